"""How cost grows with clients: aggregate MB/s and per-transfer p99 for 1, 8, 64 and 256 concurrent clients
downloading and uploading 16 MiB files, and the server's CPU seconds per GiB moved (user + system time of the
server process from ``/proc/<pid>/stat``, read before and after each phase): the efficiency figure that does not
depend on how fast the host is.

Clients are one load-generator process pinned to the client core (raw asyncio streams, keep-alive, each client one
connection): its own cost stays off the server's core. Downloads are full-body GETs of one stored file (served from
the page cache); uploads are raw-body POSTs of fresh bytes (each a new, fsynced, SHA-256-verified object).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from benchmarks.e2e import make_file, pin, service

MB = 1_000_000
GiB = 1 << 30

LOAD = r"""
import asyncio, json, socket, sys, time
from urllib.parse import urlsplit
import uvloop
mode, url, total, clients, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
u = urlsplit(url)
target = u.path + ("?" + u.query if u.query else "")
body = bytes(range(256)) * (size // 256)
lat = []
left = total
async def client():
    global left
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, (u.hostname, u.port))
    buf = bytearray(1 << 20)  # reused: the client must not be what is measured (256 clients: 256 MiB, fine)
    view = memoryview(buf)
    while left > 0:
        left -= 1
        t = time.perf_counter()
        if mode == "download":
            await loop.sock_sendall(sock, f"GET {target} HTTP/1.1\r\nHost: {u.netloc}\r\n\r\n".encode())
        else:
            head = (f"POST {target} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/octet-stream\r\n"
                    f"Content-Length: {size}\r\n\r\n").encode()
            await loop.sock_sendall(sock, head)
            await loop.sock_sendall(sock, body)
        got = b""
        while b"\r\n\r\n" not in got:
            n = await loop.sock_recv_into(sock, view)
            assert n, "closed"
            got += view[:n]
        raw, _, rest = got.partition(b"\r\n\r\n")
        status = int(raw.split(b" ", 2)[1])
        length = next(int(l.split(b":")[1]) for l in raw.split(b"\r\n") if l.lower().startswith(b"content-length:"))
        length -= len(rest)
        while length > 0:
            n = await loop.sock_recv_into(sock, view[: min(length, len(buf))])
            assert n, "closed"
            length -= n
        assert status in (200, 201), status
        lat.append(time.perf_counter() - t)
    sock.close()
async def main():
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    took = time.perf_counter() - start
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(json.dumps({"seconds": took, "p50_s": lat[len(lat) // 2], "p99_s": p99}))
uvloop.run(main())
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drive(mode: str, url: str, transfers: int, clients: int, size: int) -> dict[str, float]:
    out = subprocess.run(
        [*pin(1), sys.executable, "-c", LOAD, mode, url, str(transfers), str(clients), str(size)],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def run_concurrency(
    workdir: Path,
    levels: tuple[int, ...] = (1, 8, 64, 256),
    size: int = 16 << 20,
    *,
    quick: bool = False,
) -> dict[str, Any]:
    """Each level: ``level`` transfers at once, downloads then uploads, moving as many bytes as the largest level
    does (4 GiB: 256 transfers of 16 MiB at every level); uploads are deleted between levels so the disk holds at
    most one level's worth. ``quick``: the 256-client level moves 4 MiB files instead of ``size`` (a quarter of the
    bytes; the row says so), and every level 1 GiB, which keeps ``--quick`` to a few minutes.

    Every level moves the same bytes because what a GiB costs depends on how many are moved: uploads write into the
    page cache, and on these VMs the kernel's copy into pages of memory the guest has not touched for a while costs
    several times a copy into pages just freed (server CPU for one client's 16 MiB uploads 2.1-2.7 s/GiB, 5.2-6.0
    with 6 GiB of just-uploaded files cached; perf: 48 % in ``copy_folio_from_iter_atomic``). With 8 transfers at
    one client and 256 at 256 clients, the CPU per GiB "grew with concurrency" by that alone."""
    run_dir = workdir / "concurrency"
    run_dir.mkdir(exist_ok=True)
    rows: list[dict[str, Any]] = []
    with service(run_dir, run_dir / "data") as (url, pid):
        with httpx.Client(timeout=120) as http:
            stored: dict[int, dict[str, Any]] = {}  # file size -> descriptor of the file downloads fetch

            def file_size(level: int) -> int:
                return min(size, 4 << 20) if quick and level >= 256 else size

            per_level = max(level * file_size(level) for level in levels)  # bytes each level moves each way
            for level in levels:
                level_size = file_size(level)
                if level_size not in stored:
                    src = run_dir / "payload.bin"
                    make_file(src, level_size)
                    stored[level_size] = http.post(f"{url}/v1/files?inline=false", content=src.read_bytes()).json()
                    src.unlink()
                transfers = max(level, per_level // level_size)
                row: dict[str, Any] = {"clients": level, "transfers": transfers, "size": level_size}
                if level_size != size:
                    row["reduced"] = f"--quick: {level_size >> 20} MiB files instead of {size >> 20} MiB"
                for mode, target in (
                    ("download", stored[level_size]["url"]),
                    ("upload", f"{url}/v1/files?inline=false"),
                ):
                    before = cpu_seconds(pid)
                    result = _drive(mode, target, transfers, level, level_size)
                    used = cpu_seconds(pid) - before
                    moved = transfers * level_size
                    row[mode] = {
                        "MBps": round(moved / result["seconds"] / MB),
                        "p50_s": round(result["p50_s"], 3),
                        "p99_s": round(result["p99_s"], 3),
                        "cpu_s_per_GiB": round(used / (moved / GiB), 3),
                    }
                keep = {d["metadata"]["file_id"] for d in stored.values()}
                for item in _all_files(http, url):
                    file_id = item["metadata"]["file_id"]
                    if file_id not in keep:
                        http.delete(f"{url}/v1/files/{file_id}")
                rows.append(row)
    return {"size": size, "rows": rows}


def concurrency_table(report: dict[str, Any], machine: str) -> str:
    lines = [
        f"Concurrent clients, {report['size'] >> 20} MiB files each unless the row says otherwise ({machine}); "
        "server CPU = user + system seconds of the server process per GiB moved; p99 = per-transfer latency",
        "",
        "| clients | transfers x file | download MB/s | download p99 s | download CPU s/GiB | upload MB/s | "
        "upload p99 s | upload CPU s/GiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        d, u = r["download"], r["upload"]
        files = f"{r['transfers']} x {r['size'] >> 20} MiB" + (f" ({r['reduced']})" if r.get("reduced") else "")
        lines.append(
            f"| {r['clients']} | {files} | {d['MBps']} | {d['p99_s']:.3f} | {d['cpu_s_per_GiB']:.2f} | {u['MBps']} | "
            f"{u['p99_s']:.3f} | {u['cpu_s_per_GiB']:.2f} |"
        )
    return "\n".join(lines)


def _all_files(http: httpx.Client, url: str) -> list[dict[str, Any]]:
    """Every stored file's descriptor, page by page (GET /v1/files pages with a cursor)."""
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
        page = http.get(f"{url}/v1/files", params=params).json()
        items.extend(page["files"])
        cursor = page.get("next_cursor")
        if not cursor:
            return items
