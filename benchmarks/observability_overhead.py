"""What the observability middleware (metrics, request id, access line) costs per request.

1. In process, no network: the middleware around an application that answers at once, versus that application
   alone; the difference is the middleware's CPU time per request (process CPU time, best of five rounds).
2. End to end: sequential 4 KiB uploads (POST /v1/files, keep-alive) to a real uvicorn on loopback, with the
   middleware and with it taken out of the same app; medians of per-request latency.

    python -m benchmarks.observability_overhead [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from transfer.api.middleware.observability import JsonFormatter, Observability, ObservabilityMiddleware
from transfer.settings import Settings


async def _bare(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}", "more_body": False})


async def _in_process(n: int) -> tuple[float, float]:
    settings = Settings(data_dir=Path(tempfile.mkdtemp()))
    wrapped = ObservabilityMiddleware(_bare, Observability(settings))
    body = os.urandom(4096)
    scope = {"type": "http", "method": "POST", "path": "/v1/files", "headers": [(b"content-length", b"4096")]}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        return None

    async def rounds(app: Any) -> float:
        best = float("inf")
        for _ in range(5):
            began = time.process_time()  # CPU time: the machine may be shared, waiting for a core is not cost
            for _ in range(n):
                await app(dict(scope), receive, send)
            best = min(best, (time.process_time() - began) / n)
        return best

    return await rounds(_bare), await rounds(wrapped)


def _end_to_end(n: int, observed: bool) -> float:
    from devtools.serving import serve_in_thread
    from transfer.hosts import create_app

    settings = Settings(data_dir=Path(tempfile.mkdtemp()), signing_keys={"t": "0123456789abcdef0123"})
    app = create_app(settings)
    if not observed:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not ObservabilityMiddleware]
    body = os.urandom(4096)
    url, server, thread = serve_in_thread(app)
    try:
        with httpx.Client(base_url=url) as client:
            times = []
            for i in range(n):
                began = time.perf_counter()
                response = client.post("/v1/files", params={"name": f"s{i}"}, content=body)
                times.append(time.perf_counter() - began)
                assert response.status_code == 201
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    return statistics.median(times[n // 10 :])  # the first tenth warms up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    access = logging.getLogger("transfer.access")  # the JSON line is formatted and written, as in production
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
    handler.setFormatter(JsonFormatter())
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False  # as configure_logging sets
    logging._srcfile = None
    bare, wrapped = asyncio.run(_in_process(args.requests))
    cost = (wrapped - bare) * 1e6
    print(f"in process: bare {bare * 1e6:.1f} µs, with middleware {wrapped * 1e6:.1f} µs: +{cost:.1f} µs per request")
    without = _end_to_end(args.requests, observed=False)
    with_ = _end_to_end(args.requests, observed=True)
    print(
        f"4 KiB uploads, median latency: without {without * 1e3:.3f} ms, with {with_ * 1e3:.3f} ms "
        f"({(with_ - without) * 1e6:+.0f} µs, {(with_ / without - 1) * 100:+.1f} %)"
    )


if __name__ == "__main__":
    main()
