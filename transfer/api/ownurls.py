"""The service's own signed URLs, read in-process when the service itself fetches one (MCP ``resolve``, A2A url
parts, imports): a descriptor this service just issued names a loopback or private address when it runs on one,
which the destination policy refuses for every other URL (SSRF), so an agent could not resolve through MCP what the
same service had handed it.

A URL is the service's own when its path is a signed download path (``/v1/files/<id>/content``, a session's
``/v1/sessions/<id>/chunks`` and ``…/chunks/<index>``) and its query names one of the service's signing keys. Such
a request is answered from storage by the same calls the download routes make, so the signature, its expiry, the
file's expiry, ranges and preconditions are checked exactly as for a download, whatever host the URL names; the
bytes never cross a socket. Every other request, and every redirect, goes to the guarded transport unchanged.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

from transfer.api.streaming import plan_body
from transfer.core.http.delivery import CONTENT_SAFETY_HEADERS
from transfer.core.model.encodings import encoder_levels
from transfer.service.container import Services

FILE_CONTENT = re.compile(r"/v1/files/(?P<id>f_[0-9a-f]{32})/content")
SESSION_CHUNK = re.compile(r"/v1/sessions/(?P<sid>s_[0-9a-f]{32})/chunks/(?P<index>[0-9]{1,18})")
METHODS = ("GET", "HEAD", "POST")  # what a signed download URL may be read with


class OwnUrlTransport(httpx.AsyncBaseTransport):
    """Answers requests for the service's own signed URLs from storage; sends the rest to ``inner``."""

    def __init__(self, services: Services, inner: httpx.AsyncBaseTransport) -> None:
        self.services = services
        self.inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path, _, query = request.url.raw_path.decode("ascii").partition("?")
        method = request.method.upper()
        if method in METHODS and self.services.files.signer.knows(query):
            # a refusal (signature_invalid, url_expired, file_expired, not_found, ...) is raised as the service's
            # own error, the one a download of the URL answers, not as a remote server's answer
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers.raw}
            if (file := FILE_CONTENT.fullmatch(path)) is not None:
                return await self._file(file["id"], method, path, query, headers)
            if (chunk := SESSION_CHUNK.fullmatch(path)) is not None and method != "POST":
                return await self._chunk(chunk["sid"], int(chunk["index"]), method, path, query)
        return await self.inner.handle_async_request(request)

    async def _file(self, file_id: str, method: str, path: str, query: str, headers: dict[str, str]) -> httpx.Response:
        files = self.services.files
        download = await files.open_download(file_id, method, query, headers, raw_path=path)
        settings = files.settings
        body = plan_body(download, encoder_levels(settings))
        return httpx.Response(download.plan.status, headers=download.plan.headers, stream=_Body(body, download.close))

    async def _chunk(self, sid: str, index: int, method: str, path: str, query: str) -> httpx.Response:
        _session, stream, length, xxh3 = await self.services.sessions.open_signed_chunk(
            sid, index, method, path, query, wait=0
        )
        headers = {
            "content-length": str(length),
            "content-type": "application/octet-stream",
            "chunk-checksum": f"xxh3-128:{xxh3}",
            **dict(CONTENT_SAFETY_HEADERS),
        }
        if method == "HEAD":
            await stream.aclose()
            return httpx.Response(200, headers=headers)
        return httpx.Response(200, headers=headers, stream=_Body(aiter(stream), stream.aclose))

    async def aclose(self) -> None:
        await self.inner.aclose()


class _Body(httpx.AsyncByteStream):
    """A response body streamed from storage; closing it (read to the end or not) closes what it reads."""

    def __init__(self, pieces: AsyncIterator[bytes], close: Callable[[], Awaitable[None]]) -> None:
        self._pieces = pieces
        self._close = close

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self._pieces:
            yield piece

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._pieces, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            await self._close()


def serve_own_urls(services: Services) -> None:
    """Let the service's own fetches (imports, A2A url parts, MCP resolve) read its own signed URLs in-process."""
    services.imports.wrap_transport = lambda inner: OwnUrlTransport(services, inner)
