"""End-to-end benchmark: the service against baselines measured in the same run, alternating A B A B.

Cases (sizes from the profile):
    kernels          SHA-256 and xxh3-128 MB/s in this process: the hashing limits every other figure sits under
    upload           ``curl -X POST -T file`` into the service (SHA-256 verified, fsynced, new file)
                     vs ``dd bs=1M conv=fsync`` writing a new file of the same size on the same disk
    download         ``curl -o /dev/null`` on the signed URL, full body and one half-size range
                     vs nginx serving the same file (sendfile on), when nginx is installed
    resolve          ``transfer resolve`` (parallel ranges + SHA-256 + write) vs ``curl | tee | sha256sum``
    memory           the server's peak RSS (VmHWM) after all of the above, next to the file size

The server runs pinned to CPU 0 and every client to CPU 1 when ``taskset`` exists (PERF-NOTES: unpinned loopback
figures jump between ~1.1 and ~4 GB/s). Ratios are per pair, reported as median (min-max).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import xxhash

from devtools.ports import free_port

MB = 1_000_000


@dataclass
class Case:
    name: str
    bytes: int
    ours_s: list[float] = field(default_factory=list)
    base_s: list[float] = field(default_factory=list)
    baseline: str = ""
    note: str = ""

    def mbps(self, seconds: list[float]) -> float | None:
        return self.bytes / statistics.median(seconds) / MB if seconds else None

    def ratios(self) -> list[float]:
        """ours/baseline throughput per pair (> 1: ours faster)."""
        return [b / o for o, b in zip(self.ours_s, self.base_s, strict=False)]

    def row(self) -> dict[str, Any]:
        r = self.ratios()
        return {
            "case": self.name,
            "bytes": self.bytes,
            "ours_MBps": _round(self.mbps(self.ours_s)),
            "baseline": self.baseline,
            "baseline_MBps": _round(self.mbps(self.base_s)),
            "ratio_median": _round(statistics.median(r), 2) if r else None,
            "ratio_min": _round(min(r), 2) if r else None,
            "ratio_max": _round(max(r), 2) if r else None,
            "runs": len(self.ours_s),
            "note": self.note,
        }


def _round(v: float | None, digits: int = 0) -> float | None:
    return None if v is None else round(v, digits)


def pin(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def timed(cmd: list[str], **kwargs: Any) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, **kwargs)
    return time.perf_counter() - start


def curl_upload(src: Path, url: str, out: Path) -> list[str]:
    """The client command of every upload case: curl streaming ``src`` as the raw body of POST /v1/files."""
    return [
        *pin(1),
        "curl",
        "-sSf",
        "-X",
        "POST",
        "-T",
        str(src),
        "-H",
        "content-type: application/octet-stream",
        "-o",
        str(out),
        url,
    ]


def resolve_command(descriptor: Path, out: Path, connections: int) -> list[str]:
    """``transfer resolve`` pinned to the client core, ``connections`` ranged requests."""
    return [
        *pin(1),
        sys.executable,
        "-m",
        "transfer",
        "resolve",
        str(descriptor),
        "-o",
        str(out),
        "--connections",
        str(connections),
        "--no-progress",
    ]


# how long a service (ours or a baseline) may take to answer after it is started: generous, since the pair is
# lost when it is missed and start-up on a loaded 2-core machine takes far longer than the usual second or two
START_TIMEOUT = 120.0


def read_log(workdir: Path, name: str = "serve.log") -> str:
    """The last lines of a service's log in ``workdir``, for the error that says why it did not start."""
    path = workdir / name
    return "\n".join(path.read_text(errors="replace").splitlines()[-40:]) if path.exists() else "(no log)"


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


@contextmanager
def service(
    workdir: Path, data_dir: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[tuple[str, int]]:
    """``transfer serve`` in ``workdir`` on a free port, pinned to CPU 0; yields (url, pid). ``data_dir`` None:
    the service's own default (``./transfer-data``)."""
    port = free_port()
    log = open(workdir / "serve.log", "wb")  # noqa: SIM115
    dirs = [] if data_dir is None else ["--data-dir", str(data_dir)]
    command = [sys.executable, "-m", "transfer", "serve", "--port", str(port), "--log-level", "warning", *dirs]
    proc = subprocess.Popen([*pin(0), *command], stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"service exited ({proc.returncode}) before it was ready: " + read_log(workdir))
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"service not ready on {url}/healthz after {START_TIMEOUT:.0f} s "
                    f"(load average {os.getloadavg()[0]:.1f}): " + read_log(workdir)
                )
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextmanager
def nginx(root: Path, workdir: Path) -> Iterator[str | None]:
    """nginx serving ``root`` with sendfile on, if the binary exists; yields its base URL or None."""
    binary = ensure_tool("nginx", "nginx-light")
    if binary is None:
        yield None
        return
    port = free_port()
    conf = workdir / "nginx.conf"
    conf.write_text(
        ("user root;\n" if os.geteuid() == 0 else "")  # workers must read the temp files this process made
        + f"""daemon off; worker_processes 1; pid {workdir}/nginx.pid; error_log {workdir}/nginx.err;
events {{ worker_connections 64; }}
http {{ access_log off; sendfile on; tcp_nopush on; client_body_temp_path {workdir};
  proxy_temp_path {workdir}; fastcgi_temp_path {workdir}; uwsgi_temp_path {workdir}; scgi_temp_path {workdir};
  server {{ listen 127.0.0.1:{port}; root {root}; }} }}
"""
    )
    proc = subprocess.Popen([*pin(0), binary, "-c", str(conf), "-p", str(workdir)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"nginx exited ({proc.returncode}): " + read_log(workdir, "nginx.err")) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nginx not listening on port {port} after {START_TIMEOUT:.0f} s") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def ensure_tool(binary: str, package: str) -> str | None:
    """The path of ``binary``, installing Debian's ``package`` with apt-get when it is missing and we are root
    (the baselines are started by the benchmark itself); None when it cannot be had."""
    found = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        subprocess.run(install, env=env, capture_output=True)
    return shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)


