# syntax=docker/dockerfile:1
# The service's image: `docker build -t agent-transfer .` (docs/operations/deployment.md). podman and buildah build OCI images by
# default, which have no HEALTHCHECK: build with `--format docker` to keep it.
#
# Closed by default: it listens on 0.0.0.0 and holds no keys, so `docker run` without TRANSFER_API_KEYS refuses to
# start (`transfer: open_mode_refused: …`, exit status 1) rather than serve every caller as admin. Give it keys
# (`-e TRANSFER_API_KEYS=…`; on S3 also TRANSFER_SIGNING_KEYS), or, for a throw-away local try only,
# `-e TRANSFER_ALLOW_OPEN_MODE=true`.
#
# Stage "wheel" builds the wheel exactly as `python -m build` does anywhere: setup.py's hook fetches the pinned
# browser files (tus-js-client, swagger-ui-dist, redoc) from the npm registry and checks each tarball's SHA-512
# against transfer/web/package-lock.json, so no Node.js is needed in any stage. The final stage installs only that
# wheel: no compiler, no npm, no build tools, no source tree.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir "build==1.6.1"
COPY pyproject.toml setup.py README.md LICENSE ./
COPY transfer ./transfer
COPY storage ./storage
COPY devtools ./devtools
RUN python -m build --wheel --outdir /dist .

FROM ${PYTHON_IMAGE}
# a system user without a login shell owns the data directory; the service never runs as root
RUN useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin transfer \
    && install -d -o transfer -g transfer -m 0750 /data
COPY --from=wheel /dist/ /tmp/dist/
RUN pip install --no-cache-dir /tmp/dist/*.whl && rm -rf /tmp/dist
# SIGTERM: /readyz answers 503 for the drain (balancers stop sending), then requests in flight get the grace; the
# orchestrator's kill delay must be longer than both (Compose stop_grace_period, Kubernetes
# terminationGracePeriodSeconds: 40 s in deploy/)
ENV TRANSFER_HOST=0.0.0.0 \
    TRANSFER_PORT=8080 \
    TRANSFER_DATA_DIR=/data \
    TRANSFER_LOG_FORMAT=json \
    TRANSFER_SHUTDOWN_DRAIN=5 \
    TRANSFER_SHUTDOWN_GRACE=25 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /data
VOLUME /data
EXPOSE 8080
STOPSIGNAL SIGTERM
# readiness, not liveness: a draining or storage-less replica reports unhealthy (the image has no curl)
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=4).status != 200)"]
CMD ["transfer", "serve"]
