"""Chunked deduplication rows: a file uploaded again unchanged, with 1 % changed in 20 places, with 16 MiB appended;
bytes sent and time against a full upload measured in the same run, and against rsync through a loopback rsync
daemon (the well-known delta baseline); the server CPU the lookups and the assembly cost per GiB; the client's
chunking cost; a resolve of the changed file with the old one's chunks in the cache.

Run alone: ``python -m benchmarks.dedup --size 256`` (MiB), or as the ``dedup`` section of ``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import statistics
import subprocess
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.e2e import ensure_tool, pin, service
from benchmarks.summary import host_cpu
from devtools.serving import free_port
from transfer.client.client import AsyncTransferClient
from transfer.client.dedup import ChunkCache, cut_file, resolve_with_cache
from transfer.client.resolver import ResolveOptions

MiB = 1 << 20
PLACES = 20


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def random_file(path: Path, size: int, seed: int = 1) -> None:
    """``size`` bytes that share no chunk with themselves (a repeated block would deduplicate by itself)."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, 4 * MiB)
            f.write(rng.randbytes(n))
            left -= n


def changed_copy(src: Path, dst: Path, fraction: float, places: int, seed: int = 2) -> int:
    """``dst``: ``src`` with ``fraction`` of its bytes rewritten in ``places`` spots; returns the bytes changed."""
    shutil.copyfile(src, dst)
    size = src.stat().st_size
    width = int(size * fraction / places)
    rng = random.Random(seed)
    with open(dst, "r+b") as f:
        for _ in range(places):
            f.seek(rng.randrange(0, size - width))
            f.write(rng.randbytes(width))
    return width * places


def appended_copy(src: Path, dst: Path, extra: int) -> int:
    shutil.copyfile(src, dst)
    with open(dst, "ab") as f:
        f.write(random.Random(3).randbytes(extra))
    return extra


async def _plain_upload(url: str, path: Path) -> float:
    async with AsyncTransferClient(url, options=ResolveOptions(buffer_size=MiB)) as client:
        start = time.perf_counter()
        await client.upload(path, inline=False)
        return time.perf_counter() - start


async def _dedup_upload(url: str, path: Path, pid: int) -> dict[str, Any]:
    """One upload the way ``transfer upload`` makes it by default: the head probed, a new file whole at once and
    its chunks indexed after, a known one as the chunks the key lacks, content the key stores as a new file at
    once (its chunk list checked after the answer). ``seconds``: until the answer; ``server_cpu_s``: until the file's
    manifest is there (``indexed_after_s`` later), so that work the service does after its answer is counted."""
    async with AsyncTransferClient(url, options=ResolveOptions(buffer_size=MiB)) as client:
        cpu = _cpu_seconds(pid)
        start = time.perf_counter()
        outcome = await client.upload_dedup(path)
        seconds = time.perf_counter() - start
    assert outcome is not None, "the service offers no chunked uploads"
    indexed_after = await asyncio.to_thread(_indexed, url, str(outcome.descriptor.metadata["file_id"]))
    return {
        "how": outcome.how,
        "seconds": seconds,
        "indexed_after_s": indexed_after,
        "sent_bytes": outcome.sent_bytes,
        "manifest_bytes": outcome.manifest_bytes,
        "chunks": outcome.chunks,
        "server_cpu_s": _cpu_seconds(pid) - cpu,
        "descriptor": outcome.descriptor.to_json(),
    }


def _indexed(url: str, file_id: str, timeout: float = 300.0) -> float:
    """Seconds until file ``file_id``'s chunks are indexed (its manifest answers 200)."""
    start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=30) as http:
        while (status := http.get(f"/v1/files/{file_id}/chunks").status_code) != 200:
            if status != 404 or time.perf_counter() - start > timeout:
                raise RuntimeError(f"file {file_id} was not indexed ({status})")
            time.sleep(0.05)
    return time.perf_counter() - start


