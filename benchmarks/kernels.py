"""CPU kernels on one core: hashing, the codings the service uses against stdlib zlib level 6, base64.

Each figure is MB/s of input (original bytes) over a 64 MiB corpus, best of ``reps`` (kernels are not disturbed
by I/O, so the best run is the kernel's speed); ratios are ours/baseline in the same run.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
import zlib
from collections.abc import Callable
from typing import Any

import pybase64
import xxhash

from transfer.core.content import ContentEncoding
from transfer.core.encodings import Base64Encoder, DecodeLimits, make_decoder, make_encoder

MB = 1_000_000
PIECE = 1 << 20


def corpus(kind: str, size: int) -> bytes:
    """``text``: repetitive structured text (logs/JSON-like); ``random``: incompressible bytes."""
    if kind == "random":
        return os.urandom(size)
    lines = []
    n = 0
    while n < size:
        line = f'{{"ts": {n}, "level": "info", "agent": "agent-{n % 97}", "msg": "transfer chunk {n % 1013} ok"}}\n'
        lines.append(line)
        n += len(line)
    return "".join(lines).encode()[:size]


def best_mbps(fn: Callable[[], object], nbytes: int, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return nbytes / best / MB


def _pieces(data: bytes) -> list[memoryview]:
    view = memoryview(data)
    return [view[i : i + PIECE] for i in range(0, len(view), PIECE)]


def _ours_encode(encoding: ContentEncoding, data: bytes, **levels: int) -> bytes:
    encoder = make_encoder(encoding, **levels)
    return b"".join([encoder.encode(p) for p in _pieces(data)] + [encoder.finish()])


def _ours_decode(encoding: ContentEncoding, blob: bytes) -> int:
    decoder = make_decoder(encoding, DecodeLimits(1 << 40), piece_size=4 * PIECE)
    total = 0
    for p in _pieces(blob):
        for out in decoder.feed(p):
            total += len(out)
    for out in decoder.finish():
        total += len(out)
    return total


def _zlib6_encode(data: bytes, wbits: int) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return b"".join([c.compress(p) for p in _pieces(data)] + [c.flush()])


def run_kernels(size: int = 64 << 20, reps: int = 3) -> list[dict[str, Any]]:
    """Every kernel row: name, ours MB/s, baseline, baseline MB/s, ratio, and output/input size for codecs."""
    rows: list[dict[str, Any]] = []
    rand = corpus("random", size)
    rows.append(_row("SHA-256 (hashlib)", best_mbps(lambda: hashlib.sha256(rand).digest(), size, reps)))
    rows.append(_row("xxh3-128 (xxhash)", best_mbps(lambda: xxhash.xxh3_128(rand).digest(), size, reps)))
    for kind in ("text", "random"):
        data = corpus(kind, size)
        for encoding, wbits in ((ContentEncoding.GZIP, 31), (ContentEncoding.DEFLATE, 15)):
            ours_blob = _ours_encode(encoding, data)
            base_blob = _zlib6_encode(data, wbits)
            rows.append(
                _row(
                    f"{encoding.value} encode, {kind} (isal level 1)",
                    best_mbps(lambda e=encoding, d=data: _ours_encode(e, d), size, reps),
                    "zlib level 6",
                    best_mbps(lambda w=wbits, d=data: _zlib6_encode(d, w), size, reps),
                    ours_size=len(ours_blob) / size,
                    base_size=len(base_blob) / size,
                )
            )
            rows.append(
                _row(
                    f"{encoding.value} decode, {kind} (isal)",
                    best_mbps(lambda e=encoding, b=ours_blob: _ours_decode(e, b), size, reps),
                    "zlib",
                    best_mbps(lambda b=base_blob, w=wbits: zlib.decompress(b, w), size, reps),
                )
            )
        for level in (1, 3):
            blob = _ours_encode(ContentEncoding.ZSTD, data, zstd_level=level)
            rows.append(
                _row(
                    f"zstd {level} encode, {kind}",
                    best_mbps(
                        lambda lv=level, d=data: _ours_encode(ContentEncoding.ZSTD, d, zstd_level=lv), size, reps
                    ),
                    ours_size=len(blob) / size,
                )
            )
            rows.append(
                _row(
                    f"zstd {level} decode, {kind} (8 MiB window)",
                    best_mbps(lambda b=blob: _ours_decode(ContentEncoding.ZSTD, b), size, reps),
                )
            )
        del data
    inline = os.urandom(1 << 20)
    encoded = pybase64.b64encode(inline)
    encoder = Base64Encoder()
    rows.append(
        _row(
            "base64 encode 1 MiB (Base64Encoder: pybase64 in pieces, reused output)",
            best_mbps(lambda: [encoder.encode(inline) for _ in range(64)], 64 << 20, reps),
            "stdlib base64",
            best_mbps(lambda: [base64.b64encode(inline) for _ in range(64)], 64 << 20, reps),
        )
    )
    rows.append(
        _row(
            "base64 encode 1 MiB (pybase64, fresh output per call)",
            best_mbps(lambda: [pybase64.b64encode(inline) for _ in range(64)], 64 << 20, reps),
            "stdlib base64",
            best_mbps(lambda: [base64.b64encode(inline) for _ in range(64)], 64 << 20, reps),
        )
    )
    rows.append(
        _row(
            "base64 decode 1 MiB (pybase64)",
            best_mbps(lambda: [pybase64.b64decode(encoded) for _ in range(64)], 64 << 20, reps),
            "stdlib base64",
            best_mbps(lambda: [base64.b64decode(encoded) for _ in range(64)], 64 << 20, reps),
        )
    )
    return rows


def _row(
    name: str,
    ours: float,
    baseline: str = "",
    base: float | None = None,
    ours_size: float | None = None,
    base_size: float | None = None,
) -> dict[str, Any]:
    return {
        "case": name,
        "ours_MBps": round(ours),
        "baseline": baseline,
        "baseline_MBps": None if base is None else round(base),
        "ratio": None if base is None else round(ours / base, 2),
        "ours_output_ratio": None if ours_size is None else round(ours_size, 4),
        "baseline_output_ratio": None if base_size is None else round(base_size, 4),
    }


def kernels_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| kernel (one core) | ours MB/s | baseline | baseline MB/s | ratio | output/input (ours / baseline) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        sizes = ""
        if r["ours_output_ratio"] is not None:
            sizes = f"{r['ours_output_ratio']:.3f}"
            if r["baseline_output_ratio"] is not None:
                sizes += f" / {r['baseline_output_ratio']:.3f}"
        base = "—" if r["baseline_MBps"] is None else str(r["baseline_MBps"])
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        lines.append(f"| {r['case']} | {r['ours_MBps']} | {r['baseline'] or '—'} | {base} | {ratio} | {sizes} |")
    return "\n".join(lines)