def kernel_mbps(fn: Callable[[bytes], object], size: int = 256 << 20) -> float:
    buf = os.urandom(1 << 20)
    start = time.perf_counter()
    for _ in range(size >> 20):
        fn(buf)
    return size / (time.perf_counter() - start) / MB


def pinned_sha256_seconds(size: int, cpu: int) -> float:
    """Seconds to SHA-256 ``size`` bytes (1 MiB blocks) in a fresh process pinned to ``cpu``: the baseline of a
    row whose server does its hashing on that CPU, timed between that row's runs. A figure taken once, at the start
    and on another CPU, drifted from the runs it was compared with by up to a third on a shared host (Intel Xeon,
    2 vCPU: 0.94-1.08 GB/s within minutes)."""
    script = (
        "import hashlib, os, sys, time\n"
        "block = os.urandom(1 << 20); left = int(sys.argv[1]); h = hashlib.sha256(); start = time.perf_counter()\n"
        "while left > 0:\n"
        "    h.update(block[: min(left, len(block))]); left -= len(block)\n"
        "h.digest(); print(time.perf_counter() - start)\n"
    )
    out = subprocess.run(
        [*pin(cpu), sys.executable, "-c", script, str(size)], capture_output=True, text=True, check=True
    )
    return float(out.stdout)


def make_file(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        left = size
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)


def run(size: int, reps: int, workdir: Path, use_baselines: bool = True) -> dict[str, Any]:
    """Run every case on a file of ``size`` bytes; returns the report (also printed as a table by the caller)."""
    src_dir = workdir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    src = src_dir / "payload.bin"
    make_file(src, size)
    cases: list[Case] = []
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": sys.platform},
        "size": size,
        "kernels_MBps": {
            "sha256": round(kernel_mbps(lambda b: hashlib.sha256(b).digest())),
            "xxh3_128": round(kernel_mbps(lambda b: xxhash.xxh3_128(b).digest())),
        },
    }
    with service(workdir, workdir / "data") as (url, pid):
        upload = Case("upload (curl POST, SHA-256, fsync, new file)", size, baseline="dd bs=1M conv=fsync")
        descriptor: dict[str, Any] = {}
        for i in range(reps):
            out = workdir / f"up{i}.json"
            upload.ours_s.append(timed(curl_upload(src, f"{url}/v1/files?name=payload.bin", out)))
            descriptor = json.loads(out.read_text())
            if i < reps - 1:
                httpx.delete(f"{url}/v1/files/{descriptor['metadata']['file_id']}")
            if use_baselines:
                target = workdir / f"dd{i}.bin"
                upload.base_s.append(
                    timed(
                        [*pin(1), "dd", f"if={src}", f"of={target}", "bs=1M", "conv=fsync"], stderr=subprocess.DEVNULL
                    )
                )
                target.unlink()
        cases.append(upload)
        signed = descriptor["url"]
        sink = Case(
            "upload into a discarding sink (network + SHA-256)", size, baseline="SHA-256, one core (the server's)"
        )
        (workdir / "null").mkdir(exist_ok=True)
        with service(workdir / "null", env={**os.environ, "TRANSFER_STORAGE": "null"}) as (null_url, _):
            for i in range(reps):
                sink.ours_s.append(timed(curl_upload(src, f"{null_url}/v1/files", workdir / f"null{i}.json")))
                sink.base_s.append(pinned_sha256_seconds(size, cpu=0))
        cases.append(sink)
        half = size // 2
        with nginx(src_dir, workdir) as nginx_url:
            for label, extra, nbytes in (
                ("download full body", [], size),
                ("download one range (half)", ["-r", f"0-{half - 1}"], half),
            ):
                case = Case(label, nbytes, baseline="nginx sendfile" if nginx_url else "(nginx not installed)")
                for _ in range(reps):
                    case.ours_s.append(timed([*pin(1), "curl", "-sSf", *extra, "-o", "/dev/null", signed]))
                    if nginx_url and use_baselines:
                        case.base_s.append(
                            timed([*pin(1), "curl", "-sSf", *extra, "-o", "/dev/null", f"{nginx_url}/payload.bin"])
                        )
                cases.append(case)
        resolve = Case(
            "resolve url descriptor, one stream (download + SHA-256 + write)",
            size,
            baseline="curl | tee out | sha256sum",
        )
        desc_path = workdir / "descriptor.json"
        desc_path.write_text(json.dumps(descriptor))
        for i in range(reps):
            out = workdir / f"resolved{i}.bin"
            resolve.ours_s.append(timed(resolve_command(desc_path, out, connections=1), stderr=subprocess.DEVNULL))
            out.unlink()
            if use_baselines:
                piped = workdir / f"piped{i}.bin"
                resolve.base_s.append(timed([*pin(1), "sh", "-c", f"curl -sSf '{signed}' | tee '{piped}' | sha256sum"]))
                piped.unlink()
        cases.append(resolve)
        aria2c = ensure_tool("aria2c", "aria2") if use_baselines else None
        if aria2c:
            parallel = Case("resolve url descriptor, 4 connections", size, baseline="aria2c -x4 then sha256sum")
            for i in range(reps):
                out = workdir / f"resolved{i}.bin"
                parallel.ours_s.append(timed(resolve_command(desc_path, out, connections=4), stderr=subprocess.DEVNULL))
                out.unlink()
                fetched = workdir / f"aria{i}.bin"
                parallel.base_s.append(
                    timed(
                        [
                            *pin(1),
                            "sh",
                            "-c",
                            f"{aria2c} -q -x4 -s4 --allow-overwrite=true -d '{workdir}' "
                            f"-o '{fetched.name}' '{signed}' && sha256sum '{fetched}'",
                        ]
                    )
                )
                fetched.unlink()
            cases.append(parallel)
        report["server_peak_rss_bytes"] = peak_rss_bytes(pid)
    report["cases"] = [c.row() for c in cases]
    return report


