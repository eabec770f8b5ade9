"""Memory under decompression bombs: a fresh server's RSS while it decodes uploads that expand ~1000:1 or more.

Cases (each on its own fresh ``transfer serve`` process, idle RSS taken after one small warm-up upload):
    gzip x3             three concurrent uploads of 1 GiB of zeros, gzip-compressed (~1 MiB each),
                        ``Content-Encoding: gzip``: decoded while streaming, stored as is
    zstd x1             one upload of 1 GiB of zeros with 128 random bytes per MiB, zstd-compressed (8 MiB window,
                        ~150 KiB: ~7,000:1, under the service's 10,000:1 guard, so all of it is decoded)
    gzip->zstd x1       one gzip bomb stored with ``encoding=zstd``: decoded and encoded again by the service
    zstd pure zeros x1  1 GiB of zeros in ~32 KiB of zstd: refused by the ratio guard (413) once 16 MiB came out

The RSS is sampled every 10 ms with psutil during the uploads (peak), and once more a second after they finished
(after). Bounded decoding shows as a peak a few ``buffer_size`` above idle per upload, whatever the expansion, and
as an "after" figure back near idle. The bombs are built in a streaming way (never 1 GiB in this process).
"""

from __future__ import annotations

import random
import shutil
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import zstandard
from isal import isal_zlib

from benchmarks.e2e import service

MiB = 1 << 20


def gzip_zeros(size: int) -> bytes:
    """``size`` bytes of zeros as one gzip member (~1 MiB per GiB), compressed 1 MiB at a time."""
    compressor = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)  # as small as zlib -9, 30x faster
    zeros = bytes(MiB)
    parts = [compressor.compress(zeros[: min(MiB, size - done)]) for done in range(0, size, MiB)]
    parts.append(compressor.flush())
    return b"".join(parts)


def zstd_zeros(size: int, noise: int = 0) -> bytes:
    """``size`` bytes of zeros as one zstd frame with an 8 MiB window (the most RFC 9659 lets a decoder ask);
    ``noise`` random bytes in each MiB keep the ratio under the service's 10,000:1 guard (128: ~7,000:1)."""
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=23)
    compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
    parts = []
    for done in range(0, size, MiB):
        block = bytearray(min(MiB, size - done))
        if noise:
            at = random.randrange(len(block) - noise) if len(block) > noise else 0
            block[at : at + noise] = random.randbytes(min(noise, len(block)))
        parts.append(compressor.compress(bytes(block)))
    parts.append(compressor.flush())
    return b"".join(parts)


class RssSampler:
    """The peak RSS of a process, sampled in a thread while the block runs."""

    def __init__(self, pid: int, interval: float = 0.01) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self.peak = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def _upload(url: str, body: bytes, coding: str, params: dict[str, str], expect: int = 201) -> dict[str, Any]:
    response = httpx.post(
        f"{url}/v1/files",
        params={"inline": "false", **params},
        content=body,
        headers={"content-encoding": coding, "content-type": "application/octet-stream"},
        timeout=600,
    )
    if response.status_code != expect:
        raise RuntimeError(f"bomb upload answered {response.status_code}: {response.text[:300]}")
    doc: dict[str, Any] = response.json()
    if expect != 201:
        return {"size": None, "refused": doc["error"]["code"]}
    return doc


def _case(name: str, workdir: Path, decoded: int, uploads: list[Callable[[str], dict[str, Any]]]) -> dict[str, Any]:
    run_dir = workdir / f"bomb-{name.replace(' ', '-').replace('>', '')}"
    run_dir.mkdir()
    try:
        with service(run_dir, run_dir / "data") as (url, pid):
            _upload(url, zlib.compress(b"warm-up " * 1000), "deflate", {})
            time.sleep(0.5)
            idle = psutil.Process(pid).memory_info().rss
            started = time.perf_counter()
            with RssSampler(pid) as sampler, ThreadPoolExecutor(len(uploads)) as pool:
                results = list(pool.map(lambda up: up(url), uploads))
            seconds = time.perf_counter() - started
            if any(r["size"] not in (decoded, None) for r in results):
                raise RuntimeError(f"{name}: stored sizes {[r['size'] for r in results]}, expected {decoded}")
            time.sleep(1.0)
            after = psutil.Process(pid).memory_info().rss
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "case": name,
        "uploads": len(uploads),
        "decoded_bytes_each": decoded,
        "idle_rss": idle,
        "peak_rss": sampler.peak,
        "after_rss": after,
        "refused": results[0].get("refused"),
        "seconds": round(seconds, 2),
        "decoded_MBps": round(len(uploads) * decoded / seconds / 1e6),
    }


def run_bombs(decoded: int, workdir: Path) -> list[dict[str, Any]]:
    """The three cases above with bombs of ``decoded`` bytes of zeros each."""
    gz = gzip_zeros(decoded)
    zs = zstd_zeros(decoded, noise=128)
    zs_pure = zstd_zeros(decoded)
    rows = [
        _case("gzip x3", workdir, decoded, [lambda url: _upload(url, gz, "gzip", {})] * 3),
        _case("zstd x1", workdir, decoded, [lambda url: _upload(url, zs, "zstd", {})]),
        _case("gzip->zstd x1", workdir, decoded, [lambda url: _upload(url, gz, "gzip", {"encoding": "zstd"})]),
        _case("zstd pure zeros x1", workdir, decoded, [lambda url: _upload(url, zs_pure, "zstd", {}, 413)]),
    ]
    for row, body in zip(rows, (gz, zs, gz, zs_pure), strict=True):
        row["encoded_bytes_each"] = len(body)
    return rows


def bombs_table(rows: list[dict[str, Any]]) -> str:
    """Server RSS while decoding bombs (bounded: peak a few MiB above idle, and back afterwards)."""
    lines = [
        "| bomb upload | each: sent → decoded | idle RSS | peak RSS | RSS 1 s after | decoded MB/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['encoded_bytes_each'] / 1024:.0f} KiB → {r['decoded_bytes_each'] >> 20} MiB | "
            f"{r['idle_rss'] / MiB:.0f} MiB | {r['peak_rss'] / MiB:.0f} MiB | {r['after_rss'] / MiB:.0f} MiB | "
            f"{r['decoded_MBps'] if r['refused'] is None else 'refused: ' + r['refused']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":  # python -m benchmarks.bombs [MiB]: this section alone
    import sys
    import tempfile

    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    with tempfile.TemporaryDirectory(prefix="transfer-bombs-") as tmp:
        print(bombs_table(run_bombs(size * MiB, Path(tmp))))
