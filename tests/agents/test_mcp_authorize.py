"""MCP authorize_upload / confirm_upload / authorize_download (shaped after SEP-2631 files/authorizeUpload and
authorizeDownload) through the official SDK client: the bytes go by plain HTTP to expiring signed URLs, never inside
an MCP message; the SHA-256 of what comes back equals what went in; an expired authorisation is refused."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from mcp import Client

from storage.local import LocalStorage
from tests.agents.test_mcp import structured, tool_error
from tests.conftest import Clock, LiveServer, running
from transfer.core.auth import Grant, parse_keys
from transfer.errors import TooManyAuthorizations
from transfer.service.container import Services
from transfer.settings import Settings

pytestmark = pytest.mark.anyio

BIG = 200 << 20


@pytest.fixture
def live(tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})
    with running(settings, clock) as server:
        yield server


@pytest.fixture
def on_s3(tmp_path: Path, s3_env: dict[str, str]) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, storage="s3")
    with running(settings) as server:
        yield server


async def _pieces(seed: bytes, total: int, sha: Any) -> AsyncIterator[bytes]:
    block = hashlib.sha256(seed).digest() * (1 << 15)  # 1 MiB, not all the same byte
    sent = 0
    while sent < total:
        piece = block[: min(len(block), total - sent)]
        sha.update(piece)
        sent += len(piece)
        yield piece


async def test_authorize_put_200_mib_confirm_and_download(live: LiveServer) -> None:
    async with Client(f"{live.url}/mcp") as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert {"authorize_upload", "confirm_upload", "authorize_download"} <= tools
        plan = structured(
            await client.call_tool("authorize_upload", {"name": "big.bin", "max_size": BIG, "start_ttl": 600})
        )
        assert plan["upload"]["method"] == "PUT" and plan["max_size"] == BIG
        assert plan["upload"]["expires_at"] < plan["expires_at"]  # a short start, a longer life
        pending = tool_error(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
        assert pending["code"] == "conflict"

        sent = hashlib.sha256()
        async with httpx.AsyncClient(timeout=120) as http:  # plain HTTP, no key: the URL is the capability
            put = await http.request(
                plan["upload"]["method"],
                plan["upload"]["url"],
                headers=plan["upload"]["headers"],
                content=_pieces(b"seed", BIG, sent),
            )
        assert put.status_code == 201, put.text
        assert put.json()["checksum"] == "sha256:" + sent.hexdigest()

        confirmed = structured(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
        assert confirmed["checksum"] == "sha256:" + sent.hexdigest() and confirmed["size"] == BIG
        file_id = confirmed["metadata"]["file_id"]
        fetch = structured(await client.call_tool("authorize_download", {"file_id": file_id}))
        assert fetch["checksum"] == confirmed["checksum"] and fetch["download"]["method"] == "GET"

    got = hashlib.sha256()
    async with httpx.AsyncClient(timeout=120) as http:
        async with http.stream("GET", fetch["download"]["url"]) as response:
            assert response.status_code == 200
            async for piece in response.aiter_bytes():
                got.update(piece)
    assert got.hexdigest() == sent.hexdigest()
    # one PUT per authorisation
    again = httpx.put(plan["upload"]["url"], content=b"other bytes")
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"


async def test_expired_or_oversized_or_tampered_authorization_is_refused(live: LiveServer, clock: Clock) -> None:
    async with Client(f"{live.url}/mcp") as client:
        plan = structured(await client.call_tool("authorize_upload", {"max_size": 10, "start_ttl": 60}))
        too_big = httpx.put(plan["upload"]["url"], content=os.urandom(11))
        assert too_big.status_code == 413, too_big.text
        tampered = httpx.put(plan["upload"]["url"].replace("/az_", "/az_0"), content=b"x")
        assert tampered.status_code in (403, 404)
        clock.advance(61)
        late = httpx.put(plan["upload"]["url"], content=b"in time?")
        assert late.status_code == 403 and late.json()["error"]["code"] == "url_expired"
        unknown = tool_error(await client.call_tool("authorize_download", {"file_id": "f_" + "0" * 32}))
        assert unknown["code"] == "not_found"
        clock.advance(24 * 3600)  # past the authorisation's life: the sweep removes its record
        swept = await live.app.state.services.uploads.sweep()
        assert swept == 1
        gone = tool_error(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
        assert gone["code"] == "not_found"
    assert not [name for name in live.objects() if name.startswith("files/")]


@pytest.mark.s3
async def test_on_s3_the_put_goes_to_the_bucket_and_confirm_publishes(
    on_s3: LiveServer, s3_env: dict[str, str]
) -> None:
    size = 12 << 20
    async with Client(f"{on_s3.url}/mcp") as client:
        plan = structured(
            await client.call_tool("authorize_upload", {"name": "direct.bin", "size": size, "start_ttl": 600})
        )
        assert plan["direct"] is True
        assert plan["upload"]["url"].startswith(s3_env["TRANSFER_S3_ENDPOINT_URL"])  # not the service's address
        sent = hashlib.sha256()
        async with httpx.AsyncClient(timeout=120) as http:
            headers = {**plan["upload"]["headers"], "content-length": str(size)}  # the length the URL signs
            put = await http.put(plan["upload"]["url"], headers=headers, content=_pieces(b"s3", size, sent))
        assert put.status_code == 200, put.text
        confirmed = structured(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
        assert confirmed["checksum"] == "sha256:" + sent.hexdigest() and confirmed["size"] == size
        again = structured(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
        assert again["metadata"] == confirmed["metadata"]  # one file, whichever confirm came first
        fetch = structured(await client.call_tool("authorize_download", {"file_id": confirmed["metadata"]["file_id"]}))
        got = httpx.get(fetch["download"]["url"], timeout=120)
        assert hashlib.sha256(got.content).hexdigest() == sent.hexdigest()

        # straight to the bucket, the exact size is required: the bucket holds the PUT to it (signed) and the key's
        # quota counts it from the start (a URL for "up to 10 bytes" would let the bucket take any size, uncounted)
        unsized = tool_error(await client.call_tool("authorize_upload", {"max_size": 10}))
        assert unsized["code"] == "invalid_request" and unsized["detail"]["field"] == "size"
        small = structured(await client.call_tool("authorize_upload", {"size": 10}))
        longer = httpx.put(small["upload"]["url"], headers=small["upload"]["headers"], content=b"x" * 11)
        assert longer.status_code in (400, 403), longer.text  # the signed length refuses any other body


async def test_a_key_may_hold_only_so_many_open_upload_authorizations(tmp_path: Path, clock: Clock) -> None:
    """TRANSFER_MAX_OPEN_AUTHORIZATIONS_PER_KEY: the authorisation beyond the limit is refused with 429
    too_many_authorizations; one that expired frees its slot; another key has slots of its own."""
    keys = {name: {"sha256": "0" * 64, "scopes": ["upload", "read"]} for name in ("alice", "bob")}
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys=keys,
        max_open_authorizations_per_key=2,
    )
    services = Services.build(settings, LocalStorage(settings.data_dir), clock=clock)  # grants on its one engine
    files = services.files
    await files.start()
    try:
        authorizations = services.authorizations
        alice, bob = (Grant(parse_keys(keys)[name]) for name in ("alice", "bob"))
        for _ in range(2):
            await authorizations.authorize_upload(alice, "http://127.0.0.1")
        with pytest.raises(TooManyAuthorizations) as refused:
            await authorizations.authorize_upload(alice, "http://127.0.0.1")
        assert refused.value.status == 429 and refused.value.detail["limit"] == 2
        await authorizations.authorize_upload(bob, "http://127.0.0.1")
        clock.advance(24 * 3600 + 1)  # the first two are past their life: their slots are free
        await authorizations.authorize_upload(alice, "http://127.0.0.1")
    finally:
        await files.close()


def _markers(live: LiveServer, folder: str) -> list[str]:
    return [name for name in live.objects() if name.startswith("owners/") and f"/{folder}/" in name]


@pytest.mark.s3
async def test_on_s3_an_exact_size_is_signed_so_the_bucket_refuses_another_length(
    on_s3: LiveServer, s3_env: dict[str, str]
) -> None:
    """authorize_upload with ``size``: the presigned PUT signs Content-Length, so the bucket refuses an oversize (or
    short) body before storing a byte, instead of confirm removing it later; the right length is published."""
    async with Client(f"{on_s3.url}/mcp") as client:
        plan = structured(await client.call_tool("authorize_upload", {"size": 1000, "name": "exact.bin"}))
        assert plan["size"] == 1000 and plan["max_size"] == 1000 and plan["direct"] is True
        url, headers = plan["upload"]["url"], plan["upload"]["headers"]
        async with httpx.AsyncClient(timeout=60) as http:
            for wrong in (20 << 20, 1001, 999):
                refused = await http.put(url, headers=headers, content=os.urandom(wrong))
                assert refused.status_code == 403, (wrong, refused.status_code, refused.text[:200])
            aid = {"authorization_id": plan["authorization_id"]}
            nothing = tool_error(await client.call_tool("confirm_upload", aid))
            assert nothing["code"] == "conflict"  # the bucket kept none of them
            body = os.urandom(1000)
            put = await http.put(url, headers=headers, content=body)
            assert put.status_code == 200, put.text
        confirmed = structured(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
        assert confirmed["size"] == 1000 and confirmed["checksum"] == "sha256:" + hashlib.sha256(body).hexdigest()
        too_big = tool_error(await client.call_tool("authorize_upload", {"size": 11, "max_size": 10}))
        assert too_big["code"] == "invalid_request"


async def test_through_the_service_an_exact_size_refuses_another_length(live: LiveServer) -> None:
    async with Client(f"{live.url}/mcp") as client:
        plan = structured(await client.call_tool("authorize_upload", {"size": 5}))
        assert plan["size"] == 5 and plan["direct"] is False
        short = httpx.put(plan["upload"]["url"], content=b"1234")
        assert short.status_code == 422 and short.json()["error"]["code"] == "size_mismatch", short.text
        assert httpx.put(plan["upload"]["url"], content=b"12345").status_code == 201
        confirmed = structured(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
        assert confirmed["size"] == 5


async def test_an_authorization_lets_go_of_its_slot_when_it_receives_its_file(tmp_path: Path, clock: Clock) -> None:
    """The key's open-authorisation slot goes at completion (and with the sweep), not only when the key next
    reaches its limit."""
    keys = {"alice": {"sha256": "0" * 64, "scopes": ["upload", "read"]}}
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys)
    services = Services.build(settings, LocalStorage(settings.data_dir), clock=clock)  # grants on its one engine
    files = services.files
    await files.start()

    async def markers() -> list[str]:
        return await authorizations.kind.slots.open_ids(alice.owner or "")

    async def body(data: bytes) -> AsyncIterator[bytes]:
        yield data

    try:
        authorizations = services.authorizations
        alice = Grant(parse_keys(keys)["alice"])
        plans = [await authorizations.authorize_upload(alice, "http://127.0.0.1") for _ in range(3)]
        assert len(await markers()) == 3
        query = urlsplit(plans[0]["upload"]["url"]).query
        await authorizations.receive(plans[0]["authorization_id"], query, body(b"done"), content_length=4)
        assert len(await markers()) == 2  # the one that received its file holds no slot
        clock.advance(24 * 3600 + 1)
        assert await services.uploads.sweep() == 3
        assert await markers() == []
    finally:
        await files.close()
