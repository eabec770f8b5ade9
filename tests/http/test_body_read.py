"""Request bodies on the server's HTTP/1.1 protocol (transfer.api.protocol.bodyread): a Content-Length body bypasses the
parser after its head and reaches the application as the socket's own reads; everything around it (pipelined requests,
chunked bodies, 100-continue, early answers, keep-alive) behaves as before."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from uvicorn.server import ServerState

from devtools.serving import serve_in_thread
from tests.conftest import running
from transfer.api.protocol.bodyread import HIGH_WATER, BodyCycle
from transfer.api.protocol.server import uvicorn_config
from transfer.settings import Settings


def _echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/digest")
    async def digest(request: Request) -> JSONResponse:
        sha = hashlib.sha256()
        size = messages = 0
        async for piece in request.stream():
            assert isinstance(piece, bytes)  # ASGI: the body is a byte string
            sha.update(piece)
            size += len(piece)
            messages += 1
        return JSONResponse({"sha256": sha.hexdigest(), "size": size, "messages": messages})

    @app.post("/refuse")
    async def refuse() -> JSONResponse:  # answers without reading the body
        return JSONResponse({"refused": True}, status_code=413)

    return app


@pytest.fixture
def address() -> Iterator[tuple[str, int]]:
    url, server, thread = serve_in_thread(_echo_app())
    host, port = url.removeprefix("http://").split(":")
    try:
        yield host, int(port)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _read_response(f: Any) -> tuple[int, dict[str, str], bytes]:
    status = int(f.readline().split()[1])
    headers: dict[str, str] = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = f.read(int(headers.get("content-length", "0")))
    return status, headers, body


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    return head.encode("latin-1") + body


def test_pipelined_requests_around_large_bodies_are_each_served_whole(address: tuple[str, int]) -> None:
    """Three requests in one write: the first body ends inside a socket read that also holds the next request's
    head, so the body is cut at its Content-Length and a fresh parser takes the rest of the read."""
    bodies = [os.urandom(3 << 20), b"small", os.urandom((1 << 20) + 7)]
    wire = b"".join(_post("/digest", body) for body in bodies)
    with socket.create_connection(address) as sock, sock.makefile("rb") as f:
        sock.sendall(wire)
        for body in bodies:
            status, _, answer = _read_response(f)
            assert status == 200
            assert answer == (
                b'{"sha256":"%s","size":%d,"messages":' % (hashlib.sha256(body).hexdigest().encode(), len(body))
                + answer.rpartition(b":")[2]
            )


def test_chunked_bodies_with_100_continue_arrive_without_their_framing(address: tuple[str, int]) -> None:
    """RFC 9112 §7.1 chunked framing stays with the parser; RFC 9110 §10.1.1: 100 Continue before the body."""
    body = os.urandom(2 << 20)
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 70000]), body[i : i + 70000]) for i in range(0, len(body), 70000)
    )
    head = b"POST /digest HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n"
    with socket.create_connection(address) as sock, sock.makefile("rb") as f:
        sock.sendall(head)
        assert f.readline().startswith(b"HTTP/1.1 100 ")
        assert f.readline() == b"\r\n"
        sock.sendall(chunks + b"0\r\n\r\n")
        status, _, answer = _read_response(f)
        assert status == 200
        assert hashlib.sha256(body).hexdigest().encode() in answer
        sock.sendall(_post("/digest", b"again"))  # and the connection carries on
        status, _, answer = _read_response(f)
        assert status == 200 and hashlib.sha256(b"again").hexdigest().encode() in answer


def test_a_body_the_application_does_not_read_is_dropped_and_the_connection_reused(address: tuple[str, int]) -> None:
    body = os.urandom(4 << 20)
    with socket.create_connection(address) as sock, sock.makefile("rb") as f:
        sock.sendall(_post("/refuse", body)[: -(len(body) - 100_000)])  # the head and the body's start
        status, _, _ = _read_response(f)
        assert status == 413
        sock.sendall(body[100_000:])  # the rest of the refused body, read and dropped by the server
        sock.sendall(_post("/digest", b"next"))
        status, _, answer = _read_response(f)
        assert status == 200 and hashlib.sha256(b"next").hexdigest().encode() in answer


class _Transport(asyncio.Transport):
    """Just enough transport for the protocol's reading side (what a socket delivers is fed by the test)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        pass


