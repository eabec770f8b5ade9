"""CPU kernels on one core: hashing, the codings the service uses against stdlib zlib, base64; and a comparison
of the three gzip/deflate libraries (python-isal, zlib-ng, stdlib zlib) on the same streams.

Each figure is MB/s of input (original bytes) over a 64 MiB corpus. Ours and the baseline run alternately, once
each per repetition: MB/s is the best run (kernels are not disturbed by I/O, so the best run is the kernel's speed)
and the ratio is ours/baseline per pair, median (min-max) — on a loaded host the pairs show how much it moved.

Decoding is always compared on the same compressed stream: the one stdlib zlib writes at level 6 (what a client's
gzip sends; on incompressible data that is stored blocks, so decoding is a copy plus the CRC) decoded by the
service's decoder and by the same bounded loop on stdlib zlib.
"""

from __future__ import annotations

import base64
import hashlib
import os
import statistics
import time
import zlib
from collections.abc import Callable
from functools import partial
from typing import Any

import pybase64
import xxhash
from isal import isal_zlib

from transfer.core.model.content import ContentEncoding
from transfer.core.model.encodings import (
    INFLATE,
    ISAL,
    Base64Encoder,
    DecodeLimits,
    InflateBackend,
    _ZlibFamilyDecoder,
    make_decoder,
    make_encoder,
)

MB = 1_000_000
PIECE = 1 << 20
STDLIB_ZLIB = InflateBackend("zlib", zlib.decompressobj, zlib.error)
# zlib-ng is compared here only (a dev dependency): the service decodes with isal (transfer/core/model/encodings.py)
try:
    from zlib_ng import zlib_ng
except ImportError:  # pragma: no cover - without it the comparison has no zlib-ng columns
    zlib_ng = None


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


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_mbps(fn: Callable[[], object], nbytes: int, reps: int) -> float:
    return nbytes / min(_seconds(fn) for _ in range(reps)) / MB


def paired(
    ours: Callable[[], object], base: Callable[[], object], nbytes: int, reps: int
) -> tuple[float, float, list[float]]:
    """Ours and the baseline alternately ``reps`` times: (ours best MB/s, baseline best MB/s, ratio per pair)."""
    ours_s, base_s = [], []
    for _ in range(reps):
        ours_s.append(_seconds(ours))
        base_s.append(_seconds(base))
    return nbytes / min(ours_s) / MB, nbytes / min(base_s) / MB, [b / o for o, b in zip(ours_s, base_s, strict=True)]


def _pieces(data: bytes) -> list[memoryview]:
    view = memoryview(data)
    return [view[i : i + PIECE] for i in range(0, len(view), PIECE)]


def _ours_encode(encoding: ContentEncoding, data: bytes, **levels: int) -> bytes:
    encoder = make_encoder(encoding, levels=levels)
    return b"".join([encoder.encode(p) for p in _pieces(data)] + [encoder.finish()])


def _drain(decoder: Any, blob: bytes) -> int:
    total = 0
    for p in _pieces(blob):
        for out in decoder.feed(p):
            total += len(out)
    for out in decoder.finish():
        total += len(out)
    return total


def _ours_decode(encoding: ContentEncoding, blob: bytes) -> int:
    return _drain(make_decoder(encoding, DecodeLimits(1 << 40), piece_size=4 * PIECE), blob)


def _decode_with(backend: InflateBackend, encoding: ContentEncoding, blob: bytes) -> int:
    """The service's bounded gzip/deflate decoding loop on ``backend``: only the library differs."""
    return _drain(_ZlibFamilyDecoder(encoding, DecodeLimits(1 << 40), 4 * PIECE, backend), blob)


def _compress(module: Any, level: int, data: bytes, wbits: int) -> bytes:
    c = module.compressobj(level, module.DEFLATED, wbits)
    return b"".join([c.compress(p) for p in _pieces(data)] + [c.flush()])


def _zlib6_encode(data: bytes, wbits: int) -> bytes:
    return _compress(zlib, 6, data, wbits)


