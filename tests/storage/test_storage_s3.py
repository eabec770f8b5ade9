"""The S3 backend against real S3 engines — Swift's s3api (or the endpoint in ``TRANSFER_TEST_S3_ENDPOINT``) and
Ceph's RADOS Gateway 16.2 and 20.2, all started by the test session — every test on each: the conformance suite
unchanged, multipart boundaries, aborts that leave no multipart upload behind, presigned URLs the server itself
checks, and clear start-up errors."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from storage.errors import BackendUnavailable, ObjectChanged, ObjectNotFound
from storage.parts import MAX_PART_SIZE, MIN_PART_SIZE, plan_part_size
from storage.s3 import S3Config, S3Storage
from tests.conftest import ENGINES, engine_endpoint, in_progress_uploads, s3_client, s3_config
from tests.storage_conformance import StorageConformance, put, read_all

pytestmark = [pytest.mark.anyio, pytest.mark.s3]
MiB = 1 << 20


@pytest.fixture(params=ENGINES)
def s3_endpoint(request: pytest.FixtureRequest) -> Any:
    """Every test of this module on each engine."""
    return engine_endpoint(request, request.param)


@pytest.fixture
async def storage(s3_endpoint: Any, s3_bucket: str) -> AsyncIterator[S3Storage]:
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB, buffer_size=256 << 10))
    await backend.start()
    yield backend
    await backend.close()
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []  # no test leaves a multipart upload behind


class TestS3Conformance(StorageConformance):
    pass


def etag_parts(endpoint: Any, bucket: str, storage: S3Storage, key: str) -> int:
    etag = s3_client(endpoint).head_object(Bucket=bucket, Key=storage.data_key(key))["ETag"].strip('"')
    return int(etag.rsplit("-", 1)[1]) if "-" in etag else 1


@pytest.mark.parametrize(("size", "parts"), [(5 * MiB - 1, 1), (5 * MiB, 1), (5 * MiB + 1, 2), (15 * MiB + 3, 4)])
async def test_multipart_boundaries(
    storage: S3Storage, s3_endpoint: Any, s3_bucket: str, size: int, parts: int
) -> None:
    data = os.urandom(size)
    await put(storage, "files/m", data)
    assert await read_all(storage, "files/m") == data
    assert await read_all(storage, "files/m", size - 10, size + 10) == data[-10:]
    assert etag_parts(s3_endpoint, s3_bucket, storage, "files/m") == parts


async def test_parts_over_plain_http_are_proven_by_their_signed_sha256_alone(storage: S3Storage) -> None:
    """The test engines listen on plain HTTP, where SigV4 signs each part's SHA-256 and the engine checks it: no
    CRC32 is computed beside it. The signed hash is the part's real one (a part whose bytes changed on the way
    would be refused), and an HTTPS endpoint keeps botocore's CRC32, the only per-part check there."""
    import hashlib

    from storage.s3.client import _checksum_calculation

    sent: list[tuple[dict[str, str], bytes]] = []

    def seen(request: Any, **_: Any) -> None:
        sent.append(
            (
                {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()},
                bytes(request.body),
            )
        )

    storage.client.meta.events.register("before-send.s3.UploadPart", seen)
    data = os.urandom(5 * MiB + 1)
    await put(storage, "files/signed", data)
    assert await read_all(storage, "files/signed") == data
    assert len(sent) == 2
    for headers, body in sent:
        assert headers["x-amz-content-sha256"] == hashlib.sha256(body).hexdigest()
        assert not [name for name in headers if name.startswith("x-amz-checksum-")]
    assert _checksum_calculation("https://s3.example.com") == "when_supported"
    assert _checksum_calculation("HTTP://10.0.0.5:9000") == "when_required"


async def test_failure_mid_upload_aborts_the_multipart_upload(
    storage: S3Storage, s3_endpoint: Any, s3_bucket: str
) -> None:
    with pytest.raises(RuntimeError):
        async with storage.create("files/fail") as writer:
            await writer.write(os.urandom(12 * MiB))
            assert in_progress_uploads(s3_endpoint, s3_bucket) != []  # parts were really on their way
            raise RuntimeError("checksum mismatch upstream")
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []
    with pytest.raises(ObjectNotFound):
        await storage.stat("files/fail")


