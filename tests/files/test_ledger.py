"""The usage ledger counts every removed file exactly once: racing deletes, expiry sweeps and admin gc runs, on one
server and on two replicas of one storage, on local storage and on the S3 test server; only the one removal that
won the claim answers 204 (the others 404) and refunds. ``transfer usage repair`` recounts the ledger from the file
records and sets it right on request."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash

from tests.conftest import Clock, LiveServer, running, serving
from tests.uploads.test_lifecycle import KEYS, TOKENS, TUS, KiB, MiB, key, life_settings, stored_files, usage
from transfer.cli import main as cli_main
from transfer.core.auth import parse_keys
from transfer.hosts import create_app
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.accounting.usage import UsageLedger
from transfer.service.backends import make_storage

ROUNDS = 10
RACERS = 8


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def life(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    extra: dict[str, Any] = {}
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        extra = {"storage": "s3"}
    with running(life_settings(tmp_path, **extra), clock) as live:
        yield live


@pytest.fixture
def two_replicas(tmp_path: Path, clock: Clock) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Two services, each with its own ledger and locks, on one data directory (what two processes share)."""
    settings = life_settings(tmp_path)
    with ExitStack() as stack:
        one = stack.enter_context(serving(create_app(settings, clock=clock), settings))
        two = stack.enter_context(serving(create_app(settings, clock=clock), settings))
        yield one, two


def upload(url: str, nbytes: int, **params: Any) -> str:
    with httpx.Client(base_url=url, headers=key("alice"), timeout=60) as http:
        r = http.post("/v1/files", content=os.urandom(nbytes), params=params)
        assert r.status_code == 201, r.text
        file_id: str = r.json()["metadata"]["file_id"]
        return file_id


def race(calls: list[tuple[str, str, str]]) -> list[httpx.Response]:
    """``(method, url, who)`` all at once, each on its own connection."""

    def one(call: tuple[str, str, str]) -> httpx.Response:
        method, url, who = call
        with httpx.Client(headers=key(who), timeout=60) as http:
            return http.request(method, url)

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(one, calls))


