"""Whether HTTP/3 pays here: Hypercorn's HTTP/3 (QUIC through aioquic, pure Python) against its HTTP/2 over TLS,
the same null ``source`` application (:mod:`benchmarks.h2apps`) and process, on a clean loopback and with 1 %
packet loss (``python -m benchmarks.http3``; not part of ``make bench``: it needs ``aioquic``, root, and Debian's
nftables, and answers a question of design rather than tracking a figure).

The link: a network namespace the benchmark makes itself (``unshare -n``) whose loopback has a 1,500-byte MTU and
GSO off (so a "packet" is one datagram or one TCP segment, as on the Internet) and, for the lossy rows, an nftables
rule dropping 1 packet in 100 at random in each direction (``numgen random mod 100``). ``tc netem`` is not
available in this kernel (``CONFIG_NET_SCH_NETEM`` is not set), so the link adds no delay: the round trip is
loopback's. Server on CPU 0; clients on CPU 1: curl for HTTP/2, an aioquic client for HTTP/3 (there is no curl
with HTTP/3 in Debian 12). The figure that does not depend on the client is the server's CPU per byte.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.e2e import free_port, pin
from benchmarks.http2 import _cpu_seconds_of, make_certs, stop
from benchmarks.summary import host_cpu

MB = 1e6


async def h3_get(port: int, path: str) -> int:
    """GET ``path`` over HTTP/3 from 127.0.0.1:``port``; the body's length."""
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import DataReceived, HeadersReceived
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import QuicEvent

    class Client(QuicConnectionProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.h3 = H3Connection(self._quic)
            self.received = 0
            self.done = asyncio.Event()

        def quic_event_received(self, event: QuicEvent) -> None:
            for h3_event in self.h3.handle_event(event):
                if isinstance(h3_event, DataReceived):
                    self.received += len(h3_event.data)
                if isinstance(h3_event, DataReceived | HeadersReceived) and h3_event.stream_ended:
                    self.done.set()

    configuration = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, verify_mode=ssl.CERT_NONE)
    configuration.max_data = configuration.max_stream_data = 16 << 20
    async with connect("127.0.0.1", port, configuration=configuration, create_protocol=Client) as client:
        assert isinstance(client, Client)
        stream = client._quic.get_next_available_stream_id()
        headers = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", f"127.0.0.1:{port}".encode())]
        client.h3.send_headers(stream, [*headers, (b":path", path.encode())], end_stream=True)
        client.transmit()
        await client.done.wait()
        return client.received


def fetch(protocol: str, port: int, mib: int) -> tuple[float, float]:
    """Seconds to download ``mib`` MiB over ``protocol`` (h2 with curl, h3 with the aioquic client), on CPU 1, and
    the client's CPU seconds."""
    url = f"https://127.0.0.1:{port}/?mib={mib}"
    if protocol == "h2":
        command = [*pin(1), "curl", "-sSfk", "--http2", "-o", "/dev/null", url]
    else:
        command = [*pin(1), sys.executable, "-m", "benchmarks.http3", "--get", str(port), str(mib)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, timeout=900)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def shape_link(loss: int) -> None:
    """This namespace's loopback as the module docstring says: MTU 1,500, no GSO, ``loss`` % dropped."""
    subprocess.run(["ip", "link", "set", "lo", "up", "mtu", "1500", "gso_max_size", "1500"], check=True)
    if loss:
        nft = shutil.which("nft") or "/usr/sbin/nft"
        subprocess.run([nft, "add", "table", "inet", "loss"], check=True)
        chain = "{ type filter hook output priority 0; }"
        subprocess.run([nft, "add", "chain", "inet", "loss", "out", chain], check=True)
        rule = ["numgen", "random", "mod", "100", "<", str(loss), "drop"]
        subprocess.run([nft, "add", "rule", "inet", "loss", "out", *rule], check=True)


