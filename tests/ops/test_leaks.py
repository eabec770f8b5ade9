"""Resources that must not outlive their request: WebSocket subscriptions, file descriptors of HEAD requests,
jobs that ids from nowhere would create. Each test drives a real server on loopback and counts the resource."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash
from httpx_sse import aconnect_sse
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, running
from transfer.errors import NotFound
from transfer.settings import Settings

pytestmark = pytest.mark.anyio


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def server_errors() -> Iterator[list[logging.LogRecord]]:
    """Errors the server logs meanwhile (uvicorn's loggers do not propagate to the root, so caplog misses them)."""
    handler = _Errors()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "uvicorn", "transfer")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def envelope(message_type: str, payload: dict[str, Any]) -> str:
    return json.dumps(
        {
            "tp_version": "1.0.0",
            "message_id": str(uuid.uuid4()),
            "message_type": message_type,
            "sender": "fay:watcher",
            "payload": payload,
        }
    )


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})
    with running(settings) as server:
        yield server


async def test_websocket_subscriptions_are_removed_when_the_socket_closes(live: LiveServer) -> None:
    """1,000 subscribe/close cycles leave no subscription behind (each one held a queue of up to 1,000 notifies:
    memory grew and stayed) and log no error (the clean-up used to die on 'Set changed size during iteration')."""
    tp = live.app.state.services.tp
    ws_url = live.url.replace("http", "ws") + "/tp/v1"
    with server_errors() as errors:
        for i in range(1000):
            async with connect(ws_url, subprotocols=["tp.v1"]) as ws:  # type: ignore[list-item]
                await ws.send(envelope("resource_notify", {"subscribe": [f"f_watched{i % 7}", "j_0123456789"]}))
                assert json.loads(await ws.recv())["payload"]["status"] == "subscribed"
        # the server's side of the last close may still be running: a notify round trip orders us after it
        async with httpx.AsyncClient() as http:
            for _ in range(200):
                if not tp._topics:
                    break
                await http.get(f"{live.url}/healthz")
    assert tp._topics == {}
    assert [r.getMessage() for r in errors] == []


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))  # the server runs in this process (a thread)


def test_head_on_a_chunk_url_leaks_no_descriptor(live: LiveServer) -> None:
    """HEAD opens the chunk to learn its length and checksum; the descriptor is closed even though no byte is
    read (the chunk used to be owned by an async generator that never started, so its ``finally`` never ran)."""
    data = os.urandom(100_000)
    chunk = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)}
    with httpx.Client(base_url=live.url, timeout=30) as http:
        doc = http.post("/v1/sessions", json={"size": 2 * len(data), "chunk_size": len(data)}).json()
        sid = doc["streaming_session_id"]
        base, query = doc["descriptor"]["url"].split("?")
        assert http.put(f"/v1/sessions/{sid}/chunks/0", content=data, headers=chunk).status_code == 201
        url = f"{base}/0?{query}"
        assert http.head(url).status_code == 200  # warm up: lazily opened files, pools, caches
        before = open_fds()
        for _ in range(50):  # a chunk of a session still uploading
            response = http.head(url)
            assert response.status_code == 200 and response.headers["content-length"] == str(len(data))
            assert response.content == b""
        assert http.put(f"/v1/sessions/{sid}/chunks/1", content=data, headers=chunk).status_code == 201
        assert http.post(f"/v1/sessions/{sid}/complete", json={}).status_code == 200
        for _ in range(50):  # a chunk of the completed file
            assert http.head(url).status_code == 200
        assert http.get(url).content == data
        assert open_fds() - before <= 2  # not +1 per HEAD (noise: the client's own connection pool)


async def test_job_lookups_of_unknown_ids_create_nothing_and_waiting_streams_are_bounded(tmp_path: Path) -> None:
    """``GET /v1/jobs/<random id>`` used to create a pending job that never expired (10,050 of them made every
    lookup slow). A look creates nothing; a stream opened before its upload waits, but at most
    ``max_waiting_jobs`` at once (then 429), and each ends with not_found after ``job_wait_ttl``."""
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        max_waiting_jobs=5,
        job_wait_ttl=1.0,
        sse_heartbeat=30,  # the hub's own expiry ends the streams, not the SSE keep-alive check
    )
    with running(settings) as live:
        hub = live.app.state.services.hub
        async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
            for _ in range(500):
                response = await http.get(f"/v1/jobs/{uuid.uuid4().hex}")
                assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
            assert len(hub) == 0

            async def follow(job_id: str) -> list[tuple[str, dict[str, Any]]]:
                async with aconnect_sse(http, "GET", f"/v1/jobs/{job_id}/events") as source:
                    return [(sse.event, json.loads(sse.data)) for sse in [s async for s in source.aiter_sse()]]

            ids = [f"waiting-{i:04d}" for i in range(5)]
            streams = [asyncio.create_task(follow(job_id)) for job_id in ids]
            while hub.waiting < 5:
                await asyncio.sleep(0.02)
            refused = await http.get("/v1/jobs/one-too-many/events")
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_jobs"
            assert int(refused.headers["retry-after"]) >= 1
            for events in await asyncio.wait_for(asyncio.gather(*streams), 30):
                assert [name for name, _ in events] == ["error"]
                assert events[0][1]["payload"]["code"] == "not_found"
            assert hub.waiting == 0 and len(hub) == 0

            # the feature stays: a stream opened for one's own upload id before the upload sees it finish
            reader = asyncio.create_task(follow("my-upload-0002"))
            while hub.waiting < 1:
                await asyncio.sleep(0.02)
            stored = await http.post("/v1/files", params={"job_id": "my-upload-0002"}, content=b"x" * 5000)
            assert stored.status_code == 201
            events = await asyncio.wait_for(reader, 30)
            assert [name for name, _ in events][-1] == "done" and hub.waiting == 0


def test_the_hub_forgets_finished_jobs_and_evicts_them_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finished jobs go after ``retention``; over ``max_jobs`` the oldest finished go first; running jobs stay."""
    from transfer.service.jobs import progress

    now = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    hub = progress.ProgressHub(max_jobs=3, retention=10.0)
    running_job = hub.open("running-0001", "upload")
    running_job.start()
    for i in range(5):
        job = hub.open(f"finished-{i:04d}", "upload")
        job.succeed({})
        now[0] += 1
    assert len(hub) == 3  # running + the two newest finished
    assert hub.find("running-0001") is running_job and hub.find("finished-0004").finished
    with pytest.raises(NotFound):
        hub.find("finished-0000")
    now[0] += 10
    hub.open("new-job-0001", "upload")
    assert len(hub) == 2 and hub.find("running-0001") is running_job
