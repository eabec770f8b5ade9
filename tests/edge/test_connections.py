"""Connection-layer bounds on both protocols, against a real ``transfer serve`` process on loopback: a reader that
stops reading (HTTP/1.1, the zero-copy path and the copied one), the per-process and per-address connection limits
and their answers (503 ``too_many_connections`` on HTTP/1.1 and on HTTP/2), a flood of connections past the limit,
and the Host rule of RFC 9112 §3.2. Each test states its time bound."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.edge.attacks import RawH2, Server, serve

pytestmark = [pytest.mark.e2e]

MiB = 1 << 20
ATTACKER = "127.0.0.2"  # loopback, but not 127.0.0.1 (which the tests make a trusted proxy's address)


HEALTHZ = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
HEALTHZ_CLOSE = "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"


def signed_target(server: Server, size: int) -> str:
    answer = httpx.post(f"{server.url}/v1/files", params={"name": "big.bin"}, content=os.urandom(size), timeout=120)
    assert answer.status_code == 201, answer.text
    url = urlsplit(answer.json()["url"])
    return f"{url.path}?{url.query}"


def raw_request(port: int, head: str, *, source: str = "", rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting: the window the client advertises is set by then
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(30)
    if source:
        sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.sendall(head.encode("latin-1"))
    return sock


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; then the socket is closed."""
    out = b""
    with sock:
        try:
            while chunk := sock.recv(65536):
                out += chunk
        except OSError:
            pass
    return out


def status_and_error(answer: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["zero-copy", "copied"])
def test_a_reader_that_stops_reading_is_cut_after_the_send_timeout(tmp_path: Path, path: str) -> None:
    """An HTTP/1.1 client asks for 64 MiB and reads nothing (before: the response, its file and the socket were
    held for as long as the client stayed). After http_send_timeout (2 s here) without progress the connection is
    closed, its file with it; descriptors are back to the baseline within 2 s more. The zero-copy path (sendfile of
    one range) and a copied one (multipart byteranges) alike. Bound: ~8 s."""
    with serve(tmp_path, http_send_timeout=2) as server:
        target = signed_target(server, 64 * MiB)
        # one download first: the zero-copy path's epoll descriptor lives as long as the event loop
        assert len(httpx.get(f"{server.url}{target}", headers={"range": "bytes=0-9"}, timeout=30).content) == 10
        time.sleep(0.5)  # that connection closed
        base_fds = server.fds()
        # two ranges with a gap (adjacent ones are coalesced into one, which goes zero-copy): multipart, copied
        ranges = "" if path == "zero-copy" else "Range: bytes=0-33554431,33554500-67108863\r\n"
        began = time.monotonic()
        sock = raw_request(server.port, f"GET {target} HTTP/1.1\r\nHost: localhost\r\n{ranges}\r\n", rcvbuf=4096)
        try:
            time.sleep(1)
            assert server.fds() >= base_fds + 2  # the connection and the file being sent, held while it stalls
            assert server.wait_fds(base_fds, 2 + 6) <= base_fds  # the timeout, then both closed
            took = time.monotonic() - began
        finally:
            received = len(answer_of(sock))
        assert 2 <= took < 2 + 6, took
        assert received < 64 * MiB  # it was cut, not finished
        assert "took no bytes for 2 s: connection closed" in server.log_text()


def test_host_rules_of_rfc_9112(tmp_path: Path) -> None:
    """RFC 9112 §3.2: an HTTP/1.1 request with no Host, or with two, is answered 400 (here with the JSON error body,
    code invalid_host) and the connection closed; HTTP/1.0 needs none. Before: both were served. Bound: ~2 s."""
    with serve(tmp_path) as server:
        for head, fields in (
            ("GET /healthz HTTP/1.1\r\n\r\n", 0),
            ("GET /healthz HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", 2),
        ):
            status, error = status_and_error(answer_of(raw_request(server.port, head)))
            assert (status, error["code"], error["detail"]) == (400, "invalid_host", {"host_fields": fields}), error
        ok = answer_of(raw_request(server.port, "GET /healthz HTTP/1.0\r\n\r\n"))
        assert ok.startswith(b"HTTP/1.1 200 ")
        ok = answer_of(raw_request(server.port, HEALTHZ_CLOSE))
        assert ok.startswith(b"HTTP/1.1 200 ")


