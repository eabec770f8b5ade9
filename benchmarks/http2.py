"""TLS and HTTP/2 rows (``python -m benchmarks.http2``; ``make bench`` runs them as the ``http2`` section).

1. Many small uploads: 4 KiB ``POST /v1/files`` through ``h2load`` (Debian's nghttp2-client, installed here when
   missing), over TLS, as 64 streams on one HTTP/2 connection vs 64 HTTP/1.1 connections, against the same
   ``transfer serve``. Requests/s and the server's CPU per request.
2. One large download over TLS: the file's signed URL with curl, HTTP/1.1 and HTTP/2, vs nginx over TLS with the same
   certificate, the same TLS 1.3 cipher (TLS_AES_128_GCM_SHA256, pinned on the client) and the same protocol.
3. The HTTP/2 server chosen: Hypercorn's h2 protocol on our listener (transfer.api.protocol.http2) vs Granian (Rust),
   each serving the same null ASGI application in cleartext (h2c): a 64 MiB upload, a 256 MiB download, and 4 KiB
   POSTs on 64 streams. This is the measurement behind the choice (README "TLS and HTTP/2").
4. The page in Chromium (Debian's, driven by Playwright, trusting our certificate with
   ``--ignore-certificate-errors``): 8 files of 2 MiB dropped at once, each a tus upload, over HTTP/2 (one
   connection) vs HTTP/1.1 (the server with ``--no-http2``; Chromium opens at most 6 connections to one host, so
   two uploads wait), on loopback and through a link emulator with a 40 ms round trip.

Server on CPU 0, clients on CPU 1 (``taskset``; Chromium, many processes, is not pinned), medians of ``reps`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from benchmarks.e2e import ensure_tool, free_port, make_file, pin
from benchmarks.summary import host_cpu

MB = 1e6


def _cpu_seconds_of(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its children (Granian serves from a worker process)."""
    import psutil

    total = 0.0
    process = psutil.Process(pid)
    for each in (process, *process.children(recursive=True)):
        times = each.cpu_times()
        total += times.user + times.system
    return total


CIPHER = "TLS_AES_128_GCM_SHA256"


def make_certs(workdir: Path) -> tuple[Path, Path, Path]:
    """A test CA and a certificate for 127.0.0.1 (trustme): (CA file, certificate chain, key)."""
    import trustme

    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    paths = workdir / "ca.pem", workdir / "cert.pem", workdir / "key.pem"
    ca.cert_pem.write_to_path(str(paths[0]))
    paths[1].write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(paths[2]))
    return paths


@contextmanager
def tls_service(
    workdir: Path, cert: Path, key: Path, ca: Path, extra: tuple[str, ...] = ()
) -> Iterator[tuple[str, int]]:
    """``transfer serve`` with TLS on a free port, pinned to CPU 0 (``extra``: more of its arguments); yields
    (https URL, pid)."""
    port = free_port()
    log = open(workdir / f"serve-tls-{port}.log", "wb")  # noqa: SIM115
    command = [sys.executable, "-m", "transfer", "serve", "--port", str(port), "--log-level", "warning"]
    command += ["--data-dir", str(workdir / "data"), "--tls-cert", str(cert), "--tls-key", str(key), *extra]
    proc = subprocess.Popen([*pin(0), *command], stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    url = f"https://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/healthz", proc, verify=str(ca))
        yield url, proc.pid
    finally:
        stop(proc)
        log.close()


def wait_ready(url: str, proc: subprocess.Popen[bytes], verify: str | bool = True) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url, verify=verify).status_code < 500:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"server at {url} did not start")
        time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def nginx_tls(root: Path, workdir: Path, cert: Path, key: Path) -> Iterator[str | None]:
    """nginx serving ``root`` over TLS (HTTP/1.1 and HTTP/2 by ALPN) with our certificate; None without nginx."""
    binary = ensure_tool("nginx", "nginx-light")
    if binary is None:
        yield None
        return
    port = free_port()
    conf = workdir / "nginx-tls.conf"
    conf.write_text(
        ("user root;\n" if os.geteuid() == 0 else "")
        + f"""daemon off; worker_processes 1; pid {workdir}/nginx-tls.pid; error_log {workdir}/nginx-tls.err;
events {{ worker_connections 256; }}
http {{ access_log off; sendfile on; tcp_nopush on; client_body_temp_path {workdir};
  proxy_temp_path {workdir}; fastcgi_temp_path {workdir}; uwsgi_temp_path {workdir}; scgi_temp_path {workdir};
  server {{ listen 127.0.0.1:{port} ssl http2; root {root};
    ssl_certificate {cert}; ssl_certificate_key {key}; ssl_protocols TLSv1.2 TLSv1.3; }} }}
"""
    )
    proc = subprocess.Popen([*pin(0), binary, "-c", str(conf), "-p", str(workdir)], stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"https://127.0.0.1:{port}/", proc, verify=False)
        yield f"https://127.0.0.1:{port}"
    finally:
        stop(proc)