def run_kernels(size: int = 64 << 20, reps: int = 3) -> list[dict[str, Any]]:
    """Every kernel row: id, name, ours MB/s, baseline, baseline MB/s, ratio (median, min, max over pairs), and
    output/input size for codecs."""
    rows: list[dict[str, Any]] = []
    rand = corpus("random", size)
    rows.append(_row("sha256", "SHA-256 (hashlib)", best_mbps(lambda: hashlib.sha256(rand).digest(), size, reps)))
    rows.append(_row("xxh3_128", "xxh3-128 (xxhash)", best_mbps(lambda: xxhash.xxh3_128(rand).digest(), size, reps)))
    for kind in ("text", "random"):
        data = corpus(kind, size)
        for encoding, wbits in ((ContentEncoding.GZIP, 31), (ContentEncoding.DEFLATE, 15)):
            name = encoding.value
            ours_blob = _ours_encode(encoding, data)
            base_blob = _zlib6_encode(data, wbits)
            rows.append(
                _row(
                    f"{name}_encode_{kind}",
                    f"{name} encode, {kind} (isal level 1)",
                    *paired(
                        lambda e=encoding, d=data: _ours_encode(e, d),
                        lambda w=wbits, d=data: _zlib6_encode(d, w),
                        size,
                        reps,
                    ),
                    baseline="zlib level 6",
                    ours_size=len(ours_blob) / size,
                    base_size=len(base_blob) / size,
                )
            )
            rows.append(
                _row(
                    f"{name}_decode_{kind}",
                    f"{name} decode, {kind}, zlib level 6 stream (ours: {INFLATE.name})",
                    *paired(
                        lambda e=encoding, b=base_blob: _ours_decode(e, b),
                        lambda e=encoding, b=base_blob: _decode_with(STDLIB_ZLIB, e, b),
                        size,
                        reps,
                    ),
                    baseline="stdlib zlib, same bounded loop",
                )
            )
        for level in (1, 3):
            blob = _ours_encode(ContentEncoding.ZSTD, data, zstd_level=level)
            rows.append(
                _row(
                    f"zstd{level}_encode_{kind}",
                    f"zstd {level} encode, {kind}",
                    best_mbps(
                        lambda lv=level, d=data: _ours_encode(ContentEncoding.ZSTD, d, zstd_level=lv), size, reps
                    ),
                    ours_size=len(blob) / size,
                )
            )
            rows.append(
                _row(
                    f"zstd{level}_decode_{kind}",
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
            "base64_encode",
            "base64 encode 1 MiB (Base64Encoder: pybase64 in pieces, reused output)",
            *paired(
                lambda: [encoder.encode(inline) for _ in range(64)],
                lambda: [base64.b64encode(inline) for _ in range(64)],
                64 << 20,
                reps,
            ),
            baseline="stdlib base64",
        )
    )
    rows.append(
        _row(
            "base64_encode_fresh",
            "base64 encode 1 MiB (pybase64, fresh output per call)",
            *paired(
                lambda: [pybase64.b64encode(inline) for _ in range(64)],
                lambda: [base64.b64encode(inline) for _ in range(64)],
                64 << 20,
                reps,
            ),
            baseline="stdlib base64",
        )
    )
    rows.append(
        _row(
            "base64_decode",
            "base64 decode 1 MiB (pybase64)",
            *paired(
                lambda: [pybase64.b64decode(encoded) for _ in range(64)],
                lambda: [base64.b64decode(encoded) for _ in range(64)],
                64 << 20,
                reps,
            ),
            baseline="stdlib base64",
        )
    )
    return rows


# The gzip/deflate libraries compared: encoders (module, level) and the decoders' inflate backends.
_NG_ENCODER: dict[str, tuple[Any, int]] = {} if zlib_ng is None else {"zlib-ng 1": (zlib_ng, 1)}
_NG_INFLATER = {} if zlib_ng is None else {"zlib-ng": InflateBackend("zlib-ng", zlib_ng.decompressobj, zlib_ng.error)}
ENCODERS: dict[str, tuple[Any, int]] = {
    "isal 1": (isal_zlib, 1),
    **_NG_ENCODER,
    "zlib 1": (zlib, 1),
    "zlib 6": (zlib, 6),
}
INFLATERS: dict[str, InflateBackend] = {"isal": ISAL, **_NG_INFLATER, "zlib": STDLIB_ZLIB}


