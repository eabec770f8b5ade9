"""Bytes stored per API key, counted in one small record per key that every replica updates with the storage
backend's compare-and-set (``create(key, if_match=<etag>)``; ``if_absent`` for the first write).

Record ``usage/<key hash>``: ``{"used": bytes, "files": n, "reservations": {"<upload id>": [bytes, until]},
"charged": {"<upload id>": [bytes, until]}, "removals": {"<file id>": [bytes, until]}}``.

    reserve(owner, rid, n)   an unfinished upload declares its size: refused (QuotaExceeded) unless it fits
    charge(owner, rid, n)    a file is about to be published: its reservation goes, its bytes count; refused
                             unless they fit (the exact check: a stream of unknown length is caught here at last).
                             With ``until``, at most once per upload id: the compare-and-set round that records
                             the upload in ``charged`` is the one that counts it, so two replicas (or four
                             concurrent confirmations) publishing the same upload's one file charge it once
    withdraw(owner, rid, n)  the publication that charged upload ``rid`` failed: its charge is taken back
    refund(owner, n)         a file's publish failed after the charge
    release(owner, rid)      an upload ended without a file (aborted, expired, terminated)
    claim_removal(owner, id, n)   a file is about to be removed: True for exactly one caller at a time (the
                             removal's tombstone, moved by compare-and-set); every other caller is told False
    removed(owner, id, n)    the claimer removed the file: the claim goes and the bytes leave the count, in one
                             write (a file is refunded once, however many deletes, sweeps and replicas race)
    unclaim(owner, id)       the claimer found the file gone already: the claim goes, nothing is refunded

A charge comes before the publish and a refund after the delete, so the count is never below what is stored: a
process that dies between the two leaves it too high (the safe side), never too low; ``transfer usage repair``
recomputes it from the file records. A reservation lives until its ``until`` (the upload's own expiry), a removal
claim until its lease ends: one left by a dead process stops counting then.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from storage.base import Storage
from transfer.core.auth import ApiKey
from transfer.core.lifecycle import Usage
from transfer.errors import Conflict, NotFound, StorageUnavailable, TransferError, VersionConflict
from transfer.service.recordstore import DEFAULT_POLICY, RetryPolicy, read_record, write_record

USAGE_PREFIX = "usage/"
REMOVAL_LEASE = 600.0  # seconds a removal claim holds: a claimer that died frees the file for another removal then

T = TypeVar("T")
_Change = tuple[Callable[["_Doc"], Any], "asyncio.Future[Any]", bool]  # change, its caller's answer, durable


def usage_key(owner: str | None) -> str:
    """The record of ``owner`` (a key name; None: files stored in open mode). Hashed: names are free text."""
    if owner is None:
        return USAGE_PREFIX + "open"
    return USAGE_PREFIX + "k" + hashlib.sha256(owner.encode("utf-8")).hexdigest()[:40]


class _Doc:
    """The mutable form of one usage record during a compare-and-set round."""

    def __init__(self, raw: Mapping[str, Any], now: float) -> None:
        self.used = int(raw.get("used", 0))
        self.files = int(raw.get("files", 0))
        reservations = raw.get("reservations", {})
        self.reservations: dict[str, tuple[int, float]] = {
            rid: (int(entry[0]), float(entry[1]))
            for rid, entry in (reservations.items() if isinstance(reservations, dict) else ())
            if float(entry[1]) > now  # a reservation past its time (its upload ended or its process died) is dropped
        }
        charged = raw.get("charged", {})
        # uploads already counted, kept while a second completion of the same upload could still come
        self.charged: dict[str, tuple[int, float]] = {
            rid: (int(entry[0]), float(entry[1]))
            for rid, entry in (charged.items() if isinstance(charged, dict) else ())
            if float(entry[1]) > now
        }
        removals = raw.get("removals", {})
        self.removals: dict[str, tuple[int, float]] = {
            file_id: (int(entry[0]), float(entry[1]))
            for file_id, entry in (removals.items() if isinstance(removals, dict) else ())
            if float(entry[1]) > now  # a claim past its lease: its claimer died; another removal may claim the file
        }

    def usage(self, quota: int | None, excluding: str | None = None) -> Usage:
        reserved = sum(n for rid, (n, _) in self.reservations.items() if rid != excluding)
        return Usage(used=self.used, files=self.files, reserved=reserved, quota=quota)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "used": self.used,
            "files": self.files,
            "reservations": {rid: [n, until] for rid, (n, until) in self.reservations.items()},
            **({"charged": {rid: [n, until] for rid, (n, until) in self.charged.items()}} if self.charged else {}),
        }
        if self.removals:
            doc["removals"] = {file_id: [n, until] for file_id, (n, until) in self.removals.items()}
        return doc


class UsageLedger:
    """Per-key byte counts and quotas over one storage backend, exact across replicas (compare-and-set)."""

    def __init__(
        self,
        storage: Storage,
        keys: Mapping[str, ApiKey],
        *,
        clock: Callable[[], float] = time.time,
        policy: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        self.storage = storage
        self.policy = policy
        self.keys = keys
        self.clock = clock
        self._locks: dict[str | None, asyncio.Lock] = {}
        self._pending: dict[str | None, list[_Change]] = {}  # changes waiting for the next round, per owner
        self._known: dict[str, tuple[dict[str, Any], str]] = {}  # record and version this process last wrote

    def quota_of(self, owner: str | None) -> int | None:
        """The byte quota of ``owner``'s key (None: no quota)."""
        key = self.keys.get(owner) if owner is not None else None
        return None if key is None else key.max_bytes

    async def _read(self, key: str) -> tuple[dict[str, Any], str | None]:
        """The record and its version token (None: no record yet)."""
        try:
            doc, etag = await read_record(self.storage, key, self.policy)
        except NotFound:
            return {}, None
        return (doc if isinstance(doc, dict) else {}), etag

    async def _update(self, owner: str | None, change: Callable[[_Doc], T], *, durable: bool = True) -> T:
        """Apply ``change`` to the owner's record atomically: read, change, write only if nobody wrote meanwhile,
        else again. ``change`` may raise (QuotaExceeded): then nothing of it is written.

        Group commit: the changes of concurrent callers for one owner are applied in one compare-and-set round
        (one durable write for all of them, not one each: the record's write is what every upload of a key would
        otherwise queue behind). A caller returns only after the write that holds its change has succeeded.
        ``durable=False``: a change that may be lost in a crash (a removal claim: its loss frees the file for
        another removal); the write is flushed to stable storage if any change in its round needs it."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        queue = self._pending.setdefault(owner, [])
        entry: _Change = (change, done, durable)
        queue.append(entry)
        try:
            async with self._locks.setdefault(owner, asyncio.Lock()):
                if not done.done():  # nobody took it into a round while we waited: lead one for everyone queued
                    batch, self._pending[owner] = self._pending[owner], []
                    # shielded: the callers in the batch wait on it even if the one that leads it is cancelled
                    await asyncio.shield(asyncio.ensure_future(self._round(owner, batch)))
        except asyncio.CancelledError:
            if entry in self._pending.get(owner, ()):
                self._pending[owner].remove(entry)  # not taken into a round: it never happens
            raise
        return done.result()

    async def _round(self, owner: str | None, batch: list[_Change]) -> None:
        """One group-commit round: apply every change of ``batch`` in order to the current record (a change that
        raises is left out and gets its error), write the result with compare-and-set, again on a conflict; then
        settle every caller's future."""
        key = usage_key(owner)
        retry = self.policy.start()
        try:
            while True:
                cached = self._known.get(key)
                raw, etag = cached if cached is not None else await self._read(key)
                doc = _Doc(raw, self.clock())
                outcomes: list[tuple[bool, Any]] = []
                for change, _, _ in batch:
                    before = doc.to_json()
                    try:
                        outcomes.append((True, change(doc)))
                    except Exception as exc:  # noqa: BLE001 - the caller's own error, handed to it below
                        doc = _Doc(before, float("-inf"))  # undo whatever the change did before it raised
                        outcomes.append((False, exc))
                written = doc.to_json()
                if any(ok for ok, _ in outcomes):
                    try:
                        info = await write_record(
                            self.storage,
                            key,
                            written,
                            if_absent=etag is None,
                            if_match=etag,
                            durable=any(durable for _, _, durable in batch),
                        )
                    except (VersionConflict, Conflict):
                        # another replica wrote first: read its version and apply the changes again
                        self._known.pop(key, None)
                        await retry.again(
                            lambda: VersionConflict(
                                f"the usage record of {owner!r} kept changing while it was being updated; try again"
                            )
                        )
                        continue
                    except TransferError:
                        self._known.pop(key, None)  # the write may or may not have happened: read it next time
                        raise
                    # what we wrote is the record until its version changes: the next round compares against it
                    # instead of reading it back (another replica's write still makes that compare fail)
                    self._known[key] = (written, info.etag)
                for (_, future, _), (ok, value) in zip(batch, outcomes, strict=True):
                    if not future.done():
                        if ok:
                            future.set_result(value)
                        else:
                            future.set_exception(value)
                return
        except BaseException as exc:
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else StorageUnavailable(str(exc)))
            if not isinstance(exc, Exception):
                raise  # cancelled or exiting: every caller has its answer; the callers report the errors

    async def usage(self, owner: str | None) -> Usage:
        """``owner``'s usage as stored now (lapsed reservations left out)."""
        raw, _ = await self._read(usage_key(owner))
        return _Doc(raw, self.clock()).usage(self.quota_of(owner))

    async def reserve(self, owner: str | None, rid: str, nbytes: int, until: float) -> Usage:
        """Reserve ``nbytes`` for upload ``rid`` until ``until`` (QuotaExceeded if they do not fit); returns the
        usage with the reservation. Without a quota nothing is written: there is nothing to protect."""
        quota = self.quota_of(owner)
        if quota is None:
            return await self.usage(owner)

        def change(doc: _Doc) -> Usage:
            doc.usage(quota, excluding=rid).require_room(nbytes)
            doc.reservations[rid] = (nbytes, until)
            return doc.usage(quota)

        return await self._update(owner, change)

    async def reserve_at_least(self, owner: str | None, rid: str, nbytes: int, until: float) -> None:
        """Grow upload ``rid``'s reservation to ``nbytes`` (a reservation never shrinks here), before the bytes
        that take it there are stored: QuotaExceeded if they do not fit beside the key's other reservations.
        What an upload of unknown length holds as it grows. Without a quota nothing is written."""
        quota = self.quota_of(owner)
        if quota is None:
            return

        def change(doc: _Doc) -> None:
            held = doc.reservations.get(rid, (0, until))[0]
            if held < nbytes:
                doc.usage(quota, excluding=rid).require_room(nbytes)
                doc.reservations[rid] = (nbytes, until)

        await self._update(owner, change)

    async def available_to(self, owner: str | None, rid: str) -> int | None:
        """Bytes upload ``rid`` may still bring (its own reservation counted as its room); None: no quota."""
        quota = self.quota_of(owner)
        if quota is None:
            return None
        raw, _ = await self._read(usage_key(owner))
        return _Doc(raw, self.clock()).usage(quota, excluding=rid).available

    async def release(self, owner: str | None, rid: str) -> None:
        """Forget upload ``rid``'s reservation (it ended without a file)."""
        if self.quota_of(owner) is None:
            return

        def change(doc: _Doc) -> None:
            doc.reservations.pop(rid, None)

        await self._update(owner, change)

    async def charge(
        self,
        owner: str | None,
        rid: str,
        nbytes: int,
        *,
        until: float | None = None,
        files: int = 1,
        durable: bool = True,
    ) -> bool:
        """Count a file of ``nbytes`` about to be published by upload ``rid`` (its reservation goes); QuotaExceeded
        if it does not fit, and then nothing changes. With ``until`` (a time past which no completion of ``rid``
        can come) the charge is made at most once per upload id: False when ``rid`` was counted already (by another
        replica or a concurrent completion), and then nothing changes either. ``files=0``: bytes stored that are
        not a file (a bundle's record, a TP message waiting in a mailbox), counted in ``used`` only.

        ``durable=False``: the publish that follows flushes the charge to disk with itself
        (``flushes_earlier_writes``), before it answers."""
        quota = self.quota_of(owner)

        def change(doc: _Doc) -> bool:
            if until is not None and rid in doc.charged:
                return False
            doc.usage(quota, excluding=rid).require_room(nbytes)
            doc.reservations.pop(rid, None)
            doc.used += nbytes
            doc.files += files
            if until is not None:
                doc.charged[rid] = (nbytes, until)
            return True

        return await self._update(owner, change, durable=durable)

    async def withdraw(self, owner: str | None, rid: str, nbytes: int) -> None:
        """Take back the charge of upload ``rid`` whose publication failed (it may be charged again by a retry)."""

        def change(doc: _Doc) -> None:
            doc.charged.pop(rid, None)
            doc.used = max(0, doc.used - nbytes)
            doc.files = max(0, doc.files - 1)

        await self._update(owner, change)

    async def refund(self, owner: str | None, nbytes: int, files: int = 1) -> None:
        """Uncount a file whose publish failed after its charge (a removed file goes through :meth:`removed`)."""

        def change(doc: _Doc) -> None:
            doc.used = max(0, doc.used - nbytes)
            doc.files = max(0, doc.files - files)

        await self._update(owner, change)

    async def count_bytes(self, owner: str | None, nbytes: int) -> None:
        """Count ``nbytes`` about to be stored for ``owner`` that are no file (chunks kept for later versions):
        QuotaExceeded, and nothing changes, when they do not fit beside its files and reservations."""
        quota = self.quota_of(owner)

        def change(doc: _Doc) -> None:
            doc.usage(quota).require_room(nbytes)
            doc.used += nbytes

        await self._update(owner, change)

    async def claim_removal(self, owner: str | None, file_id: str, nbytes: int) -> bool:
        """Claim the removal of ``file_id`` (``nbytes`` counted): True for the one caller whose compare-and-set
        round put the claim in the record, False while another caller's claim holds. A claim holds until
        :meth:`removed` or :meth:`unclaim`, or at most :data:`REMOVAL_LEASE` seconds (its claimer died)."""
        until = self.clock() + REMOVAL_LEASE

        def change(doc: _Doc) -> bool:
            if file_id in doc.removals:
                return False
            doc.removals[file_id] = (nbytes, until)
            return True

        # not flushed: a claim lost in a crash only lets another removal claim the file (which it then finds there
        # or gone, as always); what must survive a crash is the refund, and that write is durable
        return await self._update(owner, change, durable=False)

    async def removed(self, owner: str | None, file_id: str, nbytes: int, *, files: int = 1) -> None:
        """The claimer of ``file_id`` removed it: the claim goes and its bytes leave the count, in one write
        (``files=0``: it was charged with ``files=0``: a bundle, a message, a stored chunk)."""

        def change(doc: _Doc) -> None:
            doc.removals.pop(file_id, None)
            doc.used = max(0, doc.used - nbytes)
            doc.files = max(0, doc.files - files)

        await self._update(owner, change)

    async def unclaim(self, owner: str | None, file_id: str) -> None:
        """Give back the claim on ``file_id`` without a refund (its file was gone already, or its removal failed)."""

        def change(doc: _Doc) -> None:
            doc.removals.pop(file_id, None)

        await self._update(owner, change, durable=False)

    async def recorded(self, owner: str | None) -> tuple[int, int, dict[str, int], str | None]:
        """What the record of ``owner`` says now: bytes used, files, the live removal claims (file id -> bytes),
        and the record's version (None: no record yet). For :meth:`correct`, after a count of the files."""
        raw, etag = await self._read(usage_key(owner))
        doc = _Doc(raw, self.clock())
        return doc.used, doc.files, {file_id: n for file_id, (n, _) in doc.removals.items()}, etag

    async def correct(self, owner: str | None, used: int, files: int, etag: str | None) -> bool:
        """Set ``owner``'s bytes used and files to a count made after reading version ``etag`` of its record
        (:meth:`recorded`), only if the record is still at that version: False when anything was charged,
        refunded or reserved meanwhile (count again). Reservations and claims are kept as they are."""
        key = usage_key(owner)
        raw, current = await self._read(key)
        if current != etag:
            return False
        doc = _Doc(raw, self.clock())
        doc.used, doc.files = used, files
        self._known.pop(key, None)  # this process's last write will not be the record any more
        try:
            await write_record(self.storage, key, doc.to_json(), if_absent=etag is None, if_match=etag)
        except (VersionConflict, Conflict):
            return False
        return True
