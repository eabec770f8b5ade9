"""Chunked upload sessions: create, put chunk (any order, in parallel, verified), status, complete, abort, expiry,
and reading chunks — while the upload is still going on (live) or after it completed.

Everything lives in the storage backend, so a restarted process or another replica carries on:

    sessions/<id>/session.json        the Session record (rewritten on completion, abort, expiry)
    sessions/<id>/chunks/<index:08d>  one chunk, created if-absent (a second writer gets ObjectExists), with its
                                      xxh3-128 (and SHA-256 when the client sent one) in the object's metadata

The whole file's SHA-256 is computed by a per-process hasher that follows the contiguous prefix of stored chunks
(re-reading each chunk once, in the background, as the prefix grows); after a restart it starts again from chunk 0.
Completion composes the chunks server-side (COMPOSE) into an ordinary stored file and deletes them.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import xxhash

from storage.base import Capability, ObjectReader, Storage
from storage.errors import ObjectExists, StorageError
from transfer.core.auth import TRUSTED, Grant
from transfer.core.content import ContentEncoding, FileRole, checksum_hex
from transfer.core.mime import MIME_OCTET_STREAM, require_media_type
from transfer.core.naming import sanitize_filename, sniff_content_type
from transfer.core.sessions import Session, SessionState, compact_ranges, plan_chunk_size
from transfer.errors import (
    ChecksumMismatch,
    ChunkChecksumMismatch,
    ChunkConflict,
    ChunkLengthMismatch,
    ChunkNotReady,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    SessionIncomplete,
    TooLarge,
    from_storage_error,
    storage_errors_translated,
)
from transfer.service.documents import publish_composed, read_document, write_document
from transfer.service.ingest import SNIFF_BYTES
from transfer.service.lifecycle import Lifecycle
from transfer.service.quota import SessionQuota
from transfer.service.records import FileRecord, object_key
from transfer.settings import Settings

MiB = 1 << 20
POLL_SECONDS = 0.1


def new_session_id() -> str:
    return "s_" + secrets.token_hex(16)


def is_session_id(value: str) -> bool:
    return value.startswith("s_") and len(value) == 34 and all(c in "0123456789abcdef" for c in value[2:])


def session_key(sid: str) -> str:
    return f"sessions/{sid}/session.json"


def chunk_key(sid: str, index: int) -> str:
    return f"sessions/{sid}/chunks/{index:08d}"


@dataclass(frozen=True, slots=True)
class ChunkDigest:
    """What a chunk PUT declares: ``xxh3-128:<32 hex>`` or ``sha256:<64 hex>``."""

    algorithm: str  # "xxh3-128" or "sha256"
    hex: str

    @classmethod
    def parse(cls, value: str) -> ChunkDigest:
        algorithm, _, digest = value.strip().partition(":")
        algorithm = algorithm.lower()
        lengths = {"xxh3-128": 32, "sha256": 64, "sha-256": 64}
        digest = digest.strip().lower()
        if (
            algorithm not in lengths
            or len(digest) != lengths[algorithm]
            or not all(c in "0123456789abcdef" for c in digest)
        ):
            raise InvalidRequest("Chunk-Checksum must be 'xxh3-128:<32 hex>' or 'sha256:<64 hex>'")
        return cls("sha256" if algorithm.startswith("sha") else "xxh3-128", digest)


@dataclass(frozen=True, slots=True)
class ChunkReceipt:
    index: int
    size: int
    xxh3: str
    duplicate: bool


class _PrefixHasher:
    """SHA-256 of the contiguous prefix of stored chunks, advanced as chunks arrive."""

    def __init__(self) -> None:
        self.next_index = 0
        self.sha = hashlib.sha256()
        self.lock = asyncio.Lock()


class SessionService:
    """Chunked sessions over one storage backend; completion hands the file to the file layer's records."""

    def __init__(
        self,
        storage: Storage,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        quota: SessionQuota | None = None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.lifecycle = lifecycle or Lifecycle(storage, settings, clock=clock)
        self.quota = quota or SessionQuota(storage, settings.max_open_sessions_per_key)
        self.quota.register(is_session_id, self.is_open)
        self._hashers: dict[str, _PrefixHasher] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._arrivals: dict[str, asyncio.Event] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- records -------------------------------------------------------------------------------------------------

    async def _save(self, session: Session, *, new: bool = False) -> None:
        await write_document(self.storage, session_key(session.id), session.to_json(), if_absent=new)

    async def load(self, sid: str, caller: Grant) -> Session:
        """The session, if the caller may see it (its own; any for admin); NotFound otherwise, whether or not it
        exists. Readers holding a signed chunk URL act as TRUSTED: the signature is their authority."""
        if not is_session_id(sid):
            raise NotFound(f"no session {sid!r}")
        try:
            session = Session.from_json(await read_document(self.storage, session_key(sid)))
        except NotFound:
            raise NotFound(f"no session {sid!r}") from None
        if not caller.sees(session.owner):
            raise NotFound(f"no session {sid!r}")
        return session

    def _lock(self, sid: str) -> asyncio.Lock:
        return self._locks.setdefault(sid, asyncio.Lock())

    def _min_chunk(self) -> int:
        # S3 composes with UploadPartCopy: every part but the last must be at least 5 MiB
        return 5 * MiB if Capability.MULTIPART in self.storage.capabilities else 64 << 10

    # -- operations ----------------------------------------------------------------------------------------------

    async def create(
        self,
        *,
        name: str | None,
        content_type: str | None,
        size: int | None,
        chunk_size: int | None,
        checksum: str | None,
        ttl: int | None,
        role: FileRole | None = None,
        description: str | None = None,
        owner: str | None = None,
        expires_in: int | None = None,
    ) -> Session:
        """Open a session; ``owner`` (an API key name) counts it against that key's open-session limit and, for
        a declared ``size``, its byte quota; ``expires_in``: the lifetime of the file it makes."""
        s = self.settings
        file_ttl = self.lifecycle.lifetime(owner, expires_in)
        if content_type is not None:
            require_media_type(content_type)  # every front door: REST, TP, MCP
        try:
            declared = None if checksum is None else "sha256:" + checksum_hex(checksum)
        except ValueError as exc:  # TP passes the envelope's string as it came
            raise InvalidRequest(f"checksum: {exc}", field="checksum") from None
        if size is not None and size > s.max_upload_size:
            raise TooLarge(f"size exceeds the limit of {s.max_upload_size} bytes", limit=s.max_upload_size)
        cs = plan_chunk_size(
            chunk_size,
            default=max(s.session_chunk_size, self._min_chunk()),
            minimum=self._min_chunk(),
            maximum=s.session_max_chunk_size,
        )
        now = self.clock()
        session = Session(
            id=new_session_id(),
            name=sanitize_filename(name, default="upload"),
            content_type=content_type,
            size=size,
            chunk_size=cs,
            created_at=now,
            expires_at=now + min(ttl or s.session_ttl, s.session_max_ttl),
            checksum=declared,
            role=role.value if role else None,
            description=description,
            owner=owner,
            max_size=s.max_upload_size,
            file_ttl=file_ttl,
        )
        await self.lifecycle.admit(owner, session.id, size, session.expires_at)
        try:
            async with self.quota.claim(owner, session.id):
                await self._save(session, new=True)
        except BaseException:
            await self.lifecycle.release_after_failure(owner, session.id)
            raise
        return session

    async def is_open(self, sid: str) -> bool:
        try:
            session = await self.load(sid, TRUSTED)
        except NotFound:
            return False
        return session.state_at(self.clock()) is SessionState.OPEN

    async def put_chunk(
        self,
        sid: str,
        index: int,
        body: AsyncIterator[bytes],
        digest: ChunkDigest,
        declared_length: int | None,
        caller: Grant,
    ) -> ChunkReceipt:
        """Store chunk ``index`` if its length and checksum are right. The same bytes again: a no-op; other bytes
        for a stored chunk: ChunkConflict."""
        session = await self.load(sid, caller)
        now = self.clock()
        expected = session.expected_length(index)
        limit = session.chunk_size if expected is None else expected
        if declared_length is not None:
            session.check_length(index, declared_length)
        if session.size is None:  # no reservation to hold it: the quota bounds where its chunks may reach
            await self._require_room(session, index * session.chunk_size + (declared_length or limit))
        try:
            session.require_open(now)
        except Exception:
            # a completed session still answers a repeated chunk with the same bytes as a no-op
            if session.state is not SessionState.COMPLETED or index >= len(session.chunk_digests):
                raise
        x3 = xxhash.xxh3_128()
        sha = hashlib.sha256() if digest.algorithm == "sha256" else None
        size = 0
        key = chunk_key(sid, index)
        try:
            # not flushed to disk one by one: completion re-reads every chunk and checks its xxh3 first
            async with self.storage.create(key, size_hint=limit, if_absent=True, durable=False) as writer:
                async for piece in body:
                    size += len(piece)
                    if size > limit:
                        raise ChunkLengthMismatch(f"chunk {index} is longer than {limit} bytes", expected=limit)
                    x3.update(piece)
                    if sha is not None:
                        sha.update(piece)
                    await writer.write(piece)
                session.check_length(index, size)
                actual = sha.hexdigest() if sha is not None else x3.hexdigest()
                if actual != digest.hex:
                    raise ChunkChecksumMismatch(
                        f"chunk {index}: {digest.algorithm} of the received bytes is {actual}",
                        expected=digest.hex,
                        actual=actual,
                    )
                if session.state is SessionState.COMPLETED:
                    raise ObjectExists(key)  # compare with what was stored
                await writer.commit({"xxh3": x3.hexdigest(), "sha256": sha.hexdigest() if sha else ""})
        except ObjectExists:
            stored = await self._stored_digest(session, index)
            if stored != x3.hexdigest():
                raise ChunkConflict(f"chunk {index} is already stored with other bytes", stored_xxh3=stored) from None
            return ChunkReceipt(index, size, stored, duplicate=True)
        except StorageError as exc:
            raise from_storage_error(exc) from exc
        self._arrived(sid)
        self._spawn(self._advance(session))
        return ChunkReceipt(index, size, x3.hexdigest(), duplicate=False)

    async def _stored_digest(self, session: Session, index: int) -> str:
        if session.state is SessionState.COMPLETED:
            return session.chunk_digests[index]
        with storage_errors_translated():
            info = await self.storage.stat(chunk_key(session.id, index))
        return info.metadata.get("xxh3", "")

    def _arrived(self, sid: str) -> None:
        event = self._arrivals.pop(sid, None)
        if event is not None:
            event.set()

    async def wait_for_change(self, sid: str, timeout: float) -> None:
        """Return when a chunk arrives, or the session completes or ends, in this process; or after ``timeout``."""
        event = self._arrivals.setdefault(sid, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout=timeout)
        except TimeoutError:
            pass

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stored_chunks(self, sid: str) -> dict[int, int]:
        """index -> length of every stored chunk."""
        out: dict[int, int] = {}
        prefix = f"sessions/{sid}/chunks/"
        with storage_errors_translated():
            async for info in self.storage.list(prefix):
                out[int(info.key[len(prefix) :])] = info.size
        return out

    async def status(self, sid: str, caller: Grant) -> dict[str, Any]:
        """What is stored, what is missing, and the session's state: enough to resume with no local state."""
        session = await self.load(sid, caller)
        state = session.state_at(self.clock())
        stored = (
            {i: 0 for i in range(len(session.chunk_digests))}
            if state is SessionState.COMPLETED
            else await self.stored_chunks(sid)
        )
        total = session.total_chunks
        received = session.size if state is SessionState.COMPLETED else sum(stored.values())
        doc: dict[str, Any] = {
            "streaming_session_id": session.id,
            "state": state.value,
            "name": session.name,
            "size": session.size,
            "chunk_size": session.chunk_size,
            "total_chunks": total,
            "stored": compact_ranges(stored),
            "stored_count": len(stored),
            "bytes_received": received,
            "expires_at": _timestamp(session.expires_at),
            "checksum": session.checksum,
        }
        if total is not None:
            doc["missing"] = compact_ranges(i for i in range(total) if i not in stored)
        if session.file_id:
            doc["file_id"] = session.file_id
        return doc

    async def _advance(self, session: Session) -> _PrefixHasher:
        """Hash stored chunks in order from where this process's hasher stopped."""
        hasher = self._hashers.setdefault(session.id, _PrefixHasher())
        async with hasher.lock:
            while True:
                try:
                    with storage_errors_translated():
                        reader = await self.storage.open(chunk_key(session.id, hasher.next_index))
                except NotFound:
                    return hasher
                check = xxhash.xxh3_128()
                staged = hasher.sha.copy()
                async with reader:
                    async for piece in reader.read():
                        check.update(piece)
                        await asyncio.to_thread(staged.update, piece)
                if check.hexdigest() != reader.info.metadata.get("xxh3"):
                    # what was acknowledged is not what is stored (e.g. lost in a machine crash): the chunk is
                    # dropped, status lists it as missing, and the client sends it again
                    with storage_errors_translated():
                        await self.storage.delete(chunk_key(session.id, hasher.next_index))
                    return hasher
                hasher.sha = staged
                hasher.next_index += 1

    async def _require_room(self, session: Session, end: int) -> None:
        room = await self.lifecycle.room_for(session.owner, session.id)
        if room is not None and end > room:
            raise QuotaExceeded(
                f"chunks up to byte {end} go beyond the {room} bytes this key's quota has room for", room=room
            )

    async def complete(self, sid: str, caller: Grant, declared_size: int | None = None) -> tuple[Session, FileRecord]:
        """Verify and publish the whole file; the session becomes COMPLETED with the new file's id, which belongs
        to the session's owner."""
        async with self._lock(sid):
            session = await self.load(sid, caller)
            session.require_open(self.clock())
            stored = await self.stored_chunks(sid)
            size, total = session.completion_plan(stored, declared_size)
            hasher = await self._advance(session)
            if hasher.next_index < total:  # dropped by its xxh3 check, or deleted under us
                raise SessionIncomplete(
                    f"chunk {hasher.next_index} is not stored intact; send it again",
                    missing=[[hasher.next_index, hasher.next_index]],
                )
            sha_hex = hasher.sha.hexdigest()
            if hasher.next_index > total:
                raise InvalidRequest("more chunks than the declared size allows")
            if session.checksum is not None and checksum_hex(session.checksum) != sha_hex:
                raise ChecksumMismatch(
                    "SHA-256 of the assembled chunks does not match the session's checksum",
                    expected=session.checksum,
                    actual="sha256:" + sha_hex,
                )
            digests = []
            for i in range(total):
                with storage_errors_translated():
                    digests.append((await self.storage.stat(chunk_key(sid, i))).metadata.get("xxh3", ""))
            # the file id follows from the session id: two replicas completing at once compose the same object
            # and write the same record, so there is one outcome and no orphan
            file_id = "f_" + sid[2:]
            content_type = session.content_type
            if content_type is None:  # none declared at creation: what the first bytes show, as for other uploads
                content_type = await self._sniffed_type(sid, session.name) if total else MIME_OCTET_STREAM
            record = FileRecord(
                id=file_id,
                name=session.name,
                content_type=content_type,
                size=size,
                sha256=sha_hex,
                encoding=ContentEncoding.NONE,
                encoded_size=size,
                encoded_sha256=sha_hex,
                created_at=(created := datetime.fromtimestamp(self.clock(), UTC).replace(microsecond=0)),
                role=FileRole(session.role) if session.role else None,
                description=session.description,
                owner=session.owner,
                expires_at=self.lifecycle.expiry(created, session.file_ttl),
            )
            async with self.lifecycle.publishing(record, sid):
                await publish_composed(self.storage, record, [chunk_key(sid, i) for i in range(total)])
            done = session.with_changes(state=SessionState.COMPLETED, file_id=file_id, size=size, chunk_digests=digests)
            await self._save(done)
            await self.quota.release(session.owner, sid)
            self._hashers.pop(sid, None)
            self._arrived(sid)
            self._spawn(self._delete_chunks(sid))
            return done, record

    async def _sniffed_type(self, sid: str, name: str | None) -> str:
        """The media type the start of chunk 0 shows (one bounded ranged read)."""
        head = b""
        with storage_errors_translated():
            reader = await self.storage.open(chunk_key(sid, 0))
            async with reader:
                async for piece in reader.read(0, SNIFF_BYTES):
                    head += piece
        return await asyncio.to_thread(sniff_content_type, head[:SNIFF_BYTES], name)  # a CPU scan: off the loop

    async def _delete_chunks(self, sid: str) -> None:
        for index in list(await self.stored_chunks(sid)):
            with storage_errors_translated():
                await self.storage.delete(chunk_key(sid, index))

    async def abort(self, sid: str, caller: Grant, *, state: SessionState = SessionState.ABORTED) -> None:
        """Abort (or expire) a session: its chunks are deleted; completed sessions cannot be aborted."""
        async with self._lock(sid):
            session = await self.load(sid, caller)
            if session.state is SessionState.COMPLETED:
                session.require_open(self.clock())
            await self._delete_chunks(sid)
            if session.state is SessionState.OPEN:
                await self._save(session.with_changes(state=state))
            await self.quota.release(session.owner, sid)
            await self.lifecycle.release(session.owner, sid)
            self._hashers.pop(sid, None)
            self._arrived(sid)

    async def collect_garbage(self) -> dict[str, int]:
        """Expire open sessions past their time (deleting their chunks) and forget ended sessions a retention
        period after they ended. Driven by the service clock."""
        now = self.clock()
        expired = forgotten = 0
        sids = set()
        with storage_errors_translated():
            async for info in self.storage.list("sessions/"):
                sids.add(info.key.split("/")[1])
        for sid in sids:
            try:
                session = await self.load(sid, TRUSTED)
            except NotFound:  # chunks without a record: left by a crash between deletes
                await self._delete_chunks(sid)
                continue
            if session.state is SessionState.OPEN and session.state_at(now) is SessionState.EXPIRED:
                await self.abort(sid, TRUSTED, state=SessionState.EXPIRED)
                expired += 1
            elif session.state is not SessionState.OPEN and now >= session.expires_at + self.settings.session_retention:
                await self._delete_chunks(sid)
                with storage_errors_translated():
                    await self.storage.delete(session_key(sid))
                forgotten += 1
        return {"expired": expired, "forgotten": forgotten}

    async def open_chunk(self, sid: str, index: int, wait: float) -> tuple[Session, ReaderStream, int, str]:
        """The bytes of chunk ``index`` with its length and xxh3-128; for a session still uploading, waits up to
        ``wait`` seconds for the chunk to arrive (a live read). The caller owns the stream: ``aclose()`` it (or
        use ``async with``) whether or not it iterates it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            session = await self.load(sid, TRUSTED)  # the caller holds a signed URL for this session's chunks
            session.require_readable(self.clock())
            session.check_index(index)  # after completion the size is known, so this bounds the index too
            if session.state is SessionState.COMPLETED:
                assert session.file_id is not None and session.size is not None
                start = index * session.chunk_size
                end = min(start + session.chunk_size, session.size)
                with storage_errors_translated():
                    reader = await self.storage.open(object_key(session.file_id))
                return session, ReaderStream(reader, start, end), end - start, session.chunk_digests[index]
            try:
                with storage_errors_translated():
                    reader = await self.storage.open(chunk_key(sid, index))
                return session, ReaderStream(reader, 0, None), reader.info.size, reader.info.metadata.get("xxh3", "")
            except NotFound:
                pass
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ChunkNotReady(f"chunk {index} has not arrived yet", headers={"retry-after": "1"})
            event = self._arrivals.setdefault(sid, asyncio.Event())
            try:  # woken by an arrival in this process, or polling for one at another replica
                await asyncio.wait_for(event.wait(), timeout=min(POLL_SECONDS * 5, remaining))
            except TimeoutError:
                pass


class ReaderStream:
    """Bytes ``[start, end)`` of an open storage reader, owning it: ``aclose()`` closes the reader whether or not
    iteration ever started. (An async generator wrapping the reader would not: closing a generator that never
    ran does not run its ``finally``, so a HEAD, or a client gone before the first byte, leaked the descriptor.)"""

    def __init__(self, reader: ObjectReader, start: int, end: int | None) -> None:
        self._reader: ObjectReader | None = reader
        self._start = start
        self._end = end

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._reader is None:
            raise RuntimeError("the stream is closed")
        return self._reader.read(self._start, self._end)

    async def aclose(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()

    async def __aenter__(self) -> ReaderStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
