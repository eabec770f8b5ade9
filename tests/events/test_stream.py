"""The caller's own events as a server-sent event stream (``GET /v1/events``): a key sees its own files' events
only, live and from the feed, and a stream that reconnects with ``Last-Event-ID`` gets what came after, nothing
before. And the outbox's crash path, in-process: an event staged by a process that placed its file and died before
telling anyone is checked against the storage and sent; one whose change never happened is dropped."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from httpx_sse import connect_sse

from tests.conftest import Clock, running
from tests.events.conftest import event_settings
from tests.events.receiver import Receiver
from transfer.core.auth import token_hash
from transfer.core.uploads.state import FileIntent
from transfer.service.container import Services
from transfer.service.events.delivery import STAGED_SETTLE
from transfer.service.events.model import EventType, event_id
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.records import new_file_id

ALICE, BOB = "tk_alice_0123456789abcdef0123456789", "tk_bob_0123456789abcdef0123456789ab"
ROOT = "tk_root_0123456789abcdef01234567890"
KEYS = {
    "alice": {"sha256": token_hash(ALICE), "scopes": ["upload", "read"]},
    "bob": {"sha256": token_hash(BOB), "scopes": ["upload", "read"]},
    "root": {"sha256": token_hash(ROOT), "scopes": ["admin"]},
}


def client(url: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=15, headers={"authorization": f"Bearer {token}"})


def upload(http: httpx.Client, name: str) -> str:
    r = http.post("/v1/files", content=name.encode() * 10, params={"name": name})
    assert r.status_code == 201, r.text
    return str(r.json()["metadata"]["file_id"])


def read(http: httpx.Client, count: int, **kw: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """The first ``count`` events of the caller's stream: (SSE id, event name, data)."""
    out = []
    with connect_sse(http, "GET", "/v1/events", **kw) as source:
        assert source.response.status_code == 200, source.response.read()
        for sse in source.iter_sse():
            out.append((sse.id, sse.event, json.loads(sse.data)))
            if len(out) == count:
                break
    return out


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[str]:
    with running(event_settings(tmp_path, api_keys=KEYS)) as live:
        yield live.url


def test_a_key_streams_its_own_events_and_resumes_after_the_last_one(keyed: str) -> None:
    with client(keyed, ALICE) as alice, client(keyed, BOB) as bob:
        first = upload(alice, "a1")
        upload(bob, "b1")
        [(cursor, name, doc)] = read(alice, 1)
        assert name == "file.published" and doc["type"] == "file.published"
        assert doc["data"]["file"]["id"] == first and doc["id"] == event_id(EventType.FILE_PUBLISHED, first)
        seen: list[tuple[str, str, dict[str, Any]]] = []

        def follow() -> None:  # live: connected before the next upload, resumed after the first event
            seen.extend(read(alice, 2, headers={"last-event-id": cursor}))

        reader = threading.Thread(target=follow)
        reader.start()
        time.sleep(0.5)
        second, third = upload(alice, "a2"), upload(alice, "a3")
        reader.join(timeout=30)
        assert [doc["data"]["file"]["id"] for _, _, doc in seen] == [second, third]
        [(_, _, bobs)] = read(bob, 1)
        assert bobs["data"]["file"]["owner"] == "bob"  # never alice's
        with client(keyed, ROOT) as root:
            assert root.delete(f"/v1/files/{first}").status_code == 204
        [(_, name, deleted)] = read(alice, 1, params={"types": "file.deleted"})  # the published ones left out
        assert name == "file.deleted" and deleted["data"]["file"]["id"] == first


def test_a_stream_with_a_foreign_last_event_id_or_type_is_refused(keyed: str) -> None:
    with client(keyed, ALICE) as alice:
        assert alice.get("/v1/events", headers={"last-event-id": "17"}).json()["error"]["code"] == "invalid_request"
        assert alice.get("/v1/events", params={"types": "file.nope"}).json()["error"]["code"] == "invalid_request"
        assert httpx.get(f"{keyed}/v1/events").status_code == 401


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.mark.anyio
async def test_a_staged_event_is_sent_once_its_change_is_seen_and_dropped_if_never_made(
    tmp_path: Path, clock: Clock, receiver: Receiver
) -> None:
    services = Services.build(event_settings(tmp_path), clock=clock)
    await services.start()
    try:
        events = services.events
        _, secret = await events.subscriptions.create(receiver.url)
        receiver.secrets.append(secret)
        forgot = events.made
        events.made = lambda _eid: None  # type: ignore[method-assign]  # the process dies before telling its workers
        record = await services.files.upload(_one(b"placed, then the process died"), UploadRequest(FileIntent("p")))
        ghost = replace(record, id=new_file_id())  # staged, then its publication failed for good
        await events.publishing(ghost, upload_id=ghost.id, door="upload", durable=True)
        events.made = forgot  # type: ignore[method-assign]
        assert len(await events.outbox.ids()) == 2
        await events.dispatcher.look()  # too fresh: its own maker may still confirm it
        await anyio.sleep(0.5)
        assert not receiver.deliveries
        clock.advance(STAGED_SETTLE + 1)
        events.dispatcher._next.clear()  # noqa: SLF001 - the look's memory of when to come back runs on real time
        await events.dispatcher.look()
        with anyio.fail_after(10):
            while not receiver.deliveries:
                await anyio.sleep(0.05)
        assert receiver.deliveries[0].payload["data"]["file"]["id"] == record.id
        assert await events.outbox.ids() == [event_id(EventType.FILE_PUBLISHED, ghost.id)]
        clock.advance(3601)  # past a publication's grace: it never happened
        events.dispatcher._next.clear()  # noqa: SLF001
        await events.dispatcher.look()
        with anyio.fail_after(10):
            while await events.outbox.ids():
                await anyio.sleep(0.05)
        assert len(receiver.deliveries) == 1
    finally:
        await services.close()
