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


async def test_start_sweeps_only_stale_temp_files(tmp_path: Path) -> None:
    backend = LocalStorage(tmp_path / "s", stale_after=3600)
    await backend.start()
    stale = backend.tmp_dir / "old.part"
    fresh = backend.tmp_dir / "new.part"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    await backend.start()
    assert not stale.exists() and fresh.exists()


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
