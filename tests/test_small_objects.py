"""Durable small objects on local storage: a small object is written in one call at commit (nothing on disk before),
and concurrent publishes share their directory fsyncs (storage.local._DirectorySync) without any publish returning
before an fsync that covers its renames."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

import storage.local as local
from storage.errors import ObjectExists
from storage.local import LocalStorage, _DirectorySync
from tests.storage_conformance import read_all

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
    assert not (store.objects_dir / "files" / "gone").exists()


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

    monkeypatch.setattr(local, "_fsync_dir", slow_fsync)
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

    monkeypatch.setattr(local, "_fsync_dir", failing)
    with pytest.raises(OSError, match="I/O error"):
        _DirectorySync(tmp_path).sync()
