"""Chunked upload sessions: create, put chunk (any order, in parallel, verified), status, complete, abort, expiry,
and reading chunks — while the upload is still going on (live) or after it completed.

The index-addressed view of the upload engine (:mod:`transfer.service.uploads.engine`). Everything lives in the storage
backend, so a restarted process or another replica carries on:

    sessions/<id>/session.json        the Session record: state, expiry, owner and the index of stored chunks
                                      (index -> size, xxh3-128, SHA-256), updated by compare-and-set
    sessions/<id>/chunks/<index:08d>  one chunk, created if-absent (a second writer gets ObjectExists), with its
                                      digests in the object's metadata too (a chunk stored by a process that died
                                      before its record said so is adopted when the client sends it again)

    sessions/<id>/file                on backends with WRITE_AT_OFFSET (local), instead of the chunk objects: one
                                      staged file, preallocated, each chunk written at its offset while its PUT
                                      holds that region, flushed, then recorded; never written again once recorded

Chunk PUT, status, completion and abort read the record; none lists storage. The whole file's SHA-256 is computed
by the engine's prefix hasher that follows the contiguous prefix of stored chunks (re-reading each chunk once, in
the background, as the prefix grows, and checking it against its recorded xxh3-128); after a restart it starts
again from chunk 0. Completion publishes the staged file by a rename (no byte copied), or, with chunk objects,
composes them server-side (COMPOSE; S3: UploadPartCopy) into an ordinary stored file and deletes them.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

import xxhash

from storage.base import Capability, ObjectInfo, ObjectReader, Storage, SupportsWriteAtOffset, capable, rules_of
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import is_id, new_id
from transfer.core.model.content import FileRole, checksum_hex, format_timestamp
from transfer.core.model.naming import sanitize_filename
from transfer.core.uploads.lifetimes import is_expired
from transfer.core.uploads.sessions import Session, SessionState, compact_ranges, plan_chunk_size
from transfer.core.uploads.state import Part, UploadEvent, transition, with_part
from transfer.errors import (
    ChecksumMismatch,
    ChunkChecksumMismatch,
    ChunkConflict,
    ChunkLengthMismatch,
    ChunkNotReady,
    FileExpired,
    InvalidRequest,
    NotFound,
    SessionIncomplete,
    TooLarge,
    TransferError,
    VersionConflict,
    storage_errors_translated,
)
from transfer.service.accounting.slots import SessionQuota
from transfer.service.files.documents import publish_composed
from transfer.service.files.publisher import Candidate, Publisher
from transfer.service.files.records import FileRecord, object_key
from transfer.service.uploads.engine import PartExists, PieceHasher, StoredPart, UploadEngine
from transfer.service.uploads.session_views import chunks_path
from transfer.settings import Settings

MiB = 1 << 20
POLL_SECONDS = 0.1


def new_session_id() -> str:
    """A fresh session id (``s_`` and 128 random bits)."""
    return new_id("s_")


def is_session_id(value: str) -> bool:
    """Whether ``value`` is a session id."""
    return is_id(value, "s_")


def session_key(sid: str) -> str:
    """The storage key of session ``sid``'s record."""
    return f"sessions/{sid}/session.json"


def chunk_key(sid: str, index: int) -> str:
    """The storage key of chunk ``index`` of session ``sid`` (sessions with chunk objects)."""
    return f"sessions/{sid}/chunks/{index:08d}"


def staged_key(sid: str) -> str:
    """The staged object a session's chunks are written into at their offsets (backends with WRITE_AT_OFFSET)."""
    return f"sessions/{sid}/file"


@dataclass(frozen=True, slots=True)
class ChunkDigest:
    """What a chunk PUT declares: ``xxh3-128:<32 hex>`` or ``sha256:<64 hex>``."""

    algorithm: str  # "xxh3-128" or "sha256"
    hex: str

    @classmethod
    def parse(cls, value: str) -> ChunkDigest:
        """A Chunk-Checksum value (InvalidRequest when it is neither form)."""
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
    """What storing one chunk answers: its index, length and xxh3-128, and whether the same bytes were stored
    already."""

    index: int
    size: int
    xxh3: str
    duplicate: bool


