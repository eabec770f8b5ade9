FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY transfer ./transfer
COPY storage ./storage
RUN pip install --no-cache-dir .
ENV TRANSFER_HOST=0.0.0.0 TRANSFER_PORT=8080 TRANSFER_DATA_DIR=/data
VOLUME /data
EXPOSE 8080
CMD ["transfer", "serve"]
