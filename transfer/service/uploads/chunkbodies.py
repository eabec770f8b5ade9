"""Bodies of chunked deduplicating uploads cut into their chunks as they arrive, and hashed a batch at a time (one
thread hop per batch, not per chunk): a run of chunks (:func:`cut_run`), a whole file (:func:`_whole_chunks`), and
the batches read on ahead while the last one is hashed and written (:func:`_received_ahead`)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, TypeVar

from transfer.core.uploads.chunking import Chunk, Manifest
from transfer.errors import ContentLengthMismatch

_T = TypeVar("_T")
HASH_BATCH = 4 << 20  # bytes of arrived chunks hashed in one thread hop


async def cut_run(
    body: AsyncIterator[bytes], run: list[Chunk], positions: list[int], total: int
) -> AsyncIterator[list[tuple[Chunk, bytes]]]:
    """The chunks of ``run`` cut from ``body``, a batch of about HASH_BATCH bytes at a time (one thread hop hashes
    a batch); ContentLengthMismatch when the body ends early or runs on."""
    buffer = bytearray()
    pieces = body.__aiter__()
    batch: list[tuple[Chunk, bytes]] = []
    batched = 0
    for chunk, at in zip(run, positions, strict=True):
        while len(buffer) < chunk.length:
            try:
                piece = await pieces.__anext__()
            except StopAsyncIteration:
                if batch:
                    yield batch
                raise ContentLengthMismatch(f"the body ended inside chunk {at}; {total} bytes were due") from None
            buffer += piece
        batch.append((chunk, bytes(buffer[: chunk.length])))
        del buffer[: chunk.length]
        batched += chunk.length
        if batched >= HASH_BATCH:
            yield batch
            batch, batched = [], 0
    if batch:
        yield batch
    if buffer:
        raise ContentLengthMismatch(f"the body is longer than the {total} bytes of its chunks")
    async for piece in pieces:
        if piece:
            raise ContentLengthMismatch(f"the body is longer than the {total} bytes of its chunks")


def _check_batch(view: memoryview, chunks: list[Chunk], sha: Any | None) -> tuple[Chunk, str] | None:
    """Hash each of ``chunks`` (back to back in ``view``) and feed ``view`` to the whole-file ``sha`` (if any); the
    first chunk that does not hash to its name, with its digest (None: all do). Runs off the event loop."""
    at = 0
    for chunk in chunks:
        digest = hashlib.sha256(view[at : at + chunk.length]).hexdigest()
        if digest != chunk.sha256:
            return chunk, digest
        at += chunk.length
    if sha is not None:
        sha.update(view)
    return None


FILE_BATCH = 2 << 20  # bytes of whole chunks checked per thread hop of a whole-file body (put_file)


async def _whole_chunks(body: AsyncIterator[bytes], manifest: Manifest) -> AsyncIterator[tuple[memoryview, int, int]]:
    """``body`` coalesced into batches of whole chunks of about FILE_BATCH bytes: (bytes, first chunk, chunk
    count); ContentLengthMismatch when the body is longer or shorter than the manifest's file."""
    chunks = manifest.chunks
    pending: list[bytes] = []
    pending_len = received = k = 0
    last = False
    async for piece in body:
        if not piece:
            continue
        received += len(piece)
        if received > manifest.size:
            raise ContentLengthMismatch(f"the body is longer than the {manifest.size} bytes of the file")
        pending.append(piece)
        pending_len += len(piece)
        last = received == manifest.size
        if pending_len < FILE_BATCH and not last:
            continue
        first, size = k, 0
        while k < len(chunks) and size + chunks[k].length <= pending_len:
            size += chunks[k].length
            k += 1
        if not size:
            continue
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending = [data[size:]] if size < len(data) else []
        pending_len -= size
        yield memoryview(data)[:size], first, k - first
    if received != manifest.size or k != len(chunks):
        raise ContentLengthMismatch(f"the body ended after {received} bytes; the file is {manifest.size}")


async def _received_ahead(batches: AsyncIterator[_T], depth: int = 2) -> AsyncGenerator[_T, None]:
    """``batches`` as they come, the body read on by a task while the caller works on the last one (``depth``
    batches ahead at most): the socket keeps receiving while a batch is hashed and written."""
    queue: asyncio.Queue[tuple[bool, Any]] = asyncio.Queue(maxsize=depth)

    async def produce() -> None:
        try:
            async for batch in batches:
                await queue.put((True, batch))
        except asyncio.CancelledError:  # the consumer has gone (it cancels us): nobody would take an item
            raise
        except BaseException as exc:  # handed to the consumer, raised there as itself
            await queue.put((False, exc))
            return
        await queue.put((False, None))

    task = asyncio.create_task(produce())
    try:
        while True:
            ok, item = await queue.get()
            if not ok:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
