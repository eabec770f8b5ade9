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
from pathlib import Path
from typing import Any

from benchmarks.e2e import pin, service
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
    its chunks indexed after, a known one as the chunks the key lacks."""
    async with AsyncTransferClient(url, options=ResolveOptions(buffer_size=MiB)) as client:
        cpu = _cpu_seconds(pid)
        start = time.perf_counter()
        outcome = await client.upload_dedup(path)
        seconds = time.perf_counter() - start
        server_cpu = _cpu_seconds(pid) - cpu
    assert outcome is not None, "the service offers no chunked uploads"
    return {
        "how": outcome.how,
        "seconds": seconds,
        "sent_bytes": outcome.sent_bytes,
        "manifest_bytes": outcome.manifest_bytes,
        "chunks": outcome.chunks,
        "server_cpu_s": server_cpu,
        "descriptor": outcome.descriptor.to_json(),
    }


class RsyncDaemon:
    """``rsync --daemon`` on a loopback port serving one writable module (``dest``)."""

    def __init__(self, workdir: Path) -> None:
        self.dest = workdir / "rsync-dest"
        self.dest.mkdir()
        self.port = free_port()
        conf = workdir / "rsyncd.conf"
        conf.write_text(
            f"use chroot = no\nport = {self.port}\naddress = 127.0.0.1\npid file = {workdir / 'rsyncd.pid'}\n"
            f"[dest]\npath = {self.dest}\nread only = no\nuid = {os.getuid()}\ngid = {os.getgid()}\n"
        )
        self.proc = subprocess.Popen(
            [*pin(0), "rsync", "--daemon", "--no-detach", f"--config={conf}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)

    def send(self, path: Path, name: str) -> dict[str, Any]:
        start = time.perf_counter()
        out = subprocess.run(
            [*pin(1), "rsync", "--stats", "--inplace", str(path), f"rsync://127.0.0.1:{self.port}/dest/{name}"],
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


def run_dedup(size: int, reps: int, workdir: Path) -> dict[str, Any]:
    """Every row of the module text on a ``size``-byte file, medians of ``reps`` where a run can be repeated."""
    work = workdir / "dedup"
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
    report: dict[str, Any] = {"size": size, "reps": reps, "cpu": host_cpu(), "cases": {}}
    report["client_chunking_cpu_s_per_GiB"] = chunking_cpu / (size / (1 << 30))
    rsync = shutil.which("rsync") is not None
    report["rsync"] = "rsync through a loopback daemon" if rsync else "rsync not installed: its rows are left out"
    serve = work / "serve"
    serve.mkdir()
    with service(serve, data_dir=serve / "data") as (url, pid):
        full = [asyncio.run(_plain_upload(url, base)) for _ in range(reps)]
        report["full_upload_s"] = statistics.median(full)
        first = asyncio.run(_dedup_upload(url, base, pid))
        report["first_dedup_upload"] = {k: v for k, v in first.items() if k != "descriptor"}
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
                "sent_bytes": row["sent_bytes"],
                "sent_fraction": row["sent_bytes"] / path.stat().st_size,
                "manifest_bytes": row["manifest_bytes"],
                "within_budget": row["sent_bytes"] + row["manifest_bytes"] <= budget,
                "seconds": seconds,
                "runs": len(runs),
                "vs_full": seconds / report["full_upload_s"],
                "server_cpu_s_per_GiB": statistics.median(r["server_cpu_s"] for r in runs)
                / (path.stat().st_size / (1 << 30)),
            }
        if rsync:
            daemon = RsyncDaemon(work)
            try:
                report["rsync_full"] = daemon.send(base, "first.bin")
                for name, (path, _changed) in variants.items():
                    shutil.copyfile(base, daemon.dest / f"{name}.bin".replace(" ", "_").replace("%", "pc"))
                    sent = daemon.send(path, f"{name}.bin".replace(" ", "_").replace("%", "pc"))
                    report["cases"][name]["rsync"] = sent
            finally:
                daemon.close()
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
    size = report["size"]
    lines = [
        "### Chunked deduplication (FastCDC, 64 KiB average)",
        "",
        f"{size >> 20} MiB random file, local storage, `transfer serve` pinned to CPU 0; {report['cpu']}. Full upload "
        f"(POST /v1/files, same run): {report['full_upload_s']:.2f} s. First upload the default way (its head "
        "probed, then sent whole and its chunks indexed): "
        f"{report['first_dedup_upload']['seconds']:.2f} s "
        f"({report['first_dedup_upload']['seconds'] / report['full_upload_s']:.2f}x the full upload). "
        "Client chunking + hashing: "
        f"{report['client_chunking_cpu_s_per_GiB']:.2f} CPU s/GiB. {report['rsync']}.",
        "",
        "| upload again | bytes sent | of the file | within 3 % + changes | time | vs full upload | server CPU s/GiB "
        "| rsync bytes | rsync time |",
        "| --- | ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in report["cases"].items():
        r = row.get("rsync") or {}
        lines.append(
            f"| {name} | {row['sent_bytes'] + row['manifest_bytes']:,} | {row['sent_fraction']:.2%} | "
            f"{'yes' if row['within_budget'] else 'no'} | {row['seconds']:.2f} s | {row['vs_full']:.2f}x | "
            f"{row['server_cpu_s_per_GiB']:.2f} | {r.get('sent_bytes', 0):,} | "
            f"{r.get('seconds', float('nan')):.2f} s |"
        )
    res = report["resolve"]
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
    args = parser.parse_args()
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="transfer-dedup-") as tmp:
        report = run_dedup(args.size << 20, args.reps, Path(tmp))
    print(dedup_table(report))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
