"""What the S3 backend learns of its engine at start-up, and what it does with it, on the engines the tests run:
Swift's s3api (no conditional PUT, a non-atomic create-if-absent), Ceph 16.2 (If-Match compared with the ETag
unquoted, conditions ignored on CompleteMultipartUpload, part checksums stored unchecked) and Ceph 20.2 (the ETag
quoted, conditions honoured on CompleteMultipartUpload, part checksums verified, PutObject's not). Compare-and-set
across Ceph's two gateways loses no update; a large create-if-absent has one winner, with a claim object only where
the completion ignores its condition; a large replace is compared by the completion where the engine does; an engine
without compare-and-set refuses replicas unless told the process runs alone; ``transfer storage check`` prints it
all."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from devtools.ceph import CephCluster
from devtools.s3server import s3_client
from storage.base import Capability, UnsafeForReplicas, replica_hazards
from storage.errors import ObjectChanged, ObjectExists, ObjectNotFound
from storage.s3 import S3Storage
from tests.conftest import ON_ENGINES, in_progress_uploads, s3_config
from tests.storage_conformance import read_all
from transfer.hosts import create_app
from transfer.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.s3]
MiB = 1 << 20

# what the probes must see on each engine the tests start (Swift's race probe of create-if-absent can be won by one
# writer by chance, so its conditional_create is not asserted)
PROFILES: dict[str, dict[str, Any]] = {
    "ceph16": {
        "conditional_create": True,
        "if_match": "unquoted",
        "if_match_missing": 412,
        "get_if_match": "quoted",
        "complete_if_none_match": False,
        "complete_if_match": "ignored",
        "copy_if_match": False,
        "put_checksum_verified": False,
        "part_checksums_verified": False,
        "presign": "sigv4",
    },
    "ceph20": {
        "conditional_create": True,
        "if_match": "quoted",
        "if_match_missing": 404,
        "get_if_match": "quoted",
        "complete_if_none_match": True,
        "complete_if_match": "quoted",
        "copy_if_match": False,
        "put_checksum_verified": False,
        "part_checksums_verified": True,
        "presign": "sigv4",
    },
    "swift": {
        "if_match": "refused",
        "if_match_missing": None,
        "get_if_match": "quoted",
        "complete_if_none_match": True,
        "complete_if_match": "refused",
        "copy_if_match": True,
        "put_checksum_verified": True,
        "part_checksums_verified": True,
        "presign": "sigv4",
    },
}


@pytest.fixture
async def storage(s3_endpoint: Any, s3_bucket: str) -> AsyncIterator[S3Storage]:
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB))
    await backend.start()
    yield backend
    await backend.close()


class Requests:
    """The S3 requests of some storages, as (operation, key, the conditions it carries), in order."""

    def __init__(self, *storages: S3Storage) -> None:
        self.seen: list[tuple[str, str, tuple[str, ...]]] = []
        for storage in storages:
            storage.client.meta.events.register("before-parameter-build.s3", self._seen)

    def _seen(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        conditions = tuple(sorted(name for name in params if name.startswith(("If", "CopySourceIf"))))
        self.seen.append((model.name, str(params.get("Key", "")), conditions))

    def of(self, key_part: str) -> list[tuple[str, str, tuple[str, ...]]]:
        return [request for request in self.seen if key_part in request[1]]


@ON_ENGINES
async def test_the_probes_see_what_each_engine_does(
    storage: S3Storage, s3_endpoint: Any, request: pytest.FixtureRequest
) -> None:
    engine = storage.engine
    assert engine is not None
    seen = asdict(engine)
    if s3_endpoint.engine == "swift":
        seen.pop("conditional_create")
    assert seen == PROFILES.get(s3_endpoint.engine, seen)
    if s3_endpoint.engine.startswith("ceph"):
        cluster: CephCluster = request.getfixturevalue(s3_endpoint.engine)
        assert cluster.version.startswith(f"ceph version {cluster.release}."), cluster.version
        assert {Capability.ATOMIC_IF_MATCH, Capability.ATOMIC_IF_ABSENT} <= storage.capabilities
        assert replica_hazards(storage) == []
    if s3_endpoint.engine == "ceph16":
        assert storage.if_match_value('"abc"') == "abc" and storage.if_match_value('"abc"', complete=True) is None
        assert not storage.complete_if_none_match
    elif s3_endpoint.engine == "ceph20":
        assert storage.if_match_value('"abc"') == storage.if_match_value('"abc"', complete=True) == '"abc"'
        assert storage.complete_if_none_match
    elif s3_endpoint.engine == "swift":
        assert Capability.ATOMIC_IF_MATCH not in storage.capabilities
        assert len(replica_hazards(storage)) == 2
        assert storage.if_match_value('"abc"') is None
    probes = {row[0] for row in engine.rows()}
    assert {
        "conditional replace (PutObject If-Match)",
        "conditional CompleteMultipartUpload (If-None-Match: *)",
        "conditional CompleteMultipartUpload (If-Match)",
        "PutObject checksum verified (x-amz-checksum-sha256)",
        "UploadPart checksum verified (x-amz-checksum-sha256)",
    } <= probes


async def test_compare_and_set_across_two_gateways_loses_no_update(ceph: CephCluster) -> None:
    """Eight writers on each of Ceph's two gateways increment one counter by read, modify, write-if-match: every
    increment lands (without a working If-Match some would be overwritten; on 16.2 with the ETag quoted, none
    lands)."""
    bucket = "cas-counter"
    s3_client(ceph.endpoint).create_bucket(Bucket=bucket)
    gateways = [S3Storage(s3_config(gw, bucket)) for gw in ceph.gateways]
    for backend in gateways:
        await backend.start()
    try:
        async with gateways[0].create("n") as w:
            await w.write(b"0")
            await w.commit({})

        async def increment(backend: S3Storage, times: int) -> int:
            conflicts = 0
            for _ in range(times):
                for _attempt in range(200):
                    try:
                        async with await backend.open("n") as r:
                            value = int(b"".join([c async for c in r.read()]))
                            etag = r.info.etag
                        async with backend.create("n", if_match=etag) as w:
                            await w.write(str(value + 1).encode())
                            await w.commit({})
                        break
                    except ObjectChanged:
                        conflicts += 1
                else:
                    raise AssertionError("an increment never landed")
            return conflicts

        conflicts = await asyncio.gather(*(increment(gateways[i % 2], 5) for i in range(16)))
        assert await read_all(gateways[1], "n") == b"80"
        assert sum(conflicts) > 0  # they did race
    finally:
        for backend in gateways:
            await backend.close()


async def test_a_large_create_if_absent_has_one_winner(ceph: CephCluster) -> None:
    """Four writers of 6 MiB create one key if absent on both gateways: one object, the winner's bytes, no multipart
    upload and no claim left by the losers. Ceph 16.2 overwrites on CompleteMultipartUpload whatever its
    If-None-Match says, so there each writer claims the key by a conditional PutObject of its metadata first; Ceph
    20.2 refuses the completion itself, so there no writer claims anything: the completion is the compare-and-set."""
    bucket = "large-if-absent"
    s3_client(ceph.endpoint).create_bucket(Bucket=bucket)
    gateways = [S3Storage(s3_config(gw, bucket, part_size=5 * MiB)) for gw in ceph.gateways]
    for backend in gateways:
        await backend.start()
    requests = Requests(*gateways)
    try:
        bodies = [bytes([i + 1]) * (6 * MiB) for i in range(4)]

        async def attempt(i: int) -> bool:
            try:
                async with gateways[i % 2].create("big", if_absent=True, size_hint=len(bodies[i])) as w:
                    await w.write(bodies[i])
                    await w.commit({"i": str(i)})
                return True
            except ObjectExists:
                return False

        won = await asyncio.gather(*(attempt(i) for i in range(4)))
        assert sum(won) == 1
        winner = won.index(True)
        assert await read_all(gateways[0], "big") == bodies[winner]
        assert (await gateways[1].stat("big")).metadata["i"] == str(winner)
        assert in_progress_uploads(ceph.endpoint, bucket) == []
        # a loser's abort gives its claim back only if it held one: the winner's metadata is the only one
        keys = [o["Key"] for o in s3_client(ceph.endpoint).list_objects_v2(Bucket=bucket).get("Contents", [])]
        assert sorted(keys) == ["data/big", "meta/big.json"]
        claims = [r for r in requests.of("meta/big.json") if r[0] == "PutObject" and r[2] == ("IfNoneMatch",)]
        completions = [r for r in requests.of("data/big") if r[0] == "CompleteMultipartUpload"]
        if ceph.release == "16.2":
            assert len(claims) == 4 and all(r[2] == () for r in completions)  # every writer claimed; one won
        else:
            assert claims == [] and len(completions) == 4 and all(r[2] == ("IfNoneMatch",) for r in completions)
        await gateways[0].delete("big")
        with pytest.raises(ObjectNotFound):
            await gateways[1].stat("big")
        async with gateways[1].create("big", if_absent=True) as w:  # free again once deleted
            await w.write(b"again" * (2 * MiB))
            await w.commit({})
    finally:
        for backend in gateways:
            await backend.close()


async def test_a_large_replace_is_compared_by_the_completion_where_the_engine_does(ceph: CephCluster) -> None:
    """A multipart replace-if-version: refused (ObjectChanged) for a stale version, nothing changed; published for
    the current one. On Ceph 20.2 the CompleteMultipartUpload carries If-Match (the engine compares, across
    gateways); on Ceph 16.2, which ignores it there, the version is compared by a HEAD just before."""
    bucket = "large-if-match"
    s3_client(ceph.endpoint).create_bucket(Bucket=bucket)
    backend = S3Storage(s3_config(ceph.gateways[0], bucket, part_size=5 * MiB))
    other = S3Storage(s3_config(ceph.gateways[1], bucket, part_size=5 * MiB))
    for b in (backend, other):
        await b.start()
    try:
        first, second, third = (bytes([n]) * (6 * MiB) for n in (1, 2, 3))
        versions = []
        for body in (first, second):
            async with other.create("big", size_hint=len(body)) as w:
                await w.write(body)
                versions.append((await w.commit({})).etag)
        stale = versions[0]
        requests = Requests(backend)
        with pytest.raises(ObjectChanged):
            async with backend.create("big", if_match=stale, size_hint=len(third)) as w:
                await w.write(third)
                await w.commit({})
        assert await read_all(other, "big") == second
        assert in_progress_uploads(ceph.endpoint, bucket) == []
        current = (await other.stat("big")).etag
        async with backend.create("big", if_match=current, size_hint=len(third)) as w:
            await w.write(third)
            await w.commit({})
        assert await read_all(other, "big") == third
        completions = [r for r in requests.of("data/big") if r[0] == "CompleteMultipartUpload"]
        heads = [r for r in requests.of("data/big") if r[0] == "HeadObject"]
        if ceph.release == "16.2":
            assert len(completions) == 1 and completions[0][2] == () and len(heads) == 2
        else:
            assert [r[2] for r in completions] == [("IfMatch",), ("IfMatch",)] and heads == []
    finally:
        for b in (backend, other):
            await b.close()


async def test_an_engine_without_compare_and_set_refuses_replicas_unless_told_it_runs_alone(
    s3_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Swift (If-Match: 501), a service that was not told it runs alone does not start, in process or as
    ``transfer serve`` (one line, exit 1); told so, it serves."""
    monkeypatch.setenv("TRANSFER_SINGLE_REPLICA", "false")
    monkeypatch.setenv("TRANSFER_S3_ATOMIC_IF_MATCH", "true")  # the operator does not say no: the probe does
    monkeypatch.setenv("TRANSFER_S3_ATOMIC_IF_ABSENT", "true")
    settings = Settings(data_dir=tmp_path / "data", storage="s3", signing_keys={"t": "0123456789abcdef0123"})
    services = create_app(settings).state.services
    with pytest.raises(UnsafeForReplicas, match="TRANSFER_SINGLE_REPLICA=true"):
        await services.start()
    await services.close()
    env = {**os.environ, "TRANSFER_SINGLE_REPLICA": "false", "TRANSFER_SHUTDOWN_DRAIN": "0"}
    out = subprocess.run(
        [sys.executable, "-m", "transfer", "serve", "--port", "0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("transfer: unsafe_for_replicas:"), out.stderr
    assert "compare-and-set (If-Match) is not atomic" in lines[0] and "--single-replica" in lines[0]
    alone = Settings(
        data_dir=tmp_path / "data", storage="s3", signing_keys={"t": "0123456789abcdef0123"}, single_replica=True
    )
    services = create_app(alone).state.services
    await services.start()
    await services.close()


@ON_ENGINES
def test_storage_check_prints_the_matrix(s3_endpoint: Any, s3_bucket: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": s3_endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_key,
        "AWS_REGION": s3_endpoint.region,
        "TRANSFER_S3_ADDRESSING_STYLE": "path",
    }
    command = [sys.executable, "-m", "transfer", "storage", "check", "--endpoint", s3_endpoint.url]
    as_json = subprocess.run(
        [*command, "--bucket", s3_bucket, "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert as_json.returncode == 0, as_json.stderr
    seen = json.loads(as_json.stdout)
    assert seen["replicas"] is s3_endpoint.engine.startswith("ceph")
    expected = PROFILES.get(s3_endpoint.engine, {})
    for field in ("if_match", "complete_if_none_match", "complete_if_match", "put_checksum_verified"):
        assert seen[field] == expected.get(field, seen[field]), field
    assert seen["part_checksums_verified"] == expected.get("part_checksums_verified", seen["part_checksums_verified"])
    text = subprocess.run(
        [*command, "--bucket", s3_bucket], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert text.returncode == 0
    lines = text.stdout.strip().splitlines()
    assert lines[-1].startswith("replicas: ")
    rows = {line.strip().split("  ")[0]: line for line in lines[1:-1]}
    put_row = rows["PutObject checksum verified (x-amz-checksum-sha256)"]
    part_row = rows["UploadPart checksum verified (x-amz-checksum-sha256)"]
    complete_row = rows["conditional CompleteMultipartUpload (If-None-Match: *)"]
    if s3_endpoint.engine == "ceph20":  # the current Ceph: each operation for what it is
        assert " no " in put_row and " yes " in part_row and "decided by its completion" in complete_row
    elif s3_endpoint.engine == "ceph16":
        assert " no " in put_row and " no " in part_row and "claims its key" in complete_row
    missing = subprocess.run(
        [*command, "--bucket", "no-such-bucket-here"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert missing.returncode == 1 and "storage_unavailable" in missing.stderr
    # the probes clean up after themselves
    keys = [o["Key"] for o in s3_client(s3_endpoint).list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert keys == []
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []
