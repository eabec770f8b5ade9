"""The service on the S3 backend, end to end: uploads become multipart uploads, downloads pass ranges to S3,
``signed_url`` descriptors are S3 presigned URLs, refused uploads leave no multipart upload, and two replicas
sharing one bucket serve each other's files (nothing lives only in one process). The tests that say something about
the engine run on Swift's s3api and on Ceph's RADOS Gateway."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.e2e import service
from tests.conftest import ON_ENGINES, in_progress_uploads
from tests.uploads.test_api_upload import assert_error
from transfer.client import AsyncTransferClient, ResolveOptions

pytestmark = pytest.mark.s3
MiB = 1 << 20


@pytest.fixture
def replicas(s3_env: dict[str, str], tmp_path: Path) -> Iterator[list[str]]:
    """Two ``transfer serve`` processes on two ports; they share nothing but the bucket and their settings."""
    with ExitStack() as stack:
        urls = []
        for name in ("a", "b"):
            workdir = tmp_path / f"replica-{name}"
            workdir.mkdir()
            url, _pid = stack.enter_context(service(workdir, env={**os.environ, **s3_env}))
            urls.append(url)
        yield urls


@ON_ENGINES
def test_upload_download_ranges_on_s3(replicas: list[str], s3_endpoint: Any, s3_bucket: str) -> None:
    data = os.urandom(12 * MiB + 5)
    with httpx.Client(base_url=replicas[0], timeout=60) as http:
        d = http.post("/v1/files", params={"name": "s3.bin"}, content=data).json()
        assert d["type"] == "url" and d["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
        r = http.get(d["url"])
        assert r.status_code == 200 and r.content == data
        etag = r.headers["etag"]
        r = http.get(d["url"], headers={"range": "bytes=5242870-5242889,-3"})
        assert r.status_code == 206 and r.headers["content-type"].startswith("multipart/byteranges")
        assert data[5242870:5242890] in r.content and data[-3:] in r.content
        assert http.get(d["url"], headers={"if-none-match": etag}).status_code == 304
        assert http.head(d["url"]).headers["content-length"] == str(len(data))
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []


@ON_ENGINES
def test_two_replicas_share_one_bucket(replicas: list[str], tmp_path: Path) -> None:
    a, b = replicas
    data = os.urandom(9 * MiB)
    with httpx.Client(timeout=60) as http:
        d = http.post(f"{a}/v1/files", content=data).json()
        file_id = d["metadata"]["file_id"]
        via_b = d["url"].replace(a, b)  # A's signed URL, served by B: both have the signing keys
        assert http.get(via_b).content == data
        assert http.get(via_b, headers={"range": "bytes=100-199"}).content == data[100:200]
        fresh = http.get(f"{b}/v1/files/{file_id}").json()  # B describes A's upload
        assert fresh["url"].startswith(b) and fresh["checksum"] == d["checksum"]
        assert http.delete(f"{b}/v1/files/{file_id}").status_code == 204
        assert_error(http.get(d["url"]), 404, "not_found")  # deleted through B, gone for A


@pytest.mark.anyio
async def test_resolve_through_the_other_replica(replicas: list[str], tmp_path: Path) -> None:
    a, b = replicas
    data = os.urandom(11 * MiB)
    options = ResolveOptions(parallel_min_size=4 * MiB, connections=4)
    async with AsyncTransferClient(a, options=options) as ca, AsyncTransferClient(b, options=options) as cb:
        d = await ca.upload(data)
        fresh = await cb.describe((d.metadata or {})["file_id"])
        out = await cb.resolve(fresh, tmp_path / "via-b.bin")
    assert Path(out).read_bytes() == data


@ON_ENGINES
def test_signed_url_descriptor_is_an_s3_presigned_url(replicas: list[str], s3_endpoint: Any) -> None:
    data = b"%PDF-1.7 " + os.urandom(2 * MiB)
    with httpx.Client(base_url=replicas[0], timeout=60) as http:
        d = http.post("/v1/files", params={"download_method": "signed_url", "name": "doc.pdf"}, content=data).json()
        assert d["download_method"] == "signed_url" and d["range_supported"] is True
        assert d["url"].startswith(s3_endpoint.url) and "X-Amz-Signature=" in d["url"]
        r = http.get(d["url"], headers={"range": "bytes=0-8"})
        assert r.status_code == 206 and r.content == data[:9]
        assert r.headers["content-type"] == "application/pdf"
        full = http.get(d["url"])
        assert full.content == data and 'filename="doc.pdf"' in full.headers["content-disposition"]
        long_lived = http.get(
            f"/v1/files/{d['metadata']['file_id']}", params={"download_method": "signed_url", "ttl": 30 * 86400}
        ).json()
        expires = datetime.fromisoformat(long_lived["url_expires_at"].replace("Z", "+00:00"))
        assert expires <= datetime.now(UTC) + timedelta(days=7, seconds=5)
        assert "X-Amz-Expires=604800" in long_lived["url"]  # capped at 7 days


def test_refused_uploads_leave_no_multipart_upload(replicas: list[str], s3_endpoint: Any, s3_bucket: str) -> None:
    data = os.urandom(13 * MiB)
    with httpx.Client(base_url=replicas[0], timeout=60) as http:
        bad = http.post("/v1/files", params={"checksum": "sha256:" + "0" * 64}, content=data)
        assert_error(bad, 422, "checksum_mismatch")
        bad = http.post("/v1/files", params={"size": len(data) + 1}, content=data)
        assert_error(bad, 422, "size_mismatch")
        assert http.get("/v1/files").json()["files"] == []
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []


def test_encoded_storage_on_s3(replicas: list[str]) -> None:
    data = b"structured log line\n" * 400_000
    with httpx.Client(base_url=replicas[1], timeout=60) as http:
        d = http.post("/v1/files", params={"encoding": "zstd"}, content=data).json()
        assert d["encoding"] == "zstd" and d["encoded_size"] < len(data) // 10
        with http.stream("GET", d["url"]) as r:
            assert r.headers["content-encoding"] == "zstd"
            assert len(b"".join(r.iter_raw())) == d["encoded_size"]


@pytest.mark.parametrize(
    ("bucket", "endpoint", "message"),
    [("no-such-bucket", None, "does not exist"), (None, "http://127.0.0.1:9", "cannot reach")],
)
def test_serve_refuses_an_unusable_bucket_in_one_line(
    s3_env: dict[str, str], tmp_path: Path, bucket: str | None, endpoint: str | None, message: str
) -> None:
    env = {**os.environ, **s3_env, "AWS_MAX_ATTEMPTS": "1"}
    if bucket:
        env["TRANSFER_S3_BUCKET"] = bucket
    if endpoint:
        env["TRANSFER_S3_ENDPOINT_URL"] = endpoint
    out = subprocess.run(
        [sys.executable, "-m", "transfer", "serve"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("transfer: storage_unavailable:") and message in lines[0]
