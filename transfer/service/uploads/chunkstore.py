"""The per-key chunk store of chunked deduplicating uploads: where a key's content-defined chunks live, how they are
found, stored, read back, checked against files and swept. The door (:mod:`transfer.service.uploads.chunked`)
opens, completes and aborts uploads through the one upload lifecycle; this store is what it shares with the
resolvers and the usage repair.

    cdc/<key hash>/packs/<pack>        chunks of one upload's body, back to back (a published file's own object
                                       serves as the pack ``file:<file id>``)
    cdc/<key hash>/index/<shard>.json  sha256 -> [pack, offset, length, stored_at], INDEX_SHARDS records per key,
                                       changed by compare-and-set
    cdc/<key hash>/manifests/<file>    the manifest of a published file (for resolvers with a chunk cache)

Privacy: a key's chunks live under its own folder, ``cdc/<key hash>/chunks/<sha256>``; a lookup, a chunk upload
and an assembly only ever read that folder. So no answer (lacks, stored, missing, an error, a timing of a lookup that
finds something) can depend on what another key stores: a manifest naming another key's chunks is answered as if
nobody had them, and the upload completes only once the caller sent their bytes itself.

Quota: a stored chunk counts in its key's usage (``UsageLedger.count_bytes``, before it is stored; given back when
it was stored already) on top of the files assembled from it: a key pays for its file and for the chunks it keeps
for its next version. Chunks live while a live file's manifest or an open upload names them, and at least
:data:`CHUNK_GRACE` seconds after they were stored; :meth:`ChunkStore.sweep_chunks` removes the others (their
bytes leave the count exactly once: a removal claim) and the manifests of files that are gone.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from storage.base import Storage
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import new_id
from transfer.core.model.content import ContentEncoding
from transfer.core.uploads.chunking import CHUNKING, MAX_CHUNKS, SHA256_HEX, Chunk, Manifest, parse_manifest
from transfer.errors import (
    AccessDenied,
    ChecksumMismatch,
    ChunkChecksumMismatch,
    ContentLengthMismatch,
    InvalidManifest,
    ManifestSizeMismatch,
    ManifestTooLarge,
    NotFound,
    StorageUnavailable,
    TooLarge,
    TransferError,
    storage_errors_translated,
)
from transfer.service import cpus
from transfer.service.accounting.recordstore import RecordStore, read_record, write_record
from transfer.service.files.records import FileRecord, object_key
from transfer.service.files.service import FileService
from transfer.service.uploads.chunkbodies import _check_batch, _received_ahead, _whole_chunks, cut_run

log = logging.getLogger("transfer.chunks")
_T = TypeVar("_T")

PREFIX = "cdc/"
CHUNK_GRACE = 24 * 3600.0  # seconds a chunk no live file names stays (an upload that stopped may come back)
MAX_RUN_BYTES = 64 << 20  # bytes of one PUT of a run of chunks
HASH_BATCH = 4 << 20  # bytes of arrived chunks hashed in one thread hop
INDEX_SHARDS = 16  # index records per key (by the first hex digit of a chunk's SHA-256)
INDEX_CHECKS = 2  # batches of a stored file hashed at once while its manifest is checked (index_file)
INDEX_LATER_MAX = 8  # checks of index_file(later=True) waiting at once on one process; past it a caller waits
MAX_PROBE = 4096  # chunk hashes one probe may name (a client probes the first few MiB of a file)


def _sha_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_all(batch: list[tuple[Chunk, bytes]]) -> list[str]:
    return [_sha_hex(data) for _, data in batch]


def key_folder(owner: str | None) -> str:
    """``cdc/<key hash>/``: everything chunked uploads keep for one key (None: open mode)."""
    if owner is None:
        return PREFIX + "open/"
    return PREFIX + "k" + hashlib.sha256(owner.encode("utf-8")).hexdigest()[:40] + "/"


FILE_PACK = "file:"  # a "pack" that is a published file's own object (chunks indexed by ChunkService.put_file)


def pack_key(owner: str | None, pack: str) -> str:
    """Where the key ``owner`` keeps the pack ``pack``: chunks of one upload's body, back to back; for a pack named
    ``file:<file id>``, that file's own object (its chunks were stored once, as the file)."""
    if pack.startswith(FILE_PACK):
        return object_key(pack[len(FILE_PACK) :])
    return f"{key_folder(owner)}packs/{pack}"


