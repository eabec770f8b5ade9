"""Downloading url-mode content into a file at wire speed: blocking HTTP/1.1 ranged GETs in threads, hashed in order
as the bytes arrive.

Why not httpx for the body: it hands the body over in 64 KiB pieces through h11 and the event loop, ~3.5 CPU-seconds
per GiB on these hosts against ~0.3 for ``recv_into`` a reused 1 MiB buffer — the difference between losing and
beating ``curl | tee | sha256sum``. httpx still builds every request (client headers, cookies, auth), and h11 parses
every response head; only a ``Content-Length`` body is read straight into our buffers (others go through h11).

    workers (one per connection)   claim segments in file order, ``recv_into`` pooled piece buffers, ``pwrite`` each
                                   piece at its offset, hand it to the assembler; a cut connection resumes its segment
                                   with ``Range`` + ``If-Range`` (RFC 9110 §14.2, §13.1.5)
    assembler (one thread)         SHA-256 in file order: a piece at the frontier is hashed from the buffer it arrived
                                   in; pieces ahead of it wait in a bounded pool of buffers; when the pool is empty a
                                   worker receives into its own scratch buffer, and those bytes alone are read back
                                   from the file when the frontier reaches them

Memory is bounded by the pool (``window`` pieces) plus one scratch buffer per connection, whatever the file size.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import httpx

from transfer.errors import RemoteError, SizeMismatch, TransferError, error_from_payload

_HEAD_READ = 64 << 10
_MAX_ERROR_BODY = 1 << 20


class RangeIgnored(Exception):
    """The server answered 200 to a ranged request."""


class _Aborted(Exception):
    """Another worker failed or the caller gave up: stop quietly."""


def lean_path_possible(http: httpx.AsyncClient, url: str) -> bool:
    """Whether ``url`` can be fetched by this module: plain http, no proxy configured for it (TLS and proxies stay
    with httpx)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    # a client with its own transport (the service's destination guard against SSRF, a fault injector) must see
    # every request: only httpx's plain transport may be bypassed
    if type(getattr(http, "_transport", None)) is not httpx.AsyncHTTPTransport or getattr(http, "_mounts", None):
        return False
    if http.trust_env and urllib.request.getproxies().get("http") and not urllib.request.proxy_bypass(parts.hostname):
        return False
    return True


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """What to fetch: ``total`` raw bytes (None: unknown, one stream to the end), ``segment`` bytes per request,
    ``connections`` at once, in pieces of ``piece`` bytes, at most ``window`` pieces held ahead of the hash."""

    method: str
    url: str
    total: int | None
    connections: int
    segment: int
    piece: int
    window: int
    retries: int
    connect_timeout: float | None
    read_timeout: float | None


class Assembler:
    """Writes pieces at their offsets and keeps the SHA-256 of the file's prefix, in order, off the event loop."""

    def __init__(self, fd: int, piece: int, window: int, inline: bool = False) -> None:
        self.fd = fd
        self.inline = inline  # one stream: pieces arrive in order and are hashed by the thread that received them
        self.piece = piece
        self.sha = hashlib.sha256()
        self.frontier = 0  # bytes hashed
        self.received = 0  # bytes written (for progress)
        self.read_back = 0  # bytes hashed from the file rather than in flight (the window was full)
        self.end: int | None = None  # set once the size is known and every byte has been deposited or will be
        self._cond = threading.Condition()
        self._ahead: dict[int, tuple[int, bytearray | None]] = {}  # offset -> (length, buffer; None: on disk only)
        self._free: list[bytearray] = []
        self._allocated = 0
        self._window = window
        self._failed = False

    def take(self) -> bytearray | None:
        """A pooled piece buffer, or None when the window is full (the caller then receives into its scratch)."""
        with self._cond:
            if self._free:
                return self._free.pop()
            if self._allocated < self._window:
                self._allocated += 1
                return bytearray(self.piece)
            return None

    def give_back(self, buf: bytearray) -> None:
        with self._cond:
            self._free.append(buf)

    def deposit(self, offset: int, buf: bytearray, length: int, pooled: bool) -> None:
        """Write ``buf[:length]`` at ``offset``; a pooled buffer then belongs to the assembler until hashed."""
        pwrite_all(self.fd, memoryview(buf)[:length], offset)
        if self.inline:
            assert offset == self.frontier
            self.sha.update(memoryview(buf)[:length])
            self.frontier += length
            self.received += length
            if pooled:
                self.give_back(buf)
            return
        with self._cond:
            self.received += length
            self._ahead[offset] = (length, buf if pooled else None)
            self._cond.notify_all()

    def finish(self, end: int) -> None:
        with self._cond:
            self.end = end
            self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self._failed = True
            self._cond.notify_all()

    def run(self) -> None:
        """Hash pieces in order until ``end``; returns early (hash incomplete) if :meth:`fail` was called."""
        while True:
            with self._cond:
                while not self._failed and self.frontier not in self._ahead and self.frontier != self.end:
                    self._cond.wait()
                if self._failed or self.frontier == self.end:
                    return
                length, buf = self._ahead.pop(self.frontier)
            if buf is not None:
                self.sha.update(memoryview(buf)[:length])
                self.give_back(buf)
            else:  # received while the window was full: read back what could not be hashed in flight
                hash_range(self.fd, self.sha, self.frontier, self.frontier + length, self.piece)
                self.read_back += length
            self.frontier += length


