"""A key's usage in shards: what one upload counts lives in the shard its id falls in, so uploads of one key on
several replicas rarely write the same record; the quota is allotted to the shards and stays exact — never over,
and all of it usable — whatever the concurrency, the number of processes, a mover that stopped half way, or a
quota that changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from storage.local import LocalStorage
from transfer.core import ids
from transfer.core.auth import ApiKey, Scope
from transfer.core.ids import draw_ids_into, is_id, new_id
from transfer.errors import QuotaExceeded
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.accounting.usage import UsageLedger, shard_key, shard_of, usage_key
from transfer.service.files.publisher import file_id_for

pytestmark = pytest.mark.anyio
SHARDS = 8


def _keys(quota: int | None) -> dict[str, ApiKey]:
    return {"alice": ApiKey("alice", "0" * 64, frozenset({Scope.UPLOAD}), max_bytes=quota)}


async def _store(path: Path) -> LocalStorage:
    store = LocalStorage(path)
    await store.start()
    return store


async def _ledgers(path: Path, quota: int | None, n: int = 2) -> list[UsageLedger]:
    """``n`` processes' worth of ledgers on one storage (each its own record store: its own caches and turns)."""
    return [UsageLedger(RecordStore(await _store(path)), _keys(quota), shards=SHARDS) for _ in range(n)]


async def _stored(path: Path) -> list[str]:
    store = await _store(path)
    return sorted([info.key async for info in store.list("usage/")])


async def test_uploads_of_one_key_count_in_the_shards_their_ids_fall_in(tmp_path: Path) -> None:
    (ledger,) = await _ledgers(tmp_path / "s", None, 1)
    ids = [new_id("f_") for _ in range(64)]
    for rid in ids:
        assert await ledger.charge("alice", rid, 10, until=ledger.clock() + 60)
    assert len(await _stored(tmp_path / "s")) == len({shard_of(rid, SHARDS) for rid in ids}) > 1
    usage = await ledger.usage("alice")
    assert (usage.used, usage.files) == (640, 64)
    # an upload and the file it publishes meet in one shard: charged once, whichever id asks
    upload = "t_" + ids[0].removeprefix("f_")
    assert shard_of(upload, SHARDS) == shard_of(ids[0], SHARDS)
    assert not await ledger.charge("alice", ids[0], 10, until=ledger.clock() + 60)


async def test_the_quota_is_exact_and_all_of_it_usable_under_concurrency_on_two_processes(tmp_path: Path) -> None:
    quota, size = 24_000, 1_000  # 32 uploads at once, room for 24
    ledgers = await _ledgers(tmp_path / "s", quota)

    async def upload(i: int) -> bool:
        ledger, rid = ledgers[i % 2], new_id("s_")
        try:
            await ledger.reserve("alice", rid, size, ledger.clock() + 60)
        except QuotaExceeded:
            return False
        assert await ledger.charge("alice", rid, size, until=ledger.clock() + 60)
        return True

    done = await asyncio.gather(*(upload(i) for i in range(32)))
    assert sum(done) == quota // size  # never over, and nothing left unusable
    usage = await ledgers[0].usage("alice")
    assert (usage.used, usage.files, usage.reserved) == (quota, quota // size, 0)
    with pytest.raises(QuotaExceeded):
        await ledgers[1].reserve("alice", new_id("s_"), 1, ledgers[1].clock() + 60)


async def test_a_move_whose_mover_stopped_is_given_by_the_next_gatherer(tmp_path: Path) -> None:
    quota = 8_000  # 1,000 for each of the 8 shards
    (ledger,) = await _ledgers(tmp_path / "s", quota, 1)
    # a mover that stopped after taking the first shard's 1,000, before giving them to shard 3
    now = ledger.clock()

    def taken(doc: object) -> None:
        doc.cap -= 1_000  # type: ignore[attr-defined]
        doc.out["m_" + "0" * 32] = (3, 1_000, now - 3600)  # type: ignore[attr-defined]

    await ledger._update_shard("alice", 0, taken)
    # 8,000 bytes still fit: the stale move is given first, then the allotment gathered where it is needed (the
    # upload counted in shard 3, where the stale move goes: what it brings is counted as gathered)
    rid = next(r for r in (new_id("s_") for _ in range(10_000)) if shard_of(r, SHARDS) == 3)
    await ledger.reserve("alice", rid, quota, ledger.clock() + 60)
    usage = await ledger.usage("alice")
    assert usage.reserved == quota
    with pytest.raises(QuotaExceeded):
        await ledger.reserve("alice", new_id("s_"), 1, ledger.clock() + 60)


async def test_a_changed_quota_moves_the_allotments_with_it(tmp_path: Path) -> None:
    path = tmp_path / "s"
    (ledger,) = await _ledgers(path, 10_000, 1)
    for _ in range(5):
        rid = new_id("f_")
        assert await ledger.charge("alice", rid, 1_000, until=ledger.clock() + 60)
    (smaller,) = await _ledgers(path, 6_000, 1)
    with pytest.raises(QuotaExceeded):
        await smaller.reserve("alice", new_id("s_"), 1_001, smaller.clock() + 60)
    await smaller.reserve("alice", new_id("s_"), 1_000, smaller.clock() + 60)
    (larger,) = await _ledgers(path, 20_000, 1)
    await larger.reserve("alice", new_id("s_"), 14_000, larger.clock() + 60)


async def test_one_record_per_key_is_the_first_shard(tmp_path: Path) -> None:
    """A store written with one record per key: it stays one record (its counts, reservations and charge marks all
    there) when the service counts new keys in shards."""
    path = tmp_path / "s"
    (one,) = [UsageLedger(RecordStore(await _store(path)), _keys(5_000), shards=1)]
    assert await one.charge("alice", "f_" + "a" * 32, 3_000, until=one.clock() + 60)
    assert await _stored(path) == [usage_key("alice")]
    assert shard_key("alice", 0) == usage_key("alice")
    (sharded,) = await _ledgers(path, 5_000, 1)
    assert (await sharded.usage("alice")).used == 3_000
    with pytest.raises(QuotaExceeded):
        await sharded.reserve("alice", new_id("s_"), 2_001, sharded.clock() + 60)
    await sharded.reserve("alice", new_id("s_"), 2_000, sharded.clock() + 60)


def test_a_serving_process_draws_its_ids_into_one_shard(monkeypatch: pytest.MonkeyPatch) -> None:
    """``transfer serve`` draws the ids it makes into one usage shard of its own: an upload, the file it publishes
    (and so that file's removal) count there; ids stay ids of their kind; without a lane they fall anywhere."""
    monkeypatch.setattr(ids, "_DRAWN_INTO", None)
    assert {shard_of(new_id("s_"), SHARDS) for _ in range(400)} == set(range(SHARDS))
    draw_ids_into(SHARDS, 3)
    made = [new_id(prefix) for prefix in ("s_", "t_", "d_", "c_", "f_", "b_") for _ in range(50)]
    assert all(is_id(i, i[: i.index("_") + 1]) for i in made) and len(set(made)) == len(made)
    assert {shard_of(i, SHARDS) for i in made} == {3}
    assert {shard_of(file_id_for(i), SHARDS) for i in made if i.startswith("s_")} == {3}
    draw_ids_into(1, 0)  # one shard: no lane
    assert {shard_of(new_id("s_"), SHARDS) for _ in range(400)} == set(range(SHARDS))