async def test_cancelled_upload_is_aborted(storage: S3Storage, s3_endpoint: Any, s3_bucket: str) -> None:
    started = asyncio.Event()

    async def upload() -> None:
        async with storage.create("files/cancel") as writer:
            for _ in range(100):
                await writer.write(os.urandom(MiB))
                started.set()
            await writer.commit({})

    task = asyncio.create_task(upload())
    await started.wait()
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []
    assert [i.key async for i in storage.list()] == []


async def test_part_buffers_bound_memory(s3_endpoint: Any, s3_bucket: str) -> None:
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB, part_buffers=2))
    await backend.start()
    writer = backend.create("files/bounded", size_hint=40 * MiB)
    for _ in range(40):
        await writer.write(b"z" * MiB)
        in_flight = sum(not t.done() for t in writer._tasks)
        assert in_flight <= 2 and len(writer._buf) <= 5 * MiB  # at most 2 parts + 1 buffer in memory
    await writer.commit({})
    assert (await backend.stat("files/bounded")).size == 40 * MiB
    await backend.close()


async def test_presigned_urls_are_checked_by_the_server(storage: S3Storage) -> None:
    data = os.urandom(MiB)
    await put(storage, "files/p", data)
    await put(storage, "files/q", b"other")
    url = await storage.presign_get("files/p", expires_in=60, content_type="image/png")
    async with httpx.AsyncClient() as http:
        r = await http.get(url)
        assert r.status_code == 200 and r.content == data and r.headers["content-type"] == "image/png"
        r = await http.get(url, headers={"range": "bytes=10-19"})
        assert r.status_code == 206 and r.content == data[10:20]
        sig_at = url.index("X-Amz-Signature=") + len("X-Amz-Signature=")
        tampered = url[:sig_at] + ("0" if url[sig_at] != "0" else "1") + url[sig_at + 1 :]
        assert (await http.get(tampered)).status_code == 403
        other_key = url.replace("/data/files/p?", "/data/files/q?")
        assert (await http.get(other_key)).status_code == 403
        short = await storage.presign_get("files/p", expires_in=1)
        await asyncio.sleep(2.1)
        assert (await http.get(short)).status_code == 403
    assert "X-Amz-Expires=604800" in await storage.presign_get("files/p", expires_in=30 * 86400)  # capped at 7 days


async def test_startup_errors_are_clear(s3_endpoint: Any, s3_bucket: str) -> None:
    missing = S3Storage(s3_config(s3_endpoint, "no-such-bucket-here", max_attempts=1))
    with pytest.raises(BackendUnavailable, match="does not exist|access denied"):
        await missing.start()
    wrong = S3Storage(
        S3Config(
            bucket=s3_bucket,
            endpoint_url=s3_endpoint.url,
            region=s3_endpoint.region,
            access_key_id="test:x",
            secret_access_key="wrong",
            addressing_style="path",
            max_attempts=1,
        )
    )
    with pytest.raises(BackendUnavailable, match="access denied"):
        await wrong.start()
    unreachable = S3Storage(
        S3Config(
            bucket=s3_bucket,
            endpoint_url="http://127.0.0.1:9",
            access_key_id="a",
            secret_access_key="b",
            region="us-east-1",
            addressing_style="path",
            max_attempts=1,
            connect_timeout=1,
        )
    )
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="cannot reach"):
        await unreachable.start()
    assert time.monotonic() - started < 30
    for backend in (missing, wrong, unreachable):
        await backend.close()


