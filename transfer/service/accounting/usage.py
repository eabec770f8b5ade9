"""Bytes stored per API key, counted in one small record per key that every replica updates with the storage
backend's compare-and-set, through the record store (:class:`~transfer.service.accounting.recordstore.RecordStore`: its
bounded retries and its group commit: concurrent changes of one key's record share one write).

Record ``usage/<key hash>``: ``{"used": bytes, "files": n, "reservations": {"<upload id>": [bytes, until]},
"changes": {"<id>": [bytes, files, until, applied]}}``.

``changes`` holds the state changes that publish or remove one thing (a file, a bundle, a TP message, a stored
chunk), keyed by the id of the change (the upload that publishes, the thing removed), each with its signed deltas
of ``used`` and ``files`` and a time it is kept until. A change is applied to the count exactly once, however many
replicas, retries, deletes and sweeps race: the compare-and-set round that enters its id is the one that decides,
and every other caller finds the id there.

- a publication (``charge`` with ``until``) is applied in the round that enters it (``applied`` true, ``+bytes``):
  the entry stays until no completion of that upload can come any more, so a second one is not counted;
- a removal (``claim_removal``) is entered unapplied (``-bytes``, its claim, held for a lease) by the one caller
  that removes the thing; the write that ends the claim (``removed``) applies it; ``unclaim`` drops it unapplied.

Records of the older shape (``"charged": {"<upload id>": [bytes, until]}``, applied publications, and
``"removals": {"<id>": [bytes, until]}``, removal claims) read as the same changes and are written in this shape.

    reserve(owner, rid, n)   an unfinished upload declares its size: refused (QuotaExceeded) unless it fits
    charge(owner, rid, n)    a file is about to be published: its reservation goes, its bytes count; refused
                             unless they fit (the exact check: a stream of unknown length is caught here at last).
                             With ``until``, at most once per upload id (its publication change)
    withdraw(owner, rid, n)  the publication that charged upload ``rid`` failed: its charge is taken back
    refund(owner, n)         a file's publish failed after the charge
    release(owner, rid)      an upload ended without a file (aborted, expired, terminated)
    claim_removal(owner, id, n)   a file is about to be removed: True for exactly one caller at a time (the
                             removal entered unapplied by compare-and-set); every other caller is told False
    removed(owner, id, n)    the claimer removed the file: its removal is applied and leaves the record, in one
                             write (a file is refunded once, however many deletes, sweeps and replicas race)
    unclaim(owner, id)       the claimer found the file gone already: the removal leaves unapplied

A charge comes before the publish and a refund after the delete, so the count is never below what is stored: a
process that dies between the two leaves it too high (the safe side), never too low; ``transfer usage repair``
recomputes it from the file records. A reservation lives until its ``until`` (the upload's own expiry), a removal
claim until its lease ends: one left by a dead process stops counting then.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from transfer.core.auth import ApiKey
from transfer.core.uploads.lifetimes import Usage
from transfer.errors import Conflict, NotFound
from transfer.service.accounting.recordstore import RecordStore

USAGE_PREFIX = "usage/"
REMOVAL_LEASE = 600.0  # seconds a removal claim holds: a claimer that died frees the file for another removal then

R = TypeVar("R")

# the limits of an owner (its quota among them), whatever kind of identity it is: Identities.limits
LimitsOf = Callable[[str | None], Awaitable[ApiKey | None]]


def limits_from(keys: Mapping[str, ApiKey]) -> LimitsOf:
    """The limits of a fixed set of keys by name (the keys of the settings, in tests and tools)."""

    async def limits(owner: str | None) -> ApiKey | None:
        return None if owner is None else keys.get(owner)

    return limits


def usage_key(owner: str | None) -> str:
    """The record of ``owner`` (a key name; None: files stored in open mode). Hashed: names are free text."""
    if owner is None:
        return USAGE_PREFIX + "open"
    return USAGE_PREFIX + "k" + hashlib.sha256(owner.encode("utf-8")).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class StateChange:
    """One publication or removal in a key's record: what it adds to ``used`` and ``files`` (signed: a removal
    takes away), until when its entry is kept, and whether it is in the count already (a publication, kept so that
    a repeat is refused) or still to be applied by the one caller that claimed it (a removal)."""

    nbytes: int
    files: int
    until: float
    applied: bool

    def to_json(self) -> list[Any]:
        """The entry as the record stores it: ``[bytes, files, until, applied]``."""
        return [self.nbytes, self.files, self.until, self.applied]


def _entries(raw: Any) -> list[tuple[str, list[Any]]]:
    return [(k, v) for k, v in raw.items() if isinstance(v, list)] if isinstance(raw, dict) else []


def _changes(raw: Mapping[str, Any], now: float) -> dict[str, StateChange]:
    """The live state changes of a stored record, of either shape (an entry past its ``until`` is dropped: its
    upload can no longer complete, or its claimer died)."""
    changes: dict[str, StateChange] = {}
    for rid, entry in _entries(raw.get("charged")):  # the older shape: publications, applied
        changes[rid] = StateChange(int(entry[0]), 1, float(entry[1]), True)
    for thing, entry in _entries(raw.get("removals")):  # the older shape: removal claims, not applied
        changes[thing] = StateChange(-int(entry[0]), -1, float(entry[1]), False)
    for thing, entry in _entries(raw.get("changes")):
        changes[thing] = StateChange(int(entry[0]), int(entry[1]), float(entry[2]), bool(entry[3]))
    return {thing: change for thing, change in changes.items() if change.until > now}


class _Doc:
    """One usage record as the ledger's changes see it (each change works on its own copy: they are pure)."""

    def __init__(self, raw: Mapping[str, Any], now: float) -> None:
        self.used = int(raw.get("used", 0))
        self.files = int(raw.get("files", 0))
        reservations = raw.get("reservations", {})
        self.reservations: dict[str, tuple[int, float]] = {
            rid: (int(entry[0]), float(entry[1]))
            for rid, entry in (reservations.items() if isinstance(reservations, dict) else ())
            if float(entry[1]) > now  # a reservation past its time (its upload ended or its process died) is dropped
        }
        self.changes = _changes(raw, now)

    def copy(self) -> _Doc:
        doc = _Doc({}, 0.0)
        doc.used, doc.files = self.used, self.files
        doc.reservations, doc.changes = dict(self.reservations), dict(self.changes)
        return doc

    def same(self, other: _Doc) -> bool:
        return (self.used, self.files, self.reservations, self.changes) == (
            other.used,
            other.files,
            other.reservations,
            other.changes,
        )

    def usage(self, quota: int | None, excluding: str | None = None) -> Usage:
        reserved = sum(n for rid, (n, _) in self.reservations.items() if rid != excluding)
        return Usage(used=self.used, files=self.files, reserved=reserved, quota=quota)

    def begin(self, thing: str, change: StateChange) -> bool:
        """Enter ``change`` under ``thing`` (applied now if it says so): False, and nothing changes, when a change
        of that id is on record already (applied, or claimed by another caller)."""
        if thing in self.changes:
            return False
        self.changes[thing] = change
        if change.applied:
            self.add(change.nbytes, change.files)
        return True

    def add(self, nbytes: int, files: int) -> None:
        """Count ``nbytes`` and ``files`` more (negative: fewer; never below nothing)."""
        self.used = max(0, self.used + nbytes)
        self.files = max(0, self.files + files)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "used": self.used,
            "files": self.files,
            "reservations": {rid: [n, until] for rid, (n, until) in self.reservations.items()},
        }
        if self.changes:
            doc["changes"] = {thing: change.to_json() for thing, change in self.changes.items()}
        return doc


