"""Whole-file deduplication within one key: an upload that declares content (SHA-256 and size) its key already
stores completes without its body (plain upload with ``Expect: 100-continue``, tus creation, IETF creation), as a
file of its own sharing the bytes; deleting or expiring one file never takes bytes another still uses; another key
learns nothing (it is asked for its body and answered the same way). Real servers on loopback, local and S3."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.s3server import s3_client
from tests.conftest import Clock, LiveServer, running
from transfer.client.dedup import cut_file, upload_deduplicated
from transfer.core.auth import TRUSTED, new_token, token_hash
from transfer.service.container import Services
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.records import object_key
from transfer.service.files.shared import SWEEP_GRACE, content_key
from transfer.settings import Settings

TOKENS = {name: new_token() for name in ("alice", "bob", "carol", "root")}
MIN = 64 << 10  # dedup_min_size of these tests: files this large share bytes
TUS = {"tus-resumable": "1.0.0"}


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


def tenant_settings(tmp_path: Path, **extra: Any) -> Settings:
    keys = {
        name: {"sha256": token_hash(t), "scopes": ["admin"] if name == "root" else ["upload", "read"]}
        for name, t in TOKENS.items()
    }
    return Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys=keys,
        dedup_min_size=MIN,
        inline_threshold=1024,
        **extra,
    )


class Stored:
    """The server and a way to list what its backend holds (local directory or S3 bucket)."""

    def __init__(self, live: LiveServer, bucket: tuple[Any, str] | None) -> None:
        self.live = live
        self.url = live.url
        self.bucket = bucket

    def keys(self) -> list[str]:
        if self.bucket is None:
            return [k for k in self.live.objects()]
        endpoint, name = self.bucket
        client = s3_client(endpoint)
        return sorted(  # the service's objects are under data/ (their metadata under meta/)
            item["Key"].removeprefix("data/")
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=name, Prefix="data/")
            for item in page.get("Contents", [])
        )

    def under(self, prefix: str) -> list[str]:
        return [k for k in self.keys() if k.startswith(prefix)]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def stored(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Stored]:
    extra: dict[str, Any] = {}
    bucket = None
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        extra = {"storage": "s3"}
        bucket = (request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket"))
    with running(tenant_settings(tmp_path, **extra), clock) as live:
        yield Stored(live, bucket)


def checksum(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def upload(url: str, who: str, data: bytes, **params: Any) -> httpx.Response:
    """A plain upload that sends its body (no Expect)."""
    query = {"checksum": checksum(data), "size": len(data), **params}
    return httpx.post(f"{url}/v1/files", params=query, content=data, headers=key(who), timeout=60)


def upload_expecting(url: str, who: str, data: bytes, query: str = "") -> tuple[int, dict[str, Any], bool]:
    """A plain upload with ``Expect: 100-continue``, as curl sends large bodies: the body goes only after a
    ``100 Continue``. Returns the final status, its JSON body and whether the body was sent."""
    host, port = url.removeprefix("http://").split(":")
    q = f"checksum={checksum(data)}&size={len(data)}&name=again.bin{query}"
    head = (
        f"POST /v1/files?{q} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {TOKENS[who]}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(data)}\r\nExpect: 100-continue\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(head.encode())
        answer = _read_head(s)
        sent = False
        if answer.startswith(b"HTTP/1.1 100"):
            s.sendall(data)
            sent = True
            answer = answer.partition(b"\r\n\r\n")[2] + b""
            while b"\r\n\r\n" not in answer:
                answer += s.recv(65536)
        status_line, _, rest = answer.partition(b"\r\n")
        fields, _, body = rest.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1]) for line in fields.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += s.recv(65536)
    return int(status_line.split()[1]), json.loads(body[:length]), sent


def _read_head(s: socket.socket) -> bytes:
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = s.recv(65536)
        assert chunk, "the server closed the connection without an answer"
        answer += chunk
    return answer


def download(url: str, who: str, file_id: str) -> bytes:
    """The file's bytes by its descriptor's signed URL (url mode: the files here are above the inline threshold)."""
    described = descriptor_of(url, who, file_id)
    assert described.status_code == 200, described.text
    response = httpx.get(described.json()["url"], timeout=60)
    assert response.status_code == 200, response.text
    return response.content


def descriptor_of(url: str, who: str, file_id: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/files/{file_id}", headers=key(who), timeout=60)


def file_id(descriptor: dict[str, Any]) -> str:
    return str(descriptor["metadata"]["file_id"])


def used(url: str, who: str) -> int:
    return int(httpx.get(f"{url}/v1/usage", headers=key(who), timeout=30).json()["bytes_used"])


def test_plain_upload_of_stored_content_completes_before_its_body(stored: Stored) -> None:
    data = os.urandom(MIN + 12_345)
    first = upload(stored.url, "alice", data, name="first.bin")
    assert first.status_code == 201, first.text
    status, again, sent = upload_expecting(stored.url, "alice", data)
    assert status == 201 and not sent  # answered before the 100 Continue: not one byte of the body was sent
    assert file_id(again) != file_id(first.json())  # a file of its own
    assert again["name"] == "again.bin" and again["checksum"] == checksum(data) and again["size"] == len(data)
    assert download(stored.url, "alice", file_id(again)) == data
    # one copy of the bytes: the new file is a record, its bytes the first file's
    assert len(stored.under("content/")) == 1 and stored.under("blobs/") == []
    # quota: each file counts its size (what the key sees), once
    assert used(stored.url, "alice") == 2 * len(data)


def test_a_known_content_is_named_as_its_bytes_and_this_uploads_name_say(stored: Stored) -> None:
    """The media type of a file that shares stored bytes is sniffed as if its bytes were read, with its own name:
    not the type the content was given at first (which came from the first upload's name)."""
    data = b"\x00\x01binary" + os.urandom(MIN + 99)
    first = upload(stored.url, "alice", data, name="notes.txt")
    assert first.status_code == 201 and first.json()["content_type"] == "text/plain"
    status, again, sent = upload_expecting(stored.url, "alice", data)  # named again.bin
    assert status == 201 and not sent
    assert again["content_type"] == "application/octet-stream"
    png = bytes.fromhex("89504e470d0a1a0a0000000d49484452") + os.urandom(MIN)  # a clear signature beats a name
    assert upload(stored.url, "alice", png, name="a.bin").json()["content_type"] == "image/png"
    status, again, sent = upload_expecting(stored.url, "alice", png)
    assert status == 201 and not sent and again["content_type"] == "image/png"


def test_another_key_learns_nothing_and_must_send_its_body(stored: Stored) -> None:
    data = os.urandom(MIN + 999)
    assert upload(stored.url, "alice", data).status_code == 201
    status_alice, alice, sent_alice = upload_expecting(stored.url, "alice", data)
    status_bob, bob, sent_bob = upload_expecting(stored.url, "bob", data)
    assert not sent_alice and sent_bob  # bob is asked for his body, as for any content
    assert status_alice == status_bob == 201
    assert sorted(alice) == sorted(bob)  # the same descriptor fields, the same values but for id and URL

    def same(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k not in ("url", "url_expires_at", "metadata")}

    assert same(alice) == same(bob)
    assert download(stored.url, "bob", file_id(bob)) == data
    # bob's bytes are his own: neither file of alice's shares them, nor does a 404 tell him hers exist
    assert descriptor_of(stored.url, "bob", file_id(alice)).status_code == 404
    assert len(stored.under("content/")) == 2  # one record per key
    # tus and the IETF door: bob's creation is an ordinary upload at offset 0
    meta = f"sha256 {base64.b64encode(hashlib.sha256(data).hexdigest().encode()).decode()}"
    created = httpx.post(
        f"{stored.url}/tus/files",
        headers={**TUS, **key("bob"), "upload-length": str(len(data) + 1), "upload-metadata": meta},
    )
    assert created.status_code == 201 and "upload-file-id" not in created.headers
    head = httpx.head(created.headers["location"], headers={**TUS, **key("bob")})
    assert head.headers["upload-offset"] == "0"


def test_tus_creation_declaring_stored_content_is_complete_at_once(stored: Stored) -> None:
    data = os.urandom(MIN * 2)
    first = upload(stored.url, "alice", data)
    assert first.status_code == 201
    digest = hashlib.sha256(data).hexdigest()
    meta = f"filename {base64.b64encode(b'tus.bin').decode()},sha256 {base64.b64encode(digest.encode()).decode()}"
    created = httpx.post(
        f"{stored.url}/tus/files",
        headers={**TUS, **key("alice"), "upload-length": str(len(data)), "upload-metadata": meta},
    )
    assert created.status_code == 201, created.text
    assert created.headers["upload-offset"] == str(len(data))  # Upload-Offset = Upload-Length: nothing to send
    new_id = created.headers["upload-file-id"]
    head = httpx.head(created.headers["location"], headers={**TUS, **key("alice")})
    assert head.headers["upload-offset"] == str(len(data))
    assert download(stored.url, "alice", new_id) == data
    assert descriptor_of(stored.url, "alice", new_id).json()["name"] == "tus.bin"
    # bob, declaring the same, is answered as for any content: offset 0, send the bytes
    created_bob = httpx.post(
        f"{stored.url}/tus/files",
        headers={**TUS, **key("bob"), "upload-length": str(len(data)), "upload-metadata": meta},
    )
    assert created_bob.status_code == 201 and "upload-offset" not in created_bob.headers
    assert "upload-file-id" not in created_bob.headers


def test_ietf_creation_with_repr_digest_of_stored_content_is_complete_at_once(stored: Stored) -> None:
    data = os.urandom(MIN + 7)
    assert upload(stored.url, "alice", data).status_code == 201
    digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
    headers = {"upload-length": str(len(data)), "upload-complete": "?0", "repr-digest": f"sha-256=:{digest}:"}
    created = httpx.post(f"{stored.url}/v1/uploads", headers={**key("alice"), **headers})
    assert created.status_code == 201, created.text
    assert created.headers["upload-complete"] == "?1" and created.headers["upload-offset"] == str(len(data))
    assert download(stored.url, "alice", file_id(created.json())) == data
    bob = httpx.post(f"{stored.url}/v1/uploads", headers={**key("bob"), **headers})
    assert bob.status_code == 201 and bob.headers["upload-complete"] == "?0"
    assert bob.headers["upload-offset"] == "0"


def test_deleting_or_expiring_one_file_keeps_the_bytes_the_others_use(stored: Stored, clock: Clock) -> None:
    data = os.urandom(MIN + 1)
    origin = file_id(upload(stored.url, "alice", data).json())
    _, second, _ = upload_expecting(stored.url, "alice", data)
    _, third, _ = upload_expecting(stored.url, "alice", data, "&expires_in=60")
    # the first file goes first: its bytes move to a blob the others use
    assert httpx.delete(f"{stored.url}/v1/files/{origin}", headers=key("root")).status_code == 204
    assert descriptor_of(stored.url, "alice", origin).status_code == 404
    assert len(stored.under("blobs/")) == 1 and stored.under(object_key(origin)) == []
    assert download(stored.url, "alice", file_id(second)) == data
    # the third expires and is swept (by a second service on the same backend, as a replica's sweep would)
    clock.advance(3600 * 3)
    assert asyncio.run(_sweep_files(stored.live.settings, clock)) == 1
    assert descriptor_of(stored.url, "alice", file_id(third)).status_code in (404, 410)
    assert download(stored.url, "alice", file_id(second)) == data
    # the last one goes: its bytes, its content record and the blob with it
    assert httpx.delete(f"{stored.url}/v1/files/{file_id(second)}", headers=key("root")).status_code == 204
    assert stored.under("blobs/") == [] and stored.under("content/") == []
    assert [k for k in stored.keys() if k.startswith("files/")] == []
    assert used(stored.url, "alice") == 0


async def _sweep_files(settings: Settings, clock: Clock) -> int:
    service = Services.build(settings, _storage(settings), clock=clock).files
    await service.start()
    try:
        return await service.sweep_expired_files()
    finally:
        await service.close()


def _storage(settings: Settings) -> Any:
    from transfer.service.backends import make_storage

    return make_storage(settings)


def test_a_body_that_does_not_match_its_declared_stored_content_is_refused(stored: Stored) -> None:
    data = os.urandom(MIN + 3)
    assert upload(stored.url, "alice", data).status_code == 201
    other = os.urandom(len(data))
    # the body is sent (no Expect): it must be the declared content, shared or not
    refused = httpx.post(
        f"{stored.url}/v1/files",
        params={"checksum": checksum(data), "size": len(data)},
        content=other,
        headers=key("alice"),
    )
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "checksum_mismatch"
    # nothing was published: the content record still names the one file, and used is one file's size
    assert used(stored.url, "alice") == len(data)
    status, again, sent = upload_expecting(stored.url, "alice", data)
    assert status == 201 and not sent and download(stored.url, "alice", file_id(again)) == data


# --- the reference count under crashes: the steps called one at a time, then the sweep -----------------------


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def crash_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    extra: dict[str, Any] = {}
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        extra = {"storage": "s3"}
    return tenant_settings(tmp_path, **extra)


@pytest.mark.anyio
async def test_a_crash_between_any_two_steps_leaves_an_orphan_the_sweep_removes(
    crash_settings: Settings, clock: Clock
) -> None:
    service = Services.build(crash_settings, _storage(crash_settings), clock=clock).files
    await service.start()
    try:
        shared = service.publisher.shared
        data = os.urandom(MIN + 5)
        sha = hashlib.sha256(data).hexdigest()
        request = UploadRequest(checksum="sha256:" + sha, expected_size=len(data), owner="alice")
        origin = await service.upload(_body(data), request)
        record_key = content_key("alice", sha, len(data), origin.encoding)
        # crash 1: a reference taken for a file whose publication never happened
        found = await shared.reference("alice", sha, len(data), origin.encoding, "f_" + "0" * 32)
        assert found is not None
        # crash 2: an origin's move composed its blob, then died before the compare-and-set
        assert shared.composer is not None
        await shared.composer.compose(
            "blobs/" + record_key.removeprefix("content/") + "/dead", [object_key(origin.id)], {}
        )
        # a pointer file, published properly
        pointer = await service.upload(_body(b""), request, body_pending=True)
        assert pointer.content == record_key
        # crash 3: the pointer's object deleted, its reference never released
        await service.storage.delete(object_key(pointer.id))
        # nothing is removed while it may still be in flight
        assert await service.sweep_shared_content() == 0
        # (a blob's age is the backend's modification time: the test's clock must be past it too)
        clock.now = max(clock.now, time.time()) + SWEEP_GRACE + 1
        assert await service.sweep_shared_content() == 3  # two references and the orphan blob
        doc, _ = await shared.records.read(record_key)
        assert list(doc["refs"]) == [origin.id]  # only the file that exists is left, its bytes where they were
        # then the origin goes, the last one: bytes and record with it, nothing dangling or leaked
        await service.delete(origin.id, TRUSTED)
        for prefix in ("files/", "blobs/", "content/"):
            assert [info.key async for info in service.storage.list(prefix)] == []
    finally:
        await service.close()


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("curl"), reason="curl is needed by the benchmark")
def test_the_benchmark_row_sends_no_body_the_second_time(tmp_path: Path) -> None:
    from benchmarks.dedup_whole import dedup_whole_table, run_dedup_whole

    result = run_dedup_whole(9 << 20, 1, tmp_path)  # above the default dedup_min_size (8 MiB)
    assert result["full_bytes_sent"] == 9 << 20 and result["shared_bytes_sent"] == 0
    assert "again, shared" in dedup_whole_table(result)