@pytest.mark.parametrize(
    ("size", "preferred", "expected"),
    [
        (0, 8 * MiB, 8 * MiB),
        (5 * MiB, 5 * MiB, 5 * MiB),
        (10_000 * 8 * MiB, 8 * MiB, 8 * MiB),  # exactly 10,000 parts
        (10_000 * 8 * MiB + 1, 8 * MiB, 9 * MiB),  # one byte more: the part size grows (whole MiB)
        (1 << 40, 8 * MiB, 105 * MiB),  # 1 TiB needs ~104.9 MiB parts
        (10_000 * MAX_PART_SIZE, 8 * MiB, MAX_PART_SIZE),
        (None, 8 * MiB, 8 * MiB),  # unknown size, planned for max_size = 64 GiB: 6.6 MiB < 8 MiB
    ],
)
def test_plan_part_size_boundaries(size: int | None, preferred: int, expected: int) -> None:
    part = plan_part_size(size, max_size=64 << 30, preferred=preferred)
    assert part == expected
    total = size if size is not None else 64 << 30
    assert MIN_PART_SIZE <= part <= MAX_PART_SIZE and -(-total // part) <= 10_000


def test_plan_part_size_limits() -> None:
    with pytest.raises(ValueError):
        plan_part_size(10, max_size=100, preferred=MiB)
    from storage.errors import ObjectTooLarge

    with pytest.raises(ObjectTooLarge):
        plan_part_size(10_000 * MAX_PART_SIZE + 1, max_size=0)
    assert plan_part_size(None, max_size=1 << 40) == 105 * MiB  # unknown size planned for the largest allowed


async def test_list_is_one_request_per_page_without_metadata_reads(storage: S3Storage) -> None:
    """ListObjectsV2 with Prefix/StartAfter/MaxKeys: one call per page, no HeadObject or metadata GET per key."""
    for i in range(7):
        await put(storage, f"n/{i}", b"x")
    calls: list[str] = []
    storage.client.meta.events.register("before-call.s3", lambda model, **_: calls.append(model.name))
    page = [i async for i in storage.list("n/", start_after="n/2", limit=3)]
    assert [(i.key, i.size, dict(i.metadata)) for i in page] == [("n/3", 1, {}), ("n/4", 1, {}), ("n/5", 1, {})]
    assert calls == ["ListObjectsV2"]
    calls.clear()
    assert [i.key async for i in storage.list("n/", start_after="n/5", metadata=True)] == ["n/6"]
    assert calls == ["ListObjectsV2", "GetObject"]


async def test_copy_range_keeps_the_part_minimum(storage: S3Storage, s3_endpoint: Any, s3_bucket: str) -> None:
    """A copied part and the written part before it are each at least 5 MiB: the writer says how much of a range
    must be written first (the lead), refuses a copy that would break the rule, and the object comes out whole."""
    source = os.urandom(16 * MiB)
    await put(storage, "src", source)
    first = os.urandom(MiB)
    async with await storage.open("src") as r, storage.create("out", size_hint=18 * MiB) as w:
        assert w.copy_lead(5 * MiB - 1) is None  # shorter than a part: written, not copied
        assert w.copy_lead(5 * MiB) == 0
        await w.write(first)
        assert w.copy_lead(16 * MiB) == 4 * MiB  # 1 MiB gathered: 4 MiB more before a copy may start
        assert w.copy_lead(9 * MiB - 1) is None  # 4 MiB lead would leave less than a part to copy
        with pytest.raises(ValueError, match="part minimum"):
            await w.copy_range(r, 0, 16 * MiB)
        await w.write(source[: 4 * MiB])
        await w.copy_range(r, 4 * MiB, 16 * MiB)
        await w.write(b"end")
        await w.commit({})
    assert await read_all(storage, "out") == first + source + b"end"
    assert etag_parts(s3_endpoint, s3_bucket, storage, "out") == 3  # 5 MiB written, 12 MiB copied, the end


async def test_copy_range_from_a_source_deleted_meanwhile_fails_the_commit(storage: S3Storage) -> None:
    await put(storage, "src", os.urandom(6 * MiB))
    async with await storage.open("src") as r, storage.create("out", size_hint=6 * MiB) as w:
        await storage.delete("src")
        await w.copy_range(r, 0, 6 * MiB)
        with pytest.raises(ObjectChanged, match="gone"):
            await w.commit({})
    with pytest.raises(ObjectNotFound):
        await storage.stat("out")


async def test_a_put_answered_without_an_etag_names_the_version_there(storage: S3Storage) -> None:
    """Swift answers a PUT that a concurrent, later-stamped PUT of the same key superseded with 202 and no ETag
    (its proxy turns the object servers' 409 into 202: last writer wins); the commit then names what is there (the
    absent header is produced here by a hook on the real client's parsed answer: the race itself is timing)."""

    def drop_etag(parsed: dict[str, Any], **_: Any) -> None:
        parsed.pop("ETag", None)

    storage.client.meta.events.register("after-call.s3.PutObject", drop_etag)
    try:
        async with storage.create("quiet", size_hint=3) as w:
            await w.write(b"abc")
            info = await w.commit({})
    finally:
        storage.client.meta.events.unregister("after-call.s3.PutObject", drop_etag)
    assert info.etag and info.etag == (await storage.stat("quiet")).etag
    assert await read_all(storage, "quiet") == b"abc"
