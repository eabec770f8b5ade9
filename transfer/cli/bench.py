"""``transfer bench``: measure a deployment from the outside, as its users see it.

For each size (generated random files, and optionally the user's own file): upload in one stream, upload as a
chunked session with parallel chunks, resolve (download + verify) — MB/s each — and the time to the first byte of
a download; then many small uploads at once for requests/s and p50/p99 latency. Everything it uploads is deleted
afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transfer.cli.console import CliError, _api_key
from transfer.client.client import AsyncTransferClient
from transfer.client.resolver import ResolveOptions

MB = 1_000_000
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``16M``, ``1G``, ``4096`` -> bytes."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


@dataclass
class SizeResult:
    label: str
    size: int
    upload_mbps: float
    chunked_mbps: float
    resolve_mbps: float
    ttfb_ms: float


def _write_random(path: Path, size: int) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)


async def _measure(client: AsyncTransferClient, path: Path, label: str, workdir: Path) -> SizeResult:
    size = path.stat().st_size
    uploaded: list[str] = []
    start = time.perf_counter()
    single = await client.upload(path, inline=False)
    upload_s = time.perf_counter() - start
    uploaded.append((single.metadata or {})["file_id"])
    start = time.perf_counter()
    chunked = await client.upload_chunked(path, remember=None)
    chunked_s = time.perf_counter() - start
    uploaded.append((chunked.metadata or {})["file_id"])
    assert single.url is not None
    start = time.perf_counter()
    async with client.http.stream("GET", single.url, headers={"accept-encoding": "identity"}) as response:
        async for _ in response.aiter_raw(64 << 10):
            break
    ttfb = time.perf_counter() - start
    out = workdir / f"resolved-{label}"
    start = time.perf_counter()
    await client.resolve(single, out)
    resolve_s = time.perf_counter() - start
    out.unlink()
    for file_id in uploaded:
        await client.delete(file_id)
    return SizeResult(label, size, size / upload_s / MB, size / chunked_s / MB, size / resolve_s / MB, ttfb * 1000)


async def _small(client: AsyncTransferClient, count: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    ids: list[str] = []
    slots = asyncio.Semaphore(concurrency)
    body = os.urandom(4096)

    async def one() -> None:
        async with slots:
            started = time.perf_counter()
            d = await client.upload(body, name="small.bin")
            latencies.append(time.perf_counter() - started)
            ids.append((d.metadata or {})["file_id"])

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    took = time.perf_counter() - start
    for file_id in ids:
        await client.delete(file_id)
    latencies.sort()
    return {
        "requests_per_s": count / took,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }


async def run_bench(
    server: str,
    sizes: list[int],
    own_file: Path | None,
    connections: int,
    small: int,
    progress: bool = True,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Every measurement as a dict (the CLI prints it as a table or JSON)."""
    results: list[SizeResult] = []
    options = ResolveOptions(connections=connections)
    async with AsyncTransferClient(server, options=options, api_key=api_key) as client:
        with tempfile.TemporaryDirectory(prefix="transfer-bench-") as tmp:
            workdir = Path(tmp)
            for size in sizes:
                path = workdir / f"random-{size}"
                await asyncio.to_thread(_write_random, path, size)
                if progress:
                    print(f"measuring {size / (1 << 20):.0f} MiB ...", flush=True, file=sys.stderr)
                results.append(await _measure(client, path, f"{size / (1 << 20):.0f} MiB random", workdir))
                path.unlink()
            if own_file is not None:
                if progress:
                    print(f"measuring {own_file} ...", flush=True, file=sys.stderr)
                results.append(await _measure(client, own_file, own_file.name, workdir))
        small_result = await _small(client, small, 16) if small else None
    return {
        "server": server,
        "connections": connections,
        "sizes": [r.__dict__ for r in results],
        "small_objects": small_result,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"server {report['server']} (chunked uploads: {report['connections']} parallel chunks)",
        "",
        f"{'content':<24}{'upload MB/s':>13}{'chunked MB/s':>14}{'resolve MB/s':>14}{'TTFB ms':>10}",
    ]
    for r in report["sizes"]:
        lines.append(
            f"{r['label']:<24}{r['upload_mbps']:>13.0f}{r['chunked_mbps']:>14.0f}{r['resolve_mbps']:>14.0f}"
            f"{r['ttfb_ms']:>10.1f}"
        )
    s = report.get("small_objects")
    if s:
        lines += [
            "",
            f"4 KiB uploads, 16 at once: {s['requests_per_s']:.0f} req/s, p50 {s['p50_ms']:.1f} ms, "
            f"p99 {s['p99_ms']:.1f} ms",
        ]
    return "\n".join(lines)


async def cmd_bench(args: argparse.Namespace) -> int:
    try:
        sizes = [parse_size(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError as exc:
        raise CliError("invalid_request", f"--sizes: {exc}") from exc
    own = Path(args.file) if args.file else None
    if own is not None and not own.is_file():
        raise CliError("invalid_request", f"{args.file}: no such file")
    report = await run_bench(
        args.server, sizes, own, args.connections, args.small, progress=not args.json, api_key=_api_key(args)
    )
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0