@pytest.mark.anyio
async def test_mcp_authorize_upload_of_stored_content_is_complete_without_a_put(stored: Stored) -> None:
    from mcp import Client

    from tests.agents.test_mcp import _bearer, structured

    data = os.urandom(MIN + 11)
    assert (await asyncio.to_thread(upload, stored.url, "alice", data)).status_code == 201
    declared = {"name": "mcp.bin", "checksum": checksum(data), "size": len(data)}
    async with Client(_bearer(f"{stored.url}/mcp", TOKENS["alice"])) as client:
        plan = structured(await client.call_tool("authorize_upload", declared))
        assert plan["complete"] is True  # no PUT: the file is there
        confirmed = structured(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
    assert confirmed["checksum"] == checksum(data) and confirmed["name"] == "mcp.bin"
    assert await asyncio.to_thread(download, stored.url, "alice", file_id(confirmed)) == data
    async with Client(_bearer(f"{stored.url}/mcp", TOKENS["bob"])) as client:
        bob = structured(await client.call_tool("authorize_upload", declared))
    assert bob["complete"] is False and sorted(bob) == sorted(plan)  # bob must PUT, and learns nothing


def manifest_of(data: bytes) -> dict[str, Any]:
    """The chunk manifest of ``data`` as ``transfer upload`` cuts it (FastCDC, the service's parameters)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f.bin"
        path.write_bytes(data)
        return cut_file(path).to_json()


def chunked_create(url: str, who: str, data: bytes) -> httpx.Response:
    """A chunked upload's creation: the file's manifest, name given."""
    doc = {**manifest_of(data), "name": "chunked.bin"}
    return httpx.post(f"{url}/v1/chunked", json=doc, headers=key(who), timeout=60)


def test_chunked_creation_declaring_stored_content_is_born_completed(stored: Stored) -> None:
    data = os.urandom(MIN + 4321)
    first = upload(stored.url, "alice", data, name="first.bin")  # a plain upload: nobody sent its manifest
    assert first.status_code == 201, first.text
    made = chunked_create(stored.url, "alice", data)
    assert made.status_code == 201, made.text
    born = made.json()
    assert born["state"] == "completed" and born["missing"] == [] and born["missing_bytes"] == 0
    assert born["file_id"] and born["file_id"] != file_id(first.json())  # a file of its own, published already
    # nothing more to send to it: a chunk is refused, not stored (nor charged)
    sent = httpx.put(f"{stored.url}/v1/chunked/{born['id']}/chunks/0", content=data[:100], headers=key("alice"))
    assert sent.status_code == 409 and sent.json()["error"]["code"] == "session_completed"
    done = httpx.post(f"{stored.url}/v1/chunked/{born['id']}/complete", headers=key("alice"), timeout=60)
    assert done.status_code == 201, done.text
    assert file_id(done.json()) == born["file_id"] and done.json()["name"] == "chunked.bin"
    assert done.json()["checksum"] == checksum(data)
    assert download(stored.url, "alice", born["file_id"]) == data
    assert len(stored.under("content/")) == 1  # one copy of the bytes
    assert used(stored.url, "alice") == 2 * len(data)  # each file its size, once; no chunk stored or charged
    # its chunk list, checked against the shared bytes after the answer, is its manifest (resolvers with a cache)
    asyncio.run(checks_done(stored.live))
    manifest = httpx.get(f"{stored.url}/v1/files/{born['file_id']}/chunks", headers=key("alice"), timeout=60)
    assert manifest.status_code == 200 and manifest.json()["chunks"] == manifest_of(data)["chunks"]
    # bob declares the same manifest: an ordinary open upload that lacks every chunk, as for unknown content
    bob = chunked_create(stored.url, "bob", data)
    assert bob.status_code == 201 and bob.json()["state"] == "open" and bob.json()["file_id"] is None
    assert bob.json()["missing_bytes"] == len(data) and sorted(bob.json()) == sorted(born)
    early = httpx.post(f"{stored.url}/v1/chunked/{bob.json()['id']}/complete", headers=key("bob"), timeout=60)
    assert early.status_code == 409 and early.json()["error"]["code"] == "chunks_missing"
    # what is shared is the declared content (SHA-256 and size), never the chunk list: chunks of other bytes
    # under alice's checksum give her a file of the content she declared, and that list, checked, is not kept
    lie = {**manifest_of(os.urandom(len(data))), "checksum": checksum(data)}
    lying = httpx.post(f"{stored.url}/v1/chunked", json=lie, headers=key("alice"), timeout=60)
    assert lying.status_code == 201 and lying.json()["state"] == "completed"
    assert download(stored.url, "alice", lying.json()["file_id"]) == data
    asyncio.run(checks_done(stored.live))
    kept = httpx.get(f"{stored.url}/v1/files/{lying.json()['file_id']}/chunks", headers=key("alice"), timeout=60)
    assert kept.status_code == 404


async def checks_done(live: LiveServer) -> None:
    """Until every chunk check the server left for after its answer has ended."""
    await live.call(live.app.state.services.chunks.store.indexing_done())


def test_the_client_says_a_known_file_went_by_its_manifest_alone(stored: Stored, tmp_path: Path) -> None:
    data = os.urandom(MIN + 77)
    assert upload(stored.url, "alice", data).status_code == 201
    src = tmp_path / "again.bin"
    src.write_bytes(data)

    async def again() -> Any:
        async with httpx.AsyncClient(headers=key("alice"), timeout=60) as http:
            return await upload_deduplicated(http, stored.url, src)

    outcome = asyncio.run(again())
    assert outcome.how == "known" and outcome.sent_bytes == 0 and outcome.sent_chunks == 0
    assert outcome.descriptor.checksum == checksum(data) and outcome.manifest_bytes > 0
    fresh = tmp_path / "fresh.bin"
    fresh.write_bytes(os.urandom(MIN + 78))
    src.write_bytes(fresh.read_bytes())
    assert asyncio.run(again()).how == "chunks"  # content nobody stored: its chunks went


def test_a_chunked_upload_born_completed_holds_no_open_slot(tmp_path: Path, clock: Clock) -> None:
    data = os.urandom(MIN + 5)
    with running(tenant_settings(tmp_path, max_open_sessions_per_key=1), clock) as live:
        assert upload(live.url, "alice", data).status_code == 201
        for _ in range(3):  # a key at its limit of one open upload would be refused a second
            born = chunked_create(live.url, "alice", data)
            assert born.status_code == 201 and born.json()["state"] == "completed", born.text
        opened = chunked_create(live.url, "alice", os.urandom(MIN + 6))  # its one slot is still free
        assert opened.status_code == 201 and opened.json()["state"] == "open"
        refused = chunked_create(live.url, "alice", os.urandom(MIN + 7))
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_sessions"


@pytest.mark.s3
def test_direct_plan_declaring_stored_content_is_completed_at_once(
    s3_env: dict[str, str], tmp_path: Path, clock: Clock
) -> None:
    data = os.urandom(MIN + 21)
    plan_body = {"size": len(data), "checksum": checksum(data), "name": "direct.bin"}
    with running(tenant_settings(tmp_path, storage="s3"), clock) as live:
        assert upload(live.url, "alice", data).status_code == 201
        plan = httpx.post(f"{live.url}/v1/direct", json=plan_body, headers=key("alice"))
        assert plan.status_code == 201, plan.text
        assert plan.json()["state"] == "completed" and plan.json()["file_id"]  # no part to send
        done = httpx.post(f"{live.url}/v1/direct/{plan.json()['id']}/complete", json={}, headers=key("alice"))
        assert done.status_code == 200 and file_id(done.json()) == plan.json()["file_id"]
        assert download(live.url, "alice", plan.json()["file_id"]) == data
        bob = httpx.post(f"{live.url}/v1/direct", json=plan_body, headers=key("bob"))
        assert bob.status_code == 201 and bob.json()["state"] == "open" and bob.json()["file_id"] is None
        assert sorted(bob.json()) == sorted(plan.json())


# --- the operator's sharing group: keys of one group share content as one key does --------------------------

GROUPS = {"team": ["alice", "carol"]}  # bob stays outside


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def grouped(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Stored]:
    extra: dict[str, Any] = {"dedup_groups": GROUPS}
    bucket = None
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        extra["storage"] = "s3"
        bucket = (request.getfixturevalue("s3_endpoint"), request.getfixturevalue("s3_bucket"))
    with running(tenant_settings(tmp_path, **extra), clock) as live:
        yield Stored(live, bucket)


def tus_create(url: str, who: str, data: bytes) -> httpx.Response:
    digest = base64.b64encode(hashlib.sha256(data).hexdigest().encode()).decode()
    meta = f"filename {base64.b64encode(b'tus.bin').decode()},sha256 {digest}"
    headers = {**TUS, **key(who), "upload-length": str(len(data)), "upload-metadata": meta}
    return httpx.post(f"{url}/tus/files", headers=headers, timeout=60)


def ietf_create(url: str, who: str, data: bytes) -> httpx.Response:
    digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
    headers = {"upload-length": str(len(data)), "upload-complete": "?0", "repr-digest": f"sha-256=:{digest}:"}
    return httpx.post(f"{url}/v1/uploads", headers={**key(who), **headers}, timeout=60)


def direct_plan(url: str, who: str, data: bytes) -> httpx.Response:
    body = {"size": len(data), "checksum": checksum(data), "name": "direct.bin"}
    return httpx.post(f"{url}/v1/direct", json=body, headers=key(who), timeout=60)


async def mcp_authorize(url: str, who: str, data: bytes) -> dict[str, Any]:
    from mcp import Client

    from tests.agents.test_mcp import _bearer, structured

    declared = {"name": "mcp.bin", "checksum": checksum(data), "size": len(data)}
    async with Client(_bearer(f"{url}/mcp", TOKENS[who])) as client:
        return structured(await client.call_tool("authorize_upload", declared))


def test_keys_of_one_group_share_what_either_stored_on_every_door(grouped: Stored) -> None:
    url = grouped.url
    data = os.urandom(MIN + 17)
    origin = upload(url, "alice", data, name="first.bin")
    assert origin.status_code == 201, origin.text
    # carol, alice's group, is answered before her body, as alice would be
    status, plain, sent = upload_expecting(url, "carol", data)
    assert status == 201 and not sent
    tus = tus_create(url, "carol", data)
    assert tus.status_code == 201 and tus.headers["upload-offset"] == str(len(data))
    ietf = ietf_create(url, "carol", data)
    assert ietf.status_code == 201 and ietf.headers["upload-complete"] == "?1"
    mcp = asyncio.run(mcp_authorize(url, "carol", data))
    assert mcp["complete"] is True
    chunked = chunked_create(url, "carol", data)
    assert chunked.status_code == 201 and chunked.json()["state"] == "completed"
    made = [file_id(plain), tus.headers["upload-file-id"], file_id(ietf.json()), chunked.json()["file_id"]]
    if grouped.bucket is not None:  # direct plans exist on S3 only
        plan = direct_plan(url, "carol", data)
        assert plan.status_code == 201 and plan.json()["state"] == "completed"
        made.append(plan.json()["file_id"])
    for new in made:
        assert download(url, "carol", new) == data
    # one copy of the bytes, in the group's record; and the other way round: alice shares what carol stored
    assert len(grouped.under("content/")) == 1 and grouped.under("content/g-")
    other = os.urandom(MIN + 18)
    assert upload(url, "carol", other).status_code == 201
    status, back, sent = upload_expecting(url, "alice", other)
    assert status == 201 and not sent and download(url, "alice", file_id(back)) == other
    # ownership stays per key: the group shares bytes, not files
    assert descriptor_of(url, "alice", made[0]).status_code == 404
    assert descriptor_of(url, "carol", file_id(origin.json())).status_code == 404
    # quota: every file counts its full size for the key that made it (the MCP file too, confirmed or not)
    assert used(url, "carol") == (len(made) + 1) * len(data) + len(other)


MASKS = [
    (re.compile(r"[0-9a-f]{64}"), "<hex>"),  # checksums
    (re.compile(r"[A-Za-z0-9+/]{43}="), "<b64>"),  # Repr-Digest values
    (re.compile(r"\b[a-z]{1,4}_[A-Za-z0-9_-]{16,}"), "<id>"),  # file, upload, plan and authorisation ids
    (re.compile(r"\d{4}-\d\d-\d\dT[0-9:.]+Z?"), "<time>"),
    (re.compile(r"(sig|signature|expires|X-Amz-[A-Za-z-]+)=[^&\"\s]+"), r"\1=<v>"),
    (re.compile(r"\d{9,}"), "<n>"),  # expiry instants in seconds
]


def masked(value: Any) -> str:
    """What of an answer may not differ between two contents: its text with every id, digest and instant masked."""
    text = json.dumps(value, sort_keys=True)
    for pattern, mask in MASKS:
        text = pattern.sub(mask, text)
    return text


def answer(response: httpx.Response) -> str:
    headers = {k: v for k, v in response.headers.items() if k not in ("date", "content-length", "x-request-id")}
    body = response.json() if response.content and "json" in response.headers.get("content-type", "") else None
    return masked({"status": response.status_code, "headers": headers, "body": body})


def test_a_key_outside_the_group_is_answered_as_for_unknown_content_on_every_door(grouped: Stored) -> None:
    url = grouped.url
    data = os.urandom(MIN + 33)
    assert upload(url, "alice", data).status_code == 201
    assert upload_expecting(url, "carol", data)[2] is False  # the group stores it
    unknown = os.urandom(len(data))  # the same size, never stored by anyone
    # plain: bob must send his body either way, and the answers differ only in ids, digests and instants
    status_known, known, sent_known = upload_expecting(url, "bob", data)
    status_fresh, fresh, sent_fresh = upload_expecting(url, "bob", unknown)
    assert sent_known and sent_fresh and status_known == status_fresh == 201
    assert masked(known) == masked(fresh)
    bob_data = os.urandom(MIN + 34)  # tus, IETF, MCP, direct: compared on content nobody in his scope has
    group_data = os.urandom(len(bob_data))
    assert upload(url, "carol", group_data).status_code == 201
    for door in (tus_create, ietf_create) + ((direct_plan,) if grouped.bucket is not None else ()):
        known_answer, fresh_answer = door(url, "bob", group_data), door(url, "bob", bob_data)
        assert known_answer.status_code == 201, known_answer.text
        assert answer(known_answer) == answer(fresh_answer), door.__name__
    assert masked(asyncio.run(mcp_authorize(url, "bob", group_data))) == masked(
        asyncio.run(mcp_authorize(url, "bob", bob_data))
    )
    # chunked: an open upload that lacks every chunk either way (the chunk count is the content's own)
    for made in (chunked_create(url, "bob", group_data), chunked_create(url, "bob", bob_data)):
        doc = made.json()
        assert made.status_code == 201 and doc["state"] == "open" and doc["file_id"] is None
        assert doc["missing"] == list(range(doc["chunks"])) and doc["missing_bytes"] == len(bob_data)
    # his file is his own bytes: a record of his own scope, not the group's
    assert download(url, "bob", file_id(known)) == data
    assert len([k for k in grouped.under("content/") if not k.startswith("content/g-")]) == 2


def test_deleting_one_members_file_keeps_the_bytes_another_members_file_uses(grouped: Stored) -> None:
    url = grouped.url
    data = os.urandom(MIN + 5)
    origin = file_id(upload(url, "alice", data).json())
    _, carols, sent = upload_expecting(url, "carol", data)
    assert not sent
    assert httpx.delete(f"{url}/v1/files/{origin}", headers=key("root")).status_code == 204
    assert len(grouped.under("blobs/")) == 1 and grouped.under(object_key(origin)) == []
    assert download(url, "carol", file_id(carols)) == data
    assert httpx.delete(f"{url}/v1/files/{file_id(carols)}", headers=key("root")).status_code == 204
    assert grouped.under("blobs/") == [] and grouped.under("content/") == []
    assert [k for k in grouped.keys() if k.startswith("files/")] == []


@pytest.mark.anyio
async def test_a_file_shared_in_a_group_keeps_its_bytes_after_the_groups_change(tmp_path: Path, clock: Clock) -> None:
    data = os.urandom(MIN + 9)
    sha = hashlib.sha256(data).hexdigest()
    request = UploadRequest(checksum="sha256:" + sha, expected_size=len(data), owner="alice")
    before = tenant_settings(tmp_path, dedup_groups=GROUPS)
    service = Services.build(before, _storage(before), clock=clock).files
    await service.start()
    try:
        origin = await service.upload(_body(data), request)
        pointer = await service.upload(_body(b""), replace(request, owner="carol"), body_pending=True)
        assert pointer.content is not None and pointer.content == origin.shared_as
    finally:
        await service.close()
    after = tenant_settings(tmp_path)  # the operator dissolved the group: alice's scope is her own again
    service = Services.build(after, _storage(after), clock=clock).files
    await service.start()
    try:
        await service.delete(origin.id, TRUSTED)  # the origin still finds the record it is the location of
        async with await service.publisher.shared.open(pointer) as reader:
            assert b"".join([piece async for piece in reader.read()]) == data
    finally:
        await service.close()


def test_a_key_in_two_groups_or_an_unknown_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is in"):
        tenant_settings(tmp_path, dedup_groups={"a": ["alice"], "b": ["alice", "carol"]})
    with pytest.raises(ValueError, match="not a key"):
        tenant_settings(tmp_path, dedup_groups={"a": ["alice", "mallory"]})


@pytest.mark.s3
@pytest.mark.anyio
async def test_a_file_larger_than_one_copy_moves_is_shared_and_moved_in_ranges_on_s3(
    s3_env: dict[str, str], tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import storage.s3.store as s3
    import storage.s3.writer as s3_writer
    from storage.rules import S3Rules

    # one UploadPartCopy moves at most 6 MiB here (5 GiB on AWS): the 16 MiB origin moves in three ranges
    limit = 6 << 20
    monkeypatch.setattr(
        s3.S3Storage,
        "rules",
        property(lambda self: S3Rules(preferred_part_size=self.config.part_size, max_compose_source=limit)),
    )
    planned: list[list[tuple[int, int] | None]] = []
    plan = s3.copy_ranges

    def ranges(size: int, most: int | None) -> list[tuple[int, int] | None]:
        planned.append(plan(size, most))
        return planned[-1]

    monkeypatch.setattr(s3, "copy_ranges", ranges)  # compose
    monkeypatch.setattr(s3_writer, "copy_ranges", ranges)  # a writer's copy_range
    settings = tenant_settings(tmp_path, storage="s3")
    service = Services.build(settings, _storage(settings), clock=clock).files
    await service.start()
    try:
        data = os.urandom((16 << 20) + 3)
        sha = hashlib.sha256(data).hexdigest()
        request = UploadRequest(checksum="sha256:" + sha, expected_size=len(data), owner="alice")
        origin = await service.upload(_body(data), request)
        pointer = await service.upload(_body(b""), request, body_pending=True)
        assert pointer.content is not None  # shared although larger than one copy moves
        await service.delete(origin.id, TRUSTED)  # its bytes move to a blob, range by range
        assert [len(p) for p in planned] == [3]
        doc, _ = await service.publisher.shared.records.read(pointer.content)
        assert doc["location"].startswith("blobs/")
        async with await service.publisher.shared.open(pointer) as reader:
            moved = b"".join([piece async for piece in reader.read()])
        assert len(moved) == len(data) and hashlib.sha256(moved).hexdigest() == sha
    finally:
        await service.close()
