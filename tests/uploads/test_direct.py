"""Direct-to-storage uploads: parts go from the client straight to the bucket through presigned URLs; the service
plans, signs, checks every part, reads the assembled bytes back to verify the declared SHA-256, and publishes.

Runs on the S3 test server (Swift's s3api 2.38 verifies SigV4 and the signed ``x-amz-checksum-sha256`` of each part,
answering BadDigest otherwise; it keeps no part checksums, so ListParts reports none and the read-back is the
whole-file check) and on local storage (refused with 409 ``direct_upload_unsupported`` so clients fall back)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tests.conftest import Clock, in_progress_uploads, s3_client, serving
from tests.faultproxy import FaultProxy
from transfer.client import AsyncTransferClient, ResolveOptions
from transfer.core.auth import new_token, token_hash
from transfer.errors import ChecksumMismatch, DirectUploadUnsupported
from transfer.hosts import create_app
from transfer.settings import Settings

MiB = 1 << 20
TOKENS = {name: new_token() for name in ("alice", "bob")}


def sha_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class BodyCounter:
    """ASGI middleware: counts the request body bytes the service process receives (every route)."""

    def __init__(self, app: ASGIApp, counts: dict[str, int]) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                self.counts["bytes"] += len(message.get("body", b""))
            return message

        await self.app(scope, counted if scope["type"] == "http" else receive, send)


@pytest.fixture
def proxy(s3_endpoint: Any) -> Iterator[FaultProxy]:
    """A proxy in front of the S3 test server, which the service uses as its endpoint: presigned URLs point at it,
    so every part a client sends to the bucket is seen (and counted) here."""
    parts = urlsplit(s3_endpoint.url)
    fault_proxy = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 80)).start()
    yield fault_proxy
    fault_proxy.stop()


def direct_settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        storage="s3",
        **extra,
    )


@pytest.fixture
def counts() -> dict[str, int]:
    return {"bytes": 0}


@pytest.fixture
def s3_service(
    s3_env: dict[str, str], proxy: FaultProxy, tmp_path: Path, clock: Clock, counts: dict[str, int]
) -> Iterator[Any]:
    """The service on the S3 test server (through ``proxy``), its request bodies counted, two API keys."""
    keys = {name: {"sha256": token_hash(token), "scopes": ["upload", "read"]} for name, token in TOKENS.items()}
    settings = direct_settings(tmp_path, s3_endpoint_url=proxy.url, api_keys=keys)
    app = create_app(settings, clock=clock)
    app.add_middleware(BodyCounter, counts=counts)
    with serving(app, settings) as live:
        yield live


def client_for(live: Any, who: str = "alice", connections: int = 2) -> AsyncTransferClient:
    return AsyncTransferClient(live.url, api_key=TOKENS[who], options=ResolveOptions(connections=connections))


def http_for(live: Any, who: str = "alice") -> httpx.Client:
    return httpx.Client(base_url=live.url, timeout=60, headers={"authorization": f"Bearer {TOKENS[who]}"})


def part_puts(proxy: FaultProxy) -> list[int]:
    """Part numbers of the UploadPart requests the bucket received through the proxy for uploads, in order (the
    backend's start-up probes of its engine, under ``<prefix>probe/``, are not uploads)."""
    return [
        int(parse_qs(urlsplit(t).query)["partNumber"][0])
        for op, t in proxy.targets
        if op == "UploadPart" and "/probe/" not in urlsplit(t).path
    ]


def put_part(http: httpx.Client, pid: str, number: int, data: bytes) -> httpx.Response:
    r = http.post(f"/v1/direct/{pid}/parts", json={"parts": [{"number": number, "sha256": sha_hex(data)}]})
    assert r.status_code == 200, r.text
    target = r.json()["parts"][0]
    assert target["method"] == "PUT" and "x-amz-checksum-sha256" in target["headers"]
    return httpx.put(target["url"], content=data, headers=target["headers"])


def refused_by_bucket(http: httpx.Client, pid: str, number: int, data: bytes) -> bool:
    """Whether the bucket refused the part: 403 (its length does not match the signed Content-Length), or a
    connection closed before the body was sent (a server that answers the signature check before reading it)."""
    try:
        return put_part(http, pid, number, data).status_code == 403
    except (httpx.RemoteProtocolError, httpx.WriteError, httpx.ReadError):
        return True


def bucket_keys(endpoint: Any, bucket: str) -> list[str]:
    return [o["Key"] for o in s3_client(endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])]


