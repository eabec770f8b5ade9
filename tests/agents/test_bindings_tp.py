"""TP bindings end to end on a live server: REST, native HTTP, A2A JSON-RPC (httpx), native WebSocket (the
`websockets` client, and a raw socket that never answers pings), prompt embedding."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import socket
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import LiveServer, running
from transfer.core.agents.tp import member_spans
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

pytestmark = pytest.mark.anyio
TP_JSON = {"content-type": "application/tp+json"}


def envelope(message_type: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    doc = {
        "tp_version": "1.0.0",
        "message_id": str(uuid.uuid4()),
        "message_type": message_type,
        "sender": "fay:agent-a",
        "receiver": "fay:agent-b",
        "protocol_contract_ref": "contract-7",
        "payload": payload,
    }
    doc.update(extra)
    return doc


def native_headers(doc: dict[str, Any]) -> dict[str, str]:
    """What TP's native HTTP/2 mode (§9.2.3) sends with an envelope to POST /tp/v1."""
    return {**TP_JSON, "tp-contract-ref": doc["protocol_contract_ref"], "tp-message-id": doc["message_id"]}


@pytest.fixture
def tp_server(tmp_path: Path) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        inline_threshold=1024,
        tp_max_envelope_size=64 << 10,
        tp_ping_interval=0.3,
        tp_pong_timeout=0.3,
        session_gc_interval=60,
    )
    with running(settings) as live:
        yield live


async def upload(http: httpx.AsyncClient, live: LiveServer, data: bytes, name: str = "f.bin") -> dict[str, Any]:
    response = await http.post(f"{live.url}/v1/files", params={"name": name}, content=data)
    assert response.status_code == 201, response.text
    doc: dict[str, Any] = response.json()
    return doc


def without(text: str, name: str) -> str:
    start, end = member_spans(text)[name]
    return text[:start] + text[end:]


async def test_rest_mount_unmount_and_headers(tp_server: LiveServer) -> None:
    live = tp_server
    data = os.urandom(50_000)
    async with httpx.AsyncClient() as http:
        stored = await upload(http, live, data)
        fid = stored["metadata"]["file_id"]
        request = envelope("resource_mount", {"resource_id": fid, "ttl": 120})
        response = await http.post(
            f"{live.url}/tp/v1/resource/mount",
            content=json.dumps(request),
            headers={**TP_JSON, "tp-version": "1.0.0", "tp-contract-ref": "contract-7"},
        )
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/tp+json"
        reply = response.json()
        assert response.headers["tp-message-id"] == reply["message_id"] != request["message_id"]
        assert reply["message_type"] == "resource_mount" and reply["in_reply_to"] == request["message_id"]
        assert reply["receiver"] == "fay:agent-a" and reply["protocol_contract_ref"] == "contract-7"
        assert reply["trace_info"] == {
            "original_protocol": "rest_api",
            "original_message_id": reply["message_id"],
            "hop_count": 0,
        }
        resource = reply["payload"]["resource"]
        assert reply["payload"]["status"] == "mounted" and resource["checksum"] == stored["checksum"]
        url = resource["url"]
        assert (await http.get(url)).content == data

        unmount = envelope("resource_unmount", {"resource_id": fid})
        response = await http.post(f"{live.url}/tp/v1/resource/unmount", json=unmount, headers=TP_JSON)
        assert response.status_code == 200 and response.json()["payload"]["status"] == "unmounted"
        assert (await http.get(url)).status_code in (403, 404)  # its URLs stop working
        again = await http.post(f"{live.url}/tp/v1/resource/unmount", json=unmount, headers=TP_JSON)
        assert again.status_code == 404 and again.json()["code"] == "not_found"