def curl_download(url: str, protocol: str, ca: Path) -> float:
    """Seconds for curl to fetch ``url`` to /dev/null over TLS 1.3 with the pinned cipher."""
    command = [*pin(1), "curl", "-sSf", protocol, "--tlsv1.3", "--tls13-ciphers", CIPHER, "--cacert", str(ca)]
    start = time.perf_counter()
    subprocess.run([*command, "-o", "/dev/null", url], check=True)
    return time.perf_counter() - start


def run_tls_download(size: int, reps: int, workdir: Path) -> dict[str, Any]:
    ca, cert, key = make_certs(workdir)
    src_dir = workdir / "www"
    src_dir.mkdir(exist_ok=True)
    src = src_dir / "payload.bin"
    make_file(src, size)
    rows: dict[str, list[float]] = {}
    with tls_service(workdir, cert, key, ca) as (url, _pid), nginx_tls(src_dir, workdir, cert, key) as nginx_url:
        with open(src, "rb") as body:
            done = httpx.post(
                f"{url}/v1/files", params={"name": "payload.bin"}, content=body, verify=str(ca), timeout=600
            )
        done.raise_for_status()
        signed = done.json()["url"]
        targets = {"service": signed, **({"nginx": f"{nginx_url}/payload.bin"} if nginx_url else {})}
        for _ in range(reps):  # interleaved: each pair shares the machine's load of the moment
            for protocol in ("--http1.1", "--http2"):
                for name, target in targets.items():
                    rows.setdefault(f"{name} {protocol[2:]}", []).append(
                        size / curl_download(target, protocol, ca) / MB
                    )
    src.unlink()
    out: dict[str, Any] = {"size": size, "reps": reps, "cipher": CIPHER}
    for name, values in rows.items():
        out[name] = {"MBps": round(statistics.median(values), 1), "runs": [round(v, 1) for v in values]}
    return out


def h2load(url: str, body: Path, requests: int, *, h1: bool, ca: Path | None = None) -> dict[str, float]:
    """``h2load`` POSTing ``body`` ``requests`` times: 64 HTTP/1.1 connections (``h1``) or 64 streams on one
    HTTP/2 connection. Returns requests/s and the share of 2xx answers."""
    binary = ensure_tool("h2load", "nghttp2-client")
    if binary is None:
        raise RuntimeError("h2load is not installed (apt-get install nghttp2-client)")
    shape = ["--h1", "-c", "64", "-m", "1"] if h1 else ["-c", "1", "-m", "64"]
    command = [*pin(1), binary, "-n", str(requests), *shape, "-d", str(body)]
    command += ["-H", "content-type: application/octet-stream", url]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", done.stdout).group(1))  # type: ignore[union-attr]
    ok = int(re.search(r"status codes: (\d+) 2xx", done.stdout).group(1))  # type: ignore[union-attr]
    return {"rps": rps, "ok": ok / requests}


def run_small_uploads(requests: int, reps: int, workdir: Path) -> dict[str, Any]:
    ca, cert, key = make_certs(workdir)
    body = workdir / "4k.bin"
    body.write_bytes(os.urandom(4096))
    rows: dict[str, list[dict[str, float]]] = {"h2 1x64 streams": [], "http/1.1 64 connections": []}
    with tls_service(workdir, cert, key, ca) as (url, pid):
        target = f"{url}/v1/files?name=small.bin"
        h2load(target, body, 256, h1=False)  # warm-up
        h2load(target, body, 256, h1=True)
        for _ in range(reps):
            for name in rows:
                before = _cpu_seconds_of(pid)
                row = h2load(target, body, requests, h1=name.startswith("http/1.1"))
                row["cpu_ms_per_request"] = round((_cpu_seconds_of(pid) - before) * 1000 / requests, 3)
                rows[name].append(row)
    out: dict[str, Any] = {"requests": requests, "reps": reps}
    for name, values in rows.items():
        out[name] = {key: statistics.median(v[key] for v in values) for key in values[0]}
    out["ratio"] = round(out["h2 1x64 streams"]["rps"] / out["http/1.1 64 connections"]["rps"], 2)
    return out


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [  # as tests/client/test_web_page.py starts it, trusting the benchmark's own certificate
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--ignore-certificate-errors",
]
BROWSER_RTTS = (0, 40)  # ms of round trip: loopback, and a wide-area path (benchmarks.network.LinkEmulator)