def test_the_process_and_address_connection_limits_answer_503_in_each_protocol(tmp_path: Path) -> None:
    """With http_max_connections=20: 20 idle connections are held, the 21st is answered 503 too_many_connections
    (HTTP/1.1: JSON body, Retry-After, Connection: close; HTTP/2 by prior knowledge: the same 503 on its first
    stream, then GOAWAY naming that stream as the last processed) and closed; once one closes, a new one is served.
    Per address (http_max_connections_per_client=5, 127.0.0.1 a trusted proxy's address and exempt): the 6th from
    127.0.0.2 is refused while 127.0.0.1 is not. Before: no limit at all. Bound: ~3 s."""
    limits = {"http_max_connections": 20, "http_max_connections_per_client": 5, "trusted_proxies": ["127.0.0.1/32"]}
    with serve(tmp_path, **limits) as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        try:
            time.sleep(0.3)
            status, error = status_and_error(answer_of(raw_request(server.port, HEALTHZ)))
            assert (status, error["code"], error["detail"]) == (503, "too_many_connections", {"limit": "process"})
            h2 = RawH2(server.port)
            sid = h2.open_stream("/healthz")
            h2.read(lambda seen: seen.goaway is not None, timeout=5)
            assert h2.seen.status.get(sid) == 503 and sid in h2.seen.ended
            assert (h2.seen.goaway, h2.seen.last_stream) == (0, sid)  # NO_ERROR: the stream it answered, no other
            h2.close()
            idle.pop().close()
            time.sleep(0.3)
            served = answer_of(raw_request(server.port, HEALTHZ_CLOSE))
            assert served.startswith(b"HTTP/1.1 200 ")
        finally:
            for sock in idle:
                sock.close()
        time.sleep(0.3)
        own = [raw_request(server.port, "", source=ATTACKER) for _ in range(5)]
        try:
            time.sleep(0.3)
            refused = answer_of(raw_request(server.port, HEALTHZ, source=ATTACKER))
            status, error = status_and_error(refused)
            assert (status, error["code"], error["detail"]) == (503, "too_many_connections", {"limit": "client"})
            served = answer_of(raw_request(server.port, HEALTHZ_CLOSE))
            assert served.startswith(b"HTTP/1.1 200 ")  # the trusted address is not counted per client
        finally:
            for sock in own:
                sock.close()
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'transfer_connections_refused_total{limit="process"} 2.0' in metrics
        assert 'transfer_connections_refused_total{limit="client"} 1.0' in metrics


@pytest.mark.slow
def test_a_flood_of_connections_past_the_limit_is_not_held_open(tmp_path: Path) -> None:
    """500 connections opened past a limit of 20 and left silent: each is held at most REFUSE_WAIT (2 s) waiting
    for a request to answer, at most 64 at once (the rest are closed at once), so descriptors come back to the
    baseline within 4 s while the 20 admitted stay served. Bound: ~6 s."""
    with serve(tmp_path, http_max_connections=20) as server:
        base_fds = server.fds()
        admitted = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
        flood = []
        try:
            time.sleep(0.3)
            for _ in range(500):
                flood.append(socket.create_connection(("127.0.0.1", server.port)))
            time.sleep(0.5)
            assert server.fds() <= base_fds + 20 + 64 + 5  # the admitted, the refusals waiting, a few closing
            assert server.wait_fds(base_fds + 20, 4) <= base_fds + 20
        finally:
            for sock in flood + admitted:
                sock.close()
        assert server.wait_fds(base_fds, 5) <= base_fds
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


@pytest.mark.slow
def test_clients_that_take_nothing_do_not_hold_the_shutdown(tmp_path: Path) -> None:
    """With the default send timeout (60 s) and a shutdown grace of 25 s: an HTTP/1.1 reader stalled on a
    zero-copy download, one on a copied download, and an HTTP/2 connection with 100 download streams and no window
    are still connected when SIGTERM comes. The process exits within 3 s anyway: once shutting down, a response
    that makes no progress for 1 s is not waited for (before: the whole grace). Bound: ~6 s."""
    from tests.edge.attacks import RawH2 as H2

    with serve(tmp_path) as server:
        target = signed_target(server, 64 * MiB)
        head = f"GET {target} HTTP/1.1\r\nHost: localhost\r\n"
        stalled = [
            raw_request(server.port, head + "\r\n", rcvbuf=4096),
            raw_request(server.port, head + "Range: bytes=0-33554431,33554500-67108863\r\n\r\n", rcvbuf=4096),
        ]
        h2 = H2(server.port, window=0)
        for _ in range(100):
            h2.open_stream(target)
        try:
            time.sleep(1.5)  # all of them stalled by now
            took = server.stop()
        finally:
            for sock in stalled:
                answer_of(sock)
            h2.close()
        assert took < 3, took


def test_a_request_head_past_its_limit_is_answered_431_before_it_ends(tmp_path: Path) -> None:
    """A head that does not end (a header value of 1 MiB and counting): httptools held all of it until the head
    completed or the header timeout (30 s) ran out, whatever its size. Now 431 headers_too_large once it passes
    max_header_size + 16 KiB (80 KiB; counted from the second socket read of the head, so at most one read of 256 KiB
    more), and the connection closes. Bound: ~2 s."""
    with serve(tmp_path) as server:
        sock = raw_request(server.port, "GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Long: ")
        try:
            sock.sendall(b"a" * (1 << 20))  # past the limit, even counted from the second read on
        except OSError:
            pass  # closed on us after the answer
        answer = answer_of(sock)
        status, error = status_and_error(answer)
        assert (status, error["code"]) == (431, "headers_too_large"), answer[:300]
