"""Chunked deduplicating uploads against a real server on loopback (local storage and the S3 test server): a new
version sends only the chunks its key lacks, the file is verified whole before it is published, bad manifests and
chunks get their own 4xx, no key learns what another key stores, and a resolver with a cache fetches only the
chunks it lacks."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks.e2e import service
from tests.conftest import Clock, LiveServer, running, wait_indexed
from transfer.client.dedup import ChunkCache, cut_file, offer, resolve_with_cache, upload_deduplicated
from transfer.core.auth import token_hash
from transfer.core.uploads.chunking import Manifest
from transfer.service.uploads.chunkstore import CHUNK_GRACE, key_folder
from transfer.settings import Settings

pytestmark = pytest.mark.anyio
MiB = 1 << 20
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab", "carol": "carol-token-0123456789"}


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


def keyed_settings(tmp_path: Path, **extra: Any) -> Settings:
    keys = {
        name: {
            "sha256": token_hash(token),
            "scopes": ["upload", "read", "admin"] if name == "alice" else ["upload", "read"],
            "max_bytes": 1 << 30,
        }
        for name, token in TOKENS.items()
    }
    return Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys, **extra)


@pytest.fixture
def tenants(tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    # the tests that sweep run the sweeps themselves: a periodic one (60 s by default, reached by a slow test under
    # load) would race theirs and take some of the chunks they count
    with running(keyed_settings(tmp_path, session_gc_interval=3600), clock) as live:
        yield live


def changed(data: bytes, places: int, width: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    out = bytearray(data)
    for _ in range(places):
        at = rng.randrange(0, len(data) - width)
        out[at : at + width] = rng.randbytes(width)
    return bytes(out)


async def upload(live: LiveServer, path: Path, who: str | None = None) -> Any:
    async with httpx.AsyncClient(headers=key(who) if who else None, timeout=60) as http:
        return await upload_deduplicated(http, live.url, path)


async def test_a_new_version_sends_only_the_chunks_that_changed(server: LiveServer, tmp_path: Path) -> None:
    v1 = os.urandom(6 * MiB)
    src = tmp_path / "v1.bin"
    src.write_bytes(v1)
    first = await upload(server, src)
    assert first.sent_bytes == len(v1)  # nothing stored yet: every chunk goes
    assert first.descriptor.checksum == "sha256:" + hashlib.sha256(v1).hexdigest()

    again = await upload(server, src)  # unchanged: no chunk goes, a new file all the same
    assert again.sent_bytes == 0 and again.sent_chunks == 0
    assert again.descriptor.metadata["file_id"] != first.descriptor.metadata["file_id"]

    v2 = changed(v1, places=3, width=1000) + os.urandom(100_000)
    (tmp_path / "v2.bin").write_bytes(v2)
    second = await upload(server, tmp_path / "v2.bin")
    # each change costs about a chunk or two (~80 KiB each), the appended tail its own bytes and one chunk
    assert 0 < second.sent_bytes <= 3 * 2 * 256 * 1024 + 100_000 + 256 * 1024
    async with httpx.AsyncClient(timeout=60) as http:
        for outcome, data in ((first, v1), (again, v1), (second, v2)):
            got = await http.get(outcome.descriptor.url)
            assert got.status_code == 200 and got.content == data


async def test_the_service_advertises_its_chunker(server: LiveServer) -> None:
    async with httpx.AsyncClient() as http:
        doc = await offer(http, server.url)
    assert doc is not None and doc["chunking"]["algorithm"] == "fastcdc-2020"
    assert doc["chunking"]["avg_size"] == 64 << 10


def manifest_doc(manifest: Manifest, **changes: Any) -> dict[str, Any]:
    doc = manifest.to_json()
    doc.update(changes)
    return doc


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


def test_bad_manifests_and_chunks_get_their_own_errors_and_publish_nothing(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(2 * MiB)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    manifest = cut_file(src)
    chunks = manifest.to_json()["chunks"]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        short = http.post("/v1/chunked", json=manifest_doc(manifest, size=len(data) + 1))
        assert short.status_code == 400 and error_code(short) == "manifest_size_mismatch"
        gap = [dict(chunks[0], offset=1), *chunks[1:]]
        bad = http.post("/v1/chunked", json=manifest_doc(manifest, chunks=gap))
        assert bad.status_code == 400 and error_code(bad) == "invalid_manifest"
        monkeypatch.setattr("transfer.service.uploads.chunked.MAX_CHUNKS", len(chunks) - 1)
        many = http.post("/v1/chunked", json=manifest_doc(manifest))
        assert many.status_code == 413 and error_code(many) == "manifest_too_large"
        monkeypatch.setattr("transfer.api.chunked.MAX_MANIFEST_BODY", 1000)
        huge = http.post("/v1/chunked", json=manifest_doc(manifest))
        assert huge.status_code == 413 and error_code(huge) == "manifest_too_large"
        monkeypatch.undo()

        made = http.post("/v1/chunked", json=manifest_doc(manifest))
        assert made.status_code == 201, made.text
        uid, missing = made.json()["id"], made.json()["missing"]
        assert missing == list(range(len(chunks)))
        first = manifest.chunks[0]
        wrong = bytearray(data[: first.length])
        wrong[0] ^= 1
        put = http.put(f"/v1/chunked/{uid}/chunks/0", content=bytes(wrong))
        assert put.status_code == 422 and error_code(put) == "chunk_checksum_mismatch"
        outside = http.put(f"/v1/chunked/{uid}/chunks/{len(chunks)}", content=b"x")
        assert outside.status_code == 400 and error_code(outside) == "chunk_not_in_manifest"
        early = http.post(f"/v1/chunked/{uid}/complete")
        assert early.status_code == 409 and error_code(early) == "chunks_missing"
        assert early.json()["error"]["detail"]["missing"] == missing  # the bad chunk was not kept

        # every chunk right, the whole-file checksum a lie: verified before publishing, nothing published
        lie = http.post("/v1/chunked", json=manifest_doc(manifest, checksum="sha256:" + "0" * 64))
        lying = lie.json()["id"]
        sent = http.put(f"/v1/chunked/{lying}/chunks/0", params={"count": len(chunks)}, content=data)
        assert sent.status_code == 200, sent.text
        done = http.post(f"/v1/chunked/{lying}/complete")
        assert done.status_code == 422 and error_code(done) == "checksum_mismatch"
        assert http.get("/v1/files").json()["files"] == []


async def test_no_key_learns_whether_another_key_stores_a_chunk(tenants: LiveServer, tmp_path: Path) -> None:
    secret = os.urandom(MiB)
    src = tmp_path / "secret.bin"
    src.write_bytes(secret)
    stored = await upload(tenants, src, "alice")
    manifest = cut_file(src)
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        answers = {}
        for who in ("bob", "carol"):  # bob names alice's chunks; carol's key has nothing and nobody has them
            made = http.post("/v1/chunked", json=manifest.to_json(), headers=key(who))
            assert made.status_code == 201
            answers[who] = made.json()
        # what bob is told about alice's chunks is what anyone is told about chunks nobody stored
        assert answers["bob"]["missing"] == answers["carol"]["missing"] == list(range(len(manifest.chunks)))
        assert answers["bob"]["missing_bytes"] == len(secret)
        bob = answers["bob"]["id"]
        early = http.post(f"/v1/chunked/{bob}/complete", headers=key("bob"))
        assert early.status_code == 409 and error_code(early) == "chunks_missing"
        # bob cannot read alice's file's manifest, nor alice complete bob's upload: 404, as for unknown ids
        alice_file = stored.descriptor.metadata["file_id"]
        assert http.get(f"/v1/files/{alice_file}/chunks", headers=key("bob")).status_code == 404
        assert http.post(f"/v1/chunked/{bob}/complete", headers=key("alice")).status_code == 404
        assert http.get(f"/v1/files/{alice_file}/chunks", headers=key("alice")).status_code == 200
    # and nothing of bob's went into alice's store or the other way round
    assert key_folder("alice") != key_folder("bob")


async def test_unused_chunks_are_swept_and_leave_the_count(
    tenants: LiveServer, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "transfer.client.dedup.upload.WHOLE_FRACTION", 2.0
    )  # into packs (a file sent whole holds its own)
    data = os.urandom(MiB)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    services = tenants.app.state.services
    done = await upload(tenants, src, "alice")
    usage = await tenants.call(services.files.lifecycle.usage.usage("alice"))
    assert usage.used == 2 * len(data)  # the file and the chunks kept for its next version
    file_id = done.descriptor.metadata["file_id"]
    clock.advance(CHUNK_GRACE + 1)
    assert (await tenants.call(services.sweep_now()))[
        "chunks"
    ] == 0  # the file lives: its chunks stay whatever their age
    async with httpx.AsyncClient(base_url=tenants.url, headers=key("alice")) as http:
        assert (await http.delete(f"/v1/files/{file_id}")).status_code == 204
    assert (await tenants.call(services.sweep_now()))["chunks"] == len(cut_file(src).distinct())
    assert (await tenants.call(services.files.lifecycle.usage.usage("alice"))).used == 0
    again = await upload(tenants, src, "alice")  # gone for good: the next upload sends them again
    assert again.sent_bytes == len(data)


async def test_a_resolver_with_a_cache_fetches_only_the_chunks_it_lacks(server: LiveServer, tmp_path: Path) -> None:
    v1 = os.urandom(4 * MiB)
    v2 = changed(v1, places=2, width=500)
    (tmp_path / "v1.bin").write_bytes(v1)
    (tmp_path / "v2.bin").write_bytes(v2)
    first = (await upload(server, tmp_path / "v1.bin")).descriptor
    second = (await upload(server, tmp_path / "v2.bin")).descriptor
    cache = ChunkCache(tmp_path / "cache")
    async with httpx.AsyncClient(timeout=60) as http:  # no API key: the descriptor's signature is enough
        cold = await resolve_with_cache(http, first, tmp_path / "out1.bin", cache)
        assert cold.fetched_bytes == len(v1) and cold.cached_bytes == 0
        warm = await resolve_with_cache(http, second, tmp_path / "out2.bin", cache)
    assert (tmp_path / "out1.bin").read_bytes() == v1 and (tmp_path / "out2.bin").read_bytes() == v2
    assert 0 < warm.fetched_bytes <= 2 * 2 * 256 * 1024
    assert warm.cached_bytes + warm.fetched_bytes == len(v2)


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transfer", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_transfer_upload_dedup_sends_what_changed_and_resolve_uses_its_cache(tmp_path: Path) -> None:
    v1 = os.urandom(3 * MiB)
    v2 = changed(v1, places=2, width=300)
    (tmp_path / "v1.bin").write_bytes(v1)
    (tmp_path / "v2.bin").write_bytes(v2)
    workdir = tmp_path / "serve"
    workdir.mkdir()
    with service(workdir) as (url, _pid):
        # the default: a file whose head the key lacks goes whole at once, then its chunks are indexed
        first = cli("upload", "--server", url, str(tmp_path / "v1.bin"))
        assert first.returncode == 0, first.stderr
        assert f"new to this key, sent whole ({len(v1)} bytes)" in first.stderr
        wait_indexed(url, json.loads(first.stdout)["metadata"]["file_id"])
        second = cli("upload", "--server", url, str(tmp_path / "v2.bin"))
        assert second.returncode == 0, second.stderr
        sent = int(second.stderr.split("sent ")[1].split(" ")[0])
        assert 0 < sent <= 2 * 2 * 256 * 1024  # about a chunk or two per change
        whole = cli("upload", "--no-dedup", "--server", url, str(tmp_path / "v2.bin"))
        assert whole.returncode == 0 and "sent " not in whole.stderr
        assert json.loads(whole.stdout)["checksum"] == json.loads(second.stdout)["checksum"]
        encoded = cli("upload", "--dedup", "--encoding", "gzip", "--server", url, str(tmp_path / "v2.bin"))
        assert encoded.returncode != 0 and "invalid_request" in encoded.stderr

        (tmp_path / "d1.json").write_text(first.stdout)
        (tmp_path / "d2.json").write_text(second.stdout)
        cache = str(tmp_path / "cache")
        cold = cli("resolve", "d1.json", "-o", "o1.bin", "--cache", cache, cwd=tmp_path)
        assert cold.returncode == 0, cold.stderr
        assert f"({len(v1)} bytes fetched, 0 from the cache)" in cold.stderr
        warm = cli("resolve", "d2.json", "-o", "o2.bin", "--cache", cache, cwd=tmp_path)
        assert warm.returncode == 0, warm.stderr
        fetched = int(warm.stderr.split("(")[1].split(" ")[0])
        assert 0 < fetched <= 2 * 2 * 256 * 1024
    assert (tmp_path / "o1.bin").read_bytes() == v1 and (tmp_path / "o2.bin").read_bytes() == v2


def test_the_dedup_benchmark_runs(tmp_path: Path) -> None:
    from benchmarks.dedup import dedup_table, run_dedup

    report = run_dedup(8 * MiB, 1, tmp_path)
    assert report["cases"]["unchanged"]["sent_bytes"] == 0
    assert 0 < report["cases"]["16 MiB appended"]["sent_bytes"] < 17 * MiB
    assert report["resolve"]["cached_bytes"] > 0
    assert "| 1% in 20 places |" in dedup_table(report)


@pytest.mark.s3
def test_the_dedup_benchmark_runs_on_s3(tmp_path: Path) -> None:
    from benchmarks.dedup import dedup_table, run_dedup

    report = run_dedup(24 * MiB, 1, tmp_path, s3=True)
    assert report["storage"] == "s3"
    assert report["cases"]["unchanged"]["sent_bytes"] == 0  # the first upload's chunks were indexed before
    assert 0 < report["cases"]["16 MiB appended"]["sent_bytes"] < 17 * MiB
    assert "resolve" not in report and "on S3" in dedup_table(report)


def test_a_key_holds_a_bounded_number_of_open_chunked_uploads(tmp_path: Path, clock: Clock) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(100_000))
    manifest = cut_file(src).to_json()
    with running(keyed_settings(tmp_path, max_open_sessions_per_key=2), clock) as live:
        with httpx.Client(base_url=live.url, headers=key("bob")) as http:
            made = [http.post("/v1/chunked", json=manifest) for _ in range(2)]
            assert [r.status_code for r in made] == [201, 201]
            third = http.post("/v1/chunked", json=manifest)
            assert third.status_code == 429 and error_code(third) == "too_many_sessions"
            assert http.post("/v1/chunked", json=manifest, headers=key("carol")).status_code == 201  # per key
            assert http.delete(f"/v1/chunked/{made[0].json()['id']}").status_code == 204
            assert http.post("/v1/chunked", json=manifest).status_code == 201  # the slot came back
