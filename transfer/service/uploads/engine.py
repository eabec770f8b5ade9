"""Parts of resumable uploads, written once for every door: how a part is stored and hashed, and the running
SHA-256 of an upload whose parts arrive in order (or are read back when they did not). The record of an upload,
and its whole life, are the upload lifecycle's (:mod:`transfer.service.uploads.lifecycle`).

- **Parts.** :meth:`UploadEngine.store_part` writes one part if-absent while hashing it; :meth:`write_part_at`
  writes one at its offset in a staged object.
- **Hashing.** Every digest of uploaded bytes goes through :class:`~transfer.service.hashing.PieceHasher`, which
  hands pieces above a small threshold to a thread (hashlib and xxhash release the GIL): CPU work never holds the
  event loop. :class:`PrefixHasher` is the running SHA-256 of the whole upload, following its parts in order.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import xxhash

from storage.base import RegionWriter, Storage
from storage.errors import ObjectExists, StorageError
from transfer.core.uploads.state import Part
from transfer.errors import NotFound, from_storage_error, storage_errors_translated
from transfer.service.hashing import Digest, PieceHasher

T = TypeVar("T")
HEAD_BYTES = 4096  # the start of an upload kept by its hasher (media type sniffing)
# bytes of a part gathered before one write at its offset and one hashing hop: every hop is a thread wake-up, and
# on a loaded core each wake-up waits for a time slice (a CPU hog beside a server that hopped per 64 KiB piece made
# chunked uploads 0.37x of one stream; see benchmarks/network.py)
REGION_BATCH = 4 << 20


class PrefixHasher:
    """The SHA-256 of an upload's bytes from its start to ``position``: fed live as parts arrive in order, or by
    re-reading stored parts (``catch_up``) when they arrived out of order or in another process."""

    def __init__(self) -> None:
        self.position = 0  # bytes hashed
        self.next_part = 0  # the address of the next part to hash (an index or an offset)
        self.sha = hashlib.sha256()
        self.head = bytearray()  # the first HEAD_BYTES: what the media type is sniffed from
        self.lock = asyncio.Lock()

    def staged(self) -> _Staged:
        """A copy to feed one part into: it becomes the hasher's state only if the part is kept."""
        return _Staged(self.sha.copy(), bytearray(self.head))

    def advance(self, staged: _Staged, size: int, next_part: int) -> None:
        """Adopt ``staged`` (fed one kept part of ``size`` bytes) as the running state."""
        self.sha, self.head = staged.sha, staged.head
        self.position += size
        self.next_part = next_part


class _Staged:
    """A running SHA-256 and the head bytes, fed one part's pieces."""

    def __init__(self, sha: Any, head: bytearray) -> None:
        self.sha = sha
        self.head = head

    def update(self, data: bytes, /) -> None:
        self.sha.update(data)
        if len(self.head) < HEAD_BYTES:
            self.head += data[: HEAD_BYTES - len(self.head)]


@dataclass(frozen=True, slots=True)
class StoredPart:
    """What :meth:`UploadEngine.store_part` wrote (``stored`` False: nothing was kept)."""

    size: int
    xxh3: str
    sha256: str
    stored: bool
    cut: BaseException | None = None  # the body ended with ``keep_partial``'s exception: what came was kept

    def part(self) -> Part:
        """The part as its upload record indexes it."""
        return Part(self.size, self.xxh3, self.sha256)


class PartExists(Exception):
    """A part's key was taken when it was published (another writer, or a part stored by a process that stopped
    before its record said so); carries what this writer received."""

    def __init__(self, result: StoredPart) -> None:
        super().__init__("part exists")
        self.result = result