async def test_mount_inline_resource_and_upload_session(tp_server: LiveServer) -> None:
    live = tp_server
    data = b"inline bytes for a mount"
    resource = {
        "type": "inline",
        "content_type": "text/plain",
        "encoding": "base64",
        "data": base64.b64encode(data).decode(),
        "name": "note.txt",
        "size": len(data),
        "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
    }
    async with httpx.AsyncClient() as http:
        doc = envelope("resource_mount", {"resource": resource})
        response = await http.post(f"{live.url}/tp/v1", json=doc, headers=native_headers(doc))
        assert response.status_code == 200, response.text
        mounted = response.json()["payload"]
        assert mounted["resource_id"].startswith("f_") and base64.b64decode(mounted["resource"]["data"]) == data

        bad = {**resource, "checksum": "sha256:" + "0" * 64}
        doc = envelope("resource_mount", {"resource": bad})
        response = await http.post(f"{live.url}/tp/v1", json=doc, headers=native_headers(doc))
        assert response.status_code == 422 and response.json()["code"] == "checksum_mismatch"

        spec = {"name": "big.bin", "size": 300_000, "chunk_size": 100_000}
        response = await http.post(
            f"{live.url}/tp/v1/resource/mount", json=envelope("resource_mount", {"upload": spec}), headers=TP_JSON
        )
        opened = response.json()["payload"]
        assert opened["status"] == "open" and opened["resource"]["type"] == "streaming"
        assert opened["upload"]["total_chunks"] == 3


async def test_mount_of_a_foreign_url_is_an_ssrf_guarded_import(tp_server: LiveServer) -> None:
    live = tp_server
    async with httpx.AsyncClient() as http:
        stored = await upload(http, live, os.urandom(5000))
        foreign = {**stored}
        foreign["metadata"] = {}  # not recognisably ours: the service would have to fetch it
        # not signed either (a signed URL of ours would be read in-process, as MCP resolve and A2A parts do)
        foreign["url"] = stored["url"].split("?")[0]
        request = envelope("resource_mount", {"resource": foreign})
        response = await http.post(f"{live.url}/tp/v1/resource/mount", json=request, headers=TP_JSON)
        assert response.status_code == 202
        job_id = response.json()["correlation_id"]
        for _ in range(100):
            state = (await http.get(f"{live.url}/v1/jobs/{job_id}")).json()
            if state["state"] != "running":
                break
            await asyncio.sleep(0.05)
        assert state["state"] == "failed" and state["error"]["code"] == "destination_refused"
        # the sender learns it from its mailbox (long poll)
        polled = await http.get(f"{live.url}/tp/v1/messages", params={"receiver": "fay:agent-a", "wait": 5})
        messages = polled.json()["messages"]
        assert len(messages) == 1 and messages[0]["payload"]["event"] == "failed"
        assert messages[0]["payload"]["error"]["code"] == "destination_refused"


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "code"),
    [
        ("/tp/v1/resource/mount", b"{}", {"content-type": "text/plain"}, 415, "unsupported_media_type"),
        ("/tp/v1/resource/mount", b"{not json", TP_JSON, 400, "invalid_envelope"),
        ("/tp/v1/resource/mount", b"[]", TP_JSON, 400, "invalid_envelope"),
        ("/tp/v1/resource/mount", b"x" * (70 << 10), TP_JSON, 413, "payload_too_large"),
        ("/tp/v1/goal/propose", b"{}", TP_JSON, 501, "unsupported_message_type"),
        ("/tp/v1/goal/g1/accept", b"{}", TP_JSON, 501, "unsupported_message_type"),
        ("/tp/v1/nothing/here", b"{}", TP_JSON, 404, "not_found"),
    ],
)
async def test_rest_errors_are_tperrors(
    tp_server: LiveServer, path: str, body: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.post(f"{tp_server.url}{path}", content=body, headers=headers)
    assert response.status_code == status
    error = response.json()
    assert error["code"] == code and error["status"] == status and isinstance(error["retryable"], bool)


async def test_rest_envelope_checks(tp_server: LiveServer) -> None:
    url = f"{tp_server.url}/tp/v1/resource/mount"
    async with httpx.AsyncClient() as http:
        doc = envelope("resource_notify", {"resource_id": "x"})
        response = await http.post(url, json=doc, headers=TP_JSON)
        assert response.status_code == 400 and response.json()["related_message_id"] == doc["message_id"]
        doc = envelope("resource_mount", {"resource_id": "f_x"})
        response = await http.post(url, json=doc, headers={**TP_JSON, "tp-version": "2.0"})
        assert response.status_code == 400 and response.json()["code"] == "TP-TRA020"
        response = await http.post(url, json=doc, headers={**TP_JSON, "tp-contract-ref": "other"})
        assert response.status_code == 400 and "TP-Contract-Ref" in response.json()["message"]
        trace = {"original_protocol": "a2a_jsonrpc", "original_message_id": "m0", "hop_count": 6}
        response = await http.post(url, json={**doc, "trace_info": trace}, headers=TP_JSON)
        assert response.status_code == 400 and response.json()["code"] == "TP-TRA001"
        response = await http.post(url, json=envelope("resource_mount", {}), headers=TP_JSON)
        assert response.status_code == 400 and response.json()["code"] == "invalid_envelope"


async def test_keys_and_scopes_on_tp(tmp_path: Path) -> None:
    uploader, admin = new_token(), new_token()
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys={
            "u": {"sha256": token_hash(uploader), "scopes": ["upload", "read"]},
            "a": {"sha256": token_hash(admin), "scopes": ["admin"]},
        },
    )
    with running(settings) as live:
        async with httpx.AsyncClient() as http:
            unmount = envelope("resource_unmount", {"resource_id": "f_" + "1" * 32})
            response = await http.post(f"{live.url}/tp/v1/resource/unmount", json=unmount, headers=TP_JSON)
            assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
            auth = {**TP_JSON, "authorization": f"Bearer {uploader}"}
            response = await http.post(f"{live.url}/tp/v1/resource/unmount", json=unmount, headers=auth)
            assert response.status_code == 403 and response.json()["code"] == "insufficient_scope"
            auth = {**TP_JSON, "authorization": f"Bearer {admin}"}
            response = await http.post(f"{live.url}/tp/v1/resource/unmount", json=unmount, headers=auth)
            assert response.status_code == 404  # allowed, and there is no such file
            rpc = {"jsonrpc": "2.0", "id": 1, "method": "tp.resource.unmount", "params": {"tp_envelope": unmount}}
            response = await http.post(f"{live.url}/a2a", json=rpc)
            assert response.status_code == 401 and response.json()["error"]["data"]["code"] == "unauthenticated"
            try:
                async with connect(f"{live.url.replace('http', 'ws')}/tp/v1", subprotocols=["tp.v1"]):  # type: ignore[list-item]
                    raise AssertionError("accepted without a key")
            except InvalidStatus as exc:
                assert exc.response.status_code == 401


