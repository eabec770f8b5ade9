"""Keys own what they create: another non-admin key gets 404 for every upload, session, file, bundle, import and
TP mount of someone else (whether it exists is not revealed), admin may act on all, listings show a key its own
files, and signed URLs stay bearer capabilities for exactly what they sign."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash
from mcp.client import Client

from tests.agents.test_bindings_tp import TP_JSON, envelope
from tests.agents.test_mcp import _bearer, structured, tool_error
from tests.conftest import LiveServer, running
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

TOKENS = {name: new_token() for name in ("alice", "bob", "reader", "admin")}
SCOPES = {"alice": ["upload", "read"], "bob": ["upload", "read"], "reader": ["read"], "admin": ["admin"]}
IDENTITIES = {"alice": ["fay:alice"], "bob": ["fay:bob"]}
TUS = {"tus-resumable": "1.0.0"}
pytestmark = pytest.mark.anyio


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


@pytest.fixture
def tenants(tmp_path: Path) -> Iterator[LiveServer]:
    root = tmp_path / "root"
    root.mkdir()
    keys = {
        name: {"sha256": token_hash(TOKENS[name]), "scopes": SCOPES[name], "tp_identities": IDENTITIES.get(name, [])}
        for name in TOKENS
    }
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys=keys,
        inline_threshold=1024,
        session_chunk_size=64 << 10,
        mcp_root=root,
    )
    with running(settings) as live:
        yield live


def assert_not_found(response: httpx.Response) -> None:
    assert response.status_code == 404, (response.status_code, response.text)
    if response.content:  # HEAD has no body
        assert response.json()["error"]["code"] == "not_found"


def test_tus_uploads_belong_to_their_key(tenants: LiveServer) -> None:
    data = os.urandom(200_000)
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        created = http.post("/tus/files", headers={**TUS, **key("alice"), "upload-length": str(len(data))})
        assert created.status_code == 201
        url = created.headers["location"]
        patch = {**TUS, "content-type": "application/offset+octet-stream", "upload-offset": "0"}
        # bob can neither see, extend, nor end alice's upload, and learns nothing about whether it exists
        assert_not_found(http.head(url, headers={**TUS, **key("bob")}))
        assert_not_found(http.patch(url, content=data[:1000], headers={**patch, **key("bob")}))
        assert_not_found(http.delete(url, headers={**TUS, **key("bob")}))
        unknown = url[: -len("0" * 8)] + "0" * 8
        assert_not_found(http.head(unknown, headers={**TUS, **key("bob")}))
        # alice's upload is untouched by all that: offset 0, and it completes with her bytes
        head = http.head(url, headers={**TUS, **key("alice")})
        assert head.status_code == 200 and head.headers["upload-offset"] == "0"
        done = http.patch(url, content=data, headers={**patch, **key("alice")})
        assert done.status_code == 204 and done.headers["upload-offset"] == str(len(data))
        file_id = done.headers["upload-file-id"]
        assert_not_found(http.get(url, headers=key("bob")))  # the finished upload's descriptor
        assert_not_found(http.get(f"/v1/files/{file_id}", headers=key("bob")))
        descriptor = http.get(f"/v1/files/{file_id}", headers=key("alice")).json()
        assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
        assert http.head(url, headers={**TUS, **key("admin")}).status_code == 200  # admin acts on all


def test_tus_concatenation_takes_only_the_callers_partials(tenants: LiveServer) -> None:
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        partial = http.post(
            "/tus/files",
            headers={**TUS, **key("alice"), "upload-length": "3", "upload-concat": "partial"},
        )
        url = partial.headers["location"]
        http.patch(
            url,
            content=b"abc",
            headers={**TUS, **key("alice"), "content-type": "application/offset+octet-stream", "upload-offset": "0"},
        )
        stolen = http.post("/tus/files", headers={**TUS, **key("bob"), "upload-concat": f"final;{url}"})
        assert_not_found(stolen)
        mine = http.post("/tus/files", headers={**TUS, **key("alice"), "upload-concat": f"final;{url}"})
        assert mine.status_code == 201 and "upload-file-id" in mine.headers


def _put_chunk(http: httpx.Client, sid: str, index: int, data: bytes, who: str) -> httpx.Response:
    headers = {**key(who), "chunk-checksum": f"xxh3-128:{xxhash.xxh3_128_hexdigest(data)}"}
    return http.put(f"/v1/sessions/{sid}/chunks/{index}", content=data, headers=headers)


def test_sessions_belong_to_their_key(tenants: LiveServer) -> None:
    chunk = 64 << 10
    data = os.urandom(chunk * 2)
    checksum = "sha256:" + hashlib.sha256(data).hexdigest()
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        doc = http.post(
            "/v1/sessions",
            json={"name": "a.bin", "size": len(data), "chunk_size": chunk, "checksum": checksum},
            headers=key("alice"),
        ).json()
        sid = doc["streaming_session_id"]
        # the attack of the issue: bob writes chunk 0 first, so that alice's own chunk 0 would conflict
        assert_not_found(_put_chunk(http, sid, 0, os.urandom(chunk), "bob"))
        assert_not_found(http.get(f"/v1/sessions/{sid}", headers=key("bob")))
        assert_not_found(http.get(f"/v1/sessions/{sid}/descriptor", headers=key("bob")))
        assert_not_found(http.post(f"/v1/sessions/{sid}/complete", json={}, headers=key("bob")))
        assert_not_found(http.delete(f"/v1/sessions/{sid}", headers=key("bob")))
        assert _put_chunk(http, sid, 0, data[:chunk], "alice").status_code == 201
        assert _put_chunk(http, sid, 1, data[chunk:], "alice").status_code == 201
        status = http.get(f"/v1/sessions/{sid}", headers=key("admin")).json()  # admin sees every session
        assert status["stored_count"] == 2
        done = http.post(f"/v1/sessions/{sid}/complete", json={}, headers=key("alice")).json()
        assert done["checksum"] == checksum
        assert http.get(done["url"]).content == data  # the signed URL needs no key: a bearer capability
        assert_not_found(http.get(f"/v1/files/{done['metadata']['file_id']}", headers=key("bob")))


def test_files_listing_and_bundles_are_per_key(tenants: LiveServer) -> None:
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        a = http.post("/v1/files?name=a.txt", content=b"alice's", headers=key("alice")).json()
        b = http.post("/v1/files?name=b.txt", content=b"bob's", headers=key("bob")).json()
        a_id, b_id = a["metadata"]["file_id"], b["metadata"]["file_id"]

        def listed(who: str) -> set[str]:
            response = http.get("/v1/files", headers=key(who))
            assert response.status_code == 200
            return {d["metadata"]["file_id"] for d in response.json()["files"]}

        assert listed("alice") == {a_id}
        assert listed("bob") == {b_id}
        assert listed("admin") == {a_id, b_id}
        assert listed("reader") == set()  # a key that stored nothing sees nothing
        assert_not_found(http.get(f"/v1/files/{a_id}", headers=key("bob")))
        # a bundle cannot take in someone else's file, nor be read by another key
        item = {"role": "main", "file_id": a_id}
        assert_not_found(http.post("/v1/bundles", json={"items": [item]}, headers=key("bob")))
        bundle = http.post("/v1/bundles", json={"items": [item]}, headers=key("alice"))
        assert bundle.status_code == 201
        bundle_id = bundle.json()["id"]
        assert_not_found(http.get(f"/v1/bundles/{bundle_id}", headers=key("bob")))
        assert http.get(f"/v1/bundles/{bundle_id}", headers=key("alice")).status_code == 200
        assert http.get(f"/v1/bundles/{bundle_id}", headers=key("admin")).status_code == 200
        assert_not_found(http.delete(f"/v1/files/{'f_' + '0' * 32}", headers=key("admin")))
        assert http.delete(f"/v1/files/{a_id}", headers=key("admin")).status_code == 204


def test_tp_mount_needs_ownership_and_senders_are_the_keys_identities(tenants: LiveServer) -> None:
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        a = http.post("/v1/files?name=a.bin", content=os.urandom(4096), headers=key("alice")).json()
        a_id = a["metadata"]["file_id"]
        as_bob = envelope("resource_mount", {"resource_id": a_id}, sender="fay:bob")
        response = http.post("/tp/v1/resource/mount", json=as_bob, headers={**TP_JSON, **key("bob")})
        assert response.status_code == 404 and response.json()["code"] == "not_found"
        # bob cannot speak as alice either
        as_alice = envelope("resource_mount", {"resource_id": a_id}, sender="fay:alice")
        response = http.post("/tp/v1/resource/mount", json=as_alice, headers={**TP_JSON, **key("bob")})
        assert response.status_code == 403 and response.json()["code"] == "forbidden"
        response = http.post("/tp/v1/resource/mount", json=as_alice, headers={**TP_JSON, **key("alice")})
        assert response.status_code == 200, response.text
        mounted = json.loads(response.content)["payload"]["resource"]
        assert mounted["metadata"]["file_id"] == a_id
        # an inline resource mounted by bob becomes bob's file, not visible to alice
        inline = {
            "type": "inline",
            "name": "n.txt",
            "content_type": "text/plain",
            "encoding": "base64",
            "data": base64.b64encode(b"hello").decode(),
            "size": 5,
            "checksum": "sha256:" + hashlib.sha256(b"hello").hexdigest(),
        }
        mount = envelope("resource_mount", {"resource": inline}, sender="fay:bob")
        response = http.post("/tp/v1/resource/mount", json=mount, headers={**TP_JSON, **key("bob")})
        assert response.status_code == 200, response.text
        bobs = json.loads(response.content)["payload"]["resource_id"]
        assert_not_found(http.get(f"/v1/files/{bobs}", headers=key("alice")))


async def test_mcp_resolve_writes_only_with_upload_scope_and_never_replaces(
    tenants: LiveServer, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    (root / "existing.txt").write_bytes(b"keep me")
    (root / "out").mkdir()
    (root / "out" / "n.txt").write_bytes(b"keep me too")
    data = b"resolved bytes"
    inline: dict[str, Any] = {
        "type": "inline",
        "name": "n.txt",
        "content_type": "text/plain",
        "encoding": "base64",
        "data": base64.b64encode(data).decode(),
        "size": len(data),
        "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
    }
    bundle = {
        "id": "b_1",
        "created_at": "2026-11-30T00:00:00Z",
        "items": [{"id": "one", "role": "main", "content": inline}],
    }
    async with Client(_bearer(f"{tenants.url}/mcp", TOKENS["reader"])) as client:
        denied = tool_error(await client.call_tool("resolve", {"descriptor": inline, "path": "new.txt"}))
        assert denied["code"] == "insufficient_scope"
        small = structured(await client.call_tool("resolve", {"descriptor": inline}))  # no path: nothing written
        assert small["content"] == data.decode()
    assert not (root / "new.txt").exists()
    async with Client(_bearer(f"{tenants.url}/mcp", TOKENS["alice"])) as client:
        refused = tool_error(await client.call_tool("resolve", {"descriptor": inline, "path": "existing.txt"}))
        assert refused["code"] == "conflict"
        refused = tool_error(await client.call_tool("resolve", {"descriptor": bundle, "path": "out"}))
        assert refused["code"] == "conflict"
        assert (root / "existing.txt").read_bytes() == b"keep me"
        assert (root / "out" / "n.txt").read_bytes() == b"keep me too"
        replaced = structured(
            await client.call_tool("resolve", {"descriptor": inline, "path": "existing.txt", "overwrite": True})
        )
        assert replaced["size"] == len(data) and (root / "existing.txt").read_bytes() == data
        assert sorted(p.name for p in root.iterdir()) == ["existing.txt", "out"]  # no staging left behind
        # another key's file cannot be described over MCP either
        async with httpx.AsyncClient() as http:
            bob = await http.post(f"{tenants.url}/v1/files", content=b"bob", headers=key("bob"))
        hidden = tool_error(await client.call_tool("describe", {"file_id": bob.json()["metadata"]["file_id"]}))
        assert hidden["code"] == "not_found"


async def test_jobs_belong_to_their_key_and_cannot_be_squatted(tenants: LiveServer) -> None:
    from tests.agents.test_progress_sse import read_stream

    async with httpx.AsyncClient(base_url=tenants.url, timeout=30) as http:
        done = await http.post(
            "/v1/files", params={"name": "a.bin", "job_id": "alice-job-1"}, content=b"a" * 5000, headers=key("alice")
        )
        assert done.status_code == 201
        assert (await http.get("/v1/jobs/alice-job-1", headers=key("alice"))).json()["state"] == "completed"
        assert_not_found(await http.get("/v1/jobs/alice-job-1", headers=key("bob")))
        assert (await http.get("/v1/jobs/alice-job-1", headers=key("admin"))).status_code == 200
        # a session's job is its session's: bob cannot follow alice's session either
        doc = (await http.post("/v1/sessions", json={"name": "s", "size": 10}, headers=key("alice"))).json()
        sid = doc["streaming_session_id"]
        assert_not_found(await http.get(f"/v1/jobs/{sid}", headers=key("bob")))
        assert (await http.get(f"/v1/jobs/{sid}", headers=key("alice"))).status_code == 200

        # bob guesses the id of alice's next upload and opens its stream first: he is dropped when she starts,
        # never sees her events, and her upload goes through
        squatter = asyncio.create_task(read_stream(http, "/v1/jobs/alice-job-2/events", headers=key("bob")))
        for _ in range(100):
            if (await http.get("/v1/jobs/alice-job-2", headers=key("bob"))).status_code == 200:
                break
            await asyncio.sleep(0.05)
        upload = await http.post(
            "/v1/files", params={"name": "b.bin", "job_id": "alice-job-2"}, content=b"b" * 5000, headers=key("alice")
        )
        assert upload.status_code == 201
        events = await asyncio.wait_for(squatter, 20)
        assert [e[0] for e in events] == ["error"]
        assert events[0][2]["payload"]["code"] == "not_found"
        assert (await http.get("/v1/jobs/alice-job-2", headers=key("alice"))).json()["state"] == "completed"
        assert_not_found(await http.get("/v1/jobs/alice-job-2", headers=key("bob")))


async def test_websocket_subscriptions_to_another_keys_resources_are_refused(tenants: LiveServer) -> None:
    from websockets.asyncio.client import connect

    async with httpx.AsyncClient(base_url=tenants.url, timeout=30) as http:
        a = (await http.post("/v1/files?name=a.bin", content=b"a" * 3000, headers=key("alice"))).json()
        doc = (await http.post("/v1/sessions", json={"name": "s", "size": 10}, headers=key("alice"))).json()
    a_id, sid = a["metadata"]["file_id"], doc["streaming_session_id"]
    ws_url = f"{tenants.url.replace('http', 'ws')}/tp/v1"
    message = envelope("resource_notify", {"subscribe": [a_id, sid, "peer-channel-7"]}, sender="fay:bob")
    async with connect(ws_url, subprotocols=["tp.v1"], additional_headers=key("bob")) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps(message))
        frames = [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in range(3)]
    errors = [f for f in frames if f["message_type"] == "error"]
    assert [f["payload"]["error"]["code"] for f in errors] == ["not_found", "not_found"]
    (ack,) = [f for f in frames if f["message_type"] == "resource_notify"]
    assert ack["payload"]["subscribe"] == ["peer-channel-7"]  # a relay channel: anyone may listen
    message = envelope("resource_notify", {"subscribe": [a_id, sid]}, sender="fay:alice")
    async with connect(ws_url, subprotocols=["tp.v1"], additional_headers=key("alice")) as ws:  # type: ignore[list-item]
        await ws.send(json.dumps(message))
        ack = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert ack["payload"]["subscribe"] == [a_id, sid]
