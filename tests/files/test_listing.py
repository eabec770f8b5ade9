"""Paginated listing of stored files: GET /v1/files?limit=&cursor= (and the client, CLI and MCP tool) over the
per-key file index, on local storage and on the S3 test server. Each page comes from one listing of the caller's own
folder (the key's index, or ``files/`` for admin), so another key's files never appear and a page costs the page."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash
from mcp.client import Client

from tests.agents.test_mcp import _bearer, structured, tool_error
from tests.conftest import LiveServer, running
from tests.uploads.test_api_upload import assert_error
from transfer.cli import main as cli_main
from transfer.client.client import AsyncTransferClient
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

TOKENS = {name: new_token() for name in ("alice", "bob", "admin")}
SCOPES = {"alice": ["upload", "read"], "bob": ["upload", "read"], "admin": ["admin"]}
pytestmark = pytest.mark.anyio


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def tenants(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    extra: dict[str, Any] = {}
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        extra = {"storage": "s3"}
    keys = {name: {"sha256": token_hash(TOKENS[name]), "scopes": SCOPES[name]} for name in TOKENS}
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys=keys,
        inline_threshold=16,
        session_chunk_size=64 << 10,
        **extra,
    )
    with running(settings) as live:
        yield live


def upload(http: httpx.Client, who: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        r = http.post(f"/v1/files?name={who}-{i}.bin", content=os.urandom(40), headers=key(who))
        assert r.status_code == 201, r.text
        ids.append(r.json()["metadata"]["file_id"])
    return ids


def page_through(http: httpx.Client, who: str, limit: int) -> tuple[list[str], int]:
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        r = http.get("/v1/files", params=params, headers=key(who))
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["files"]) <= limit
        seen += [d["metadata"]["file_id"] for d in body["files"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return seen, pages


def test_paging_gives_each_of_the_keys_files_once_in_order(tenants: LiveServer) -> None:
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        alice = upload(http, "alice", 12)
        bob = upload(http, "bob", 5)
        for limit in (1, 5, 12, 1000):
            seen, pages = page_through(http, "alice", limit)
            assert seen == sorted(alice)  # each once, in file-id order, none of bob's
            assert pages == -(-len(alice) // limit)  # no empty last page: a page knows whether one follows
        assert page_through(http, "bob", 2)[0] == sorted(bob)
        assert page_through(http, "admin", 4)[0] == sorted(alice + bob)  # admin reads files/, all of them
        # the default page is 100, and the existing fields stay (url descriptors)
        body = http.get("/v1/files", headers=key("alice")).json()
        assert body["next_cursor"] is None and len(body["files"]) == 12
        assert all(d["type"] == "url" and d["url"] for d in body["files"])


def test_deleting_while_paging_is_safe(tenants: LiveServer) -> None:
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        ids = sorted(upload(http, "alice", 9))
        first = http.get("/v1/files", params={"limit": 3}, headers=key("alice")).json()
        assert [d["metadata"]["file_id"] for d in first["files"]] == ids[:3]
        # delete the cursor's own file and one of the next page (deleting takes the admin scope)
        for gone in (ids[2], ids[4]):
            assert http.delete(f"/v1/files/{gone}", headers=key("admin")).status_code == 204
        rest: list[str] = []
        cursor = first["next_cursor"]
        while cursor is not None:
            body = http.get("/v1/files", params={"limit": 3, "cursor": cursor}, headers=key("alice")).json()
            rest += [d["metadata"]["file_id"] for d in body["files"]]
            cursor = body["next_cursor"]
        assert rest == [i for i in ids[3:] if i != ids[4]]
        assert page_through(http, "alice", 100)[0] == [i for i in ids if i not in (ids[2], ids[4])]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"cursor": "not-a-cursor"}, "invalid_cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"f1:f_" + b"0" * 31).decode()}, "invalid_cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"x1:f_" + b"0" * 32).decode()}, "invalid_cursor"),
        ({"cursor": "%%%"}, "invalid_cursor"),
        ({"limit": "0"}, "invalid_request"),
        ({"limit": "1001"}, "invalid_request"),
        ({"limit": "-1"}, "invalid_request"),
        ({"limit": "1e3"}, "invalid_request"),
        ({"limit": "\u0661\u0660"}, "invalid_request"),  # Arabic-Indic digits are not DIGIT
        ({"limit": "9" * 19}, "invalid_request"),
    ],
)
def test_malformed_paging_parameters_are_400s(tenants: LiveServer, params: dict[str, str], code: str) -> None:
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        assert_error(http.get("/v1/files", params=params, headers=key("alice")), 400, code)


def test_every_publish_path_enters_the_owners_index(tenants: LiveServer) -> None:
    """REST upload, a chunked session's completion and a tus upload's completion all list for their key."""
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        [rest] = upload(http, "alice", 1)
        data = os.urandom(1000)
        opened = http.post("/v1/sessions", json={"name": "s.bin", "size": len(data)}, headers=key("alice"))
        assert opened.status_code == 201, opened.text
        sid = opened.json()["streaming_session_id"]
        digest = "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)
        r = http.put(f"/v1/sessions/{sid}/chunks/0", content=data, headers={**key("alice"), "chunk-checksum": digest})
        assert r.status_code == 201, r.text
        done = http.post(f"/v1/sessions/{sid}/complete", json={}, headers=key("alice"))
        assert done.status_code in (200, 201), done.text
        session_file = done.json()["metadata"]["file_id"]
        tus = {"tus-resumable": "1.0.0", **key("alice")}
        created = http.post("/tus/files/", headers={**tus, "upload-length": str(len(data))})
        assert created.status_code == 201, created.text
        patched = http.patch(
            created.headers["location"],
            content=data,
            headers={**tus, "upload-offset": "0", "content-type": "application/offset+octet-stream"},
        )
        assert patched.status_code == 204, patched.text
        listed = page_through(http, "alice", 2)[0]
        assert rest in listed and session_file in listed and len(listed) == 3
        assert page_through(http, "bob", 2)[0] == []


async def test_client_cli_and_mcp_page_the_same_way(
    tenants: LiveServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        ids = sorted(upload(http, "alice", 5))
        upload(http, "bob", 2)
    async with AsyncTransferClient(tenants.url, api_key=TOKENS["alice"]) as client:
        page = await client.list_files(limit=2)
        assert [d["metadata"]["file_id"] for d in page["files"]] == ids[:2]
        assert [d["metadata"]["file_id"] async for d in client.iter_files(limit=2)] == ids
    monkeypatch.setenv("TRANSFER_API_KEY", TOKENS["alice"])
    assert await _cli(["ls", "--server", tenants.url, "--limit", "2"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["metadata"]["file_id"] for line in out.splitlines()] == ids[:2]
    cursor = err.split("--cursor ")[1].strip()
    assert await _cli(["ls", "--server", tenants.url, "--cursor", cursor, "--all", "--limit", "2"]) == 0
    out, _ = capsys.readouterr()
    assert [json.loads(line)["metadata"]["file_id"] for line in out.splitlines()] == ids[2:]
    async with Client(_bearer(f"{tenants.url}/mcp", TOKENS["alice"])) as mcp:
        first = structured(await mcp.call_tool("list_files", {"limit": 3}))
        assert [d["metadata"]["file_id"] for d in first["files"]] == ids[:3]
        second = structured(await mcp.call_tool("list_files", {"limit": 3, "cursor": first["next_cursor"]}))
        assert [d["metadata"]["file_id"] for d in second["files"]] == ids[3:]
        assert second["next_cursor"] is None
        assert tool_error(await mcp.call_tool("list_files", {"cursor": "bogus"}))["code"] == "invalid_cursor"


async def _cli(argv: list[str]) -> int:
    import anyio.to_thread

    return await anyio.to_thread.run_sync(cli_main, argv)