async def test_jsonrpc_single_batch_and_errors(tp_server: LiveServer) -> None:
    live = tp_server
    async with httpx.AsyncClient() as http:
        stored = await upload(http, live, os.urandom(3000))
        fid = stored["metadata"]["file_id"]
        mount = envelope("resource_mount", {"resource_id": fid})
        call = {"jsonrpc": "2.0", "id": "c1", "method": "tp.resource.mount", "params": {"tp_envelope": mount}}
        response = await http.post(f"{live.url}/a2a", json=call)
        assert response.status_code == 200
        result = response.json()
        assert result["id"] == "c1" and result["result"]["tp_envelope"]["payload"]["resource_id"] == fid
        assert result["result"]["tp_envelope"]["trace_info"]["original_protocol"] == "a2a_jsonrpc"

        batch = [
            call,
            {"jsonrpc": "2.0", "id": 2, "method": "tp.goal.propose", "params": {"tp_envelope": mount}},
            {"jsonrpc": "2.0", "id": 3, "method": "tp.resource.mount", "params": {}},
            {"jsonrpc": "2.0", "id": 4, "method": "tp.resource.unmount", "params": {"tp_envelope": mount}},
            {
                "jsonrpc": "2.0",
                "method": "tp.resource.notify",
                "params": {"tp_envelope": envelope("resource_notify", {"resource_id": fid})},
            },
            {"jsonrpc": "1.0", "id": 6, "method": "tp.resource.mount"},
            7,
            {
                "jsonrpc": "2.0",
                "id": 8,
                "method": "tp.resource.mount",
                "params": {"tp_envelope": {**mount, "tp_version": "9.0"}},
            },
        ]
        response = await http.post(f"{live.url}/a2a", json=batch)
        answers = {a["id"]: a for a in response.json() if a["id"] is not None}
        nulls = [a for a in response.json() if a["id"] is None]
        assert "result" in answers["c1"]
        assert answers[2]["error"]["code"] == -32601
        assert answers[3]["error"]["code"] == -32602
        assert answers[4]["error"]["code"] == -32602  # method says unmount, envelope says mount
        assert answers[6]["error"]["code"] == -32600
        assert answers[8]["error"]["code"] == -32602 and answers[8]["error"]["data"]["code"] == "TP-TRA020"
        assert len(nulls) == 1 and nulls[0]["error"]["code"] == -32600  # the bare 7
        assert len(response.json()) == 7  # the notification got no answer

        for body, code in ((b"{oops", -32700), (b"[]", -32600), (b'"x"', -32600)):
            response = await http.post(f"{live.url}/a2a", content=body, headers={"content-type": "application/json"})
            assert response.status_code == 200 and response.json()["error"]["code"] == code
            assert response.json()["id"] is None
        only_notification = {
            "jsonrpc": "2.0",
            "method": "tp.resource.notify",
            "params": {"tp_envelope": envelope("resource_notify", {"resource_id": fid})},
        }
        response = await http.post(f"{live.url}/a2a", json=only_notification)
        assert response.status_code == 204 and response.content == b""


