"""Fixtures of the hooks and events tests: a server with events on, a real webhook receiver subscribed to it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Clock, LiveServer, running
from tests.events.receiver import Receiver
from transfer.settings import Settings


def event_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Events on, loopback receivers allowed, delivery loops fast enough for a test."""
    base: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "signing_keys": {"t": "0123456789abcdef0123"},
        "events": True,
        "hooks_allow_networks": ["127.0.0.0/8"],
        "events_scan_interval": 0.2,
        "events_retry_base": 0.1,
        "events_retry_max": 0.5,
    }
    return Settings(**{**base, **overrides})


@dataclass
class Hooked:
    live: LiveServer
    http: httpx.Client
    receiver: Receiver
    subscription: dict[str, Any]


def subscribe(http: httpx.Client, receiver: Receiver, **fields: Any) -> dict[str, Any]:
    """A subscription of ``receiver`` (it learns the secret)."""
    answer = http.post("/v1/admin/subscriptions", json={"url": receiver.url, **fields})
    assert answer.status_code == 201, answer.text
    doc: dict[str, Any] = answer.json()
    receiver.secrets.append(doc["secret"])
    return doc


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def hooked(tmp_path: Path, clock: Clock, receiver: Receiver) -> Iterator[Hooked]:
    """A server with events on (on the test's clock) and ``receiver`` subscribed to every event."""
    with running(event_settings(tmp_path), clock) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        yield Hooked(live, http, receiver, subscribe(http, receiver))
