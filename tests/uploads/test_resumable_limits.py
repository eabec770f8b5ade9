"""``Upload-Limit`` at /v1/uploads (draft-ietf-httpbis-resumable-upload §"Limits"): every member the draft defines is
announced and enforced on a real server — the append sizes as the body arrives (a request past ``max-append-size``
keeps nothing, one below ``min-append-size`` that does not complete the upload neither), ``min-size`` without an
upload resource, ``max-age`` counting down — and every refusal for a limit answers the limits and the offset."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Clock, LiveServer, running
from tests.uploads.test_resumable import RawClient
from transfer.core.http.resumable import UploadLimits, boolean_item, parse_upload_limit
from transfer.settings import Settings

KiB, MiB = 1 << 10, 1 << 20
V9 = {"upload-draft-interop-version": "9"}
PARTIAL = {"content-type": "application/partial-upload"}
LIMITS = {
    "resumable_min_size": 10_000,
    "resumable_max_append_size": MiB,
    "resumable_min_append_size": 64 * KiB,
    "max_upload_size": 8 * MiB,
}


@pytest.fixture
def limited(tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, **LIMITS)
    with running(settings, clock) as live:
        yield live


def announced(response: httpx.Response) -> UploadLimits:
    limits = parse_upload_limit(response.headers.get("upload-limit"))
    assert limits is not None, response.headers
    return limits


def create(live: LiveServer, length: int) -> str:
    """A careful creation (no content): the draft exempts it from min-append-size."""
    created = httpx.post(
        live.url + "/v1/uploads", headers={**V9, "upload-complete": "?0", "upload-length": str(length)}, content=b""
    )
    assert created.status_code == 201, created.text
    return created.headers["location"]


def offset_of(location: str) -> int:
    head = httpx.head(location, headers=V9)
    assert head.status_code == 204, head.text
    return int(head.headers["upload-offset"])


def pieces(data: bytes, size: int = 64 * KiB) -> Iterator[bytes]:
    """A body without Content-Length (chunked): its size is known only as it arrives."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_every_member_is_announced_and_max_age_counts_down(limited: LiveServer, clock: Clock) -> None:
    options = httpx.options(limited.url + "/v1/uploads", headers=V9)
    assert announced(options) == UploadLimits(
        max_size=8 * MiB, min_size=10_000, max_append_size=MiB, min_append_size=64 * KiB, max_age=24 * 3600
    )
    location = create(limited, 3 * MiB)
    clock.advance(1000)
    assert announced(httpx.head(location, headers=V9)).max_age == 24 * 3600 - 1000


def test_above_max_append_size_with_content_length_is_refused_before_the_body(limited: LiveServer) -> None:
    client = RawClient(limited.url)
    client.send_head(
        "POST", "/v1/uploads", {**V9, "upload-complete": "?1", "content-length": str(2 * MiB), "expect": "100-continue"}
    )
    first = client.read_message()  # no 104 and no 100 Continue: refused on the header fields alone
    client.close()
    assert first.status == 413
    assert json.loads(first.body)["code"] == "append_too_large"
    assert parse_upload_limit(first.headers["upload-limit"]) == announced(
        httpx.options(limited.url + "/v1/uploads", headers=V9)
    )
    assert boolean_item(first.headers["upload-complete"]) is False
    assert not [k for k in limited.objects() if k.startswith("tus/")]


def test_above_max_append_size_as_the_body_arrives_keeps_nothing(limited: LiveServer) -> None:
    location = create(limited, 3 * MiB)
    data = os.urandom(3 * MiB)
    first = httpx.patch(
        location, headers={**V9, **PARTIAL, "upload-offset": "0", "upload-complete": "?0"}, content=data[:MiB]
    )
    assert first.status_code == 204 and first.headers["upload-offset"] == str(MiB)
    over = httpx.patch(
        location,
        headers={**V9, **PARTIAL, "upload-offset": str(MiB), "upload-complete": "?0"},
        content=pieces(data[MiB : MiB + MiB + 100 * KiB]),
        timeout=30,
    )
    assert over.status_code == 413 and over.json()["code"] == "append_too_large"
    assert over.headers["upload-offset"] == str(MiB) and "max-append-size=1048576" in over.headers["upload-limit"]
    assert offset_of(location) == MiB  # none of the refused request's bytes were kept
    for start in (MiB, 2 * MiB):  # within the limit, the upload goes on
        last = start + MiB == len(data)
        done = httpx.patch(
            location,
            headers={**V9, **PARTIAL, "upload-offset": str(start), "upload-complete": "?1" if last else "?0"},
            content=data[start : start + MiB],
        )
    assert done.status_code == 201 and done.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()


