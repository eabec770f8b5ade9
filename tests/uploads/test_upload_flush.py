"""Local storage flushes a large upload as it goes (fdatasync every ``sync_every`` bytes) without making the upload
wait for each flush: receiving and flushing overlap, and the object is still durable on commit."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from storage.local import LocalStorage
from storage.local import writer as local

pytestmark = pytest.mark.anyio


@pytest.fixture
def slow_disk(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every fdatasync of storage.local blocks until the returned event is set (a disk busy flushing: the one
    condition a test cannot produce on a real disk)."""
    release = threading.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        release.wait(30)
        real(fd)

    monkeypatch.setattr(local.os, "fdatasync", fdatasync)
    return release


async def test_writes_go_on_while_a_flush_is_in_flight_and_commit_waits_for_it(
    tmp_path: Path, slow_disk: threading.Event
) -> None:
    store = LocalStorage(tmp_path / "s", sync_every=1 << 20, small_object=0)
    await store.start()
    piece = os.urandom(1 << 20)
    async with store.create("big") as writer:
        # the first write starts a flush; the next one must not wait for it (the old writer awaited every flush,
        # so with the disk busy this never finished)
        await asyncio.wait_for(writer.write(piece), 10)
        await asyncio.wait_for(writer.write(piece[:1000]), 10)
        committing = asyncio.ensure_future(writer.commit({}))
        await asyncio.sleep(0.05)
        assert not committing.done()  # durable on commit: not before the flush in flight has ended
        slow_disk.set()
        await asyncio.wait_for(committing, 30)
    async with await store.open("big") as reader:
        assert b"".join([c async for c in reader.read()]) == piece + piece[:1000]
    await store.close()


async def test_an_abort_waits_for_the_flush_before_closing_and_leaves_nothing(
    tmp_path: Path, slow_disk: threading.Event
) -> None:
    store = LocalStorage(tmp_path / "s", sync_every=1 << 20, small_object=0)
    await store.start()
    writer = store.create("gone")
    await writer.__aenter__()
    await writer.write(os.urandom(1 << 20))  # a flush is now in flight on the temp file's descriptor
    aborting = asyncio.ensure_future(writer.abort())
    await asyncio.sleep(0.05)
    assert not aborting.done()  # its descriptor stays open until the flush has ended
    slow_disk.set()
    await asyncio.wait_for(aborting, 30)
    assert list((tmp_path / "s" / "tmp").iterdir()) == []
    await store.close()
