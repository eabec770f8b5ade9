"""Chunk packs against a real server on loopback (local storage, and the S3 test server where marked): the chunks a
key sends in one body are stored as one pack and indexed in at most 16 compare-and-set shards, so the objects an
upload writes grow with its bodies, not its chunks; a new version sends only the chunks the key lacks; the
``missing`` route refuses what does not fit the upload with its own 4xx and publishes nothing; a crash between a
pack and its index leaves no index entry naming bytes that are not there; no key learns what another stores; and
removing one file keeps the chunks and bytes of another.

The manifests here are cut at pseudo-random lengths (not FastCDC): the service takes any manifest that tiles the
file, and the tests must not depend on the client's chunker."""

from __future__ import annotations

import base64
import hashlib
import os
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Clock, LiveServer, running
from tests.uploads.test_chunked_dedup import changed
from transfer.core.auth import token_hash
from transfer.core.uploads.chunking import Chunk, Manifest
from transfer.errors import StorageUnavailable
from transfer.service.uploads.chunkstore import CHUNK_GRACE, INDEX_SHARDS, key_folder
from transfer.settings import Settings

pytestmark = pytest.mark.anyio
KiB, MiB = 1 << 10, 1 << 20
TOKENS = {
    "alice": "alice-token-0123456789",
    "bob": "bob-token-0123456789ab",
    "carol": "carol-token-0123456789",
    "root": "root-token-0123456789ab",
}


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


def manifest_of(data: bytes, *, smallest: int = 16 * KiB, largest: int = 128 * KiB, seed: int = 1) -> Manifest:
    """``data`` cut at lengths drawn from ``seed`` (the same cuts for every file of one length: a version changed
    in place changes only the chunks it touches)."""
    rng = random.Random(seed)
    chunks: list[Chunk] = []
    at = 0
    while at < len(data):
        length = min(rng.randint(smallest, largest), len(data) - at)
        chunks.append(Chunk(at, length, hashlib.sha256(data[at : at + length]).hexdigest()))
        at += length
    return Manifest(size=len(data), sha256=hashlib.sha256(data).hexdigest(), chunks=tuple(chunks))


def body(data: bytes, manifest: Manifest, positions: list[int]) -> bytes:
    """The bytes of the chunks at ``positions``, back to back (what one PUT of a run carries)."""
    return b"".join(data[c.offset : c.offset + c.length] for c in (manifest.chunks[i] for i in positions))


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


class Uploader:
    """A chunked upload over the routes, as one key."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def create(self, manifest: Manifest, **fields: Any) -> dict[str, Any]:
        made = await self.http.post("/v1/chunked", json={**manifest.to_json(), **fields})
        assert made.status_code == 201, made.text
        doc: dict[str, Any] = made.json()
        return doc

    async def send_missing(self, upload: dict[str, Any], data: bytes, manifest: Manifest, bodies: int = 1) -> int:
        """Send the chunks the creation answered missing in ``bodies`` PUTs of the ``missing`` route; the chunks
        newly stored."""
        missing: list[int] = upload["missing"]
        stored = 0
        per = max(1, -(-len(missing) // bodies))
        for start in range(0, len(missing), per):
            run = missing[start : start + per]
            put = await self.http.put(
                f"/v1/chunked/{upload['id']}/missing",
                params={"start": start, "count": len(run)},
                content=body(data, manifest, run),
            )
            assert put.status_code == 200, put.text
            stored += int(put.json()["stored"])
        return stored

    async def complete(self, upload: dict[str, Any]) -> dict[str, Any]:
        done = await self.http.post(f"/v1/chunked/{upload['id']}/complete")
        assert done.status_code == 201, done.text
        doc: dict[str, Any] = done.json()
        return doc

    async def upload(self, data: bytes, manifest: Manifest | None = None, bodies: int = 1) -> dict[str, Any]:
        manifest = manifest or manifest_of(data)
        made = await self.create(manifest)
        await self.send_missing(made, data, manifest, bodies)
        return await self.complete(made)

    async def content(self, descriptor: dict[str, Any]) -> bytes:
        """The file's bytes by a signed URL made now (the descriptor's would expire when a test moves the clock)."""
        fresh = await self.http.get(f"/v1/files/{descriptor['metadata']['file_id']}")
        assert fresh.status_code == 200, fresh.text
        if fresh.json()["type"] == "inline":  # 1 MiB or less
            return base64.b64decode(fresh.json()["data"])
        got = await self.http.get(fresh.json()["url"])
        assert got.status_code == 200, got.text
        return got.content


async def objects(live: LiveServer, prefix: str) -> dict[str, int]:
    """Every object the service's backend holds under ``prefix`` (local directory or S3 bucket alike): key ->
    size."""
    storage = live.app.state.services.files.storage
    return {info.key: info.size async for info in storage.list(prefix)}


async def index_entries(live: LiveServer, owner: str | None) -> dict[str, list[Any]]:
    """Every chunk entry of ``owner``'s index shards: sha256 -> [pack, offset, length, stored_at]."""
    from transfer.service.accounting.recordstore import read_record

    storage = live.app.state.services.files.storage
    entries: dict[str, list[Any]] = {}
    for name in await objects(live, key_folder(owner) + "index/"):
        doc, _ = await read_record(storage, name)
        entries.update(doc["chunks"])
    return entries


