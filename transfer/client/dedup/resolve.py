"""Resolving with a cache: the chunks the cache holds are copied into place, only the ranges of the others are
fetched, and the whole file is verified before it is renamed and its new chunks kept."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx

from transfer.client.dedup.cache import ChunkCache
from transfer.client.dedup.cutting import _all, runs
from transfer.client.integrity import verify_bytes
from transfer.client.resolver import raise_for_error
from transfer.core.model.content import ContentEncoding, DownloadMethod, FileContent, TransferMode, load_descriptor
from transfer.core.uploads.chunking import Chunk, Manifest, parse_manifest
from transfer.errors import ChecksumMismatch, InvalidDescriptor, RemoteError, TransferError

_T = TypeVar("_T")


FETCH_RUN_BYTES = 8 << 20  # bytes of consecutive missing chunks fetched in one ranged GET


PLACERS = 4  # threads placing cached chunks into a file being resolved


@dataclass(frozen=True, slots=True)
class CachedResolve:
    path: Path
    fetched_bytes: int  # bytes fetched from the service
    cached_bytes: int  # bytes taken from the cache


def manifest_url(descriptor: FileContent) -> str | None:
    """Where this service gives the manifest of a url-mode descriptor's file: its content URL with ``/manifest``
    for ``/content``, under the same signature; None for any other URL."""
    if descriptor.url is None:
        return None
    parts = urlsplit(descriptor.url)
    if not parts.path.endswith("/content"):
        return None
    return urlunsplit(parts._replace(path=parts.path[: -len("/content")] + "/manifest"))


async def fetch_manifest(http: httpx.AsyncClient, descriptor: FileContent) -> Manifest | None:
    url = manifest_url(descriptor)
    if url is None:
        return None
    try:
        response = await http.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        manifest = parse_manifest(response.json())
    except (ValueError, TransferError):
        return None
    if descriptor.checksum != "sha256:" + manifest.sha256 or descriptor.size != manifest.size:
        return None
    return manifest


async def resolve_with_cache(
    http: httpx.AsyncClient,
    descriptor: FileContent | dict[str, Any] | str,
    dest: str | os.PathLike[str],
    cache: ChunkCache,
    *,
    connections: int = 4,
    fallback: Callable[[FileContent, Path], Any] | None = None,
) -> CachedResolve:
    """Resolve ``descriptor`` into ``dest`` using and filling ``cache`` (module text). A descriptor without a
    manifest (another service, an encoded file, inline content) is resolved by ``fallback`` (the ordinary
    resolver), and its chunks are kept afterwards."""
    if not isinstance(descriptor, FileContent):
        loaded = load_descriptor(descriptor)
        if not isinstance(loaded, FileContent):
            raise InvalidDescriptor("only a FileContent resolves through a chunk cache")
        descriptor = loaded
    dest = Path(dest)
    plain = descriptor.type is TransferMode.URL and descriptor.encoding in (None, ContentEncoding.NONE)
    manifest = await fetch_manifest(http, descriptor) if plain else None
    if manifest is None:
        if fallback is None:
            raise InvalidDescriptor("the service gives no chunk manifest for this descriptor")
        await fallback(descriptor, dest)
        await asyncio.to_thread(cache.keep_file, dest)
        await asyncio.to_thread(cache.trim)
        return CachedResolve(dest, descriptor.size or 0, 0)
    assert descriptor.url is not None
    method = "POST" if descriptor.download_method is DownloadMethod.POST else "GET"
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.parent / f".{dest.name}.{secrets.token_hex(6)}.part"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    cached_bytes = fetched_bytes = 0
    threads: list[asyncio.Future[Any]] = []  # every thread job on ``fd``: all ended before it closes

    async def on_thread(fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on a thread, which runs on to its end whatever happens to the caller (see ``threads``)."""
        job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        threads.append(job)
        return await asyncio.shield(job)

    try:
        os.ftruncate(fd, manifest.size)
        # the chunks the cache holds are placed on a few threads while the others are fetched: a thread hop per
        # chunk, one after the other, cost more than the bytes (3,300 chunks of a 256 MiB file: 1.2 s of waiting)
        held = await asyncio.to_thread(cache.holds, [c.sha256 for c in manifest.chunks])
        lacking = [i for i, chunk in enumerate(manifest.chunks) if chunk.sha256 not in held]
        gate = asyncio.Semaphore(max(1, connections))

        async def fetch(first: int, count: int) -> None:
            nonlocal fetched_bytes
            chunks = manifest.chunks[first : first + count]
            start, end = chunks[0].offset, chunks[-1].offset + chunks[-1].length
            async with gate:
                response = await http.request(
                    method,
                    descriptor.url or "",
                    headers={"range": f"bytes={start}-{end - 1}", "accept-encoding": "identity"},
                )
            await raise_for_error(response)
            body = response.content
            if response.status_code != 206 or len(body) != end - start:
                raise RemoteError(f"the service did not answer the range {start}-{end - 1} of the file")
            await on_thread(_place_fetched, cache, fd, chunks, body, start)
            fetched_bytes += len(body)

        async def fetch_all(indexes: list[int]) -> None:
            ranges = runs(indexes, manifest.chunks, FETCH_RUN_BYTES)
            await _all([partial(fetch, first, count) for first, count in ranges])

        cached = [c for c in manifest.chunks if c.sha256 in held]
        placers = [  # a few threads: opening and reading thousands of small files
            asyncio.ensure_future(on_thread(_place_cached, cache, fd, cached[k::PLACERS])) for k in range(PLACERS)
        ]
        try:
            await fetch_all(lacking)
        finally:
            await asyncio.wait(placers)
            for placer in placers:
                if not placer.cancelled():
                    placer.exception()  # retrieved: raised below, or behind the fetch's own error
        outcomes = [placer.result() for placer in placers]
        placed = [chunk for done, _ in outcomes for chunk in done]
        gone = [sha for _, lost in outcomes for sha in lost]

        async def refetch(lost: set[str]) -> None:
            await fetch_all([i for i, chunk in enumerate(manifest.chunks) if chunk.sha256 in lost])

        if gone:  # evicted by another resolver sharing the cache meanwhile: fetched after all
            await refetch(set(gone))
        sha = await on_thread(_hash_fd, fd)
        if descriptor.checksum != "sha256:" + sha and placed:  # a cached chunk was damaged on disk: which one?
            damaged = set(await on_thread(_damaged_placed, cache, fd, placed))
            if damaged:
                await refetch(damaged)
                placed = [c for c in placed if c.sha256 not in damaged]
                sha = await on_thread(_hash_fd, fd)
        cached_bytes = sum(c.length for c in placed)
        verify_bytes(descriptor, sha, manifest.size)
        os.replace(part, dest)
    finally:
        if threads:  # a fetch cancelled beside a failed one, or this resolve cancelled: its thread writes on
            await asyncio.wait(threads)
            for job in threads:
                if not job.cancelled():
                    job.exception()  # retrieved: raised already, or behind the error that ended the resolve
        os.close(fd)
        part.unlink(missing_ok=True)
    await asyncio.to_thread(cache.trim)
    return CachedResolve(dest, fetched_bytes, cached_bytes)


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _place_cached(cache: ChunkCache, fd: int, chunks: list[Chunk]) -> tuple[list[Chunk], list[str]]:
    """Write each of ``chunks`` from the cache at its offset of ``fd`` (blocking), unhashed: the whole file's
    SHA-256 checks them all, and :func:`_damaged_placed` finds the culprit on a mismatch. Returns the chunks placed
    and the hashes of those the cache no longer holds."""
    placed: list[Chunk] = []
    gone: list[str] = []
    for chunk in chunks:
        data = cache.read(chunk.sha256, chunk.length)
        if data is None:
            gone.append(chunk.sha256)
            continue
        _pwrite_all(fd, data, chunk.offset)
        placed.append(chunk)
    return placed, gone


