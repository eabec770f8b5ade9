"""Network-shaped cases: uploads over an emulated wide-area link, and many small objects at once.

The link emulator is a small userspace TCP proxy on loopback (``tc netem`` is not available in this kernel):
every connection is capped at ``rate`` bytes/s in each direction and every byte is delayed by ``latency`` seconds
one way (a round trip of twice that), so one TCP stream cannot go faster than the cap while parallel chunk uploads
(one connection each) can. The cap is per connection, not shared: it stands for a wide-area path whose limit is
each connection's window over the round trip (a 2 MB window at a 40 ms round trip is 50 MB/s), not a shared
bottleneck link (there, no number of connections beats one stream, and no client could reach the goal). It does not
emulate slow start or loss. The proxy runs on one thread of the benchmark process, unpinned; it costs up to ~2.5
CPU-seconds per GiB relayed (measured with raw senders), so on a loaded machine the x4 case, which needs four
times the relay rate of one stream, is the first to be starved.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from benchmarks.e2e import Case, curl_upload, free_port, pin, service, timed

MB = 1_000_000


class LinkEmulator:
    """A TCP proxy whose connections each behave like a ``rate``-capped link with ``latency`` one-way delay."""

    def __init__(self, target_port: int, rate: float = 50 * MB, latency: float = 0.020) -> None:
        self.target_port = target_port
        self.rate = rate
        self.latency = latency
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._writers: list[asyncio.StreamWriter] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
            self._ready.set()
            await self._stop.wait()
            server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)  # every connection closed before the loop
            for writer in self._writers:
                writer.close()
            await server.wait_closed()

        try:
            self._loop.run_until_complete(main())
        finally:
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=64)

        async def receive() -> None:
            while data := await reader.read(64 << 10):
                await queue.put((time.monotonic() + self.latency, data))
            await queue.put(None)

        async def deliver() -> None:
            clock = time.monotonic()
            while (item := await queue.get()) is not None:
                due, data = item
                clock = max(clock, due) + len(data) / self.rate  # serialisation at the link rate
                delay = clock - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(receive(), deliver())
        except (ConnectionError, OSError):
            writer.close()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self._writers.append(client_writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.close()
            return
        self._writers.append(up_writer)
        try:
            await asyncio.gather(
                self._pipe(client_reader, up_writer), self._pipe(up_reader, client_writer), return_exceptions=True
            )
        except asyncio.CancelledError:
            pass  # closed at exit: end quietly (a cancelled handler task is reported by asyncio's stream callback)

    def __enter__(self) -> LinkEmulator:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def run_wan(src: Path, reps: int, workdir: Path, connections: int = 4) -> dict[str, Any]:
    """Single-stream upload vs ``transfer upload --chunked`` with ``connections`` parallel chunks, both through the
    emulated 50 MB/s, 20 ms link."""
    size = src.stat().st_size
    case = Case(
        f"upload over a 50 MB/s, 20 ms link: --chunked x{connections}",
        size,
        baseline="single stream (curl) through the same link",
    )
    (workdir / "wan").mkdir(exist_ok=True)
    with service(workdir / "wan", workdir / "wan" / "data") as (url, _pid):
        port = int(url.rsplit(":", 1)[1])
        with LinkEmulator(port) as link:
            via = f"http://127.0.0.1:{link.port}"
            for i in range(reps):
                case.ours_s.append(
                    timed(
                        [
                            *pin(1),
                            sys.executable,
                            "-m",
                            "transfer",
                            "upload",
                            "--server",
                            via,
                            "--chunked",
                            "--connections",
                            str(connections),
                            "--no-progress",
                            "--state-dir",
                            str(workdir / "wan" / f"state{i}"),
                            str(src),
                        ]
                    )
                )
                case.base_s.append(timed(curl_upload(src, f"{via}/v1/files", workdir / "wan" / "out.json")))
    return case.row()


def run_small_objects(requests: int, concurrency: int, workdir: Path, rounds: int = 3) -> dict[str, Any]:
    """4 KiB uploads, ``concurrency`` at once: the service (every object durable on 201) vs two minimal FastAPI
    endpoints served by the same uvicorn settings: one that reads the body and answers 200 (the non-durable sink),
    and one that also writes it to a new file and fsyncs it in a thread (``asyncio.to_thread``: the durable
    baseline, one fsync per object). The three run in turn, ``rounds`` times, each round ``requests`` uploads, so
    the ratios of one round share the machine's load of that moment: medians, and the ratios' min-max over the
    rounds. Each case also reports its server's CPU time per request (user + system, from /proc: the figure that
    does not depend on how busy the machine is)."""
    body = b"x" * 4096
    (workdir / "small").mkdir(exist_ok=True)
    cases: dict[str, list[dict[str, float]]] = {"service": [], "baseline": [], "durable_baseline": []}
    with service(workdir / "small", workdir / "small" / "data") as (url, pid), minimal_app(workdir) as (base, bpid):
        targets = {
            "service": (f"{url}/v1/files", pid),
            "baseline": (f"{base}/sink", bpid),
            "durable_baseline": (f"{base}/durable", bpid),
        }
        for target, _ in targets.values():
            _load(target, body, min(requests, 200), concurrency)  # warm-up: connections, imports, first files
        for _ in range(rounds):
            for name, (target, server_pid) in targets.items():
                before = _cpu_seconds(server_pid)
                row = _load(target, body, requests, concurrency)
                row["cpu_ms_per_request"] = round((_cpu_seconds(server_pid) - before) * 1000 / requests, 3)
                cases[name].append(row)
    out: dict[str, Any] = {"requests": requests, "concurrency": concurrency, "rounds": rounds}
    for name, rows in cases.items():
        out[name] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        out[name]["runs"] = rows
    for key, baseline in (("ratio", "baseline"), ("ratio_durable", "durable_baseline")):
        ratios = [ours["rps"] / theirs["rps"] for ours, theirs in zip(cases["service"], cases[baseline], strict=True)]
        out[key] = round(statistics.median(ratios), 2)
        out[key + "_min"], out[key + "_max"] = round(min(ratios), 2), round(max(ratios), 2)
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def minimal_app(workdir: Path) -> Iterator[tuple[str, int]]:
    """A FastAPI app under uvicorn (uvloop, httptools) with two endpoints: ``/sink`` reads the body and returns
    200; ``/durable`` also writes it to a new file and fsyncs it in a thread. Yields its URL and process id."""
    import subprocess

    port = free_port()
    store = workdir / "durable-objects"
    store.mkdir(exist_ok=True)
    code = (
        "import asyncio, os, uuid\n"
        "from fastapi import FastAPI, Request\n"
        "app = FastAPI()\n"
        f"STORE = {str(store)!r}\n"
        "@app.post('/sink')\n"
        "async def sink(request: Request) -> dict[str, int]:\n"
        "    n = 0\n"
        "    async for chunk in request.stream():\n"
        "        n += len(chunk)\n"
        "    return {'bytes': n}\n"
        "def store(data: bytes) -> None:\n"
        "    fd = os.open(os.path.join(STORE, uuid.uuid4().hex), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)\n"
        "    try:\n"
        "        os.write(fd, data)\n"
        "        os.fsync(fd)\n"
        "    finally:\n"
        "        os.close(fd)\n"
        "@app.post('/durable', status_code=201)\n"
        "async def durable(request: Request) -> dict[str, int]:\n"
        "    data = await request.body()\n"
        "    await asyncio.to_thread(store, data)\n"
        "    return {'bytes': len(data)}\n"
    )
    (workdir / "minimal_app.py").write_text(code)
    proc = subprocess.Popen(
        [
            *pin(0),
            sys.executable,
            "-m",
            "uvicorn",
            "minimal_app:app",
            "--port",
            str(port),
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--log-level",
            "warning",
        ],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                httpx.post(url + "/sink", content=b"")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


# A minimal HTTP/1.1 keep-alive load generator on raw asyncio streams: httpx's pool, not the server, was the limit
# at 64 connections (~360 req/s against an empty endpoint).
LOAD_SCRIPT = r"""
import asyncio, json, sys, time
from urllib.parse import urlsplit
url, n, c = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
u = urlsplit(url)
body = b"x" * 4096
request = (f"POST {u.path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/octet-stream\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
lat = []
left = n
async def worker():
    global left
    reader, writer = await asyncio.open_connection(u.hostname, u.port)
    while left > 0:
        left -= 1
        t = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        assert status in (200, 201), status
        lat.append(time.perf_counter() - t)
    writer.close()
async def main():
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(c)))
    took = time.perf_counter() - start
    lat.sort()
    print(json.dumps({"rps": n / took, "p50_ms": lat[len(lat) // 2] * 1000,
                      "p99_ms": lat[int(len(lat) * 0.99)] * 1000}))
asyncio.run(main())
"""


def _load(url: str, body: bytes, requests: int, concurrency: int) -> dict[str, float]:
    """Drive ``requests`` POSTs with ``concurrency`` in flight from a separate process pinned to CPU 1."""
    import subprocess

    script = LOAD_SCRIPT
    out = subprocess.run(
        [*pin(1), sys.executable, "-c", script, url, str(requests), str(concurrency)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result: dict[str, float] = {k: round(v, 1) for k, v in json.loads(out.stdout).items()}
    return result


def network_table(wan: dict[str, Any] | None, small: dict[str, Any] | None) -> str:
    lines = []
    if wan:
        lines += [
            "| case | ours MB/s | baseline | baseline MB/s | ratio median (min-max) |",
            "|---|---|---|---|---|",
            f"| {wan['case']} | {wan['ours_MBps']:.0f} | {wan['baseline']} | {wan['baseline_MBps']:.0f} | "
            f"{wan['ratio_median']:.2f}× ({wan['ratio_min']:.2f}-{wan['ratio_max']:.2f}) |",
            "",
        ]
    if small:
        s, b = small["service"], small["baseline"]
        spread = f" ({small['ratio_min']:.2f}-{small['ratio_max']:.2f})" if "ratio_min" in small else ""
        lines += [
            f"Small objects ({small['requests']} uploads of 4 KiB, {small['concurrency']} concurrent): service "
            f"{s['rps']:.0f} req/s (p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms) vs a minimal FastAPI sink "
            f"{b['rps']:.0f} req/s (p50 {b['p50_ms']:.1f} ms, p99 {b['p99_ms']:.1f} ms): {small['ratio']:.2f}×"
            f"{spread} (goal ≥ 0.3×)",
        ]
        if d := small.get("durable_baseline"):
            spread = (
                f" ({small['ratio_durable_min']:.2f}-{small['ratio_durable_max']:.2f})"
                if "ratio_durable_min" in small
                else ""
            )
            lines[-1] += (
                f"; vs a minimal FastAPI handler that writes and fsyncs each object in a thread {d['rps']:.0f} req/s "
                f"(p50 {d['p50_ms']:.1f} ms, p99 {d['p99_ms']:.1f} ms): {small['ratio_durable']:.2f}×{spread} "
                "(goal ≥ 2×)"
            )
        if "cpu_ms_per_request" in s:
            lines[-1] += (
                f". Server CPU per request: service {s['cpu_ms_per_request']:.2f} ms, sink "
                f"{b['cpu_ms_per_request']:.2f} ms, durable baseline "
                f"{small['durable_baseline']['cpu_ms_per_request']:.2f} ms"
            )
    return "\n".join(lines)


__all__ = ["LinkEmulator", "network_table", "run_small_objects", "run_wan"]
