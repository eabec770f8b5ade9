"""The usage ledger counts every removed file exactly once: racing deletes, expiry sweeps and admin gc runs, on one
server and on two replicas of one storage, on local storage and on the S3 test server; only the one removal that
won the claim answers 204 (the others 404) and refunds. ``transfer usage repair`` recounts the ledger from the file
records and sets it right on request."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Clock, LiveServer, running, serving
from tests.test_lifecycle import MiB, key, life_settings, stored_files, usage
from transfer.hosts import create_app

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
