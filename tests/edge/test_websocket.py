"""TP WebSocket subscribers bounded per key and per process (transfer.service.agents.subscriptions), against a real
``transfer serve`` process on loopback: connections refused at the handshake past a limit, subscriptions past one
ending their connection with 1008, everything given back when connections close, and the memory one followed id
costs. Each test states its time bound."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.edge.attacks import Server, serve, settle_rss
from transfer.core.auth import new_token, token_hash

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKENS = {name: new_token() for name in ("alice", "bob")}
KEYS = {name: {"sha256": token_hash(token), "scopes": ["read", "upload"]} for name, token in TOKENS.items()}


def subscribe(ids: list[str]) -> str:
    return json.dumps(
        {
            "tp_version": "1.0.0",
            "message_id": str(uuid.uuid4()),
            "message_type": "resource_notify",
            "sender": "fay:watcher",
            "payload": {"subscribe": ids},
        }
    )


async def open_ws(server: Server, who: str) -> ClientConnection:
    url = server.url.replace("http", "ws") + "/tp/v1"
    headers = {"authorization": f"Bearer {TOKENS[who]}"}
    return await connect(url, subprotocols=["tp.v1"], additional_headers=headers)  # type: ignore[list-item]


async def follow(ws: ClientConnection, ids: list[str]) -> dict[str, Any]:
    """Follow ``ids`` 100 at a time; the last answer (or the close reason, as ``{"closed": ...}``)."""
    answer: dict[str, Any] = {}
    for start in range(0, len(ids), 100):
        try:
            await ws.send(subscribe(ids[start : start + 100]))
            answer = json.loads(await asyncio.wait_for(ws.recv(), 30))
        except ConnectionClosed as exc:
            assert exc.rcvd is not None
            return {"closed": exc.rcvd.code, "reason": json.loads(exc.rcvd.reason)}
    return answer


async def test_websocket_connections_are_bounded_per_key_and_per_process(tmp_path: Path) -> None:
    """tp_max_websockets_per_key=3, tp_max_websockets=5: alice's 4th connection is refused at the handshake (503
    too_many_connections, limit websocket_key), bob's 3rd (the process's 6th) too (websocket_process); once one of
    alice's closes, bob gets his. Before: no limit. Bound: ~3 s."""
    limits = {"api_keys": KEYS, "tp_max_websockets_per_key": 3, "tp_max_websockets": 5}
    with serve(tmp_path, **limits) as server:
        alice = [await open_ws(server, "alice") for _ in range(3)]
        with pytest.raises(InvalidStatus) as refused:
            await open_ws(server, "alice")
        assert refused.value.response.status_code == 503
        assert json.loads(refused.value.response.body or b"{}")["code"] == "too_many_connections"
        bob = [await open_ws(server, "bob") for _ in range(2)]
        with pytest.raises(InvalidStatus) as refused:
            await open_ws(server, "bob")
        assert refused.value.response.status_code == 503
        await alice.pop().close()
        await asyncio.sleep(0.3)
        bob.append(await open_ws(server, "bob"))
        for ws in alice + bob:
            await ws.close()


async def test_subscriptions_are_bounded_per_key_and_given_back_on_close(tmp_path: Path) -> None:
    """tp_max_subscriptions_per_key=1000 (topics: two per resource id): alice's second connection takes her past
    it and is closed with 1008 too_many_subscriptions; bob is not affected; when alice's connections close, her
    subscriptions are given back and she can follow again. Before: only the per-connection bound. Bound: ~3 s."""
    limits = {"api_keys": KEYS, "tp_max_subscriptions_per_key": 1000}
    with serve(tmp_path, **limits) as server:
        first, second = await open_ws(server, "alice"), await open_ws(server, "alice")
        assert (await follow(first, [f"a{i}" for i in range(400)]))["payload"]["status"] == "subscribed"
        over = await follow(second, [f"b{i}" for i in range(400)])
        assert over["closed"] == 1008 and over["reason"]["code"] == "too_many_subscriptions", over
        assert "this key holds 1000 subscriptions" in over["reason"]["message"]
        bob = await open_ws(server, "bob")
        assert (await follow(bob, [f"c{i}" for i in range(400)]))["payload"]["status"] == "subscribed"
        await first.close()
        await bob.close()
        await asyncio.sleep(0.3)
        again = await open_ws(server, "alice")
        assert (await follow(again, [f"d{i}" for i in range(450)]))["payload"]["status"] == "subscribed"
        await again.close()


@pytest.mark.slow
async def test_many_subscriptions_of_one_key_stay_within_their_memory_bound(tmp_path: Path) -> None:
    """One read key, 20 connections each following up to 1,000 ids, with the default limits (before: 120 such
    connections held 120,000 subscriptions and took RSS 645 → 1,484 MiB, ~7-10 KB an id, a queue and a task per
    topic). The key stops at tp_max_subscriptions_per_key (10,000 topics, 5,000 ids); what it holds stays under
    2 KiB an id (20 MiB here); then every connection closes and the key can follow again. Bound: ~10 s."""
    with serve(tmp_path, api_keys=KEYS) as server:
        base = settle_rss(server, 0.5)
        conns = [await open_ws(server, "alice") for _ in range(20)]
        answers = [await follow(ws, [f"r{n}-{i}" for i in range(1000)]) for n, ws in enumerate(conns)]
        peak = server.rss_mib()
        closed = [a for a in answers if "closed" in a]
        assert closed and all(a["reason"]["code"] == "too_many_subscriptions" for a in closed)
        assert 20 - len(closed) == 5  # 5 connections of 1,000 ids: 10,000 topics
        assert peak - base < 20, (base, peak)
        for ws in conns:
            await ws.close()
        await asyncio.sleep(0.5)
        again = await open_ws(server, "alice")
        assert (await follow(again, [f"s{i}" for i in range(1000)]))["payload"]["status"] == "subscribed"
        await again.close()
