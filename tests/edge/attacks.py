"""Tools for the connection-layer tests (``test_edge_*.py``): ``transfer serve`` as a real process on loopback
whose memory (``/proc/PID/status`` VmRSS) and descriptors (``/proc/PID/fd``) can be read, HTTP/2 frames written by
hand (an attacker does not use a well-behaved client library), the server's frames read back with ``hyperframe``,
and a bystander that measures ``/healthz`` latency while an attack runs.

``EDGE_SERVER_ROOT`` runs the server from another checkout (``python -m transfer serve`` there): how these tests
were shown to fail on the tree before the connection-layer bounds."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hpack
import httpx
from hyperframe.frame import Frame, GoAwayFrame, HeadersFrame, RstStreamFrame, SettingsFrame

from devtools.serving import free_port

SIGNING = {"t": "0123456789abcdef0123"}
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MiB = 1 << 20

# frame types and flags (RFC 9113 §6)
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
ENHANCE_YOUR_CALM, REFUSED_STREAM, CANCEL, FRAME_SIZE_ERROR = 0xB, 0x7, 0x8, 0x6


@dataclass
class Server:
    """A ``transfer serve`` process."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    data_dir: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mib(self) -> float:
        """Resident memory of the process now."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def fds(self) -> int:
        """Open descriptors of the process now."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_fds(self, at_most: int, timeout: float) -> int:
        """Descriptors once they are down to ``at_most`` (or the count when ``timeout`` ran out)."""
        deadline = time.monotonic() + timeout
        while (count := self.fds()) > at_most and time.monotonic() < deadline:
            time.sleep(0.1)
        return count

    def stop(self, sig: int = signal.SIGTERM) -> float:
        """Seconds from ``sig`` to the process's exit."""
        began = time.monotonic()
        self.proc.send_signal(sig)
        self.proc.wait(60)
        return time.monotonic() - began


@contextmanager
def serve(tmp_path: Path, **settings: Any) -> Iterator[Server]:
    """``transfer serve`` with ``settings`` (as ``TRANSFER_*`` variables; lists and dicts as JSON), its log in a
    file; stopped with SIGKILL if a test left it running."""
    port = free_port()
    data_dir = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    env = {**os.environ, "TRANSFER_SIGNING_KEYS": json.dumps(SIGNING), "TRANSFER_SHUTDOWN_DRAIN": "0"}
    for name, value in settings.items():
        env[f"TRANSFER_{name.upper()}"] = json.dumps(value) if isinstance(value, list | dict) else str(value)
    root = os.environ.get("EDGE_SERVER_ROOT")
    command = [sys.executable, "-m", "transfer", "serve", "--port", str(port), "--data-dir", str(data_dir)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*command, "--log-level", "info"],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env={**env, "PYTHONPATH": root} if root else env,
            cwd=root or tmp_path,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("service did not start: " + log_path.read_text())
            time.sleep(0.05)
        yield Server(url, port, proc, log_path, data_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def settle_rss(server: Server, seconds: float = 1.0) -> float:
    """RSS after the process has had ``seconds`` to finish what it was doing."""
    time.sleep(seconds)
    return server.rss_mib()


# --- HTTP/2 by hand ----------------------------------------------------------------------------------------------


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame's bytes (RFC 9113 §4.1)."""
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def settings_frame(values: dict[int, int] | None = None, ack: bool = False) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in (values or {}).items())
    return frame(SETTINGS, ACK if ack else 0, 0, payload)


INITIAL_WINDOW_SIZE = 0x4


class Encoder:
    """HPACK for one connection (the dynamic table is the connection's)."""

    def __init__(self) -> None:
        self.hpack = hpack.Encoder()

    def request(self, port: int, path: str, method: str = "GET", **extra: str) -> bytes:
        headers = [(":method", method), (":path", path), (":scheme", "http"), (":authority", f"127.0.0.1:{port}")]
        headers += list(extra.items())
        return bytes(self.hpack.encode(headers))


