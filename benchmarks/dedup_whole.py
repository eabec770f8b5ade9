"""Whole-file deduplication: a file uploaded again unchanged, against a full upload of it, in the same run.

    full upload      curl POST /v1/files?checksum=…&size=… with the body (``Expect:`` off: the body always goes)
    again, shared    the same request with ``Expect: 100-continue`` after the same key stored that content: the
                     service answers 201 before the body, so curl sends none (``size_upload`` says how many bytes
                     went); its time counts the client's own SHA-256 of the file (it must know it to declare it)

The server runs pinned to CPU 0 and curl to CPU 1 (:func:`benchmarks.e2e.pin`); the CPU is named in the table.
``python -m benchmarks.dedup_whole --size 256`` runs it alone.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.e2e import make_file, pin, service
from benchmarks.summary import host_cpu


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _curl(src: Path, url: str, expect: str) -> tuple[float, int, dict[str, Any]]:
    """One upload by curl: (seconds, bytes of body sent, the descriptor)."""
    command = [
        *pin(1),
        "curl",
        "-sS",
        "-X",
        "POST",
        "-T",
        str(src),
        "-H",
        "content-type: application/octet-stream",
        "-H",
        f"expect: {expect}" if expect else "expect:",
        "--expect100-timeout",
        "30",
        "-w",
        "\n%{size_upload} %{http_code}",
        url,
    ]
    start = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    body, _, tail = done.stdout.rpartition(b"\n")
    sent, code = tail.split()
    if code != b"201":
        raise RuntimeError(f"upload answered {code.decode()}: {body[:300]!r}")
    return seconds, int(sent), json.loads(body)


def run_dedup_whole(size: int, reps: int, workdir: Path) -> dict[str, Any]:
    """A ``size``-byte file uploaded in full ``reps`` times and again unchanged (shared) ``reps`` times; medians."""
    src = workdir / "dedup-whole.bin"
    make_file(src, size)
    data_dir = workdir / "dedup-whole-data"
    try:
        with service(workdir, data_dir) as (url, _pid):
            hash_start = time.perf_counter()
            sha = _sha256_of(src)
            hash_seconds = time.perf_counter() - hash_start
            upload_url = f"{url}/v1/files?checksum=sha256:{sha}&size={size}&name=again.bin"
            _, _, origin = _curl(src, upload_url, "")  # the key stores it: every later upload may share it
            full, shared, requests, shared_sent, full_sent = [], [], [], [], []
            for _ in range(reps):
                seconds, sent, descriptor = _curl(src, upload_url, "")
                full.append(seconds)
                full_sent.append(sent)
                httpx.delete(f"{url}/v1/files/{descriptor['metadata']['file_id']}", timeout=120)
                seconds, sent, descriptor = _curl(src, upload_url, "100-continue")
                shared.append(seconds + hash_seconds)
                requests.append(seconds)
                shared_sent.append(sent)
                httpx.delete(f"{url}/v1/files/{descriptor['metadata']['file_id']}", timeout=120)
            httpx.delete(f"{url}/v1/files/{origin['metadata']['file_id']}", timeout=120)
    finally:
        src.unlink(missing_ok=True)
    full_s, shared_s = statistics.median(full), statistics.median(shared)
    return {
        "cpu": host_cpu(),
        "size": size,
        "reps": reps,
        "full_seconds": full_s,
        "full_bytes_sent": int(statistics.median(full_sent)),
        "shared_seconds": shared_s,
        "shared_bytes_sent": int(statistics.median(shared_sent)),
        "shared_request_seconds": statistics.median(requests),
        "client_sha256_seconds": hash_seconds,
        "time_ratio": shared_s / full_s,
    }


def dedup_whole_table(r: dict[str, Any]) -> str:
    """The row of the issue: bytes sent and time of an unchanged file uploaded again, vs a full upload."""
    mib = r["size"] >> 20
    return "\n".join(
        [
            f"Whole-file dedup, {mib} MiB uploaded again unchanged (same key), {r['reps']} runs, medians; {r['cpu']}",
            "",
            "| case | bytes sent | time (s) | vs full upload |",
            "|---|---|---|---|",
            f"| full upload | {r['full_bytes_sent']:,} | {r['full_seconds']:.3f} | 1.00× |",
            f"| again, shared: client SHA-256 + request | {r['shared_bytes_sent']:,} "
            f"| {r['shared_seconds']:.3f} | {r['time_ratio']:.3f}× |",
            f"| of which the request alone | {r['shared_bytes_sent']:,} | {r['shared_request_seconds']:.3f} "
            f"| {r['shared_request_seconds'] / r['full_seconds']:.3f}× |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dedup_whole", description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="file size in MiB")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="transfer-bench-") as tmp:
        result = run_dedup_whole(args.size << 20, args.reps, Path(tmp))
    print(dedup_whole_table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