async def test_bridged_envelope_bytes_pass_unaltered(tp_server: LiveServer) -> None:
    """A notify sent over JSON-RPC reaches a WebSocket subscriber with every byte kept but trace_info."""
    live = tp_server
    # odd spacing, key order, escapes and a signature: a re-serialising bridge would change all of them
    original = (
        '{ "payload" : {"resource_id":"f_watched", "event":"progress", "note":"caf\\u00e9 \\ud83d\\ude80"},\n'
        '  "signature": {"alg":"ed25519","value":"AAAA"}, "message_type":"resource_notify",\n'
        f'  "message_id":"{uuid.uuid4()}", "tp_version":"1.0.0", "sender":"fay:a", "extra":[1.50, 2e3] }}'
    )
    ws_url = live.url.replace("http", "ws") + "/tp/v1"
    async with connect(ws_url, subprotocols=["tp.v1"]) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps(envelope("resource_notify", {"subscribe": ["f_watched"]}, sender="fay:watcher")))
        ack = json.loads(await ws.recv())
        assert ack["payload"]["status"] == "subscribed"
        body = '{"jsonrpc":"2.0","id":1,"method":"tp.resource.notify","params":{"tp_envelope":' + original + "}}"
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{live.url}/a2a", content=body, headers={"content-type": "application/json"})
            assert response.json()["result"] == {"correlation_id": json.loads(original)["message_id"]}
        relayed = await asyncio.wait_for(ws.recv(), 5)
    assert isinstance(relayed, str)
    assert json.loads(relayed)["trace_info"] == {
        "original_protocol": "a2a_jsonrpc",
        "original_message_id": json.loads(original)["message_id"],
        "hop_count": 1,
    }
    assert relayed.startswith(original.rstrip()[:-1])  # appended trace_info is the only change


