"""Assembling a chunked upload's file from its key's chunk store: the manifest as runs of packs, read in order
(one streamed read per run), hashed on the way; a run of chunks lying back to back in one pack (the old version's
object, for most of a new version) is copied into the new object server-side where the writer's rules allow. A chunk
that is gone or damaged is forgotten and reported missing (409 ``chunks_missing``), so the client sends it again."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable

from storage.base import Capability, CopiesRanges, ObjectReader
from storage.errors import ObjectChanged, ObjectNotFound
from transfer.core.uploads.chunking import Manifest
from transfer.errors import ChunksMissing, NotFound, storage_errors_translated
from transfer.service import cpus
from transfer.service.files.publisher import SNIFF_BYTES
from transfer.service.files.records import FileRecord, object_key
from transfer.service.uploads.chunkbodies import _received_ahead
from transfer.service.uploads.chunkstore import ChunkStore, _sha_hex, key_folder, pack_key, require_checksum

SEGMENT_BYTES = 4 << 20  # bytes of a pack hashed at once while assembling (memory: three of them)
# (sha256 hex, first bytes, how to place the file) -> the published file
Publish = Callable[[str, bytes, Callable[[FileRecord], Awaitable[None]]], Awaitable[FileRecord]]


async def plan_runs(store: ChunkStore, owner: str | None, manifest: Manifest) -> list[tuple[str, int, int]]:
    """The manifest as ranges of packs, in order, consecutive chunks of one pack merged into one range:
    (pack, start, end). ChunksMissing names every chunk the index lacks."""
    where = await store.locate(owner, manifest.distinct())
    missing = [i for i, c in enumerate(manifest.chunks) if c.sha256 not in where]
    if missing:
        raise ChunksMissing(f"{len(missing)} chunk(s) are not stored; send them and complete again", missing=missing)
    out: list[tuple[str, int, int]] = []
    for chunk in manifest.chunks:
        at = where[chunk.sha256]
        if at.length != chunk.length:
            await store.index_drop(key_folder(owner), [chunk.sha256])
            raise ChunksMissing("a stored chunk has another length than its name says", missing=[0])
        if out and out[-1][0] == at.pack and out[-1][2] == at.offset:
            out[-1] = (at.pack, out[-1][1], at.offset + at.length)
        else:
            out.append((at.pack, at.offset, at.offset + at.length))
    return out


async def chunks_in_order(
    store: ChunkStore, owner: str | None, manifest: Manifest
) -> AsyncGenerator[tuple[tuple[str, int, int], ObjectReader, int, bytes], None]:
    """The bytes of the file ``manifest`` describes, as (run, the reader of its pack, offset in the pack, bytes
    of at most :data:`SEGMENT_BYTES`): each run of :meth:`_runs` read by one streamed read (one GET on S3,
    whatever its length: a request per segment costs a store like Swift more than the bytes), read on by a
    task while the caller hashes the last batch. A pack that is gone or shorter than the run (lost in a
    crash) has its entries dropped and its chunks reported missing."""
    runs = await plan_runs(store, owner, manifest)
    readers: dict[str, ObjectReader] = {}

    async def batches() -> AsyncIterator[tuple[tuple[str, int, int], ObjectReader, int, bytes]]:
        for run in runs:
            pack, start, end = run
            at, pieces, gathered = start, [], 0
            with storage_errors_translated():
                reader = readers.get(pack)
                if reader is None:
                    try:
                        reader = readers[pack] = await store.storage.open(pack_key(owner, pack))
                    except ObjectNotFound:
                        reader = None
                if reader is None or reader.info.size < end:  # gone, or shorter than its index says
                    await drop_pack_entries(store, owner, manifest, pack)
                    raise ChunksMissing(
                        "a pack of stored chunks was damaged; send them and complete again", missing=[0]
                    )
                # any other failure (a read timed out) is the store's, not damage: 503, the pack kept
                async for piece in reader.read(start, end):
                    pieces.append(piece)
                    gathered += len(piece)
                    if gathered >= SEGMENT_BYTES or at + gathered >= end:
                        yield run, reader, at, b"".join(pieces)
                        at, pieces, gathered = at + gathered, [], 0

    try:
        async with contextlib.aclosing(_received_ahead(batches(), depth=1)) as ahead:  # its task ends first
            async for batch in ahead:
                yield batch
    finally:
        for reader in readers.values():
            await reader.close()


async def drop_pack_entries(store: ChunkStore, owner: str | None, manifest: Manifest, pack: str) -> None:
    """Forget the chunks of ``manifest`` that ``pack`` held (it is gone or damaged)."""
    where = await store.locate(owner, manifest.distinct())
    await store.index_drop(key_folder(owner), [sha for sha, at in where.items() if at.pack == pack])


async def drop_damaged(store: ChunkStore, owner: str | None, manifest: Manifest) -> None:
    """After a whole-file mismatch: re-hash each distinct chunk; one whose bytes are not its name (lost in a
    crash) is forgotten and reported missing, so the client sends it again. None: the manifest itself lies."""
    where = await store.locate(owner, manifest.distinct())
    damaged: list[int] = []
    bad: list[str] = []
    seen: set[str] = set()
    for i, chunk in enumerate(manifest.chunks):
        if chunk.sha256 in seen:
            continue
        seen.add(chunk.sha256)
        at = where.get(chunk.sha256)
        data = b""
        if at is not None:
            try:
                with storage_errors_translated():
                    async with await store.storage.open(pack_key(owner, at.pack)) as reader:
                        data = b"".join([p async for p in reader.read(at.offset, at.offset + at.length)])
            except NotFound:
                pass
        if await cpus.hashed(_sha_hex, len(data), data) != chunk.sha256:
            bad.append(chunk.sha256)
            damaged.append(i)
    if damaged:
        await store.index_drop(key_folder(owner), bad)
        raise ChunksMissing(
            f"{len(damaged)} stored chunk(s) were damaged and removed; send them and complete again",
            missing=damaged[:10_000],
        )


async def assemble(
    store: ChunkStore, owner: str | None, manifest: Manifest, file_id: str, publish: Publish
) -> FileRecord:
    """Assemble ``owner``'s file ``manifest`` describes into the new object of ``file_id``, hashed on the way, and
    hand it to ``publish(sha256, head, place)`` (the upload's door builds its candidate) only if it matches. Every byte
    is read (the whole-file SHA-256 needs them all); where the backend's writers copy ranges server-side (COPY_RANGE:
    local ``copy_file_range``, S3 ``UploadPartCopy``), a run of chunks lying back to back in one pack is copied instead
    of written, as far as the writer's rules allow (:meth:`~storage.base.CopiesRanges.copy_lead`)."""
    sha = hashlib.sha256()
    head = b""
    copied: set[str] = set()  # the packs ranges were copied from
    key = object_key(file_id)
    with storage_errors_translated():
        try:
            # the readers close after the writer has ended (a local copy reads from their descriptors)
            async with contextlib.aclosing(chunks_in_order(store, owner, manifest)) as batches:
                async with store.storage.create(key, size_hint=manifest.size) as writer:
                    copier = (
                        writer
                        if Capability.COPY_RANGE in store.storage.capabilities and isinstance(writer, CopiesRanges)
                        else None
                    )
                    copy_from = 0  # where the copy of the current run starts: its bytes from there are not written
                    async for (pack, start, end), reader, at, data in batches:
                        if len(head) < SNIFF_BYTES:
                            head += data[: SNIFF_BYTES - len(head)]
                        if at == start:  # the first bytes of a run: how much of it can be copied
                            lead = None if copier is None else copier.copy_lead(end - start)
                            copy_from = end if lead is None else start + lead
                        written = data[: max(0, copy_from - at)]
                        if written:
                            await writer.write(written)
                        if copier is not None and at <= copy_from < at + len(data):
                            # the lead is written; the pack is known to hold the whole run (its size was
                            # checked when it was opened), so the copy starts now, while the run is read
                            await copier.copy_range(reader, copy_from, end)  # in the background on S3
                            copied.add(pack)
                        # a chunk of the usual size stays on the loop: less than the thread hop
                        await cpus.hashed(sha.update, len(data), data, at_most=(1 << 20) - 1)
                    digest = sha.hexdigest()
                    if digest != manifest.sha256:
                        await drop_damaged(store, owner, manifest)
                    require_checksum(manifest, digest)

                    async def place(record: FileRecord) -> None:
                        await writer.commit(record.to_metadata())

                    return await publish(digest, head, place)
        except ObjectChanged as exc:  # a pack a range was copied from went after it was read (S3)
            await drop_gone_packs(store, owner, manifest, copied)
            raise ChunksMissing(
                "a file whose chunks this one shares was deleted while it was assembled; send them and complete again",
                missing=[0],
            ) from exc


async def drop_gone_packs(store: ChunkStore, owner: str | None, manifest: Manifest, packs: Iterable[str]) -> None:
    """Forget the chunks of ``manifest`` that those of ``packs`` that are gone held (deleted during an assembly)."""
    for pack in packs:
        try:
            await store.storage.stat(pack_key(owner, pack))
        except ObjectNotFound:
            await drop_pack_entries(store, owner, manifest, pack)
