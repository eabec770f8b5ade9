"""Small JSON records in the storage backend, read with their version and changed by compare-and-set, with one
bounded retry policy for every record the service keeps (upload records, usage, plans, authorisations, documents).

    read(key)                        the record and its etag (a record replaced between open and read: read again)
    create(key, doc)                 publish a new record (Conflict if the key is taken)
    write(key, doc, etag)            one compare-and-set write (``etag`` None: if absent); VersionConflict if lost
    update(key, decode, change, encode, absent=...)
                                     read, change, write ``if_match``, again on a lost race, within the policy
                                     (``absent``: the record an absent key stands for, created ``if_absent``)

Every retry loop here is bounded twice: in rounds and in time (:class:`RetryPolicy`, 2 s by default, with
jittered exponential backoff). On a busy record a request gives up at once with VersionConflict (409
``version_conflict``: read and retry) rather than queueing behind other writers: on an engine whose
compare-and-set round trip is slow, 200 rounds kept one request 35 s in the loop.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from storage.base import ObjectInfo, Storage
from storage.errors import ObjectChanged
from storage.keyed import KeyedLocks
from transfer.errors import Conflict, NotFound, TransferError, VersionConflict, storage_errors_translated

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
                await retry.again(lambda: VersionConflict(f"{key} kept changing while it was read; try again"))


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
    (VersionConflict when not), or unconditionally. ``durable=False``: a record whose loss in a power cut is
    harmless (a removal claim) skips the backend's flush."""
    body = _encode(doc)
    with storage_errors_translated():
        async with storage.create(
            key, size_hint=len(body), if_absent=if_absent, if_match=if_match, durable=durable
        ) as writer:
            await writer.write(body)
            return await writer.commit({})


class RecordStore:
    """Compare-and-set records over one backend, for one process: updates of one record here take turns (no
    needless retries between this process's own callers), and the last version seen of each record is the
    optimistic start of the next update (the backend refuses it if another writer got there since)."""

    def __init__(self, storage: Storage, policy: RetryPolicy = DEFAULT_POLICY) -> None:
        self.storage = storage
        self.policy = policy
        self.locks = KeyedLocks()
        self._seen: OrderedDict[str, tuple[Any, str]] = OrderedDict()

    def _remember(self, key: str, doc: Any, etag: str) -> None:
        if not etag:
            return
        self._seen[key] = (doc, etag)
        self._seen.move_to_end(key)
        while len(self._seen) > SEEN_RECORDS:
            self._seen.popitem(last=False)

    async def read(self, key: str) -> tuple[Any, str]:
        """A record and its version (etag); NotFound when absent."""
        doc, etag = await read_record(self.storage, key, self.policy)
        self._remember(key, doc, etag)
        return doc, etag

    async def create(self, key: str, doc: Any) -> None:
        """Publish a new record; Conflict if the key is taken."""
        await self._write(key, doc, if_absent=True)

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
    ) -> T:
        """Apply ``change`` to the record at ``key`` with compare-and-set and return the record as written.
        ``change`` is pure and may run more than once (it sees the latest record each time); it returns None to
        leave the record as it is, or raises to refuse. Between processes the backend's ``if_match`` decides and
        the loser tries again, within the policy; then VersionConflict.

        ``absent``: the stored form of the record an absent key stands for (else NotFound); a change of it creates
        the record ``if_absent``, and a creation lost to another writer is a lost race like any other.
        ``durable=False``: a record whose loss in a power cut is harmless skips the backend's flush."""
        async with self.locks.hold(key):
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
                current = decode(doc)
                try:
                    changed = change(current)
                except Exception:
                    if seen is not None:
                        continue  # judged on a remembered version: judge again on the stored one
                    raise
                if changed is None:
                    if seen is not None:
                        continue  # the same: only the stored version may say "nothing to do"
                    return current
                try:
                    if etag is None:
                        await self._write(key, encode(changed), if_absent=True, durable=durable)
                    else:
                        await self._write(key, encode(changed), if_match=etag, durable=durable)
                    return changed
                except Conflict:  # VersionConflict (if_match lost) or Conflict (if_absent lost)
                    await retry.again(lambda: VersionConflict(f"{key} kept changing; try again"))
