"""What a pre-upload hook and a webhook subscription cost the upload paths: the same uploads to ``transfer serve``
(pinned to CPU 0) without hooks or events, and with ``TRANSFER_EVENTS=true``, a subscription and
``TRANSFER_HOOK_URL``, both answered by a local receiver (a keep-alive ``http.server`` on loopback, as small as the
example of docs/HOOKS.md) in this process on CPU 1, beside the client.

    small    sequential 4 KiB POST /v1/files over one keep-alive connection: uploads/s (median of rounds)
    small×8  the same from 8 threads at once: uploads/s
    large    curl streaming a 256 MiB file as the raw body of POST /v1/files: MB/s (best of ``--reps``)

Each row is measured for both configurations in alternation, rounds interleaved, so drift on a shared host falls on
both alike; the report gives the ratio with/without and checks every event arrived (one per upload).

    python -m benchmarks.events_overhead [--small 400] [--size 256] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from benchmarks.e2e import curl_upload, make_file, service

MB = 1_000_000


class _Counting(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the service's clients reuse their connections
    events = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - the http.server name
        self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path == "/pre-upload":
            answer = b'{"allow": true, "metadata": {"project": "bench"}}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
            return
        with _Counting.lock:
            _Counting.events += 1
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server signature
        pass


@contextmanager
def receiver() -> Iterator[str]:
    """The hook and webhook receiver on loopback; yields its base URL."""
    os.sched_setaffinity(0, {1})  # this process (client and receiver) on CPU 1, the service on CPU 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def served(workdir: Path, hooked_to: str | None) -> Iterator[str]:
    """``transfer serve`` on a fresh data directory, with the hook and a subscription to ``hooked_to`` (or none)."""
    env = {**os.environ, "TRANSFER_SIGNING_KEYS": json.dumps({"b": "0123456789abcdef0123"})}
    if hooked_to is not None:
        env |= {
            "TRANSFER_EVENTS": "true",
            "TRANSFER_HOOK_URL": f"{hooked_to}/pre-upload",
            "TRANSFER_HOOKS_ALLOW_NETWORKS": json.dumps(["127.0.0.0/8"]),
        }
    workdir.mkdir(parents=True)
    with service(workdir, workdir / "data", env) as (url, _pid):
        if hooked_to is not None:
            made = httpx.post(f"{url}/v1/admin/subscriptions", json={"url": f"{hooked_to}/webhooks"}, timeout=30)
            made.raise_for_status()
        yield url


def small_sequential(url: str, count: int) -> float:
    body = os.urandom(4096)
    with httpx.Client(base_url=url, timeout=60) as http:
        began = time.perf_counter()
        for i in range(count):
            http.post("/v1/files", params={"name": f"s{i}"}, content=body).raise_for_status()
        return count / (time.perf_counter() - began)


def small_parallel(url: str, count: int, threads: int = 8) -> float:
    body = os.urandom(4096)

    def one_thread(t: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            for i in range(count // threads):
                http.post("/v1/files", params={"name": f"p{t}-{i}"}, content=body).raise_for_status()

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one_thread, range(threads)))
    return (count // threads * threads) / (time.perf_counter() - began)


def large(url: str, src: Path, workdir: Path) -> float:
    began = time.perf_counter()
    subprocess.run(curl_upload(src, f"{url}/v1/files?name=big.bin", workdir / "answer.json"), check=True)
    return src.stat().st_size / (time.perf_counter() - began) / MB


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=400, help="4 KiB uploads per round")
    parser.add_argument("--size", type=int, default=256, help="MiB of the large upload")
    parser.add_argument("--reps", type=int, default=3, help="rounds of each row and configuration")
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {}
    sent = 0
    with tempfile.TemporaryDirectory() as tmp, receiver() as hooks:
        root = Path(tmp)
        src = root / "big.bin"
        make_file(src, args.size << 20)
        for rep in range(args.reps):
            for name, hooked_to in (("none", None), ("hook + subscription", hooks)):
                workdir = root / f"{rep}-{'hooked' if hooked_to else 'plain'}"
                with served(workdir, hooked_to) as url:
                    small_sequential(url, args.small // 10)  # warm-up
                    measures: list[tuple[str, Callable[[str], float]]] = [
                        ("small 4 KiB, sequential (uploads/s)", lambda u: small_sequential(u, args.small)),
                        ("small 4 KiB, 8 at once (uploads/s)", lambda u: small_parallel(u, args.small)),
                        (f"large {args.size} MiB, curl (MB/s)", partial(large, src=src, workdir=workdir)),
                    ]
                    for row, measure in measures:
                        rows.setdefault(row, {}).setdefault(name, []).append(measure(url))
                    if hooked_to is not None:
                        sent += args.small // 10 + args.small + args.small // 8 * 8 + 1
        deadline = time.monotonic() + 60
        while _Counting.events < sent and time.monotonic() < deadline:
            time.sleep(0.1)
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores); service on CPU 0, client and receiver on CPU 1")
    print("| row | none | hook + subscription | ratio |")
    print("|---|---|---|---|")
    for row, by in rows.items():
        pick = max if row.startswith("large") else statistics.median
        plain, hooked = pick(by["none"]), pick(by["hook + subscription"])
        print(f"| {row} | {plain:,.0f} | {hooked:,.0f} | {hooked / plain:.2f} |")
    print(f"events delivered: {_Counting.events} of {sent} uploads (one file.published each)")


if __name__ == "__main__":
    main()