def check_deletes_refund_once(servers: list[LiveServer]) -> None:
    kept = upload(servers[0].url, MiB // 2)
    for _ in range(ROUNDS):
        doomed = upload(servers[0].url, MiB)
        answers = race(
            [("DELETE", f"{servers[i % len(servers)].url}/v1/files/{doomed}", "admin") for i in range(RACERS)]
        )
        codes = sorted(r.status_code for r in answers)
        assert codes == [204] + [404] * (RACERS - 1), codes
        assert all(r.json()["error"]["code"] == "not_found" for r in answers if r.status_code == 404)
        with httpx.Client(base_url=servers[-1].url) as http:
            assert usage(http, "alice")["bytes_used"] == MiB // 2
            assert usage(http, "alice")["files"] == 1
    assert stored_files(servers[0]) == [kept]


def test_racing_deletes_answer_204_once_and_refund_once(life: LiveServer) -> None:
    check_deletes_refund_once([life])


def test_racing_deletes_through_two_replicas_refund_once(two_replicas: tuple[LiveServer, LiveServer]) -> None:
    check_deletes_refund_once(list(two_replicas))


def check_sweeps_remove_once(servers: list[LiveServer], clock: Clock) -> None:
    kept = upload(servers[0].url, MiB // 2)
    for i in range(20):
        upload(servers[i % len(servers)].url, 50_000, expires_in=60)
    clock.advance(3600)  # every one of them is due
    answers = race([("POST", f"{servers[i % len(servers)].url}/v1/admin/gc", "admin") for i in range(4)])
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert sum(r.json()["removed"]["expired_files"] for r in answers) == 20
    with httpx.Client(base_url=servers[-1].url) as http:
        assert usage(http, "alice")["bytes_used"] == MiB // 2
        assert usage(http, "alice")["files"] == 1
    assert stored_files(servers[0]) == [kept]


def test_racing_gc_runs_remove_and_refund_each_expired_file_once(life: LiveServer, clock: Clock) -> None:
    check_sweeps_remove_once([life], clock)


def test_two_replicas_sweeping_remove_each_expired_file_once(
    two_replicas: tuple[LiveServer, LiveServer], clock: Clock
) -> None:
    check_sweeps_remove_once(list(two_replicas), clock)


# --- transfer usage repair ---------------------------------------------------------------------------------------


def side_ledger(live: LiveServer, change: Callable[[UsageLedger], Awaitable[Any]]) -> Any:
    """Run ``change`` on the ledger through a storage backend of its own (another process's view of the store)."""

    async def run() -> Any:
        storage = make_storage(live.settings)
        await storage.start()
        try:
            return await change(UsageLedger(RecordStore(storage), parse_keys(KEYS), shards=live.settings.usage_shards))
        finally:
            await storage.close()

    return asyncio.run(run())


def test_usage_repair_reports_a_wrong_ledger_and_fixes_it_on_request(
    life: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with httpx.Client(base_url=life.url, timeout=30) as http:
        ids = [upload(life.url, n) for n in (1000, 2000, 3000)]
        r = http.post("/v1/files", content=b"b" * 5000, headers=key("bob"))
        assert r.status_code == 201, r.text
    # what a double refund and a crash between a removal and its refund leave behind; and a removal claimed (in
    # flight) of a file still stored, which the count must not take twice
    side_ledger(life, lambda ledger: ledger.refund("alice", 2500, rid="f_lost"))
    side_ledger(life, lambda ledger: ledger.charge("bob", "lost", 700))
    assert side_ledger(life, lambda ledger: ledger.claim_removal("alice", ids[0], 1000))
    admin = ["--server", life.url, "--api-key", TOKENS["admin"]]

    assert cli_main(["usage", "repair", *admin]) == 1  # a difference, not fixed
    lines = capsys.readouterr().out.splitlines()
    assert (
        "alice: recorded 3,500 bytes in 2 files, counted 6,000 bytes in 3 files: -2,500 bytes, -1 files (differs)"
        in lines
    )
    assert (
        "bob: recorded 5,700 bytes in 2 files, counted 5,000 bytes in 1 files: +700 bytes, +1 files (differs)" in lines
    )
    with httpx.Client(base_url=life.url, timeout=60) as http:
        assert usage(http, "alice")["bytes_used"] == 3500  # a report changes nothing

    assert cli_main(["usage", "repair", "--fix", "--json", *admin]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["differing"] == 2 and result["fixed"] == 2 and result["unreadable_records"] == 0
    assert result["keys"]["alice"] == {
        "recorded": {"bytes_used": 3500, "files": 2},
        "counted": {"bytes_used": 6000, "files": 3},
        "differs": True,
        "fixed": True,
        "busy": False,
    }
    assert not result["keys"][""]["differs"] and not result["keys"]["admin"]["differs"]
    with httpx.Client(base_url=life.url, timeout=60) as http:
        assert usage(http, "alice")["bytes_used"] == 6000 and usage(http, "alice")["files"] == 3
        assert usage(http, "bob")["bytes_used"] == 5000 and usage(http, "bob")["files"] == 1
        side_ledger(life, lambda ledger: ledger.unclaim("alice", ids[0]))
        assert http.delete(f"/v1/files/{ids[0]}", headers=key("admin")).status_code == 204  # the claim is gone
        assert usage(http, "alice")["bytes_used"] == 5000

    assert cli_main(["usage", "repair", *admin]) == 0  # the ledger is right: nothing to fix
    assert all("differs" not in line for line in capsys.readouterr().out.splitlines())
    assert cli_main(["usage", "repair", "--server", life.url, "--api-key", TOKENS["alice"]]) == 1
    assert "insufficient_scope" in capsys.readouterr().err


# --- uploads of unknown length reserve as they grow ---------------------------------------------------------------


def test_deferred_length_tus_uploads_reserve_as_they_grow(life: LiveServer) -> None:
    """Four tus uploads with a deferred length, 1 MiB PATCHed to each, on a 3 MiB quota: each PATCH reserves its
    bytes before they are stored, so the fourth is refused (it was bounded by the whole free quota, not by what the
    others held: 4 MiB stored, 0 reserved)."""
    patch = {**TUS, "upload-offset": "0", "content-type": "application/offset+octet-stream"}
    with httpx.Client(base_url=life.url, headers=key("alice"), timeout=60) as http:
        urls = [
            http.post("/tus/files", headers={**TUS, "upload-defer-length": "1"}).headers["location"] for _ in range(4)
        ]
        codes = [http.patch(url, content=os.urandom(MiB), headers=patch).status_code for url in urls]
        assert codes == [204, 204, 204, 413]
        assert usage(http, "alice")["bytes_reserved"] == 3 * MiB
        # a PATCH without a Content-Length takes what is left, then holds what it stored
        assert http.delete(urls[2], headers=TUS).status_code == 204
        assert usage(http, "alice")["bytes_reserved"] == 2 * MiB

        def body() -> Iterator[bytes]:
            yield os.urandom(KiB)

        r = http.patch(urls[3], content=body(), headers=patch)
        assert r.status_code == 204, r.text
        assert usage(http, "alice")["bytes_reserved"] == 2 * MiB + KiB
        # declaring the length publishes: the reservation becomes the file's bytes
        done = {**patch, "upload-offset": str(MiB), "upload-length": str(MiB)}
        assert http.patch(urls[0], content=b"", headers=done).status_code == 204
        assert usage(http, "alice")["bytes_used"] == MiB
        assert usage(http, "alice")["bytes_reserved"] == MiB + KiB


def test_sessions_without_a_size_reserve_up_to_their_chunks(life: LiveServer) -> None:
    """Sessions of unknown size on a 3 MiB quota: a chunk reserves up to its end before it is stored, so three
    sessions cannot each reach 1.5 MiB."""
    on_s3 = life.settings.storage == "s3"  # S3 sessions have chunks of at least 5 MiB (UploadPartCopy)
    chunk_size, index = (5 * MiB, 0) if on_s3 else (64 * KiB, 23)
    chunk = os.urandom(3 * MiB // 2 - index * chunk_size)  # each session reaches 1.5 MiB
    with httpx.Client(base_url=life.url, headers=key("alice"), timeout=60) as http:
        sids = [
            http.post("/v1/sessions", json={"chunk_size": chunk_size}).json()["streaming_session_id"] for _ in range(3)
        ]
        codes = []
        for sid in sids:
            r = http.put(
                f"/v1/sessions/{sid}/chunks/{index}",
                content=chunk,
                headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(chunk)},
            )
            codes.append(r.status_code)
        assert codes == [201, 201, 413], codes
        assert usage(http, "alice")["bytes_reserved"] == 3 * MiB
        assert http.delete(f"/v1/sessions/{sids[0]}").status_code == 204
        assert usage(http, "alice")["bytes_reserved"] == 3 * MiB // 2
