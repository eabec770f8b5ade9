"""The S3 requests each upload kind and each download costs, counted on Ceph 16.2 and 20.2 (every call the service's
boto3 client makes, by operation), each held to its release's ceilings in docs/SCALING.md: a change that makes one
of them dearer fails here until the document says so. Run with ``-s`` to see the counts."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash

from devtools.ceph import CephCluster
from devtools.s3server import s3_client
from storage.s3 import S3Storage
from tests.conftest import s3_config, serving
from transfer.core.auth import new_token, token_hash
from transfer.hosts import create_app
from transfer.settings import Settings

pytestmark = [pytest.mark.s3, pytest.mark.ceph, pytest.mark.slow]
MiB = 1 << 20
TOKEN = new_token()
SCALING = Path(__file__).resolve().parents[2] / "docs" / "SCALING.md"


def documented_ceilings(release: str) -> dict[str, int]:
    """The ``| kind | Ceph 16.2 | Ceph 20.2 | ...`` rows of SCALING.md's cost table: each release's ceilings."""
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\d+) \| (\d+) \|", SCALING.read_text(), flags=re.MULTILINE)
    column = {"16.2": 1, "20.2": 2}[release]
    return {row[0]: int(row[column]) for row in rows}


class Counting:
    """Every S3 API call of one storage client, by operation name."""

    def __init__(self, storage: S3Storage) -> None:
        self.calls: Counter[str] = Counter()
        storage.client.meta.events.register("before-call.s3", self._seen)

    def _seen(self, model: Any, **_: Any) -> None:
        self.calls[model.name] += 1

    def take(self) -> Counter[str]:
        """The calls since the last take, once none has come for half a second: work a request leaves behind after
        its response (a cleanup, a record settled in the background) is its cost too, not the next request's."""
        quiet_since, seen = time.monotonic(), sum(self.calls.values())
        while time.monotonic() - quiet_since < 0.5:
            time.sleep(0.05)
            if sum(self.calls.values()) != seen:
                quiet_since, seen = time.monotonic(), sum(self.calls.values())
        taken, self.calls = self.calls, Counter()
        return taken


@pytest.fixture
def counted(ceph: CephCluster, tmp_path: Path) -> Iterator[tuple[httpx.Client, Counting, str]]:
    bucket = "costs-" + os.urandom(4).hex()
    s3_client(ceph.endpoint).create_bucket(Bucket=bucket)
    storage = S3Storage(s3_config(ceph.endpoint, bucket, part_size=5 * MiB))
    settings = Settings(
        data_dir=tmp_path / "data",
        storage="s3",
        s3_bucket=bucket,
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys={"k": {"sha256": token_hash(TOKEN), "scopes": ["upload", "read"], "max_bytes": 1 << 30}},
        single_replica=False,
    )
    counter = Counting(storage)
    with (
        serving(create_app(settings, storage), settings) as live,
        httpx.Client(base_url=live.url, timeout=60, headers={"authorization": f"Bearer {TOKEN}"}) as http,
    ):
        counter.take()  # start-up: probes, signing keys
        yield http, counter, ceph.release


