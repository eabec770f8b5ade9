"""The local filesystem backend: the conformance suite, plus what only a filesystem can show."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import random
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from storage.base import Capability
from storage.errors import BackendUnavailable
from storage.local import COPY_MIN, LocalStorage
from tests.layout import object_file
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


async def test_copy_range_copies_runs_of_a_mebibyte_or_more_from_the_open_version(storage: LocalStorage) -> None:
    """A shorter range is written (copy_lead None: a thread hop for nothing), a longer one copied whole, from the
    descriptor the reader holds: a source deleted after it was opened is still copied, pending small bytes first."""
    source = os.urandom(3 << 20)
    await put(storage, "src", source)
    async with await storage.open("src") as r, storage.create("out") as w:
        assert w.copy_lead(COPY_MIN - 1) is None and w.copy_lead(COPY_MIN) == 0
        with pytest.raises(ValueError):
            await w.copy_range(r, 0, COPY_MIN - 1)
        await storage.delete("src")
        await w.write(b"head")  # small: still in memory when the copy comes
        await w.copy_range(r, 1 << 20, 3 << 20)
        await w.write(b"tail")
        await w.commit({})
    assert await read_all(storage, "out") == b"head" + source[1 << 20 :] + b"tail"


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
    assert object_file(storage.root, "files/x").read_bytes() == b"payload"
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
    # threads still opening finish and their clean-ups run; group commits a cancelled caller left go on to their
    # end (a syncfs can take seconds while other processes write): waited for, not assumed done in a fixed time
    deadline = time.monotonic() + 30
    while True:
        await asyncio.sleep(0.1)
        gc.collect()
        fds, temps = open_fds(), list((tmp_path / "store" / "tmp").iterdir())
        if fds <= before and not temps or time.monotonic() > deadline:
            break
    assert fds <= before
    assert temps == []


async def test_list_reads_only_the_prefix_folder_and_what_follows_start_after(
    storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page costs the folders it passes through: neither a sibling folder nor a folder wholly before start_after
    is read, and no metadata file is opened without ``metadata=True``."""
    for i in range(30):
        await put(storage, f"big/{i:02d}", b"x")
    for i in range(3):
        await put(storage, f"small/a/{i}", b"x")
        await put(storage, f"small/b/{i}", b"x")
    scanned: list[str] = []
    real_scandir = os.scandir

    def spy(path: Any) -> Any:
        scanned.append(os.path.relpath(path, storage.objects_dir))
        return real_scandir(path)

    metas: list[str] = []
    real_read_meta = storage._read_meta
    monkeypatch.setattr("storage.local.store.os.scandir", spy)
    monkeypatch.setattr(storage, "_read_meta", lambda key: metas.append(key) or real_read_meta(key))
    assert [i.key async for i in storage.list("small/", start_after="small/a0", limit=2)] == ["small/b/0", "small/b/1"]
    assert scanned == ["small", "small/b", "small/b/@0", "small/b/@1"] and metas == []  # not small/b's third shard
    assert [i.metadata async for i in storage.list("small/b/", limit=1, metadata=True)] == [{}]
    assert metas == ["small/b/0"]


def _increment_many(root: str, times: int) -> int:
    """In a process of its own: read-modify-write the counter ``times`` times with if_match; returns retries."""
    from storage.errors import ObjectChanged

    async def run() -> int:
        store = LocalStorage(root)
        await store.start()
        retries = 0
        for _ in range(times):
            while True:
                async with await store.open("counter") as r:
                    value = int(b"".join([c async for c in r.read()]))
                    etag = r.info.etag
                try:
                    async with store.create("counter", if_match=etag, durable=False) as w:
                        await w.write(str(value + 1).encode())
                        await w.commit({})
                    break
                except ObjectChanged:
                    retries += 1
        return retries

    return asyncio.run(run())


