"""Chunked upload sessions: create, put chunk (any order, in parallel, verified), status, complete, abort, expiry,
and reading chunks — while the upload is still going on (live) or after it completed.

The index-addressed door of the one upload lifecycle (:mod:`transfer.service.uploads.lifecycle`). Everything lives in
the storage backend, so a restarted process or another replica carries on:

    sessions/<id>/session.json        the Session record: state, expiry, owner, the file's intent and the index of
                                      stored chunks (index -> size, xxh3-128, SHA-256), updated by compare-and-set
                                      through the lifecycle
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
composes them server-side (COMPOSE; S3: UploadPartCopy) into an ordinary stored file and deletes them. Reading
chunks (live, or after completion) is :mod:`transfer.service.uploads.session_reads`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import xxhash

from storage.base import Capability, ObjectInfo, Storage, SupportsWriteAtOffset, capable
from storage.rules import rules_of
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import new_id
from transfer.core.model.content import checksum_hex
from transfer.core.uploads.sessions import Session, SessionState, compact_ranges, plan_chunk_size
from transfer.core.uploads.state import FileIntent, Part, UploadEvent, with_part
from transfer.errors import (
    ChecksumMismatch,
    ChunkChecksumMismatch,
    ChunkConflict,
    ChunkLengthMismatch,
    InvalidRequest,
    NotFound,
    SessionIncomplete,
    TooLarge,
    TransferError,
    VersionConflict,
    storage_errors_translated,
)
from transfer.service.accounting.slots import OpenSlots
from transfer.service.files.documents import publish_composed
from transfer.service.files.publisher import Candidate
from transfer.service.files.records import FileRecord, object_key
from transfer.service.hashing import PieceHasher
from transfer.service.uploads.engine import PartExists, StoredPart, UploadEngine
from transfer.service.uploads.lifecycle import UploadKind, UploadLifecycle
from transfer.service.uploads.session_reads import ChunkReading, SignatureCheck, chunk_key, staged_key
from transfer.settings import Settings

MiB = 1 << 20
PREFIX = "sessions/"


def new_session_id() -> str:
    """A fresh session id (``s_`` and 128 random bits)."""
    return new_id("s_")


def is_session_id(value: str) -> bool:
    """Whether ``value`` is a session id."""
    return value.startswith("s_") and len(value) == 34 and all(c in "0123456789abcdef" for c in value[2:])


def session_key(sid: str, owner: str | None = None) -> str:
    """The storage key of session ``sid``'s record."""
    return f"{PREFIX}{sid}/session.json"


def _listed(key: str) -> tuple[str, bool] | None:
    sid, sep, rest = key[len(PREFIX) :].partition("/")
    return (sid, rest == "session.json") if sep and rest else None


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


