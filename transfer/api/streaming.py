"""Streaming a :class:`DeliveryPlan` to an ASGI client: the bytes the plan names, read from storage in
``buffer_size`` pieces, stopped as soon as the client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Protocol, runtime_checkable

import anyio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from transfer.core.http.delivery import CompressedBody, MultipartBody, NoBody, RangeBody
from transfer.core.model.encodings import coding_from_http as coding_of
from transfer.core.model.encodings import make_encoder
from transfer.errors import ClientDisconnected, UnsupportedEncoding
from transfer.service.files.service import Download


def request_body(request: Request, *, decodes: bool = False) -> AsyncIterator[bytes]:
    """The request body as it arrives; a client that goes away mid-body becomes ClientDisconnected.

    A body sent with a content coding is refused at once (415, ``Accept-Encoding: identity``) unless the route
    decodes it (``decodes``): stored as sent, compressed bytes would be taken for the content (RFC 9110 §15.5.16)."""
    if not decodes:
        codings = {c.strip().lower() for v in request.headers.getlist("content-encoding") for c in v.split(",")}
        if codings - {"", "identity"}:
            shown = ", ".join(request.headers.getlist("content-encoding"))[:60]
            raise UnsupportedEncoding(f"this route takes the bytes as they are, not with Content-Encoding {shown!r}")
    return _received(request)


async def _received(request: Request) -> AsyncIterator[bytes]:
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect as exc:
        raise ClientDisconnected("client disconnected before the body was complete") from exc


def combined_headers(request: Request) -> dict[str, str]:
    """Request header fields with lower-case names; repeated fields joined with ", " (RFC 9110 §5.3)."""
    out: dict[str, str] = {}
    for key, value in request.headers.items():
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


async def plan_body(download: Download, levels: Mapping[str, int]) -> AsyncIterator[bytes]:
    """The body bytes of a planned download."""
    body = download.plan.body
    reader = download.reader
    if isinstance(body, NoBody) or reader is None:
        return
    if isinstance(body, RangeBody):
        async for chunk in reader.read(body.range.start, body.range.end + 1):
            yield chunk
    elif isinstance(body, MultipartBody):
        for part in body.plan.parts:
            yield part.head
            async for chunk in reader.read(part.range.start, part.range.end + 1):
                yield chunk
        yield body.plan.tail
    elif isinstance(body, CompressedBody):
        encoder = make_encoder(coding_of(body.coding), levels=levels)
        async for chunk in reader.read():
            out = await asyncio.to_thread(encoder.encode, chunk)
            if out:
                yield out
        yield encoder.finish()


ZERO_COPY = "http.response.zerocopysend"  # the ASGI extension (transfer.api.protocol.zerocopy adds it to uvicorn)


@runtime_checkable
class FileBacked(Protocol):
    """A storage reader over an open local file (LocalReader): its bytes can go to the socket with sendfile."""

    def fileno(self) -> int: ...


def zero_copy_range(download: Download, scope: Scope) -> tuple[int, int, int] | None:
    """(descriptor, offset, count) when the body is one byte range of a local file and the server offers the
    zero-copy send extension; None when it must be copied (multipart byteranges, on-the-fly coding, S3)."""
    body = download.plan.body
    reader = download.reader
    if ZERO_COPY not in (scope.get("extensions") or {}) or not isinstance(body, RangeBody):
        return None
    if not isinstance(reader, FileBacked):
        return None
    return reader.fileno(), body.range.start, body.range.end + 1 - body.range.start


class DownloadResponse(Response):
    """Sends a planned download; closes the storage reader whatever happens. One range of a local file goes out
    with zero-copy send when the server offers it (the bytes never enter Python); everything else is copied in
    ``buffer_size`` pieces."""

    def __init__(self, download: Download, levels: Mapping[str, int]) -> None:
        self.download = download
        self.status_code = download.plan.status
        self.background = None
        self.body = b""
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in download.plan.headers]
        self._levels = levels

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if scope["method"] == "HEAD" or isinstance(self.download.plan.body, NoBody):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            async with anyio.create_task_group() as tg:

                async def watch_disconnect() -> None:
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            tg.cancel_scope.cancel()
                            return

                async def stream() -> None:
                    if (whole := zero_copy_range(self.download, scope)) is not None:
                        fd, offset, count = whole
                        await send({"type": ZERO_COPY, "file": fd, "offset": offset, "count": count})
                    else:
                        async for chunk in plan_body(self.download, self._levels):
                            if chunk:
                                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                    tg.cancel_scope.cancel()

                tg.start_soon(watch_disconnect)
                tg.start_soon(stream)
        finally:
            await self.download.close()


class ClosableStream(Protocol):
    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class OwningStreamResponse(StreamingResponse):
    """Streams ``stream`` (HEAD: headers only) and closes it whatever happens: sent, HEAD, client gone, error.

    The stream must own its resource as an object (``aclose()`` releases it even if iteration never started);
    starlette does not close a body iterator it did not finish."""

    def __init__(self, stream: ClosableStream, headers: Mapping[str, str], media_type: str) -> None:
        super().__init__(stream, headers=headers, media_type=media_type)
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["method"] == "HEAD":  # RFC 9110 §9.3.2: the GET headers, no content
                await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            await super().__call__(scope, receive, send)
        finally:
            await self.stream.aclose()
