"""Uploads through 1, 2 and 3 ``transfer serve`` replicas on one Ceph bucket behind HAProxy (round robin), the
replicas spread over the cluster's two RADOS Gateways: uploads/s of small files and MB/s of 64 MiB files, with the
CPU seconds each kind of process spent meanwhile (from ``/proc/<pid>/stat``), so the bottleneck is named by
measurement: the service, the gateways, the OSD or the balancer. Each replica count is run with one API key (every
upload charged to it, with a quota: its usage in shards) and with eight; afterwards each replica's usage report
must equal the bytes uploaded (``usage_exact``), and answers other than 201 are counted, not retried.

A throw-away cluster (``devtools.ceph``: one monitor, one memstore OSD; Ceph 20.2 by default) on this machine: every
process shares the same cores, so the figures say where the CPU goes per upload more than how far replicas scale on
separate hosts.

    python -m benchmarks.replicas [--release 20.2] [--small 600] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks.e2e import free_port
from transfer.core.auth import new_token, token_hash

MiB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@contextmanager
def serve_unpinned(workdir: Path, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """``transfer serve`` in ``workdir`` on a free port, unpinned, given two minutes to start on a loaded machine;
    yields (url, pid)."""
    port = free_port()
    log = open(workdir / "serve.log", "wb")  # noqa: SIM115 - closed below
    command = [sys.executable, "-m", "transfer", "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("replica did not start: " + (workdir / "serve.log").read_text())
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextmanager
def _haproxy(root: Path, urls: list[str]) -> Iterator[tuple[str, int]]:
    binary = shutil.which("haproxy")
    if binary is None:
        raise RuntimeError("HAProxy is not installed (`make install` installs Debian's haproxy)")
    port = free_port()
    servers = "\n".join(f"    server r{i} {urlsplit(u).netloc}" for i, u in enumerate(urls))
    conf = root / "haproxy.cfg"
    conf.write_text(
        "global\n    maxconn 1024\n\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 120s\n"
        f"    timeout server 120s\n\nfrontend api\n    bind 127.0.0.1:{port}\n    default_backend replicas\n\n"
        f"backend replicas\n    balance roundrobin\n{servers}\n"
    )
    proc = subprocess.Popen([binary, "-db", "-f", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("haproxy did not start")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def _cluster_pids(root: Path) -> dict[str, list[int]]:
    """The cluster's daemons by kind (radosgw, ceph-osd, ceph-mon): processes whose command line names its root's
    directory (by name: a release run in a chroot sees the root under another path)."""
    kinds: dict[str, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = os.path.basename(argv[0].decode(errors="replace"))
        if name in ("radosgw", "ceph-osd", "ceph-mon") and root.name.encode() in b" ".join(argv):
            kinds.setdefault(name, []).append(int(proc.name))
    return kinds


async def _uploads(url: str, count: int, size: int, concurrency: int, tokens: list[str]) -> dict[int, int]:
    """``count`` uploads of ``size`` bytes, ``concurrency`` at once, the i-th with ``tokens[i % len(tokens)]``; the
    answers' statuses counted (none retried)."""
    body = os.urandom(size)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                headers = {"authorization": f"Bearer {tokens[i % len(tokens)]}"}
                r = await http.post(f"{url}/v1/files", params={"name": f"b{i}.bin"}, content=body, headers=headers)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return statuses