class SessionService(ChunkReading):
    """Chunked sessions over one storage backend: the index-addressed door of the one upload lifecycle (its wire:
    chunks by index, in any order, verified; live reads)."""

    def __init__(
        self,
        storage: Storage,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        lifecycle: UploadLifecycle,
        slots: OpenSlots,
        engine: UploadEngine,
        check_signed: SignatureCheck | None = None,
    ) -> None:
        # collaborators come from the composition root (Services.build), shared with every other door
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.lifecycle = lifecycle
        self.publisher = lifecycle.publisher
        self.terms = lifecycle.terms
        self.engine = engine
        self.kind = lifecycle.register(
            UploadKind(
                name="session",
                noun="session",
                prefix="s",
                decode=Session.from_json,
                encode=Session.to_json,
                key=session_key,
                listing=PREFIX,
                listed=_listed,
                slots=slots,
                discard=self._discard,
                retention=float(settings.session_retention),
                forgets=lambda session: replace(session, parts={}),  # its chunks go with it
            )
        )
        # chunks written at their offsets into one staged file, published by a rename: completion copies nothing
        self.staging = capable(storage, Capability.WRITE_AT_OFFSET, SupportsWriteAtOffset)
        self._check_signed = check_signed
        self._arrivals: dict[str, asyncio.Event] = {}
        self._background: set[asyncio.Task[None]] = set()

    # -- records -------------------------------------------------------------------------------------------------

    async def load(self, sid: str, caller: Grant) -> Session:
        """The session, if the caller may see it (its own; any for admin); NotFound otherwise, whether or not it
        exists. Readers holding a signed chunk URL act as TRUSTED: the signature is their authority."""
        return await self.lifecycle.load(self.kind, sid, caller)

    def _min_chunk(self) -> int:
        # chunks are composed into the file: each must be a source the backend composes (S3: 5 MiB)
        return max(64 << 10, rules_of(self.storage).min_compose_part)

    # -- operations ----------------------------------------------------------------------------------------------

    async def create(
        self,
        *,
        intent: FileIntent,
        size: int | None,
        chunk_size: int | None,
        checksum: str | None,
        ttl: int | None,
        owner: str | None = None,
    ) -> Session:
        """Open a session; ``owner`` (an API key name) counts it against that key's open-session limit and, for
        a declared ``size``, its byte quota; ``intent``: the file it makes (its lifetime granted now). Content the
        key stores already (a declared ``checksum`` and ``size``) is published at once: the session is born
        completed, holding no slot, reservation or staged file."""
        s = self.settings
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
            owner=owner,
            created_at=now,
            expires_at=now + min(ttl or s.session_ttl, s.session_max_ttl),
            intent=intent,
            size=size,
            chunk_size=cs,
            checksum=declared,
            max_size=s.max_upload_size,
            staged=self.staging is not None,
        )

        def born(done: Session) -> Session:
            # the chunks' digests are unknown (no byte was read): "" until a reader asks for a chunk (open_chunk)
            return replace(done, staged=False, chunk_digests=[""] * (done.total_chunks or 0))

        async def stage(session: Session) -> None:
            # the record first: a crash before the staged file exists leaves a session the client never heard of,
            # which expires (and is swept) like any other; a staged file is never without its record
            if self.staging is not None:
                try:
                    with storage_errors_translated():
                        await self.staging.create_staged(staged_key(session.id), size)
                except BaseException:
                    await self._discard_staged(session)
                    raise

        known = None if declared is None or size is None else (checksum_hex(declared), size)
        return await self.lifecycle.open(self.kind, session, reserve=size, known=known, born=born, then=stage)

    async def is_open(self, sid: str) -> bool:
        """Whether session ``sid`` exists and is open now."""
        return await self.lifecycle.is_open(self.kind, sid, None)

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
            session.require_open(now)
            if session.size is None:  # no reservation to hold it: the quota bounds where its chunks may reach
                end = index * session.chunk_size + (declared_length or limit)
                await self.terms.grow(session.owner, session.id, end, session.expires_at)

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
            updated = await self._record_part(session, index, result.part())
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
            fresh.require_open(self.clock())  # ended: its refusal
            raise
        try:
            fresh = await self.load(sid, caller)  # holding the region: was the chunk recorded while we waited?
            if index in fresh.parts or fresh.state is SessionState.COMPLETED:
                return await self._compare_repeat(fresh, index, body, digest, limit, verify)
            fresh.require_open(self.clock())
            result = await self.engine.write_part_at(
                region,
                body,
                limit=limit,
                too_long=lambda n: ChunkLengthMismatch(f"chunk {index} is longer than {limit} bytes", expected=limit),
                sha256=digest.algorithm == "sha256",
                verify=verify,
            )
            updated = await self._record_part(fresh, index, result.part())
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
            session.require_open(self.clock())  # a chunk past a completed session's end: refused
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
            updated = await self._record_part(session, index, stored)
            self._arrived(session.id)
            self._spawn(self._advance(updated))
        return ChunkReceipt(index, mine.size, stored.xxh3, duplicate=True)

    async def _record_part(self, session: Session, index: int, part: Part) -> Session:
        """Enter a stored chunk in the session's index (compare-and-set; a no-op if it is there already)."""
        now = self.clock()

        def change(current: Session) -> Session | None:
            if current.parts.get(index) == part:
                return None
            # aborted or expired meanwhile: refused
            return current.after(UploadEvent.PUT_PART, now, noun="session", parts=with_part(current.parts, index, part))

        return await self.lifecycle.change(self.kind, session, change)

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
                await self.lifecycle.change(self.kind, session, lambda current: _without_part(current, bad, True))
            return hasher.next_part
        hasher = await self.engine.catch_up(sid, ordered)
        bad = hasher.next_part
        if bad in session.parts and not await self._exists(chunk_key(sid, bad)):
            await self.lifecycle.change(self.kind, session, lambda current: _without_part(current, bad))
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
        to the session's owner. Completing it again is refused (409 ``session_completed``), except a session born
        completed (content its key stored already), which answers its file."""
        done_fields: dict[str, Any] = {}

        async def gather(session: Session) -> tuple[Candidate, Any]:
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
            done_fields.update(size=size, chunk_digests=[session.parts[i].xxh3 for i in range(total)])
            # the file id follows from the session id: two replicas completing at once compose the same object
            # and write the same record, so there is one outcome, one charge and no orphan; the first bytes: the
            # hasher kept them as it went (no read)
            candidate = self.lifecycle.candidate(
                session, size=size, sha256=sha_hex, head=bytes(hasher.head), source="session"
            )

            async def place(record: FileRecord) -> None:
                if session.staged:
                    await self._publish_staged(session, record)
                else:
                    await publish_composed(self.storage, record, [chunk_key(sid, i) for i in range(total)])

            return candidate, place

        done, record = await self.lifecycle.finish(
            self.kind,
            sid,
            caller,
            gather,
            done=lambda current, file: dict(done_fields),
            again=lambda session: session.file_id is not None and not session.parts,  # born completed
        )
        self.engine.forget(sid)
        self._arrived(sid)
        if not done.staged and done.parts:
            self._spawn(self._delete_chunks(sid, list(done.parts)))
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

    async def abort(self, sid: str, caller: Grant) -> None:
        """Abort a session: its chunks are deleted; a completed session cannot be aborted (409)."""
        await self.lifecycle.abort(self.kind, sid, caller)

    async def _discard(self, session: Session) -> None:
        """What an ended session holds beside its record: its staged file or its recorded chunks, this process's
        running hash; its readers are woken."""
        self.engine.forget(session.id)
        self._arrived(session.id)
        if session.state is SessionState.COMPLETED and not session.parts:
            return
        await self._discard_staged(session)
        # the chunks its record indexes (no listing on a request's path: the sweep removes any it never recorded)
        await self.engine.delete([chunk_key(session.id, i) for i in sorted(session.parts)])


def _without_part(current: Session, index: int, only_open: bool = False) -> Session | None:
    if index not in current.parts or (only_open and current.state is not SessionState.OPEN):
        return None
    return replace(current, parts={i: p for i, p in current.parts.items() if i != index})


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