class _Duplicate(Exception):
    """A chunk the record already holds: its bytes were hashed, nothing was published."""

    def __init__(self, result: StoredPart) -> None:
        self.result = result


# FileService.check_signed: (method, signed path, query, raw path, the paths it may be) -> None or an error, counted
SignatureCheck = Callable[[str, str, str, bytes | str | None, tuple[str, ...]], None]


def _candidate(session: Session, size: int, sha256: str, head: bytes, source: str) -> Candidate:
    """What a session hands the publisher: its bytes' size, SHA-256 and first bytes, and the file it asked for."""
    return Candidate(
        owner=session.owner,
        upload_id=session.id,
        size=size,
        sha256=sha256,
        head=head,
        source=source,
        name=session.name,
        content_type=session.content_type,
        role=FileRole(session.role) if session.role else None,
        description=session.description,
        lifetime=session.file_ttl,
        republishable_until=session.expires_at,
    )


class SessionService:
    """Chunked sessions over one storage backend; completion hands the file to the file layer's records."""

    def __init__(
        self,
        storage: Storage,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        quota: SessionQuota,
        engine: UploadEngine,
        publisher: Publisher,
        check_signed: SignatureCheck | None = None,
    ) -> None:
        # collaborators come from the composition root (Services.build), shared with every other door
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.publisher = publisher
        self.lifecycle = publisher.lifecycle
        self.quota = quota
        self.quota.register(is_session_id, self.is_open)
        self.engine = engine
        # chunks written at their offsets into one staged file, published by a rename: completion copies nothing
        self.staging = capable(storage, Capability.WRITE_AT_OFFSET, SupportsWriteAtOffset)
        self._check_signed = check_signed
        self._arrivals: dict[str, asyncio.Event] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- records -------------------------------------------------------------------------------------------------

    async def load(self, sid: str, caller: Grant) -> Session:
        """The session, if the caller may see it (its own; any for admin); NotFound otherwise, whether or not it
        exists. Readers holding a signed chunk URL act as TRUSTED: the signature is their authority."""
        if not is_session_id(sid):
            raise NotFound(f"no session {sid!r}")
        try:
            doc, _ = await self.engine.read(session_key(sid))
        except NotFound:
            raise NotFound(f"no session {sid!r}") from None
        session = Session.from_json(doc)
        if not caller.sees(session.owner):
            raise NotFound(f"no session {sid!r}")
        return session

    async def _update(self, sid: str, change: Callable[[Session], Session | None]) -> Session:
        """Change the session's record by compare-and-set (``change`` sees the latest record; None: no change)."""
        return await self.engine.update(session_key(sid), Session.from_json, change, Session.to_json)

    def _min_chunk(self) -> int:
        # chunks are composed into the file: each must be a source the backend composes (S3: 5 MiB)
        return max(64 << 10, rules_of(self.storage).min_compose_part)

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
        self.publisher.check_fields(content_type=content_type, description=description)  # REST, TP, MCP alike
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
            staged=self.staging is not None,
        )
        if declared is not None and size is not None:
            shared = await self._publish_known(session, declared)
            if shared is not None:
                return shared
        await self.lifecycle.admit(owner, session.id, size, session.expires_at)
        try:
            async with self.quota.claim(owner, session.id):
                # the record first: a crash before the staged file exists leaves a session the client never heard
                # of, which expires (and is swept) like any other; a staged file is never without its record
                await self.engine.create(session_key(session.id), session.to_json())
                if self.staging is not None:
                    try:
                        with storage_errors_translated():
                            await self.staging.create_staged(staged_key(session.id), size)
                    except BaseException:
                        await self.engine.delete([session_key(session.id)])
                        raise
        except BaseException:
            await self._discard_staged(session)
            await self.lifecycle.release_after_failure(owner, session.id)
            raise
        return session

    async def _publish_known(self, session: Session, declared: str) -> Session | None:
        """Content the owner's scope already stores (the declared SHA-256 and size): published now as a file of
        its own sharing those bytes (:meth:`Publisher.publish_known`), and the session is born completed: no
        chunk to send, no slot, reservation or staged file held. None: the scope stores no such content."""
        assert session.size is not None
        candidate = _candidate(session, session.size, checksum_hex(declared), b"", "session (shared)")
        record = await self.publisher.publish_known(candidate)
        if record is None:
            return None
        # the chunks' digests are unknown (no byte was read): "" until a reader asks for a chunk (open_chunk)
        done = session.with_changes(
            state=SessionState.COMPLETED,
            file_id=record.id,
            staged=False,
            chunk_digests=[""] * (session.total_chunks or 0),
        )
        await self.engine.create(session_key(session.id), done.to_json())
        return done

    async def is_open(self, sid: str) -> bool:
        """Whether session ``sid`` exists and is open now (the open-session quota asks)."""
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
        """Store chunk ``index`` if its length and checksum are right, and enter it in the session's record. The
        same bytes again: a no-op; other bytes for a stored chunk: ChunkConflict."""
        session = await self.load(sid, caller)
        now = self.clock()
        expected = session.expected_length(index)
        limit = session.chunk_size if expected is None else expected
        if declared_length is not None:
            session.check_length(index, declared_length)
        # a completed session still answers a repeated chunk with the same bytes as a no-op
        repeat = session.state is SessionState.COMPLETED and index < len(session.chunk_digests)
        if not repeat:
            session.after(UploadEvent.PUT_PART, now)
            if session.size is None:  # no reservation to hold it: the quota bounds where its chunks may reach
                await self._require_room(session, index * session.chunk_size + (declared_length or limit))

        def verify(result: StoredPart) -> None:
            session.check_length(index, result.size)
            actual = result.sha256 if digest.algorithm == "sha256" else result.xxh3
            if actual != digest.hex:
                raise ChunkChecksumMismatch(
                    f"chunk {index}: {digest.algorithm} of the received bytes is {actual}",
                    expected=digest.hex,
                    actual=actual,
                )
            if repeat or index in session.parts:
                raise _Duplicate(result)  # compare with what was stored; nothing new is published

        if session.staged:
            return await self._put_staged_chunk(session, index, body, digest, limit, verify, caller)
        key = chunk_key(sid, index)
        try:
            # not flushed to disk one by one: completion re-reads every chunk and checks its xxh3 first
            result = await self.engine.store_part(
                key,
                body,
                limit=limit,
                too_long=lambda n: ChunkLengthMismatch(f"chunk {index} is longer than {limit} bytes", expected=limit),
                size_hint=limit,
                sha256=digest.algorithm == "sha256",
                durable=False,
                verify=verify,
            )
        except _Duplicate as dup:
            known = session.parts.get(index) or Part(dup.result.size, session.chunk_digests[index])
            return await self._repeated(session, index, dup.result, known)
        except PartExists as exists:
            # stored, but not in the record we read: a concurrent PUT of this chunk, or a process that stopped
            # between storing it and recording it; the object's metadata says what it holds
            info = await self._racing_chunk(key, index)
            known = Part(info.size, info.metadata.get("xxh3", ""), info.metadata.get("sha256", ""))
            return await self._repeated(session, index, exists.result, known)
        try:
            updated = await self._record_part(sid, index, result.part())
        except TransferError:  # ended meanwhile (aborted, expired): the chunk it will never use goes now
            await self.engine.delete([key])
            raise
        return self._accepted(sid, index, updated, result.size, result.xxh3)

    async def _racing_chunk(self, key: str, index: int) -> ObjectInfo:
        """The object of a chunk whose conditional create lost. An engine that refuses a conditional write while
        another one of the key is in flight (S3's 409 ConditionalRequestConflict, Ceph) has no object to show yet:
        the winner is still writing it. Wait a little for it; if it has not appeared, the race is lost all the same
        (409 version_conflict: send the chunk again to have it compared), never a 404 for a chunk being stored."""
        for delay in (0.05, 0.1, 0.2, 0.4, 0.8):
            try:
                with storage_errors_translated():
                    return await self.storage.stat(key)
            except NotFound:
                await asyncio.sleep(delay)
        raise VersionConflict(f"chunk {index} is being stored by a concurrent request: send it again to compare")

    async def _put_staged_chunk(
        self,
        session: Session,
        index: int,
        body: AsyncIterator[bytes],
        digest: ChunkDigest,
        limit: int,
        verify: Callable[[StoredPart], None],
        caller: Grant,
    ) -> ChunkReceipt:
        """:meth:`put_chunk` for a staged session: the chunk is written at its offset in the session's staged file
        while holding that region (no other writer, in any process, writes it meanwhile), flushed, and recorded
        before the region is let go. A recorded chunk's bytes are never written again: a repeat is hashed and
        compared, not written, so the bytes the prefix hasher verified are the bytes that get published."""
        assert self.staging is not None
        sid = session.id
        if index in session.parts or session.state is SessionState.COMPLETED:
            return await self._compare_repeat(session, index, body, digest, limit, verify)
        try:
            region = self.staging.write_region(staged_key(sid), index * session.chunk_size, limit)
            with storage_errors_translated():
                await region.__aenter__()
        except NotFound:  # published or discarded since the record was read: its state says why
            fresh = await self.load(sid, caller)
            if index in fresh.parts or fresh.state is SessionState.COMPLETED:
                return await self._compare_repeat(fresh, index, body, digest, limit, verify)
            fresh.after(UploadEvent.PUT_PART, self.clock())  # ended: its refusal
            raise
        try:
            fresh = await self.load(sid, caller)  # holding the region: was the chunk recorded while we waited?
            if index in fresh.parts or fresh.state is SessionState.COMPLETED:
                return await self._compare_repeat(fresh, index, body, digest, limit, verify)
            fresh.after(UploadEvent.PUT_PART, self.clock())
            result = await self.engine.write_part_at(
                region,
                body,
                limit=limit,
                too_long=lambda n: ChunkLengthMismatch(f"chunk {index} is longer than {limit} bytes", expected=limit),
                sha256=digest.algorithm == "sha256",
                verify=verify,
            )
            updated = await self._record_part(sid, index, result.part())
        finally:
            await region.__aexit__(None, None, None)
        return self._accepted(sid, index, updated, result.size, result.xxh3)

    async def _compare_repeat(
        self,
        session: Session,
        index: int,
        body: AsyncIterator[bytes],
        digest: ChunkDigest,
        limit: int,
        verify: Callable[[StoredPart], None],
    ) -> ChunkReceipt:
        """A chunk a staged session already holds, sent again: its bytes are hashed (and checked as any chunk's)
        and compared with the recorded ones; nothing is written."""
        x3 = xxhash.xxh3_128()
        sha = hashlib.sha256() if digest.algorithm == "sha256" else None
        hasher = PieceHasher(x3, sha)
        size = 0
        async for piece in body:
            size += len(piece)
            if size > limit:
                raise ChunkLengthMismatch(f"chunk {index} is longer than {limit} bytes", expected=limit)
            await hasher.update(piece)
        mine = StoredPart(size, x3.hexdigest(), sha.hexdigest() if sha is not None else "", False)
        if index not in session.parts and not (
            session.state is SessionState.COMPLETED and index < len(session.chunk_digests)
        ):
            session.after(UploadEvent.PUT_PART, self.clock())  # a chunk past a completed session's end: refused
        try:
            verify(mine)
        except _Duplicate:
            pass
        known = session.parts.get(index) or Part(mine.size, session.chunk_digests[index])
        return await self._repeated(session, index, mine, known)

    async def _discard_staged(self, session: Session) -> None:
        if session.staged and self.staging is not None:
            with storage_errors_translated():
                await self.staging.discard_staged(staged_key(session.id))

    async def _repeated(self, session: Session, index: int, mine: StoredPart, stored: Part) -> ChunkReceipt:
        """A chunk sent again: ChunkConflict for other bytes; for the same bytes a no-op, except that a stored
        chunk the record does not list yet is entered in it (adopted)."""
        if stored.xxh3 != mine.xxh3:
            raise ChunkConflict(f"chunk {index} is already stored with other bytes", stored_xxh3=stored.xxh3)
        if session.state is SessionState.OPEN and index not in session.parts:
            updated = await self._record_part(session.id, index, stored)
            self._arrived(session.id)
            self._spawn(self._advance(updated))
        return ChunkReceipt(index, mine.size, stored.xxh3, duplicate=True)

    async def _require_room(self, session: Session, end: int) -> None:
        """A session without a size reserves up to the end of the chunk about to be stored, before it is stored:
        its reservation grows with its chunks, and is capped by what the key has left beside its other uploads."""
        await self.lifecycle.grow(session.owner, session.id, end, session.expires_at)

    async def _record_part(self, sid: str, index: int, part: Part) -> Session:
        """Enter a stored chunk in the session's index (compare-and-set; a no-op if it is there already)."""

        def change(current: Session) -> Session | None:
            if current.parts.get(index) == part:
                return None
            current.after(UploadEvent.PUT_PART, self.clock())  # aborted or expired meanwhile: refused
            return current.with_changes(parts=with_part(current.parts, index, part))

        return await self._update(sid, change)

    def _accepted(self, sid: str, index: int, updated: Session, size: int, xxh3: str) -> ChunkReceipt:
        """A new chunk is recorded: wake its readers, let the hasher follow, answer the receipt."""
        self._arrived(sid)
        self._spawn(self._advance(updated))
        return ChunkReceipt(index, size, xxh3, duplicate=False)

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
        """index -> length of every stored chunk (the record's index)."""
        return (await self.load(sid, TRUSTED)).stored

    async def status(self, sid: str, caller: Grant) -> dict[str, Any]:
        """What is stored, what is missing, and the session's state: enough to resume with no local state.
        One record read, whatever is stored."""
        session = await self.load(sid, caller)
        return self._status(session)

    def _status(self, session: Session) -> dict[str, Any]:
        state = session.state_at(self.clock())
        completed = state is SessionState.COMPLETED
        stored = {i: 0 for i in range(len(session.chunk_digests))} if completed else session.stored
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

    async def _advance(self, session: Session) -> int:
        """Hash the recorded chunks in order from where this process's hasher stopped; returns how many chunks
        from the start are hashed and intact (a chunk whose bytes are not what was acknowledged is deleted and
        dropped from the record: status lists it as missing, and the client sends it again)."""
        sid = session.id
        ordered = [(i, chunk_key(sid, i), session.parts[i]) for i in sorted(session.parts)]
        if session.staged and self.staging is not None:
            staging, cs, read_whole = self.staging, session.chunk_size, set()

            async def read(index: int, _key: str, part: Part) -> AsyncIterator[bytes]:
                async for piece in staging.read_staged(staged_key(sid), index * cs, index * cs + part.size):
                    yield piece
                read_whole.add(index)

            hasher = await self.engine.catch_up(sid, ordered, read=read)
            bad = hasher.next_part
            if bad in read_whole:  # read, and not the bytes acknowledged (a crash lost them): to be sent again
                await self._update(sid, lambda current: _without_part(current, bad, only_open=True))
            return hasher.next_part
        hasher = await self.engine.catch_up(sid, ordered)
        bad = hasher.next_part
        if bad in session.parts and not await self._exists(chunk_key(sid, bad)):
            await self._update(sid, lambda current: _without_part(current, bad))
        return hasher.next_part

    async def _exists(self, key: str) -> bool:
        try:
            with storage_errors_translated():
                await self.storage.stat(key)
        except NotFound:
            return False
        return True

    async def complete(self, sid: str, caller: Grant, declared_size: int | None = None) -> tuple[Session, FileRecord]:
        """Verify and publish the whole file; the session becomes COMPLETED with the new file's id, which belongs
        to the session's owner."""
        async with self.engine.locks.hold(sid):
            session = await self.load(sid, caller)
            if session.state is SessionState.COMPLETED and session.file_id and session.size and not session.parts:
                # born completed, sharing stored bytes (_publish_known): completing it answers its file
                with storage_errors_translated():
                    info = await self.storage.stat(object_key(session.file_id))
                return session, FileRecord.from_metadata(info.metadata)
            session.require_open(self.clock())  # completing twice is refused (SessionCompleted), as before
            size, total = session.completion_plan(session.stored, declared_size)
            hashed = await self._advance(session)
            if hashed < total:  # dropped by its xxh3 check, or deleted under us
                raise SessionIncomplete(
                    f"chunk {hashed} is not stored intact; send it again", missing=[[hashed, hashed]]
                )
            hasher = self.engine.hasher(sid)
            sha_hex = hasher.sha.hexdigest()
            if hashed > total:
                raise InvalidRequest("more chunks than the declared size allows")
            if session.checksum is not None and checksum_hex(session.checksum) != sha_hex:
                raise ChecksumMismatch(
                    "SHA-256 of the assembled chunks does not match the session's checksum",
                    expected=session.checksum,
                    actual="sha256:" + sha_hex,
                )
            digests = [session.parts[i].xxh3 for i in range(total)]
            # the file id follows from the session id: two replicas completing at once compose the same object
            # and write the same record, so there is one outcome, one charge and no orphan
            # the first bytes: the hasher kept them as it went (no read)
            candidate = _candidate(session, size, sha_hex, bytes(hasher.head), "session")

            async def place(record: FileRecord) -> None:
                if session.staged:
                    await self._publish_staged(session, record)
                else:
                    await publish_composed(self.storage, record, [chunk_key(sid, i) for i in range(total)])

            record = await self.publisher.publish(candidate, place)
            file_id = record.id

            def completed(current: Session) -> Session | None:
                if current.state is SessionState.COMPLETED and current.file_id == file_id:
                    return None  # another replica completed it the same way
                current.after(UploadEvent.COMPLETE, self.clock())
                return current.with_changes(
                    state=SessionState.COMPLETED, file_id=file_id, size=size, chunk_digests=digests
                )

            done = await self._update(sid, completed)
            await self.quota.release(session.owner, sid)
            self.engine.forget(sid)
            self._arrived(sid)
            if not session.staged:
                self._spawn(self._delete_chunks(sid, list(session.parts)))
            return done, record

    async def _publish_staged(self, session: Session, record: FileRecord) -> ObjectInfo:
        """The staged file becomes the file's object by a rename (no byte copied). If it is gone, a completion
        elsewhere (another replica, or one that stopped before recording itself) published it already: the object
        under the file's key, if it is this record's bytes, is the outcome."""
        assert self.staging is not None
        key = object_key(record.id)
        try:
            with storage_errors_translated():
                info = await self.staging.publish_staged(staged_key(session.id), key, record.size, record.to_metadata())
        except NotFound:
            try:
                with storage_errors_translated():
                    info = await self.storage.stat(key)
            except NotFound:
                raise SessionIncomplete("the session's chunks are gone; open a new session") from None
            if FileRecord.from_metadata(info.metadata).sha256 != record.sha256:
                raise SessionIncomplete("the session's chunks are gone; open a new session") from None
        return info

    async def _delete_chunks(self, sid: str, indices: list[int]) -> None:
        await self.engine.delete([chunk_key(sid, index) for index in indices])

    async def abort(self, sid: str, caller: Grant, *, state: SessionState = SessionState.ABORTED) -> None:
        """Abort (or expire) a session: its chunks are deleted; completed sessions cannot be aborted."""
        event = UploadEvent.EXPIRE if state is SessionState.EXPIRED else UploadEvent.ABORT
        async with self.engine.locks.hold(sid):
            session = await self.load(sid, caller)
            if session.state is SessionState.COMPLETED:
                session.require_open(self.clock())  # SessionCompleted
            doomed = set(session.parts)
            if session.state is SessionState.OPEN:  # an ended one again: nothing to record, chunks deleted again
                # the staged file goes first: on a full disk, writing the record needs the space it frees (a
                # failure after this leaves an open record whose chunks are gone: completing it is refused as
                # incomplete, and the expiry sweep ends it)
                await self._discard_staged(session)

                def ended(current: Session) -> Session | None:
                    doomed.update(current.parts)  # the latest index: a chunk recorded meanwhile goes too
                    return _ended(current, event)

                session = await self._update(sid, ended)
            if session.staged:
                await self._discard_staged(session)
            await self._delete_chunks(sid, sorted(doomed))
            await self.quota.release(session.owner, sid)
            await self.lifecycle.release(session.owner, sid)
            self.engine.forget(sid)
            self._arrived(sid)

    async def sweep_expired(self) -> int:
        """Expire open sessions past their time (deleting their chunks) and forget ended sessions a retention
        period after they ended; returns how many sessions it expired or forgot. Driven by the service clock.
        A sweep may list storage: it is the one place that looks at everything."""
        now = self.clock()
        removed = 0
        sids = set()
        with storage_errors_translated():
            async for info in self.storage.list("sessions/"):
                sids.add(info.key.split("/")[1])
        for sid in sids:
            try:
                session = await self.load(sid, TRUSTED)
            except NotFound:  # chunks without a record: left by a crash between deletes
                await self._delete_listed_chunks(sid)
                continue
            if session.state is SessionState.OPEN and session.state_at(now) is SessionState.EXPIRED:
                await self.abort(sid, TRUSTED, state=SessionState.EXPIRED)
                removed += 1
            elif session.state is not SessionState.OPEN and now >= session.expires_at + self.settings.session_retention:
                await self._discard_staged(session)
                await self._delete_listed_chunks(sid)
                with storage_errors_translated():
                    await self.storage.delete(session_key(sid))
                removed += 1
        return removed

    async def _delete_listed_chunks(self, sid: str) -> None:
        """The sweep's clean-up: every chunk object under the session's prefix, listed or not in a record."""
        prefix = f"sessions/{sid}/chunks/"
        with storage_errors_translated():
            keys = [info.key async for info in self.storage.list(prefix)]
        await self.engine.delete(keys)

    async def collect_garbage(self) -> int:
        """Kept for callers of the former name: :meth:`sweep_expired`."""
        return await self.sweep_expired()

    # -- readers holding a signed streaming descriptor ---------------------------------------------------------

    def _verify_signed(self, sid: str, method: str, raw_path: bytes | str | None, path: str, query: str) -> None:
        """The URL's path is exactly ``path`` as sent (the chunks path, or it plus a chunk's index) and its
        signature over the chunks path is valid and unexpired: the signature is the reader's authority."""
        if self._check_signed is None:
            raise NotFound("signed session URLs are not served here")
        self._check_signed(method, chunks_path(sid), query, raw_path, (path,))

    async def signed_status(self, sid: str, raw_path: bytes | str | None, query: str) -> dict[str, Any]:
        """The status, for the holder of a streaming descriptor's signed chunks URL."""
        self._verify_signed(sid, "GET", raw_path, chunks_path(sid), query)
        return await self.status(sid, TRUSTED)

    async def open_signed_chunk(
        self, sid: str, index: int, method: str, raw_path: bytes | str | None, query: str, wait: float
    ) -> tuple[Session, ReaderStream, int, str]:
        """:meth:`open_chunk` for the holder of a signed chunks URL (its path plus the index, written canonically)."""
        self._verify_signed(sid, method, raw_path, f"{chunks_path(sid)}/{index}", query)
        return await self.open_chunk(sid, index, wait)

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
                digest = session.chunk_digests[index]
                try:  # its file's expiry ends its chunk URLs too, as it ends the file's own, swept or not
                    record = FileRecord.from_metadata(reader.info.metadata)
                    _require_live(record, self.clock())
                    if not digest:  # born sharing stored bytes, none read: the chunk is hashed, then read again
                        x3 = xxhash.xxh3_128()
                        async with await self.publisher.shared.open(record) as hashed:
                            async for piece in hashed.read(start, end):
                                x3.update(piece)
                        digest = x3.hexdigest()
                    if record.content is not None:  # its object holds no bytes: they are where its record says
                        shared = await self.publisher.shared.open(record)
                        await reader.close()
                        reader = shared
                except BaseException:
                    await reader.close()
                    raise
                return session, ReaderStream(reader, start, end), end - start, digest
            if session.staged and self.staging is not None:
                part = session.parts.get(index)
                if part is not None:  # recorded: its bytes are in place and never written again
                    start = index * session.chunk_size
                    staged = _StagedChunk(self.staging, staged_key(sid), start, part.size)
                    return session, ReaderStream(staged, 0, part.size), part.size, part.xxh3
            else:
                try:
                    with storage_errors_translated():
                        reader = await self.storage.open(chunk_key(sid, index))
                    size, xxh3 = reader.info.size, reader.info.metadata.get("xxh3", "")
                    return session, ReaderStream(reader, 0, None), size, xxh3
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


