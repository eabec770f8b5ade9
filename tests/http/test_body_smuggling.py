"""Request-smuggling shapes and read boundaries on the server's HTTP/1.1 protocol (transfer.api.protocol.bodyread reads
a Content-Length body past the parser): for each byte stream, split into two socket reads at every offset, the
server's protocol must frame requests exactly as uvicorn's stock httptools protocol does (RFC 9112 §6.3: one
Content-Length, no Transfer-Encoding with it, malformed lengths refused; §9.3.2: pipelined requests). The reads are
fed to the protocol directly: a real socket cannot be made to cut a stream at a chosen byte."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from transfer.api.protocol.server import head_timeout_protocol

pytestmark = pytest.mark.anyio


def _post(path: bytes, body: bytes, extra: bytes = b"", length: bytes | None = None) -> bytes:
    length = str(len(body)).encode() if length is None else length
    return b"POST " + path + b" HTTP/1.1\r\nhost: x\r\ncontent-length: " + length + b"\r\n" + extra + b"\r\n" + body


NEXT = b"GET /next HTTP/1.1\r\nhost: x\r\n\r\n"
CHUNKED = b"POST /a HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"

SHAPES: dict[str, bytes] = {
    "pipelined": _post(b"/a", b"0123456789") + _post(b"/b", b"abcdefgh") + NEXT,
    "answered-unread": _post(b"/early", b"0123456789") + NEXT,
    "connection-close": _post(b"/a", b"0123456789", b"connection: close\r\n") + NEXT,
    "http-1.0": b"POST /a HTTP/1.0\r\ncontent-length: 4\r\n\r\nabcd" + NEXT,
    "cl-and-te": _post(b"/a", b"5\r\nhello\r\n0\r\n\r\n", b"transfer-encoding: chunked\r\n") + NEXT,
    "te-and-cl": CHUNKED + b"content-length: 4\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + NEXT,
    "two-cl-equal": _post(b"/a", b"abcd", b"content-length: 4\r\n") + NEXT,
    "two-cl-different": _post(b"/a", b"abcd", b"content-length: 6\r\n") + NEXT,
    "cl-plus": _post(b"/a", b"abcd", length=b"+4") + NEXT,
    "cl-leading-space": _post(b"/a", b"abcd", length=b" 4") + NEXT,
    "cl-trailing-space": _post(b"/a", b"abcd", length=b"4 ") + NEXT,
    "cl-list": _post(b"/a", b"abcd", length=b"4,4") + NEXT,
    "cl-leading-zeros": _post(b"/a", b"abcd", length=b"0004") + NEXT,
    "cl-overflow": _post(b"/a", b"abcd", length=b"99999999999999999999999") + NEXT,
    "cl-2^64-1": _post(b"/a", b"abcd", length=b"18446744073709551615") + NEXT,
    "cl-0-with-bytes": _post(b"/a", b"") + b"abcd" + NEXT,
    "cl-obs-fold": b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length:\r\n 4\r\n\r\nabcd" + NEXT,
    "te-obs-fold": b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\ntransfer-encoding:\r\n chunked\r\n\r\nabcd"
    + NEXT,
    "te-identity": _post(b"/a", b"abcd", b"transfer-encoding: identity\r\n") + NEXT,
    "cl-name-space": b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length : 4\r\n\r\nabcd" + NEXT,
    "bare-lf": b"POST /a HTTP/1.1\nhost: x\ncontent-length: 4\n\nabcd" + NEXT,
    "get-with-body": b"GET /g HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello" + NEXT,
    "head-with-body": b"HEAD /g HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello" + NEXT,
    "expect-100": _post(b"/a", b"abcd", b"expect: 100-continue\r\n") + NEXT,
    "upgrade-h2c-with-body": _post(b"/a", b"abcd", b"connection: upgrade\r\nupgrade: h2c\r\n") + NEXT,
    "chunked-then-cl": CHUNKED + b"\r\n3\r\nabc\r\n0\r\n\r\n" + _post(b"/b", b"0123456789") + NEXT,
}


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """Echoes what it received; under /early it answers without reading the body."""
    body = b""
    if not scope["path"].startswith("/early"):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
    out = b"%s %s %d:%s" % (scope["method"].encode(), scope["path"].encode(), len(body), body)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def _settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


async def _serve(protocol_class: type[HttpToolsProtocol], reads: list[bytes]) -> tuple[bytes, bool]:
    """What ``protocol_class`` writes, and whether it closes, when a client's bytes arrive as ``reads``."""
    config = Config(_app, log_level="critical", ws="none")
    config.load()
    state = ServerState()
    protocol = protocol_class(config, state, {}, _loop=asyncio.get_running_loop())
    transport = _Transport()
    protocol.connection_made(transport)
    for read in reads:
        for _ in range(30):  # a paused transport delivers nothing until the application has run
            if transport.reading:
                break
            await asyncio.sleep(0)
        if transport.closed:
            break
        protocol.data_received(read)
        await _settle()
    await _settle()
    written, closed = bytes(transport.written), transport.closed
    protocol.connection_lost(None)
    for task in list(state.tasks):
        task.cancel()
    await _settle()
    return written, closed


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_every_read_boundary_frames_requests_as_uvicorn_does(shape: str) -> None:
    wire = SHAPES[shape]
    ours = head_timeout_protocol(30.0, body_grace=30.0, body_min_rate=8192.0)
    for cut in range(len(wire)):
        reads = [wire[:cut], wire[cut:]] if cut else [wire]
        expected = await _serve(HttpToolsProtocol, reads)
        assert await _serve(ours, reads) == expected, (shape, cut, expected)
