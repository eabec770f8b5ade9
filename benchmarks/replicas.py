"""Uploads through 1, 2 and 3 ``transfer serve`` replicas on one Ceph bucket behind HAProxy (round robin), the
replicas spread over the cluster's two RADOS Gateways: uploads/s of small files and MB/s of 64 MiB files, with the
CPU seconds each kind of process spent meanwhile (from ``/proc/<pid>/stat``), so the bottleneck is named by
measurement: the service, the gateways, the OSD or the balancer.

A throw-away cluster (``devtools.ceph``: one monitor, one memstore OSD) on this machine: every process shares the
same cores, so the figures say where the CPU goes per upload more than how far replicas scale on separate hosts.
"""

from __future__ import annotations

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
    """The cluster's daemons by kind (radosgw, ceph-osd, ceph-mon): processes whose command line names its root."""
    kinds: dict[str, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        name = os.path.basename(argv[0].decode(errors="replace"))
        if name in ("radosgw", "ceph-osd", "ceph-mon") and str(root).encode() in b" ".join(argv):
            kinds.setdefault(name, []).append(int(proc.name))
    return kinds


async def _uploads(url: str, count: int, size: int, concurrency: int) -> None:
    body = os.urandom(size)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with gate:
                r = await http.post(f"{url}/v1/files", params={"name": f"b{i}.bin"}, content=body)
                if r.status_code != 201:
                    raise RuntimeError(f"upload {i}: {r.status_code} {r.text[:200]}")

        await asyncio.gather(*(one(i) for i in range(count)))


def _usage_races(urls: list[str]) -> dict[str, float]:
    """Lost compare-and-set races on usage records so far, summed over the replicas (``lost``: every lost race,
    ``busy``: those answered 503 record_busy), from each replica's ``/metrics``."""
    totals = {"lost": 0.0, "busy": 0.0}
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        for line in text.splitlines():
            if line.startswith('transfer_record_races_total{kind="usage"'):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                totals[outcome] = totals.get(outcome, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def _phase(pids: dict[str, list[int]], run: Any) -> dict[str, Any]:
    before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
    start = time.monotonic()
    run()
    seconds = time.monotonic() - start
    cpu = {k: sum(cpu_seconds(p) for p in v) - before[k] for k, v in pids.items()}
    return {"seconds": seconds, "cpu": cpu}


def run_replicas(
    workdir: Path, counts: tuple[int, ...] = (1, 2, 3), small: int = 300, large: int = 3
) -> dict[str, Any]:
    """For each replica count: ``small`` uploads of 4 KiB (16 at once) and ``large`` uploads of 64 MiB (all at
    once) through HAProxy; uploads/s, MB/s and CPU seconds per process kind."""
    from devtools.ceph import ceph_cluster, ceph_missing
    from devtools.s3server import s3_client

    reason = ceph_missing()
    if reason:
        return {"skipped": reason}
    rows = []
    with ceph_cluster(gateways=2) as cluster:
        daemons = _cluster_pids(cluster.root)
        for n in counts:
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
                    }
                    where = workdir / f"rep{n}-{i}"
                    where.mkdir(exist_ok=True)
                    url, pid = stack.enter_context(serve_unpinned(where, env))
                    urls.append(url)
                    pids.append(pid)
                balancer, haproxy_pid = stack.enter_context(_haproxy(workdir, urls))
                watched = {"service": pids, "haproxy": [haproxy_pid], **daemons}
                asyncio.run(_uploads(balancer, 16, 4096, 16))  # warm-up: connections, first records
                load = os.getloadavg()[0]
                races = _usage_races(urls)
                few = _phase(watched, lambda: asyncio.run(_uploads(balancer, small, 4096, 16)))  # noqa: B023
                races = {k: v - races.get(k, 0.0) for k, v in _usage_races(urls).items()}
                big = _phase(watched, lambda: asyncio.run(_uploads(balancer, large, 64 * MiB, large)))  # noqa: B023
                rows.append(
                    {
                        "replicas": n,
                        "load_average": load,
                        "small_per_s": small / few["seconds"],
                        "small_cpu_ms_per_upload": {k: v * 1000 / small for k, v in few["cpu"].items()},
                        "small_usage_races_per_upload": {k: v / small for k, v in races.items()},
                        "large_MBps": large * 64 * MiB / big["seconds"] / 1e6,
                        "large_cpu_s_per_GiB": {k: v / (large * 64 / 1024) for k, v in big["cpu"].items()},
                    }
                )
    return {"rows": rows, "cluster_started_in": cluster.started_in}


def replicas_table(report: dict[str, Any]) -> str:
    if "skipped" in report:
        return f"Replicas on Ceph: not run ({report['skipped']})"
    lines = [
        "Uploads through replicas on one Ceph bucket behind HAProxy (one memstore OSD, two gateways, this machine):",
        "",
        "| replicas | 4 KiB uploads/s | CPU ms per 4 KiB upload: service / radosgw / osd / haproxy "
        "| usage-record races lost per 4 KiB upload (answered 503) "
        "| 64 MiB MB/s | CPU s per GiB: service / radosgw / osd / haproxy | load average |",
        "|---|---|---|---|---|---|---|",
    ]
    kinds = ("service", "radosgw", "ceph-osd", "haproxy")
    for r in report["rows"]:
        small = " / ".join(f"{r['small_cpu_ms_per_upload'].get(k, 0):.1f}" for k in kinds)
        large = " / ".join(f"{r['large_cpu_s_per_GiB'].get(k, 0):.2f}" for k in kinds)
        races = r.get("small_usage_races_per_upload", {})
        lost = f"{races.get('lost', 0):.2f} ({races.get('busy', 0) * 100:.1f} %)" if races else "-"
        lines.append(
            f"| {r['replicas']} | {r['small_per_s']:.0f} | {small} | {lost} | {r['large_MBps']:.0f} | {large} | "
            f"{r['load_average']:.1f} |"
        )
    return "\n".join(lines)