def test_below_min_append_size_only_the_last_request_may_be(limited: LiveServer) -> None:
    data = os.urandom(200 * KiB)
    location = create(limited, len(data))  # a creation without content is exempt
    small = {**V9, **PARTIAL, "upload-offset": "0", "upload-complete": "?0"}
    known = httpx.patch(location, headers=small, content=data[: 10 * KiB])  # Content-Length: refused up front
    assert known.status_code == 400 and known.json()["code"] == "append_too_small"
    assert known.headers["upload-offset"] == "0" and "min-append-size=65536" in known.headers["upload-limit"]
    chunked = httpx.patch(location, headers=small, content=pieces(data[: 10 * KiB], 4 * KiB))  # at the body's end
    assert chunked.status_code == 400 and chunked.json()["code"] == "append_too_small"
    assert offset_of(location) == 0
    enough = httpx.patch(location, headers=small, content=pieces(data[: 150 * KiB]))
    assert enough.status_code == 204 and enough.headers["upload-offset"] == str(150 * KiB)
    last = httpx.patch(  # 50 KiB, below min-append-size, but it completes the upload
        location,
        headers={**V9, **PARTIAL, "upload-offset": str(150 * KiB), "upload-complete": "?1"},
        content=data[150 * KiB :],
    )
    assert last.status_code == 201 and last.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()


def test_below_min_size_no_upload_resource(limited: LiveServer) -> None:
    """§"Limits" min-size: no upload resource below it (nor without a length); sent whole, the representation is
    taken in one request (no 104, no Location), else refused with the limits."""
    data = os.urandom(5000)
    client = RawClient(limited.url)
    client.send_head("POST", "/v1/uploads", {**V9, "upload-complete": "?1", "content-length": str(len(data))})
    client.send(data)
    first = client.read_message()
    client.close()
    assert first.status == 201 and "location" not in first.headers  # no 104 came first: nothing to resume
    descriptor = json.loads(first.body)
    assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert boolean_item(first.headers["upload-complete"]) is True
    assert not [k for k in limited.objects() if k.startswith("tus/")]
    for length in ({"upload-length": "5000"}, {}):
        refused = httpx.post(
            limited.url + "/v1/uploads", headers={**V9, "upload-complete": "?0", **length}, content=data[:100]
        )
        assert refused.status_code == 400 and refused.json()["code"] == "upload_below_min_size"
        assert announced(refused).min_size == 10_000


def test_more_than_the_declared_length_cancels_the_upload(limited: LiveServer) -> None:
    """§"Upload Append": the offset may not exceed the length; the request is refused and the upload resource
    marked invalid (every later interaction refused)."""
    location = create(limited, 100 * KiB)
    over = httpx.patch(
        location,
        headers={**V9, **PARTIAL, "upload-offset": "0", "upload-complete": "?0"},
        content=pieces(os.urandom(150 * KiB)),
    )
    assert over.status_code == 413 and over.json()["code"] == "payload_too_large"
    assert httpx.head(location, headers=V9).status_code == 410


def test_upload_limit_parsing_follows_the_draft() -> None:
    assert parse_upload_limit("max-size=10, x-future=?1, max-age=5") == UploadLimits(max_size=10, max_age=5)
    assert parse_upload_limit('max-size="10"') is None  # a known member of the wrong type: the field is ignored
    assert parse_upload_limit("max-size=-1") is None and parse_upload_limit("max-size=1.5") is None
    assert parse_upload_limit("10") is None and parse_upload_limit(None) is None
    assert UploadLimits().header() == "min-size=0"  # never empty
    limits = UploadLimits(max_size=1, min_size=0, max_append_size=2, min_append_size=1, max_age=3)
    assert parse_upload_limit(limits.header()) == limits
