"""TP messages waiting in a mailbox are bytes stored, charged to the key that sent them: refused over its quota,
refunded exactly once when a poll delivers them or the sweep removes them (polls and sweeps racing on two replicas
of one data directory), and counted by ``transfer usage repair``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agents.test_bindings_tp import TP_JSON, envelope
from tests.conftest import Clock, LiveServer, serving
from transfer.core.auth import new_token, token_hash
from transfer.hosts import create_app
from transfer.settings import Settings

pytestmark = pytest.mark.anyio

TOKENS = {name: new_token() for name in ("alice", "bob", "ops")}
QUOTA = 40_000
PAD = "p" * 8000  # each note: about 8.3 kB kept for its receiver


def auth(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[who]}"}


@pytest.fixture
def replicas(tmp_path: Path, clock: Clock) -> Iterator[tuple[LiveServer, LiveServer]]:
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys={
            "alice": {"sha256": token_hash(TOKENS["alice"]), "scopes": ["upload", "read"], "tp_identities": ["fay:a"]},
            "bob": {
                "sha256": token_hash(TOKENS["bob"]),
                "scopes": ["upload", "read"],
                "tp_identities": ["fay:b"],
                "max_bytes": QUOTA,
            },
            "ops": {"sha256": token_hash(TOKENS["ops"]), "scopes": ["admin"]},
        },
        tp_mailbox_ttl=600,
        tp_mailbox_max_messages=100,
        tp_max_envelope_size=64 << 10,
        session_gc_interval=3600,
    )
    with ExitStack() as stack:
        one = stack.enter_context(serving(create_app(settings, clock=clock), settings))
        two = stack.enter_context(serving(create_app(settings, clock=clock), settings))
        yield one, two


async def notify(http: httpx.AsyncClient, url: str, pad: str = PAD) -> httpx.Response:
    note = envelope("resource_notify", {"event": "hello", "pad": pad}, sender="fay:b", receiver="fay:a")
    return await http.post(f"{url}/tp/v1/resource/notify", json=note, headers={**TP_JSON, **auth("bob")})


async def used(http: httpx.AsyncClient, url: str, who: str = "bob") -> dict[str, Any]:
    r = await http.get(f"{url}/v1/usage", headers=auth(who))
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def mailbox(live: LiveServer) -> list[str]:
    return [name for name in live.objects() if name.startswith("tp/mailbox/")]


async def test_waiting_messages_are_charged_to_their_sender_and_refunded_once_on_delivery(
    replicas: tuple[LiveServer, LiveServer],
) -> None:
    one, two = replicas
    async with httpx.AsyncClient(timeout=60) as http:
        sent = [await notify(http, (one, two)[i % 2].url) for i in range(4)]
        assert [r.status_code for r in sent] == [202] * 4, [r.text for r in sent]
        bob = await used(http, one.url)
        assert 4 * len(PAD) < bob["bytes_used"] < 4 * (len(PAD) + 1000) and bob["files"] == 0
        assert (await used(http, one.url, "alice"))["bytes_used"] == 0  # the receiver pays nothing
        over = await notify(http, two.url, "q" * (QUOTA - bob["bytes_used"]))
        assert over.status_code == 413 and "quota_exceeded" in over.text, over.text
        assert len(mailbox(one)) == 4 and (await used(http, one.url))["bytes_used"] == bob["bytes_used"]

        polls = await asyncio.gather(
            *(
                http.get(f"{(one, two)[i % 2].url}/tp/v1/messages", params={"receiver": "fay:a"}, headers=auth("alice"))
                for i in range(6)
            )
        )
        assert all(r.status_code == 200 for r in polls), [r.text for r in polls]
        delivered = [m["message_id"] for r in polls for m in r.json()["messages"]]
        assert sorted(delivered) == sorted(r.json()["correlation_id"] for r in sent)  # each once
        assert (await used(http, one.url))["bytes_used"] == 0
        assert mailbox(one) == []


async def test_the_sweep_refunds_expired_messages_once_and_repair_counts_waiting_ones(
    replicas: tuple[LiveServer, LiveServer], clock: Clock
) -> None:
    one, two = replicas
    async with httpx.AsyncClient(timeout=60) as http:
        assert [(await notify(http, one.url)).status_code for _ in range(3)] == [202] * 3
        charged = (await used(http, one.url))["bytes_used"]
        repair = await http.post(f"{two.url}/v1/admin/usage/repair", headers=auth("ops"))
        assert repair.status_code == 200, repair.text
        report = repair.json()["keys"]["bob"]
        assert report["counted"] == {"bytes_used": charged, "files": 0} and not report["differs"]

        clock.advance(601)  # past their lifetime: both replicas' sweeps race for them
        runs = await asyncio.gather(
            *(http.post(f"{(one, two)[i % 2].url}/v1/admin/gc", headers=auth("ops")) for i in range(4))
        )
        assert all(r.status_code == 200 for r in runs), [r.text for r in runs]
        assert sum(r.json()["removed"]["tp_mailboxes"] for r in runs) == 3
        assert (await used(http, one.url))["bytes_used"] == 0
        assert mailbox(one) == []
