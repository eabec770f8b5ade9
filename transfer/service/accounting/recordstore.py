"""Small JSON records in the storage backend, read with their version and changed by compare-and-set, with one
bounded retry policy for every record the service keeps (upload records, usage, plans, authorisations, documents).

    read(key)                        the record and its etag (a record replaced between open and read: read again)
    create(key, doc)                 publish a new record (Conflict if the key is taken)
    write(key, doc, etag)            one compare-and-set write (``etag`` None: if absent); VersionConflict if lost
    update(key, decode, change, encode, absent=..., durable=..., group=...)
                                     read, change, write ``if_match``, again on a lost race, within the policy
                                     (``absent``: the record an absent key stands for, created ``if_absent``;
                                     ``group``: changes queued meanwhile go in the next write together)

Every retry loop here is bounded twice: in rounds and in time (:class:`RetryPolicy`, 2 s by default, with
jittered exponential backoff). On a busy record a request gives up then with RecordBusy (503 ``record_busy``
with ``Retry-After``: nothing was written, send it again) rather than queueing behind other writers: on an engine
whose compare-and-set round trip is slow, 200 rounds kept one request 35 s in the loop.

Group commit (``update(..., group=True)``): a record that every request of a key changes (its usage) would make
each request wait for its own compare-and-set write. Changes of one record queue in this process; one task per
record runs its rounds while anything is queued, and each round applies every change queued so far (those that
arrived while the previous write was in flight), in order, to the record and writes it once. Each caller gets its
own result (or its own error: a change that refuses is left out, the others are written); a round that loses the
race applies all of them again to the newer record, within the policy.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from storage.base import ObjectInfo, Storage
from storage.errors import ObjectChanged
from storage.keyed import KeyedLocks
from transfer import metrics
from transfer.errors import Conflict, NotFound, RecordBusy, TransferError, storage_errors_translated

T = TypeVar("T")
_REQUIRED: Any = object()  # update() without ``absent``: an absent record is NotFound
SEEN_RECORDS = 4096  # record versions remembered per process (an optimistic start for updates; bounded)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long a lost race may be retried: at most ``attempts`` rounds and ``budget`` seconds in all, each wait
    drawn uniformly from ``[0, min(cap, base * 2**round))`` (full jitter: replicas that collided spread apart).
    The first ``floor`` rounds are made however long they took: on a loaded engine one read and one conditional
    write can take the whole budget, and a lost race is settled by reading once more (six replicas racing for the
    last slot on a busy Ceph: the losers then find it taken, instead of giving up before looking)."""

    attempts: int = 40
    budget: float = 2.0
    floor: int = 3
    base: float = 0.002
    cap: float = 0.1
    clock: Callable[[], float] = time.monotonic

    def start(self) -> Retry:
        """A fresh count of rounds and time for one operation."""
        return Retry(self, self.clock)