def page_uploads(browser: Any, url: str, files: list[Path]) -> dict[str, Any]:
    """The page at ``url`` uploading ``files`` at once (tus-js-client, one upload per file, as a user dropping
    them): seconds until every row says done, and the connections and protocol Chromium used for them."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(300_000)
        page.goto(url + "/")
        page.wait_for_function("() => window.tus && window.tus.isSupported")
        cdp = context.new_cdp_session(page)
        seen: dict[Any, str] = {}

        def on_response(params: dict[str, Any]) -> None:
            response = params["response"]
            if response["url"].startswith(url):
                seen[response.get("connectionId")] = response.get("protocol", "?")

        cdp.on("Network.responseReceived", on_response)
        cdp.send("Network.enable")
        start = time.perf_counter()
        page.set_input_files("#pick", [str(f) for f in files])
        page.wait_for_function(
            f"() => [...document.querySelectorAll('#uploads li')].filter(li => li.dataset.state === 'done').length"
            f" === {len(files)}"
        )
        seconds = time.perf_counter() - start
        failed = page.evaluate("() => [...document.querySelectorAll('#uploads li.failed')].length")
        if failed:
            raise RuntimeError(f"{failed} uploads failed in the page")
        return {"seconds": seconds, "connections": len(seen), "protocols": sorted(set(seen.values()))}
    finally:
        context.close()


def run_browser_uploads(files: int, size: int, reps: int, workdir: Path) -> dict[str, Any] | None:
    """The page uploading ``files`` files of ``size`` bytes at once in Chromium over TLS: HTTP/2 (one connection)
    vs HTTP/1.1 (``--no-http2``: Chromium opens at most 6 connections to one host), at each round trip of
    ``BROWSER_RTTS`` (through the link emulator of :mod:`benchmarks.network`, its rate cap set out of the way:
    a cap per connection would hand HTTP/1.1's six connections six times the bandwidth), interleaved; medians
    of ``reps``. None without Chromium (``make install``)."""
    if not Path(CHROMIUM).is_file():
        return None
    from playwright.sync_api import sync_playwright

    from benchmarks.network import LinkEmulator

    ca, cert, key = make_certs(workdir)
    paths = []
    for n in range(files):
        path = workdir / f"page-{n}.bin"
        path.write_bytes(os.urandom(size))
        paths.append(path)
    runs: dict[str, list[dict[str, Any]]] = {}
    (workdir / "h1").mkdir(exist_ok=True)
    with (
        tls_service(workdir, cert, key, ca) as (h2_url, _),
        tls_service(workdir / "h1", cert, key, ca, ("--no-http2",)) as (h1_url, _),
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page_uploads(browser, h2_url, paths[:2])  # warm-up: both servers, the page's assets
            page_uploads(browser, h1_url, paths[:2])
            for _ in range(reps):
                for rtt in BROWSER_RTTS:
                    for name, url in (("h2", h2_url), ("http/1.1", h1_url)):
                        port = int(url.rsplit(":", 1)[1])
                        if rtt == 0:
                            runs.setdefault(f"{name} {rtt}ms", []).append(page_uploads(browser, url, paths))
                            continue
                        with LinkEmulator(port, rate=10e9, latency=rtt / 2000) as link:
                            via = f"https://127.0.0.1:{link.port}"
                            runs.setdefault(f"{name} {rtt}ms", []).append(page_uploads(browser, via, paths))
        finally:
            browser.close()
    out: dict[str, Any] = {"files": files, "size": size, "reps": reps}
    for name, values in runs.items():
        out[name] = {
            "seconds": round(statistics.median(v["seconds"] for v in values), 3),
            "runs": [round(v["seconds"], 3) for v in values],
            "connections": max(v["connections"] for v in values),
            "protocols": sorted({p for v in values for p in v["protocols"]}),
        }
    for rtt in BROWSER_RTTS:
        h2, h1 = out[f"h2 {rtt}ms"]["seconds"], out[f"http/1.1 {rtt}ms"]["seconds"]
        out[f"speedup {rtt}ms"] = round(h1 / h2, 2)
    return out


@contextmanager
def null_server(kind: str, app: str) -> Iterator[tuple[str, int]]:
    """The null application ``app`` of :mod:`benchmarks.h2apps` on CPU 0: on our listener (``listener``) or
    under Granian (``granian``), cleartext, HTTP/1.1 + h2c."""
    port = free_port()
    if kind == "listener":
        command = [sys.executable, "-m", "benchmarks.h2apps", app, str(port)]
    else:
        granian = shutil.which("granian") or str(Path(sys.executable).parent / "granian")
        command = [granian, "--interface", "asgi", "--http", "auto", "--port", str(port), "--workers", "1"]
        command += ["--loop", "uvloop", "--log-level", "warning", "--http2-initial-stream-window-size", str(1 << 20)]
        command += ["--http2-initial-connection-window-size", str(16 << 20), f"benchmarks.h2apps:{app}"]
    proc = subprocess.Popen([*pin(0), *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}/", proc)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        stop(proc)


def curl_h2c(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([*pin(1), "curl", "-sSf", "--http2-prior-knowledge", "-o", "/dev/null", *args], check=True)
    return time.perf_counter() - start


def run_server_choice(reps: int, workdir: Path) -> dict[str, Any]:
    upload = workdir / "64m.bin"
    make_file(upload, 64 << 20)
    small = workdir / "4k-choice.bin"
    small.write_bytes(os.urandom(4096))
    out: dict[str, Any] = {}
    for kind in ("listener", "granian"):
        if kind == "granian" and not (shutil.which("granian") or (Path(sys.executable).parent / "granian").exists()):
            out[kind] = None
            continue
        row: dict[str, list[float]] = {"upload_MBps": [], "download_MBps": [], "small_rps": []}
        with null_server(kind, "sink") as (sink, _):
            for _ in range(reps):
                row["upload_MBps"].append((64 << 20) / curl_h2c(["--data-binary", f"@{upload}", sink]) / MB)
                row["small_rps"].append(h2load(sink, small, 6400, h1=False)["rps"])
        with null_server(kind, "source") as (source, _):
            for _ in range(reps):
                row["download_MBps"].append((256 << 20) / curl_h2c([source]) / MB)
        out[kind] = {key: round(statistics.median(values), 1) for key, values in row.items()}
        with service_under(kind, workdir / f"svc-{kind}") as (url, pid):
            target = f"{url}/v1/files?name=small.bin"
            h2load(target, small, 256, h1=False)  # warm-up
            rps, cpu = [], []
            for _ in range(reps):
                before = _cpu_seconds_of(pid)
                rps.append(h2load(target, small, 3200, h1=False)["rps"])
                cpu.append((_cpu_seconds_of(pid) - before) * 1000 / 3200)
                row["service_upload_MBps"] = row.get("service_upload_MBps", [])
                seconds = curl_h2c(["--data-binary", f"@{upload}", f"{url}/v1/files?name=big.bin"])
                row["service_upload_MBps"].append((64 << 20) / seconds / MB)
        out[kind]["service_small_rps"] = round(statistics.median(rps), 1)
        out[kind]["service_cpu_ms"] = round(statistics.median(cpu), 2)
        out[kind]["service_upload_MBps"] = round(statistics.median(row["service_upload_MBps"]), 1)
    upload.unlink()
    return out


@contextmanager
def service_under(kind: str, workdir: Path) -> Iterator[tuple[str, int]]:
    """The whole service (``transfer.hosts:default_app``, local storage) on CPU 0, cleartext: ``transfer serve``
    (``listener``) or Granian with one worker (``granian``)."""
    workdir.mkdir(exist_ok=True)
    port = free_port()
    env = {**os.environ, "TRANSFER_DATA_DIR": str(workdir / "data"), "TRANSFER_PORT": str(port)}
    if kind == "listener":
        command = [sys.executable, "-m", "transfer", "serve", "--log-level", "warning"]
    else:
        granian = shutil.which("granian") or str(Path(sys.executable).parent / "granian")
        command = [granian, "--interface", "asgi", "--http", "auto", "--port", str(port), "--workers", "1"]
        command += ["--loop", "uvloop", "--log-level", "warning", "--http2-initial-stream-window-size", str(1 << 20)]
        command += ["--http2-initial-connection-window-size", str(16 << 20), "--factory", "transfer.hosts:default_app"]
    proc = subprocess.Popen([*pin(0), *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        stop(proc)


def http2_table(report: dict[str, Any]) -> str:
    lines = ["### TLS and HTTP/2", ""]
    small = report.get("small")
    if small:
        lines += [
            f"4 KiB uploads over TLS (POST /v1/files, local storage, {small['requests']} per run, h2load; "
            f"medians of {small['reps']}):",
            "",
            "| client shape | requests/s | server CPU ms/request | 2xx |",
            "| --- | ---: | ---: | ---: |",
        ]
        for name in ("h2 1x64 streams", "http/1.1 64 connections"):
            row = small[name]
            lines.append(f"| {name} | {row['rps']:.0f} | {row['cpu_ms_per_request']:.2f} | {row['ok']:.0%} |")
        lines += ["", f"HTTP/2 / HTTP/1.1: **{small['ratio']}x**", ""]
    download = report.get("download")
    if download:
        lines += [
            f"{download['size'] >> 20} MiB download over TLS 1.3 ({download['cipher']}, same certificate), curl; "
            f"medians of {download['reps']}:",
            "",
            "| protocol | service MB/s | nginx MB/s | ratio |",
            "| --- | ---: | ---: | ---: |",
        ]
        for protocol in ("http1.1", "http2"):
            ours = download.get(f"service {protocol}", {}).get("MBps")
            theirs = download.get(f"nginx {protocol}", {}).get("MBps")
            ratio = f"{ours / theirs:.2f}" if ours and theirs else "n/a"
            lines.append(f"| {protocol} | {ours} | {theirs or 'not run'} | {ratio} |")
        lines.append("")
    choice = report.get("choice")
    if choice:
        lines += [
            "The HTTP/2 server, on a null ASGI app, h2c (curl --http2-prior-knowledge; h2load 64 streams):",
            "",
            "| server | null app: 64 MiB upload MB/s | 256 MiB download MB/s | 4 KiB POSTs req/s "
            "| the service: 4 KiB uploads req/s | CPU ms/upload | 64 MiB upload MB/s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for kind, label in (("listener", "Hypercorn h2 on our listener"), ("granian", "Granian 2 (Rust)")):
            row = choice.get(kind)
            if row is None:
                lines.append(f"| {label} | not installed | | | | | |")
            else:
                lines.append(
                    f"| {label} | {row['upload_MBps']} | {row['download_MBps']} | {row['small_rps']:.0f} "
                    f"| {row['service_small_rps']:.0f} | {row['service_cpu_ms']} | {row['service_upload_MBps']} |"
                )
        lines.append("")
    browser = report.get("browser")
    if browser:
        lines += [
            f"The page (tus-js-client) uploading {browser['files']} files of {browser['size'] >> 20} MiB at once in "
            f"Chromium over TLS, until every row says done; medians of {browser['reps']}:",
            "",
            "| round trip | HTTP/2 s | connections | HTTP/1.1 s | connections | HTTP/1.1 / HTTP/2 |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for rtt in BROWSER_RTTS:
            h2, h1 = browser[f"h2 {rtt}ms"], browser[f"http/1.1 {rtt}ms"]
            lines.append(
                f"| {rtt} ms | {h2['seconds']} | {h2['connections']} | {h1['seconds']} | {h1['connections']} "
                f"| **{browser[f'speedup {rtt}ms']}x** |"
            )
        lines.append("")
    return "\n".join(lines)


SECTIONS = ("small", "download", "choice", "browser")


def run_http2(
    size: int, reps: int, workdir: Path, *, quick: bool = False, only: tuple[str, ...] = SECTIONS
) -> dict[str, Any]:
    """Every row of this module (see the docstring), or the sections named in ``only``."""
    report: dict[str, Any] = {"cpu": host_cpu()}
    for section in only:
        (workdir / f"h2-{section}").mkdir(exist_ok=True)
    if "small" in only:
        report["small"] = run_small_uploads(2000 if quick else 6400, reps, workdir / "h2-small")
    if "download" in only:
        report["download"] = run_tls_download(size, reps, workdir / "h2-download")
    if "choice" in only:
        report["choice"] = run_server_choice(reps, workdir / "h2-choice")
    if "browser" in only:
        report["browser"] = run_browser_uploads(8, 2 << 20, reps, workdir / "h2-browser")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http2", description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1024, help="download size in MiB (default 1024)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="these sections only")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="transfer-h2-") as tmp:
        report = run_http2(args.size << 20, args.reps, Path(tmp), quick=args.quick, only=tuple(args.only))
        print(f"Machine: {report['cpu']}\n", flush=True)  # before the clean-up of tens of thousands of objects
        print(http2_table(report), flush=True)
        print(json.dumps(report), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