def _damaged_placed(cache: ChunkCache, fd: int, placed: list[Chunk]) -> list[str]:
    """After a whole-file mismatch: the placed chunks whose bytes are not their name, removed from the cache."""
    damaged = set()
    for chunk in placed:
        if chunk.sha256 not in damaged:
            if hashlib.sha256(os.pread(fd, chunk.length, chunk.offset)).hexdigest() != chunk.sha256:
                damaged.add(chunk.sha256)
                cache.path(chunk.sha256).unlink(missing_ok=True)
    return sorted(damaged)


def _place_fetched(cache: ChunkCache, fd: int, chunks: tuple[Chunk, ...], body: bytes, start: int) -> None:
    """Check each chunk of a fetched range against its name, write it at its offset and keep it (blocking)."""
    view = memoryview(body)
    for chunk in chunks:
        piece = view[chunk.offset - start : chunk.offset - start + chunk.length]
        if hashlib.sha256(piece).hexdigest() != chunk.sha256:
            raise ChecksumMismatch(f"the chunk at offset {chunk.offset} is not the manifest's")
        _pwrite_all(fd, piece, chunk.offset)
        cache.put(chunk.sha256, piece)


def _hash_fd(fd: int) -> str:
    sha = hashlib.sha256()
    at = 0
    while piece := os.pread(fd, 1 << 20, at):
        sha.update(piece)
        at += len(piece)
    return sha.hexdigest()
