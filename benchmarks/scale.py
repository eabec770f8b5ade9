"""``python -m benchmarks.scale``: per-request latency against how much is stored (issue 12's table).

For each stored-object count (default 0, 10,000 and 100,000; ``--counts``) the data directory is filled up to that
count with 64-byte files owned by another key, written through the service's own publish path (FileService.upload,
in-process, ``--concurrency`` at once: no HTTP), then a fresh ``transfer serve`` on it is timed, median of
``--reps``, as a new client would meet it:

    tus                 tus create + one 1 MiB PATCH + HEAD
    session             session open + one 1 MiB chunk PUT + status
    list                ``GET /v1/files`` first page (open mode: the all-files listing, 100 per page)
    upload 4 KiB        one 4 KiB POST /v1/files
    page all            time to page through every stored file, 1,000 a page (once per count)

Prints the table and the ratio of the largest count to 0 per column (the goal is at most 1.2x). Local storage only:
the S3 cells need the S3 test server launcher, which lives under tests/ until it moves (see the README).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import xxhash

from benchmarks.e2e import service
from benchmarks.summary import machine
from storage.local import LocalStorage
from transfer.core.uploads.state import FileIntent
from transfer.service.container import Services
from transfer.service.files.ingest import UploadRequest
from transfer.settings import Settings

MiB = 1 << 20
TUS = {"tus-resumable": "1.0.0"}
PAGE = 100  # files on the first page of GET /v1/files


async def populate(data_dir: Path, have: int, want: int, concurrency: int) -> float:
    """Store ``want - have`` more 64-byte files owned by another key; returns the seconds it took."""
    if want <= have:
        return 0.0
    settings = Settings(data_dir=data_dir, signing_keys={"bench": "0123456789abcdef0123"})
    files = Services.build(settings, LocalStorage(data_dir)).files
    await files.start()
    left = want - have
    start = time.perf_counter()

    async def one() -> AsyncIterator[bytes]:
        yield os.urandom(64)

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await files.upload(one(), UploadRequest(owner="someone-else", intent=FileIntent(name="other.bin")))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await files.close()
    return time.perf_counter() - start


def median_ms(fn: Callable[[httpx.Client], None], http: httpx.Client, reps: int) -> float:
    fn(http)  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(http)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def tus_case(http: httpx.Client) -> None:
    body = os.urandom(MiB)
    created = http.post("/tus/files/", headers={**TUS, "upload-length": str(len(body))})
    created.raise_for_status()
    url = created.headers["location"]
    http.patch(
        url, content=body, headers={**TUS, "upload-offset": "0", "content-type": "application/offset+octet-stream"}
    ).raise_for_status()
    http.head(url, headers=TUS).raise_for_status()


def session_case(http: httpx.Client) -> None:
    body = os.urandom(MiB)
    opened = http.post("/v1/sessions", json={"size": len(body), "chunk_size": MiB})
    opened.raise_for_status()
    sid = opened.json()["streaming_session_id"]
    checksum = "xxh3-128:" + xxhash.xxh3_128_hexdigest(body)
    http.put(f"/v1/sessions/{sid}/chunks/0", content=body, headers={"chunk-checksum": checksum}).raise_for_status()
    http.get(f"/v1/sessions/{sid}").raise_for_status()


def list_case(http: httpx.Client) -> None:
    http.get("/v1/files").raise_for_status()


def small_case(http: httpx.Client) -> None:
    http.post("/v1/files?name=small.bin", content=os.urandom(4096)).raise_for_status()


def page_all(http: httpx.Client) -> tuple[float, int]:
    start = time.perf_counter()
    seen = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        response = http.get("/v1/files", params=params)
        response.raise_for_status()
        body = response.json()
        seen += len(body["files"])
        cursor = body.get("next_cursor")
        if not cursor:
            return time.perf_counter() - start, seen


CASES = {"tus": tus_case, "session": session_case, "list": list_case, "upload 4 KiB": small_case}


def run_scale(counts: list[int], reps: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    data_dir = workdir / "data"
    data_dir.mkdir()
    have = 0
    rows = []
    for count in sorted(counts):
        filled = asyncio.run(populate(data_dir, have, count, concurrency))
        have = max(have, count)
        with service(workdir, data_dir) as (url, _pid), httpx.Client(base_url=url, timeout=600) as http:
            row: dict[str, Any] = {"stored": count, "populate_s": round(filled, 1)}
            for name, fn in CASES.items():
                row[name] = round(median_ms(fn, http, reps), 1)
            seconds, seen = page_all(http)
            row["page all s"] = round(seconds, 2)
            row["paged"] = seen
        rows.append(row)
        print(row, flush=True)
    return {"machine": machine(), "reps": reps, "rows": rows}


def scale_table(report: dict[str, Any]) -> str:
    rows = report["rows"]
    head = "| stored objects | " + " | ".join(f"{name} (ms)" for name in CASES) + " | page through all (s) |"
    lines = [
        f"Per-request latency against stored objects, local storage, median of {report['reps']} — {report['machine']}",
        "",
        head,
        "|" + "---|" * (len(CASES) + 2),
    ]
    for row in rows:
        cells = " | ".join(f"{row[name]:.1f}" for name in CASES)
        lines.append(f"| {row['stored']:,} | {cells} | {row['page all s']:.2f} ({row['paged']:,} files) |")
    if len(rows) > 1 and rows[0]["stored"] == 0:
        last = rows[-1]
        ratios = " | ".join(f"{last[name] / rows[0][name]:.2f}×" for name in CASES)
        lines.append(f"| {last['stored']:,} vs 0 | {ratios} | |")
    # with nothing stored the listing's page holds only the benchmark's own few files: against the smallest count
    # that fills a page (100 files), the list column compares pages of the same size
    full = [row for row in rows[:-1] if row["stored"] >= PAGE]
    if full and len(rows) > 1:
        first, last = full[0], rows[-1]
        ratios = " | ".join(f"{last[name] / first[name]:.2f}×" for name in CASES)
        lines.append(f"| {last['stored']:,} vs {first['stored']:,} | {ratios} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="0,10000,100000", help="stored-object counts (default 0,10000,100000)")
    parser.add_argument("--reps", type=int, default=5, help="runs per cell (median; default 5)")
    parser.add_argument("--concurrency", type=int, default=16, help="uploads at once while populating")
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",") if c.strip()]
    with tempfile.TemporaryDirectory(prefix="transfer-scale-") as tmp:
        report = run_scale(counts, args.reps, args.concurrency, Path(tmp))
    print(scale_table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
