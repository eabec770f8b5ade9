"""The local filesystem backend: the conformance suite, plus what only a filesystem can show."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage.errors import BackendUnavailable
from storage.local import LocalStorage
from tests.storage_conformance import StorageConformance, put, read_all

pytestmark = pytest.mark.anyio


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[LocalStorage]:
    backend = LocalStorage(tmp_path / "store", buffer_size=64 << 10)
    await backend.start()
    yield backend
    assert list((tmp_path / "store" / "tmp").iterdir()) == []  # no temp file survives any test
    await backend.close()


class TestLocalConformance(StorageConformance):
    pass


async def test_open_reader_keeps_its_version(storage: LocalStorage) -> None:
    await put(storage, "v", b"first version")
    async with await storage.open("v") as r:
        await storage.delete("v")
        assert b"".join([c async for c in r.read()]) == b"first version"


async def test_start_sweeps_temp_files_no_live_writer_holds(tmp_path: Path) -> None:
    """A dead writer's temp files go at start-up whatever their age; a live writer's (here: another storage on the
    same directory, as another process would be) stay and still publish; other files go by age."""
    live = LocalStorage(tmp_path / "s", stale_after=3600, small_object=0)  # every write goes to the temp file
    await live.start()
    writer = live.create("files/in-flight")
    await writer.write(b"first half ")
    dead_part, dead_meta = live.tmp_dir / "dead.part", live.tmp_dir / "dead.meta"
    dead_part.write_bytes(b"x")  # what kill -9 leaves: nobody holds a lock on it
    dead_meta.write_text("{}")
    orphan_meta = live.tmp_dir / "gone.meta"  # its part went already
    orphan_meta.write_text("{}")
    stray_old, stray_new = live.tmp_dir / "stray-old", live.tmp_dir / "stray-new"
    stray_old.write_bytes(b"o")
    stray_new.write_bytes(b"n")
    old = time.time() - 7200
    os.utime(stray_old, (old, old))

    other = LocalStorage(tmp_path / "s", stale_after=3600)
    await other.start()

    left = sorted(p.name for p in live.tmp_dir.iterdir())
    assert len(left) == 2 and left[1] == "stray-new" and left[0].endswith(".part")  # the live writer's part
    await writer.write(b"second half")
    await writer.commit({})
    assert await read_all(other, "files/in-flight") == b"first half second half"
    assert sorted(p.name for p in live.tmp_dir.iterdir()) == ["stray-new"]


async def test_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(BackendUnavailable, match="cannot use data directory"):
        await LocalStorage(blocker / "sub").start()


async def test_published_file_is_the_object(storage: LocalStorage) -> None:
    await put(storage, "files/x", b"payload")
    assert (storage.objects_dir / "files" / "x").read_bytes() == b"payload"
    assert await read_all(storage, "files/x", 3) == b"load"


async def test_cancellation_at_any_moment_leaks_nothing(storage: LocalStorage, tmp_path: Path) -> None:
    """Opens finish in worker threads: a caller cancelled meanwhile (a client gone, a shutdown) must not leave an
    open descriptor or a temp file behind."""
    await put(storage, "files/a", os.urandom(1000))

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_fds()

    async def read_once() -> None:
        async with await storage.open("files/a") as reader:
            async for _ in reader.read():
                pass

    async def write_once(n: int) -> None:
        async with storage.create(f"files/w{n}") as writer:
            await writer.write(b"x" * 100)
            await writer.commit({})

    for n in range(200):
        for job in (read_once(), write_once(n)):
            task = asyncio.ensure_future(job)
            await asyncio.sleep(random.choice([0, 0, 1e-5, 1e-4, 5e-4, 2e-3]))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    await asyncio.sleep(0.3)  # threads still opening finish, and their clean-ups run
    gc.collect()
    assert open_fds() <= before
    assert list((tmp_path / "store" / "tmp").iterdir()) == []