@dataclass
class Seen:
    """What the server sent on a raw connection."""

    goaway: int | None = None  # its error code
    last_stream: int | None = None
    resets: dict[int, int] = field(default_factory=dict)
    headers: set[int] = field(default_factory=set)
    status: dict[int, int] = field(default_factory=dict)  # the :status of each stream's response
    data: dict[int, int] = field(default_factory=dict)  # bytes of DATA per stream
    ended: set[int] = field(default_factory=set)
    closed: bool = False
    frames: int = 0


class RawH2:
    """A hand-driven HTTP/2 client connection: bytes out as written, frames in parsed (no client state machine)."""

    def __init__(self, port: int, *, window: int | None = None, timeout: float = 10.0, source: str = "") -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
        self.hpack = Encoder()
        self.decoder = hpack.Decoder()
        self.seen = Seen()
        self.inbox = b""
        values = {INITIAL_WINDOW_SIZE: window} if window is not None else {}
        self.send(PREFACE + settings_frame(values))
        self.next_stream = 1

    def send(self, data: bytes) -> bool:
        """Write ``data``; False once the server has closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.seen.closed = True
            return False

    def open_stream(self, path: str, *, end: bool = True, method: str = "GET") -> int:
        sid = self.next_stream
        self.next_stream += 2
        block = self.hpack.request(self.port, path, method)
        self.send(frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, block))
        return sid

    def read(self, until: Any = None, timeout: float = 10.0) -> Seen:
        """Read frames until ``until(seen)`` holds (after taking what has arrived), the connection closes or
        ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        self.sock.settimeout(min(0.2, timeout))
        while not self.seen.closed:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                chunk = None
            except OSError:
                self.seen.closed = True
                break
            if chunk == b"":
                self.seen.closed = True
                break
            if chunk:
                self.inbox += chunk
                self._parse()
                continue  # more may be waiting: take it before judging
            if (until is not None and until(self.seen)) or time.monotonic() >= deadline:
                break
        return self.seen

    def _parse(self) -> None:
        while len(self.inbox) >= 9:
            length = int.from_bytes(self.inbox[:3], "big")
            if len(self.inbox) < 9 + length:
                return
            head, body = self.inbox[:9], self.inbox[9 : 9 + length]
            self.inbox = self.inbox[9 + length :]
            parsed, _ = Frame.parse_frame_header(memoryview(head))
            parsed.parse_body(memoryview(body))
            self.seen.frames += 1
            if isinstance(parsed, GoAwayFrame):
                self.seen.goaway = parsed.error_code
                self.seen.last_stream = parsed.last_stream_id
            elif isinstance(parsed, RstStreamFrame):
                self.seen.resets[parsed.stream_id] = parsed.error_code
            elif isinstance(parsed, HeadersFrame):  # (the server sends no CONTINUATION: its blocks are small)
                self.seen.headers.add(parsed.stream_id)
                fields = dict(self.decoder.decode(parsed.data, raw=True))
                if b":status" in fields:
                    self.seen.status[parsed.stream_id] = int(fields[b":status"])
                if "END_STREAM" in parsed.flags:
                    self.seen.ended.add(parsed.stream_id)
            elif isinstance(parsed, SettingsFrame) and "ACK" not in parsed.flags:
                self.send(settings_frame(ack=True))
            elif parsed.type == DATA:
                self.seen.data[parsed.stream_id] = self.seen.data.get(parsed.stream_id, 0) + length
                if "END_STREAM" in parsed.flags:
                    self.seen.ended.add(parsed.stream_id)

    def close(self) -> None:
        self.sock.close()


# --- a bystander ---------------------------------------------------------------------------------------------------


class Bystander:
    """A well-behaved client asking ``/healthz`` every ``every`` seconds on its own HTTP/1.1 connection while an attack
    runs; the latencies are what the attack cost someone else."""

    def __init__(self, url: str, every: float = 0.01) -> None:
        self.url = url
        self.every = every
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Bystander:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            http.get("/healthz")  # the connection, before the clock
            while not self._stop.is_set():
                began = time.perf_counter()
                try:
                    status = http.get("/healthz").status_code
                    if status != 200:
                        self.failures.append(str(status))
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.latencies.append(time.perf_counter() - began)
                time.sleep(self.every)

    def p99(self) -> float:
        assert len(self.latencies) >= 20, self.latencies
        return statistics.quantiles(self.latencies, n=100)[98]


