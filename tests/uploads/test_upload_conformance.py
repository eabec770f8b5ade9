"""The upload conformance suite (``tests/upload_conformance.py``) on one server, for every door: local storage, and
the S3 test server (where the direct door exists too). The race of a completion and an abort on two replicas is
``tests/ops/test_upload_races.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Clock, LiveServer, running
from tests.upload_conformance import Door, chunk_size_for, doors, file_id_of, succeeded, usage
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

OWNER, ADMIN = new_token(), new_token()
SLOTS = 3  # open uploads a key may hold per kind (tus and IETF uploads share theirs with sessions)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def live(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    extra: dict[str, Any] = {}
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        extra = {"storage": "s3"}
    keys = {
        "owner": {"sha256": token_hash(OWNER), "scopes": ["upload", "read"], "max_bytes": 1 << 30},
        "admin": {"sha256": token_hash(ADMIN), "scopes": ["admin"]},
    }
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys=keys,
        max_open_sessions_per_key=SLOTS,
        max_open_direct_plans_per_key=SLOTS,
        session_gc_interval=3600,  # the sweep runs when the test asks (POST /v1/admin/gc)
        dedup_min_size=64 << 10,  # the files here are shared (the born-completed case)
        **extra,
    )
    with running(settings, clock) as server:
        yield server


def _client(live: LiveServer, token: str = OWNER) -> httpx.Client:
    return httpx.Client(base_url=live.url, timeout=120, headers={"authorization": f"Bearer {token}"})


def _doors(live: LiveServer) -> list[Door]:
    with _client(live) as http:
        return doors(chunk_size_for(http), s3=live.settings.storage == "s3")


def _data(door: Door, live: LiveServer) -> bytes:
    with _client(live) as http:
        chunk = chunk_size_for(http)
    return os.urandom(2 * chunk + 1234) if door.name in ("session", "direct") else os.urandom(300_000)


def _sweep(live: LiveServer) -> dict[str, Any]:
    with _client(live, ADMIN) as admin:
        r = admin.post("/v1/admin/gc")
        assert r.status_code == 200, r.text
        return dict(r.json())


def test_complete_twice_publishes_one_file_charged_once(live: LiveServer) -> None:
    for door in _doors(live):
        data = _data(door, live)
        with _client(live) as http:
            before = usage(http)
            opened = door.open(http, data)
            assert opened.response.status_code == 201, (door.name, opened.response.text)
            door.send(http, opened, data)
            first = door.complete(http, opened, data)
            assert succeeded(first), (door.name, first.status_code, first.text)
            again = door.complete(http, opened, data)
            # a second completion answers the same file, or (sessions) refuses, 409: never a second file
            assert (succeeded(again) and file_id_of(again) == file_id_of(first)) or again.status_code == 409, (
                door.name,
                again.status_code,
                again.text,
            )
            after = usage(http)
            assert after["files"] == before["files"] + 1, door.name
            grew = after["bytes_used"] - before["bytes_used"]
            if door.name == "chunked":  # the file, and the chunks its key keeps for its next version (once)
                assert len(data) <= grew <= 2 * len(data), door.name
            else:
                assert grew == len(data), door.name
            assert after["bytes_reserved"] == 0, door.name
            assert httpx.get(first.json()["url"], timeout=60).content == data


def test_an_abort_ends_the_upload_and_releases_its_reservation(live: LiveServer) -> None:
    for door in _doors(live):
        data = _data(door, live)
        with _client(live) as http:
            before = usage(http)
            opened = door.open(http, data)
            door.send(http, opened, data, last=False)
            assert door.abort(http, opened).status_code == 204, door.name
            late = door.complete(http, opened, data)
            assert late.status_code in (404, 409, 410) and not succeeded(late), (door.name, late.status_code)
            after = usage(http)
            assert (after["files"], after["bytes_reserved"]) == (before["files"], 0), door.name
            if door.name != "chunked":  # (the chunk store keeps the chunks sent, counted, for the grace)
                assert after["bytes_used"] == before["bytes_used"], door.name


def test_an_expired_upload_is_ended_by_the_one_sweep(live: LiveServer, clock: Clock) -> None:
    opened_ids = []
    with _client(live) as http:
        for door in _doors(live):
            data = _data(door, live)
            opened = door.open(http, data)
            door.send(http, opened, data, last=False)
            opened_ids.append((door, opened, data))
        assert usage(http)["bytes_reserved"] > 0
        clock.advance(live.settings.session_ttl + 1)
        swept = _sweep(live)["removed"]
        assert swept["uploads"] >= len(opened_ids) - 1  # the chunked door keeps no parts of its own to remove
        assert usage(http)["bytes_reserved"] == 0
        for door, opened, data in opened_ids:
            late = door.complete(http, opened, data)
            assert late.status_code in (404, 409, 410) and not succeeded(late), (door.name, late.status_code)
    if live.settings.storage == "local":  # the parts went with the uploads (the chunk store keeps its chunks)
        parts = [o for o in live.objects() if "/seg/" in o or "/chunks/" in o and o.startswith("sessions/")]
        assert parts == []
        assert not any((live.data_dir / "staging" / "sessions").glob("s_*"))


def test_content_the_key_stores_is_published_at_once_and_holds_no_slot(live: LiveServer) -> None:
    for door in _doors(live):
        data = _data(door, live)
        with _client(live) as http:
            opened = door.open(http, data)
            door.send(http, opened, data)
            original = door.complete(http, opened, data)
            assert succeeded(original), door.name
            for _ in range(SLOTS + 1):  # more than the key's open uploads: none of them holds a slot
                born = door.open(http, data, known=True)
                assert born.response.status_code == 201, (door.name, born.response.text)
                answered = door.complete(http, born, data)  # nothing sent: the upload is complete already
                assert succeeded(answered), (door.name, answered.status_code, answered.text)
                assert file_id_of(answered) != file_id_of(original)
                assert httpx.get(answered.json()["url"], timeout=60).content == data
            assert usage(http)["bytes_reserved"] == 0, door.name
            # a new upload still finds a free slot
            other = os.urandom(len(data))
            fresh = door.open(http, other)
            assert fresh.response.status_code == 201, (door.name, fresh.response.text)
            door.abort(http, fresh)