def test_requests_per_upload_kind_and_download(counted: tuple[httpx.Client, Counting, str]) -> None:
    http, counter, release = counted
    seen: dict[str, Counter[str]] = {}
    # a replica that has served a while: the versions of the key's usage shards known (the first request that
    # touches a shard in a process reads it once; 48 uploads touch all 8 but for a 1.3 % chance)
    for _ in range(48):
        assert http.post("/v1/files", content=b"warm").status_code == 201
    counter.take()

    small = os.urandom(100_000)
    r = http.post("/v1/files", content=small)
    assert r.status_code == 201, r.text
    seen["post_small"] = counter.take()

    big = os.urandom(12 * MiB)
    r = http.post("/v1/files", params={"size": len(big)}, content=big)
    assert r.status_code == 201, r.text
    big_url = r.json()["url"]
    seen["post_12mib"] = counter.take()

    got = http.get(big_url)
    assert hashlib.sha256(got.content).digest() == hashlib.sha256(big).digest()
    seen["get_full"] = counter.take()
    assert http.get(big_url, headers={"range": "bytes=100-199"}).content == big[100:200]
    seen["get_range"] = counter.take()

    data = os.urandom(2 * MiB)
    tus = {"tus-resumable": "1.0.0"}
    name = base64.b64encode(b"t.bin").decode()
    created = http.post(
        "/tus/files/", headers={**tus, "upload-length": str(len(data)), "upload-metadata": f"filename {name}"}
    )
    path = httpx.URL(created.headers["location"]).path
    seen["tus_create"] = counter.take()
    for offset in (0, MiB):
        patch = http.patch(
            path,
            content=data[offset : offset + MiB],
            headers={**tus, "upload-offset": str(offset), "content-type": "application/offset+octet-stream"},
        )
        assert patch.status_code == 204, patch.text
        seen["tus_patch_first" if offset == 0 else "tus_patch_last"] = counter.take()

    r = http.post("/v1/uploads", headers={"upload-complete": "?1"}, content=data)
    assert r.status_code == 201, r.text
    seen["ietf_one_request"] = counter.take()

    chunk = 5 * MiB
    body = os.urandom(2 * chunk)
    opened = http.post("/v1/sessions", json={"size": len(body), "chunk_size": chunk})
    sid = opened.json()["streaming_session_id"]
    seen["session_open"] = counter.take()
    for index in range(2):
        piece = body[index * chunk : (index + 1) * chunk]
        put = http.put(
            f"/v1/sessions/{sid}/chunks/{index}",
            content=piece,
            headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(piece)},
        )
        assert put.status_code == 201, put.text
        seen[f"session_chunk_{index}"] = counter.take()
    done = http.post(f"/v1/sessions/{sid}/complete", json={})
    assert done.status_code == 200, done.text
    seen["session_complete"] = counter.take()

    # a chunk larger than a part: a multipart create-if-absent (Ceph 16.2: its key claimed by its metadata first;
    # 20.2: the completion's If-None-Match decides, and the metadata follows)
    large = os.urandom(6 * MiB)
    sid = http.post("/v1/sessions", json={"size": len(large), "chunk_size": len(large)}).json()["streaming_session_id"]
    counter.take()  # the opening, as session_open
    put = http.put(
        f"/v1/sessions/{sid}/chunks/0",
        content=large,
        headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(large)},
    )
    assert put.status_code == 201, put.text
    seen["session_chunk_6mib"] = counter.take()

    direct = os.urandom(2 * chunk)
    plan = http.post("/v1/direct", json={"size": len(direct), "checksum": hashlib.sha256(direct).hexdigest()}).json()
    seen["direct_plan"] = counter.take()
    ps = plan["part_size"]
    assert plan["part_count"] == 2, plan
    for number in (1, 2):
        part = direct[(number - 1) * ps : number * ps]
        asked = http.post(
            f"/v1/direct/{plan['id']}/parts",
            json={"parts": [{"number": number, "sha256": hashlib.sha256(part).hexdigest()}]},
        )
        target = asked.json()["parts"][0]
        assert httpx.put(target["url"], content=part, headers=target["headers"]).status_code == 200
    seen["direct_part_urls_2"] = counter.take()
    done = http.post(f"/v1/direct/{plan['id']}/complete", json={})
    assert done.status_code == 200, done.text
    seen["direct_complete"] = counter.take()

    print(f"\nCeph {release}")
    for kind, calls in seen.items():
        print(f"| `{kind}` | {sum(calls.values())} | {', '.join(f'{op} {n}' for op, n in sorted(calls.items()))} |")
    ceilings = documented_ceilings(release)
    assert set(seen) <= set(ceilings), set(seen) - set(ceilings)
    dearer = {
        kind: (sum(calls.values()), ceilings[kind])
        for kind, calls in seen.items()
        if sum(calls.values()) > ceilings[kind]
    }
    assert dearer == {}, f"dearer on Ceph {release} than docs/SCALING.md says (counted, documented): {dearer}"