# --- attacks, each in a process of its own (``python -m tests.edge.attacks ATTACK PORT SECONDS CONNECTIONS``) --------
#
# An attacker in the test's own process would compete with the bystander for the interpreter lock, and its latency
# would measure the client, not the server.


ATTACKER = "127.0.0.2"  # the attacks' source address: loopback, but not the bystander's 127.0.0.1


def _flood(port: int, seconds: float, connections: int, make: Any) -> dict[str, Any]:
    """Open ``connections`` at a time, each sending ``make(conn)`` batches until the server closes it, reopening
    until ``seconds`` have passed (a round under way then runs to its end). Counts the connections, the GOAWAY codes
    seen (``refused``: closed before the server sent a frame, as a penalised address is) and how long each
    connection lived."""
    end = time.monotonic() + seconds
    codes: dict[str, int] = {}
    lived: list[float] = []
    opened = 0
    while time.monotonic() < end:
        conns = []
        for _ in range(connections):
            try:
                conns.append(RawH2(port, timeout=5, source=ATTACKER))
            except OSError:
                codes["refused"] = codes.get("refused", 0) + 1
        opened += len(conns)
        began = time.monotonic()
        alive = list(conns)
        while alive and time.monotonic() < end + 5:  # a round runs until its connections are cut (5 s at most)
            for conn in list(alive):
                if not conn.send(make(conn)):
                    alive.remove(conn)
                    lived.append(time.monotonic() - began)
                    conn.read(timeout=2)
                    continue
                conn.read(lambda seen: True, timeout=0.001)  # take what came (the server's answers), do not wait
                if conn.seen.closed or conn.seen.goaway is not None:
                    alive.remove(conn)
                    lived.append(time.monotonic() - began)
                    conn.read(timeout=2)
        for conn in conns:
            if conn.seen.goaway is None and not conn.seen.closed:
                conn.read(timeout=1)
            code = "refused" if conn.seen.frames == 0 else str(conn.seen.goaway)
            codes[code] = codes.get(code, 0) + 1
            conn.close()
    return {"connections": opened, "goaway": codes, "lived_max": max(lived, default=0.0)}


def _rapid_reset(conn: RawH2) -> bytes:
    out = []
    for _ in range(50):
        sid = conn.next_stream
        conn.next_stream += 2
        out.append(frame(HEADERS, END_HEADERS | END_STREAM, sid, conn.hpack.request(conn.port, "/healthz")))
        out.append(frame(RST_STREAM, 0, sid, CANCEL.to_bytes(4, "big")))
    return b"".join(out)


ATTACKS = {
    "rapid_reset": _rapid_reset,
    "settings": lambda conn: settings_frame() * 2000,
    "ping": lambda conn: frame(PING, 0, 0, b"12345678") * 2000,
    "priority": lambda conn: b"".join(frame(PRIORITY, 0, 2 * n + 1, bytes(4) + b"\x10") for n in range(2000)),
    "empty_data": lambda conn: _open_then(conn, frame(DATA, 0, 1) * 2000),
}


def _open_then(conn: RawH2, data: bytes) -> bytes:
    """An upload stream (stream 1, opened once) and then ``data``."""
    if conn.next_stream == 1:
        conn.open_stream("/v1/files?name=e.bin", end=False, method="POST")
    return data


def main(argv: list[str]) -> None:
    # a real attacker's CPU is not the server's: on this shared machine it gets what the server leaves
    os.nice(19 - os.nice(0))
    attack, port, seconds, connections = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
    print(json.dumps(_flood(port, seconds, connections, ATTACKS[attack])))


if __name__ == "__main__":
    main(sys.argv[1:])