class RsyncDaemon:
    """``rsync --daemon`` on a loopback port serving one writable module (``dest``)."""

    def __init__(self, workdir: Path, binary: str) -> None:
        self.binary = binary
        self.dest = workdir / "rsync-dest"
        self.dest.mkdir()
        self.port = free_port()
        conf = workdir / "rsyncd.conf"
        conf.write_text(
            f"use chroot = no\nport = {self.port}\naddress = 127.0.0.1\npid file = {workdir / 'rsyncd.pid'}\n"
            f"[dest]\npath = {self.dest}\nread only = no\nuid = {os.getuid()}\ngid = {os.getgid()}\n"
        )
        self.proc = subprocess.Popen(
            [*pin(0), binary, "--daemon", "--no-detach", f"--config={conf}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)

    def send(self, path: Path, name: str) -> dict[str, Any]:
        start = time.perf_counter()
        out = subprocess.run(
            [*pin(1), self.binary, "--stats", "--inplace", str(path), f"rsync://127.0.0.1:{self.port}/dest/{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        seconds = time.perf_counter() - start
        sent = next(
            int(line.split(":")[1].split()[0].replace(",", ""))
            for line in out.splitlines()
            if line.startswith("Total bytes sent")
        )
        return {"seconds": seconds, "sent_bytes": sent}

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)


def run_dedup(size: int, reps: int, workdir: Path, *, s3: bool = False, install_rsync: bool = False) -> dict[str, Any]:
    """Every row of the module text on a ``size``-byte file, medians of ``reps`` where a run can be repeated. With
    ``s3`` the service stores on the S3 test server (Swift's s3api, or ``TRANSFER_TEST_S3_ENDPOINT``): the uploads
    and what the service writes to the engine, without the rsync and resolve rows (they do not depend on it).
    ``install_rsync``: install Debian's rsync for its rows when it is missing (as ``make bench`` does nginx's);
    otherwise they run only where rsync is there."""
    with ExitStack() as stack:
        env = None
        if s3:
            from benchmarks.s3 import s3_service_env
            from devtools.s3server import s3_client, swift_s3_server

            endpoint = stack.enter_context(swift_s3_server())
            bucket = f"dedup-{uuid.uuid4().hex[:12]}"
            s3_client(endpoint).create_bucket(Bucket=bucket)
            env = s3_service_env(endpoint, bucket)
        return _run_dedup(size, reps, workdir / ("dedup-s3" if s3 else "dedup"), env, install_rsync)


def _run_dedup(size: int, reps: int, work: Path, env: dict[str, str] | None, install_rsync: bool) -> dict[str, Any]:
    work.mkdir()
    base = work / "v1.bin"
    random_file(base, size)
    variants = {
        "unchanged": (base, 0),
        "1% in 20 places": (work / "changed.bin", changed_copy(base, work / "changed.bin", 0.01, PLACES)),
        "16 MiB appended": (work / "appended.bin", appended_copy(base, work / "appended.bin", 16 * MiB)),
    }
    start = time.process_time()
    cut_file(base)
    chunking_cpu = time.process_time() - start
    storage = "local" if env is None else "s3"
    report: dict[str, Any] = {"size": size, "reps": reps, "cpu": host_cpu(), "storage": storage, "cases": {}}
    report["client_chunking_cpu_s_per_GiB"] = chunking_cpu / (size / (1 << 30))
    # the baseline is installed like nginx's (Debian's package, when root): a row that is "not installed" is no row
    rsync = None if env is not None else ensure_tool("rsync", "rsync") if install_rsync else shutil.which("rsync")
    report["rsync"] = (
        "rsync through a loopback daemon"
        if rsync
        else "rsync rows left out: " + ("not installed" if env is None else "they do not depend on the storage")
    )
    serve = work / "serve"
    serve.mkdir()
    with service(serve, data_dir=serve / "data", env=env) as (url, pid):
        full = [asyncio.run(_plain_upload(url, base)) for _ in range(reps)]
        report["full_upload_s"] = statistics.median(full)
        first = asyncio.run(_dedup_upload(url, base, pid))
        report["first_dedup_upload"] = {k: v for k, v in first.items() if k != "descriptor"}
        # the service indexes a file sent whole after its answer: a next version comes later than that
        report["first_indexed_after_s"] = first["indexed_after_s"]
        descriptors: dict[str, Any] = {}
        for name, (path, changed) in variants.items():
            # a version is new to the service once: its bytes sent and time are those of its first upload (the
            # unchanged file was uploaded just before, so it is timed as often as asked)
            runs = [asyncio.run(_dedup_upload(url, path, pid)) for _ in range(reps if name == "unchanged" else 1)]
            row = runs[0]
            budget = int(0.03 * path.stat().st_size) + changed
            descriptors[name] = row["descriptor"]
            seconds = statistics.median(r["seconds"] for r in runs)
            report["cases"][name] = {
                "changed_bytes": changed,
                "file_bytes": path.stat().st_size,
                "budget_bytes": budget,
                "sent_bytes": row["sent_bytes"],
                "sent_fraction": row["sent_bytes"] / path.stat().st_size,
                "manifest_bytes": row["manifest_bytes"],
                "within_budget": row["sent_bytes"] + row["manifest_bytes"] <= budget,
                "seconds": seconds,
                "runs": len(runs),
                "indexed_after_s": statistics.median(r["indexed_after_s"] for r in runs),
                "vs_full": seconds / report["full_upload_s"],
                "server_cpu_s_per_GiB": statistics.median(r["server_cpu_s"] for r in runs)
                / (path.stat().st_size / (1 << 30)),
            }
        if rsync:
            daemon = RsyncDaemon(work, rsync)
            try:
                report["rsync_full"] = daemon.send(base, "first.bin")
                for name, (path, _changed) in variants.items():
                    shutil.copyfile(base, daemon.dest / f"{name}.bin".replace(" ", "_").replace("%", "pc"))
                    sent = daemon.send(path, f"{name}.bin".replace(" ", "_").replace("%", "pc"))
                    report["cases"][name]["rsync"] = sent
            finally:
                daemon.close()
        if env is None:
            report["resolve"] = asyncio.run(_resolve_rows(descriptors, work))
    return report


async def _resolve_rows(descriptors: dict[str, Any], work: Path) -> dict[str, Any]:
    async with AsyncTransferClient(options=ResolveOptions()) as client:
        start = time.perf_counter()
        await client.resolve(descriptors["1% in 20 places"], work / "plain.bin")
        plain = time.perf_counter() - start
        cache = ChunkCache(work / "cache")
        await resolve_with_cache(client.http, descriptors["unchanged"], work / "old.bin", cache)
        start = time.perf_counter()
        warm = await resolve_with_cache(client.http, descriptors["1% in 20 places"], work / "new.bin", cache)
        cached = time.perf_counter() - start
    return {
        "plain_s": plain,
        "cached_s": cached,
        "fetched_bytes": warm.fetched_bytes,
        "cached_bytes": warm.cached_bytes,
        "vs_plain": cached / plain,
    }


def dedup_table(report: dict[str, Any]) -> str:
    size, local = report["size"], report.get("storage", "local") == "local"
    where = "local storage" if local else "S3 storage (Swift's s3api on loopback)"
    first = report["first_dedup_upload"]
    lines = [
        "### Chunked deduplication (FastCDC, 64 KiB average)" + ("" if local else ", on S3"),
        "",
        f"{size >> 20} MiB random file, {where}, `transfer serve` pinned to CPU 0; {report['cpu']}. Full upload "
        f"(POST /v1/files, same run): {report['full_upload_s']:.2f} s. First upload the default way (its head "
        "probed, then sent whole and its chunks indexed after the answer, in "
        f"{report['first_indexed_after_s']:.2f} s more): {first['seconds']:.2f} s "
        f"({first['seconds'] / report['full_upload_s']:.2f}x the full upload). Client chunking + hashing: "
        f"{report['client_chunking_cpu_s_per_GiB']:.2f} CPU s/GiB. {report['rsync']}. The runs a new version shares "
        "with the old one are copied into it server-side ("
        + ("`copy_file_range`" if local else "UploadPartCopy, not sent to the engine")
        + "); every byte is read to verify the SHA-256.",
        "",
        "| upload again | bytes sent | of the file | within 3 % + changes | time | vs full upload "
        "| manifest kept after the answer | server CPU s/GiB (to the manifest) |"
        + (" rsync bytes | rsync time |" if local else ""),
        "| --- | ---: | ---: | :---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if local else ""),
    ]
    for name, row in report["cases"].items():
        r = row.get("rsync") or {}
        rsync = f" {r.get('sent_bytes', 0):,} | {r.get('seconds', float('nan')):.2f} s |" if local else ""
        lines.append(
            f"| {name} | {row['sent_bytes'] + row['manifest_bytes']:,} | {row['sent_fraction']:.2%} | "
            f"{'yes' if row['within_budget'] else 'no'} | {row['seconds']:.2f} s | {row['vs_full']:.2f}x | "
            f"{row.get('indexed_after_s', 0):.2f} s | "
            f"{row['server_cpu_s_per_GiB']:.2f} |" + rsync
        )
    res = report.get("resolve")
    if res is not None:
        lines += [
            "",
            f"Resolve of the changed file with the old one's chunks cached: {res['cached_s']:.2f} s, "
            f"{res['fetched_bytes']:,} bytes fetched ({res['cached_bytes']:,} from the cache) vs a plain resolve "
            f"{res['plain_s']:.2f} s ({res['vs_plain']:.2f}x).",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dedup")
    parser.add_argument("--size", type=int, default=256, help="MiB (default 256)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--s3", action="store_true", help="store on the S3 test server, not a local directory")
    args = parser.parse_args()
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="transfer-dedup-") as tmp:
        report = run_dedup(args.size << 20, args.reps, Path(tmp), s3=args.s3, install_rsync=True)
    print(dedup_table(report))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
