"""A file's chunks: cut by content (FastCDC, with the service's parameters), each hashed with SHA-256 (the whole
file, or only its head for a probe); grouped into runs of consecutive chunks, one request each, run together."""

from __future__ import annotations

import asyncio
import hashlib
import mmap
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pyfastcdc import FastCDC

from transfer.core.uploads.chunking import CHUNKING, Chunk, Manifest

CUT_HASH_BATCH = 8 << 20  # bytes of chunks hashed per task while the file is cut


PROBE_BYTES = 4 << 20  # the head of a file whose chunks are probed before the rest is cut (about 64 chunks)


UNHASHED = "-"  # cut_file's whole_sha256 when the caller knows it another way


def _chunker(chunking: dict[str, Any] | None) -> FastCDC:
    params = chunking or CHUNKING
    return FastCDC(
        avg_size=int(params["avg_size"]),
        min_size=int(params["min_size"]),
        max_size=int(params["max_size"]),
        normalized_chunking=int(params.get("normalized_chunking", 1)),  # type: ignore[arg-type]
        seed=int(params.get("seed", 0)),
    )


def cut_file(
    path: str | os.PathLike[str], chunking: dict[str, Any] | None = None, *, whole_sha256: str | None = None
) -> Manifest:
    """The manifest of the file at ``path``: FastCDC chunks with the service's parameters, each SHA-256 hashed, and
    the whole file's SHA-256 (``whole_sha256``: taken as given, not computed; the service checks a manifest
    against the bytes it stores). Runs in the calling thread (CPU and file reads: call it off the event loop); the
    chunk hashes and the whole-file hash run on two helper threads while the cutter finds the next boundaries
    (all three release the GIL), so on two free cores the cut costs about one SHA-256 pass of wall time."""
    cdc = _chunker(chunking)
    if os.path.getsize(path) == 0:
        return Manifest(size=0, sha256=hashlib.sha256().hexdigest(), chunks=())
    with open(path, "rb") as f, _mapped(f.fileno()) as mapped:
        view = memoryview(mapped)
        try:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="cut") as pool:
                whole = pool.submit(lambda: whole_sha256 or hashlib.sha256(view).hexdigest())
                bounds: list[tuple[int, int]] = []
                batches: list[Future[list[str]]] = []
                first = 0  # the first chunk of the batch not yet handed to a hasher
                for piece in cdc.cut_buf(view):
                    bounds.append((piece.offset, piece.length))
                    del piece  # a view of the mapping: let it go
                    if piece_end(bounds[-1]) - bounds[first][0] >= CUT_HASH_BATCH:
                        batches.append(pool.submit(_hash_spans, view, bounds[first:]))
                        first = len(bounds)
                if first < len(bounds):
                    batches.append(pool.submit(_hash_spans, view, bounds[first:]))
                digests = [sha for batch in batches for sha in batch.result()]
                sha = whole.result()
        finally:
            view.release()
    chunks = tuple(Chunk(offset, length, d) for (offset, length), d in zip(bounds, digests, strict=True))
    return Manifest(size=piece_end(bounds[-1]), sha256=sha, chunks=chunks)


def cut_head(
    path: str | os.PathLike[str], chunking: dict[str, Any] | None = None, limit: int = PROBE_BYTES
) -> list[Chunk]:
    """The chunks of the first ``limit`` bytes of the file at ``path``, hashed, as a cut of the whole file finds
    them: the last chunk of a prefix that ends before the file does is left out (its end is the prefix's, not a
    boundary of the file)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(min(limit, size))
    view = memoryview(data)
    spans = [(piece.offset, piece.length) for piece in _chunker(chunking).cut_buf(view)]
    if len(data) < size and spans:
        spans.pop()
    return [Chunk(offset, length, sha) for (offset, length), sha in zip(spans, _hash_spans(view, spans), strict=True)]


def _mapped(fd: int) -> mmap.mmap:
    """The file read-only in memory, its pages faulted in by the kernel at once where it can (MAP_POPULATE: one
    call instead of a fault per page as the cutter walks it)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if populate and hasattr(mmap, "MAP_SHARED"):
        return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def piece_end(bound: tuple[int, int]) -> int:
    return bound[0] + bound[1]


def _hash_spans(view: memoryview, spans: list[tuple[int, int]]) -> list[str]:
    return [hashlib.sha256(view[offset : offset + length]).hexdigest() for offset, length in spans]


def runs(indexes: list[int], chunks: tuple[Chunk, ...], limit: int) -> list[tuple[int, int]]:
    """Consecutive indexes grouped into ``(first, count)`` runs of at most ``limit`` bytes each (a chunk larger
    than the limit is a run of its own)."""
    out: list[tuple[int, int]] = []
    first, count, size = -1, 0, 0
    for i in sorted(indexes):
        length = chunks[i].length
        if count and i == first + count and size + length <= limit:
            count += 1
            size += length
            continue
        if count:
            out.append((first, count))
        first, count, size = i, 1, length
    if count:
        out.append((first, count))
    return out


async def _all(jobs: list[Callable[[], Awaitable[None]]]) -> None:
    """Run ``jobs`` together; the first failure is raised as itself (the others are cancelled)."""
    try:
        async with asyncio.TaskGroup() as tg:
            for job in jobs:
                tg.create_task(job())  # type: ignore[arg-type]
    except BaseExceptionGroup as group:
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
