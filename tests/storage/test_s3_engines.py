"""What the S3 backend learns of its engine at start-up, and what it does with it, on the two engines the tests run:
Swift's s3api (no conditional PUT, a non-atomic create-if-absent) and Ceph's RADOS Gateway (If-Match compared with
the ETag unquoted, conditions ignored on CompleteMultipartUpload, part checksums stored unchecked). Compare-and-set
across Ceph's two gateways loses no update; a large create-if-absent has one winner there too; an engine without
compare-and-set refuses replicas unless told the process runs alone; ``transfer storage check`` prints it all."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
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


@pytest.fixture
async def storage(s3_endpoint: Any, s3_bucket: str) -> AsyncIterator[S3Storage]:
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB))
    await backend.start()
    yield backend
    await backend.close()


@ON_ENGINES
async def test_the_probes_see_what_each_engine_does(storage: S3Storage, s3_endpoint: Any) -> None:
    engine = storage.engine
    assert engine is not None
    if s3_endpoint.engine == "ceph":
        assert engine.if_match == "unquoted" and engine.if_match_missing == 412
        assert engine.conditional_create and not engine.conditional_complete
        assert not engine.part_checksums_verified and engine.presign == "sigv4"
        assert {Capability.ATOMIC_IF_MATCH, Capability.ATOMIC_IF_ABSENT} <= storage.capabilities
        assert replica_hazards(storage) == []
        assert storage.if_match_value('"abc"') == "abc"
    elif s3_endpoint.engine == "swift":
        assert engine.if_match == "refused" and engine.part_checksums_verified and engine.presign == "sigv4"
        assert Capability.ATOMIC_IF_MATCH not in storage.capabilities
        assert len(replica_hazards(storage)) == 2
        assert storage.if_match_value("abc") == '"abc"'
    assert {row[0] for row in engine.rows()} >= {"conditional replace (If-Match)", "part checksums verified"}


@pytest.mark.ceph
async def test_compare_and_set_across_two_gateways_loses_no_update(ceph: CephCluster) -> None:
    """Eight writers on each of Ceph's two gateways increment one counter by read, modify, write-if-match: every
    increment lands (without a working If-Match some would be overwritten; with the ETag quoted, none lands)."""
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


@pytest.mark.ceph
async def test_a_large_create_if_absent_has_one_winner_where_completion_ignores_conditions(
    ceph: CephCluster,
) -> None:
    """Ceph overwrites on CompleteMultipartUpload whatever its If-None-Match says: a multipart create-if-absent
    claims its key by a conditional PutObject of its metadata first. Four writers of 6 MiB on both gateways: one
    object, the winner's bytes, no multipart upload and no claim left by the losers."""
    bucket = "large-if-absent"
    s3_client(ceph.endpoint).create_bucket(Bucket=bucket)
    gateways = [S3Storage(s3_config(gw, bucket, part_size=5 * MiB)) for gw in ceph.gateways]
    for backend in gateways:
        await backend.start()
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
        await gateways[0].delete("big")
        with pytest.raises(ObjectNotFound):
            await gateways[1].stat("big")
        async with gateways[1].create("big", if_absent=True) as w:  # free again once deleted
            await w.write(b"again" * (2 * MiB))
            await w.commit({})
    finally:
        for backend in gateways:
            await backend.close()


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
    assert seen["replicas"] is (s3_endpoint.engine == "ceph")
    assert seen["if_match"] == {"ceph": "unquoted", "swift": "refused"}.get(s3_endpoint.engine, seen["if_match"])
    text = subprocess.run(
        [*command, "--bucket", s3_bucket], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert text.returncode == 0 and "conditional CompleteMultipartUpload" in text.stdout
    assert text.stdout.strip().splitlines()[-1].startswith("replicas: ")
    missing = subprocess.run(
        [*command, "--bucket", "no-such-bucket-here"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert missing.returncode == 1 and "storage_unavailable" in missing.stderr
    # the probes clean up after themselves
    keys = [o["Key"] for o in s3_client(s3_endpoint).list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert keys == []