class Retry:
    """One operation's retries under a :class:`RetryPolicy`."""

    def __init__(self, policy: RetryPolicy, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.clock = clock
        self.started = clock()
        self.round = 0

    async def again(self, exhausted: Callable[[], TransferError]) -> None:
        """Wait before the next round; raise ``exhausted()`` instead when the rounds or the time are used up."""
        p = self.policy
        self.round += 1
        delay = random.uniform(0, min(p.cap, p.base * 2**self.round))  # noqa: S311 - jitter, not a secret
        late = self.round >= p.floor and self.clock() - self.started + delay > p.budget
        if self.round >= p.attempts or late:
            raise exhausted()
        await asyncio.sleep(delay)


DEFAULT_POLICY = RetryPolicy()


def _encode(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode()


def record_size(doc: Any) -> int:
    """The bytes :func:`write_record` stores for ``doc``."""
    return len(_encode(doc))


async def read_record(storage: Storage, key: str, policy: RetryPolicy = DEFAULT_POLICY) -> tuple[Any, str]:
    """A JSON record and its version (etag); NotFound when absent. A record replaced between its open and its
    read (S3 pins the ETag) is read again, within ``policy``."""
    retry = policy.start()
    with storage_errors_translated():
        while True:
            try:
                async with await storage.open(key) as reader:
                    raw = b"".join([chunk async for chunk in reader.read()])
                    return json.loads(raw), reader.info.etag
            except ObjectChanged:
                await retry.again(lambda: RecordBusy(f"{key} kept changing while it was read; try again"))


async def write_record(
    storage: Storage,
    key: str,
    doc: Any,
    *,
    if_absent: bool = False,
    if_match: str | None = None,
    durable: bool = True,
) -> ObjectInfo:
    """Write one JSON record atomically: if absent (Conflict when taken), if its version is still ``if_match``
    (VersionConflict when not), or unconditionally. One attempt: a caller that retries a lost race does it through
    :meth:`RecordStore.update`, whose retries are bounded. ``durable=False``: a record whose loss in a power cut is
    harmless (a removal claim) skips the backend's flush."""
    body = _encode(doc)
    with storage_errors_translated():
        async with storage.create(
            key, size_hint=len(body), if_absent=if_absent, if_match=if_match, durable=durable
        ) as writer:
            await writer.write(body)
            return await writer.commit({})


@dataclass(eq=False, slots=True)
class _Queued(Generic[T]):
    """One caller's change waiting for a group-commit round, and the answer the round gives it."""

    change: Callable[[T], T | None]
    answer: asyncio.Future[T]
    durable: bool
    taken: bool = False  # in a round already (a caller cancelled after this point may still see it written)


class RecordStore:
    """Compare-and-set records over one backend, for one process: updates of one record here take turns (no
    needless retries between this process's own callers), and the last version seen of each record is the
    optimistic start of the next update (the backend refuses it if another writer got there since)."""

    def __init__(self, storage: Storage, policy: RetryPolicy = DEFAULT_POLICY) -> None:
        self.storage = storage
        self.policy = policy
        self.locks = KeyedLocks()
        self._seen: OrderedDict[str, tuple[Any, str]] = OrderedDict()
        self._queued: dict[str, list[_Queued[Any]]] = {}  # grouped changes waiting for the next round, per record
        self._rounds: dict[str, asyncio.Future[None]] = {}  # the task that runs a record's rounds, while it runs

    def _remember(self, key: str, doc: Any, etag: str) -> None:
        if not etag:
            return
        self._seen[key] = (doc, etag)
        self._seen.move_to_end(key)
        while len(self._seen) > SEEN_RECORDS:
            self._seen.popitem(last=False)

    async def read(self, key: str) -> tuple[Any, str]:
        """A record and its version (etag); NotFound when absent; RecordBusy when it kept changing while read."""
        doc, etag = await read_record(self.storage, key, self.policy)
        self._remember(key, doc, etag)
        return doc, etag

    async def create(self, key: str, doc: Any) -> None:
        """Publish a new record; Conflict if the key is taken."""
        await self._write(key, doc, if_absent=True)

    async def write(self, key: str, doc: Any, etag: str | None, *, durable: bool = True) -> None:
        """One compare-and-set write of ``doc`` over version ``etag`` of the record (None: only if there is none):
        VersionConflict (or Conflict) when another writer got there first, and nothing changes."""
        if etag is None:
            await self._write(key, doc, if_absent=True, durable=durable)
        else:
            await self._write(key, doc, if_match=etag, durable=durable)

    async def _write(
        self, key: str, doc: Any, *, if_absent: bool = False, if_match: str | None = None, durable: bool = True
    ) -> None:
        try:
            info = await write_record(self.storage, key, doc, if_absent=if_absent, if_match=if_match, durable=durable)
        except BaseException:
            self._seen.pop(key, None)
            raise
        self._remember(key, doc, info.etag)

    async def update(
        self,
        key: str,
        decode: Callable[[Any], T],
        change: Callable[[T], T | None],
        encode: Callable[[T], Any],
        *,
        absent: Any = _REQUIRED,
        durable: bool = True,
        group: bool = False,
    ) -> T:
        """Apply ``change`` to the record at ``key`` with compare-and-set and return the record as written.
        ``change`` is pure and may run more than once (it sees the latest record each time); it returns None to
        leave the record as it is, or raises to refuse. Between processes the backend's ``if_match`` decides and
        the loser tries again, within the policy; then RecordBusy.

        ``absent``: the stored form of the record an absent key stands for (else NotFound); a change of it creates
        the record ``if_absent``, and a creation lost to another writer is a lost race like any other.
        ``durable=False``: a record whose loss in a power cut is harmless skips the backend's flush.
        ``group``: group commit (see the module's docstring): the change may be written together with others of
        the same record (every grouped caller of one key passes the same ``decode``, ``encode`` and ``absent``);
        the caller gets the record as its own change left it, once the write that holds it succeeded. The write is
        flushed if any change of its round asked for ``durable``."""
        if group:
            return await self._grouped(key, decode, change, encode, absent, durable)
        async with self.locks.hold(key):
            [(ok, outcome)] = await self._apply(key, decode, encode, absent, [change], durable)
        if not ok:
            raise outcome
        result: T = outcome
        return result

    async def _grouped(
        self,
        key: str,
        decode: Callable[[Any], T],
        change: Callable[[T], T | None],
        encode: Callable[[T], Any],
        absent: Any,
        durable: bool,
    ) -> T:
        """Queue ``change`` for the record's rounds (started if none runs) and wait for its answer."""
        entry: _Queued[T] = _Queued(change, asyncio.get_running_loop().create_future(), durable)
        # an answer nobody waits for any more (its caller was cancelled after its round took it) is not an error
        entry.answer.add_done_callback(lambda f: None if f.cancelled() else f.exception())
        running = self._rounds.get(key)
        if running is not None and not running.done() and running.get_loop() is entry.answer.get_loop():
            self._queued.setdefault(key, []).append(entry)  # for the round after the one in flight
        else:  # no round runs: this change is the first one's, taken now; what comes meanwhile queues behind it
            self._queued.pop(key, None)  # (left by a loop that closed under its task: nobody waits for them)
            entry.taken = True
            self._rounds[key] = asyncio.ensure_future(self._drain(key, decode, encode, absent, [entry]))
        try:
            return await asyncio.shield(entry.answer)
        except asyncio.CancelledError:
            queue = self._queued.get(key)
            if not entry.taken and queue is not None:
                queue.remove(entry)  # not taken into a round: it never happens
                if not queue:
                    del self._queued[key]
            raise

    async def _drain(
        self,
        key: str,
        decode: Callable[[Any], T],
        encode: Callable[[T], Any],
        absent: Any,
        batch: list[_Queued[T]],
    ) -> None:
        """The rounds of one record, in its turn: ``batch``, then every change queued meanwhile, until nothing is
        queued. A task of its own, not any caller's: a caller cancelled while its change is being written does not
        give the record's turn away (which would start a second round racing the first)."""
        try:
            async with self.locks.hold(key):
                while True:
                    await self._round(key, decode, encode, absent, batch)
                    batch = self._queued.pop(key, [])
                    if not batch:
                        del self._rounds[key]  # in the same step as the look at the queue: a change queued later
                        return  # starts the next task
                    for queued in batch:
                        queued.taken = True
        except BaseException:
            self._rounds.pop(key, None)
            for queued in [*batch, *self._queued.pop(key, [])]:  # cancelled (the loop is closing): not applied
                if not queued.answer.done():
                    queued.answer.cancel()
            raise

    async def _round(
        self, key: str, decode: Callable[[Any], T], encode: Callable[[T], Any], absent: Any, batch: list[_Queued[T]]
    ) -> None:
        """One group-commit round: every change of ``batch`` applied and written, then every caller answered."""
        try:
            outcomes = await self._apply(
                key, decode, encode, absent, [q.change for q in batch], any(q.durable for q in batch)
            )
        except BaseException as exc:
            for queued in batch:
                if not queued.answer.done():
                    if isinstance(exc, Exception):
                        queued.answer.set_exception(exc)
                    else:
                        queued.answer.cancel()
            if not isinstance(exc, Exception):
                raise  # cancelled or exiting; an error is every caller's answer, not the task's
            return
        for queued, (ok, outcome) in zip(batch, outcomes, strict=True):
            if not queued.answer.done():
                if ok:
                    queued.answer.set_result(outcome)
                else:
                    queued.answer.set_exception(outcome)

    async def _apply(
        self,
        key: str,
        decode: Callable[[Any], T],
        encode: Callable[[T], Any],
        absent: Any,
        changes: list[Callable[[T], T | None]],
        durable: bool,
    ) -> list[tuple[bool, Any]]:
        """Apply ``changes`` in order to the record and write the result once with compare-and-set, again on a lost
        race within the policy (RecordBusy then). Per change: (True, the record as it left it) or (False, the
        exception it refused with; the record as it was before it). The caller holds the record's turn."""
        retry = self.policy.start()
        first = True
        while True:
            seen = self._seen.get(key) if first else None
            first = False
            if seen is not None:
                doc, etag = seen
            elif absent is _REQUIRED:
                doc, etag = await self.read(key)
            else:
                try:
                    doc, etag = await self.read(key)
                except NotFound:
                    doc, etag = absent, None
            state = decode(doc)
            outcomes: list[tuple[bool, Any]] = []
            changed = refused = False
            for change in changes:
                try:
                    after = change(state)
                except Exception as exc:  # noqa: BLE001 - the caller's own refusal, handed back to it
                    outcomes.append((False, exc))
                    refused = True
                    continue
                if after is not None:
                    state, changed = after, True
                outcomes.append((True, state))
            if seen is not None and (refused or not changed):
                continue  # judged on a remembered version: only the stored one may refuse or say "nothing to do"
            if not changed:
                return outcomes
            try:
                await self.write(key, encode(state), etag, durable=durable)
                return outcomes
            except Conflict:  # VersionConflict (if_match lost) or Conflict (if_absent lost)
                metrics.record_race(key, busy=False)
                try:
                    await retry.again(lambda: RecordBusy(f"{key} kept changing while it was being updated; try again"))
                except RecordBusy:
                    metrics.record_race(key, busy=True)
                    raise