@pytest.mark.s3
@pytest.mark.anyio
async def test_direct_upload_no_payload_through_the_service(
    s3_service: Any, proxy: FaultProxy, counts: dict[str, int], s3_endpoint: Any, s3_bucket: str, tmp_path: Path
) -> None:
    """24 MiB + 3 bytes in 5 parts (5 MiB part size of the test settings) straight to the bucket: the service's
    process receives only the small JSON control bodies, and the file resolves with the right SHA-256."""
    data = os.urandom(24 * MiB + 3)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    async with client_for(s3_service) as client:
        descriptor = await client.upload_direct(path, remember=tmp_path / "state")
        assert descriptor.checksum == "sha256:" + sha_hex(data) and descriptor.size == len(data)
        assert await client.resolve(descriptor) == data
    assert sorted(part_puts(proxy)) == [1, 2, 3, 4, 5]
    assert counts["bytes"] < 4096, counts  # plan, 5 URL requests, completion: JSON only, no payload
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []
    assert list((tmp_path / "state").iterdir()) == []  # the finished plan is forgotten


@pytest.mark.s3
@pytest.mark.anyio
async def test_killed_at_half_resumes_without_resending_stored_parts(
    s3_service: Any, proxy: FaultProxy, tmp_path: Path
) -> None:
    """The client dies after 4 of 9 parts (an injected fault, one part at a time); a rerun asks which parts the
    bucket holds and sends exactly the other 5 (counted at the bucket's door); the SHA-256 is right."""
    data = os.urandom(40 * MiB + 11)  # 9 parts of 5 MiB
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    state = tmp_path / "state"

    class Killed(Exception):
        pass

    stored: list[int] = []

    def die_after_four(number: int) -> None:
        stored.append(number)
        if len(stored) == 4:
            raise Killed

    async with client_for(s3_service, connections=1) as client:
        with pytest.raises(Killed):
            await client.upload_direct(path, remember=state, on_part_stored=die_after_four)
    first = part_puts(proxy)
    assert first == [1, 2, 3, 4]
    proxy.targets.clear()
    async with client_for(s3_service, connections=3) as client:
        descriptor = await client.upload_direct(path, remember=state)
        assert descriptor.checksum == "sha256:" + sha_hex(data)
        assert await client.resolve(descriptor) == data
    assert sorted(part_puts(proxy)) == [5, 6, 7, 8, 9]


@pytest.mark.s3
@pytest.mark.anyio
async def test_part_changed_in_flight_is_refused_by_the_bucket_and_sent_again(
    s3_service: Any, proxy: FaultProxy, tmp_path: Path
) -> None:
    """A bit flipped on the wire: the bucket checks the part against the SHA-256 signed into its URL and refuses it
    (BadDigest); the client sends it again and the file is right."""
    data = os.urandom(11 * MiB)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    proxy.add("UploadPart", "flip", times=1)
    async with client_for(s3_service, connections=1) as client:
        descriptor = await client.upload_direct(path)
        assert await client.resolve(descriptor) == data
    assert ("UploadPart", "flip") in proxy.log
    assert part_puts(proxy) == [1, 1, 2, 3]  # the refused part once more, nothing else


