"""Local storage's sharded layout: a page of a listing reads the shards it passes through, not every key of the
folder; and a data directory of the earlier flat layout is migrated at start-up, losing nothing even when the
migration is cut short."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from storage.errors import BackendUnavailable
from storage.local import LocalStorage
from tests.layout import object_file, stored_keys
from tests.storage_conformance import read_all

pytestmark = pytest.mark.anyio


async def _put(storage: LocalStorage, key: str, data: bytes) -> None:
    async with storage.create(key, durable=False) as writer:
        await writer.write(data)
        await writer.commit({"name": key})


async def _filled(root: Path, keys: list[str]) -> LocalStorage:
    storage = LocalStorage(root)
    await storage.start()
    for key in keys:
        await _put(storage, key, key.encode())
    return storage


def _flatten(root: Path) -> None:
    """Turn a data directory into the flat layout the earlier version wrote: each object's bytes at
    ``objects/<key>`` (the same file, so its metadata's inode and mtime still match), no shards, no layout file."""
    storage = LocalStorage(root)
    for key in stored_keys(root):
        flat = storage.objects_dir / key
        flat.parent.mkdir(parents=True, exist_ok=True)
        os.rename(storage.object_path(key), flat)
    for shard in sorted(storage.objects_dir.rglob("@*"), reverse=True):
        shard.rmdir()
    (root / "layout").unlink()


def _on_disk(root: Path, key: str) -> list[str]:
    """Where the bytes of ``key`` are: "flat", "shard" or both."""
    storage = LocalStorage(root)
    places = [("flat", storage.objects_dir / key), ("shard", storage.object_path(key))]
    return [name for name, path in places if path.is_file()]


FILE_IDS = [f"files/f_{secrets.token_hex(16)}" for _ in range(300)]
OTHERS = ["sessions/s_1/session.json", "sessions/s_1/chunks/00000000", "sessions/s_1/file", "a", "ab", "a-b/c"]


async def test_a_page_reads_the_shard_names_and_the_shards_it_reaches_not_every_key(tmp_path: Path) -> None:
    keys = [f"files/f_{secrets.token_hex(16)}" for _ in range(2000)]
    storage = await _filled(tmp_path / "s", keys)
    read: list[str] = []
    real_scandir = os.scandir

    class Counting:
        def __init__(self, path: Any) -> None:
            self._it = real_scandir(path)

        def __enter__(self) -> Counting:
            return self

        def __exit__(self, *exc: object) -> None:
            self._it.close()

        def __iter__(self) -> Any:
            for entry in self._it:
                read.append(entry.name)
                yield entry

    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("storage.local.store.os.scandir", Counting)
            page = [info.key async for info in storage.list("files/", limit=10)]
            assert page == sorted(keys)[:10]
            first = len(read)
            read.clear()
            after = [info.key async for info in storage.list("files/", start_after=page[-1], limit=10)]
            assert after == sorted(keys)[10:20]
        # 2,000 keys in 256 shards: the shard names plus a few shards' keys, not the whole folder, per page
        assert first < 400 and len(read) < 400, (first, len(read))
        assert [info.key async for info in storage.list("files/")] == sorted(keys)
    finally:
        await storage.close()


async def test_listing_keeps_byte_order_across_shards_folders_and_short_names(tmp_path: Path) -> None:
    """Shards, folders and names shorter than a shard's prefix interleave: ``a`` < ``a-b/c`` < ``a/x`` < ``a0`` <
    ``ab`` < ``abc/d`` < ``abcd`` < ``abcd/e`` < ``abcd0``; every page boundary and prefix gives what sorting gives."""
    keys = ["a", "a-b/c", "a/x", "a/x0", "a0", "ab", "abc/d", "abcd", "abcd/e", "abcd0", "abcd-", "b", "b/c/d/e", "z9"]
    keys += [f"abcd{random.randrange(100):02d}" for _ in range(20)]
    keys = sorted(set(keys))
    storage = await _filled(tmp_path / "s", keys)
    try:
        assert [info.key async for info in storage.list()] == keys
        for prefix in ["", "a", "ab", "abc", "abcd", "abcd/", "a/", "b/c/", "zz"]:
            for start_after in [None, "a", "a-", "a/", "a/x", "ab", "abc", "abcd", "abcd/", "abcd0", "b", "~"]:
                want = [k for k in keys if k.startswith(prefix) and (start_after is None or k > start_after)]
                got = [i.key async for i in storage.list(prefix, start_after=start_after)]
                assert got == want, (prefix, start_after)
                got = [i.key async for i in storage.list(prefix, start_after=start_after, limit=3)]
                assert got == want[:3], (prefix, start_after)
    finally:
        await storage.close()


async def test_an_objects_bytes_lie_in_a_shard_of_its_folder(tmp_path: Path) -> None:
    storage = await _filled(tmp_path / "s", ["files/f_3a9c0000", "a"])
    try:
        assert object_file(storage.root, "files/f_3a9c0000") == storage.objects_dir / "files" / "@f_3a" / "f_3a9c0000"
        assert object_file(storage.root, "a") == storage.objects_dir / "@a" / "a"
        assert object_file(storage.root, "files/f_3a9c0000").read_bytes() == b"files/f_3a9c0000"
        assert (storage.root / "layout").read_text() == "2"
    finally:
        await storage.close()


async def test_a_flat_data_directory_is_migrated_and_nothing_is_lost(tmp_path: Path) -> None:
    root = tmp_path / "s"
    keys = FILE_IDS + OTHERS
    await (await _filled(root, keys)).close()
    _flatten(root)
    assert all(_on_disk(root, key) == ["flat"] for key in keys)
    storage = LocalStorage(root)
    await storage.start()
    try:
        assert all(_on_disk(root, key) == ["shard"] for key in keys)
        assert [info.key async for info in storage.list()] == sorted(keys)
        for key in keys:
            assert await read_all(storage, key) == key.encode()
            assert (await storage.stat(key)).metadata == {"name": key}  # the metadata still pairs with its bytes
        assert storage.migrate_layout() == 0  # done once: the layout file says so
    finally:
        await storage.close()


@pytest.mark.parametrize("cut", ["after a link", "before a link"])
async def test_an_interrupted_migration_loses_nothing_and_the_next_start_finishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: str
) -> None:
    """The migration dies half way (as kill -9 or a power cut would stop it: between an object's new name and the
    removal of its old one, or between two objects): every object is still under one of its names, nothing
    claims the migration done, and the next start completes it."""
    root = tmp_path / "s"
    keys = FILE_IDS + OTHERS
    await (await _filled(root, keys)).close()
    _flatten(root)
    calls = 0
    real = os.remove if cut == "after a link" else os.link

    def dies_on_the_100th(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 100:
            raise OSError(5, "Input/output error (the migration is cut here)")
        real(*args)

    with monkeypatch.context() as patch:
        patch.setattr(
            "storage.local.disk.os.remove" if cut == "after a link" else "storage.local.disk.os.link", dies_on_the_100th
        )
        with pytest.raises(BackendUnavailable):
            await LocalStorage(root).start()
    places = {key: _on_disk(root, key) for key in keys}
    assert all(places[key] for key in keys)  # every object is somewhere
    assert sum(places[key] == ["shard"] for key in keys) == 99  # the cut stopped the work half way
    assert sum(places[key] == ["flat", "shard"] for key in keys) == (1 if cut == "after a link" else 0)
    assert not (root / "layout").exists()
    storage = LocalStorage(root)
    await storage.start()
    try:
        assert all(_on_disk(root, key) == ["shard"] for key in keys)
        assert [info.key async for info in storage.list()] == sorted(keys)
        for key in keys:
            assert await read_all(storage, key) == key.encode()
    finally:
        await storage.close()


async def test_processes_starting_together_on_a_flat_directory_migrate_it_once(tmp_path: Path) -> None:
    root = tmp_path / "s"
    keys = FILE_IDS + OTHERS
    await (await _filled(root, keys)).close()
    _flatten(root)
    stores = [LocalStorage(root) for _ in range(3)]
    await asyncio.gather(*(store.start() for store in stores))
    try:
        assert all(_on_disk(root, key) == ["shard"] for key in keys)
        for store in stores:
            assert [info.key async for info in store.list()] == sorted(keys)
    finally:
        for store in stores:
            await store.close()


async def test_a_later_publish_under_the_flat_name_wins_over_an_earlier_one_in_the_shard(tmp_path: Path) -> None:
    """Both names present with different files (a shard copy left by a newer version, then a write by an older
    one): the migration keeps the later publish."""
    root = tmp_path / "s"
    await (await _filled(root, ["files/f_0001"])).close()
    storage = LocalStorage(root)
    stale = storage.object_path("files/f_0001")
    _flatten(root)
    stale.parent.mkdir(parents=True)
    shutil.copy2(storage.objects_dir / "files" / "f_0001", stale)
    os.utime(stale, ns=(1, 1))
    await storage.start()
    try:
        assert _on_disk(root, "files/f_0001") == ["shard"]
        assert await read_all(storage, "files/f_0001") == b"files/f_0001"
        assert os.stat(stale).st_mtime_ns != 1
    finally:
        await storage.close()
