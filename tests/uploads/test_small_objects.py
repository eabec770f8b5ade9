"""Durable small objects on local storage: a small object is written in one call at commit (nothing on disk before),
and concurrent publishes share their directory fsyncs (storage.local.disk._DirectorySync) without any publish returning
before an fsync that covers its renames."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import storage.local.disk as disk
import storage.local.groupcommit as local
from devtools.serving import free_port
from storage.errors import BackendUnavailable, ObjectChanged, ObjectExists
from storage.local import LocalStorage
from storage.local.disk import _DirectorySync
from tests.layout import object_file, stored_keys
from tests.storage_conformance import read_all
from tests.uploads.test_sessions_resume import start_server
from transfer.core.auth import ApiKey, Scope
from transfer.core.uploads.state import FileIntent
from transfer.errors import QuotaExceeded
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.accounting.usage import UsageLedger, usage_key

pytestmark = pytest.mark.anyio


async def test_a_small_object_touches_the_disk_only_at_commit(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "s")
    await store.start()
    writer = store.create("files/small")
    await writer.write(b"a" * 3000)
    await writer.write(bytearray(b"b" * 1096))  # a caller's mutable buffer: copied, the caller may reuse it
    assert list(store.tmp_dir.iterdir()) == []
    info = await writer.commit({"k": "v"})
    assert info.size == 4096 and info.metadata == {"k": "v"}
    assert await read_all(store, "files/small") == b"a" * 3000 + b"b" * 1096
    assert list(store.tmp_dir.iterdir()) == []


async def test_a_small_object_that_grows_goes_to_its_file(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "s", small_object=10)
    await store.start()
    async with store.create("files/grown") as writer:
        await writer.write(b"0123456")  # fits: in memory
        await writer.write(b"789abcdef")  # does not: the file gets both, in order
        assert len(list(store.tmp_dir.iterdir())) == 1
        await writer.commit({})
    assert await read_all(store, "files/grown") == b"0123456789abcdef"


async def test_small_objects_aborted_or_refused_leave_nothing(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "s")
    await store.start()
    async with store.create("files/gone") as writer:
        await writer.write(b"never published")
    first = store.create("files/once", if_absent=True)
    await first.write(b"first")
    await first.commit({})
    second = store.create("files/once", if_absent=True)
    await second.write(b"second")
    with pytest.raises(ObjectExists):
        await second.commit({})
    assert await read_all(store, "files/once") == b"first"
    assert list(store.tmp_dir.iterdir()) == []  # no temp bytes or temp metadata of the refused publish
    assert not object_file(store.root, "files/gone").exists()


async def test_many_concurrent_small_publishes(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "s")
    await store.start()

    async def put(i: int) -> None:
        async with store.create(f"files/{i:03d}") as writer:
            await writer.write(i.to_bytes(2, "big") * 2048)
            await writer.commit({"i": str(i)})

    await asyncio.gather(*(put(i) for i in range(200)))
    for i in (0, 77, 199):
        assert await read_all(store, f"files/{i:03d}") == i.to_bytes(2, "big") * 2048
        assert (await store.stat(f"files/{i:03d}")).metadata == {"i": str(i)}
    await store.close()


def test_a_shared_directory_sync_always_starts_after_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every caller returns only after an fsync that began after it called (so it covers the caller's renames),
    and concurrent callers share fsyncs."""
    fsyncs: list[tuple[float, float]] = []
    lock = threading.Lock()

    def slow_fsync(path: Path) -> None:
        began = time.monotonic()
        time.sleep(0.01)  # overlap: callers arrive while one runs
        with lock:
            fsyncs.append((began, time.monotonic()))

    monkeypatch.setattr(disk, "_fsync_dir", slow_fsync)
    shared = _DirectorySync(tmp_path)
    calls: list[tuple[float, float]] = []

    def caller() -> None:
        called = time.monotonic()
        shared.sync()
        with lock:
            calls.append((called, time.monotonic()))

    threads = [threading.Thread(target=caller) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 40
    for called, returned in calls:
        assert any(called <= began and ended <= returned for began, ended in fsyncs)
    assert len(fsyncs) < 40  # shared


def test_a_failed_shared_directory_sync_fails_its_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(path: Path) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(disk, "_fsync_dir", failing)
    with pytest.raises(OSError, match="I/O error"):
        _DirectorySync(tmp_path).sync()


class _CountingStorage:
    """A LocalStorage that counts the writers opened per key (what a usage charge costs in durable writes)."""

    def __init__(self, inner: LocalStorage) -> None:
        self.inner = inner
        self.creates: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create(self, key: str, **kwargs: Any) -> Any:
        self.creates[key] = self.creates.get(key, 0) + 1
        return self.inner.create(key, **kwargs)


async def test_concurrent_charges_of_one_key_share_one_write_and_stay_exact(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "s")
    await store.start()
    counting = _CountingStorage(store)
    keys = {"alice": ApiKey("alice", "0" * 64, frozenset({Scope.UPLOAD}), max_bytes=10_000)}
    ledger = UsageLedger(RecordStore(counting), keys, shards=1)  # type: ignore[arg-type]
    # 64 charges at once of 100 bytes, and 4 of 5,000 that cannot all fit: each is decided on its own
    results = await asyncio.gather(
        *(ledger.charge("alice", f"r{i}", 100) for i in range(64)),
        *(ledger.charge("alice", f"big{i}", 5_000) for i in range(4)),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, QuotaExceeded)]
    assert all(r is True or isinstance(r, QuotaExceeded) for r in results)
    usage = await ledger.usage("alice")
    assert usage.used == 100 * 64 + 5_000 * (4 - len(refused)) <= 10_000
    assert usage.files == 64 + 4 - len(refused)
    assert len(refused) == 4  # 6,400 + 5,000 > 10,000: none of the big ones fits once the small ones are counted
    # group commit: far fewer durable writes of the record than charges (one per round, not one per charge)
    assert counting.creates[usage_key("alice")] < 68 // 4
    # a second replica's ledger over the same storage stays exact: its write makes our cached version stale
    other = UsageLedger(RecordStore(store), keys, shards=1)
    await other.charge("alice", "o", 1)
    await ledger.charge("alice", "p", 1)
    assert (await other.usage("alice")).used == (await ledger.usage("alice")).used == usage.used + 2