@pytest.mark.s3
@pytest.mark.anyio
async def test_corrupted_part_refuses_completion_and_publishes_nothing(
    s3_service: Any, s3_endpoint: Any, s3_bucket: str, tmp_path: Path
) -> None:
    """Part 2 corrupted before the client hashed it (a bad read): the bucket takes it (its checksum matches the
    corrupted bytes), but the whole-file SHA-256 read back at completion does not match the declared one: 422
    checksum_mismatch, no file, no multipart upload, no bytes left, the plan aborted; a rerun starts afresh."""
    data = os.urandom(12 * MiB)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    state = tmp_path / "state"

    def flip(number: int, part: bytes) -> bytes:
        return part if number != 2 else part[:100] + bytes([part[100] ^ 0x80]) + part[101:]

    async with client_for(s3_service) as client:
        with pytest.raises(ChecksumMismatch):
            await client.upload_direct(path, remember=state, part_filter=flip)
    with http_for(s3_service) as http:
        assert http.get("/v1/files").json()["files"] == []
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []
    assert [k for k in bucket_keys(s3_endpoint, s3_bucket) if "files/" in k] == []
    assert list(state.iterdir()) == []
    async with client_for(s3_service) as client:
        descriptor = await client.upload_direct(path, remember=state)
        assert await client.resolve(descriptor) == data


@pytest.mark.s3
def test_completion_checks_every_part(s3_service: Any) -> None:
    """Missing parts are refused with 409 plan_incomplete naming them; a part of the wrong length is refused by the
    bucket itself (its URL signs its Content-Length as well as its SHA-256), so it is never stored; sent properly,
    the same plan completes. A declared checksum is kept."""
    data = os.urandom(10 * MiB + 5)
    with http_for(s3_service) as http:
        plan = http.post("/v1/direct", json={"size": len(data), "checksum": sha_hex(data)}).json()
        pid, ps = plan["id"], plan["part_size"]
        assert plan["part_count"] == 3
        assert refused_by_bucket(http, pid, 1, data[: ps - 1])  # one byte short: the signature does not match
        assert put_part(http, pid, 3, data[2 * ps :]).status_code == 200
        r = http.post(f"/v1/direct/{pid}/complete", json={})
        assert r.status_code == 409 and r.json()["error"]["code"] == "plan_incomplete"
        assert r.json()["error"]["detail"]["missing"] == [1, 2]
        assert http.get(f"/v1/direct/{pid}").json()["missing"] == [1, 2]
        assert put_part(http, pid, 1, data[:ps]).status_code == 200
        assert put_part(http, pid, 2, data[ps : 2 * ps]).status_code == 200
        r = http.post(f"/v1/direct/{pid}/complete", json={})
        assert r.status_code == 200, r.text
        assert r.json()["checksum"] == "sha256:" + sha_hex(data)
        again = http.post(f"/v1/direct/{pid}/complete", json={})  # a retried completion gets the same file
        assert again.status_code == 200 and again.json()["metadata"] == r.json()["metadata"]
        bad = http.post(f"/v1/direct/{pid}/parts", json={"parts": [{"number": 4, "sha256": "0" * 64}]})
        assert bad.status_code == 400


@pytest.mark.s3
def test_a_part_longer_than_its_plan_is_refused_by_the_bucket(s3_service: Any) -> None:
    """A plan for one byte: a 2 MiB part with its own SHA-256 does not match its URL's signed Content-Length, so
    the bucket refuses it and stores nothing (it used to take any length, kept for the plan's lifetime)."""
    big = os.urandom(2 * MiB)
    with http_for(s3_service) as http:
        pid = http.post("/v1/direct", json={"size": 1}).json()["id"]
        assert refused_by_bucket(http, pid, 1, big)
        assert http.get(f"/v1/direct/{pid}").json()["missing"] == [1]
        assert put_part(http, pid, 1, b"x").status_code == 200
        assert http.get(f"/v1/direct/{pid}").json()["missing"] == []


