"""Chunked deduplicating uploads: a new version of a file sends only the content-defined chunks its key lacks.

    offer      GET  /v1/chunked                 the chunker every client uses (:data:`CHUNKING`) and the limits
    create     -> :meth:`ChunkService.create`:  the manifest checked (transfer.core.uploads.chunking); content the
                  key (or its sharing group) stores already, by the manifest's SHA-256 and size, is published at once
                  sharing those bytes (the upload born completed, as every door that declares a SHA-256 does);
                  otherwise each distinct chunk looked up **in the caller's key's own chunk store only**, the
                  file's size reserved; the upload record ``cdc/<key>/uploads/<id>.json`` written; answers the
                  indexes of the chunks it lacks
    chunks     -> :meth:`ChunkService.put_chunks`: a run of consecutive manifest chunks in one body (one chunk, or
                  several: fewer requests); each hashed on arrival (422 ``chunk_checksum_mismatch``: that chunk and
                  the rest of the run are not kept), counted in the key's usage before it is stored, stored once
    complete   -> :meth:`ChunkService.complete`: every chunk present (409 ``chunks_missing`` otherwise), the
                  whole-file SHA-256 computed over the chunks in order and compared with the manifest's, then
                  published through the Publisher like every other upload; the packs are read range by range,
                  hashed on the way (the whole-file SHA-256 needs every byte read), and a run of chunks lying back
                  to back in one pack (the old version's object, for most of a new version) is copied into the
                  new object server-side — local ``copy_file_range``, S3 ``UploadPartCopy`` of the version read —
                  where the writer's rules allow (S3: runs and the parts between them of at least 5 MiB), the
                  rest written; the manifest kept (``cdc/<key>/manifests/``) so that a reader can fetch only the
                  chunks it lacks (:meth:`ChunkService.manifest`)

Privacy: a key's chunks live under its own folder, ``cdc/<key hash>/chunks/<sha256>``; a lookup, a chunk upload
and an assembly only ever read that folder. So no answer (lacks, stored, missing, an error, a timing of a lookup that
finds something) can depend on what another key stores: a manifest naming another key's chunks is answered as if
nobody had them, and the upload completes only once the caller sent their bytes itself.

Quota: a stored chunk counts in its key's usage (``UsageLedger.count_bytes``, before it is stored; given back when
it was stored already) on top of the files assembled from it: a key pays for its file and for the chunks it keeps
for its next version. Chunks live while a live file's manifest or an open upload names them, and at least
:data:`CHUNK_GRACE` seconds after they were stored; :meth:`ChunkService.sweep_chunks` removes the others (their
bytes leave the count exactly once: a removal claim) and the manifests of files that are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from storage.base import Capability, CopiesRanges, ObjectReader, Storage
from storage.errors import ObjectChanged, ObjectNotFound
from storage.keyed import KeyedLocks
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import is_id, new_id
from transfer.core.model.content import ContentEncoding, FileRole
from transfer.core.uploads.chunking import CHUNKING, MAX_CHUNK, MAX_CHUNKS, SHA256_HEX, Chunk, Manifest, parse_manifest
from transfer.errors import (
    AccessDenied,
    ChecksumMismatch,
    ChunkChecksumMismatch,
    ChunkNotInManifest,
    ChunksMissing,
    ContentLengthMismatch,
    InvalidManifest,
    InvalidRequest,
    ManifestSizeMismatch,
    ManifestTooLarge,
    NotFound,
    SessionCompleted,
    StorageUnavailable,
    TooLarge,
    TransferError,
    storage_errors_translated,
)
from transfer.service import cpus
from transfer.service.accounting.recordstore import RecordStore, read_record, write_record
from transfer.service.accounting.slots import SessionQuota
from transfer.service.files.publisher import SNIFF_BYTES, Candidate, file_id_for
from transfer.service.files.records import FileRecord, object_key
from transfer.service.files.service import FileService

log = logging.getLogger("transfer.chunks")
_T = TypeVar("_T")

PREFIX = "cdc/"
CHUNK_GRACE = 24 * 3600.0  # seconds a chunk no live file names stays (an upload that stopped may come back)
MAX_RUN_BYTES = 64 << 20  # bytes of one PUT of a run of chunks
SEGMENT_BYTES = 4 << 20  # bytes of a pack hashed at once while assembling (memory: three of them)
HASH_BATCH = 4 << 20  # bytes of arrived chunks hashed in one thread hop
INDEX_SHARDS = 16  # index records per key (by the first hex digit of a chunk's SHA-256)
INDEX_CHECKS = 2  # batches of a stored file hashed at once while its manifest is checked (index_file)
INDEX_LATER_MAX = 8  # checks of index_file(later=True) waiting at once on one process; past it a caller waits
MAX_PROBE = 4096  # chunk hashes one probe may name (a client probes the first few MiB of a file)
UPLOAD_CACHE = 1024  # upload records kept per process for chunk PUTs (their fields never change while open)


def _sha_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hash_all(batch: list[tuple[Chunk, bytes]]) -> list[str]:
    return [_sha_hex(data) for _, data in batch]


def new_upload_id() -> str:
    """A fresh chunked-upload id (``c_`` and 128 random bits)."""
    return new_id("c_")


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


def upload_key(owner: str | None, uid: str) -> str:
    """The record of ``owner``'s open chunked upload ``uid``."""
    return f"{key_folder(owner)}uploads/{uid}.json"


