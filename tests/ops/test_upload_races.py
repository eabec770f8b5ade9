"""The upload conformance suite's race on two replicas over Ceph (A and B, each on its own RADOS Gateway of one
cluster, one bucket): for every door, a completion sent to A and an abort sent to B at the same moment have exactly
one outcome — the file is published and the abort refused, or the upload ends and the completion is refused — never
a 201 and a 204 both. Afterwards nothing stays reserved, the key's usage counts exactly the files published, and the
usage repair finds nothing to fix. (One server, every door: ``tests/uploads/test_upload_conformance.py``.)"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from benchmarks.replicas import serve_unpinned
from devtools.ceph import CephCluster
from devtools.s3server import s3_client
from tests.upload_conformance import Door, chunk_size_for, doors, succeeded, usage
from transfer.core.auth import new_token, token_hash

pytestmark = [pytest.mark.s3, pytest.mark.ceph, pytest.mark.slow, pytest.mark.e2e]

MiB = 1 << 20
OWNER, ADMIN = new_token(), new_token()
LAGS = (0.0, 0.05, 0.25)  # one race per lag per door: the abort at once, or while the completion works


@dataclass
class Pair:
    a: str
    b: str


@pytest.fixture(scope="module")
def pair(ceph: CephCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("races")
    bucket = f"races-{uuid.uuid4().hex[:12]}"
    s3_client(ceph.endpoint).create_bucket(Bucket=bucket)
    keys = {
        "owner": {"sha256": token_hash(OWNER), "scopes": ["upload", "read"], "max_bytes": 1 << 32},
        "admin": {"sha256": token_hash(ADMIN), "scopes": ["admin"]},
    }
    with ExitStack() as stack:
        urls = []
        for i, name in enumerate(("a", "b")):
            gateway = ceph.gateways[i % len(ceph.gateways)]
            env = {
                **os.environ,
                "TRANSFER_STORAGE": "s3",
                "TRANSFER_S3_BUCKET": bucket,
                "TRANSFER_S3_ENDPOINT_URL": gateway.url,
                "TRANSFER_S3_ADDRESSING_STYLE": "path",
                "TRANSFER_S3_PART_SIZE": str(5 * MiB),
                "TRANSFER_SINGLE_REPLICA": "false",
                "AWS_ACCESS_KEY_ID": gateway.access_key,
                "AWS_SECRET_ACCESS_KEY": gateway.secret_key,
                "AWS_REGION": gateway.region,
                "TRANSFER_SIGNING_KEYS": json.dumps({"t": "0123456789abcdef0123"}),
                "TRANSFER_API_KEYS": json.dumps(keys),
                "TRANSFER_ALLOWED_HOSTS": json.dumps(["127.0.0.1"]),
                "TRANSFER_SESSION_GC_INTERVAL": "3600",
            }
            workdir = root / name
            workdir.mkdir()
            url, _pid = stack.enter_context(serve_unpinned(workdir, env))
            urls.append(url)
        yield Pair(urls[0], urls[1])


def _client(url: str, token: str = OWNER) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=60, headers={"authorization": f"Bearer {token}"})


def _race(door: Door, pair: Pair, data: bytes, lag: float) -> tuple[httpx.Response, httpx.Response]:
    """Open on A and send every part but what completes it; then complete on A and, ``lag`` seconds later (while
    the completion is under way: both outcomes happen), abort on B."""
    with _client(pair.a) as a, _client(pair.b) as b:
        opened = door.open(a, data)
        assert opened.response.status_code == 201, (door.name, opened.response.text)
        if door.name == "tus":  # its last PATCH completes it: that PATCH is the completion that races
            door.send(a, opened, data, last=False)

            def complete() -> httpx.Response:
                half = len(data) // 2
                headers = {
                    "tus-resumable": "1.0.0",
                    "upload-offset": str(half),
                    "content-type": "application/offset+octet-stream",
                }
                return a.patch(opened.handle, content=data[half:], headers=headers)

        else:
            door.send(a, opened, data)

            def complete() -> httpx.Response:
                return door.complete(a, opened, data)

        def abort() -> httpx.Response:
            time.sleep(lag)
            return door.abort(b, opened)

        with ThreadPoolExecutor(2) as pool:
            done = pool.submit(complete)
            ended = pool.submit(abort)
            return done.result(), ended.result()


def test_a_completion_racing_an_abort_on_another_replica_has_one_outcome(pair: Pair) -> None:
    with _client(pair.a) as a:
        chunk = chunk_size_for(a)
        before = usage(a)
    published = 0
    outcomes: dict[str, list[str]] = {}
    for door in doors(chunk, s3=True):
        for lag in LAGS:
            data = os.urandom(2 * chunk + 777)
            completed, aborted = _race(door, pair, data, lag)
            won = succeeded(completed) or completed.status_code == 204 and door.name == "tus"
            ended = aborted.status_code == 204
            assert won != ended, (door.name, completed.status_code, completed.text, aborted.status_code, aborted.text)
            if won:
                assert aborted.status_code == 409, (door.name, aborted.status_code, aborted.text)
                published += 1
            else:
                assert completed.status_code in (404, 409, 410), (door.name, completed.status_code, completed.text)
            outcomes.setdefault(door.name, []).append("completed" if won else "aborted")
    with _client(pair.b) as b:
        after = usage(b)
        listed = b.get("/v1/files").json()
        assert after["files"] == before["files"] + published, (outcomes, listed)
        assert after["bytes_reserved"] == 0, outcomes
        assert after["files"] == before["files"] + published, outcomes
    with _client(pair.a, ADMIN) as admin:
        repair = admin.post("/v1/admin/usage/repair")
        assert repair.status_code == 200, repair.text
        report: dict[str, Any] = repair.json()
        assert report["differing"] == 0 and report["unreadable_records"] == 0, report