async def test_websocket_mount_errors_and_session_progress(tp_server: LiveServer) -> None:
    live = tp_server
    ws_url = live.url.replace("http", "ws") + "/tp/v1"
    async with httpx.AsyncClient() as http:
        stored = await upload(http, live, os.urandom(2000))
        async with connect(ws_url, subprotocols=["tp.v1"]) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == "tp.v1"
            assert "permessage-deflate" in ws.response.headers.get("sec-websocket-extensions", "")
            request = envelope("resource_mount", {"resource_id": stored["metadata"]["file_id"]})
            await ws.send(json.dumps(request))
            reply = json.loads(await ws.recv())
            assert reply["in_reply_to"] == request["message_id"] and reply["payload"]["status"] == "mounted"
            assert reply["trace_info"]["original_protocol"] == "native_tp"

            await ws.send("{not json")  # a bad frame gets an error envelope; the connection stays
            error = json.loads(await ws.recv())
            assert error["message_type"] == "error" and error["payload"]["error"]["code"] == "invalid_envelope"
            await ws.send(json.dumps(envelope("goal_propose", {})))
            error = json.loads(await ws.recv())
            assert error["payload"]["error"]["code"] == "unsupported_message_type"

            # a session, followed live: resource_notify progress as chunks arrive, then the result
            payload = os.urandom(300_000)
            created = (
                await http.post(
                    f"{live.url}/v1/sessions", json={"name": "s.bin", "size": len(payload), "chunk_size": 100_000}
                )
            ).json()
            sid = created["streaming_session_id"]
            await ws.send(json.dumps(envelope("resource_notify", {"subscribe": [sid]})))
            assert json.loads(await ws.recv())["payload"]["status"] == "subscribed"
            for index in range(3):
                part = payload[index * 100_000 : (index + 1) * 100_000]
                headers = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(part)}
                put = await http.put(f"{live.url}/v1/sessions/{sid}/chunks/{index}", content=part, headers=headers)
                assert put.status_code == 201
            await http.post(f"{live.url}/v1/sessions/{sid}/complete", json={})
            events = []
            while not events or events[-1] != "done":
                note = json.loads(await asyncio.wait_for(ws.recv(), 10))
                assert note["message_type"] == "resource_notify" and note["payload"]["resource_id"] == sid
                events.append(note["payload"]["event"])
                if note["payload"]["event"] == "result":
                    assert note["payload"]["descriptor"]["checksum"] == "sha256:" + hashlib.sha256(payload).hexdigest()
            assert events[0] == "start" and "progress" in events and events[-3:] == ["result", "end", "done"]

        # a binary frame is not TP: closed with 1008 and a TPError as the reason
        async with connect(ws_url, subprotocols=["tp.v1"]) as ws:  # type: ignore[list-item]
            await ws.send(b"\x00\x01")
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            assert json.loads(closed.value.rcvd.reason)["code"] == "invalid_envelope"

        # larger than the envelope limit: 1009 (message too big)
        async with connect(ws_url, subprotocols=["tp.v1"], max_size=None) as ws:  # type: ignore[list-item]
            await ws.send("x" * (70 << 10))
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009

        # without the tp.v1 subprotocol the handshake is refused with a TPError
        with pytest.raises(InvalidStatus) as refused:
            async with connect(ws_url):
                pass
        assert refused.value.response.status_code == 400