def memory_profile(sizes: list[int], workdir: Path) -> list[dict[str, int]]:
    """Peak RSS of a fresh server process after uploading, downloading (full body) and importing (the service
    fetching its own URL, as for a foreign one) a file of each size: flat peaks prove that no path holds a whole
    file in memory."""
    rows = []
    env = {**os.environ, "TRANSFER_FETCH_ALLOW_NETWORKS": '["127.0.0.0/8"]'}
    for size in sizes:
        run_dir = workdir / f"mem{size}"
        run_dir.mkdir()
        src = run_dir / "payload.bin"
        make_file(src, size)
        with service(run_dir, run_dir / "data", env=env) as (url, pid):
            out = run_dir / "d.json"
            subprocess.run(
                curl_upload(src, f"{url}/v1/files?inline=false", out),
                check=True,
            )
            after_upload = peak_rss_bytes(pid)
            signed = json.loads(out.read_text())["url"]
            subprocess.run([*pin(1), "curl", "-sSf", "-o", "/dev/null", signed], check=True)
            after_download = peak_rss_bytes(pid)
            job = httpx.post(f"{url}/v1/imports", json={"descriptor": json.loads(out.read_text())}).json()["job_id"]
            while (state := httpx.get(f"{url}/v1/jobs/{job}").json())["state"] in ("pending", "running"):
                time.sleep(0.2)
            if state["state"] != "completed":
                raise RuntimeError(f"import failed: {state}")
            rows.append(
                {
                    "size": size,
                    "peak_rss_after_upload": after_upload,
                    "peak_rss_after_download": after_download,
                    "peak_rss_after_import": peak_rss_bytes(pid),
                }
            )
        shutil.rmtree(run_dir)
    return rows


def memory_table(rows: list[dict[str, int]]) -> str:
    """Peak RSS of fresh servers per file size (flat = streams, not buffers)."""
    lines = ["| file size | server peak RSS after upload | after download | after import |", "|---|---|---|---|"]
    for m in rows:
        lines.append(
            f"| {m['size'] >> 20} MiB | {m['peak_rss_after_upload'] / (1 << 20):.0f} MiB | "
            f"{m['peak_rss_after_download'] / (1 << 20):.0f} MiB | "
            f"{m.get('peak_rss_after_import', 0) / (1 << 20):.0f} MiB |"
        )
    return "\n".join(lines)


def table(report: dict[str, Any]) -> str:
    lines = [
        f"file size {report['size'] / (1 << 20):.0f} MiB; SHA-256 {report['kernels_MBps']['sha256']} MB/s, "
        f"xxh3-128 {report['kernels_MBps']['xxh3_128']} MB/s (one core); "
        f"server peak RSS {report['server_peak_rss_bytes'] / (1 << 20):.0f} MiB",
        "",
        "| case | ours MB/s | baseline | baseline MB/s | ratio median (min-max) |",
        "|---|---|---|---|---|",
    ]
    for row in report["cases"]:
        ratio = (
            "—"
            if row["ratio_median"] is None
            else (f"{row['ratio_median']:.2f}× ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})")
        )
        base = "—" if row["baseline_MBps"] is None else f"{row['baseline_MBps']:.0f}"
        baseline = row["baseline"].replace("|", "\\|")
        lines.append(f"| {row['case']} | {row['ours_MBps']:.0f} | {baseline} | {base} | {ratio} |")
    return "\n".join(lines)