async def test_a_charge_cancelled_before_its_round_is_not_applied(tmp_path: Path) -> None:
    store = LocalStorage(tmp_path / "s")
    await store.start()
    ledger = UsageLedger(RecordStore(store), {}, shards=1)
    first = asyncio.ensure_future(ledger.charge(None, "a", 10))
    second = asyncio.ensure_future(ledger.charge(None, "b", 20))
    await asyncio.sleep(0)  # both queued; the first leads a round, the second waits for the lock
    assert not second.done()
    second.cancel()
    await first
    with pytest.raises(asyncio.CancelledError):
        await second
    usage = await ledger.usage(None)
    # the first round was taken before the second charge queued, and the cancelled one never runs: only "a" counts
    assert (usage.used, usage.files) == (10, 1)
    await ledger.charge(None, "c", 5)  # a later round does not pick the cancelled change up either
    assert ((await ledger.usage(None)).used, (await ledger.usage(None)).files) == (15, 2)


async def _upload_until_killed(url: str, proc: subprocess.Popen[bytes], acked: dict[str, str]) -> None:
    """64 connections storing distinct 4 KiB objects; once 300 are acknowledged the server is killed (kill -9)
    while the others are in flight. ``acked``: file id -> SHA-256 of every object answered 201."""
    killed = asyncio.Event()

    async def client(n: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            i = 0
            while not killed.is_set():
                body = os.urandom(4096)
                try:
                    answer = await http.post("/v1/files", content=body, headers={"content-type": "application/x-raw"})
                except httpx.TransportError:
                    return  # the server is gone: this upload was never acknowledged
                assert answer.status_code == 201, answer.text
                acked[answer.json()["metadata"]["file_id"]] = hashlib.sha256(body).hexdigest()
                if len(acked) >= 300 and not killed.is_set():
                    proc.send_signal(signal.SIGKILL)  # right after a 201, with uploads of the others in flight
                    killed.set()
                i += 1

    await asyncio.gather(*(client(n) for n in range(64)))


@pytest.mark.e2e
@pytest.mark.slow
def test_every_acknowledged_small_object_survives_kill_9(tmp_path: Path) -> None:
    """What a 201 promises holds after the process dies at once: each acknowledged object reads back with its
    SHA-256 from a new server on the same directory, and the usage count is not below what was acknowledged."""
    data_dir = tmp_path / "data"
    url = f"http://127.0.0.1:{free_port()}"
    first = start_server(url, data_dir)
    acked: dict[str, str] = {}
    try:
        asyncio.run(_upload_until_killed(url, first, acked))
    finally:
        first.kill()
        first.wait()
    assert len(acked) >= 300
    second = start_server(url, data_dir)
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            for file_id, sha in acked.items():
                described = http.get(f"/v1/files/{file_id}").json()
                assert described["checksum"] == "sha256:" + sha
                assert hashlib.sha256(base64.b64decode(described["data"])).hexdigest() == sha  # read from disk
            usage = http.get("/v1/usage").json()
        assert usage["files"] >= len(acked) and usage["bytes_used"] >= 4096 * len(acked)
        assert [p for p in (data_dir / "tmp").iterdir()] == []  # the dead writers' temp files were swept
    finally:
        second.kill()
        second.wait()


@pytest.mark.parametrize("mode", ["syncfs", "fsync", "off"])
async def test_group_commits_publish_every_object_and_refuse_only_the_conflicting_one(
    tmp_path: Path, mode: str
) -> None:
    store = LocalStorage(tmp_path / "s", group_sync=mode)
    await store.start()

    async def put(key: str, body: bytes, **options: Any) -> Any:
        async with store.create(key, **options) as writer:
            await writer.write(body)
            return await writer.commit({"n": body.decode()})

    # one batch: 40 new objects, two writers racing for one if-absent key, and a compare-and-set on a stale version
    first = await put("files/cas", b"v1")
    await put("files/cas", b"v2")
    results = await asyncio.gather(
        *(put(f"files/o{i}", str(i).encode()) for i in range(40)),
        put("files/once", b"a", if_absent=True),
        put("files/once", b"b", if_absent=True),
        put("files/cas", b"stale", if_match=first.etag),
        return_exceptions=True,
    )
    assert all(not isinstance(r, BaseException) for r in results[:40])
    assert sorted(type(r).__name__ for r in results[40:42]) == ["ObjectExists", "ObjectInfo"]
    assert isinstance(results[42], ObjectChanged)
    for i in range(40):
        assert await read_all(store, f"files/o{i}") == str(i).encode()
        assert (await store.stat(f"files/o{i}")).metadata == {"n": str(i)}
    assert await read_all(store, "files/cas") == b"v2"
    assert list(store.tmp_dir.iterdir()) == []


async def test_a_failed_syncfs_fails_every_object_of_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write-back error reported by syncfs: nobody in that group commit is told its object is stored, and no
    temp file stays behind (the disk error cannot be produced for real here: syncfs is replaced)."""
    store = LocalStorage(tmp_path / "s", group_sync="syncfs")
    if store.group_sync != "syncfs":
        pytest.skip("no syncfs that reports errors on this system")
    await store.start()

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(local, "_syncfs", failing)

    async def put(key: str) -> None:
        async with store.create(key) as writer:
            await writer.write(b"x" * 100)
            await writer.commit({})

    results = await asyncio.gather(*(put(f"files/f{i}") for i in range(10)), return_exceptions=True)
    assert all(isinstance(r, BackendUnavailable) for r in results), results
    assert list(store.tmp_dir.iterdir()) == []
    assert stored_keys(store.root, "files/") == []  # the first syncfs failed: nothing was renamed


@pytest.mark.skipif(local._syncfs is None, reason="syncfs(2) reporting write-back errors needs Linux 5.8 or later")
async def test_a_small_upload_waits_on_the_disk_once_for_its_charge_and_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usage charge is written (without a flush of its own) before the object's group commit, whose syncfs
    calls flush both: one commit round of two syncfs per upload, not the charge's round and then the object's.
    What is on disk when the upload returns holds both: the charge counts the file, the file reads back."""
    from transfer.service.container import Services
    from transfer.service.files.ingest import UploadRequest
    from transfer.settings import Settings

    calls: list[int] = []
    real = local._syncfs
    assert real is not None

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})
    files = Services.build(settings, LocalStorage(settings.data_dir)).files
    await files.start()
    try:
        body = os.urandom(4096)

        async def one() -> Any:
            yield body

        monkeypatch.setattr(local, "_syncfs", counted)
        record = await files.upload(one(), UploadRequest(intent=FileIntent(name="small.bin")))
        assert len(calls) == 2  # one group commit: before, the charge's own took two more, first
        usage = await files.lifecycle.usage.usage(None)
        assert (usage.used, usage.files) == (4096, 1)
        assert object_file(settings.data_dir, f"files/{record.id}").read_bytes() == body
    finally:
        await files.close()
