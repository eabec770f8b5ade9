"""Resources that must not outlive their request: WebSocket subscriptions, file descriptors of HEAD requests,
jobs that ids from nowhere would create. Each test drives a real server on loopback and counts the resource."""

from __future__ import annotations

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
from websockets.asyncio.client import connect

from tests.conftest import LiveServer, running
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
