"""The rest of a request body the application answered without reading (401, 413, ...): read and dropped so the
connection can be reused (RFC 9112 §9.6), but held to the same minimum rate as a body that is read, and the
connection closed at the keep-alive timeout once idle. uvicorn's own protocol read such a body with no deadline at
all: a client could hold a connection open forever after its answer at a byte a minute. Real sockets against the
real app; the only time bound is a generous one."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, running
from transfer.settings import Settings

GENEROUS = 30.0  # seconds: "closed within", never a latency claim


@pytest.fixture
def live(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        max_upload_size=1 << 20,  # a larger Content-Length is answered 413 before its body is read
        http_header_timeout=1.0,
        http_body_grace=getattr(request, "param", 1.0),
        http_body_min_rate=256 << 10,
        http_keep_alive=1,
    )
    with running(settings) as server:
        yield server


def _connect(live: LiveServer) -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(GENEROUS)
    return sock


def _upload_head(live: LiveServer, size: int, name: str = "f.bin") -> bytes:
    host = live.url.removeprefix("http://")
    return (
        f"POST /v1/files?name={name} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()


def _response(f: socket.SocketIO | object) -> tuple[int, bytes]:
    read = f.readline  # type: ignore[attr-defined]
    status = int(read().split()[1])
    length = 0
    while (line := read()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, f.read(length)  # type: ignore[attr-defined]


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes the connection (EOF or reset) within GENEROUS seconds."""
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_a_refused_body_dripping_after_its_answer_is_cut_off(live: LiveServer) -> None:
    """A terabyte announced, 413 at once, then a byte now and then: the connection is closed (the old protocol read
    the refused body forever, cancelling the keep-alive timer at each byte)."""
    with _connect(live) as sock, sock.makefile("rb") as f:
        sock.sendall(_upload_head(live, 10**12) + b"x" * 1000)
        status, body = _response(f)
        assert status == 413 and json.loads(body)["error"]["status"] == 413
        stop = threading.Event()

        def drip() -> None:
            try:
                while not stop.wait(0.2):
                    sock.send(b"x")
            except OSError:
                pass

        dripping = threading.Thread(target=drip)
        dripping.start()
        try:
            assert _closed_by_server(sock)
        finally:
            stop.set()
            dripping.join()


def test_an_idle_connection_after_a_refused_body_is_closed_at_the_keep_alive_timeout(live: LiveServer) -> None:
    """The refused body arrives whole, then nothing: closed like any idle keep-alive connection (the old protocol
    never re-armed the keep-alive timer its reads had cancelled)."""
    with _connect(live) as sock, sock.makefile("rb") as f:
        sock.sendall(_upload_head(live, 2 << 20) + os.urandom(2 << 20))
        status, _ = _response(f)
        assert status == 413
        assert _closed_by_server(sock)


@pytest.mark.parametrize("live", [5.0], indirect=True)  # a body grace longer than the keep-alive timeout
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_refused_body_sent_promptly_keeps_the_connection_for_the_next_request(live: LiveServer, framing: str) -> None:
    """The end of the refused body and the next request's head in one write, its body only after the keep-alive
    timeout (within the body grace): the keep-alive clock of the dropped body must not close the connection under
    the request that follows it. A chunked body (RFC 9112 §7.1) is refused once it passes the
    size limit, and its rest goes through the parser; a Content-Length one is refused at its head."""
    refused = os.urandom(3 << 20)
    if framing == "chunked":
        step = 64 << 10
        wire = b"".join(b"%x\r\n%s\r\n" % (step, refused[i : i + step]) for i in range(0, len(refused), step))
        wire += b"0\r\n\r\n"
        head = _upload_head(live, 0).replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
        first = 2 << 20  # past the 1 MiB limit
    else:
        wire = refused
        head = _upload_head(live, len(refused))
        first = 64 << 10
    accepted = os.urandom(900 << 10)
    with _connect(live) as sock, sock.makefile("rb") as f:
        sock.sendall(head + wire[:first])
        status, _ = _response(f)
        assert status == 413
        sock.sendall(wire[first:] + _upload_head(live, len(accepted), "next.bin"))
        time.sleep(1.5)  # past the 1 s keep-alive timeout
        sock.sendall(accepted)
        status, body = _response(f)
        assert status == 201, body
        assert json.loads(body)["size"] == len(accepted)
    assert live.leftovers() == []


def test_an_answer_before_100_continue_closes_the_connection(live: LiveServer) -> None:
    """A client that sent ``Expect: 100-continue`` and got a final answer instead (here 413) may send its body
    now or never: the answer says ``Connection: close`` and the connection ends, so a next request is never read
    as the body (RFC 9110 §10.1.1, RFC 9112 §9.6)."""
    host = live.url.removeprefix("http://")
    head = (
        f"POST /v1/files?name=f.bin HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {10**7}\r\nExpect: 100-continue\r\n\r\n"
    ).encode()
    with _connect(live) as sock, sock.makefile("rb") as f:
        sock.sendall(head)  # and, as curl does, waits for the 100 before the body
        status = int(f.readline().split()[1])
        headers = {}
        while (line := f.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        assert status == 413 and headers.get(b"connection") == b"close"
        f.read(int(headers[b"content-length"]))
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert _closed_by_server(sock)
    # the same request without the expectation keeps the old rule: the rest is read and dropped, not closed at once
    with _connect(live) as sock, sock.makefile("rb") as f:
        sock.sendall(_upload_head(live, 2 << 20) + b"x" * (2 << 20))
        assert _response(f)[0] == 413
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert _response(f)[0] == 200