@dataclass(frozen=True, slots=True)
class ChunkedUpload:
    """One chunked upload: its manifest, who owns it, what it publishes."""

    id: str
    owner: str | None
    manifest: Manifest
    missing: tuple[int, ...]  # indexes of the chunks the key lacked when the upload was created
    created_at: float
    expires_at: float
    name: str | None = None
    content_type: str | None = None
    role: str | None = None
    description: str | None = None
    lifetime: int | None = None
    state: str = "open"  # open | completed
    file_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The upload's record (JSON), as stored."""
        return {
            "id": self.id,
            "owner": self.owner,
            "manifest": self.manifest.compact(),
            "missing": list(self.missing),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "name": self.name,
            "content_type": self.content_type,
            "role": self.role,
            "description": self.description,
            "lifetime": self.lifetime,
            "state": self.state,
            "file_id": self.file_id,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ChunkedUpload:
        """The upload as read back from its record."""
        return cls(
            id=str(doc["id"]),
            owner=doc.get("owner"),
            manifest=Manifest.from_compact(doc["manifest"]),
            missing=tuple(int(i) for i in doc.get("missing", ())),
            created_at=float(doc["created_at"]),
            expires_at=float(doc["expires_at"]),
            name=doc.get("name"),
            content_type=doc.get("content_type"),
            role=doc.get("role"),
            description=doc.get("description"),
            lifetime=doc.get("lifetime"),
            state=str(doc.get("state", "open")),
            file_id=doc.get("file_id"),
        )


async def _batches(
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


class ChunkService:
    """Per-key chunk stores and the uploads assembled from them (module text)."""

    def __init__(self, files: FileService, *, clock: Callable[[], float] = time.time) -> None:
        self.files = files
        self.storage: Storage = files.storage
        self.settings = files.settings
        self.publisher = files.publisher
        self.lifecycle = files.lifecycle
        self.clock = clock
        self.locks = KeyedLocks()
        self.records = RecordStore(self.storage)  # the index shards: compare-and-set, one retry policy
        self._uploads: dict[str, ChunkedUpload] = {}
        self._indexing: set[asyncio.Task[None]] = set()  # checks of files indexed after their answer (index_file)
        # open chunked uploads per key, bounded like its open sessions: a marker each (quota.py)
        self.open_uploads = SessionQuota(
            self.storage,
            self.settings.max_open_sessions_per_key,
            folder="chunked",
            noun="open chunked uploads",
            clock=clock,
        )
        self.open_uploads.register(lambda uid: is_id(uid, "c_"), self._is_open)

    async def _is_open(self, uid: str) -> bool:
        upload = self._uploads.get(uid)
        if upload is not None:
            return upload.state == "open" and self.clock() < upload.expires_at
        return False  # not this process's: only its record (under its owner's folder) would say; let it go

    def offer(self) -> dict[str, Any]:
        """What a client needs to upload chunked: how to cut, and the bounds."""
        return {
            "chunking": dict(CHUNKING),
            "max_chunks": MAX_CHUNKS,
            "max_chunk_size": MAX_CHUNK,
            "max_run_bytes": MAX_RUN_BYTES,
            "file_url": "/v1/chunked/{id}/file",  # the whole file in one body, written once (put_file)
            "probe_url": "/v1/chunked/probe",  # which of a file's first chunks the key holds (probe)
            "max_probe": MAX_PROBE,
            "index_url": "/v1/files/{id}/chunks",  # PUT: index a file that went whole by another door (index_file)
            "max_size": self.settings.max_upload_size,
        }

    # -- the index (the caller's own folder only) ---------------------------------------------------------------

    async def _shards(self, owner: str | None, shas: Iterable[str]) -> dict[str, dict[str, list[Any]]]:
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

    async def _locate(self, owner: str | None, shas: Iterable[str]) -> dict[str, Located]:
        """Where ``owner``'s store keeps each of ``shas`` that it has (absent: it has not)."""
        wanted = set(shas)
        shards = await self._shards(owner, wanted)
        out: dict[str, Located] = {}
        for sha in wanted:
            entry = shards[shard_of(sha)].get(sha)
            if isinstance(entry, list) and len(entry) >= 3:
                out[sha] = Located(str(entry[0]), int(entry[1]), int(entry[2]))
        return out

    async def _update_shards(
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

    async def _index_add(self, owner: str | None, placed: dict[str, Located]) -> set[str]:
        """Index the chunks of a pack just stored; the ones another pack holds already are left to it (their
        bytes in this pack are garbage its sweep reclaims with the pack). Returns the shas indexed here."""
        stamp = int(self.clock())

        def add(entries: dict[str, list[Any]], sha: str) -> bool:
            if sha in entries:
                return False
            at = placed[sha]
            entries[sha] = [at.pack, at.offset, at.length, stamp]
            return True

        return await self._update_shards(key_folder(owner), placed, add)

    async def _index_drop(self, folder: str, shas: Iterable[str], *, older_than: float | None = None) -> set[str]:
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

        return await self._update_shards(folder, shas, drop)

    async def _lacking(self, owner: str | None, manifest: Manifest) -> list[int]:
        """Indexes of the first occurrence of each distinct chunk ``owner``'s store lacks."""
        first: dict[str, int] = {}
        for i, chunk in enumerate(manifest.chunks):
            first.setdefault(chunk.sha256, i)
        known = await self._locate(owner, first)
        return sorted(i for sha, i in first.items() if sha not in known)

    async def probe(self, shas_doc: Any, caller: Grant) -> list[int]:
        """Which of the chunk hashes ``shas_doc`` (a list of SHA-256 hex) the caller's key holds: their positions.
        A client asks this of the first chunks of a file before it cuts the rest: a file whose first chunks the
        key lacks is new and goes whole at once. Only the caller's own store is looked in (module text)."""
        if not isinstance(shas_doc, list) or not all(isinstance(s, str) and SHA256_HEX.match(s) for s in shas_doc):
            raise InvalidManifest('a probe is {"chunks": [SHA-256 hex, …]}, lowercase hex, 64 digits each')
        if len(shas_doc) > MAX_PROBE:
            raise ManifestTooLarge(f"a probe names at most {MAX_PROBE} chunks", limit=MAX_PROBE)
        known = await self._locate(caller.owner, shas_doc)
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
        self._require_checksum(manifest, record.sha256)
        owner = record.owner
        try:
            await read_record(self.storage, manifest_key(owner, record.id))
            return len(manifest.chunks), 0  # indexed before (its manifest is the file's: same bytes, same cut)
        except NotFound:
            pass
        if later and self._check_later(record, manifest):
            return len(manifest.chunks), None
        return len(manifest.chunks), await self._check_and_index(record, manifest)

    def _check_later(self, record: FileRecord, manifest: Manifest) -> bool:
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
        indexed = await self._index_add(owner, placed) if placed else set()
        await write_record(self.storage, manifest_key(owner, record.id), {"file_id": record.id, **manifest.compact()})
        return len(indexed)

    # -- create ------------------------------------------------------------------------------------------------

    async def create(
        self,
        manifest_doc: Any,
        caller: Grant,
        *,
        name: str | None = None,
        content_type: str | None = None,
        role: FileRole | None = None,
        description: str | None = None,
        expires_in: int | None = None,
    ) -> ChunkedUpload:
        """A new chunked upload of the file ``manifest_doc`` describes, owned by the caller's key; its size is
        reserved in the key's quota (QuotaExceeded before anything is stored). ``missing``: what to send. A file
        whose whole content (SHA-256 and size) the key stores already is published at once, sharing those bytes:
        the upload is born completed, nothing is missing."""
        s = self.settings
        manifest = parse_manifest(manifest_doc, max_chunks=MAX_CHUNKS, max_size=s.max_upload_size)
        self.publisher.check_fields(content_type=content_type, description=description)
        lifetime = self.lifecycle.lifetime(caller.owner, expires_in)
        owner = caller.owner
        now = self.clock()
        upload = ChunkedUpload(
            id=new_upload_id(),
            owner=owner,
            manifest=manifest,
            missing=(),
            created_at=now,
            expires_at=now + float(s.session_ttl),
            name=name,
            content_type=content_type,
            role=role.value if role else None,
            description=description,
            lifetime=lifetime,
        )
        born = await self._publish_known(upload)
        if born is not None:
            return born
        upload = replace(upload, missing=tuple(await self._lacking(owner, manifest)))
        await self.open_uploads.acquire(owner, upload.id)  # TooManySessions at the key's limit
        try:
            await self.lifecycle.admit(owner, upload.id, manifest.size, upload.expires_at)
            try:
                await write_record(self.storage, upload_key(owner, upload.id), upload.to_json(), if_absent=True)
            except BaseException:
                await self.lifecycle.release_after_failure(owner, upload.id)
                raise
        except BaseException:
            await self.open_uploads.release(owner, upload.id)
            raise
        self._remember(upload)
        return upload

    async def _publish_known(self, upload: ChunkedUpload) -> ChunkedUpload | None:
        """Content the owner's scope already stores (the manifest's SHA-256 and size): published now as a file of
        its own sharing those bytes (:meth:`Publisher.publish_known`, which looks in that scope only), and the
        upload is born completed: no chunk to send, no slot or reservation held. Its chunk list was not checked
        against any bytes: it becomes the file's manifest (for resolvers with a cache) only once checked against
        the shared bytes after the answer, as an index given with ``respond-async`` is (with no room for a check,
        never: the file then resolves whole). None: the scope stores no such content, or too small a file to
        share."""
        candidate = self._candidate(upload, upload.manifest.sha256, b"", "chunked (shared)")
        record = await self.publisher.publish_known(candidate)
        if record is None:
            return None
        done = replace(upload, state="completed", file_id=record.id)
        await write_record(self.storage, upload_key(upload.owner, upload.id), done.to_json(), if_absent=True)
        self._check_later(record, upload.manifest)
        return done

    def _remember(self, upload: ChunkedUpload) -> None:
        while len(self._uploads) >= UPLOAD_CACHE:
            self._uploads.pop(next(iter(self._uploads)))
        self._uploads[upload.id] = upload

    async def load(self, uid: str, caller: Grant) -> ChunkedUpload:
        """The caller's upload ``uid`` (NotFound for any other key's, as for an unknown id: the record is looked
        for in the caller's own folder)."""
        if not is_id(uid, "c_"):
            raise NotFound(f"no chunked upload {uid!r}")
        try:
            doc, _ = await read_record(self.storage, upload_key(caller.owner, uid))
        except NotFound:
            raise NotFound(f"no chunked upload {uid!r}") from None
        upload = ChunkedUpload.from_json(doc)
        if upload.owner != caller.owner:
            raise NotFound(f"no chunked upload {uid!r}")
        return upload

    async def _open_upload(self, uid: str, caller: Grant) -> ChunkedUpload:
        """For chunk PUTs: the upload from this process's cache when it has it (its manifest and owner never
        change; a completion elsewhere does not matter, chunks are content-addressed), else its record."""
        upload = self._uploads.get(uid)
        if upload is None or upload.owner != caller.owner:
            upload = await self.load(uid, caller)
            self._remember(upload)
        if upload.state == "completed":  # its file is published (perhaps at its birth): nothing more to store
            raise SessionCompleted(f"chunked upload {uid} is completed (file {upload.file_id}); complete answers it")
        if self.clock() >= upload.expires_at:
            raise NotFound(f"chunked upload {uid} has expired")
        return upload

    # -- chunks ------------------------------------------------------------------------------------------------

    async def put_chunks(
        self, uid: str, index: int, count: int, body: AsyncIterator[bytes], caller: Grant, *, length: int | None
    ) -> tuple[int, int]:
        """Store chunks ``index .. index+count-1`` of upload ``uid`` from ``body`` (their bytes back to back),
        each checked against the manifest's SHA-256 as it arrives. Returns (chunks newly stored, bytes newly
        stored). A chunk the key holds already is checked and not stored again."""
        upload = await self._open_upload(uid, caller)
        n = len(upload.manifest.chunks)
        if count < 1 or index < 0 or index + count > n:
            raise ChunkNotInManifest(
                f"chunks {index}..{index + count - 1} are not in the manifest of {uid} (0..{n - 1})", chunks=n
            )
        return await self._put(upload, list(range(index, index + count)), body, length)

    async def put_missing(
        self, uid: str, start: int, count: int, body: AsyncIterator[bytes], caller: Grant, *, length: int | None
    ) -> tuple[int, int]:
        """Store the chunks ``start .. start+count-1`` of the list the upload's creation answered as missing, from
        ``body`` (their bytes back to back, in that order): one request and one pack for chunks that need not be
        consecutive in the file."""
        upload = await self._open_upload(uid, caller)
        n = len(upload.missing)
        if count < 1 or start < 0 or start + count > n:
            raise ChunkNotInManifest(
                f"missing chunks {start}..{start + count - 1} are not in the list of {uid} (0..{n - 1})", chunks=n
            )
        return await self._put(upload, list(upload.missing[start : start + count]), body, length)

    async def _put(
        self, upload: ChunkedUpload, positions: list[int], body: AsyncIterator[bytes], length: int | None
    ) -> tuple[int, int]:
        """Verify the chunks at ``positions`` of the manifest as they arrive in ``body`` and write the ones the key
        lacks into one new pack, streamed; then index them (one compare-and-set per index shard touched). A chunk
        that does not hash to its name stops the body: the verified chunks before it are kept, it and the rest
        not."""
        chunks = upload.manifest.chunks
        run = [chunks[i] for i in positions]
        total = sum(c.length for c in run)
        if total > MAX_RUN_BYTES:
            raise TooLarge(f"one body of chunks is at most {MAX_RUN_BYTES} bytes; this one is {total}")
        if length is not None and length != total:
            raise ContentLengthMismatch(f"those {len(run)} chunks are {total} bytes, the body {length}")
        owner = upload.owner
        known = await self._locate(owner, {c.sha256 for c in run})
        await self.lifecycle.usage.count_bytes(owner, total)  # counted before stored: never below what is stored
        placed: dict[str, Located] = {}
        pack = new_id("p_")
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
                        async for batch in _batches(body, run, positions, total):
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
            indexed = await self._index_add(owner, placed) if placed else set()
        finally:
            if total - kept:  # the chunks known already, refused, or in a pack that was never committed
                try:
                    await self.lifecycle.usage.refund(owner, total - kept, files=0)
                except TransferError as exc:
                    log.warning("%d bytes of %s stay counted: %s", total - kept, upload.id, exc)
        if failure is not None:
            raise failure
        return len(indexed), sum(placed[sha].length for sha in indexed)

    # -- complete ----------------------------------------------------------------------------------------------

    async def _unpublished(self, uid: str, caller: Grant) -> tuple[ChunkedUpload, str, FileRecord | None]:
        """Upload ``uid`` (the caller's), the id of the file it makes, and that file if it is published already
        (completing again answers it); NotFound once the upload has expired unpublished."""
        upload = await self.load(uid, caller)
        file_id = file_id_for(uid)
        if upload.state == "completed" or await self._published(file_id):
            return upload, file_id, await self._record(file_id)
        if self.clock() >= upload.expires_at:
            raise NotFound(f"chunked upload {uid} has expired")
        return upload, file_id, None

    async def complete(self, uid: str, caller: Grant) -> FileRecord:
        """Check every chunk is stored, verify the whole SHA-256 over them, publish. A completed upload answers its
        file again."""
        async with self.locks.hold(uid):
            upload, file_id, published = await self._unpublished(uid, caller)
            if published is not None:
                return published
            owner = upload.owner
            manifest = upload.manifest
            await self.publisher.require_room(
                owner, uid, manifest.size, what=f"chunked upload {uid}", retry="delete files and complete again"
            )
            try:
                record = await self._assemble(upload)
            except (ChunksMissing, NotFound):
                # one chunk is gone (never sent, or swept since): tell the client every chunk to send, in one go
                lacking = await self._lacking(owner, manifest)
                if not lacking:
                    raise
                raise ChunksMissing(
                    f"{len(lacking)} chunk(s) of {uid} are not stored; send them and complete again",
                    missing=lacking[:10_000],
                ) from None
            kept = {"file_id": record.id, **manifest.compact()}
            await write_record(self.storage, manifest_key(owner, record.id), kept)
            done = replace(upload, state="completed", file_id=record.id)
            try:
                await write_record(self.storage, upload_key(owner, uid), done.to_json())
            except TransferError as exc:  # the file is published; the sweep ends the record at its expiry
                log.warning("chunked upload %s published %s but its record stays open: %s", uid, record.id, exc)
            self._uploads.pop(uid, None)
            await self.open_uploads.release(owner, uid)
            return record

    async def _assemble(self, upload: ChunkedUpload) -> FileRecord:
        """Hash the chunks in order (ranges of packs), compare with the manifest, publish. A chunk that is not
        stored raises ChunksMissing (the caller finds them all)."""
        return await self._stream_publish(upload)

    def _require_checksum(self, manifest: Manifest, sha_hex: str) -> None:
        if sha_hex != manifest.sha256:
            raise ChecksumMismatch(
                "the chunks hash to another SHA-256 than the manifest declares; nothing was published",
                expected="sha256:" + manifest.sha256,
                actual="sha256:" + sha_hex,
            )

    async def _runs(self, owner: str | None, manifest: Manifest) -> list[tuple[str, int, int]]:
        """The manifest as ranges of packs, in order, consecutive chunks of one pack merged into one range:
        (pack, start, end). ChunksMissing names every chunk the index lacks."""
        where = await self._locate(owner, manifest.distinct())
        missing = [i for i, c in enumerate(manifest.chunks) if c.sha256 not in where]
        if missing:
            raise ChunksMissing(
                f"{len(missing)} chunk(s) are not stored; send them and complete again", missing=missing
            )
        out: list[tuple[str, int, int]] = []
        for chunk in manifest.chunks:
            at = where[chunk.sha256]
            if at.length != chunk.length:
                await self._index_drop(key_folder(owner), [chunk.sha256])
                raise ChunksMissing("a stored chunk has another length than its name says", missing=[0])
            if out and out[-1][0] == at.pack and out[-1][2] == at.offset:
                out[-1] = (at.pack, out[-1][1], at.offset + at.length)
            else:
                out.append((at.pack, at.offset, at.offset + at.length))
        return out

    async def _chunks_in_order(
        self, owner: str | None, manifest: Manifest
    ) -> AsyncGenerator[tuple[tuple[str, int, int], ObjectReader, int, bytes], None]:
        """The bytes of the file ``manifest`` describes, as (run, the reader of its pack, offset in the pack, bytes
        of at most :data:`SEGMENT_BYTES`): each run of :meth:`_runs` read by one streamed read (one GET on S3,
        whatever its length: a request per segment costs a store like Swift more than the bytes), read on by a
        task while the caller hashes the last batch. A pack that is gone or shorter than the run (lost in a
        crash) has its entries dropped and its chunks reported missing."""
        runs = await self._runs(owner, manifest)
        readers: dict[str, ObjectReader] = {}

        async def batches() -> AsyncIterator[tuple[tuple[str, int, int], ObjectReader, int, bytes]]:
            for run in runs:
                pack, start, end = run
                at, pieces, gathered = start, [], 0
                with storage_errors_translated():
                    reader = readers.get(pack)
                    if reader is None:
                        try:
                            reader = readers[pack] = await self.storage.open(pack_key(owner, pack))
                        except ObjectNotFound:
                            reader = None
                    if reader is None or reader.info.size < end:  # gone, or shorter than its index says
                        await self._drop_pack_entries(owner, manifest, pack)
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

    async def _drop_pack_entries(self, owner: str | None, manifest: Manifest, pack: str) -> None:
        """Forget the chunks of ``manifest`` that ``pack`` held (it is gone or damaged)."""
        where = await self._locate(owner, manifest.distinct())
        await self._index_drop(key_folder(owner), [sha for sha, at in where.items() if at.pack == pack])

    async def _drop_damaged(self, owner: str | None, manifest: Manifest) -> None:
        """After a whole-file mismatch: re-hash each distinct chunk; one whose bytes are not its name (lost in a
        crash) is forgotten and reported missing, so the client sends it again. None: the manifest itself lies."""
        where = await self._locate(owner, manifest.distinct())
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
                        async with await self.storage.open(pack_key(owner, at.pack)) as reader:
                            data = b"".join([p async for p in reader.read(at.offset, at.offset + at.length)])
                except NotFound:
                    pass
            if await cpus.hashed(_sha_hex, len(data), data) != chunk.sha256:
                bad.append(chunk.sha256)
                damaged.append(i)
        if damaged:
            await self._index_drop(key_folder(owner), bad)
            raise ChunksMissing(
                f"{len(damaged)} stored chunk(s) were damaged and removed; send them and complete again",
                missing=damaged[:10_000],
            )

    async def _stream_publish(self, upload: ChunkedUpload) -> FileRecord:
        """Assemble into a new object, hashed on the way, published only if it matches. Every byte is read (the
        whole-file SHA-256 needs them all); where the backend's writers copy ranges server-side (COPY_RANGE:
        local ``copy_file_range``, S3 ``UploadPartCopy``), a run of chunks lying back to back in one pack is copied
        instead of written, as far as the writer's rules allow (:meth:`~storage.base.CopiesRanges.copy_lead`)."""
        manifest, owner = upload.manifest, upload.owner
        sha = hashlib.sha256()
        head = b""
        copied: set[str] = set()  # the packs ranges were copied from
        key = object_key(file_id_for(upload.id))
        with storage_errors_translated():
            try:
                # the readers close after the writer has ended (a local copy reads from their descriptors)
                async with contextlib.aclosing(self._chunks_in_order(owner, manifest)) as batches:
                    async with self.storage.create(key, size_hint=manifest.size) as writer:
                        copier = (
                            writer
                            if Capability.COPY_RANGE in self.storage.capabilities and isinstance(writer, CopiesRanges)
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
                            await self._drop_damaged(owner, manifest)
                        self._require_checksum(manifest, digest)

                        async def place(record: FileRecord) -> None:
                            await writer.commit(record.to_metadata())

                        return await self._publish(upload, digest, head, place)
            except ObjectChanged as exc:  # a pack a range was copied from went after it was read (S3)
                await self._drop_gone_packs(owner, manifest, copied)
                raise ChunksMissing(
                    "a file whose chunks this one shares was deleted while it was assembled; send them and complete "
                    "again",
                    missing=[0],
                ) from exc

    async def _drop_gone_packs(self, owner: str | None, manifest: Manifest, packs: Iterable[str]) -> None:
        for pack in packs:
            try:
                await self.storage.stat(pack_key(owner, pack))
            except ObjectNotFound:
                await self._drop_pack_entries(owner, manifest, pack)

    async def put_file(self, uid: str, body: AsyncIterator[bytes], caller: Grant, *, length: int | None) -> FileRecord:
        """Publish upload ``uid`` from ``body``: the whole file, in order (for a file whose key lacks most of its
        chunks). Each chunk is checked against the manifest as it arrives and the whole SHA-256 computed on the
        way, while the bytes are written once, straight into the new file's object; once it matches, the file is
        published and its chunks indexed as ranges of that object (``file:<id>`` packs: no second copy, no extra
        charge; when the file goes, an assembly that needs them finds them gone and asks for them again). Nothing
        is published on any mismatch (422 ``chunk_checksum_mismatch`` / ``checksum_mismatch``, 400
        ``content_length_mismatch``); the upload stays open. A completed upload answers its file again."""
        async with self.locks.hold(uid):
            upload, file_id, published = await self._unpublished(uid, caller)
            if published is not None:
                return published
            owner, manifest = upload.owner, upload.manifest
            if length is not None and length != manifest.size:
                raise ContentLengthMismatch(f"the file is {manifest.size} bytes, the body {length}")
            await self.publisher.require_room(
                owner, uid, manifest.size, what=f"chunked upload {uid}", retry="delete files and complete again"
            )
            sha = hashlib.sha256()
            head = b""
            with storage_errors_translated():
                async with self.storage.create(object_key(file_id), size_hint=manifest.size) as writer:
                    # the check of batch N+1 (a thread) runs while batch N is written, as the plain upload does
                    writing: asyncio.Task[None] | None = None
                    try:
                        async for data, first, count in _received_ahead(_whole_chunks(body, manifest)):
                            if len(head) < SNIFF_BYTES:
                                head += bytes(data[: SNIFF_BYTES - len(head)])
                            batch = list(manifest.chunks[first : first + count])
                            bad = await cpus.hashed(_check_batch, len(data), data, batch, sha)
                            if bad is not None:
                                raise ChunkChecksumMismatch(
                                    f"chunk at offset {bad[0].offset} does not hash to the manifest's SHA-256; "
                                    "nothing was published",
                                    offset=bad[0].offset,
                                    expected=bad[0].sha256,
                                    actual=bad[1],
                                )
                            if writing is not None:
                                await writing
                            writing = asyncio.create_task(writer.write(data))
                        if writing is not None:
                            await writing
                    finally:  # never abandon a write in flight: its thread would outlive the writer's abort
                        if writing is not None and not writing.done():
                            await asyncio.wait([writing])
                    digest = sha.hexdigest()
                    self._require_checksum(manifest, digest)

                    async def place(record: FileRecord) -> None:
                        await writer.commit(record.to_metadata())

                    record = await self._publish(upload, digest, head, place)
            placed: dict[str, Located] = {}
            if record.content is None:  # the bytes are this file's own object: index its chunks there
                for chunk in manifest.chunks:
                    placed.setdefault(chunk.sha256, Located(FILE_PACK + record.id, chunk.offset, chunk.length))

            async def index() -> None:
                try:
                    await self._index_add(owner, placed)
                except TransferError as exc:  # the file is published; its next version sends these chunks again
                    log.warning("chunks of %s were not indexed: %s", record.id, exc)

            await asyncio.gather(index(), self._completed(upload, record))
            return record

    async def _completed(self, upload: ChunkedUpload, record: FileRecord) -> None:
        """Keep the published file's manifest, end the upload's record and its place among the key's open ones."""
        owner, uid = upload.owner, upload.id
        kept = {"file_id": record.id, **upload.manifest.compact()}
        done = replace(upload, state="completed", file_id=record.id)

        async def end() -> None:
            try:
                await write_record(self.storage, upload_key(owner, uid), done.to_json())
            except TransferError as exc:  # the file is published; the sweep ends the record at its expiry
                log.warning("chunked upload %s published %s but its record stays open: %s", uid, record.id, exc)

        await asyncio.gather(write_record(self.storage, manifest_key(owner, record.id), kept), end())
        self._uploads.pop(uid, None)
        await self.open_uploads.release(owner, uid)

    async def _publish(
        self, upload: ChunkedUpload, sha_hex: str, head: bytes, place: Callable[[FileRecord], Any]
    ) -> FileRecord:
        return await self.publisher.publish(self._candidate(upload, sha_hex, head, "chunked"), place)

    @staticmethod
    def _candidate(upload: ChunkedUpload, sha_hex: str, head: bytes, source: str) -> Candidate:
        return Candidate(
            owner=upload.owner,
            upload_id=upload.id,
            size=upload.manifest.size,
            sha256=sha_hex,
            head=head,
            source=source,
            name=upload.name,
            content_type=upload.content_type,
            role=FileRole(upload.role) if upload.role else None,
            description=upload.description,
            lifetime=upload.lifetime,
            republishable_until=upload.expires_at,
        )

    async def _published(self, file_id: str) -> bool:
        try:
            await self._record(file_id)
        except (NotFound, StorageUnavailable):
            return False
        return True

    async def _record(self, file_id: str) -> FileRecord:
        with storage_errors_translated():
            info = await self.storage.stat(object_key(file_id))
        return FileRecord.from_metadata(info.metadata)

    async def abort(self, uid: str, caller: Grant) -> None:
        """End an open upload without a file: its reservation goes; its chunks stay for the grace (a retry may
        use them)."""
        upload = await self.load(uid, caller)
        if upload.state == "completed":
            raise InvalidRequest(f"chunked upload {uid} is complete; delete its file instead")
        with storage_errors_translated():
            await self.storage.delete(upload_key(upload.owner, uid))
        self._uploads.pop(uid, None)
        await self.lifecycle.release(upload.owner, uid)
        await self.open_uploads.release(upload.owner, uid)

    # -- reading -----------------------------------------------------------------------------------------------

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
        usage = self.lifecycle.usage
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
        """Drop ended upload records and the manifests of files that are gone; forget the chunks no live file or
        open upload names once they are older than CHUNK_GRACE; remove the packs no index entry uses (and the
        chunks of the old one-object-per-chunk layout, which nothing reads any more). Returns how many chunks
        were forgotten or removed."""
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
            for name in kinds.get("uploads", []):
                try:
                    doc, _ = await read_record(self.storage, base + "uploads/" + name)
                    upload = ChunkedUpload.from_json(doc)
                except (NotFound, ValueError, KeyError, TypeError):
                    continue
                if now < upload.expires_at:
                    marked.update(c.sha256 for c in upload.manifest.chunks)
                    continue
                if upload.state == "open":
                    await self.lifecycle.release(upload.owner, upload.id)
                    await self.open_uploads.release(upload.owner, upload.id)
                with storage_errors_translated():
                    await self.storage.delete(base + "uploads/" + name)
            for name in kinds.get("manifests", []):
                file_id = name.removesuffix(".json")
                if await self._published(file_id):
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
                gone = await self._index_drop(base, stale, older_than=now - CHUNK_GRACE) if stale else set()
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
