"""Zero-copy downloads: one range of a local object goes from the page cache to the socket with sendfile(2)
(transfer.api.protocol.zerocopy), and the HTTP stream stays correct around it: exact bytes, keep-alive and pipelined
requests after a zero-copy body, slow readers (a full socket buffer), clients that hang up mid-body, HEAD."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import LiveServer
from transfer.api.protocol import zerocopy

MiB = 1 << 20
DATA = os.urandom(12 * MiB + 77)  # several socket buffers: sendfile meets a full buffer and waits for it


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The byte counts of every sendfile(2) call the server makes, 0 for a call that found the socket full (a spy:
    the real call still runs)."""
    calls: list[int] = []
    real = os.sendfile

    def spy(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        try:
            n = real(out_fd, in_fd, offset, count)
        except BlockingIOError:
            calls.append(0)
            raise
        calls.append(n)
        return n

    monkeypatch.setattr(zerocopy.os, "sendfile", spy)
    yield calls


def _sent(calls: list[int], expected: int) -> int:
    """The bytes sendfile has sent, once they reach ``expected`` (or after a generous wait): the server thread
    records a call after it returns, which can be after the client has read the bytes."""
    deadline = time.monotonic() + 30
    while sum(calls) < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return sum(calls)


@pytest.fixture
def stored(http: httpx.Client) -> dict[str, Any]:
    d: dict[str, Any] = http.post("/v1/files", params={"name": "big.bin"}, content=DATA).json()
    return d


def _request(url: str, *extra: str) -> bytes:
    u = urlsplit(url)
    target = f"{u.path}?{u.query}"
    lines = [f"GET {target} HTTP/1.1", f"Host: {u.netloc}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _read_response(sock: socket.socket, pending: bytearray, *, pause: float = 0.0) -> tuple[bytes, bytes]:
    """One response (head, body) framed by its content-length; bytes past it stay in ``pending``."""
    while b"\r\n\r\n" not in pending:
        piece = sock.recv(65536)
        assert piece, "connection closed before the head"
        pending += piece
    head, _, rest = bytes(pending).partition(b"\r\n\r\n")
    fields = (line.partition(b":") for line in head.split(b"\r\n"))
    length = next(int(v) for k, _, v in fields if k.lower() == b"content-length")
    body = bytearray(rest)
    while len(body) < length:
        piece = sock.recv(16384 if pause else 1 << 20)
        assert piece, f"connection closed after {len(body)} of {length} body bytes"
        body += piece
        if pause:
            time.sleep(pause)
    pending[:] = body[length:]
    return head, bytes(body[:length])


def _connect(url: str, rcvbuf: int | None = None) -> socket.socket:
    u = urlsplit(url)
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    sock.connect((u.hostname or "127.0.0.1", u.port or 80))
    return sock


def test_full_body_and_ranges_go_out_with_sendfile(http: httpx.Client, stored: dict[str, Any], sent: list[int]) -> None:
    r = http.get(stored["url"])
    assert r.status_code == 200 and hashlib.sha256(r.content).digest() == hashlib.sha256(DATA).digest()
    assert _sent(sent, len(DATA)) == len(DATA)  # every body byte through sendfile, none through Python
    sent.clear()
    r = http.get(stored["url"], headers={"range": "bytes=1000-5242879"})
    assert r.status_code == 206 and r.content == DATA[1000:5242880]
    assert _sent(sent, 5242880 - 1000) == 5242880 - 1000
    sent.clear()
    r = http.get(stored["url"], headers={"range": "bytes=-10"})
    assert r.status_code == 206 and r.content == DATA[-10:] and _sent(sent, 10) == 10


def test_copying_paths_stay_for_multipart_and_head(http: httpx.Client, stored: dict[str, Any], sent: list[int]) -> None:
    r = http.get(stored["url"], headers={"range": "bytes=0-9,20-29"})
    assert r.status_code == 206 and r.headers["content-type"].startswith("multipart/byteranges")
    assert DATA[:10] in r.content and DATA[20:30] in r.content
    r = http.head(stored["url"])
    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == str(len(DATA))
    assert sent == []


def test_keep_alive_and_pipelined_requests_after_a_zero_copy_body(stored: dict[str, Any], sent: list[int]) -> None:
    url = stored["url"]
    with _connect(url) as sock:
        # two requests in one write (pipelined), then a third on the same connection
        sock.sendall(_request(url, "Range: bytes=0-99999") + _request(url))
        pending = bytearray()
        head, body = _read_response(sock, pending)
        assert head.startswith(b"HTTP/1.1 206") and body == DATA[:100000]
        head, body = _read_response(sock, pending)
        assert head.startswith(b"HTTP/1.1 200") and body == DATA
        sock.sendall(_request(url, "Range: bytes=-5"))
        head, body = _read_response(sock, pending)
        assert head.startswith(b"HTTP/1.1 206") and body == DATA[-5:]
    assert _sent(sent, 100000 + len(DATA) + 5) == 100000 + len(DATA) + 5


def test_a_slow_reader_gets_every_byte(stored: dict[str, Any], sent: list[int]) -> None:
    """A small receive buffer read slowly: the server's sendfile finds the socket full again and again and waits
    for it to drain (the wait path), and the stream stays exact."""
    url = stored["url"]
    with _connect(url, rcvbuf=32 << 10) as sock:
        sock.sendall(_request(url, "Range: bytes=1-"))
        head, body = _read_response(sock, bytearray(), pause=0.0002)
    assert head.startswith(b"HTTP/1.1 206") and body == DATA[1:]
    assert _sent(sent, len(DATA) - 1) == len(DATA) - 1 and 0 in sent  # it found the socket full, waited, and went on


def _open_descriptors_on(path_part: str) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if path_part in os.readlink(f"/proc/self/fd/{fd}"):
                count += 1
        except OSError:
            pass
    return count


def test_a_client_gone_mid_body_releases_the_file(
    http: httpx.Client, stored: dict[str, Any], live_server: LiveServer
) -> None:
    url = stored["url"]
    objects = str(Path(live_server.data_dir) / "objects")
    for _ in range(3):
        with _connect(url, rcvbuf=16 << 10) as sock:
            sock.sendall(_request(url))
            assert sock.recv(4096)  # the head and a little body, then hang up with most of it unsent
    deadline = time.monotonic() + 30
    while _open_descriptors_on(objects) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _open_descriptors_on(objects) == 0  # every reader closed
    assert http.get(url, headers={"range": "bytes=5-9"}).content == DATA[5:10]  # and the server goes on