@pytest.mark.anyio
async def test_a_content_length_body_reaches_the_application_as_the_socket_reads_without_copies() -> None:
    """uvicorn's own path copied every body byte three times (httptools' slice, the cycle's bytearray, bytes() in
    receive) and paused reading at 64 KiB of bytes copied; here each read past the head is handed on as the very
    object the socket read produced, reading pauses once HIGH_WATER bytes wait and resumes on the next receive, and
    the next request on the connection is parsed afresh."""
    started: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.append((scope, receive))

    config = uvicorn_config(app, Settings(), host="127.0.0.1", port=0)
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = _Transport()
    protocol.connection_made(transport)
    size = 3 << 20
    protocol.data_received(b"POST /x HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % size + b"a" * 1000)
    cycle = protocol.cycle
    assert isinstance(cycle, BodyCycle)
    piece = HIGH_WATER // 4
    reads = [os.urandom(piece) for _ in range(4)]
    for read in reads[:3]:
        protocol.data_received(read)
    assert transport.reading  # 1000 + 3/4 of the high-water mark waiting: still read
    protocol.data_received(reads[3])
    assert not transport.reading  # past the mark: the client waits (TCP flow control), not our memory
    assert [piece for piece in cycle.pieces][1:] == reads and all(
        a is b for a, b in zip(list(cycle.pieces)[1:], reads, strict=True)
    )
    first = await cycle.receive()
    assert first["more_body"] and len(first["body"]) == 1000 + 4 * piece
    assert transport.reading  # the application took them: reading again
    rest = size - 1000 - 4 * piece
    last = os.urandom(rest)
    protocol.data_received(last + b"GET /next HTTP/1.1\r\nhost: x\r\n\r\n")
    message = await cycle.receive()
    assert message == {"type": "http.request", "body": last, "more_body": False}
    assert protocol.cycle is not cycle and protocol.cycle.scope["path"] == "/next"  # the fresh parser's request
    for task in list(protocol.tasks):
        task.cancel()
    await asyncio.sleep(0)


def test_a_websocket_upgrade_pipelined_after_an_upload_is_answered_after_the_upload(tmp_path: Any) -> None:
    """RFC 9112 §9.3.2: responses in the order of their requests. The upload's 201 comes first, then the 101, and
    the connection is a WebSocket from there on (uvicorn wrote the 101 at once, and the 201 after it landed inside
    the WebSocket stream)."""
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})
    with running(settings) as live:
        authority = live.url.removeprefix("http://")
        host, port = authority.split(":")
        body = os.urandom(300 << 10)
        upload = (
            f"POST /v1/files?name=w.bin HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/octet-stream\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body
        upgrade = (
            f"GET /tp/v1 HTTP/1.1\r\nhost: {authority}\r\nconnection: upgrade\r\nupgrade: websocket\r\n"
            "sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "sec-websocket-protocol: tp.v1\r\n\r\n"
        ).encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock, sock.makefile("rb") as f:
            sock.sendall(upload + upgrade)
            status, _, answer = _read_response(f)
            assert status == 201, answer
            assert f.readline().startswith(b"HTTP/1.1 101 ")
            while f.readline() not in (b"\r\n", b""):
                pass
            sock.sendall(bytes([0x88, 0x82, 1, 2, 3, 4, 0x03 ^ 1, 0xE8 ^ 2]))  # a masked close frame, code 1000
            assert f.read(2)[0] == 0x88  # the server's close frame: the stream is WebSocket, nothing else
