"""Chunked deduplicating uploads: a new version of a file sends only the content-defined chunks its key lacks.

    offer      GET  /v1/chunked                 the chunker every client uses (:data:`CHUNKING`) and the limits
    create     -> :meth:`ChunkService.create`:  the manifest checked (transfer.core.chunking), each distinct chunk
                  looked up **in the caller's key's own chunk store only**, the file's size reserved; the upload
                  record ``cdc/<key>/uploads/<id>.json`` written; answers the indexes of the chunks it lacks
    chunks     -> :meth:`ChunkService.put_chunks`: a run of consecutive manifest chunks in one body (one chunk, or
                  several: fewer requests); each hashed on arrival (422 ``chunk_checksum_mismatch``: that chunk and
                  the rest of the run are not kept), counted in the key's usage before it is stored, stored once
    complete   -> :meth:`ChunkService.complete`: every chunk present (409 ``chunks_missing`` otherwise), the
                  whole-file SHA-256 computed over the chunks in order and compared with the manifest's, then
                  published through the Publisher like every other upload; the bytes placed with the backend's
                  compose (local: ``copy_file_range``, the bytes never enter this process) where part sizes allow,
                  else streamed chunk by chunk into a new object; the manifest kept (``cdc/<key>/manifests/``) so
                  that a reader can fetch only the chunks it lacks (:meth:`ChunkService.manifest`)

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
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from storage.base import Capability, Storage, SupportsCompose, capable
from storage.errors import ObjectNotFound
from storage.keyed import KeyedLocks
from transfer.core.auth import TRUSTED, Grant
from transfer.core.chunking import CHUNKING, MAX_CHUNK, MAX_CHUNKS, Manifest, parse_manifest
from transfer.core.content import FileRole
from transfer.core.ids import is_id, new_id
from transfer.errors import (
    AccessDenied,
    ChecksumMismatch,
    ChunkChecksumMismatch,
    ChunkNotInManifest,
    ChunksMissing,
    Conflict,
    ContentLengthMismatch,
    InvalidRequest,
    NotFound,
    StorageUnavailable,
    TooLarge,
    TransferError,
    storage_errors_translated,
)
from transfer.service.files import FileService
from transfer.service.publisher import SNIFF_BYTES, Candidate, file_id_for
from transfer.service.quota import SessionQuota
from transfer.service.records import FileRecord, object_key
from transfer.service.recordstore import read_record, write_record

log = logging.getLogger("transfer.chunks")

PREFIX = "cdc/"
CHUNK_GRACE = 24 * 3600.0  # seconds a chunk no live file names stays (an upload that stopped may come back)
MAX_RUN_BYTES = 64 << 20  # bytes of one PUT of a run of chunks
LOOKUPS_IN_FLIGHT = 32  # concurrent existence checks of one manifest (S3: HEADs)
READ_AHEAD = 16  # chunks read ahead while an assembly hashes (memory: READ_AHEAD x MAX_CHUNK at most)
MIN_COMPOSE_PART = 5 << 20  # S3's part minimum: compose only where every part but the last reaches it
STORES_IN_FLIGHT = 8  # verified chunks of one run being written at once (memory: that many chunks)
UPLOAD_CACHE = 1024  # upload records kept per process for chunk PUTs (their fields never change while open)


def _sha_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def new_upload_id() -> str:
    """A fresh chunked-upload id (``c_`` and 128 random bits)."""
    return new_id("c_")


def key_folder(owner: str | None) -> str:
    """``cdc/<key hash>/``: everything chunked uploads keep for one key (None: open mode)."""
    if owner is None:
        return PREFIX + "open/"
    return PREFIX + "k" + hashlib.sha256(owner.encode("utf-8")).hexdigest()[:40] + "/"


def chunk_key(owner: str | None, sha: str) -> str:
    """Where the key ``owner`` keeps the chunk whose SHA-256 is ``sha`` (its own folder: never shared)."""
    return f"{key_folder(owner)}chunks/{sha}"


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


async def _bounded(jobs: Iterable[Callable[[], Any]], limit: int) -> list[Any]:
    """Run the coroutine factories ``jobs`` with at most ``limit`` in flight; their results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Any]) -> Any:
        async with gate:
            return await job()

    return list(await asyncio.gather(*(one(job) for job in jobs)))


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
        self._uploads: dict[str, ChunkedUpload] = {}
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
            "max_size": self.settings.max_upload_size,
        }

    # -- lookups (the caller's own folder only) ----------------------------------------------------------------

    async def _has(self, owner: str | None, sha: str) -> bool:
        try:
            with storage_errors_translated():
                await self.storage.stat(chunk_key(owner, sha))
        except NotFound:
            return False
        return True

    async def _lacking(self, owner: str | None, manifest: Manifest) -> list[int]:
        """Indexes of the first occurrence of each distinct chunk ``owner``'s store lacks."""
        first: dict[str, int] = {}
        for i, chunk in enumerate(manifest.chunks):
            first.setdefault(chunk.sha256, i)
        shas = list(first)
        present = await _bounded([partial(self._has, owner, sha) for sha in shas], LOOKUPS_IN_FLIGHT)
        return sorted(first[sha] for sha, have in zip(shas, present, strict=True) if not have)

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
        reserved in the key's quota (QuotaExceeded before anything is stored). ``missing``: what to send."""
        s = self.settings
        manifest = parse_manifest(manifest_doc, max_chunks=MAX_CHUNKS, max_size=s.max_upload_size)
        self.publisher.check_fields(content_type=content_type, description=description)
        lifetime = self.lifecycle.lifetime(caller.owner, expires_in)
        owner = caller.owner
        missing = await self._lacking(owner, manifest)
        now = self.clock()
        upload = ChunkedUpload(
            id=new_upload_id(),
            owner=owner,
            manifest=manifest,
            missing=tuple(missing),
            created_at=now,
            expires_at=now + float(s.session_ttl),
            name=name,
            content_type=content_type,
            role=role.value if role else None,
            description=description,
            lifetime=lifetime,
        )
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
        if self.clock() >= upload.expires_at and upload.state == "open":
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
        chunks = upload.manifest.chunks
        if count < 1 or index < 0 or index + count > len(chunks):
            raise ChunkNotInManifest(
                f"chunks {index}..{index + count - 1} are not in the manifest of {uid} (0..{len(chunks) - 1})",
                chunks=len(chunks),
            )
        run = chunks[index : index + count]
        total = sum(c.length for c in run)
        if total > MAX_RUN_BYTES:
            raise TooLarge(f"a run of chunks is at most {MAX_RUN_BYTES} bytes; this one is {total}")
        if length is not None and length != total:
            raise ContentLengthMismatch(f"chunks {index}..{index + count - 1} are {total} bytes, the body {length}")
        owner = upload.owner
        await self.lifecycle.usage.count_bytes(owner, total)  # counted before stored: never below what is stored
        stored_chunks = stored_bytes = 0
        gate = asyncio.Semaphore(STORES_IN_FLIGHT)
        stores: list[asyncio.Task[None]] = []

        async def store(sha: str, data: bytes) -> None:
            nonlocal stored_chunks, stored_bytes
            async with gate:
                if await self._store(owner, sha, data):
                    stored_chunks += 1
                    stored_bytes += len(data)

        try:
            buffer = bytearray()
            pieces = body.__aiter__()
            for at, chunk in enumerate(run, start=index):
                while len(buffer) < chunk.length:
                    try:
                        piece = await pieces.__anext__()
                    except StopAsyncIteration:
                        raise ContentLengthMismatch(
                            f"the body ended inside chunk {at}; {total} bytes were due"
                        ) from None
                    buffer += piece
                data = bytes(buffer[: chunk.length])
                del buffer[: chunk.length]
                digest = await asyncio.to_thread(_sha_hex, data)
                if digest != chunk.sha256:
                    raise ChunkChecksumMismatch(
                        f"chunk at offset {chunk.offset} does not hash to the manifest's SHA-256; it was not stored",
                        offset=chunk.offset,
                        expected=chunk.sha256,
                        actual=digest,
                    )
                stores.append(asyncio.create_task(store(chunk.sha256, data)))
            if buffer:
                raise ContentLengthMismatch(f"the body is longer than the {total} bytes of its chunks")
            async for piece in pieces:
                if piece:
                    raise ContentLengthMismatch(f"the body is longer than the {total} bytes of its chunks")
            await asyncio.gather(*stores)
        finally:
            # the verified chunks already on their way are stored whatever happens to the rest of the run
            await asyncio.gather(*stores, return_exceptions=True)
            if total - stored_bytes:
                try:
                    await self.lifecycle.usage.refund(owner, total - stored_bytes, files=0)
                except TransferError as exc:
                    log.warning("%d bytes of %s stay counted: %s", total - stored_bytes, uid, exc)
        return stored_chunks, stored_bytes

    async def _store(self, owner: str | None, sha: str, data: bytes) -> bool:
        """Keep one verified chunk in ``owner``'s store; False when it is there already."""
        meta = {"owner": owner or "", "stored_at": str(int(self.clock()))}
        try:
            with storage_errors_translated():
                # not flushed: an assembly hashes what it reads and drops a chunk that lost its bytes
                async with self.storage.create(
                    chunk_key(owner, sha), size_hint=len(data), if_absent=True, durable=False
                ) as writer:
                    await writer.write(data)
                    await writer.commit(meta)
        except Conflict:
            return False
        return True

    # -- complete ----------------------------------------------------------------------------------------------

    async def complete(self, uid: str, caller: Grant) -> FileRecord:
        """Check every chunk is stored, verify the whole SHA-256 over them, publish. A completed upload answers its
        file again."""
        async with self.locks.hold(uid):
            upload = await self.load(uid, caller)
            file_id = file_id_for(uid)
            if upload.state == "completed" or await self._published(file_id):
                return await self._record(file_id)
            if self.clock() >= upload.expires_at:
                raise NotFound(f"chunked upload {uid} has expired")
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
            done = ChunkedUpload.from_json({**upload.to_json(), "state": "completed", "file_id": record.id})
            try:
                await write_record(self.storage, upload_key(owner, uid), done.to_json())
            except TransferError as exc:  # the file is published; the sweep ends the record at its expiry
                log.warning("chunked upload %s published %s but its record stays open: %s", uid, record.id, exc)
            self._uploads.pop(uid, None)
            await self.open_uploads.release(owner, uid)
            return record

    async def _assemble(self, upload: ChunkedUpload) -> FileRecord:
        """Hash the chunks in order, compare with the manifest, publish: by compose where it may, else streamed.
        A chunk that is not stored raises ChunksMissing or NotFound (the caller finds them all)."""
        owner, manifest = upload.owner, upload.manifest
        compose = self._composer(manifest)
        if compose is None:
            return await self._stream_publish(upload)
        sha_hex, head = await self._hash_chunks(owner, manifest)
        self._require_checksum(manifest, sha_hex)
        keys = [chunk_key(owner, c.sha256) for c in manifest.chunks]

        async def place(record: FileRecord) -> None:
            with storage_errors_translated():
                await compose.compose(object_key(record.id), keys, record.to_metadata())

        return await self._publish(upload, sha_hex, head, place)

    def _composer(self, manifest: Manifest) -> SupportsCompose | None:
        """The backend's compose, where part sizes allow it: a filesystem backend (copy_file_range takes any
        length) or chunks that all reach S3's part minimum (but the last)."""
        compose = capable(self.storage, Capability.COMPOSE, SupportsCompose)
        if compose is None or not manifest.chunks:
            return None
        if Capability.WRITE_AT_OFFSET in self.storage.capabilities:
            return compose
        if all(c.length >= MIN_COMPOSE_PART for c in manifest.chunks[:-1]):
            return compose
        return None

    def _require_checksum(self, manifest: Manifest, sha_hex: str) -> None:
        if sha_hex != manifest.sha256:
            raise ChecksumMismatch(
                "the chunks hash to another SHA-256 than the manifest declares; nothing was published",
                expected="sha256:" + manifest.sha256,
                actual="sha256:" + sha_hex,
            )

    async def _chunks_in_order(self, owner: str | None, manifest: Manifest) -> AsyncIterator[bytes]:
        """The bytes of every chunk of ``manifest`` in order, READ_AHEAD chunks fetched ahead. A chunk that is
        gone, or whose bytes are not what its name says (lost in a crash), is dropped and reported missing."""

        async def fetch(i: int) -> bytes:
            chunk = manifest.chunks[i]
            try:
                with storage_errors_translated():
                    async with await self.storage.open(chunk_key(owner, chunk.sha256)) as reader:
                        data = b"".join([piece async for piece in reader.read()])
            except NotFound:
                raise ChunksMissing(f"chunk {i} is no longer stored; send it and complete again", missing=[i]) from None
            if len(data) != chunk.length:
                await self._drop_chunk(owner, chunk.sha256)
                raise ChunksMissing(f"chunk {i} was damaged in storage; send it and complete again", missing=[i])
            return data

        pending: list[asyncio.Task[bytes]] = []
        n = len(manifest.chunks)
        try:
            for i in range(n):
                while len(pending) < READ_AHEAD and i + len(pending) < n:
                    pending.append(asyncio.create_task(fetch(i + len(pending))))
                yield await pending.pop(0)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _hash_chunks(self, owner: str | None, manifest: Manifest) -> tuple[str, bytes]:
        """SHA-256 of the chunks in order and the file's first bytes (hashed off the event loop, in batches)."""
        sha = hashlib.sha256()
        head = b""
        batch: list[bytes] = []
        batched = 0

        def update(pieces: list[bytes]) -> None:
            for piece in pieces:
                sha.update(piece)

        async for data in self._chunks_in_order(owner, manifest):
            if len(head) < SNIFF_BYTES:
                head += data[: SNIFF_BYTES - len(head)]
            batch.append(data)
            batched += len(data)
            if batched >= 4 << 20:
                await asyncio.to_thread(update, batch)
                batch, batched = [], 0
        await asyncio.to_thread(update, batch)
        digest = sha.hexdigest()
        if digest != manifest.sha256:
            await self._drop_damaged(owner, manifest)
        return digest, head

    async def _drop_damaged(self, owner: str | None, manifest: Manifest) -> None:
        """After a whole-file mismatch: re-hash each distinct chunk; one whose bytes are not its name (lost in a
        crash) is removed and reported missing, so the client sends it again. None: the manifest itself lies."""
        damaged: list[int] = []
        seen: set[str] = set()
        for i, chunk in enumerate(manifest.chunks):
            if chunk.sha256 in seen:
                continue
            seen.add(chunk.sha256)
            try:
                with storage_errors_translated():
                    async with await self.storage.open(chunk_key(owner, chunk.sha256)) as reader:
                        data = b"".join([piece async for piece in reader.read()])
            except NotFound:
                damaged.append(i)
                continue
            if await asyncio.to_thread(_sha_hex, data) != chunk.sha256:
                await self._drop_chunk(owner, chunk.sha256)
                damaged.append(i)
        if damaged:
            raise ChunksMissing(
                f"{len(damaged)} stored chunk(s) were damaged and removed; send them and complete again",
                missing=damaged[:10_000],
            )

    async def _drop_chunk(self, owner: str | None, sha: str) -> None:
        try:
            info = await self.storage.stat(chunk_key(owner, sha))
            await self._remove_chunk(owner, sha, info.size)
        except (ObjectNotFound, TransferError):
            pass

    async def _stream_publish(self, upload: ChunkedUpload) -> FileRecord:
        """Assemble by streaming the chunks into a new object, hashed on the way, published only if it matches."""
        manifest, owner = upload.manifest, upload.owner
        sha = hashlib.sha256()
        head = b""
        with storage_errors_translated():
            async with self.storage.create(object_key(file_id_for(upload.id)), size_hint=manifest.size) as writer:
                async for data in self._chunks_in_order(owner, manifest):
                    if len(head) < SNIFF_BYTES:
                        head += data[: SNIFF_BYTES - len(head)]
                    if len(data) >= 1 << 20:
                        await asyncio.to_thread(sha.update, data)
                    else:
                        sha.update(data)  # a chunk of the usual size: less than the thread hop
                    await writer.write(data)
                digest = sha.hexdigest()
                if digest != manifest.sha256:
                    await self._drop_damaged(owner, manifest)
                self._require_checksum(manifest, digest)

                async def place(record: FileRecord) -> None:
                    await writer.commit(record.to_metadata())

                return await self._publish(upload, digest, head, place)

    async def _publish(
        self, upload: ChunkedUpload, sha_hex: str, head: bytes, place: Callable[[FileRecord], Any]
    ) -> FileRecord:
        candidate = Candidate(
            owner=upload.owner,
            upload_id=upload.id,
            size=upload.manifest.size,
            sha256=sha_hex,
            head=head,
            source="chunked",
            name=upload.name,
            content_type=upload.content_type,
            role=FileRole(upload.role) if upload.role else None,
            description=upload.description,
            lifetime=upload.lifetime,
            republishable_until=upload.expires_at,
        )
        return await self.publisher.publish(candidate, place)

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

    # -- sweep -------------------------------------------------------------------------------------------------

    async def _remove_chunk(self, owner: str | None, sha: str, nbytes: int) -> bool:
        """Remove one chunk and uncount its bytes, exactly once whatever the number of sweepers."""
        claim = "chunk-" + sha
        usage = self.lifecycle.usage
        if not await usage.claim_removal(owner, claim, nbytes):
            return False
        try:
            with storage_errors_translated():
                await self.storage.delete(chunk_key(owner, sha))
        except BaseException:
            await usage.unclaim(owner, claim)
            raise
        await usage.removed(owner, claim, nbytes, files=0)
        return True

    async def sweep_chunks(self) -> int:
        """Drop ended upload records and the manifests of files that are gone; remove the chunks no live file or
        open upload names once they are older than CHUNK_GRACE. Returns how many chunks were removed."""
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
            for sha in kinds.get("chunks", []):
                if sha in marked:
                    continue
                try:
                    with storage_errors_translated():
                        info = await self.storage.stat(base + "chunks/" + sha)
                except NotFound:
                    continue
                if now - float(info.metadata.get("stored_at", "0") or 0) < CHUNK_GRACE:
                    continue
                owner = info.metadata.get("owner") or None
                if key_folder(owner) != base:
                    continue  # not written by this service for that key: left alone
                if await self._remove_chunk(owner, sha, info.size):
                    removed += 1
        return removed


def manifest_document(manifest: Manifest) -> dict[str, Any]:
    """The JSON a reader gets for a file's chunks."""
    return {**manifest.to_json(), "chunking": dict(CHUNKING)}