@pytest.mark.s3
def test_a_key_may_hold_only_so_many_open_plans(s3_env: dict[str, str], tmp_path: Path, clock: Clock) -> None:
    """TRANSFER_MAX_OPEN_DIRECT_PLANS_PER_KEY: the plan beyond the limit is 429 too_many_plans; an aborted plan
    frees its slot; another key has slots of its own."""
    keys = {name: {"sha256": token_hash(token), "scopes": ["upload", "read"]} for name, token in TOKENS.items()}
    settings = direct_settings(tmp_path, api_keys=keys, max_open_direct_plans_per_key=2)
    with serving(create_app(settings, clock=clock), settings) as live:
        with http_for(live, "alice") as alice, http_for(live, "bob") as bob:
            pids = [alice.post("/v1/direct", json={"size": 10}).json()["id"] for _ in range(2)]
            r = alice.post("/v1/direct", json={"size": 10})
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_plans", r.text
            assert r.json()["error"]["detail"]["limit"] == 2
            assert bob.post("/v1/direct", json={"size": 10}).status_code == 201
            assert alice.delete(f"/v1/direct/{pids[0]}").status_code == 204
            assert alice.post("/v1/direct", json={"size": 10}).status_code == 201


@pytest.mark.s3
def test_plans_are_owned(s3_service: Any) -> None:
    """Another key gets 404 for every plan operation, as for a plan that does not exist."""
    with http_for(s3_service, "alice") as alice, http_for(s3_service, "bob") as bob:
        pid = alice.post("/v1/direct", json={"size": 10}).json()["id"]
        for response in (
            bob.get(f"/v1/direct/{pid}"),
            bob.post(f"/v1/direct/{pid}/parts", json={"parts": [{"number": 1, "sha256": "a" * 64}]}),
            bob.post(f"/v1/direct/{pid}/complete", json={"checksum": "a" * 64}),
            bob.delete(f"/v1/direct/{pid}"),
        ):
            assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", response.text
        assert alice.get(f"/v1/direct/{pid}").status_code == 200
        parts = {"parts": [{"number": 1, "sha256": "a" * 64}]}
        assert alice.post(f"/v1/direct/{pid}/parts", json=parts).status_code == 200  # the plan is cached now
        assert alice.delete(f"/v1/direct/{pid}").status_code == 204
        assert alice.get(f"/v1/direct/{pid}").status_code == 410
        refused = alice.post(f"/v1/direct/{pid}/parts", json=parts)  # an aborted plan hands out no part URLs
        assert refused.status_code == 410 and refused.json()["error"]["code"] == "gone", refused.text


@pytest.mark.s3
@pytest.mark.anyio
async def test_expired_plans_are_swept(
    s3_service: Any, clock: Clock, s3_endpoint: Any, s3_bucket: str, tmp_path: Path
) -> None:
    """An abandoned plan: after its expiry the sweep aborts its multipart upload and deletes its record; the
    abandoned-multipart sweep sees direct uploads too (same ``data/`` prefix)."""
    data = os.urandom(6 * MiB)
    with http_for(s3_service) as http:
        pid = http.post("/v1/direct", json={"size": len(data)}).json()["id"]
        assert put_part(http, pid, 1, data[: 5 * MiB]).status_code == 200
        second = http.post("/v1/direct", json={"size": 1}).json()["id"]
    assert len(in_progress_uploads(s3_endpoint, s3_bucket)) == 2
    services = s3_service.app.state.services  # the app's own: its clock is the test's
    storage = services.files.storage
    assert await services.uploads.sweep() == 0  # not expired yet
    clock.advance(s3_service.settings.session_ttl + 1)
    assert await services.uploads.sweep() == 2
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []
    with http_for(s3_service) as http:
        assert http.get(f"/v1/direct/{pid}").status_code == 404
        assert http.get(f"/v1/direct/{second}").status_code == 404
        http.post("/v1/direct", json={"size": 1})
    assert await storage.abort_abandoned_uploads(0) == 1