def run_codecs(size: int = 64 << 20, reps: int = 3) -> list[dict[str, Any]]:
    """isal, zlib-ng and stdlib zlib side by side, gzip and deflate, text and incompressible data: encode MB/s and
    output/input per encoder; decode MB/s of each inflater (in the service's bounded decoding loop) on the streams
    of two encoders — stdlib zlib level 6 (a client's gzip) and isal level 1 (the service's own encoder) — plus
    stdlib ``zlib.decompress`` in one call. Within a repetition the libraries take turns; best run per library."""
    rows: list[dict[str, Any]] = []
    for kind in ("text", "random"):
        data = corpus(kind, size)
        for encoding, wbits in ((ContentEncoding.GZIP, 31), (ContentEncoding.DEFLATE, 15)):
            blobs = {name: _compress(mod, level, data, wbits) for name, (mod, level) in ENCODERS.items()}
            encode: dict[str, list[float]] = {name: [] for name in ENCODERS}
            for _ in range(reps):
                for name, (mod, level) in ENCODERS.items():
                    encode[name].append(_seconds(partial(_compress, mod, level, data, wbits)))
            rows.append(
                {
                    "kind": kind,
                    "format": encoding.value,
                    "direction": "encode",
                    "stream": "",
                    "MBps": {name: round(size / min(t) / MB) for name, t in encode.items()},
                    "output_ratio": {name: round(len(b) / size, 4) for name, b in blobs.items()},
                }
            )
            for stream in ("zlib 6", "isal 1"):
                blob = blobs[stream]
                decode: dict[str, list[float]] = {name: [] for name in (*INFLATERS, "zlib one call")}
                for _ in range(reps):
                    for name, backend in INFLATERS.items():
                        decode[name].append(_seconds(partial(_decode_with, backend, encoding, blob)))
                    decode["zlib one call"].append(_seconds(partial(zlib.decompress, blob, wbits)))
                rows.append(
                    {
                        "kind": kind,
                        "format": encoding.value,
                        "direction": "decode",
                        "stream": stream,
                        "MBps": {name: round(size / min(t) / MB) for name, t in decode.items()},
                        "output_ratio": {},
                    }
                )
        del data
    return rows


def codecs_table(rows: list[dict[str, Any]]) -> str:
    """The library comparison as markdown: MB/s of original bytes per library (output/input for encoders)."""
    names = [*ENCODERS, *INFLATERS, "zlib one call"]
    lines = [
        "gzip/deflate libraries, one core, MB/s of original bytes, best run (encode: output/input in brackets; "
        "decode: each inflater in the service's bounded loop on the stream the named encoder wrote)",
        "",
        "| data | format | direction (stream) | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for r in rows:
        cells = []
        for name in names:
            if name not in r["MBps"]:
                cells.append("")
                continue
            cell = f"{r['MBps'][name]:,}"
            if name in r["output_ratio"]:
                cell += f" ({r['output_ratio'][name]:.3f})"
            cells.append(cell)
        direction = r["direction"] + (f" ({r['stream']})" if r["stream"] else "")
        lines.append(f"| {r['kind']} | {r['format']} | {direction} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _row(
    row_id: str,
    name: str,
    ours: float,
    base: float | None = None,
    ratios: list[float] | None = None,
    baseline: str = "",
    ours_size: float | None = None,
    base_size: float | None = None,
) -> dict[str, Any]:
    return {
        "id": row_id,
        "case": name,
        "ours_MBps": round(ours),
        "baseline": baseline,
        "baseline_MBps": None if base is None else round(base),
        "ratio": None if base is None else round(ours / base, 2),
        "ratio_median": round(statistics.median(ratios), 2) if ratios else None,
        "ratio_min": round(min(ratios), 2) if ratios else None,
        "ratio_max": round(max(ratios), 2) if ratios else None,
        "runs": len(ratios) if ratios else None,
        "ours_output_ratio": None if ours_size is None else round(ours_size, 4),
        "baseline_output_ratio": None if base_size is None else round(base_size, 4),
    }


def kernels_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| kernel (one core) | ours MB/s | baseline | baseline MB/s | ratio median (min-max) | "
        "output/input (ours / baseline) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        sizes = ""
        if r["ours_output_ratio"] is not None:
            sizes = f"{r['ours_output_ratio']:.3f}"
            if r["baseline_output_ratio"] is not None:
                sizes += f" / {r['baseline_output_ratio']:.3f}"
        base = "—" if r["baseline_MBps"] is None else str(r["baseline_MBps"])
        ratio = "—"
        if r.get("ratio_median") is not None:
            ratio = f"{r['ratio_median']:.2f}× ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        lines.append(f"| {r['case']} | {r['ours_MBps']} | {r['baseline'] or '—'} | {base} | {ratio} | {sizes} |")
    return "\n".join(lines)