def _require_live(record: FileRecord, now: float) -> None:
    """FileExpired (410) from the file's expiry on (service clock), whether or not the sweep has removed it."""
    if is_expired(record.expires_at, now):
        assert record.expires_at is not None
        expired_at = format_timestamp(record.expires_at)
        raise FileExpired(f"file {record.id} expired at {expired_at}", expired_at=expired_at)


class _StagedChunk:
    """One recorded chunk of a staged session's file, read as an :class:`ObjectReader` of its own."""

    def __init__(self, staging: SupportsWriteAtOffset, staged: str, start: int, size: int) -> None:
        self._staging = staging
        self._staged = staged
        self._start = start
        self._info = ObjectInfo(key=staged, size=size, modified=datetime.now(UTC))

    @property
    def info(self) -> ObjectInfo:
        return self._info

    async def read(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        stop = self._info.size if end is None else min(end, self._info.size)
        with storage_errors_translated():
            async for piece in self._staging.read_staged(self._staged, self._start + start, self._start + stop):
                yield piece

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


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
        """Close the underlying reader."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()

    async def __aenter__(self) -> ReaderStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _ended(current: Session, event: UploadEvent) -> Session | None:
    """The record after ABORT or EXPIRE (judged on the recorded state: the sweep records what the clock decided)."""
    if current.state is not SessionState.OPEN:
        return None  # ended meanwhile
    after = transition(current.state, event, upload_id=f"session {current.id}")
    return current.with_changes(state=after, parts={})  # its chunks are deleted next


def _without_part(current: Session, index: int, *, only_open: bool = False) -> Session | None:
    if index not in current.parts or (only_open and current.state is not SessionState.OPEN):
        return None
    return current.with_changes(parts={i: p for i, p in current.parts.items() if i != index})


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