async def dangling(live: LiveServer, owner: str | None) -> list[str]:
    """Index entries naming bytes their pack does not hold (the pack is gone or shorter)."""
    folder = key_folder(owner)
    packs = await objects(live, folder + "packs/")
    return [
        sha
        for sha, (pack, offset, length, *_) in (await index_entries(live, owner)).items()
        if packs.get(f"{folder}packs/{pack}", -1) < offset + length
    ]


class Writes:
    """Counts the objects the service's backend is asked to create, by key."""

    def __init__(self, live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.keys: list[str] = []
        storage = live.app.state.services.files.storage
        original = storage.create

        def create(key: str, *args: Any, **kwargs: Any) -> Any:
            self.keys.append(key)
            return original(key, *args, **kwargs)

        monkeypatch.setattr(storage, "create", create)

    def under(self, prefix: str) -> list[str]:
        return [k for k in self.keys if k.startswith(prefix)]


def keyed_settings(tmp_path: Path, **extra: Any) -> Settings:
    keys = {
        name: {"sha256": token_hash(token), "scopes": ["admin"] if name == "root" else ["upload", "read"]}
        for name, token in TOKENS.items()
    }
    return Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys, **extra)


@pytest.fixture
def tenants(tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    with running(keyed_settings(tmp_path, session_gc_interval=3600), clock) as live:
        yield live


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def server(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    """A live server in open mode on local storage, and again on the S3 test server. Its own sweeps wait an hour:
    the tests sweep when they mean to (a sweep on the test's event loop must not meet one on the server's)."""
    extra: dict[str, Any] = {}
    if request.param == "s3":
        request.getfixturevalue("s3_env")  # TRANSFER_STORAGE=s3 and friends in the environment
        extra = {"storage": "s3"}
    settings = Settings(
        data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, session_gc_interval=3600, **extra
    )
    with running(settings, clock) as live:
        yield live


@pytest.fixture
async def http(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        yield client


def on_s3(live: LiveServer) -> bool:
    """Whether ``live`` stores on the S3 test server (its tests use smaller files: every object is a request)."""
    return str(live.settings.storage) == "s3"


async def test_a_new_version_sends_only_the_chunks_the_key_lacks(server: LiveServer, http: httpx.AsyncClient) -> None:
    up = Uploader(http)
    v1 = os.urandom(MiB + 1 if on_s3(server) else 3 * MiB)
    m1 = manifest_of(v1)
    first = await up.create(m1)
    assert first["missing"] == list(range(len(m1.chunks))) and first["missing_bytes"] == len(v1)
    assert await up.send_missing(first, v1, m1) == len(m1.chunks)
    d1 = await up.complete(first)

    v2 = changed(v1, places=3, width=1000)
    m2 = manifest_of(v2)
    known = {c.sha256 for c in m1.chunks}
    new = [i for i, c in enumerate(m2.chunks) if c.sha256 not in known]
    assert 1 <= len(new) <= 6  # each change touches a chunk or two
    second = await up.create(m2)
    assert second["missing"] == new  # exactly the chunks that changed, nothing the key holds
    assert second["missing_bytes"] == sum(m2.chunks[i].length for i in new)
    assert await up.send_missing(second, v2, m2) == len(new)
    d2 = await up.complete(second)

    again = await up.create(m2)  # the same version once more: nothing to send, a file of its own all the same
    assert again["missing"] == [] and again["missing_bytes"] == 0
    d3 = await up.complete(again)
    assert len({d["metadata"]["file_id"] for d in (d1, d2, d3)}) == 3
    assert await up.content(d1) == v1 and await up.content(d2) == v2 and await up.content(d3) == v2


class Assembly:
    """The bytes each new file object is given through ``write`` and through ``copy_range``, by key."""

    def __init__(self, live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.written: dict[str, int] = {}
        self.copied: dict[str, int] = {}
        storage = live.app.state.services.files.storage
        original = storage.create

        def create(key: str, *args: Any, **kwargs: Any) -> Any:
            writer = original(key, *args, **kwargs)
            if key.startswith("files/"):
                write, copy_range = writer.write, writer.copy_range
                self.written[key] = self.copied[key] = 0

                async def counted_write(data: Any) -> None:
                    self.written[key] += len(data)
                    await write(data)

                async def counted_copy(source: Any, start: int, end: int) -> None:
                    self.copied[key] += end - start
                    await copy_range(source, start, end)

                writer.write, writer.copy_range = counted_write, counted_copy
            return writer

        monkeypatch.setattr(storage, "create", create)


async def test_a_new_version_is_assembled_by_copying_the_runs_it_shares(
    server: LiveServer, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs of chunks the new version shares with the old one (back to back in the old one's pack) are copied
    server-side (local copy_file_range, S3 UploadPartCopy), not written: on S3 only the changed chunks and, before
    a copy, what tops the written part up to 5 MiB. The file is still verified whole and comes out exact."""
    up = Uploader(http)
    size = 24 * MiB if on_s3(server) else 6 * MiB
    v1 = os.urandom(size)
    await up.upload(v1)
    v2 = bytearray(v1)
    for at in (size // 3, 2 * size // 3):  # two places: three runs of about a third of the file each
        v2[at : at + 1000] = os.urandom(1000)
    m2 = manifest_of(bytes(v2))
    assembly = Assembly(server, monkeypatch)
    made = await up.create(m2)
    assert 1 <= len(made["missing"]) <= 4
    await up.send_missing(made, bytes(v2), m2)
    descriptor = await up.complete(made)
    assert await up.content(descriptor) == v2
    key = "files/" + descriptor["metadata"]["file_id"]
    written, copied = assembly.written[key], assembly.copied[key]
    assert written + copied == size
    if on_s3(server):  # each copy after changed chunks needs a written part of 5 MiB before it
        assert written <= 2 * 5 * MiB and copied >= size - 2 * 5 * MiB
    else:  # every run of a MiB or more copied: only the changed chunks written
        assert written == made["missing_bytes"]


async def test_a_pack_deleted_while_it_is_copied_publishes_the_bytes_read_or_nothing(
    server: LiveServer, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old version's bytes go (a delete, a sweep) just after a range of them was copied: local storage copied
    from the descriptor it had open, so the file publishes, exact. On S3 the copy (UploadPartCopy) runs in the
    background: one that finished before the delete copied the bytes, so the file publishes, exact; one that
    finds its source gone (or, on an engine that ignores the copy's condition, a commit whose check finds it gone)
    publishes nothing: 409 chunks_missing, and the key's index forgets the pack, so the next creation asks for
    those chunks again and the upload completes. Which of the two happens is a race: both are right."""
    up = Uploader(http)
    size = 12 * MiB if on_s3(server) else 3 * MiB
    v1 = os.urandom(size)
    await up.upload(v1)
    v2 = v1[:-1000] + os.urandom(1000)
    m2 = manifest_of(v2)
    storage = server.app.state.services.files.storage
    original = storage.create

    def create(key: str, *args: Any, **kwargs: Any) -> Any:
        writer = original(key, *args, **kwargs)
        if key.startswith("files/"):
            copy_range = writer.copy_range

            async def copy_then_lose_the_source(source: Any, start: int, end: int) -> None:
                await copy_range(source, start, end)
                await storage.delete(source.info.key)

            writer.copy_range = copy_then_lose_the_source
        return writer

    monkeypatch.setattr(storage, "create", create)
    files_before = await objects(server, "files/")
    made = await up.create(m2)
    await up.send_missing(made, v2, m2)
    done = await http.post(f"/v1/chunked/{made['id']}/complete")
    monkeypatch.setattr(storage, "create", original)
    if not on_s3(server) or done.status_code == 201:
        assert done.status_code == 201, done.text
        assert await up.content(done.json()) == v2
        return
    assert done.status_code == 409 and code(done) == "chunks_missing", done.text
    assert await objects(server, "files/") == files_before  # nothing published
    again = await up.create(m2)
    assert again["missing_bytes"] == size - made["missing_bytes"]  # the lost pack's chunks are asked for again
    await up.send_missing(again, v2, m2)
    assert await up.content(await up.complete(again)) == v2


async def test_a_pack_shorter_than_its_index_is_chunks_missing_not_a_storage_error(
    server: LiveServer, http: httpx.AsyncClient
) -> None:
    """A pack cut short (a crash, a store that lost its tail) whose run would be copied whole: the completion sees
    the pack is shorter than the run before anything is copied, forgets it and asks for its chunks (409), and the
    upload completes once they are sent; never a 503 on every retry."""
    up = Uploader(http)
    size = 12 * MiB if on_s3(server) else 3 * MiB
    v1 = os.urandom(size)
    await up.upload(v1)
    storage = server.app.state.services.files.storage
    (pack,) = [k for k in await objects(server, key_folder(None) + "packs/")]
    async with storage.create(pack) as writer:  # the same pack, its last MiB lost
        await writer.write(v1[: size - MiB])
        await writer.commit({})
    v2 = v1[:-1000] + os.urandom(1000)
    m2 = manifest_of(v2)
    made = await up.create(m2)
    await up.send_missing(made, v2, m2)
    done = await http.post(f"/v1/chunked/{made['id']}/complete")
    assert done.status_code == 409 and code(done) == "chunks_missing", done.text
    again = await up.create(m2)
    assert again["missing_bytes"] == size - made["missing_bytes"]
    await up.send_missing(again, v2, m2)
    assert await up.content(await up.complete(again)) == v2


async def test_the_read_ahead_ends_when_its_reader_leaves_with_the_queue_full() -> None:
    """The assembly's read-ahead task is cancelled while it waits to queue a batch nobody will take: it must end
    (it used to wait for ever to queue its own cancellation), so the packs' readers are closed."""
    import asyncio
    import contextlib

    from transfer.service.uploads.chunkbodies import _received_ahead

    async def endless() -> AsyncIterator[int]:
        n = 0
        while True:
            yield n
            n += 1

    async def take_one() -> int:
        async with contextlib.aclosing(_received_ahead(endless(), depth=1)) as ahead:
            async for item in ahead:
                await asyncio.sleep(0.05)  # the producer fills the queue meanwhile
                return item
        return -1

    assert await asyncio.wait_for(take_one(), timeout=10) == 0


async def test_an_upload_writes_objects_per_body_not_per_chunk(
    server: LiveServer, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = Uploader(http)
    data = os.urandom(2 * MiB if on_s3(server) else 4 * MiB)
    manifest = manifest_of(data, smallest=KiB, largest=15 * KiB)  # small chunks: many of them
    chunks = len(manifest.chunks)
    assert chunks >= 200
    folder = key_folder(None)
    writes = Writes(server, monkeypatch)
    made = await up.create(manifest)
    await up.send_missing(made, data, manifest, bodies=2)
    descriptor = await up.complete(made)
    assert await up.content(descriptor) == data

    packs = writes.under(folder + "packs/")
    assert len(packs) == 2  # one pack per body
    assert len(writes.under(folder + "index/")) <= 2 * INDEX_SHARDS  # one compare-and-set per shard per body
    # everything the chunk store wrote for this upload: the packs, their shards, the upload record (created, its
    # completion claimed, completed) and the manifest kept for readers; a per-chunk layout would have written
    # `chunks` objects
    assert len(writes.under(folder)) <= 2 + 2 * INDEX_SHARDS + 4 < chunks
    stored = await objects(server, folder)
    assert sorted(k for k in stored if "/packs/" in k) == sorted(packs)
    assert sum(n for k, n in stored.items() if "/packs/" in k) == len(data)  # every byte once, in the packs
    assert len([k for k in stored if "/index/" in k]) <= INDEX_SHARDS
    assert len(stored) <= 2 + INDEX_SHARDS + 2
    assert len(await index_entries(server, None)) == len(manifest.distinct())
    assert await dangling(server, None) == []


async def test_the_missing_route_refuses_what_does_not_fit_and_publishes_nothing(tenants: LiveServer) -> None:
    data = os.urandom(MiB)
    manifest = manifest_of(data)
    n = len(manifest.chunks)
    folder = key_folder("alice")
    async with httpx.AsyncClient(base_url=tenants.url, headers=key("alice"), timeout=60) as http:
        made = await Uploader(http).create(manifest)
        uid, missing = made["id"], made["missing"]
        route = f"/v1/chunked/{uid}/missing"

        async def put(start: int, count: int, content: Any, **headers: str) -> httpx.Response:
            return await http.put(route, params={"start": start, "count": count}, content=content, headers=headers)

        # outside the list the creation answered: 400 chunk_not_in_manifest; not counts at all: 400 invalid_request
        for start, count in ((n, 1), (n - 1, 2), (0, n + 1)):
            outside = await put(start, count, b"x")
            assert outside.status_code == 400 and code(outside) == "chunk_not_in_manifest", (start, count)
        for start, count in ((-1, 1), (0, 0), (0, -3)):
            bad = await put(start, count, b"x")
            assert bad.status_code == 400 and code(bad) == "invalid_request", (start, count)

        # bytes that are not the chunks the manifest names: 422, not kept
        wrong = bytearray(body(data, manifest, missing[:3]))
        wrong[5] ^= 1
        mismatch = await put(0, 3, bytes(wrong))
        assert mismatch.status_code == 422 and code(mismatch) == "chunk_checksum_mismatch"
        swapped = body(data, manifest, [missing[1], missing[0]])  # the right bytes in the wrong order
        assert (await put(0, 2, swapped)).status_code == 422

        # a body shorter or longer than its chunks: refused before a byte is stored when its length is declared
        right = body(data, manifest, missing[:3])
        for content in (right[:-1], right + b"!"):
            length = await put(0, 3, content)
            assert length.status_code == 400 and code(length) == "content_length_mismatch"

        # and when it is not (a chunked request body): found as it ends
        async def streamed(content: bytes) -> AsyncIterator[bytes]:
            for at in range(0, len(content), 10_000):
                yield content[at : at + 10_000]

        for content in (right[: manifest.chunks[0].length - 1], right + b"!"):
            length = await put(0, 3, streamed(content))
            assert length.status_code == 400 and code(length) == "content_length_mismatch"

        assert (await objects(tenants, folder + "packs/")) == {}  # none of those bodies left a pack
        assert await index_entries(tenants, "alice") == {}
        early = await http.post(f"/v1/chunked/{uid}/complete")
        assert early.status_code == 409 and code(early) == "chunks_missing"
        assert early.json()["error"]["detail"]["missing"] == missing
        assert (await http.get("/v1/files")).json()["files"] == []
        assert await objects(tenants, "files/") == {}

        # a body whose third chunk is wrong keeps the two verified before it, and only those
        wrong = bytearray(right)
        wrong[-1] ^= 1
        assert (await put(0, 3, bytes(wrong))).status_code == 422
        early = await http.post(f"/v1/chunked/{uid}/complete")
        assert early.json()["error"]["detail"]["missing"] == missing[2:]

        # the right bodies after all that: the file, whole
        await Uploader(http).send_missing({"id": uid, "missing": missing}, data, manifest)
        descriptor = await Uploader(http).complete({"id": uid})
        assert await Uploader(http).content(descriptor) == data
        assert await dangling(tenants, "alice") == []


class Fault:
    """The next chunk body's pack commit or index writes fail, as a crash between the two would leave them."""

    def __init__(self, live: LiveServer, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
        from transfer.service.accounting.recordstore import write_record as original_write

        self.armed = True
        storage = live.app.state.services.files.storage
        if where == "index":

            async def write_record(store: Any, key: str, *args: Any, **kwargs: Any) -> Any:
                if self.armed and "/index/" in key:
                    raise StorageUnavailable("injected: the index write failed")
                return await original_write(store, key, *args, **kwargs)

            monkeypatch.setattr(
                "transfer.service.accounting.recordstore.write_record", write_record
            )  # the shards' store
        else:
            original_create = storage.create
            fault = self

            class FailingCommit:
                def __init__(self, inner: Any) -> None:
                    self.inner = inner

                async def __aenter__(self) -> FailingCommit:
                    self.writer = await self.inner.__aenter__()
                    return self

                async def __aexit__(self, *exc: Any) -> Any:
                    return await self.inner.__aexit__(*exc)

                async def write(self, data: bytes) -> None:
                    await self.writer.write(data)

                async def abort(self) -> None:
                    await self.writer.abort()

                async def commit(self, metadata: dict[str, str]) -> Any:
                    if fault.armed:
                        await self.writer.abort()
                        raise StorageUnavailable("injected: the pack was lost before it was committed")
                    return await self.writer.commit(metadata)

            def create(key: str, *args: Any, **kwargs: Any) -> Any:
                writer = original_create(key, *args, **kwargs)
                return FailingCommit(writer) if "/packs/" in key else writer

            monkeypatch.setattr(storage, "create", create)


@pytest.mark.parametrize("where", ["index", "pack"])
async def test_a_crash_between_a_pack_and_its_index_leaves_no_dangling_entry(
    tenants: LiveServer, clock: Clock, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    data = os.urandom(2 * MiB)
    manifest = manifest_of(data)
    services = tenants.app.state.services
    async with httpx.AsyncClient(base_url=tenants.url, headers=key("alice"), timeout=60) as http:
        up = Uploader(http)
        made = await up.create(manifest)
        fault = Fault(tenants, monkeypatch, where)
        failed = await http.put(
            f"/v1/chunked/{made['id']}/missing",
            params={"start": 0, "count": len(made["missing"])},
            content=body(data, manifest, made["missing"]),
        )
        assert failed.status_code == 503 and code(failed) == "storage_unavailable"
        fault.armed = False
        assert await dangling(tenants, "alice") == []  # nothing the index names is missing
        assert await index_entries(tenants, "alice") == {}  # and it names nothing of that body

        # the client sends the same body again: stored, completed, whole
        await up.send_missing(made, data, manifest)
        descriptor = await up.complete(made)
        assert await up.content(descriptor) == data
        assert await dangling(tenants, "alice") == []

        # what the failure left (a pack no entry names, when it was written) is an orphan the sweep removes; the
        # bytes the key is charged for are then its file and the packs its index uses
        clock.advance(CHUNK_GRACE + 1)
        await services.sweep_now()
        folder = key_folder("alice")
        packs = await objects(tenants, folder + "packs/")
        named = {f"{folder}packs/{entry[0]}" for entry in (await index_entries(tenants, "alice")).values()}
        assert set(packs) == named
        usage = await services.files.lifecycle.usage.usage("alice")
        assert usage.used == len(data) + sum(packs.values())
        assert await up.content(descriptor) == data
        # and the next upload of the same chunks finds them
        assert (await up.create(manifest))["missing"] == []


async def test_chunks_only_another_key_stores_are_missing_for_this_one(
    tenants: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = os.urandom(MiB)
    manifest = manifest_of(secret)
    nobody = os.urandom(MiB)
    async with (
        httpx.AsyncClient(base_url=tenants.url, headers=key("alice"), timeout=60) as alice,
        httpx.AsyncClient(base_url=tenants.url, headers=key("bob"), timeout=60) as bob,
        httpx.AsyncClient(base_url=tenants.url, headers=key("carol"), timeout=60) as carol,
    ):
        stored = await Uploader(alice).upload(secret, manifest)
        alices = await objects(tenants, key_folder("alice"))
        writes = Writes(tenants, monkeypatch)

        asked = await Uploader(bob).create(manifest)  # bob names every chunk alice stores
        control = await Uploader(carol).create(manifest_of(nobody))  # carol names chunks nobody stores
        assert asked["missing"] == list(range(len(manifest.chunks))) and asked["missing_bytes"] == len(secret)
        assert control["missing"] == list(range(len(control["missing"])))
        assert sorted(asked) == sorted(control)  # the same answer, field for field, as for unknown chunks
        early = await bob.post(f"/v1/chunked/{asked['id']}/complete")
        assert early.status_code == 409 and code(early) == "chunks_missing"
        assert early.json()["error"]["detail"]["missing"] == asked["missing"]
        # a chunk sent is stored in bob's own store (stored, not "already there")
        assert await Uploader(bob).send_missing(asked, secret, manifest) == len(manifest.distinct())
        mine = await Uploader(bob).complete(asked)
        assert await Uploader(bob).content(mine) == secret
        # bob's file, manifest and chunks are his: alice's folder was not written, nor read into his
        assert writes.under(key_folder("alice")) == []
        assert await objects(tenants, key_folder("alice")) == alices
        assert len(await objects(tenants, key_folder("bob") + "packs/")) == 1
        assert await dangling(tenants, "bob") == []
        file_of = stored["metadata"]["file_id"]
        assert (await bob.get(f"/v1/files/{file_of}/chunks")).status_code == 404


async def test_deleting_a_file_keeps_the_chunks_another_file_uses(
    server: LiveServer, http: httpx.AsyncClient, clock: Clock
) -> None:
    up = Uploader(http)
    services = server.app.state.services
    v1 = os.urandom(MiB + 1 if on_s3(server) else 2 * MiB)
    v2 = changed(v1, places=2, width=500)
    m1, m2 = manifest_of(v1), manifest_of(v2)
    only_v1 = [i for i, c in enumerate(m1.chunks) if c.sha256 not in {d.sha256 for d in m2.chunks}]
    d1 = await up.upload(v1, m1)
    d2 = await up.upload(v2, m2)
    assert (await http.delete(f"/v1/files/{d1['metadata']['file_id']}")).status_code == 204

    clock.advance(CHUNK_GRACE + 1)
    swept = await services.sweep_now()
    # the chunks only the deleted file used are forgotten, and no other
    assert swept["chunks"] == len(only_v1)
    assert set(await index_entries(server, None)) == set(m2.distinct())
    assert await up.content(d2) == v2
    assert await dangling(server, None) == []
    again = await up.create(m2)
    assert again["missing"] == []  # the other file's chunks are all still stored
    assert await up.content(await up.complete(again)) == v2
    back = await up.create(m1)
    assert back["missing"] == only_v1  # the deleted file's own chunks are not


async def test_usage_repair_counts_packs_whole_and_shared_files_at_their_size(tmp_path: Path, clock: Clock) -> None:
    data, other = os.urandom(MiB + 1), os.urandom(256 * KiB)
    with running(keyed_settings(tmp_path, dedup_min_size=64 * KiB, session_gc_interval=3600), clock) as live:
        services = live.app.state.services
        ledger = services.files.lifecycle.usage
        async with (
            httpx.AsyncClient(base_url=live.url, headers=key("alice"), timeout=60) as alice,
            httpx.AsyncClient(base_url=live.url, headers=key("root"), timeout=60) as root,
        ):

            async def repair(fix: bool = False) -> dict[str, Any]:
                done = await root.post("/v1/admin/usage/repair", params={"fix": str(fix).lower()})
                assert done.status_code == 200, done.text
                entry: dict[str, Any] = done.json()["keys"]["alice"]
                return entry

            chunked = await Uploader(alice).upload(data)  # the file, and its chunks in one pack
            digest = "sha256:" + hashlib.sha256(other).hexdigest()
            plain = await alice.post("/v1/files", params={"checksum": digest, "size": len(other)}, content=other)
            assert plain.status_code == 201, plain.text
            shared = await alice.post("/v1/sessions", json={"size": len(other), "checksum": digest})
            assert shared.json()["state"] == "completed"  # a second file sharing the plain one's bytes
            expected = {"bytes_used": 2 * len(data) + 2 * len(other), "files": 3}
            entry = await repair()
            assert entry["recorded"] == entry["counted"] == expected and not entry["differs"]

            used, files, _, etag = await ledger.recorded("alice")
            assert await ledger.correct("alice", len(data), files, etag)  # the pack's charge lost
            entry = await repair(fix=True)
            assert entry["recorded"]["bytes_used"] == len(data) and entry["counted"] == expected and entry["fixed"]
            assert (await ledger.usage("alice")).used == used

            # the file deleted (by an admin) and its pack swept: the pack leaves the count and the recount alike
            gone = await root.delete(f"/v1/files/{chunked['metadata']['file_id']}")
            assert gone.status_code == 204, gone.text
            clock.advance(CHUNK_GRACE + 1)
            await services.sweep_now()
            assert await objects(live, key_folder("alice") + "packs/") == {}
            entry = await repair()
            assert entry["counted"] == {"bytes_used": 2 * len(other), "files": 2} and not entry["differs"]
