"""The one publisher: a field limit holds whatever the door (raw body, multipart form, session, direct plan), and a
file is charged to its key exactly once however many completions of its upload race (four concurrent
``confirm_upload`` of one S3 authorisation; one session completed at once through two replicas)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash

from benchmarks.e2e import service
from storage.local import LocalStorage
from tests.conftest import LiveServer, running
from transfer.core.auth import TRUSTED, new_token, token_hash
from transfer.core.uploads.state import FileIntent
from transfer.errors import InvalidRequest, RecordBusy
from transfer.service.accounting.recordstore import RecordStore, RetryPolicy
from transfer.service.accounting.usage import UsageLedger
from transfer.service.container import Services
from transfer.service.files.publisher import file_id_for
from transfer.settings import Settings

LIMIT = 10
LONG = "d" * 50


@pytest.fixture
def short_descriptions(tmp_path: Path) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, max_description_length=LIMIT
    )
    with running(settings) as server:
        yield server


def _refused_for_description(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request" and "description" in r.json()["error"]["message"]


def test_a_description_limit_holds_for_raw_and_multipart_uploads(short_descriptions: LiveServer) -> None:
    with httpx.Client(base_url=short_descriptions.url, timeout=30) as http:
        _refused_for_description(http.post("/v1/files", params={"description": LONG}, content=b"raw"))
        # the same description as a form field, before or after the file part: refused too, nothing stored
        for before in (True, False):
            boundary = "xyzzy"
            field = f'--{boundary}\r\ncontent-disposition: form-data; name="description"\r\n\r\n{LONG}\r\n'
            part = (
                f'--{boundary}\r\ncontent-disposition: form-data; name="file"; filename="a.txt"\r\n'
                "content-type: text/plain\r\n\r\nhello\r\n"
            )
            body = (field + part if before else part + field) + f"--{boundary}--\r\n"
            r = http.post(
                "/v1/files",
                content=body.encode(),
                headers={"content-type": f"multipart/form-data; boundary={boundary}"},
            )
            _refused_for_description(r)
        assert http.get("/v1/files").json()["files"] == []
        # within the limit, the form's description is stored as sent
        ok = http.post("/v1/files", files={"file": ("a.txt", b"hello")}, data={"description": "short"})
        assert ok.status_code == 201, ok.text
        assert ok.json()["description"] == "short"


def test_a_description_limit_holds_for_sessions(short_descriptions: LiveServer) -> None:
    with httpx.Client(base_url=short_descriptions.url, timeout=30) as http:
        _refused_for_description(http.post("/v1/sessions", json={"name": "s", "size": 3, "description": LONG}))
        r = http.post("/v1/sessions", json={"name": "s", "size": 3, "description": "x" * LIMIT})
        assert r.status_code == 201, r.text


@pytest.mark.anyio
async def test_a_description_limit_holds_for_every_service_door(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, max_description_length=LIMIT
    )
    services = Services.build(settings, LocalStorage(tmp_path / "data"))
    await services.files.start()
    with pytest.raises(InvalidRequest):  # TP and MCP open sessions through the same service
        await services.sessions.create(
            size=3, chunk_size=None, checksum=None, ttl=None, intent=FileIntent(name="s", description=LONG)
        )
    with pytest.raises(InvalidRequest):  # refused before it looks at the backend's capabilities
        services.files.publisher.check_intent(FileIntent(description=LONG))
    await services.files.close()


def test_file_ids_follow_upload_ids_as_they_always_did() -> None:
    random_part = "0123456789abcdef" * 2
    for kind in ("s_", "t_", "d_", "az_"):
        assert file_id_for(kind + random_part) == "f_" + random_part
    with pytest.raises(ValueError):
        file_id_for("nonsense")


# -- exactly once -------------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_second_charge_of_one_upload_is_not_counted(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "s")
    await store.start()
    ledger, other = (
        UsageLedger(RecordStore(store), {}, shards=1),
        UsageLedger(RecordStore(store), {}, shards=1),
    )  # two replicas' ledgers
    outcomes = await asyncio.gather(
        *(ledger.charge(None, "s_1", 100, until=1e12) for _ in range(3)),
        *(other.charge(None, "s_1", 100, until=1e12) for _ in range(3)),
    )
    assert outcomes.count(True) == 1
    usage = await ledger.usage(None)
    assert (usage.used, usage.files) == (100, 1)
    await ledger.withdraw(None, "s_1", 100)  # its publication failed: a retry may charge it again
    assert await other.charge(None, "s_1", 100, until=1e12) is True
    assert ((await ledger.usage(None)).used, (await ledger.usage(None)).files) == (100, 1)


@pytest.mark.s3
@pytest.mark.anyio
async def test_concurrent_confirmations_of_one_s3_authorization_charge_once(
    tmp_path: Path, s3_env: dict[str, str]
) -> None:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, storage="s3")
    services = Services.build(settings)
    await services.files.start()
    try:
        authz = services.authorizations
        assert authz.direct
        for round_ in range(3):
            data = os.urandom(100_000)
            plan = await authz.authorize_upload(
                TRUSTED, "http://127.0.0.1", intent=FileIntent(name=f"c{round_}.bin"), size=len(data)
            )
            async with httpx.AsyncClient(timeout=30) as http:
                put = await http.put(plan["upload"]["url"], content=data, headers=plan["upload"]["headers"])
                assert put.status_code == 200, put.text
            before = await services.files.lifecycle.usage.usage(None)
            aid = plan["authorization_id"]
            answers = await asyncio.gather(
                *(authz.confirm(aid, TRUSTED, "http://127.0.0.1") for _ in range(4)), return_exceptions=True
            )
            descriptors = [a for a in answers if isinstance(a, dict)]
            assert descriptors, answers
            assert {d["checksum"] for d in descriptors} == {"sha256:" + hashlib.sha256(data).hexdigest()}
            after = await services.files.lifecycle.usage.usage(None)
            assert (after.used - before.used, after.files - before.files) == (100_000, 1)
    finally:
        await services.files.close()


OWNER = new_token()


@pytest.fixture
def two_replicas(s3_env: dict[str, str], tmp_path: Path) -> Iterator[list[str]]:
    keys = {"owner": {"sha256": token_hash(OWNER), "scopes": ["upload", "read"]}}
    env = {
        **os.environ,
        "TRANSFER_SIGNING_KEYS": json.dumps({"t": "0123456789abcdef0123"}),
        "TRANSFER_API_KEYS": json.dumps(keys),
    }
    with ExitStack() as stack:
        urls = []
        for name in ("a", "b"):
            workdir = tmp_path / name
            workdir.mkdir()
            url, _pid = stack.enter_context(service(workdir, env=env))
            urls.append(url)
        yield urls


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.anyio
async def test_sessions_completed_at_once_through_two_replicas_are_charged_once(two_replicas: list[str]) -> None:
    a, b = two_replicas
    headers = {"authorization": f"Bearer {OWNER}"}
    sizes = [1000 + i for i in range(10)]
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        sids = []
        for i, size in enumerate(sizes):
            data = os.urandom(size)
            r = await http.post(f"{a}/v1/sessions", json={"name": f"s{i}", "size": size})
            assert r.status_code == 201, r.text
            sid = r.json()["streaming_session_id"]
            digest = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)}
            put = await http.put(f"{a}/v1/sessions/{sid}/chunks/0", content=data, headers=digest)
            assert put.status_code == 201, put.text
            sids.append(sid)

        async def complete(base: str, sid: str) -> httpx.Response:
            return await http.post(f"{base}/v1/sessions/{sid}/complete", json={})

        answers = await asyncio.gather(*(complete(base, sid) for sid in sids for base in (a, b)))
        codes: dict[str, list[int]] = {}
        for sid, r in zip([s for s in sids for _ in (a, b)], answers, strict=True):
            codes.setdefault(sid, []).append(r.status_code)
        assert all(200 in c for c in codes.values()), codes  # each session completed (a loser may get 409)
        usage: Any = (await http.get(f"{b}/v1/usage")).json()
        assert (usage["bytes_used"], usage["files"]) == (sum(sizes), 10), usage


# -- one record store, bounded retries -----------------------------------------------------------------------------


class _AlwaysChanged:
    """A storage whose compare-and-set always loses (another writer got there first, every time)."""

    def __init__(self, inner: LocalStorage) -> None:
        self.inner = inner
        self.conditional_writes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create(self, key: str, **kwargs: Any) -> Any:
        if kwargs.get("if_match") is not None:
            self.conditional_writes += 1
            kwargs["if_match"] = '"not-the-current-version"'
        return self.inner.create(key, **kwargs)


@pytest.mark.anyio
async def test_a_record_update_that_keeps_losing_gives_up_within_its_rounds_and_time(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "s")
    await store.start()
    losing = _AlwaysChanged(store)
    await RecordStore(store).create("r.json", {"n": 0})
    by_rounds = RecordStore(losing, RetryPolicy(attempts=5, budget=1e9, base=0, cap=0))  # type: ignore[arg-type]
    with pytest.raises(RecordBusy):
        await by_rounds.update("r.json", dict, lambda d: {"n": d["n"] + 1}, dict)
    assert losing.conditional_writes == 5
    ticks = iter(range(10_000))  # each look at the clock: one more second
    by_time = RetryPolicy(attempts=1000, budget=3.0, base=0, cap=0, clock=lambda: float(next(ticks)))
    losing.conditional_writes = 0
    with pytest.raises(RecordBusy):
        await RecordStore(losing, by_time).update("r.json", dict, lambda d: {"n": d["n"] + 1}, dict)  # type: ignore[arg-type]
    assert 1 < losing.conditional_writes <= 3  # the 3 s budget, not the 1,000 rounds, ended it
    assert (await RecordStore(store).read("r.json"))[0] == {"n": 0}
    ledger = UsageLedger(RecordStore(losing, RetryPolicy(attempts=4, budget=1e9, base=0, cap=0)), {}, shards=1)  # type: ignore[arg-type]
    await ledger.charge(None, "a", 1)  # the first write of a usage record is if-absent
    losing.conditional_writes = 0
    with pytest.raises(RecordBusy):
        await ledger.charge(None, "b", 1)
    assert losing.conditional_writes == 4


class _LosesOnce(_AlwaysChanged):
    """A storage whose first compare-and-set loses (another writer got there first), and the rest are real."""

    def create(self, key: str, **kwargs: Any) -> Any:
        if kwargs.get("if_match") is not None and self.conditional_writes == 0:
            return super().create(key, **kwargs)
        return self.inner.create(key, **kwargs)


@pytest.mark.anyio
async def test_a_lost_race_on_a_slow_engine_is_read_again_before_the_budget_ends_it(tmp_path: Path) -> None:
    """One read and one conditional write took longer than the whole budget (a busy Ceph): the loser still reads
    the record once more and applies its change, rather than failing a race it only had to look at again."""
    store = LocalStorage(tmp_path / "s")
    await store.start()
    await RecordStore(store).create("r.json", {"n": 0})
    losing = _LosesOnce(store)
    ticks = iter(range(0, 1_000_000, 5))  # each look at the clock: five more seconds, past the 2 s budget
    slow = RetryPolicy(budget=2.0, base=0, cap=0, clock=lambda: float(next(ticks)))
    records = RecordStore(losing, slow)  # type: ignore[arg-type]
    assert await records.update("r.json", dict, lambda d: {"n": d["n"] + 1}, dict) == {"n": 1}
    assert losing.conditional_writes == 1
    assert (await RecordStore(store).read("r.json"))[0] == {"n": 1}
