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
                  published through the one upload lifecycle like every other upload (a completion on one replica
                  racing an abort on another: one outcome); the packs are read range by range,
                  hashed on the way (the whole-file SHA-256 needs every byte read), and a run of chunks lying back
                  to back in one pack (the old version's object, for most of a new version) is copied into the
                  new object server-side — local ``copy_file_range``, S3 ``UploadPartCopy`` of the version read —
                  where the writer's rules allow (S3: runs and the parts between them of at least 5 MiB), the
                  rest written; the manifest kept (``cdc/<key>/manifests/``) so that a reader can fetch only the
                  chunks it lacks (:meth:`ChunkService.manifest`)

The chunks themselves, their index, packs and manifests are the per-key chunk store's
(:mod:`transfer.service.uploads.chunkstore`); assembling a file from them is :mod:`~.chunkassembly`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any, Self

from transfer.core.auth import Grant
from transfer.core.ids import new_id
from transfer.core.uploads.chunking import CHUNKING, MAX_CHUNK, MAX_CHUNKS, Manifest, parse_manifest
from transfer.core.uploads.state import FileIntent, UploadRecord, UploadState, legacy_intent
from transfer.errors import (
    ChunkChecksumMismatch,
    ChunkNotInManifest,
    ChunksMissing,
    ContentLengthMismatch,
    InvalidRequest,
    NotFound,
    SessionCompleted,
    TransferError,
    storage_errors_translated,
)
from transfer.service import cpus
from transfer.service.accounting.slots import OpenSlots
from transfer.service.files.publisher import SNIFF_BYTES, file_id_for
from transfer.service.files.records import FileRecord, object_key
from transfer.service.uploads.chunkassembly import assemble, drop_gone_packs, plan_runs
from transfer.service.uploads.chunkbodies import _check_batch, _received_ahead, _whole_chunks
from transfer.service.uploads.chunkstore import (
    FILE_PACK,
    MAX_PROBE,
    MAX_RUN_BYTES,
    PREFIX,
    ChunkStore,
    Located,
    key_folder,
    require_checksum,
)
from transfer.service.uploads.lifecycle import UploadKind, UploadLifecycle

log = logging.getLogger("transfer.chunks")

UPLOAD_CACHE = 1024  # upload records kept per process for chunk PUTs (their fields never change while open)


def new_upload_id() -> str:
    """A fresh chunked-upload id (``c_`` and 128 random bits)."""
    return new_id("c_")


def upload_key(uid: str, owner: str | None) -> str:
    """The record of ``owner``'s chunked upload ``uid`` (in the key's own folder of the chunk store)."""
    return f"{key_folder(owner)}uploads/{uid}.json"


def _listed(key: str) -> tuple[str, bool] | None:
    parts = key.split("/")
    if len(parts) == 4 and parts[2] == "uploads" and parts[3].endswith(".json"):
        return parts[3].removesuffix(".json"), True
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkedUpload(UploadRecord):
    """One chunked upload: the shared fields of every upload, its manifest and the chunks its key lacked."""

    manifest: Manifest
    missing: tuple[int, ...] = ()  # indexes of the chunks the key lacked when the upload was created

    def to_json(self) -> dict[str, Any]:
        """The upload's record (JSON), as stored."""
        return {**self.base_json(), "manifest": self.manifest.compact(), "missing": list(self.missing)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        """The upload as read back from its record (one written before intents were kept whole: its flat fields)."""
        fields = cls.base_fields(doc)
        if "intent" not in doc:
            fields["intent"] = legacy_intent(doc)
        return cls(
            **fields,
            manifest=Manifest.from_compact(doc["manifest"]),
            missing=tuple(int(i) for i in doc.get("missing", ())),
        )


class ChunkService:
    """Chunked deduplicating uploads (module text): the door of the one upload lifecycle whose parts are the
    chunks of its key's chunk store (:attr:`store`)."""

    def __init__(
        self,
        store: ChunkStore,
        lifecycle: UploadLifecycle,
        slots: OpenSlots,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.files = store.files
        self.settings = store.settings
        self.lifecycle = lifecycle
        self.clock = clock
        self.kind = lifecycle.register(
            UploadKind(
                name="chunked",
                noun="chunked upload",
                prefix="c",
                decode=ChunkedUpload.from_json,
                encode=ChunkedUpload.to_json,
                key=upload_key,
                listing=PREFIX,
                listed=_listed,
                slots=slots,
                discard=self._discard,
            )
        )
        self._uploads: dict[str, ChunkedUpload] = {}

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

    async def close(self) -> None:
        """Stop the store's checks left for later."""
        await self.store.close()

    # -- create ------------------------------------------------------------------------------------------------

    async def create(self, manifest_doc: Any, caller: Grant, *, intent: FileIntent) -> ChunkedUpload:
        """A new chunked upload of the file ``manifest_doc`` describes, owned by the caller's key; its size is
        reserved in the key's quota (QuotaExceeded before anything is stored). ``missing``: what to send. A file
        whose whole content (SHA-256 and size) the key (or its sharing group) stores already is published at once,
        sharing those bytes: the upload is born completed, nothing is missing. Its chunk list was not checked
        against any bytes: it becomes the file's manifest (for resolvers with a cache) only once checked against
        the shared bytes after the answer, as an index given with ``respond-async`` is (with no room for a check,
        never: the file then resolves whole)."""
        s = self.settings
        manifest = parse_manifest(manifest_doc, max_chunks=MAX_CHUNKS, max_size=s.max_upload_size)
        owner = caller.owner
        now = self.clock()
        upload = ChunkedUpload(
            id=new_upload_id(),
            owner=owner,
            created_at=now,
            expires_at=now + float(s.session_ttl),
            intent=intent,
            manifest=manifest,
        )

        async def lacking(upload: ChunkedUpload) -> ChunkedUpload:
            return replace(upload, missing=tuple(await self.store.lacking(owner, manifest)))

        made = await self.lifecycle.open(
            self.kind, upload, reserve=manifest.size, known=(manifest.sha256, manifest.size), prepare=lacking
        )
        if made.state is UploadState.COMPLETED and made.file_id is not None:
            self.store.check_later(await self.store.record(made.file_id), manifest)
        else:
            self._remember(made)
        return made

    def _remember(self, upload: ChunkedUpload) -> None:
        while len(self._uploads) >= UPLOAD_CACHE:
            self._uploads.pop(next(iter(self._uploads)))
        self._uploads[upload.id] = upload

    async def load(self, uid: str, caller: Grant) -> ChunkedUpload:
        """The caller's upload ``uid`` (NotFound for any other key's, as for an unknown id: the record is looked
        for in the caller's own folder)."""
        upload = await self.lifecycle.load(self.kind, uid, caller)
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
        if upload.state is UploadState.COMPLETED:  # its file is published (perhaps at its birth): nothing to store
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
        positions = list(range(index, index + count))
        return await self.store.put_run(upload.owner, upload.manifest, positions, body, length, upload_id=uid)

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
        positions = list(upload.missing[start : start + count])
        return await self.store.put_run(upload.owner, upload.manifest, positions, body, length, upload_id=uid)

    # -- complete ----------------------------------------------------------------------------------------------

    async def _completable(self, uid: str, caller: Grant) -> ChunkedUpload:
        """Upload ``uid`` (the caller's); NotFound once it has expired unpublished."""
        upload = await self.load(uid, caller)
        if upload.state is not UploadState.COMPLETED and self.clock() >= upload.expires_at:
            if await self.lifecycle.published(upload) is None:
                raise NotFound(f"chunked upload {uid} has expired")
        return upload

    async def _publish(
        self, upload: ChunkedUpload, sha_hex: str, head: bytes, place: Callable[[FileRecord], Any]
    ) -> FileRecord:
        candidate = self.lifecycle.candidate(
            upload, size=upload.manifest.size, sha256=sha_hex, head=head, source="chunked"
        )
        return await self.lifecycle.publisher.publish(candidate, place)

    async def complete(self, uid: str, caller: Grant) -> FileRecord:
        """Check every chunk is stored, verify the whole SHA-256 over them, publish (through the lifecycle: one
        outcome across replicas). A completed upload answers its file again."""
        loaded = await self._completable(uid, caller)

        async def publish(upload: ChunkedUpload) -> FileRecord:
            owner, manifest = upload.owner, upload.manifest
            await self.lifecycle.require_room(upload, manifest.size)
            try:
                record = await assemble(
                    self.store,
                    owner,
                    manifest,
                    file_id_for(upload.id),
                    lambda sha, head, place: self._publish(upload, sha, head, place),
                )
            except (ChunksMissing, NotFound) as exc:
                # one chunk is gone (never sent, swept since, or its pack deleted while this file was assembled):
                # the client is told every chunk to send, in one go
                if not isinstance(exc, ChunksMissing):
                    runs = await plan_runs(self.store, owner, manifest)
                    await drop_gone_packs(self.store, owner, manifest, {pack for pack, _, _ in runs})
                lacking = await self.store.lacking(owner, manifest)
                raise ChunksMissing(
                    f"{len(lacking)} chunk(s) of {uid} are not stored; send them and complete again"
                    if lacking
                    else f"chunks of {uid} went while it was assembled; complete again",
                    missing=lacking[:10_000],
                ) from None
            await self.store.keep_manifest(record, manifest)
            return record

        _, record = await self.lifecycle.finish(self.kind, uid, caller, publish=publish, loaded=loaded)
        self._uploads.pop(uid, None)
        return record

    async def put_file(self, uid: str, body: AsyncIterator[bytes], caller: Grant, *, length: int | None) -> FileRecord:
        """Publish upload ``uid`` from ``body``: the whole file, in order (for a file whose key lacks most of its
        chunks). Each chunk is checked against the manifest as it arrives and the whole SHA-256 computed on the
        way, while the bytes are written once, straight into the new file's object; once it matches, the file is
        published and its chunks indexed as ranges of that object (``file:<id>`` packs: no second copy, no extra
        charge; when the file goes, an assembly that needs them finds them gone and asks for them again). Nothing
        is published on any mismatch (422 ``chunk_checksum_mismatch`` / ``checksum_mismatch``, 400
        ``content_length_mismatch``); the upload stays open. A completed upload answers its file again."""
        loaded = await self._completable(uid, caller)

        async def publish(upload: ChunkedUpload) -> FileRecord:
            manifest = upload.manifest
            if length is not None and length != manifest.size:
                raise ContentLengthMismatch(f"the file is {manifest.size} bytes, the body {length}")
            await self.lifecycle.require_room(upload, manifest.size)
            record = await self._write_whole(upload, body)
            placed: dict[str, Located] = {}
            if record.content is None:  # the bytes are this file's own object: index its chunks there
                for chunk in manifest.chunks:
                    placed.setdefault(chunk.sha256, Located(FILE_PACK + record.id, chunk.offset, chunk.length))
            try:
                await asyncio.gather(
                    self.store.index_add(upload.owner, placed), self.store.keep_manifest(record, manifest)
                )
            except TransferError as exc:  # the file is published; its next version sends these chunks again
                log.warning("chunks of %s were not indexed: %s", record.id, exc)
            return record

        _, record = await self.lifecycle.finish(self.kind, uid, caller, publish=publish, loaded=loaded)
        self._uploads.pop(uid, None)
        return record

    async def _write_whole(self, upload: ChunkedUpload, body: AsyncIterator[bytes]) -> FileRecord:
        """Write ``body`` (the whole file) into the new file's object, each batch of chunks checked (a thread) while
        the last one is written, as the plain upload does; published only if the whole SHA-256 matches."""
        manifest = upload.manifest
        sha = hashlib.sha256()
        head = b""
        with storage_errors_translated():
            storage = self.files.storage
            async with storage.create(object_key(file_id_for(upload.id)), size_hint=manifest.size) as writer:
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
                require_checksum(manifest, digest)

                async def place(record: FileRecord) -> None:
                    await writer.commit(record.to_metadata())

                return await self._publish(upload, digest, head, place)

    async def abort(self, uid: str, caller: Grant) -> None:
        """End an open upload without a file: its reservation goes; its chunks stay for the grace (a retry may
        use them)."""
        upload = await self.load(uid, caller)
        if upload.state is UploadState.COMPLETED:
            raise InvalidRequest(f"chunked upload {uid} is complete; delete its file instead")
        await self.lifecycle.abort(self.kind, uid, caller)

    async def _discard(self, upload: ChunkedUpload) -> None:
        """What an ended upload holds beside its record: nothing of its own (its chunks are its key's, kept for
        the grace); this process forgets it."""
        self._uploads.pop(upload.id, None)
