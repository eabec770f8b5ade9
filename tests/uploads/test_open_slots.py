"""A key's open-upload limit is one record per key and kind, changed by compare-and-set
(transfer/service/accounting/slots.py): replicas racing for the last slot give exactly one winner, on local storage and
on S3 (Ceph 16.2 and 20.2); acquiring and releasing are idempotent; at the limit finished ids are dropped; the per-id
markers of the old layout are ignored; and taking a slot lists nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from storage.base import ObjectInfo, Storage
from storage.local import LocalStorage
from storage.s3 import S3Storage
from tests.conftest import CEPH, s3_config
from transfer.core.ids import owner_folder
from transfer.errors import TooManySessions, VersionConflict
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.accounting.slots import FRESH, OpenSlots

pytestmark = pytest.mark.anyio
RACERS = 6
ROUNDS = 3
OWNER = "alice-key"


def quota_on(storage: Storage, limit: int, closed: set[str] | None = None, clock: Any = time.time) -> OpenSlots:
    quota = OpenSlots(RecordStore(storage), limit, clock=clock)
    quota.register(lambda sid: True, _open_unless_in(closed if closed is not None else set()))
    return quota


def _open_unless_in(closed: set[str]) -> Any:
    async def is_open(owner: str | None, sid: str) -> bool:
        return sid not in closed

    return is_open


async def _won(quota: OpenSlots, sid: str) -> bool:
    try:
        await quota.acquire(OWNER, sid)
    except TooManySessions:
        return False
    except VersionConflict:  # kept losing the record's compare-and-set past its retries (a very busy engine): a
        return False  # specific 409 that took no slot, which the client sends again
    return True


async def race_for_the_last_slot(stores: Sequence[Storage]) -> None:
    """Replicas (each its own storage client and record store) race for the last slot, round after round; the
    last store is an observer's."""
    limit = 3
    *quotas, observer = [quota_on(storage, limit) for storage in stores]
    for held in range(limit - 1):
        assert await _won(quotas[held % RACERS], f"s_held{held}")
    for round_ in range(ROUNDS):
        contenders = [f"s_r{round_}_{n}" for n in range(RACERS)]
        won = await asyncio.gather(*(_won(q, sid) for q, sid in zip(quotas, contenders, strict=True)))
        assert sum(won) == 1, won
        winner = contenders[won.index(True)]
        ids = await observer.open_ids(OWNER)
        assert len(ids) == limit and winner in ids, ids
        await quotas[-1].release(OWNER, winner)  # another replica lets the slot go: the next round races for it
        assert winner not in await quotas[0].open_ids(OWNER)


async def local(path: Path) -> LocalStorage:
    storage = LocalStorage(path)
    await storage.start()
    return storage


async def test_replicas_racing_for_the_last_slot_give_exactly_one_winner(tmp_path: Path) -> None:
    stores = [await local(tmp_path / "data") for _ in range(RACERS + 1)]
    await race_for_the_last_slot(stores)


@pytest.mark.s3
@pytest.mark.parametrize("s3_endpoint", CEPH, indirect=True)
async def test_replicas_on_s3_racing_for_the_last_slot_give_exactly_one_winner(
    s3_endpoint: Any, s3_bucket: str
) -> None:
    """On Ceph, each release: Swift's s3api has no atomic compare-and-set, so the service refuses replicas on it
    (``single_replica``) and there is no race between replicas to test there."""
    stores = [S3Storage(s3_config(s3_endpoint, s3_bucket)) for _ in range(RACERS + 1)]
    try:
        for storage in stores:
            await storage.start()
        await race_for_the_last_slot(list(stores))
    finally:
        for storage in stores:
            await storage.close()


async def test_racers_whose_uploads_are_not_recorded_yet_still_hold_their_slots(tmp_path: Path) -> None:
    """The services answer "not open" for an upload whose record is not written yet, which is every racer's while
    they race: a holder acquired a moment ago must count as open all the same (the FRESH window), on every replica,
    or the second racer drops the first and both are admitted."""
    stores = [await local(tmp_path / "data") for _ in range(RACERS)]
    quotas = [OpenSlots(RecordStore(storage), 1) for storage in stores]
    for quota in quotas:
        quota.register(lambda sid: True, _never_open)
    for round_ in range(ROUNDS):
        won = await asyncio.gather(*(_won(q, f"s_n{round_}_{n}") for n, q in enumerate(quotas)))
        assert sum(won) == 1, won
        await quotas[0].release(OWNER, f"s_n{round_}_{won.index(True)}")


async def _never_open(owner: str | None, sid: str) -> bool:
    return False


async def test_acquire_and_release_are_idempotent_and_finished_ids_go_only_at_the_limit(tmp_path: Path) -> None:
    storage = await local(tmp_path / "data")
    closed: set[str] = set()
    now = [1000.0]
    quota = quota_on(storage, 2, closed, clock=lambda: now[0])
    await quota.acquire(OWNER, "s_a")
    await quota.acquire(OWNER, "s_a")  # again: the same one slot
    await quota.acquire(OWNER, "s_b")
    assert await quota.open_ids(OWNER) == ["s_a", "s_b"]
    with pytest.raises(TooManySessions) as refused:
        await quota.acquire(OWNER, "s_c")
    assert refused.value.status == 429 and "2 open sessions" in str(refused.value)
    closed.add("s_a")  # finished, but its release was lost: still recorded until the key reaches its limit
    assert await quota.open_ids(OWNER) == ["s_a", "s_b"]
    with pytest.raises(TooManySessions):  # acquired a moment ago: counted as open without asking (its record
        await quota.acquire(OWNER, "s_c")  # may still be on its way)
    now[0] += FRESH + 1
    await quota.acquire(OWNER, "s_c")
    assert await quota.open_ids(OWNER) == ["s_b", "s_c"]
    await quota.release(OWNER, "s_b")
    await quota.release(OWNER, "s_b")
    await quota.release(OWNER, "s_never")
    await quota.release(None, "s_c")  # no key: no limit, nothing kept
    assert await quota.open_ids(OWNER) == ["s_c"]
    await quota.acquire(None, "s_x")
    assert await quota.open_ids(OWNER) == ["s_c"]


class CountingLists(LocalStorage):
    """A local backend that counts its listings."""

    lists = 0

    async def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None, metadata: bool = False
    ) -> AsyncIterator[ObjectInfo]:
        CountingLists.lists += 1
        async for info in super().list(prefix, start_after=start_after, limit=limit, metadata=metadata):
            yield info


async def test_old_markers_are_ignored_and_a_slot_costs_no_listing(tmp_path: Path) -> None:
    storage = CountingLists(tmp_path / "data")
    await storage.start()
    CountingLists.lists = 0
    for sid in ("s_old1", "s_old2"):  # the layout before the record: one empty marker per open id
        async with storage.create(f"{owner_folder(OWNER)}sessions/{sid}", size_hint=0) as writer:
            await writer.commit({})
    quota = quota_on(storage, 2)
    await quota.acquire(OWNER, "s_new1")
    await quota.acquire(OWNER, "s_new2")
    with pytest.raises(TooManySessions):
        await quota.acquire(OWNER, "s_new3")
    await quota.release(OWNER, "s_old1")  # one of the old uploads finishing: nothing to give back
    assert await quota.open_ids(OWNER) == ["s_new1", "s_new2"]
    assert CountingLists.lists == 0