def shard_of(sha: str) -> str:
    """The index shard that holds the chunk ``sha`` (one of INDEX_SHARDS)."""
    return f"{int(sha[:2], 16) % INDEX_SHARDS:02x}"


def index_key(owner: str | None, shard: str) -> str:
    """The index record ``shard`` of ``owner``'s chunks: sha256 -> [pack, offset, length, stored_at]."""
    return f"{key_folder(owner)}index/{shard}.json"


@dataclass(frozen=True, slots=True)
class Located:
    """Where a stored chunk's bytes are: a range of one pack."""

    pack: str
    offset: int
    length: int


def manifest_key(owner: str | None, file_id: str) -> str:
    """Where the manifest of ``owner``'s file ``file_id`` is kept, for resolvers with a chunk cache."""
    return f"{key_folder(owner)}manifests/{file_id}.json"


def require_checksum(manifest: Manifest, sha_hex: str) -> None:
    """ChecksumMismatch unless the chunks hash to the SHA-256 the manifest declares."""
    if sha_hex != manifest.sha256:
        raise ChecksumMismatch(
            "the chunks hash to another SHA-256 than the manifest declares; nothing was published",
            expected="sha256:" + manifest.sha256,
            actual="sha256:" + sha_hex,
        )


class ChunkStore:
    """Every key's chunks, indexes, packs and manifests over one storage backend (module text)."""

    def __init__(self, files: FileService, records: RecordStore, *, clock: Callable[[], float] = time.time) -> None:
        self.files = files
        self.storage: Storage = files.storage
        self.settings = files.settings
        self.publisher = files.publisher
        self.terms = files.lifecycle
        self.clock = clock
        self.records = records  # the index shards: compare-and-set, one retry policy
        self._indexing: set[asyncio.Task[None]] = set()  # checks of files indexed after their answer (index_file)

    # -- the index (the caller's own folder only) ---------------------------------------------------------------

    async def shards(self, owner: str | None, shas: Iterable[str]) -> dict[str, dict[str, list[Any]]]:
        """The index shards that hold ``shas`` (a bounded number of records: at most INDEX_SHARDS)."""
        names = sorted({shard_of(sha) for sha in shas})

        async def read(name: str) -> dict[str, list[Any]]:
            try:
                doc, _ = await read_record(self.storage, index_key(owner, name))
            except NotFound:
                return {}
            entries = doc.get("chunks") if isinstance(doc, dict) else None
            return entries if isinstance(entries, dict) else {}

        return dict(zip(names, await asyncio.gather(*(read(n) for n in names)), strict=True))

    async def locate(self, owner: str | None, shas: Iterable[str]) -> dict[str, Located]:
        """Where ``owner``'s store keeps each of ``shas`` that it has (absent: it has not)."""
        wanted = set(shas)
        shards = await self.shards(owner, wanted)
        out: dict[str, Located] = {}
        for sha in wanted:
            entry = shards[shard_of(sha)].get(sha)
            if isinstance(entry, list) and len(entry) >= 3:
                out[sha] = Located(str(entry[0]), int(entry[1]), int(entry[2]))
        return out

    async def update_shards(
        self, folder: str, shas: Iterable[str], change: Callable[[dict[str, list[Any]], str], bool]
    ) -> set[str]:
        """Apply ``change`` (True: it changed the entries) to the entries of each of ``shas`` in its shard, one
        compare-and-set per shard touched, read again and redone when another writer got there first."""
        by_shard: dict[str, list[str]] = {}
        for sha in shas:
            by_shard.setdefault(shard_of(sha), []).append(sha)

        async def one(name: str, members: list[str]) -> set[str]:
            changed: set[str] = set()

            def decode(doc: Any) -> dict[str, list[Any]]:
                entries = doc.get("chunks") if isinstance(doc, dict) else None
                return dict(entries) if isinstance(entries, dict) else {}  # a copy: the change edits it

            def apply(entries: dict[str, list[Any]]) -> dict[str, list[Any]] | None:
                changed.clear()  # a lost race runs the change again, on the shard as the winner left it
                changed.update(sha for sha in members if change(entries, sha))
                return entries if changed else None

            await self.records.update(
                f"{folder}index/{name}.json", decode, apply, lambda entries: {"chunks": entries}, absent={}
            )
            return changed

        done = await asyncio.gather(*(one(n, m) for n, m in by_shard.items()))
        return set().union(*done) if done else set()

    async def index_add(self, owner: str | None, placed: dict[str, Located]) -> set[str]:
        """Index the chunks of a pack just stored; the ones another pack holds already are left to it (their
        bytes in this pack are garbage its sweep reclaims with the pack). Returns the shas indexed here."""
        stamp = int(self.clock())

        def add(entries: dict[str, list[Any]], sha: str) -> bool:
            if sha in entries:
                return False
            at = placed[sha]
            entries[sha] = [at.pack, at.offset, at.length, stamp]
            return True

        return await self.update_shards(key_folder(owner), placed, add)

    async def index_drop(self, folder: str, shas: Iterable[str], *, older_than: float | None = None) -> set[str]:
        """Remove the index entries of ``shas`` from the key folder ``folder`` (only those stored before
        ``older_than`` when given)."""

        def drop(entries: dict[str, list[Any]], sha: str) -> bool:
            entry = entries.get(sha)
            if entry is None:
                return False
            if older_than is not None and len(entry) >= 4 and float(entry[3]) >= older_than:
                return False
            del entries[sha]
            return True

        return await self.update_shards(folder, shas, drop)

    async def lacking(self, owner: str | None, manifest: Manifest) -> list[int]:
        """Indexes of the first occurrence of each distinct chunk ``owner``'s store lacks."""
        first: dict[str, int] = {}
        for i, chunk in enumerate(manifest.chunks):
            first.setdefault(chunk.sha256, i)
        known = await self.locate(owner, first)
        return sorted(i for sha, i in first.items() if sha not in known)

    async def probe(self, shas_doc: Any, caller: Grant) -> list[int]:
        """Which of the chunk hashes ``shas_doc`` (a list of SHA-256 hex) the caller's key holds: their positions.
        A client asks this of the first chunks of a file before it cuts the rest: a file whose first chunks the
        key lacks is new and goes whole at once. Only the caller's own store is looked in (module text)."""
        if not isinstance(shas_doc, list) or not all(isinstance(s, str) and SHA256_HEX.match(s) for s in shas_doc):
            raise InvalidManifest('a probe is {"chunks": [SHA-256 hex, …]}, lowercase hex, 64 digits each')
        if len(shas_doc) > MAX_PROBE:
            raise ManifestTooLarge(f"a probe names at most {MAX_PROBE} chunks", limit=MAX_PROBE)
        known = await self.locate(caller.owner, shas_doc)
        return [i for i, sha in enumerate(shas_doc) if sha in known]

    async def index_file(
        self, file_id: str, manifest_doc: Any, caller: Grant, *, later: bool = False
    ) -> tuple[int, int | None]:
        """Index the chunks of a stored file of the caller's that went whole by another door (a plain upload, tus,
        a direct upload): its next version then sends only what changed, and resolvers with a cache get its
        manifest. The manifest must describe the file (its size and SHA-256, 400 ``manifest_size_mismatch`` /
        422 ``checksum_mismatch``), and every chunk is checked against the stored bytes, read back (422
        ``chunk_checksum_mismatch``: nothing indexed). Returns (chunks, chunks newly indexed); a file indexed
        already answers its chunk count again. NotFound for another key's file, as for an unknown one.

        ``later``: answer once the manifest is known to describe the file, and check its chunks and index them
        afterwards, on this process (newly indexed: None). The same check decides what is indexed: a chunk that
        is not the file's bytes there indexes nothing (logged), and a check that never ends (the process stops)
        indexes nothing either, which only makes the file's next version send more. At most
        :data:`INDEX_LATER_MAX` checks wait at once; past that the caller waits for its own, as without
        ``later``."""
        s = self.settings
        manifest = parse_manifest(manifest_doc, max_chunks=MAX_CHUNKS, max_size=s.max_upload_size)
        record = await self.files.record(file_id, caller)
        if record.encoding is not ContentEncoding.NONE:
            raise InvalidManifest(
                f"file {file_id} is stored {record.encoding.value}-encoded: its chunks are not ranges of its bytes"
            )
        if manifest.size != record.size:
            raise ManifestSizeMismatch(f"the manifest is of {manifest.size} bytes, file {file_id} of {record.size}")
        require_checksum(manifest, record.sha256)
        owner = record.owner
        try:
            await read_record(self.storage, manifest_key(owner, record.id))
            return len(manifest.chunks), 0  # indexed before (its manifest is the file's: same bytes, same cut)
        except NotFound:
            pass
        if later and self.check_later(record, manifest):
            return len(manifest.chunks), None
        return len(manifest.chunks), await self._check_and_index(record, manifest)

    def check_later(self, record: FileRecord, manifest: Manifest) -> bool:
        """Check ``manifest`` against ``record``'s stored bytes and index it after the caller's answer, on this
        process; False when :data:`INDEX_LATER_MAX` checks wait already (nothing scheduled)."""
        if len(self._indexing) >= INDEX_LATER_MAX:
            return False
        task = asyncio.create_task(self._index_later(record, manifest), name=f"index:{record.id}")
        self._indexing.add(task)
        task.add_done_callback(self._indexing.discard)
        return True

    async def _index_later(self, record: FileRecord, manifest: Manifest) -> None:
        try:
            indexed = await self._check_and_index(record, manifest)
        except TransferError as exc:  # the file is published as it is; its next version sends these chunks again
            log.warning("chunks of %s were not indexed: %s", record.id, exc)
        except Exception:  # noqa: BLE001 - nobody awaits this task: a bug is logged, not lost
            log.exception("checking the chunks of %s failed unexpectedly (a bug); nothing was indexed", record.id)
        else:
            log.info("indexed %d new chunks of %s", indexed, record.id)

    async def indexing_done(self) -> None:
        """Until every check :meth:`index_file` left for later has ended (tests; close)."""
        while self._indexing:
            await asyncio.wait(set(self._indexing))

    async def close(self) -> None:
        """Stop the checks left for later (nothing of theirs is indexed) and wait for them to end."""
        tasks = set(self._indexing)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _check_and_index(self, record: FileRecord, manifest: Manifest) -> int:
        """Check every chunk of ``manifest`` against ``record``'s stored bytes, then index them; how many were
        newly indexed. ChunkChecksumMismatch (nothing indexed) when one is not the file's bytes there."""
        owner = record.owner
        # every chunk checked against the stored bytes; the chunks tile the file (parse_manifest), and those bytes
        # hash to the record's SHA-256 (checked when they were stored): no second whole-file pass
        checks: set[asyncio.Future[tuple[Chunk, str] | None]] = set()

        def refuse(bad: tuple[Chunk, str] | None) -> None:
            if bad is not None:
                raise ChunkChecksumMismatch(
                    f"chunk at offset {bad[0].offset} is not the file's bytes there; nothing was indexed",
                    offset=bad[0].offset,
                    expected=bad[0].sha256,
                    actual=bad[1],
                )

        try:
            with storage_errors_translated():
                async with await self.publisher.shared.open(record) as reader:
                    body = _whole_chunks(reader.read(0, record.size), manifest)
                    async for data, first, count in _received_ahead(body, depth=INDEX_CHECKS):
                        batch = list(manifest.chunks[first : first + count])
                        checks.add(asyncio.ensure_future(asyncio.to_thread(_check_batch, data, batch, None)))
                        if len(checks) >= INDEX_CHECKS:  # batches hashed on that many threads at once
                            done, checks = await asyncio.wait(checks, return_when=asyncio.FIRST_COMPLETED)
                            for check in done:
                                refuse(check.result())
                    for bad in await asyncio.gather(*checks):
                        refuse(bad)
        finally:  # never leave a hash running on a thread past the request
            if checks:
                await asyncio.wait(checks)
        placed: dict[str, Located] = {}
        if record.content is None:  # bytes of its own: its chunks are ranges of its object (no copy, no charge)
            for chunk in manifest.chunks:
                placed.setdefault(chunk.sha256, Located(FILE_PACK + record.id, chunk.offset, chunk.length))
        indexed = await self.index_add(owner, placed) if placed else set()
        await self.keep_manifest(record, manifest)
        return len(indexed)

    # -- packs ---------------------------------------------------------------------------------------------------

    async def put_run(
        self,
        owner: str | None,
        manifest: Manifest,
        positions: list[int],
        body: AsyncIterator[bytes],
        length: int | None,
        *,
        upload_id: str,
    ) -> tuple[int, int]:
        """Verify the chunks at ``positions`` of ``manifest`` as they arrive in ``body`` and write the ones
        ``owner``'s store lacks into one new pack, streamed; then index them (one compare-and-set per index shard
        touched). A chunk that does not hash to its name stops the body: the verified chunks before it are kept, it
        and the rest not. Returns (chunks newly stored, bytes newly stored)."""
        chunks = manifest.chunks
        run = [chunks[i] for i in positions]
        total = sum(c.length for c in run)
        if total > MAX_RUN_BYTES:
            raise TooLarge(f"one body of chunks is at most {MAX_RUN_BYTES} bytes; this one is {total}")
        if length is not None and length != total:
            raise ContentLengthMismatch(f"those {len(run)} chunks are {total} bytes, the body {length}")
        known = await self.locate(owner, {c.sha256 for c in run})
        pack = new_id("p_")
        # counted before stored (never below what is stored), in the shard of the pack's removal claim
        await self.terms.usage.count_bytes(owner, total, rid="pack-" + pack)
        placed: dict[str, Located] = {}
        written = 0
        kept = 0  # bytes of the pack once it is committed: what stays counted
        verified = 0
        failure: TransferError | None = None
        try:
            with storage_errors_translated():
                async with self.storage.create(
                    pack_key(owner, pack), size_hint=total, durable=False
                ) as writer:  # not flushed: an assembly hashes what it reads and drops a chunk that lost its bytes
                    try:
                        async for batch in cut_run(body, run, positions, total):
                            digests = await cpus.hashed(_hash_all, sum(len(data) for _, data in batch), batch)
                            for (chunk, data), digest in zip(batch, digests, strict=True):
                                if digest != chunk.sha256:
                                    raise ChunkChecksumMismatch(
                                        f"chunk at offset {chunk.offset} does not hash to the manifest's SHA-256; "
                                        "it and the rest of its body were not stored",
                                        offset=chunk.offset,
                                        expected=chunk.sha256,
                                        actual=digest,
                                    )
                                verified += 1
                                if chunk.sha256 in known or chunk.sha256 in placed:
                                    continue
                                await writer.write(data)
                                placed[chunk.sha256] = Located(pack, written, len(data))
                                written += len(data)
                    except (ChunkChecksumMismatch, ContentLengthMismatch) as exc:
                        failure = exc  # the verified chunks before it are kept ...
                        if verified == len(run):
                            placed.clear()  # ... but a body that runs on past its chunks is not what was asked
                    if not placed:
                        await writer.abort()
                    else:
                        meta = {"owner": owner or "", "stored_at": str(int(self.clock())), "chunks": str(len(placed))}
                        await writer.commit(meta)
                        kept = written
            # the pack first, then its index: a crash between the two leaves a pack no entry names (an orphan the
            # sweep removes after CHUNK_GRACE, its bytes uncounted then), never an entry naming bytes not stored
            indexed = await self.index_add(owner, placed) if placed else set()
        finally:
            if total - kept:  # the chunks known already, refused, or in a pack that was never committed
                try:
                    await self.terms.usage.refund(owner, total - kept, files=0, rid="pack-" + pack)
                except TransferError as exc:
                    log.warning("%d bytes of %s stay counted: %s", total - kept, upload_id, exc)
        if failure is not None:
            raise failure
        return len(indexed), sum(placed[sha].length for sha in indexed)

    # -- files and manifests ------------------------------------------------------------------------------------

    async def published(self, file_id: str) -> bool:
        """Whether file ``file_id`` is published (a file a manifest names)."""
        try:
            await self.record(file_id)
        except (NotFound, StorageUnavailable):
            return False
        return True

    async def record(self, file_id: str) -> FileRecord:
        """The record of file ``file_id`` (NotFound when absent)."""
        with storage_errors_translated():
            info = await self.storage.stat(object_key(file_id))
        return FileRecord.from_metadata(info.metadata)

    async def keep_manifest(self, record: FileRecord, manifest: Manifest) -> None:
        """``manifest`` is the manifest of the published file ``record``: resolvers with a chunk cache fetch only the
        chunks they lack, and its next version dedups against it."""
        await write_record(
            self.storage, manifest_key(record.owner, record.id), {"file_id": record.id, **manifest.compact()}
        )

    async def manifest(self, file_id: str, caller: Grant) -> Manifest:
        """The chunk manifest of a stored file the caller may read (NotFound otherwise, or when the file was not
        uploaded chunked)."""
        record = await self.files.record(file_id, caller)  # NotFound for another key's file
        try:
            doc, _ = await read_record(self.storage, manifest_key(record.owner, record.id))
        except NotFound:
            raise NotFound(f"file {file_id} has no chunk manifest (it was not uploaded in chunks)") from None
        manifest = Manifest.from_compact(doc)
        if manifest.sha256 != record.sha256 or manifest.size != record.size:
            raise NotFound(f"file {file_id} has no chunk manifest")
        return manifest

    async def signed_manifest(self, file_id: str, query_string: str, raw_path: bytes | str | None) -> Manifest:
        """The manifest of ``file_id`` for whoever holds a signed URL of its content (the same signature, GET or
        POST): the chunk hashes say nothing the content itself does not."""
        content = f"/v1/files/{file_id}/content"
        allowed = (f"/v1/files/{file_id}/manifest",)
        try:
            self.files.check_signed("GET", content, query_string, raw_path, allowed)
        except AccessDenied:
            self.files.check_signed("POST", content, query_string, raw_path, allowed)
        return await self.manifest(file_id, TRUSTED)

    # -- usage repair ------------------------------------------------------------------------------------------

    async def charged(self) -> AsyncIterator[tuple[str | None, str, int]]:
        """``(owner, claim id, bytes)`` of every stored pack (``pack-<id>``) and chunk of the old one-object-per-chunk
        layout (``chunk-<sha256>``), for ``transfer usage repair``: what a key is charged for beside its files (a
        pack counts whole, live chunks and garbage alike, until the sweep removes it). The ids are the ones the
        sweep's removal claims use, so a pack whose removal is claimed but not yet refunded counts once. One
        listing of ``cdc/`` with metadata: an admin count, never a request path. An object whose metadata names
        no key this folder belongs to was not written by this service for that key and is left out."""
        with storage_errors_translated():
            listed = [info async for info in self.storage.list(PREFIX, metadata=True)]
        for info in listed:
            parts = info.key.split("/")
            if len(parts) != 4 or parts[2] not in ("packs", "chunks"):
                continue
            owner = info.metadata.get("owner") or None
            if key_folder(owner) != f"{PREFIX}{parts[1]}/":
                continue
            yield owner, ("pack-" if parts[2] == "packs" else "chunk-") + parts[3], info.size

    # -- sweep -------------------------------------------------------------------------------------------------

    async def _remove_object(self, owner: str | None, key: str, claim: str, nbytes: int) -> bool:
        """Remove one pack (or a chunk of the old layout) and uncount its bytes, exactly once whatever the number
        of sweepers."""
        usage = self.terms.usage
        if not await usage.claim_removal(owner, claim, nbytes):
            return False
        try:
            with storage_errors_translated():
                await self.storage.delete(key)
        except BaseException:
            await usage.unclaim(owner, claim)
            raise
        await usage.removed(owner, claim, nbytes, files=0)
        return True

    async def _sweepable(self, base: str, key: str, now: float) -> tuple[str | None, int] | None:
        """(owner, size) of an object of the folder ``base`` older than CHUNK_GRACE that this service wrote for
        that key; None for any other."""
        try:
            with storage_errors_translated():
                info = await self.storage.stat(key)
        except NotFound:
            return None
        if now - float(info.metadata.get("stored_at", "0") or 0) < CHUNK_GRACE:
            return None
        owner = info.metadata.get("owner") or None
        if key_folder(owner) != base:
            return None  # not written by this service for that key: left alone
        return owner, info.size

    async def sweep_chunks(self) -> int:
        """Drop the manifests of files that are gone; forget the chunks no live file or open upload names once they
        are older than CHUNK_GRACE (the upload records themselves are the upload lifecycle's sweep's); remove the
        packs no index entry uses (and the chunks of the old one-object-per-chunk layout, which nothing reads any
        more). Returns how many chunks were forgotten or removed."""
        now = self.clock()
        folders: dict[str, dict[str, list[str]]] = {}
        with storage_errors_translated():
            async for info in self.storage.list(PREFIX):
                parts = info.key.split("/")
                if len(parts) != 4:
                    continue
                folders.setdefault(parts[1], {}).setdefault(parts[2], []).append(parts[3])
        removed = 0
        for folder, kinds in folders.items():
            marked: set[str] = set()
            base = f"{PREFIX}{folder}/"
            for name in kinds.get("uploads", []):  # the chunks an upload not yet expired may still use
                try:
                    doc, _ = await read_record(self.storage, base + "uploads/" + name)
                    if now < float(doc["expires_at"]):
                        marked.update(c.sha256 for c in Manifest.from_compact(doc["manifest"]).chunks)
                except (NotFound, ValueError, KeyError, TypeError):
                    continue
            for name in kinds.get("manifests", []):
                file_id = name.removesuffix(".json")
                if await self.published(file_id):
                    try:
                        doc, _ = await read_record(self.storage, base + "manifests/" + name)
                    except NotFound:
                        continue
                    marked.update(str(sha) for _, sha in doc.get("chunks", ()))
                    continue
                with storage_errors_translated():
                    await self.storage.delete(base + "manifests/" + name)
            live_packs: set[str] = set()
            for name in kinds.get("index", []):
                try:
                    doc, _ = await read_record(self.storage, base + "index/" + name)
                except NotFound:
                    continue
                entries = doc.get("chunks", {}) if isinstance(doc, dict) else {}
                stale = [sha for sha in entries if sha not in marked]
                gone = await self.index_drop(base, stale, older_than=now - CHUNK_GRACE) if stale else set()
                removed += len(gone)
                live_packs.update(str(e[0]) for sha, e in entries.items() if sha not in gone)
            for pack in kinds.get("packs", []):
                if pack in live_packs:
                    continue  # garbage inside a live pack stays until its last chunk is forgotten
                found = await self._sweepable(base, base + "packs/" + pack, now)
                if found is not None:
                    await self._remove_object(found[0], base + "packs/" + pack, "pack-" + pack, found[1])
            for sha in kinds.get("chunks", []):  # the old layout: migrated by being sent again, then swept
                found = await self._sweepable(base, base + "chunks/" + sha, now)
                if found is not None and await self._remove_object(
                    found[0], base + "chunks/" + sha, "chunk-" + sha, found[1]
                ):
                    removed += 1
        return removed


def manifest_document(manifest: Manifest) -> dict[str, Any]:
    """The JSON a reader gets for a file's chunks."""
    return {**manifest.to_json(), "chunking": dict(CHUNKING)}