class UsageLedger:
    """Per-key byte counts and quotas over one storage backend, exact across replicas (compare-and-set)."""

    def __init__(
        self,
        records: RecordStore,
        keys: Mapping[str, ApiKey] | LimitsOf,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.records = records
        self.storage = records.storage
        self.policy = records.policy
        self.limits: LimitsOf = keys if callable(keys) else limits_from(keys)
        self.clock = clock

    async def quota_of(self, owner: str | None) -> int | None:
        """The byte quota of ``owner`` (None: no quota), read through the one interface of owners' limits."""
        key = await self.limits(owner)
        return None if key is None else key.max_bytes

    def _decode(self, raw: Any) -> _Doc:
        return _Doc(raw if isinstance(raw, dict) else {}, self.clock())

    async def _read(self, owner: str | None) -> tuple[_Doc, str | None]:
        """The record of ``owner`` as stored now and its version (None: no record yet)."""
        try:
            raw, etag = await self.records.read(usage_key(owner))
        except NotFound:
            return self._decode({}), None
        return self._decode(raw), etag

    async def _update(self, owner: str | None, step: Callable[[_Doc], R], *, durable: bool = True) -> R:
        """Apply ``step`` to the owner's record with compare-and-set, grouped with the concurrent changes of the
        same record (one write for all of them: the record's write is what every upload of a key would otherwise
        queue behind), and return what it answered. ``step`` may raise (QuotaExceeded): then nothing of it is
        written. A caller returns only after the write that holds its change has succeeded. ``durable=False``: a
        change that may be lost in a crash (a removal claim: its loss frees the file for another removal); the
        write is flushed to stable storage if any change in its round needs it."""
        answers: list[R] = []

        def change(doc: _Doc) -> _Doc | None:
            after = doc.copy()
            answers.append(step(after))
            return None if after.same(doc) else after

        await self.records.update(
            usage_key(owner), self._decode, change, _Doc.to_json, absent={}, durable=durable, group=True
        )
        return answers[-1]  # the last run of the step is the one the record holds

    async def usage(self, owner: str | None) -> Usage:
        """``owner``'s usage as stored now (lapsed reservations left out)."""
        doc, _ = await self._read(owner)
        return doc.usage(await self.quota_of(owner))

    async def reserve(self, owner: str | None, rid: str, nbytes: int, until: float) -> Usage:
        """Reserve ``nbytes`` for upload ``rid`` until ``until`` (QuotaExceeded if they do not fit); returns the
        usage with the reservation. Without a quota nothing is written: there is nothing to protect."""
        quota = await self.quota_of(owner)
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
        quota = await self.quota_of(owner)
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
        quota = await self.quota_of(owner)
        if quota is None:
            return None
        doc, _ = await self._read(owner)
        return doc.usage(quota, excluding=rid).available

    async def release(self, owner: str | None, rid: str) -> None:
        """Forget upload ``rid``'s reservation (it ended without a file)."""
        if await self.quota_of(owner) is None:
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
        quota = await self.quota_of(owner)

        def change(doc: _Doc) -> bool:
            if until is not None and rid in doc.changes:
                return False  # this upload's publication is counted already
            doc.usage(quota, excluding=rid).require_room(nbytes)
            doc.reservations.pop(rid, None)
            if until is None:
                doc.add(nbytes, files)
                return True
            return doc.begin(rid, StateChange(nbytes, files, until, applied=True))

        return await self._update(owner, change, durable=durable)

    async def withdraw(self, owner: str | None, rid: str, nbytes: int) -> None:
        """Take back the charge of upload ``rid`` whose publication failed (it may be charged again by a retry).
        Once: a charge already taken back (by a concurrent failure of the same upload) is not taken back again."""

        def change(doc: _Doc) -> None:
            if doc.changes.pop(rid, None) is not None:
                doc.add(-nbytes, -1)

        await self._update(owner, change)

    async def refund(self, owner: str | None, nbytes: int, files: int = 1) -> None:
        """Uncount a file whose publish failed after its charge (a removed file goes through :meth:`removed`)."""

        def change(doc: _Doc) -> None:
            doc.add(-nbytes, -files)

        await self._update(owner, change)

    async def count_bytes(self, owner: str | None, nbytes: int) -> None:
        """Count ``nbytes`` about to be stored for ``owner`` that are no file (chunks kept for later versions):
        QuotaExceeded, and nothing changes, when they do not fit beside its files and reservations."""
        quota = await self.quota_of(owner)

        def change(doc: _Doc) -> None:
            doc.usage(quota).require_room(nbytes)
            doc.add(nbytes, 0)

        await self._update(owner, change)

    async def claim_removal(self, owner: str | None, file_id: str, nbytes: int, *, files: int = 1) -> bool:
        """Claim the removal of ``file_id`` (``nbytes`` and ``files`` counted): True for the one caller whose
        compare-and-set round entered the removal in the record, False while another caller's claim holds. A claim
        holds until :meth:`removed` or :meth:`unclaim`, or at most :data:`REMOVAL_LEASE` seconds (its claimer
        died)."""
        removal = StateChange(-nbytes, -files, self.clock() + REMOVAL_LEASE, applied=False)

        def change(doc: _Doc) -> bool:
            return doc.begin(file_id, removal)

        # not flushed: a claim lost in a crash only lets another removal claim the file (which it then finds there
        # or gone, as always); what must survive a crash is the refund, and that write is durable
        return await self._update(owner, change, durable=False)

    async def removed(self, owner: str | None, file_id: str, nbytes: int, *, files: int = 1) -> None:
        """The claimer of ``file_id`` removed it: the removal is applied (``nbytes`` and ``files`` leave the count;
        ``files=0``: it was charged with ``files=0``: a bundle, a message, a stored chunk) and leaves the record,
        in one write."""

        def change(doc: _Doc) -> None:
            doc.changes.pop(file_id, None)
            doc.add(-nbytes, -files)

        await self._update(owner, change)

    async def unclaim(self, owner: str | None, file_id: str) -> None:
        """Give back the claim on ``file_id`` without a refund (its file was gone already, or its removal failed)."""

        def change(doc: _Doc) -> None:
            claim = doc.changes.get(file_id)
            if claim is not None and not claim.applied:
                del doc.changes[file_id]

        await self._update(owner, change, durable=False)

    async def recorded(self, owner: str | None) -> tuple[int, int, dict[str, int], str | None]:
        """What the record of ``owner`` says now: bytes used, files, the live removal claims (file id -> bytes),
        and the record's version (None: no record yet). For :meth:`correct`, after a count of the files."""
        doc, etag = await self._read(owner)
        claims = {thing: -change.nbytes for thing, change in doc.changes.items() if not change.applied}
        return doc.used, doc.files, claims, etag

    async def correct(self, owner: str | None, used: int, files: int, etag: str | None) -> bool:
        """Set ``owner``'s bytes used and files to a count made after reading version ``etag`` of its record
        (:meth:`recorded`), only if the record is still at that version: False when anything was charged,
        refunded or reserved meanwhile (count again). Reservations and claims are kept as they are."""
        doc, current = await self._read(owner)
        if current != etag:
            return False
        doc.used, doc.files = used, files
        try:
            await self.records.write(usage_key(owner), doc.to_json(), etag)
        except Conflict:  # VersionConflict too: it changed since
            return False
        return True
