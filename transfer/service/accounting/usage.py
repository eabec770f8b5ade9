"""Bytes stored per API key, counted in a few small records per key (shards) that every replica updates with the
storage backend's compare-and-set, through the record store (:class:`~transfer.service.accounting.recordstore.
RecordStore`: its bounded retries and its group commit: concurrent changes of one record share one write).

Why shards: one record per key was one hot record. Every upload of a key (and every upload in open mode) changed it
by compare-and-set, so replicas added lost races instead of throughput (1 / 2 / 3 replicas: 35 / 36 / 17 small
uploads per second, 5.5 / 7.2 / 10.8 ms of CPU each). Now what one upload changes lives in the shard its id falls
in (``shard_of``: the id's random part, so an upload, the file it publishes and that file's removal meet in one
shard, and "charged once per upload" is still decided by one compare-and-set). A serving process draws the ids it
makes into one shard of its own, chosen at random (:func:`transfer.core.ids.draw_ids_into`): replicas then write
mostly different shards, and the version of a shard a replica knows is still current when it writes again (with
every replica writing every shard, its first conditional write usually lost to one that wrote since).

Record ``usage/<key hash>`` (the first shard) and ``usage/<key hash>.s<nn>`` (the others, nn < ``shards``):
``{"used": bytes, "files": n, "reservations": {"<upload id>": [bytes, until]}, "changes": {"<id>": [bytes, files,
until, applied]}, "cap": bytes, "q": quota, "out": {"<move>": [shard, bytes, at]}, "in": {"<move>": at}}``. An
absent shard stands for an empty one.

The quota stays exact. It is allotted to the shards (``cap``, an allotment made for quota ``q``; an absent shard
holds an even share), and a shard takes a change only if its own ``used +
reserved`` stays within its own ``cap``: since the caps never add up to more than the quota, neither do the bytes.
A shard that lacks room takes allotment from the others (:meth:`UsageLedger._gather`): a move is taken from one shard
(its ``cap`` lowered and the move recorded in its ``out``, one compare-and-set), then given to the other (its
``cap`` raised and the move remembered in its ``in``, so a move is given once); a move whose giver stopped in
between is given by the next gatherer that finds it older than :data:`MOVE_STALE`. When the quota changes, each
shard adjusts its own cap by the difference of its share. A key without a quota (and open mode) has no allotment:
its shards only count.

``changes`` holds the state changes that publish or remove one thing (a file, a bundle, a TP message, a pack of
chunks), keyed by the id of the change (the upload that publishes, the thing removed), each with its signed deltas
of ``used`` and ``files`` and a time it is kept until. A change is applied to the count exactly once, however many
replicas, retries, deletes and sweeps race: the compare-and-set round that enters its id (in the one shard the id
falls in) is the one that decides, and every other caller finds the id there.

- a publication (``charge`` with ``until``) is applied in the round that enters it (``applied`` true, ``+bytes``):
  the entry stays until no completion of that upload can come any more, so a second one is not counted;
- a removal (``claim_removal``) is entered unapplied (``-bytes``, its claim, held for a lease) by the one caller
  that removes the thing; the write that ends the claim (``removed``) applies it; ``unclaim`` drops it unapplied.

    reserve(owner, rid, n)   an unfinished upload declares its size: refused (QuotaExceeded) unless it fits
    charge(owner, rid, n)    a file is about to be published: its reservation goes, its bytes count; refused
                             unless they fit (the exact check: a stream of unknown length is caught here at last).
                             With ``until``, at most once per upload id (its publication change)
    withdraw(owner, rid, n)  the publication that charged upload ``rid`` failed: its charge is taken back (once)
    refund(owner, n, rid)    a file's publish failed after an unmarked charge
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

The first shard's record is the one-record layout's (``usage/<key hash>``), and it records how many shards the key
has (``shards``), fixed when it was first written: a key counted in one record before shards existed stays one
record (its counts, reservations and charge marks are all there), and changing the setting applies to keys whose
usage begins after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from storage.base import Storage
from transfer.core.auth import ApiKey
from transfer.core.ids import new_id
from transfer.core.uploads.lifetimes import Usage
from transfer.errors import (
    Conflict,
    NotFound,
    QuotaExceeded,
    RecordBusy,
    TransferError,
    storage_errors_translated,
)
from transfer.service.accounting.recordstore import RecordStore, RetryPolicy
from transfer.service.accounting.shards import (
    SHARDS,
    NoRoom,
    ShardDoc,
    StateChange,
    quota_exceeded,
    shard_key,
    shard_of,
    share_of,
    usage_key,
)

REMOVAL_LEASE = 600.0  # seconds a removal claim holds: a claimer that died frees the file for another removal then
MOVE_STALE = 60.0  # seconds after which a move taken but not given (its mover stopped) is given by another
GATHER_WAIT = 10.0  # seconds a change waits for another gatherer of its key (then 503 record_busy)
GATHER_LEASE = 10.0  # seconds one gatherer holds a key's allotments (a gather takes milliseconds)
GATHERS = 4  # times a change that lacks room in its shard gathers allotment before it is refused

R = TypeVar("R")

# the limits of an owner (its quota among them), whatever kind of identity it is: Identities.limits
LimitsOf = Callable[[str | None], Awaitable[ApiKey | None]]


def limits_from(keys: Mapping[str, ApiKey]) -> LimitsOf:
    """The limits of a fixed set of keys by name (the keys of the settings, in tests and tools)."""

    async def limits(owner: str | None) -> ApiKey | None:
        return None if owner is None else keys.get(owner)

    return limits


class UsageLedger:
    """Per-key byte counts and quotas over one storage backend, exact across replicas (compare-and-set), in
    ``shards`` records per key (the module text)."""

    def __init__(
        self,
        records: RecordStore,
        keys: Mapping[str, ApiKey] | LimitsOf,
        *,
        clock: Callable[[], float] = time.time,
        shards: int = SHARDS,
    ) -> None:
        self.records = records
        self.storage: Storage = records.storage
        self.policy = records.policy
        self.limits: LimitsOf = keys if callable(keys) else limits_from(keys)
        self.clock = clock
        self.shards = shards
        self._counts: dict[str | None, int] = {}  # owner -> how many shards its usage has (see _count)

    async def quota_of(self, owner: str | None) -> int | None:
        """The byte quota of ``owner`` (None: no quota), read through the one interface of owners' limits."""
        key = await self.limits(owner)
        return None if key is None else key.max_bytes

    async def _count(self, owner: str | None) -> int:
        """How many shards ``owner``'s usage has, fixed when its first shard was first written (read once per
        process): the ledger's number for a key not seen yet; one for a record of the one-record layout (which
        stays one record: its counts, reservations and marks are all there)."""
        count = self._counts.get(owner)
        if count is None:
            try:
                raw, _ = await self.records.read(shard_key(owner, 0))
                count = int(raw.get("shards", 1)) if isinstance(raw, dict) else self.shards
            except NotFound:
                count = self.shards
            self._counts[owner] = count
        return count

    async def _decoder(self, owner: str | None, shard: int, count: int) -> Callable[[Any], ShardDoc]:
        quota = await self.quota_of(owner)

        def decode(raw: Any) -> ShardDoc:
            share = None if quota is None else share_of(quota, shard, count)
            doc = ShardDoc(raw if isinstance(raw, dict) else {}, self.clock(), share, quota)
            if shard == 0:
                doc.shards = count
            if quota is None:
                doc.cap = doc.q = None  # no quota (any more): the shard only counts
            elif doc.q != quota:  # the quota changed: this shard's allotment follows its share of the difference
                before = 0 if doc.q is None else share_of(doc.q, shard, count)
                doc.cap = (doc.cap or 0) + share_of(quota, shard, count) - before
                doc.q = quota
            return doc

        return decode

    async def _read_shard(self, owner: str | None, shard: int) -> tuple[ShardDoc, str | None]:
        count = await self._count(owner)
        try:
            raw, etag = await self.records.read(shard_key(owner, shard))
        except NotFound:
            return (await self._decoder(owner, shard, count))({}), None
        return (await self._decoder(owner, shard, count))(raw), etag

    async def _read_all(self, owner: str | None) -> list[tuple[ShardDoc, str | None]]:
        count = await self._count(owner)
        return list(await asyncio.gather(*(self._read_shard(owner, s) for s in range(count))))

    async def _update_shard(
        self, owner: str | None, shard: int, step: Callable[[ShardDoc], R], *, durable: bool = True
    ) -> R:
        """Apply ``step`` to one shard with compare-and-set, grouped with the concurrent changes of the same shard
        (one write for all of them), and return what it answered. ``step`` may raise: then nothing of it is
        written. ``durable=False``: a change that may be lost in a crash (a removal claim)."""
        answers: list[R] = []

        def change(doc: ShardDoc) -> ShardDoc | None:
            after = doc.copy()
            answers.append(step(after))
            return None if after.same(doc) else after

        await self.records.update(
            shard_key(owner, shard),
            await self._decoder(owner, shard, await self._count(owner)),
            change,
            ShardDoc.to_json,
            absent={},
            durable=durable,
            group=True,
        )
        return answers[-1]  # the last run of the step is the one the record holds

    async def _update(self, owner: str | None, rid: str, step: Callable[[ShardDoc], R], *, durable: bool = True) -> R:
        """:meth:`_update_shard` on the shard ``rid`` falls in; when that shard's own allotment lacks room (the
        step raised NoRoom), allotment is gathered from the other shards and the step runs again (QuotaExceeded
        when the key's whole quota lacks it)."""
        shard = shard_of(rid, await self._count(owner))
        for _ in range(GATHERS):
            try:
                return await self._update_shard(owner, shard, step, durable=durable)
            except NoRoom as short:
                need = short.need
                await self._gather(owner, shard, need)
        # each gather found room, and concurrent uploads of the key took it first: the quota is not known to be
        # used up (a gather that finds too little refuses with QuotaExceeded), so the client is asked to try again
        raise RecordBusy(f"the quota of {owner!r} is being taken by concurrent uploads; try again")

    async def _gather(self, owner: str | None, target: int, need: int) -> None:
        """Move at least ``need`` bytes of allotment into shard ``target`` from the others (each move: taken from
        one shard by compare-and-set, then given to the target, once); QuotaExceeded when they hold too little.
        One gatherer of a key at a time (a lease record, on any replica): gatherers taking from each other would
        leave the quota in fragments no upload fits in, near its end. Moves left half-done by a gatherer that
        stopped are given first."""
        # no refusal before the lease: shards read while a gatherer moves allotment between them may miss what is
        # moving (read at the target before it arrives, at the source after it left); under the lease only this
        # gatherer moves, so what it reads is whole
        async with self._gathering(owner):
            await self._gather_held(owner, target, need)

    async def _refusal(self, owner: str | None, shards: list[tuple[ShardDoc, str | None]], need: int) -> QuotaExceeded:
        quota = await self.quota_of(owner)
        assert quota is not None
        used = sum(doc.used for doc, _ in shards)
        reserved = sum(doc.reserved() for doc, _ in shards)
        return quota_exceeded(quota, used, reserved, need)

    @contextlib.asynccontextmanager
    async def _gathering(self, owner: str | None) -> AsyncIterator[None]:
        """Hold ``owner``'s gather lease (waiting for it up to the retry policy's budget: RecordBusy then)."""
        key = f"{usage_key(owner)}.gather"
        retry = RetryPolicy(attempts=400, budget=GATHER_WAIT, cap=0.05, clock=self.policy.clock).start()
        while True:
            now = self.clock()
            try:
                await self.records.create(key, {"until": now + GATHER_LEASE})
                break
            except Conflict:
                try:
                    held, etag = await self.records.read(key)
                    if float(held.get("until", 0)) <= now:  # its holder stopped: the lease is taken over
                        await self.records.write(key, {"until": now + GATHER_LEASE}, etag)
                        break
                except (NotFound, Conflict):
                    pass
            await retry.again(lambda: RecordBusy(f"the usage of {owner!r} is being rebalanced; try again"))
        try:
            yield
        finally:
            with contextlib.suppress(TransferError), storage_errors_translated():
                await self.storage.delete(key)

    async def _gather_held(self, owner: str | None, target: int, need: int) -> None:
        quota = await self.quota_of(owner)
        assert quota is not None
        shards = await self._read_all(owner)
        now = self.clock()
        stale = [
            (source, to, xid, amount)
            for source, (doc, _) in enumerate(shards)
            for xid, (to, amount, at) in doc.out.items()
            if now - at > MOVE_STALE
        ]
        for source, to, xid, amount in stale:  # moves taken but never given (their mover stopped)
            await self._give(owner, source, to, xid, amount)
        if stale:
            shards = await self._read_all(owner)
            need -= sum(amount for _, to, _, amount in stale if to == target)  # what arrived where it is needed
            if need <= 0:
                return
        free = {s: doc.room() or 0 for s, (doc, _) in enumerate(shards) if s != target}
        # signed: a shard over its own allotment (its quota lowered since) takes its excess from what others hold
        if sum(free.values()) < need:
            raise await self._refusal(owner, shards, need)
        # at least an even share of what is free: a shard that gathers once keeps enough for a while
        count = len(shards)
        left = max(need, min(sum(max(0, room) for room in free.values()) // count, quota // count))
        for source in sorted(free, key=lambda s: -free[s]):
            if left <= 0 or free[source] <= 0:
                break
            xid = new_id("m_")
            wanted = left

            def take(doc: ShardDoc, wanted: int = wanted, xid: str = xid) -> int:
                amount = min(wanted, max(0, doc.room() or 0))
                if amount:
                    assert doc.cap is not None
                    doc.cap -= amount
                    doc.out[xid] = (target, amount, self.clock())
                return amount

            taken = await self._update_shard(owner, source, take)
            if taken:
                await self._give(owner, source, target, xid, taken)
                left -= taken

    async def _give(self, owner: str | None, source: int, target: int, xid: str, amount: int) -> None:
        """Give move ``xid`` (``amount`` taken from ``source``) to ``target`` once, then forget it at the source."""

        def give(doc: ShardDoc) -> None:
            if xid not in doc.inn:
                doc.cap = (doc.cap or 0) + amount
                doc.inn[xid] = self.clock()

        def forget(doc: ShardDoc) -> None:
            doc.out.pop(xid, None)

        # neither flushed: a give lost in a crash leaves the move (flushed when taken) to be given again once stale
        # (the target's memory of it went too), a forget lost leaves a move the target already remembers
        await self._update_shard(owner, target, give, durable=False)
        await self._update_shard(owner, source, forget, durable=False)

    def _require(self, doc: ShardDoc, nbytes: int, excluding: str | None = None) -> None:
        """NoRoom unless ``nbytes`` more fit in this shard's own allotment (a key without a quota: always)."""
        if not doc.fits(nbytes, excluding):
            room = doc.room(excluding) or 0
            raise NoRoom(nbytes - room)

    async def usage(self, owner: str | None) -> Usage:
        """``owner``'s usage as stored now (lapsed reservations left out): the sum of its shards."""
        shards = await self._read_all(owner)
        return Usage(
            used=sum(doc.used for doc, _ in shards),
            files=sum(doc.files for doc, _ in shards),
            reserved=sum(doc.reserved() for doc, _ in shards),
            quota=await self.quota_of(owner),
        )

    async def reserve(self, owner: str | None, rid: str, nbytes: int, until: float) -> None:
        """Reserve ``nbytes`` for upload ``rid`` until ``until`` (QuotaExceeded if they do not fit). Without a
        quota nothing is written: there is nothing to protect."""
        if await self.quota_of(owner) is None:
            return

        def change(doc: ShardDoc) -> None:
            self._require(doc, nbytes, excluding=rid)
            doc.reservations[rid] = (nbytes, until)

        await self._update(owner, rid, change)

    async def reserve_at_least(self, owner: str | None, rid: str, nbytes: int, until: float) -> None:
        """Grow upload ``rid``'s reservation to ``nbytes`` (a reservation never shrinks here), before the bytes
        that take it there are stored: QuotaExceeded if they do not fit beside the key's other reservations.
        What an upload of unknown length holds as it grows. Without a quota nothing is written."""
        if await self.quota_of(owner) is None:
            return

        def change(doc: ShardDoc) -> None:
            held = doc.reservations.get(rid, (0, until))[0]
            if held < nbytes:
                self._require(doc, nbytes, excluding=rid)
                doc.reservations[rid] = (nbytes, until)

        await self._update(owner, rid, change)

    async def available_to(self, owner: str | None, rid: str, *, at_least: int | None = None) -> int | None:
        """Bytes upload ``rid`` may still bring (its own reservation counted as its room); None: no quota. With
        ``at_least``: answered from ``rid``'s own shard (one read) when its allotment has that much room, else from
        every shard."""
        quota = await self.quota_of(owner)
        if quota is None:
            return None
        if at_least is not None:
            own, _ = await self._read_shard(owner, shard_of(rid, await self._count(owner)))
            room = own.room(excluding=rid)
            if room is not None and room >= at_least:
                return room
        shards = await self._read_all(owner)
        used = sum(doc.used for doc, _ in shards)
        reserved = sum(doc.reserved(excluding=rid) for doc, _ in shards)
        return max(0, quota - used - reserved)

    async def release(self, owner: str | None, rid: str) -> None:
        """Forget upload ``rid``'s reservation (it ended without a file)."""
        if await self.quota_of(owner) is None:
            return

        def change(doc: ShardDoc) -> None:
            doc.reservations.pop(rid, None)

        await self._update(owner, rid, change)

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

        def change(doc: ShardDoc) -> bool:
            if until is not None and rid in doc.changes:
                return False  # this upload's publication is counted already
            self._require(doc, nbytes, excluding=rid)
            doc.reservations.pop(rid, None)
            if until is None:
                doc.add(nbytes, files)
                return True
            return doc.begin(rid, StateChange(nbytes, files, until, applied=True))

        return await self._update(owner, rid, change, durable=durable)

    async def withdraw(self, owner: str | None, rid: str, nbytes: int) -> None:
        """Take back the charge of upload ``rid`` whose publication failed (it may be charged again by a retry).
        Once: a charge already taken back (by a concurrent failure of the same upload) is not taken back again."""

        def change(doc: ShardDoc) -> None:
            if doc.changes.pop(rid, None) is not None:
                doc.add(-nbytes, -1)

        await self._update(owner, rid, change)

    async def refund(self, owner: str | None, nbytes: int, files: int = 1, *, rid: str) -> None:
        """Uncount ``nbytes`` charged for ``rid`` without a publication mark (a plain upload whose publish failed
        after its charge, chunks counted and not kept); a removed file goes through :meth:`removed`."""

        def change(doc: ShardDoc) -> None:
            doc.add(-nbytes, -files)

        await self._update(owner, rid, change)

    async def count_bytes(self, owner: str | None, nbytes: int, *, rid: str) -> None:
        """Count ``nbytes`` about to be stored for ``owner`` under ``rid`` that are no file (a pack of chunks kept
        for later versions): QuotaExceeded, and nothing changes, when they do not fit beside its files and
        reservations."""

        def change(doc: ShardDoc) -> None:
            self._require(doc, nbytes)
            doc.add(nbytes, 0)

        await self._update(owner, rid, change)

    async def claim_removal(self, owner: str | None, file_id: str, nbytes: int, *, files: int = 1) -> bool:
        """Claim the removal of ``file_id`` (``nbytes`` and ``files`` counted): True for the one caller whose
        compare-and-set round entered the removal in the record, False while another caller's claim holds. A claim
        holds until :meth:`removed` or :meth:`unclaim`, or at most :data:`REMOVAL_LEASE` seconds (its claimer
        died)."""
        removal = StateChange(-nbytes, -files, self.clock() + REMOVAL_LEASE, applied=False)

        def change(doc: ShardDoc) -> bool:
            return doc.begin(file_id, removal)

        # not flushed: a claim lost in a crash only lets another removal claim the file (which it then finds there
        # or gone, as always); what must survive a crash is the refund, and that write is durable
        return await self._update(owner, file_id, change, durable=False)

    async def removed(self, owner: str | None, file_id: str, nbytes: int, *, files: int = 1) -> None:
        """The claimer of ``file_id`` removed it: the removal is applied (``nbytes`` and ``files`` leave the count;
        ``files=0``: it was charged with ``files=0``: a bundle, a message, a pack of chunks) and leaves the record,
        in one write."""

        def change(doc: ShardDoc) -> None:
            doc.changes.pop(file_id, None)
            doc.add(-nbytes, -files)

        await self._update(owner, file_id, change)

    async def unclaim(self, owner: str | None, file_id: str) -> None:
        """Give back the claim on ``file_id`` without a refund (its file was gone already, or its removal failed)."""

        def change(doc: ShardDoc) -> None:
            claim = doc.changes.get(file_id)
            if claim is not None and not claim.applied:
                del doc.changes[file_id]

        await self._update(owner, file_id, change, durable=False)

    async def recorded(self, owner: str | None) -> tuple[int, int, dict[str, int], str | None]:
        """What the records of ``owner`` say now: bytes used, files, the live removal claims (file id -> bytes),
        and the records' version (None: no record yet). For :meth:`correct`, after a count of the files."""
        shards = await self._read_all(owner)
        claims = {
            thing: -change.nbytes for doc, _ in shards for thing, change in doc.changes.items() if not change.applied
        }
        etags = [etag for _, etag in shards]
        version = None if all(e is None for e in etags) else etags[0] if len(etags) == 1 else repr(etags)
        used = sum(doc.used for doc, _ in shards)
        files = sum(doc.files for doc, _ in shards)
        return used, files, claims, version

    async def correct(self, owner: str | None, used: int, files: int, etag: str | None) -> bool:
        """Set ``owner``'s bytes used and files to a count made after reading version ``etag`` of its records
        (:meth:`recorded`), only if no record changed since: False when anything was charged, refunded or reserved
        meanwhile (count again). The difference goes into the first shard; reservations, claims and allotments are
        kept as they are."""
        current_used, current_files, _, version = await self.recorded(owner)
        if version != etag:
            return False
        shards = await self._read_all(owner)
        doc, shard_etag = shards[0]
        doc.used += used - current_used
        doc.files += files - current_files
        try:
            await self.records.write(shard_key(owner, 0), doc.to_json(), shard_etag)
        except Conflict:  # VersionConflict too: it changed since
            return False
        return True
