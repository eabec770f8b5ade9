"""Hashing bytes the service has or receives, written once: :class:`PieceHasher` (several digests of one stream,
off the event loop where that pays) and :func:`read_back` (read stored bytes back and hash them: a completion that
must vouch for the whole file, a staged object, a chunk a reader asks for, a manifest checked against a file).

CPU work follows one rule (:func:`transfer.service.cpus.hashed`): pieces of ``OFFLOAD_BYTES`` or more are hashed in a
worker thread (hashlib and xxhash release the GIL), smaller ones inline; on a single CPU, pieces up to
:data:`~transfer.service.cpus.LOOP_HASH_MAX` stay on the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from transfer.service import cpus

OFFLOAD_BYTES = 64 << 10  # pieces at least this long are hashed in a thread (below, the hop costs more than it saves)


class Digest(Protocol):
    """What a hash object offers (hashlib's, xxhash's): bytes in, in order."""

    def update(self, data: bytes, /) -> None:
        """Feed ``data`` to the digest (after everything fed before)."""


class PieceHasher:
    """Several digests of one stream of pieces, updated together: in a thread for pieces of ``OFFLOAD_BYTES`` or
    more (the digests release the GIL), inline for smaller ones and, on a single CPU, for pieces up to
    :data:`~transfer.service.cpus.LOOP_HASH_MAX`. Pieces must be fed in order, one at a time."""

    def __init__(self, *digests: Digest | None) -> None:
        self._digests = [d for d in digests if d is not None]

    def _update(self, piece: bytes) -> None:
        for digest in self._digests:
            digest.update(piece)

    async def update(self, piece: bytes) -> None:
        """Feed one piece to every digest (in a thread when it is large)."""
        await cpus.hashed(self._update, len(piece), piece, at_most=OFFLOAD_BYTES - 1)


@dataclass(frozen=True, slots=True)
class ReadBack:
    """What :func:`read_back` read: how many bytes, and the first of them (up to the ``head`` asked for)."""

    size: int
    head: bytes


async def read_back(pieces: AsyncIterable[bytes], *digests: Digest | None, head: int = 0) -> ReadBack:
    """Feed every piece of ``pieces`` to every digest, in order; keep the first ``head`` bytes (a file's media type is
    sniffed from them)."""
    hasher = PieceHasher(*digests)
    first = bytearray()
    size = 0
    async for piece in pieces:
        size += len(piece)
        if len(first) < head:
            first += piece[: head - len(first)]
        await hasher.update(piece)
    return ReadBack(size, bytes(first))


async def ranges_ahead(
    fetch: Callable[[int, int], Coroutine[Any, Any, bytes]], size: int, *, window: int, ahead: int
) -> AsyncIterator[bytes]:
    """The bytes ``[0, size)`` in order, fetched ``window`` bytes at a time by ``fetch(start, end)`` with up to
    ``ahead`` fetches in flight (ranged GETs of a bucket: latency hidden while the caller hashes); what is still in
    flight is cancelled when the caller stops early. Memory: ``ahead`` windows."""
    windows = [(start, min(start + window, size)) for start in range(0, size, window)]
    pending: list[asyncio.Task[bytes]] = []
    try:
        for i in range(len(windows)):
            while len(pending) < ahead and i + len(pending) < len(windows):
                pending.append(asyncio.create_task(fetch(*windows[i + len(pending)])))
            yield await pending.pop(0)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
