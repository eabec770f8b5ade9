"""The resolver's chunk cache with a size limit: the least recently used chunks go first (a hit marks a chunk used),
the cache never holds more than its limit after a resolve, and a resolve through a limited cache is verified as
any (real server on loopback for the resolve; the CLI's ``--cache-size``)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer
from tests.uploads.test_chunked_dedup import upload
from transfer.client.dedup import ChunkCache, resolve_with_cache

pytestmark = pytest.mark.anyio
MiB = 1 << 20


def stored(cache: ChunkCache) -> set[str]:
    return {p.name for p in cache.directory.glob("??/*")}


def cache_bytes(cache: ChunkCache) -> int:
    return sum(p.stat().st_size for p in cache.directory.glob("??/*"))


def test_the_least_recently_used_chunks_are_evicted_first(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path / "cache", max_bytes=3 * 1000)
    chunks = [os.urandom(1000) for _ in range(4)]
    shas = [hashlib.sha256(c).hexdigest() for c in chunks]
    for i, (sha, data) in enumerate(zip(shas[:3], chunks[:3], strict=True)):
        cache.put(sha, data)
        os.utime(cache.path(sha), ns=(10**18 + i, 10**18 + i))  # stored in this order, long ago
    assert cache.trim() == 0  # at the limit, not over it
    assert cache.get(shas[0], 1000) == chunks[0]  # the oldest is used again: now the most recent
    cache.put(shas[3], chunks[3])
    assert cache.trim() == 1
    assert stored(cache) == {shas[0], shas[2], shas[3]}  # the second, least recently used, went
    assert ChunkCache(tmp_path / "cache").trim() == 0  # no limit: nothing goes
    assert ChunkCache(tmp_path / "cache", max_bytes=0).trim() == 3
    with pytest.raises(ValueError):
        ChunkCache(tmp_path / "cache", max_bytes=-1)


async def test_a_resolve_leaves_the_cache_within_its_limit(server: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    (tmp_path / "f.bin").write_bytes(data)
    descriptor = (await upload(server, tmp_path / "f.bin")).descriptor
    cache = ChunkCache(tmp_path / "cache", max_bytes=MiB)
    async with httpx.AsyncClient(timeout=60) as http:
        cold = await resolve_with_cache(http, descriptor, tmp_path / "out.bin", cache)
        assert (tmp_path / "out.bin").read_bytes() == data and cold.fetched_bytes == len(data)
        assert 0 < cache_bytes(cache) <= MiB
        warm = await resolve_with_cache(http, descriptor, tmp_path / "again.bin", cache)
    assert (tmp_path / "again.bin").read_bytes() == data
    assert 0 < warm.cached_bytes <= MiB and warm.cached_bytes + warm.fetched_bytes == len(data)
    assert cache_bytes(cache) <= MiB


async def test_a_damaged_or_evicted_cached_chunk_is_fetched_and_the_file_comes_out_exact(
    server: LiveServer, tmp_path: Path
) -> None:
    """Cached chunks are placed unhashed (the whole file's SHA-256 checks them): one whose bytes on disk changed
    (same length) is found after the mismatch, removed and fetched; one removed meanwhile is fetched too."""
    data = os.urandom(3 * MiB)
    (tmp_path / "f.bin").write_bytes(data)
    descriptor = (await upload(server, tmp_path / "f.bin")).descriptor
    cache = ChunkCache(tmp_path / "cache")
    async with httpx.AsyncClient(timeout=60) as http:
        await resolve_with_cache(http, descriptor, tmp_path / "cold.bin", cache)
        files = sorted(cache.directory.glob("??/*"))
        damaged, evicted = files[0], files[1]
        damaged.write_bytes(bytes(b ^ 0xFF for b in damaged.read_bytes()))
        evicted_size = evicted.stat().st_size
        evicted.unlink()
        warm = await resolve_with_cache(http, descriptor, tmp_path / "warm.bin", cache)
    assert (tmp_path / "warm.bin").read_bytes() == data
    assert warm.fetched_bytes >= damaged.stat().st_size + evicted_size
    assert warm.cached_bytes + warm.fetched_bytes == len(data)
    assert hashlib.sha256(damaged.read_bytes()).hexdigest() == damaged.name  # fetched again, kept right
    assert evicted.exists()


def _resolve(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``transfer resolve d.json ARGS`` in ``cwd``, as a user types it."""
    return subprocess.run(
        [sys.executable, "-m", "transfer", "resolve", "d.json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_the_cli_takes_a_cache_size_only_with_a_cache(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text('{"type": "inline", "data": "aGk=", "encoding": "base64", "size": 2}')
    run = _resolve(tmp_path, "-o", "o.bin", "--cache-size", "1M")
    assert run.returncode != 0 and "--cache-size needs --cache" in run.stderr
    bad = _resolve(tmp_path, "--cache", "c", "--cache-size", "lots")
    assert bad.returncode == 2 and "not a size" in bad.stderr
