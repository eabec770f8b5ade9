"""A bounded soak: many concurrent clients mixing small and large uploads, chunked sessions, ranged downloads and
resolves against one real server. Zero failed transfers, every checksum verified, no leaked temp files or file
descriptors, memory flat. ``TRANSFER_SOAK_SECONDS`` (default 15) and ``TRANSFER_SOAK_CLIENTS`` (default 100) set
the profile; a longer run: ``TRANSFER_SOAK_SECONDS=120 TRANSFER_SOAK_CLIENTS=300 pytest tests/ops/test_soak.py -s``."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import statistics
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import xxhash

from benchmarks.e2e import peak_rss_bytes, service
from transfer.client import AsyncTransferClient, ResolveOptions

SECONDS = float(os.environ.get("TRANSFER_SOAK_SECONDS", "15"))
CLIENTS = int(os.environ.get("TRANSFER_SOAK_CLIENTS", "100"))
KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture
def soak_server(tmp_path: Path) -> Iterator[tuple[str, int, Path]]:
    """A real `transfer serve` process, so that its memory and descriptors are its own."""
    with service(tmp_path, tmp_path / "data") as (url, pid):
        yield url, pid, tmp_path / "data"


@pytest.mark.slow
@pytest.mark.anyio
async def test_soak(soak_server: tuple[str, int, Path]) -> None:
    url, pid, data_dir = soak_server
    process = psutil.Process(pid)
    fds_before = process.num_fds()
    stats: dict[str, Any] = {"ops": {}, "bytes": 0, "errors": [], "latency": []}
    shared = os.urandom(8 * MiB)
    limits = httpx.Limits(max_connections=CLIENTS + 8, max_keepalive_connections=CLIENTS)
    async with (
        httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http,
        AsyncTransferClient(url, options=ResolveOptions(connections=2, parallel_min_size=2 * MiB), http=http) as client,
    ):
        big = await client.upload(shared, name="shared.bin")
        assert big.url is not None
        warm = process.memory_info().rss
        deadline = time.monotonic() + SECONDS

        async def small(rng: random.Random) -> int:
            data = os.urandom(rng.randint(1, 64) * KiB)
            d = await client.upload(data)
            assert await client.resolve(d) == data
            return 2 * len(data)

        async def medium(rng: random.Random) -> int:
            data = os.urandom(rng.randint(1 * MiB + 1, 3 * MiB))
            d = await client.upload(data)
            assert d.url is not None
            a = rng.randrange(len(data) - 10)
            b = rng.randrange(a, len(data))
            r = await http.get(d.url, headers={"range": f"bytes={a}-{b}"})
            assert r.status_code == 206 and r.content == data[a : b + 1]
            assert await client.resolve(d) == data
            return 2 * len(data) + (b - a + 1)

        async def chunked(rng: random.Random) -> int:
            chunk = 64 * KiB
            data = os.urandom(chunk * 3 + rng.randint(1, chunk - 1))
            doc = (
                await http.post(
                    "/v1/sessions",
                    json={
                        "size": len(data),
                        "chunk_size": chunk,
                        "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
                    },
                )
            ).json()
            sid = doc["streaming_session_id"]

            async def put(i: int) -> None:
                piece = data[i * chunk : (i + 1) * chunk]
                r = await http.put(
                    f"/v1/sessions/{sid}/chunks/{i}",
                    content=piece,
                    headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(piece)},
                )
                assert r.status_code == 201, r.text

            await asyncio.gather(*(put(i) for i in rng.sample(range(4), 4)))
            r = await http.post(f"/v1/sessions/{sid}/complete", json={})
            assert r.status_code == 200, r.text
            assert r.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
            return len(data)

        async def ranged(rng: random.Random) -> int:
            a = rng.randrange(len(shared) - 1)
            b = min(len(shared) - 1, a + rng.randint(0, 2 * MiB))
            assert big.url is not None
            r = await http.get(big.url, headers={"range": f"bytes={a}-{b}"})
            assert r.status_code == 206 and r.content == shared[a : b + 1]
            return b - a + 1

        async def followed(rng: random.Random) -> int:
            """An upload whose AIFlowy progress stream is followed at the same time."""
            data = os.urandom(rng.randint(1 * MiB, 2 * MiB))
            job_id = f"soak-{rng.getrandbits(64):016x}"

            async def follow() -> list[Any]:
                return [e async for e in client.follow_job(job_id)]

            reader = asyncio.create_task(follow())
            await asyncio.sleep(0.05)
            d = await client.upload(data, job_id=job_id)
            events = await asyncio.wait_for(reader, 60)
            assert events[-1].event == "done" and events[-1].envelope["meta"]["bytes"] == len(data)
            result = next(e for e in events if e.type == "tool_result")
            assert result.payload["result"]["descriptor"]["checksum"] == d.checksum
            return len(data)

        async def mounted(rng: random.Random) -> int:
            """A TP resource_mount (REST binding) of a stored file, then a read through the new descriptor."""
            envelope = {
                "tp_version": "1.0.0",
                "message_id": f"m-{rng.getrandbits(64):016x}",
                "message_type": "resource_mount",
                "sender": "fay:soak",
                "payload": {"resource_id": big.metadata["file_id"]},  # type: ignore[index]
            }
            r = await http.post("/tp/v1/resource/mount", json=envelope, headers={"content-type": "application/tp+json"})
            assert r.status_code == 200, r.text
            url = r.json()["payload"]["resource"]["url"]
            r = await http.get(url, headers={"range": "bytes=0-65535"})
            assert r.status_code == 206 and r.content == shared[:65536]
            return 65536

        mix = [small] * 5 + [medium] * 2 + [chunked] + [ranged] * 2 + [followed, mounted]

        async def worker(n: int) -> None:
            rng = random.Random(n)
            while time.monotonic() < deadline:
                op = rng.choice(mix)
                started = time.perf_counter()
                try:
                    moved = await op(rng)  # awaited first: `x += await f()` would read x before the await
                    stats["bytes"] += moved
                    stats["latency"].append(time.perf_counter() - started)
                    stats["ops"][op.__name__] = stats["ops"].get(op.__name__, 0) + 1
                except Exception as exc:  # every failure is a finding: collect them all, fail below
                    where = traceback.extract_tb(exc.__traceback__)
                    place = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in where[-1:-6:-1])
                    stats["errors"].append(f"{op.__name__}: {type(exc).__name__}: {exc} at {place}")

        await asyncio.gather(*(worker(n) for n in range(CLIENTS)))
        peak = peak_rss_bytes(pid)
    latencies = sorted(stats["latency"])
    report = {
        "clients": CLIENTS,
        "seconds": SECONDS,
        "operations": stats["ops"],
        "MB moved": round(stats["bytes"] / 1e6),
        "errors": len(stats["errors"]),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
        "server_rss_after_warmup_MiB": round(warm / MiB),
        "server_peak_rss_MiB": round(peak / MiB),
    }
    print(f"\nsoak: {report}")
    assert stats["errors"] == [], stats["errors"][:5]
    assert sum(stats["ops"].values()) > CLIENTS  # every client did work
    assert list((data_dir / "tmp").iterdir()) == []
    await asyncio.sleep(0.5)
    assert process.num_fds() <= fds_before + 8  # connections closed, readers and writers closed
    assert peak < 400 * MiB  # bounded by buffers per transfer, whatever was moved