async def test_compare_and_set_holds_between_processes(tmp_path: Path) -> None:
    """Four processes increment one counter with if_match: no increment is lost, so the compare and the publish
    were one step for every process (the key's flock'd lock stripe), not only within one event loop."""
    import concurrent.futures
    import multiprocessing

    root = tmp_path / "shared"
    store = LocalStorage(root)
    await store.start()
    await put(store, "counter", b"0")
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(4, mp_context=ctx) as pool:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(pool, _increment_many, str(root), 25) for _ in range(4)))
    assert await read_all(store, "counter") == b"100"
    assert Capability.ATOMIC_IF_MATCH in store.capabilities


async def test_a_reader_never_pairs_bytes_with_another_publish_s_version(storage: LocalStorage) -> None:
    """A publish renames the metadata, then the bytes: a reader in between would see new metadata (and version)
    with the old bytes, and a compare-and-set based on that pair would overwrite an update it never saw."""
    await put(storage, "rec", b"0")
    stop = asyncio.Event()

    async def writer() -> None:
        for i in range(1, 200):
            await put(storage, "rec", str(i).encode())
        stop.set()

    async def reader() -> None:
        seen: dict[str, bytes] = {}
        while not stop.is_set():
            async with await storage.open("rec") as r:
                data = b"".join([c async for c in r.read()])
                assert seen.setdefault(r.info.etag, data) == data  # one version, one content

    await asyncio.gather(writer(), reader(), reader())


async def test_pieces_written_in_one_call_land_in_order_even_when_the_kernel_takes_them_in_part(
    storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``write_many`` hands several pieces to one ``writev``; a regular file's write may still end early (a signal,
    a file-size limit), and what is left of a piece, and the pieces after it, must follow in order. The kernel's
    partial write is the one fault here that cannot be produced on demand: ``writev`` is made to take at most
    100,003 bytes (a prime, so the cuts fall inside pieces and on no boundary)."""
    real = os.writev
    calls: list[int] = []

    def partial(fd: int, buffers: list[memoryview]) -> int:
        left, taken = 100_003, []
        for b in buffers:
            if left <= 0:
                break
            taken.append(b[:left])
            left -= len(taken[-1])
        calls.append(len(buffers))
        return real(fd, taken)

    monkeypatch.setattr(os, "writev", partial)
    pieces = [random.randbytes(n) for n in (70_000, 1, 250_000, 0, 131_072, 99_999)]
    head = random.randbytes(storage.small_object)  # past the size kept in memory: the pieces go to the file
    async with storage.create("files/many") as writer:
        await writer.write(head)
        await writer.write_many(pieces)
        await writer.write_many(pieces[:1])  # one piece: a plain write
        assert writer.bytes_written == len(head) + sum(map(len, pieces)) + len(pieces[0])
        await writer.commit({})
    assert await read_all(storage, "files/many") == head + b"".join(pieces) + pieces[0]
    assert len(calls) >= 5 and max(calls) > 1  # several writev calls, some of several pieces


@pytest.mark.parametrize("if_absent", [True, False])
async def test_a_publish_into_a_folder_removed_behind_its_back_makes_it_again(
    storage: LocalStorage, if_absent: bool
) -> None:
    """The storage remembers the folders it made (a mkdir per publish costs two failing system calls); one removed
    by hand meanwhile (a cleanup, a restore) is made again by the publish that finds it gone, which then succeeds:
    no error for an upload that did nothing wrong, and never a metadata file published without its bytes."""
    await put(storage, "files/f_aa01", b"first")  # the shard folder of f_aa… is made and remembered
    for folder in {storage.object_path("files/f_aa01").parent, storage.meta_path("files/f_aa01").parent}:
        shutil.rmtree(folder)
    async with storage.create("files/f_aa02", if_absent=if_absent) as writer:
        await writer.write(b"second")
        await writer.commit({"k": "v"})
    assert await read_all(storage, "files/f_aa02") == b"second"
    assert (await storage.stat("files/f_aa02")).metadata == {"k": "v"}