def _usage_races(urls: list[str], admin: str) -> dict[str, float]:
    """Lost compare-and-set races on usage records so far, summed over the replicas (``lost``: every lost race,
    ``busy``: those answered 503 record_busy), from each replica's ``/metrics``."""
    totals = {"lost": 0.0, "busy": 0.0}
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=30, headers={"authorization": f"Bearer {admin}"}).text
        for line in text.splitlines():
            if line.startswith('transfer_record_races_total{kind="usage"'):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                totals[outcome] = totals.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def _storage_operations(urls: list[str], admin: str) -> float:
    """Storage operations (S3 requests) the replicas have made so far, summed, from each one's ``/metrics``."""
    total = 0.0
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=30, headers={"authorization": f"Bearer {admin}"}).text
        for line in text.splitlines():
            if line.startswith("transfer_storage_operations_total{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def _phase(pids: dict[str, list[int]], run: Any) -> dict[str, Any]:
    before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
    start = time.monotonic()
    run()
    seconds = time.monotonic() - start
    cpu = {k: sum(cpu_seconds(p) for p in v) - before[k] for k, v in pids.items()}
    return {"seconds": seconds, "cpu": cpu}


def _timed(
    pids: dict[str, list[int]], url: str, count: int, size: int, at_once: int, tokens: list[str]
) -> tuple[dict[str, Any], dict[int, int]]:
    """:func:`_uploads` as a measured phase: its time and CPU, and its answers."""
    answers: dict[int, int] = {}
    phase = _phase(pids, lambda: answers.update(asyncio.run(_uploads(url, count, size, at_once, tokens))))
    return phase, answers


def _used(url: str, admin: str, names: list[str]) -> int:
    """Bytes the replica at ``url`` reports stored for the keys ``names``."""
    keys = httpx.get(f"{url}/v1/admin/usage", timeout=60, headers={"authorization": f"Bearer {admin}"}).json()["keys"]
    return sum(int(keys[name]["bytes_used"]) for name in names)


def run_replicas(
    workdir: Path,
    counts: tuple[int, ...] = (1, 2, 3),
    small: int = 600,
    large: int = 3,
    *,
    release: str = "20.2",
    concurrency: int = 64,
    key_counts: tuple[int, ...] = (1, 8),
) -> dict[str, Any]:
    """For each replica count and each number of API keys: ``small`` uploads of 4 KiB (``concurrency`` at once)
    and ``large`` uploads of 64 MiB (all at once) through HAProxy; uploads/s, MB/s, CPU seconds per process kind,
    lost usage-record races, the answers, and whether every replica's usage report equals what was uploaded."""
    from devtools.ceph import ceph_cluster, ceph_missing
    from devtools.s3server import s3_client

    reason = ceph_missing(release)
    if reason:
        return {"skipped": reason}
    rows = []
    with ceph_cluster(gateways=2, release=release) as cluster:
        daemons = _cluster_pids(cluster.root)
        for n in counts:
            for key_count in key_counts:
                tokens = [new_token() for _ in range(key_count)]
                names = [f"k{i}" for i in range(key_count)]
                spec = {"scopes": ["upload", "read", "admin"], "max_bytes": 1 << 40}
                api_keys = {name: {"sha256": token_hash(t), **spec} for name, t in zip(names, tokens, strict=True)}
                bucket = f"benchrep-{uuid.uuid4().hex[:12]}"
                s3_client(cluster.endpoint).create_bucket(Bucket=bucket)
                with ExitStack() as stack:
                    urls, pids = [], []
                    for i in range(n):
                        gateway = cluster.gateways[i % len(cluster.gateways)]
                        env = {
                            **os.environ,
                            "TRANSFER_STORAGE": "s3",
                            "TRANSFER_S3_BUCKET": bucket,
                            "TRANSFER_S3_ENDPOINT_URL": gateway.url,
                            "TRANSFER_S3_ADDRESSING_STYLE": "path",
                            "TRANSFER_SINGLE_REPLICA": "false",
                            "AWS_ACCESS_KEY_ID": gateway.access_key,
                            "AWS_SECRET_ACCESS_KEY": gateway.secret_key,
                            "AWS_REGION": gateway.region,
                            "TRANSFER_SIGNING_KEYS": json.dumps({"t": "0123456789abcdef0123"}),
                            "TRANSFER_ALLOWED_HOSTS": json.dumps(["127.0.0.1"]),
                            "TRANSFER_API_KEYS": json.dumps(api_keys),
                        }
                        where = workdir / f"rep{n}-k{key_count}-{i}"
                        where.mkdir(exist_ok=True)
                        url, pid = stack.enter_context(serve_unpinned(where, env))
                        urls.append(url)
                        pids.append(pid)
                    balancer, haproxy_pid = stack.enter_context(_haproxy(workdir, urls))
                    watched = {"service": pids, "haproxy": [haproxy_pid], **daemons}
                    warm = asyncio.run(_uploads(balancer, 16, 4096, 16, tokens))  # connections, first records
                    load = os.getloadavg()[0]
                    idle = _phase(watched, lambda: time.sleep(5))  # what the processes spend serving nobody
                    races = _usage_races(urls, tokens[0])
                    operations = _storage_operations(urls, tokens[0])
                    few, small_answers = _timed(watched, balancer, small, 4096, concurrency, tokens)
                    races = {k: v - races.get(k, 0.0) for k, v in _usage_races(urls, tokens[0]).items()}
                    operations = _storage_operations(urls, tokens[0]) - operations
                    big, large_answers = _timed(watched, balancer, large, 64 * MiB, large, tokens)
                    answers = {
                        s: small_answers.get(s, 0) + large_answers.get(s, 0) for s in {*small_answers, *large_answers}
                    }
                    stored = (warm.get(201, 0) + small_answers.get(201, 0)) * 4096 + large_answers.get(
                        201, 0
                    ) * 64 * MiB
                    exact = all(_used(url, tokens[0], names) == stored for url in urls)
                    rows.append(
                        {
                            "replicas": n,
                            "keys": key_count,
                            "load_average": load,
                            "small_per_s": small / few["seconds"],
                            "small_cpu_ms_per_upload": {k: v * 1000 / small for k, v in few["cpu"].items()},
                            "small_storage_operations_per_upload": operations / small,
                            "small_usage_races_per_upload": {k: v / small for k, v in races.items()},
                            "large_MBps": large * 64 * MiB / big["seconds"] / 1e6,
                            "large_cpu_s_per_GiB": {k: v / (large * 64 / 1024) for k, v in big["cpu"].items()},
                            "idle_cpu_ms_per_s": {k: v * 1000 / idle["seconds"] for k, v in idle["cpu"].items()},
                            "answers": {str(k): v for k, v in sorted(answers.items())},
                            "usage_exact": exact,
                        }
                    )
    return {"rows": rows, "cluster_started_in": cluster.started_in, "release": release, "concurrency": concurrency}


def replicas_table(report: dict[str, Any]) -> str:
    if "skipped" in report:
        return f"Replicas on Ceph: not run ({report['skipped']})"
    lines = [
        f"Uploads through replicas on one Ceph {report.get('release', '16.2')} bucket behind HAProxy (one memstore OSD,"
        f" two gateways, this machine), 4 KiB uploads {report.get('concurrency', 16)} at once:",
        "",
        "| replicas | keys | 4 KiB uploads/s | CPU ms per 4 KiB upload: service / radosgw / osd / haproxy "
        "| storage operations per upload | usage-record races lost per upload (503 share) | answers | usage exact "
        "| 64 MiB MB/s | CPU s per GiB: service / radosgw / osd / haproxy | idle CPU ms/s: service / radosgw / osd "
        "| load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    kinds = ("service", "radosgw", "ceph-osd", "haproxy")
    for r in report["rows"]:
        small = " / ".join(f"{r['small_cpu_ms_per_upload'].get(k, 0):.1f}" for k in kinds)
        large = " / ".join(f"{r['large_cpu_s_per_GiB'].get(k, 0):.2f}" for k in kinds)
        races = r.get("small_usage_races_per_upload", {})
        lost = f"{races.get('lost', 0):.2f} ({races.get('busy', 0) * 100:.1f} %)" if races else "-"
        requests = r.get("small_storage_operations_per_upload", 0)
        idle = " / ".join(f"{r.get('idle_cpu_ms_per_s', {}).get(k, 0):.0f}" for k in kinds[:3])
        answers = ", ".join(f"{k}×{v}" for k, v in r.get("answers", {}).items()) or "-"
        lines.append(
            f"| {r['replicas']} | {r.get('keys', '-')} | {r['small_per_s']:.0f} | {small} | {requests:.1f} | {lost} "
            f"| {answers} "
            f"| {r.get('usage_exact', '-')} | {r['large_MBps']:.0f} | {large} | {idle} | {r['load_average']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--release", default="20.2", help="Ceph release of the cluster (16.2 or 20.2)")
    parser.add_argument("--small", type=int, default=600, help="4 KiB uploads per row")
    parser.add_argument("--concurrency", type=int, default=64, help="4 KiB uploads at once")
    parser.add_argument("--out", default=None, help="write the report as JSON here too")
    args = parser.parse_args()
    import tempfile

    from benchmarks.summary import host_cpu

    with tempfile.TemporaryDirectory() as tmp:
        report = run_replicas(Path(tmp), small=args.small, release=args.release, concurrency=args.concurrency)
    report["cpu"] = host_cpu()
    print(f"CPU: {report['cpu']} ({os.cpu_count()} cores)")
    print(replicas_table(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