class UploadEngine:
    """Parts and running hashers of every upload of one process over one storage backend."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.hashers: dict[str, PrefixHasher] = {}

    # -- parts ---------------------------------------------------------------------------------------------------

    async def store_part(
        self,
        key: str,
        body: AsyncIterator[bytes],
        *,
        limit: int,
        too_long: Callable[[int], Exception],
        size_hint: int | None,
        sha256: bool = False,
        extra: Digest | None = None,
        live: _Staged | None = None,
        durable: bool = True,
        verify: Callable[[StoredPart], None] | None = None,
        keep_partial: type[Exception] | None = None,
    ) -> StoredPart:
        """Write one part if-absent at ``key`` from ``body`` (at most ``limit`` bytes, else ``too_long(n)``),
        hashing it with xxh3-128 (and SHA-256 with ``sha256``; ``extra`` and ``live`` too: a running hash staged
        with :meth:`PrefixHasher.staged`, which the caller advances if the part is kept);
        ``verify`` may refuse the result before it is published (nothing is then kept). When the body raises
        ``keep_partial``, the bytes received so far are still published and the result carries the exception
        in ``cut`` (the caller records the part, then raises it). Raises PartExists when the key is taken,
        storage errors translated. The part's digests go
        into its object's metadata too, so a part whose record update was lost can be adopted later."""
        x3 = xxhash.xxh3_128()
        sha = hashlib.sha256() if sha256 else None
        hasher = PieceHasher(x3, sha, extra, live)
        size = 0
        cut: BaseException | None = None
        try:
            async with self.storage.create(key, size_hint=size_hint, if_absent=True, durable=durable) as writer:
                try:
                    async for piece in body:
                        size += len(piece)
                        if size > limit:
                            raise too_long(size)
                        await hasher.update(piece)
                        await writer.write(piece)
                except Exception as exc:
                    if keep_partial is None or not isinstance(exc, keep_partial):
                        raise
                    cut = exc
                result = StoredPart(size, x3.hexdigest(), sha.hexdigest() if sha is not None else "", False, cut)
                if verify is not None:
                    verify(result)
                if size:
                    try:
                        await writer.commit({"xxh3": result.xxh3, "sha256": result.sha256})
                    except ObjectExists:
                        raise PartExists(result) from None
                    result = StoredPart(result.size, result.xxh3, result.sha256, True, cut)
        except StorageError as exc:
            raise from_storage_error(exc) from exc
        return result

    async def write_part_at(
        self,
        region: RegionWriter,
        body: AsyncIterator[bytes],
        *,
        limit: int,
        too_long: Callable[[int], Exception],
        sha256: bool = False,
        verify: Callable[[StoredPart], None] | None = None,
    ) -> StoredPart:
        """Write one part from ``body`` into ``region`` (an entered :class:`storage.base.RegionWriter`: the part's
        place in a staged object), at most ``limit`` bytes (else ``too_long(n)``), hashing it with xxh3-128 (and
        SHA-256 with ``sha256``), then flush it to stable storage, unless ``verify`` refuses the result first. The
        bytes go straight to their offset; nothing is published (the caller records the part). Bytes written before
        a refusal or an error stay in the region: only a recorded part is ever read as the upload's."""
        x3 = xxhash.xxh3_128()
        sha = hashlib.sha256() if sha256 else None
        digests = [d for d in (x3, sha) if d is not None]
        batch = bytearray(REGION_BATCH)
        fill = size = 0

        def digest(view: memoryview) -> None:
            for d in digests:
                d.update(view)

        async def spill(data: bytes | memoryview) -> None:
            # the digests and the write of one batch run at once in two threads (both release the GIL)
            view = memoryview(data)
            await asyncio.gather(asyncio.to_thread(digest, view), region.write(view))

        try:
            async for piece in body:
                size += len(piece)
                if size > limit:
                    raise too_long(size)
                if fill + len(piece) > REGION_BATCH and fill:
                    await spill(memoryview(batch)[:fill])
                    fill = 0
                if len(piece) >= REGION_BATCH:
                    await spill(piece)
                else:
                    batch[fill : fill + len(piece)] = piece
                    fill += len(piece)
            if fill:
                await spill(memoryview(batch)[:fill])
            result = StoredPart(size, x3.hexdigest(), sha.hexdigest() if sha is not None else "", False)
            if verify is not None:
                verify(result)
            if size:
                await region.flush()  # a part is recorded only once its bytes would survive a crash
        except StorageError as exc:
            raise from_storage_error(exc) from exc
        return StoredPart(result.size, result.xxh3, result.sha256, bool(size))

    async def delete(self, keys: list[str]) -> None:
        """Delete ``keys`` (parts, records), storage errors translated."""
        with storage_errors_translated():
            for key in keys:
                await self.storage.delete(key)

    # -- hashing -------------------------------------------------------------------------------------------------

    def hasher(self, upload_id: str) -> PrefixHasher:
        """This process's running hasher of ``upload_id`` (made on first use)."""
        return self.hashers.setdefault(upload_id, PrefixHasher())

    def forget(self, upload_id: str) -> None:
        """The upload ended: drop what this process kept for it."""
        self.hashers.pop(upload_id, None)

    async def catch_up(
        self,
        upload_id: str,
        parts: list[tuple[int, str, Part]],
        *,
        by_offset: bool = False,
        read: Callable[[int, str, Part], AsyncIterator[bytes]] | None = None,
    ) -> PrefixHasher:
        """Advance ``upload_id``'s running SHA-256 over ``parts`` ((address, key, part) in order, contiguous from
        the start; addresses are byte offsets ``by_offset``, else indices), re-reading the ones it has not seen
        and checking each against its recorded xxh3-128. Stops at the first part that is missing or whose bytes
        are not what was acknowledged (that part is deleted: its upload reports it missing, and the client sends
        it again). ``read(address, key, part)``: where the parts' bytes are, when they are not objects of their
        own (parts written at offsets into one staged object); then a damaged part is only not hashed (its record
        says it is missing after the caller drops it) — nothing is deleted."""
        hasher = self.hasher(upload_id)
        async with hasher.lock:
            for address, key, part in parts:
                if address < hasher.next_part:
                    continue
                if address != hasher.next_part:
                    break
                check = xxhash.xxh3_128()
                staged = hasher.staged()
                digest = PieceHasher(check, staged)
                try:
                    with storage_errors_translated():
                        if read is not None:
                            async for piece in read(address, key, part):
                                await digest.update(piece)
                        else:
                            async with await self.storage.open(key) as reader:
                                async for piece in reader.read():
                                    await digest.update(piece)
                except NotFound:
                    break
                if part.xxh3 and check.hexdigest() != part.xxh3:
                    if read is None:
                        with storage_errors_translated():
                            await self.storage.delete(key)
                    break
                hasher.advance(staged, part.size, address + (part.size if by_offset else 1))
        return hasher