def measure(loss: int, mib: int, reps: int, workdir: Path) -> dict[str, Any]:
    """Inside the namespace: one Hypercorn (h2 over TLS and h3 on the same port number), each protocol ``reps``
    times interleaved: MB/s and the server's CPU ms per MiB."""
    shape_link(loss)
    _ca, cert, key = make_certs(workdir)
    port = free_port()
    hypercorn = str(Path(sys.executable).parent / "hypercorn")
    command = [hypercorn, "--bind", f"127.0.0.1:{port}", "--quic-bind", f"127.0.0.1:{port}"]
    command += ["--certfile", str(cert), "--keyfile", str(key), "--log-level", "warning", "benchmarks.h2apps:source"]
    proc = subprocess.Popen([*pin(0), *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs: dict[str, list[tuple[float, float, float]]] = {"h2": [], "h3": []}
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["curl", "-sfk", "-o", "/dev/null", f"https://127.0.0.1:{port}/?mib=1"]).returncode:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("hypercorn did not start")
            time.sleep(0.2)
        for _ in range(reps):
            for protocol in runs:
                before = _cpu_seconds_of(proc.pid)
                seconds, client_cpu = fetch(protocol, port, mib)
                runs[protocol].append((seconds, _cpu_seconds_of(proc.pid) - before, client_cpu))
    finally:
        stop(proc)
    out: dict[str, Any] = {"loss_percent": loss, "mib": mib, "reps": reps}
    for protocol, values in runs.items():
        out[protocol] = {
            "MBps": round(statistics.median((mib << 20) / s / MB for s, _, _ in values), 1),
            "server_cpu_ms_per_MiB": round(statistics.median(c * 1000 / mib for _, c, _ in values), 2),
            "client_cpu_ms_per_MiB": round(statistics.median(c * 1000 / mib for _, _, c in values), 2),
            "runs_s": [round(s, 2) for s, _, _ in values],
        }
    return out


def http3_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"Hypercorn, one process: HTTP/2 over TLS (curl) vs HTTP/3 (aioquic client), {rows[0]['mib']} MiB download "
        f"of a null app, medians of {rows[0]['reps']}:",
        "",
        "| link | h2 MB/s | h3 MB/s | h3 / h2 | server CPU ms/MiB h2 | h3 | client CPU ms/MiB h2 | h3 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        h2, h3 = row["h2"], row["h3"]
        lines.append(
            f"| loopback, {row['loss_percent']} % loss | {h2['MBps']} | {h3['MBps']} | {h3['MBps'] / h2['MBps']:.2f}x "
            f"| {h2['server_cpu_ms_per_MiB']} | {h3['server_cpu_ms_per_MiB']} "
            f"| {h2['client_cpu_ms_per_MiB']} | {h3['client_cpu_ms_per_MiB']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.http3", description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--loss", type=int, nargs="+", default=[0, 1], help="percent of packets dropped")
    parser.add_argument("--inner", type=int, help=argparse.SUPPRESS)  # run in the namespace with this loss
    parser.add_argument("--get", nargs=2, type=int, help=argparse.SUPPRESS)  # the HTTP/3 client: PORT MIB
    args = parser.parse_args(argv)
    try:
        import aioquic  # noqa: F401
    except ImportError:
        print("benchmarks.http3 needs aioquic: .venv/bin/pip install aioquic (and apt-get install nftables)")
        return 2
    if args.get:
        got = asyncio.run(h3_get(args.get[0], f"/?mib={args.get[1]}"))
        return 0 if got == args.get[1] << 20 else 1
    if args.inner is not None:
        with tempfile.TemporaryDirectory(prefix="transfer-h3-") as tmp:
            print(json.dumps(measure(args.inner, args.mib, args.reps, Path(tmp))), flush=True)
        return 0
    rows = []
    for loss in args.loss:  # each in a namespace of its own, made and dropped by unshare
        inner = [sys.executable, "-m", "benchmarks.http3", "--inner", str(loss)]
        inner += ["--mib", str(args.mib), "--reps", str(args.reps)]
        done = subprocess.run(["unshare", "-n", *inner], capture_output=True, text=True, check=True, env=os.environ)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"Machine: {host_cpu()}\n")
    print(http3_table(rows))
    print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