def test_local_storage_answers_unsupported(live_server: Any, tmp_path: Path) -> None:
    """Local storage cannot take parts directly: 409 direct_upload_unsupported, and the CLI's automatic choice
    falls back to the ordinary upload."""
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        r = http.post("/v1/direct", json={"size": 100})
        assert r.status_code == 409 and r.json()["error"]["code"] == "direct_upload_unsupported"
        assert http.get("/v1/direct/d_" + "0" * 32).status_code == 409
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 1000)

    async def attempt() -> None:
        async with AsyncTransferClient(live_server.url) as client:
            with pytest.raises(DirectUploadUnsupported):
                await client.upload_direct(path)

    asyncio.run(attempt())
    cli = [sys.executable, "-m", "transfer", "upload", str(path), "--direct", "--server", live_server.url]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "cannot take direct uploads" in done.stderr
    assert json.loads(done.stdout)["checksum"] == "sha256:" + sha_hex(b"x" * 1000)


@pytest.fixture
def s3_direct_service(s3_env: dict[str, str], tmp_path: Path, counts: dict[str, int]) -> Iterator[Any]:
    """The service straight on the S3 test server (no proxy: large bodies), its request bodies counted."""
    settings = direct_settings(tmp_path, s3_part_size=16 * MiB)
    app = create_app(settings)
    app.add_middleware(BodyCounter, counts=counts)
    with serving(app, settings) as live:
        yield live


def write_random(path: Path, size: int) -> str:
    """A file of ``size`` pseudo-random bytes, written in 8 MiB pieces; returns its SHA-256 hex."""
    sha = hashlib.sha256()
    block = os.urandom(8 * MiB)
    with open(path, "wb") as f:
        for i, start in enumerate(range(0, size, len(block))):
            piece = (i.to_bytes(8, "big") + block[8:])[: size - start]  # every piece differs
            sha.update(piece)
            f.write(piece)
    return sha.hexdigest()


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.anyio
async def test_one_gibibyte_through_direct_parts(
    s3_direct_service: Any, counts: dict[str, int], s3_endpoint: Any, s3_bucket: str, tmp_path: Path
) -> None:
    """The issue's figure: 1 GiB in 64 parts of 16 MiB straight to the bucket, 4 in parallel; the service receives
    no payload byte, and the stored object read back from the bucket has the file's SHA-256."""
    path = tmp_path / "gib.bin"
    expected = write_random(path, 1 << 30)
    async with AsyncTransferClient(s3_direct_service.url, options=ResolveOptions(connections=4)) as client:
        descriptor = await client.upload_direct(path)
    path.unlink()
    assert descriptor.checksum == "sha256:" + expected and descriptor.size == 1 << 30
    assert counts["bytes"] < 64 * 1024, counts  # 64 URL requests, plan, completion: JSON only
    key = f"data/files/{(descriptor.metadata or {})['file_id']}"
    body = s3_client(s3_endpoint).get_object(Bucket=s3_bucket, Key=key)["Body"]
    sha = hashlib.sha256()
    while chunk := body.read(8 * MiB):
        sha.update(chunk)
    assert sha.hexdigest() == expected
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []


@pytest.mark.s3
def test_cli_process_killed_mid_upload_resumes(s3_service: Any, proxy: FaultProxy, tmp_path: Path) -> None:
    """`transfer upload --direct` as a real process, SIGKILLed while part 5 of 9 is on the wire (the proxy holds
    it), then run again: it sends parts 5-9 only, and the descriptor it prints has the file's SHA-256."""
    data = os.urandom(40 * MiB + 11)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    proxy.stall_seconds = 120
    proxy.add("UploadPart", "forward", times=4)  # not a fault: forwarded and logged as such
    proxy.add("UploadPart", "stall", times=1)
    env = {**os.environ, "TRANSFER_API_KEY": TOKENS["alice"]}
    args = [sys.executable, "-m", "transfer", "upload", str(path), "--direct", "--no-progress"]
    args += ["--server", s3_service.url, "--connections", "1", "--state-dir", str(tmp_path / "state")]
    first = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        while ("UploadPart", "stall") not in proxy.log:
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
    finally:
        first.kill()
        first.communicate()
    assert part_puts(proxy) == [1, 2, 3, 4, 5]
    proxy.targets.clear()
    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["checksum"] == "sha256:" + sha_hex(data)
    assert sorted(part_puts(proxy)) == [5, 6, 7, 8, 9]
