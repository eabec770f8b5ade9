"""The one record store and the usage ledger on it: a group of changes queued behind a write goes in one write,
each caller with its own answer; a removal claimed by six replicas at once is refunded once; a usage record of the
older shape (``charged`` and ``removals``) reads and behaves as it did; and a record that keeps changing past the
retry policy answers 503 ``record_busy`` with Retry-After, through the HTTP server too, never a 500."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from storage.local import LocalStorage
from tests.conftest import serving
from transfer.core.agents.a2a_protocol import RpcCode, rpc_code_of
from transfer.errors import InvalidRequest, RecordBusy
from transfer.hosts import create_app
from transfer.service.accounting.lifecycle import Lifecycle
from transfer.service.accounting.recordstore import RecordStore, RetryPolicy
from transfer.service.accounting.usage import UsageLedger, usage_key
from transfer.settings import Settings

pytestmark = pytest.mark.anyio

SIGNING = {"t": "0123456789abcdef0123"}


class _Counting:
    """A LocalStorage that counts, per key, the writers opened (record writes) and the objects opened (reads)."""

    def __init__(self, inner: LocalStorage) -> None:
        self.inner = inner
        self.writes: dict[str, int] = {}
        self.reads: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create(self, key: str, **kwargs: Any) -> Any:
        self.writes[key] = self.writes.get(key, 0) + 1
        return self.inner.create(key, **kwargs)

    async def open(self, key: str, **kwargs: Any) -> Any:
        self.reads[key] = self.reads.get(key, 0) + 1
        return await self.inner.open(key, **kwargs)


async def _local(path: Path) -> LocalStorage:
    store = LocalStorage(path)
    await store.start()
    return store


class _Gated(_Counting):
    """Counting storage whose record writes wait at a gate (a write in flight, held there by the test)."""

    def __init__(self, inner: LocalStorage) -> None:
        super().__init__(inner)
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    def create(self, key: str, **kwargs: Any) -> Any:
        writer = super().create(key, **kwargs)
        gated = self

        class _Writer:
            async def __aenter__(self) -> Any:
                gated.waiting.set()
                await gated.gate.wait()
                return await writer.__aenter__()

            async def __aexit__(self, *exc: Any) -> Any:
                return await writer.__aexit__(*exc)

        return _Writer()


async def test_changes_queued_behind_a_write_go_in_one_write_each_with_its_own_answer(tmp_path: Path) -> None:
    gated = _Gated(await _local(tmp_path / "s"))
    records = RecordStore(gated)  # type: ignore[arg-type]

    def add(n: int) -> Any:
        def change(doc: dict[str, int]) -> dict[str, int]:
            if n == 13:
                raise InvalidRequest("thirteen is refused")
            return {**doc, "total": doc["total"] + n, "last": n}

        return asyncio.ensure_future(records.update("r.json", dict, change, dict, absent={"total": 0}, group=True))

    first = add(1)
    await gated.waiting.wait()  # its write is in flight: the next 19 queue behind it
    rest = [add(n) for n in range(2, 21)]
    await asyncio.sleep(0)
    gated.gate.set()
    answers = await asyncio.gather(first, *rest, return_exceptions=True)
    assert gated.writes["r.json"] == 2  # the first one's, then one for the 19 queued
    # the absent record, read once; the second round starts from the version it wrote, and reads it once more only
    # because 13 refused there (a refusal judged on a remembered version is judged again on the stored one)
    assert gated.reads["r.json"] == 2
    refused = answers[12]
    assert isinstance(refused, InvalidRequest) and str(refused) == "thirteen is refused"
    totals = [a["total"] for a in answers if isinstance(a, dict)]
    # each caller sees the record as its own change left it: the running sum without 13
    assert totals == [sum(range(1, n + 1)) - (13 if n > 13 else 0) for n in range(1, 21) if n != 13]
    assert [a["last"] for a in answers if isinstance(a, dict)] == [n for n in range(1, 21) if n != 13]
    assert (await RecordStore(gated.inner).read("r.json"))[0] == {"total": 210 - 13, "last": 20}


async def test_a_leader_cancelled_during_its_write_leaves_its_group_answered(tmp_path: Path) -> None:
    gated = _Gated(await _local(tmp_path / "s"))
    records = RecordStore(gated)  # type: ignore[arg-type]

    def add(n: int) -> Any:
        return records.update(
            "r.json", dict, lambda d: {**d, "total": d["total"] + n}, dict, absent={"total": 0}, group=True
        )

    leader = asyncio.ensure_future(add(1))
    await gated.waiting.wait()  # its write is in flight: the next ones queue
    followers = [asyncio.ensure_future(add(n)) for n in (10, 100)]
    await asyncio.sleep(0)
    leader.cancel()  # its round goes on, and keeps the record's turn
    gated.gate.set()
    assert [await f for f in followers] == [{"total": 11}, {"total": 111}]
    with pytest.raises(asyncio.CancelledError):
        await leader
    assert (await RecordStore(gated.inner).read("r.json"))[0] == {"total": 111}
    assert gated.writes["r.json"] == 2  # no second round raced the first: the turn stayed with the rounds' task


async def test_a_group_of_queued_charges_is_one_write_of_the_usage_record(tmp_path: Path) -> None:
    gated = _Gated(await _local(tmp_path / "s"))
    gated.gate.set()
    ledger = UsageLedger(RecordStore(gated), {}, shards=1)  # type: ignore[arg-type]
    await ledger.charge(None, "s_first", 1)  # the record exists; this process knows its version
    gated.writes.clear()
    gated.reads.clear()
    gated.gate.clear()
    gated.waiting.clear()
    lead = asyncio.ensure_future(ledger.charge(None, "s_lead", 10))
    await gated.waiting.wait()  # its write is in flight: 30 charges queue behind it
    queued = [asyncio.ensure_future(ledger.charge(None, f"s_{i}", 100, until=ledger.clock() + 60)) for i in range(30)]
    await asyncio.sleep(0)
    gated.gate.set()
    assert await asyncio.gather(lead, *queued) == [True] * 31
    assert gated.writes == {usage_key(None): 2}  # the lead's write, then one for the 30 queued charges
    assert gated.reads == {}  # each round started from the version this process wrote
    usage = await ledger.usage(None)
    assert (usage.used, usage.files) == (1 + 10 + 30 * 100, 32)


async def test_six_replicas_claiming_one_removal_remove_and_refund_it_once(tmp_path: Path) -> None:
    root = tmp_path / "data"
    settings = Settings(data_dir=root, signing_keys=SIGNING)
    # six processes' worth of everything
    replicas = [Lifecycle(RecordStore(await _local(root)), settings) for _ in range(6)]
    store = replicas[0].storage
    async with store.create("files/f_doomed", size_hint=4) as writer:
        await writer.write(b"data")
        await writer.commit({})
    await replicas[0].usage.charge(None, "s_kept", 1000)
    await replicas[0].usage.charge(None, "s_doomed", 4)
    # each winner of a claim waits in its delete until all six have answered or got that far: were two claims to
    # succeed, both would be there at once (and one delete would then find nothing to delete)
    arrived = 0
    everyone = asyncio.Event()

    def settled() -> None:
        nonlocal arrived
        arrived += 1
        if arrived == len(replicas):
            everyone.set()

    async def before_delete() -> None:
        settled()
        await asyncio.wait_for(everyone.wait(), 30)

    async def remove(lifecycle: Lifecycle) -> bool:
        try:
            return await lifecycle.remove_charged("files/f_doomed", None, "f_doomed", 4, before_delete=before_delete)
        finally:
            if not everyone.is_set():
                settled()

    results = await asyncio.gather(*(remove(r) for r in replicas))
    assert sorted(results) == [False] * 5 + [True]
    for lifecycle in replicas:
        usage = await lifecycle.usage.usage(None)
        assert (usage.used, usage.files) == (1000, 1)
        assert (await lifecycle.usage.recorded(None))[2] == {}  # the claim went with the refund
    # a later delete (the same file found again, a replica's sweep) claims it, finds it gone and refunds nothing
    assert not await replicas[3].remove_charged("files/f_doomed", None, "f_doomed", 4)
    assert (await replicas[5].usage.usage(None)).used == 1000


async def test_a_usage_record_of_the_older_shape_reads_and_counts_as_before(tmp_path: Path) -> None:
    store = await _local(tmp_path / "s")
    now = 1_000_000.0
    old = {
        "used": 7000,
        "files": 4,
        "reservations": {"t_open": [300, now + 50], "t_lapsed": [999, now - 1]},
        "charged": {"s_published": [1000, now + 3600], "s_long_ago": [5, now - 1]},
        "removals": {"f_being_removed": [2000, now + 100], "f_claimer_died": [50, now - 1]},
    }
    async with store.create(usage_key("alice"), size_hint=0) as writer:
        await writer.write(json.dumps(old).encode())
        await writer.commit({})
    ledger = UsageLedger(RecordStore(store), {}, clock=lambda: now)  # shards by default: the old key stays one
    usage = await ledger.usage("alice")
    assert (usage.used, usage.files, usage.reserved) == (7000, 4, 300)
    used, files, claims, etag = await ledger.recorded("alice")
    assert (used, files, claims) == (7000, 4, {"f_being_removed": 2000}) and etag
    # the upload counted in ``charged`` is not counted again by another completion of it
    assert not await ledger.charge("alice", "s_published", 1000, until=now + 3600)
    # the claim in ``removals`` still holds against every other remover; its claimer's refund is applied once
    assert not await ledger.claim_removal("alice", "f_being_removed", 2000)
    assert await ledger.claim_removal("alice", "f_claimer_died", 50)  # its lease ended: free to claim again
    await ledger.removed("alice", "f_being_removed", 2000)
    await ledger.unclaim("alice", "f_claimer_died")
    usage = await ledger.usage("alice")
    assert (usage.used, usage.files, usage.reserved) == (5000, 3, 300)
    stored = json.loads(b"".join([c async for c in (await store.open(usage_key("alice"))).read()]))
    assert stored == {
        "used": 5000,
        "files": 3,
        "reservations": {"t_open": [300, now + 50]},
        "changes": {"s_published": [1000, 1, now + 3600, True]},  # the new shape holds what still matters
        "shards": 1,  # and that the key is counted in this one record
    }
    assert not await ledger.charge("alice", "s_published", 1000, until=now + 3600)  # and still refuses a repeat


class _LosingUsage(LocalStorage):
    """Local storage on which every conditional write of a usage record loses (another replica always wins)."""

    def create(self, key: str, **kwargs: Any) -> Any:
        if key.startswith("usage/") and kwargs.get("if_match") is not None:
            kwargs["if_match"] = '"another-version"'
        return super().create(key, **kwargs)


async def test_a_record_that_keeps_changing_gives_a_specific_busy_error(tmp_path: Path) -> None:
    store = _LosingUsage(tmp_path / "s")
    await store.start()
    ledger = UsageLedger(RecordStore(store, RetryPolicy(attempts=3, budget=1e9, base=0, cap=0)), {}, shards=1)
    await ledger.charge(None, "s_a", 1)  # the record's first write: if absent
    for attempt in (ledger.charge(None, "s_b", 1), ledger.claim_removal(None, "f_a", 1)):
        with pytest.raises(RecordBusy) as busy:
            await attempt
        assert busy.value.status == 503 and busy.value.headers == {"Retry-After": "1"}
        assert busy.value.retryable
        assert rpc_code_of(busy.value) == RpcCode.INTERNAL_ERROR  # A2A: the server's trouble, not a conflict
    assert (await ledger.usage(None)).used == 1


def _usage_races(http: httpx.Client) -> dict[str, float]:
    """``transfer_record_races_total`` of usage records by outcome, from the server's /metrics (the counters are
    process-wide: callers compare two readings)."""
    found = {"lost": 0.0, "busy": 0.0}
    for family in text_string_to_metric_families(http.get("/metrics", headers={"accept": "text/plain"}).text):
        for sample in family.samples:
            if sample.name == "transfer_record_races_total" and sample.labels.get("kind") == "usage":
                found[sample.labels["outcome"]] += sample.value
    return found


def test_an_upload_whose_usage_record_keeps_changing_answers_503_record_busy(tmp_path: Path) -> None:
    # one usage record per key: both uploads' charges meet in it (with shards they would not, as they should not)
    settings = Settings(data_dir=tmp_path / "data", signing_keys=SIGNING, usage_shards=1)
    store = _LosingUsage(settings.data_dir)
    with serving(create_app(settings, store), settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        first = http.post("/v1/files", content=os.urandom(1000))
        assert first.status_code == 201, first.text
        before = _usage_races(http)
        busy = http.post("/v1/files", content=os.urandom(1000))  # its charge loses every round, for 2 s
        assert busy.status_code == 503, busy.text
        after = _usage_races(http)
        # every lost round is counted, and the one that ran the policy out once more as "busy"
        assert after["busy"] - before["busy"] >= 1
        assert after["lost"] - before["lost"] >= 3  # the policy's floor: at least three rounds before giving up
        assert busy.json()["error"]["code"] == "record_busy"
        assert busy.headers["retry-after"] == "1"
        listed = http.get("/v1/files").json()
        assert [f["metadata"]["file_id"] for f in listed["files"]] == [first.json()["metadata"]["file_id"]]