class _Connection:
    """One keep-alive HTTP/1.1 connection, reopened when needed."""

    def __init__(self, host: str, port: int, plan: FetchPlan, live: set[socket.socket], lock: threading.Lock) -> None:
        self.address = (host, port)
        self.plan = plan
        self.sock: socket.socket | None = None
        self._live = live
        self._lock = lock
        self._h11: h11.Connection | None = None
        self._left: int | None = None  # body bytes still to read (Content-Length), None: framed by h11
        self._buffered = b""  # body bytes received with the head
        self._chunk = memoryview(b"")  # h11 Data not yet handed out
        self._persist = False  # the response allows another request on this connection
        self.reusable = False

    def close(self) -> None:
        if self.sock is not None:
            with self._lock:
                self._live.discard(self.sock)
            self.sock.close()
            self.sock = None

    def request(self, method: str, target: bytes, headers: list[tuple[bytes, bytes]]) -> h11.Response:
        if self.sock is None or not self.reusable:
            self.close()
            sock = socket.create_connection(self.address, timeout=self.plan.connect_timeout)
            # blocking, with the timeouts in the kernel (SO_RCVTIMEO): no poll() before every read
            sock.settimeout(None)
            if self.plan.read_timeout:
                seconds = int(self.plan.read_timeout)
                timeval = struct.pack("ll", seconds, int((self.plan.read_timeout - seconds) * 1e6))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._live.add(sock)
            self.sock = sock
        self.reusable = False
        conn = h11.Connection(h11.CLIENT)
        self.sock.sendall(conn.send(h11.Request(method=method, target=target, headers=headers)))
        self.sock.sendall(conn.send(h11.EndOfMessage()))
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = self.sock.recv(_HEAD_READ)
                if not data:
                    raise ConnectionError("connection closed before a response")
                conn.receive_data(data)
                continue
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                break
            raise ConnectionError(f"unexpected {type(event).__name__} before the response")
        self._h11 = conn
        tokens = (_header(event, b"connection") or "").lower()
        self._persist = event.http_version == b"1.1" and "close" not in tokens
        length = _content_length(event)
        chunked = any(k == b"transfer-encoding" for k, _ in event.headers)
        if method == "HEAD" or event.status_code in (204, 304):
            length = 0
        self._left = None if chunked or length is None else length
        self._buffered = conn.trailing_data[0] if self._left is not None else b""
        self._chunk = memoryview(b"")
        return event

    def readinto(self, view: memoryview) -> int:
        """Body bytes into ``view``; 0 at the end of the body. Raises ConnectionError if the body is cut short."""
        assert self.sock is not None and self._h11 is not None
        if self._left is not None:
            if self._left == 0:
                self.reusable = self._persist and not self._buffered
                return 0
            want = min(len(view), self._left)
            if self._buffered:
                n = min(want, len(self._buffered))
                view[:n] = self._buffered[:n]
                self._buffered = self._buffered[n:]
            else:
                n = self.sock.recv_into(view, want)
                if n == 0:
                    raise ConnectionError("response ended early")
            self._left -= n
            return n
        while not self._chunk:  # framed by h11 (chunked, or to the end of the connection)
            event = self._h11.next_event()
            if event is h11.NEED_DATA:
                self._h11.receive_data(self.sock.recv(_HEAD_READ))
            elif isinstance(event, h11.Data):
                self._chunk = memoryview(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.reusable = self._persist and self._h11.their_state is h11.DONE
                return 0
            else:
                raise ConnectionError(f"unexpected {type(event).__name__} in a response body")
        n = min(len(view), len(self._chunk))
        view[:n] = self._chunk[:n]
        self._chunk = self._chunk[n:]
        return n

    def read_small_body(self) -> bytes:
        out = bytearray()
        buf = bytearray(64 << 10)
        while len(out) < _MAX_ERROR_BODY and (n := self.readinto(memoryview(buf))):
            out += buf[:n]
        return bytes(out)


def _content_length(response: h11.Response) -> int | None:
    for name, value in response.headers:
        if name == b"content-length":
            return int(value)
    return None


def _header(response: h11.Response, name: bytes) -> str | None:
    for key, value in response.headers:
        if key == name:
            return value.decode("latin-1")
    return None


class Fetcher:
    """Fills ``fd`` with the raw bytes of ``plan.url`` and computes their SHA-256 as they arrive."""

    def __init__(
        self, plan: FetchPlan, fd: int, headers: Callable[[dict[str, str]], tuple[bytes, list[tuple[bytes, bytes]]]]
    ) -> None:
        self.plan = plan
        self.fd = fd
        self._headers = headers  # extra headers -> (target, every header as httpx would send it)
        parts = urlsplit(plan.url)
        assert parts.hostname is not None
        self._address = (parts.hostname, parts.port or 80)
        self.single = plan.total is None or plan.connections == 1
        self.assembler = Assembler(fd, plan.piece, 1 if self.single else plan.window, inline=self.single)
        self._stop = threading.Event()
        self._live: set[socket.socket] = set()
        self._live_lock = threading.Lock()
        self._next_segment = 0
        self._claim_lock = threading.Lock()
        self._etag: str | None = None
        self._errors: list[BaseException] = []

    # -- control ---------------------------------------------------------------------------------------------------

    def abort(self) -> None:
        """Stop every worker (unblocking their sockets) and the hasher."""
        self._stop.set()
        self.assembler.fail()
        with self._live_lock:
            for sock in self._live:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run(self) -> str:
        """Fetch everything; the SHA-256 (hex) of the bytes written. Raises the first worker's error."""
        plan = self.plan
        if self.single:  # no other thread: this one receives, writes and hashes
            self._guard(self._whole)
        else:
            assert plan.total is not None
            count = -(-plan.total // plan.segment)
            n = max(1, min(plan.connections, count))
            workers = [threading.Thread(target=self._guard, args=(self._segments,), daemon=True) for _ in range(n)]
            self.assembler.finish(plan.total)
            for w in workers:
                w.start()
            try:
                self.assembler.run()
            finally:
                for w in workers:
                    w.join()
        if self._errors:
            raise self._errors[0]
        if self._stop.is_set():
            raise _Aborted()
        return self.assembler.sha.hexdigest()

    def _guard(self, work: Callable[[_Connection], None]) -> None:
        conn = _Connection(*self._address, self.plan, self._live, self._live_lock)
        try:
            work(conn)
        except _Aborted:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to run(), which raises it in the caller
            with self._claim_lock:
                if not self._stop.is_set():
                    self._errors.append(exc)
            self.abort()
        finally:
            conn.close()

    # -- work ------------------------------------------------------------------------------------------------------

    def _segments(self, conn: _Connection) -> None:
        plan = self.plan
        assert plan.total is not None
        while not self._stop.is_set():
            with self._claim_lock:
                start = self._next_segment * plan.segment
                self._next_segment += 1
            if start >= plan.total:
                return
            self._fetch(conn, start, min(plan.total, start + plan.segment))

    def _whole(self, conn: _Connection) -> None:
        end = self._fetch(conn, 0, None)
        self.assembler.finish(end)

    def _fetch(self, conn: _Connection, start: int, end: int | None) -> int:
        """Bytes ``[start, end)`` (``end`` None: to the end) into the file, resumed after cuts; returns the end."""
        plan = self.plan
        pos = start
        attempt = 0
        scratch: bytearray | None = None
        while end is None or pos < end:
            if self._stop.is_set():
                raise _Aborted()
            extra = {"accept-encoding": "identity"}
            ranged = plan.method == "GET" and (pos > 0 or end is not None)
            if ranged:
                extra["range"] = f"bytes={pos}-" + ("" if end is None else str(end - 1))
                if self._etag:
                    extra["if-range"] = self._etag
            try:
                target, headers = self._headers(extra)
                response = conn.request(plan.method, target, headers)
                status = response.status_code
                if status >= 500 and attempt < plan.retries:
                    conn.reusable = False
                    raise ConnectionError(f"server answered {status}")
                if status >= 400:
                    body = conn.read_small_body()
                    try:
                        payload = json.loads(body)
                    except ValueError:
                        payload = None
                    raise error_from_payload(status, payload)
                self._etag = _header(response, b"etag") or self._etag
                self._check(response, ranged, pos, end)
                while True:
                    buf = self.assembler.take()
                    pooled = buf is not None
                    if buf is None:
                        scratch = scratch or bytearray(plan.piece)
                        buf = scratch
                    view = memoryview(buf)
                    if end is not None:
                        view = view[: min(len(view), end - pos)]
                    filled = 0
                    try:
                        while filled < len(view) and (n := conn.readinto(view[filled:])):
                            filled += n
                    finally:
                        if filled:
                            self.assembler.deposit(pos, buf, filled, pooled)
                            pos += filled
                            attempt = 0  # progress was made: a later cut starts a fresh retry budget
                        elif pooled:
                            self.assembler.give_back(buf)
                    if self._stop.is_set():
                        raise _Aborted()
                    if plan.total is not None and pos > plan.total:
                        raise SizeMismatch(f"server sent more than the {plan.total} bytes the descriptor declares")
                    if filled < len(view) or (end is not None and pos >= end):
                        break
                if end is None:
                    return pos
                if pos < end:
                    raise ConnectionError("response ended early")
            except (OSError, h11.ProtocolError) as exc:
                conn.close()
                if self._stop.is_set():
                    raise _Aborted() from None
                attempt += 1
                if attempt > plan.retries:
                    raise RemoteError(f"download failed after {plan.retries} retries: {exc}") from exc
                if self._stop.wait(min(0.1 * 2**attempt, 5.0)):
                    raise _Aborted() from None
        return pos

    def _check(self, response: h11.Response, ranged: bool, pos: int, end: int | None) -> None:
        total = self.plan.total
        if ranged:
            if response.status_code != 206:
                raise RangeIgnored()
            content_range = _header(response, b"content-range") or ""
            if not content_range.startswith(f"bytes {pos}-"):
                raise RemoteError(f"asked for bytes from {pos}, got Content-Range {content_range!r}")
            complete = content_range.rpartition("/")[2]
            if total is not None and complete.isdigit() and int(complete) != total:
                raise SizeMismatch(f"server holds {complete} bytes, descriptor declares {total}")
            return
        if response.status_code != 200:
            raise RemoteError(f"unexpected HTTP {response.status_code}")
        length = _content_length(response)
        if total is not None and length is not None and length != total:
            raise SizeMismatch(f"server sends {length} bytes, descriptor declares {total}")


def pwrite_all(fd: int, data: memoryview | bytes, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (pwrite may write less than asked)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def hash_range(fd: int, sha: hashlib._Hash, start: int, end: int, buffer_size: int) -> None:
    """Feed the bytes [start, end) of the file to ``sha``, read back in pieces of ``buffer_size``."""
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(buffer_size, end - pos), pos)
        if not chunk:
            raise SizeMismatch("downloaded file is shorter than expected")
        sha.update(chunk)
        pos += len(chunk)


__all__ = ["Assembler", "FetchPlan", "Fetcher", "RangeIgnored", "TransferError", "lean_path_possible"]
