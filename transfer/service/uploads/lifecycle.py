"""The one upload lifecycle: every kind of resumable upload (tus and IETF uploads, chunked sessions, direct-upload
plans, upload authorisations, chunked deduplicating uploads) is registered here as an :class:`UploadKind`, and its
record lives and dies through these operations alone. A door keeps its wire format and how its parts are stored,
read back and placed; it never writes or deletes an upload record, and never sets a state.

    open      the intent settled (fields checked, lifetime granted); content the key stores already (a declared
              SHA-256 and size) published at once, the upload born completed (no slot, no reservation); otherwise a
              slot among the key's open uploads of that kind, the declared size reserved, what the door prepares
              (a multipart upload), the record created if absent, then what the door makes beside it (a staged
              file) — each undone if a later step fails
    load      the record, if the caller may see it (its owner's, any for admin; NotFound otherwise)
    change    a change of the record by compare-and-set, through the transition table (a part recorded, a length
              declared)
    finish    the per-upload lock; the door gathers its bytes into a candidate; the publisher publishes it
              (the file id follows from the upload id: two completions publish one file, charged once); COMPLETE
              recorded once by compare-and-set, judged as of when the completion began; the slot freed. If an
              abort or the sweep ended the upload meanwhile (on any replica), the file goes again and the
              completion is refused: one outcome, never a file and an abort both
    abort     a file published but not yet recorded wins (the record says COMPLETE, the abort is refused);
              otherwise ABORTED by compare-and-set, then the slot, the reservation and the door's parts go
    sweep     one sweep over every kind: open uploads past their expiry are expired (their parts, slot and
              reservation go), ended records are deleted a retention period after their expiry, and what a crash
              left without a record is removed

Replicas share nothing but the backend: every state change is a compare-and-set on the record, so a completion on
one replica racing an abort on another has exactly one outcome.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from storage.base import Storage
from storage.keyed import KeyedLocks
from transfer.core.auth import TRUSTED, Grant
from transfer.core.uploads.state import ENDED, FileIntent, UploadEvent, UploadRecord, UploadState
from transfer.errors import (
    InsufficientStorage,
    NotFound,
    QuotaExceeded,
    SessionCompleted,
    StorageUnavailable,
    TransferError,
    storage_errors_translated,
)
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.accounting.slots import OpenSlots
from transfer.service.files.publisher import Candidate, Publisher, file_id_for
from transfer.service.files.records import FileRecord, object_key

log = logging.getLogger("transfer.uploads")

R = TypeVar("R", bound=UploadRecord)


@dataclass(frozen=True, slots=True)
class UploadKind(Generic[R]):
    """One kind of upload, as its door registers it with the engine: how its records are named, stored and swept,
    and what its door removes when one ends."""

    name: str  # in logs and metrics: "tus", "session", "plan", "authorization", "chunked"
    noun: str  # in messages: "upload", "session", "upload plan", ...
    prefix: str  # of its ids: "t", "s", "d", "az", "c"
    decode: Callable[[Any], R]
    encode: Callable[[R], Any]
    key: Callable[[str, str | None], str]  # (upload id, owner) -> where its record is
    listing: str  # what the sweep lists to find every record (and what a crash left without one)
    listed: Callable[[str], tuple[str, bool] | None]  # a listed key -> (upload id, is it the record), None: neither
    slots: OpenSlots | None  # the key's open uploads of this kind (None: unbounded)
    discard: Callable[[R], Awaitable[None]]  # remove what the upload holds beside its record (its parts)
    retention: float = 0.0  # seconds an ended record stays after its expiry (resuming clients learn the outcome)
    gone: Callable[[R, UploadState], TransferError] | None = None  # the refusal of an ended upload on load
    forgets: Callable[[R], R] | None = None  # what an upload that ended without a file forgets (its parts' index)

    def owns(self, upload_id: str) -> bool:
        """Whether ``upload_id`` is an id of this kind."""
        kind, sep, rest = upload_id.partition("_")
        return bool(sep) and kind == self.prefix and len(rest) == 32 and all(c in "0123456789abcdef" for c in rest)


Gather = Callable[[R], Awaitable[tuple[Candidate, Callable[[FileRecord], Awaitable[object]]]]]


class UploadLifecycle:
    """Open, load, change, finish, abort and sweep every registered kind of upload (see the module text)."""

    def __init__(
        self,
        storage: Storage,
        records: RecordStore,
        publisher: Publisher,
        *,
        clock: Callable[[], float] = time.time,
        locks: KeyedLocks | None = None,
    ) -> None:
        self.storage = storage
        self.records = records
        self.publisher = publisher
        self.terms = publisher.lifecycle
        self.clock = clock
        self.locks = locks or records.locks
        self.kinds: dict[str, UploadKind[Any]] = {}

    def register(self, kind: UploadKind[R]) -> UploadKind[R]:
        """Add ``kind`` (its slots ask the engine whether one of its uploads is still open)."""
        if kind.prefix in self.kinds:
            raise ValueError(f"an upload kind with the prefix {kind.prefix!r} is registered already")
        self.kinds[kind.prefix] = kind
        if kind.slots is not None:
            kind.slots.register(kind.owns, lambda owner, uid: self.is_open(kind, uid, owner))
        return kind

    # -- the file it makes ---------------------------------------------------------------------------------------

    async def settle(self, owner: str | None, intent: FileIntent) -> FileIntent:
        """``intent`` as the upload keeps it: every field checked by the publisher's one rule (whatever the door), the
        lifetime granted against the key's and the service's policy (LifetimeTooLong above the maximum)."""
        self.publisher.check_intent(intent)
        return replace(intent, lifetime=await self.terms.lifetime(owner, intent.lifetime))

    def candidate(self, record: UploadRecord, *, size: int, sha256: str, head: bytes, source: str) -> Candidate:
        """What ``record``'s upload hands the publisher: its bytes' size, SHA-256 and first bytes, and its intent."""
        return Candidate(
            owner=record.owner,
            upload_id=record.id,
            size=size,
            sha256=sha256,
            head=head,
            source=source,
            intent=record.intent,
            republishable_until=record.expires_at,
        )

    # -- open ----------------------------------------------------------------------------------------------------

    async def open(
        self,
        kind: UploadKind[R],
        record: R,
        *,
        reserve: int | None = None,
        reserving: bool = True,
        slot: bool = True,
        known: tuple[str, int] | None = None,
        born: Callable[[R], R] | None = None,
        prepare: Callable[[R], Awaitable[R]] | None = None,
        undo: Callable[[R], Awaitable[None]] | None = None,
        then: Callable[[R], Awaitable[None]] | None = None,
    ) -> R:
        """Open ``record``'s upload (see the module text). ``known``: the SHA-256 (hex) and size the client declared:
        content the key stores already is published now and the record is born completed (``born`` adds the door's
        own fields to it). ``reserve``: the declared size (None: unknown) reserved against the key's quota unless
        ``reserving`` is False; ``slot`` False: the upload takes no slot among the key's open ones (it is finished
        at once). ``prepare``: the door's work before the record exists (it may change the record),
        undone by ``undo`` if the record cannot be written; ``then``: its work once the record exists (if it fails,
        the record goes again)."""
        record = replace(record, intent=await self.settle(record.owner, record.intent))
        # the deployment's pre-upload hook, before anything is stored: it may refuse, or set lifetime and metadata
        intent = await self.publisher.events.screen(
            upload_id=record.id,
            owner=record.owner,
            door=kind.name,
            intent=record.intent,
            size=reserve if reserve is not None else None if known is None else known[1],
            checksum=None if known is None else known[0],
        )
        record = replace(record, intent=intent)
        if known is not None:
            sha256, size = known
            candidate = self.candidate(record, size=size, sha256=sha256, head=b"", source=f"{kind.name} (shared)")
            shared = await self.publisher.publish_known(candidate)
            if shared is not None:
                done = replace(record, state=UploadState.COMPLETED, file_id=shared.id)
                done = born(done) if born is not None else done
                await self._create(kind, done)
                return done
        owner, uid = record.owner, record.id
        if reserving:
            try:
                await self.terms.admit(owner, uid, reserve, record.expires_at)
            except QuotaExceeded as exc:
                await self.publisher.events.quota_exceeded(exc, subject=uid, owner=owner, door=kind.name)
                raise
        try:
            async with self._slot(kind, owner if slot else None, uid):
                if prepare is not None:
                    record = await prepare(record)
                try:
                    await self._create(kind, record)
                except BaseException:
                    if undo is not None:
                        await undo(record)
                    raise
                if then is not None:
                    try:
                        await then(record)
                    except BaseException:
                        await self._delete(kind, record)
                        raise
        except BaseException:
            if reserving:
                await self.terms.release_after_failure(owner, uid)
            raise
        return record

    @contextlib.asynccontextmanager
    async def _slot(self, kind: UploadKind[Any], owner: str | None, uid: str) -> AsyncIterator[None]:
        if kind.slots is None:
            yield
            return
        async with kind.slots.claim(owner, uid):
            yield

    async def _create(self, kind: UploadKind[R], record: R) -> None:
        await self.records.create(kind.key(record.id, record.owner), kind.encode(record))

    async def _delete(self, kind: UploadKind[R], record: R) -> None:
        with storage_errors_translated():
            try:
                await self.storage.delete(kind.key(record.id, record.owner))
            except NotFound:
                pass

    # -- load and change -----------------------------------------------------------------------------------------

    def _unknown(self, kind: UploadKind[Any], uid: str) -> NotFound:
        return NotFound(f"no {kind.noun} {uid!r}")

    async def load(
        self, kind: UploadKind[R], uid: str, caller: Grant, *, allow_ended: bool = True, owner: str | None = None
    ) -> R:
        """Upload ``uid``'s record, if ``caller`` may see it (its owner's; any for admin); NotFound otherwise, whether
        or not it exists. ``allow_ended`` False: an aborted or expired upload is refused with its kind's ``gone``.
        ``owner``: the owner whose folder holds the record, for a kind that keeps records per owner (the caller's
        by default)."""
        return (await self.load_versioned(kind, uid, caller, allow_ended=allow_ended, owner=owner))[0]

    async def load_versioned(
        self, kind: UploadKind[R], uid: str, caller: Grant, *, allow_ended: bool = True, owner: str | None = None
    ) -> tuple[R, str]:
        """:meth:`load`, and the version (etag) of the record it read: a door that keeps a copy knows by one stat
        whether it is still the latest."""
        if not kind.owns(uid):
            raise self._unknown(kind, uid)
        try:
            doc, version = await self.records.read(kind.key(uid, caller.owner if owner is None else owner))
        except NotFound:
            raise self._unknown(kind, uid) from None
        record = kind.decode(doc)
        if record.id != uid or not caller.sees(record.owner):
            raise self._unknown(kind, uid)
        if not allow_ended and kind.gone is not None:
            state = record.state_at(self.clock())
            if state in (UploadState.ABORTED, UploadState.EXPIRED):
                raise kind.gone(record, state)
        return record, version

    async def version(self, kind: UploadKind[Any], uid: str, owner: str | None = None) -> str | None:
        """The version (etag) of upload ``uid``'s record as stored now, by one stat (None: there is none): a door
        that keeps a copy of a record knows whether it is still the latest."""
        try:
            with storage_errors_translated():
                return (await self.storage.stat(kind.key(uid, owner))).etag
        except NotFound:
            return None

    async def change(self, kind: UploadKind[R], record: R, change: Callable[[R], R | None]) -> R:
        """Change ``record``'s upload by compare-and-set: ``change`` sees the latest record and returns the new one
        (made with :meth:`UploadRecord.after`, so only the transition table moves its state) or None for no change;
        it may run more than once."""
        return await self.records.update(kind.key(record.id, record.owner), kind.decode, change, kind.encode)

    async def event(self, kind: UploadKind[R], record: R, event: UploadEvent, **changes: Any) -> R:
        """Move ``record``'s upload by ``event`` (as of now), with ``changes``."""
        now = self.clock()
        return await self.change(kind, record, lambda current: current.after(event, now, noun=kind.noun, **changes))

    async def is_open(self, kind: UploadKind[Any], uid: str, owner: str | None) -> bool:
        """Whether upload ``uid`` of ``owner`` still holds a slot: it exists and is open (or being completed) now."""
        try:
            record = await self.load(kind, uid, TRUSTED, owner=owner)
        except NotFound:
            return False
        return record.state_at(self.clock()) is UploadState.OPEN

    # -- finish --------------------------------------------------------------------------------------------------

    async def published(self, record: UploadRecord) -> FileRecord | None:
        """The file ``record``'s upload publishes, if it is published (whatever its record says), else None."""
        try:
            with storage_errors_translated():
                info = await self.storage.stat(object_key(record.file_id or file_id_for(record.id)))
            return FileRecord.from_metadata(info.metadata)
        except (NotFound, StorageUnavailable):  # absent, or placed and not yet given its record
            return None

    async def require_room(
        self, record: UploadRecord, size: int, *, retry: str = "delete files and complete again"
    ) -> None:
        """Before costly work for ``size`` bytes of ``record``'s upload: QuotaExceeded when they cannot fit."""
        await self.publisher.require_room(record.owner, record.id, size, what=f"upload {record.id}", retry=retry)

    async def finish(
        self,
        kind: UploadKind[R],
        uid: str,
        caller: Grant,
        gather: Gather[R] | None = None,
        *,
        publish: Callable[[R], Awaitable[FileRecord]] | None = None,
        owner: str | None = None,
        done: Callable[[R, FileRecord], dict[str, Any]] | None = None,
        again: bool | Callable[[R], bool] = True,
        loaded: R | None = None,
    ) -> tuple[R, FileRecord]:
        """Complete upload ``uid`` (see the module text): ``gather(record)`` checks and reads the door's parts and
        returns the candidate and how to place it, for the publisher (or ``publish(record)`` publishes through it
        itself: a door whose bytes arrive in one plain upload); ``done(record, file)``: the door's own fields of the
        completed record. A completed upload answers its file again (unless ``again`` is False: then it is refused,
        409 ``session_completed``; ``again`` may decide per record), and so does one whose file a completion
        elsewhere published while this one gathered (its parts were gone). ``loaded``: the record as the door just
        read it for ``caller`` (not read again: COMPLETE's compare-and-set starts from it).

        COMPLETE is judged as of the moment the completion began: an upload open then may complete after its expiry,
        unless the sweep or an abort (on any replica) ended it first; then the file this completion published goes
        again, and the completion is refused with the state that won (one outcome)."""
        async with self.locks.hold(f"upload:{uid}"):
            began = self.clock()
            record = loaded if loaded is not None else await self.load(kind, uid, caller, owner=owner)
            if record.state is UploadState.COMPLETED and record.file_id is not None:
                if not (again(record) if callable(again) else again):
                    raise SessionCompleted(
                        f"{kind.noun} {uid} is already completed", state=record.state.value, file_id=record.file_id
                    )
                return record, await self._file(record.file_id)
            record.after(UploadEvent.COMPLETE, began, noun=kind.noun)  # refused now, before any work, if ended
            try:
                if publish is not None:
                    file = await publish(record)
                else:
                    assert gather is not None
                    candidate, place = await gather(record)
                    file = await self.publisher.publish(candidate, place)
            except TransferError:
                elsewhere = await self.published(record)
                if elsewhere is None:
                    raise
                file = elsewhere  # a completion elsewhere published it while this one gathered: one outcome
            try:
                completed = await self._completed(kind, record, file, done, began)
            except TransferError:
                # the upload ended meanwhile (an abort on another replica, the sweep): the file goes again
                await self._unpublish(file)
                raise
            return completed, file

    async def _completed(
        self,
        kind: UploadKind[R],
        record: R,
        file: FileRecord,
        done: Callable[[R, FileRecord], dict[str, Any]] | None,
        began: float,
    ) -> R:
        """Record that ``record``'s upload published ``file`` (once, whoever comes second), free its slot."""

        def completed(current: R) -> R | None:
            if current.state is UploadState.COMPLETED and current.file_id == file.id:
                return None  # another completion recorded it the same way
            extra = done(current, file) if done is not None else {}
            return current.after(UploadEvent.COMPLETE, began, noun=kind.noun, file_id=file.id, **extra)

        completed_record = await self.change(kind, record, completed)
        if kind.slots is not None:
            await kind.slots.release(record.owner, record.id)
        return completed_record

    async def _file(self, file_id: str) -> FileRecord:
        with storage_errors_translated():
            info = await self.storage.stat(object_key(file_id))
        return FileRecord.from_metadata(info.metadata)

    async def _unpublish(self, file: FileRecord) -> None:
        log.warning("%s was published by a completion that lost its upload to an abort; it is removed", file.id)
        await self.publisher.unpublish(file)

    # -- abort and expiry ----------------------------------------------------------------------------------------

    async def abort(self, kind: UploadKind[R], uid: str, caller: Grant, *, owner: str | None = None) -> R:
        """End upload ``uid`` without a file: ABORTED (the table refuses a completed one, or one a completion holds),
        then its slot, its reservation and its parts go. An aborted upload aborted again: its parts are removed
        again and the refusal is answered."""
        async with self.locks.hold(f"upload:{uid}"):
            record = await self.load(kind, uid, caller, owner=owner)
            if record.state is UploadState.OPEN:
                published = await self.published(record)
                if published is not None:  # a completion published it and has not recorded it yet: it won
                    record = await self._completed(kind, record, published, None, self.clock())
            events = self.publisher.events
            # its event staged before the compare-and-set that aborts it (an abort refused leaves it to be dropped)
            staged = None
            if record.state_at(self.clock()) is UploadState.OPEN:
                staged = await events.aborting(record, kind=kind.name, key=kind.key(record.id, record.owner))
            done = await self._end(kind, record, UploadEvent.ABORT)
            events.made(staged)
            return done

    async def _end(self, kind: UploadKind[R], record: R, event: UploadEvent, leftovers: Sequence[str] = ()) -> R:
        """End ``record``'s upload without a file (ABORT, EXPIRE) by compare-and-set; then what it held goes: its
        slot, its reservation, its parts (as the latest record before the end indexed them) and ``leftovers``."""
        now = self.clock()
        held: list[R] = [record]

        def ended(current: R) -> R | None:
            held[0] = current
            after = current.after(event, now, noun=kind.noun)
            if after.state is current.state:
                return None  # ended already (the sweep recording what the clock decided, twice)
            return kind.forgets(after) if kind.forgets is not None else after

        try:
            done = await self.change(kind, record, ended)
        except InsufficientStorage:  # a full disk: what the upload holds goes first, to make room for the record
            await kind.discard(held[0])
            done = await self.change(kind, record, ended)
        if kind.slots is not None:
            await kind.slots.release(done.owner, done.id)
        await self.terms.release(done.owner, done.id)
        await kind.discard(held[0])
        if leftovers:
            await self._delete_keys(list(leftovers))
        return done

    async def sweep(self) -> int:
        """One pass over every kind (see the module text); how many uploads it expired or forgot."""
        removed = 0
        for kind in self.kinds.values():
            removed += await self._sweep(kind)
        return removed

    async def _sweep(self, kind: UploadKind[Any]) -> int:
        groups: dict[str, list[str]] = {}
        records: dict[str, str] = {}
        with storage_errors_translated():
            async for info in self.storage.list(kind.listing):
                listed = kind.listed(info.key)
                if listed is None:
                    continue
                uid, is_record = listed
                groups.setdefault(uid, [])
                if is_record:
                    records[uid] = info.key
                else:
                    groups[uid].append(info.key)
        removed = 0
        for uid, keys in groups.items():
            try:
                removed += await self._sweep_one(kind, uid, records.get(uid), keys)
            except TransferError as exc:
                log.warning("sweep could not end %s %s; retrying at the next interval: %s", kind.noun, uid, exc)
        return removed

    async def _sweep_one(self, kind: UploadKind[R], uid: str, key: str | None, keys: list[str]) -> int:
        now = self.clock()
        record: R | None = None
        if key is not None:
            try:
                doc, _ = await self.records.read(key)
                record = kind.decode(doc)
            except NotFound:
                record = None
            except (KeyError, TypeError, ValueError):
                log.warning("%s record %s is unreadable; left as it is", kind.noun, key)
                return 0
        if record is None:  # what a crash left without a record
            await self._delete_keys(keys)
            return 0
        state = record.state_at(now)
        if state is UploadState.OPEN:
            return 0
        if state is UploadState.EXPIRED and record.state not in ENDED:
            async with self.locks.hold(f"upload:{uid}"):
                published = await self.published(record)
                if published is not None:  # its completion published it, then stopped before recording it
                    await self._completed(kind, record, published, None, record.expires_at)
                    return 1
                record = await self._end(kind, record, UploadEvent.EXPIRE, keys)
            if kind.retention:  # the record stays a while: a resuming client learns the upload expired
                return 1
            keys = []
        if now >= record.expires_at + kind.retention:
            if record.state is not UploadState.COMPLETED:
                await kind.discard(record)
                if kind.slots is not None:
                    await kind.slots.release(record.owner, uid)
            await self._delete_keys(keys)  # what is left beside the record (parts a crash did not record)
            await self._delete(kind, record)
            return 1
        if keys and record.state in (UploadState.ABORTED, UploadState.EXPIRED):
            await self._delete_keys(keys)  # an ended upload whose parts outlived it (a failure after it ended)
        return 0

    async def _delete_keys(self, keys: list[str]) -> None:
        with storage_errors_translated():
            for key in keys:
                try:
                    await self.storage.delete(key)
                except NotFound:
                    pass