def _raw_handshake(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /tp/v1 HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: tp.v1\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101")
    return sock


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    def exact(n: int) -> bytes:
        out = b""
        while len(out) < n:
            piece = sock.recv(n - len(out))
            if not piece:
                raise ConnectionError("closed")
            out += piece
        return out

    first, second = exact(2)
    length = second & 0x7F
    if length == 126:
        length = struct.unpack("!H", exact(2))[0]
    elif length == 127:
        length = struct.unpack("!Q", exact(8))[0]
    return first & 0x0F, exact(length)


def test_two_missed_pongs_close_with_1008_and_tperror(tp_server: LiveServer) -> None:
    sock = _raw_handshake(tp_server.url)
    pings = 0
    try:
        while True:
            opcode, payload = _read_frame(sock)
            if opcode == 0x9:
                pings += 1  # and never answered
                continue
            assert opcode == 0x8
            code = struct.unpack("!H", payload[:2])[0]
            reason = json.loads(payload[2:])
            break
    finally:
        sock.close()
    assert pings == 2 and code == 1008 and reason["code"] == "TP-TRA010"


def test_answered_pings_keep_the_connection(tp_server: LiveServer) -> None:
    sock = _raw_handshake(tp_server.url)
    try:
        for _ in range(4):  # four intervals: well past two timeouts
            opcode, payload = _read_frame(sock)
            assert opcode == 0x9
            mask = os.urandom(4)
            masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            sock.sendall(bytes([0x8A, 0x80 | len(payload)]) + mask + masked)  # the pong
    finally:
        sock.close()


async def test_prompt_embedding_binding(tp_server: LiveServer) -> None:
    live = tp_server
    async with httpx.AsyncClient() as http:
        stored = await upload(http, live, os.urandom(3000))
        request = envelope("resource_mount", {"resource_id": stored["metadata"]["file_id"]})
        text = "Hello! Please mount this.\n\n```tp-envelope\n" + json.dumps(request, indent=2) + "\n```\n"
        response = await http.post(f"{live.url}/tp/v1/prompt", content=text, headers={"content-type": "text/plain"})
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        block = response.text.split("```tp-envelope\n", 1)[1].split("\n```", 1)[0]
        reply = json.loads(block)
        assert reply["in_reply_to"] == request["message_id"]
        assert reply["trace_info"]["original_protocol"] == "prompt_embedding"
        response = await http.post(
            f"{live.url}/tp/v1/prompt", content="no block here", headers={"content-type": "text/plain"}
        )
        assert response.status_code == 422 and response.json()["code"] == "TP-TRA030"
        secret = envelope("resource_mount", {"resource": {"name": "x", "requires_encryption": True}})
        text = "```tp-envelope\n" + json.dumps(secret) + "\n```"
        response = await http.post(f"{live.url}/tp/v1/prompt", content=text, headers={"content-type": "text/plain"})
        assert response.status_code == 403 and response.json()["code"] == "TP-TRA031"


async def test_relay_failure_is_tp_tra002(tp_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mailbox that cannot be written (a storage outage we cannot cause for real here): the bridge says so."""
    from transfer.errors import StorageUnavailable

    async def broken(receiver: Any, raw: bytes, *, payer: str | None) -> None:
        raise StorageUnavailable("storage backend failed: injected")

    monkeypatch.setattr(tp_server.app.state.services.tp, "deliver", broken)
    async with httpx.AsyncClient() as http:
        note = envelope("resource_notify", {"resource_id": "f_x", "event": "available"})
        response = await http.post(f"{tp_server.url}/tp/v1/resource/notify", json=note, headers=TP_JSON)
    assert response.status_code == 502
    body = response.json()
    assert (
        body["code"] == "TP-TRA002" and body["retryable"] is True and body["detail"]["cause"] == "storage_unavailable"
    )


async def test_mailboxes_are_read_only_by_their_identities(tmp_path: Path) -> None:
    alice, bob, admin = new_token(), new_token(), new_token()
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys={
            "alice": {"sha256": token_hash(alice), "scopes": ["upload", "read"], "tp_identities": ["fay:alice"]},
            "bob": {"sha256": token_hash(bob), "scopes": ["upload", "read"], "tp_identities": ["fay:bob"]},
            "ops": {"sha256": token_hash(admin), "scopes": ["admin"]},
        },
    )
    with running(settings) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            note = envelope("resource_notify", {"event": "hello"}, sender="fay:bob", receiver="fay:alice")
            sent = await http.post(
                "/tp/v1/resource/notify", json=note, headers={**TP_JSON, "authorization": f"Bearer {bob}"}
            )
            assert sent.status_code == 202
            snoop = await http.get(
                "/tp/v1/messages", params={"receiver": "fay:alice"}, headers={"authorization": f"Bearer {bob}"}
            )
            assert snoop.status_code == 403 and snoop.json()["code"] == "forbidden"
            mine = await http.get(
                "/tp/v1/messages", params={"receiver": "fay:alice"}, headers={"authorization": f"Bearer {alice}"}
            )
            assert [m["message_id"] for m in mine.json()["messages"]] == [note["message_id"]]
            ops = await http.get(
                "/tp/v1/messages", params={"receiver": "fay:bob"}, headers={"authorization": f"Bearer {admin}"}
            )
            assert ops.status_code == 200 and ops.json() == {"messages": []}


async def test_a_mailbox_is_bounded_and_swept(tmp_path: Path) -> None:
    """A receiver that never polls holds TRANSFER_TP_MAILBOX_MAX_MESSAGES messages at most (the next is 429
    mailbox_full), and each for its lifetime only: the sweep removes them whether or not anyone polls."""
    from tests.conftest import Clock, serving
    from transfer.hosts import create_app

    clock = Clock()
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        tp_mailbox_max_messages=3,
        tp_mailbox_ttl=600,
        session_gc_interval=3600,
    )
    with serving(create_app(settings, clock=clock), settings) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:

            async def notify(receiver: str) -> httpx.Response:
                note = envelope("resource_notify", {"event": "hello"}, receiver=receiver)
                return await http.post("/tp/v1/resource/notify", json=note, headers=TP_JSON)

            assert [(await notify("fay:idle")).status_code for _ in range(3)] == [202] * 3
            full = await notify("fay:idle")
            assert full.status_code == 429, full.text
            assert "mailbox_full" in full.text
            assert (await notify("fay:other")).status_code == 202  # another receiver has a mailbox of its own
            clock.advance(601)  # past their lifetime: they no longer count, and the sweep removes them
            assert (await notify("fay:idle")).status_code == 202
            swept = await live.app.state.services.tp.sweep_mailboxes()
            assert swept == 4
            box = [name for name in live.objects() if name.startswith("tp/mailbox/")]
            assert len(box) == 1
            polled = await http.get("/tp/v1/messages", params={"receiver": "fay:idle"})
            assert len(polled.json()["messages"]) == 1


async def test_one_connection_follows_a_bounded_number_of_ids(tmp_path: Path) -> None:
    """MAX_SUBSCRIBE bounds one message; the connection as a whole follows at most tp_max_subscriptions ids (60,000
    once took 480 MiB of RSS): naming the same ids again costs nothing, one id more closes it with 1008 and a
    TPError that names the limit."""
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, tp_max_subscriptions=5)
    with running(settings) as live:
        ws_url = live.url.replace("http", "ws") + "/tp/v1"
        async with connect(ws_url, subprotocols=["tp.v1"]) as ws:  # type: ignore[list-item]
            ids = [f"relay-{n}" for n in range(5)]
            for _ in range(3):
                await ws.send(json.dumps(envelope("resource_notify", {"subscribe": ids})))
                ack = json.loads(await asyncio.wait_for(ws.recv(), 5))
                assert ack["payload"]["status"] == "subscribed" and ack["payload"]["subscribe"] == ids
            await ws.send(json.dumps(envelope("resource_notify", {"subscribe": ["relay-5"]})))
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        reason = json.loads(closed.value.rcvd.reason)
        assert reason["code"] == "too_many_subscriptions" and "5" in reason["message"]
        services = live.app.state.services
        assert not any(topic.startswith("resource:relay-") for topic in services.tp._topics)  # all let go


async def test_a_shutdown_that_meets_a_connection_its_peer_is_closing_goes_on(tp_server: LiveServer) -> None:
    """The server shuts down (SIGTERM: close 1012 to every WebSocket) just as a client's close frame has been
    answered and the connection is closing: that connection is closed, not sent a second close frame. uvicorn's
    own shutdown raised ``InvalidState`` there, which ended the whole shutdown (seen once under load, as the
    teardown of a wss test). The order is forced on the server's loop: the client's close frame is fed to the
    connection and its shutdown called in the same step, before the transport has finished closing."""
    from websockets.frames import Close, Frame, Opcode

    from transfer.api.protocol.server import TPWebSocketProtocol

    assert tp_server.server is not None
    sock = _raw_handshake(tp_server.url)
    close = Frame(Opcode.CLOSE, Close(1000, "bye").serialize()).serialize(mask=True, extensions=[])

    async def close_then_shut_down() -> list[str]:
        assert tp_server.server is not None
        protocols = [c for c in tp_server.server.server_state.connections if isinstance(c, TPWebSocketProtocol)]
        states = []
        for protocol in protocols:
            protocol.data_received(close)  # the peer's close: answered, the transport closing
            protocol.shutdown()
            states.append(protocol.conn.state.name)
        return states

    try:
        assert await tp_server.call(close_then_shut_down()) == ["CLOSING"]
        sock.settimeout(30)
        opcode, payload = _read_frame(sock)  # the answer to the close, then the end of the connection
        assert opcode == 0x8 and struct.unpack("!H", payload[:2])[0] == 1000
        assert sock.recv(1) == b""
    finally:
        sock.close()
