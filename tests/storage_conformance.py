"""The conformance suite every storage backend must pass. A backend's test module subclasses
:class:`StorageConformance` and provides a ``storage`` fixture (started, empty) — nothing else."""

from __future__ import annotations

import asyncio
import os

import pytest

from storage.base import Capability, Storage, SupportsCompose
from storage.errors import InvalidKey, ObjectExists, ObjectNotFound

pytestmark = pytest.mark.anyio


async def put(storage: Storage, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
    async with storage.create(key, size_hint=len(data)) as w:
        for i in range(0, len(data), 100_000):
            await w.write(data[i : i + 100_000])
        await w.commit(metadata or {})


async def read_all(storage: Storage, key: str, start: int = 0, end: int | None = None) -> bytes:
    async with await storage.open(key) as r:
        return b"".join([c async for c in r.read(start, end)])


class StorageConformance:
    async def test_round_trip_with_metadata(self, storage: Storage) -> None:
        data = os.urandom(1_234_567)
        await put(storage, "files/a", data, {"k": "v", "record": '{"x":1}'})
        info = await storage.stat("files/a")
        assert info.size == len(data)
        assert dict(info.metadata) == {"k": "v", "record": '{"x":1}'}
        assert await read_all(storage, "files/a") == data
        async with await storage.open("files/a") as r:
            assert r.info.size == len(data) and r.info.metadata["k"] == "v"

    @pytest.mark.parametrize(
        ("start", "end"), [(0, 1), (0, None), (1, 2), (999_999, 1_000_001), (1_048_575, 1_048_577), (5, 5)]
    )
    async def test_ranged_reads(self, storage: Storage, start: int, end: int | None) -> None:
        data = os.urandom(1_500_000)
        await put(storage, "r", data)
        assert await read_all(storage, "r", start, end) == data[start:end]

    async def test_empty_object(self, storage: Storage) -> None:
        await put(storage, "empty", b"")
        assert (await storage.stat("empty")).size == 0
        assert await read_all(storage, "empty") == b""

    async def test_invisible_until_commit_and_abort_discards(self, storage: Storage) -> None:
        w = storage.create("pending")
        await w.write(b"x" * 1000)
        with pytest.raises(ObjectNotFound):
            await storage.stat("pending")
        assert [i.key async for i in storage.list()] == []
        await w.abort()
        await w.abort()  # idempotent
        with pytest.raises(ObjectNotFound):
            await storage.open("pending")

    async def test_exception_inside_writer_block_discards(self, storage: Storage) -> None:
        with pytest.raises(RuntimeError):
            async with storage.create("boom") as w:
                await w.write(b"partial")
                raise RuntimeError("client went away")
        with pytest.raises(ObjectNotFound):
            await storage.stat("boom")

    async def test_commit_replaces(self, storage: Storage) -> None:
        await put(storage, "k", b"old", {"v": "1"})
        await put(storage, "k", b"newer", {"v": "2"})
        assert await read_all(storage, "k") == b"newer"
        assert (await storage.stat("k")).metadata["v"] == "2"

    async def test_delete_is_idempotent(self, storage: Storage) -> None:
        await put(storage, "d", b"123")
        await storage.delete("d")
        await storage.delete("d")
        with pytest.raises(ObjectNotFound):
            await storage.stat("d")
        with pytest.raises(ObjectNotFound):
            await storage.open("d")

    async def test_list_by_prefix(self, storage: Storage) -> None:
        for key in ("files/1", "files/2", "other/3"):
            await put(storage, key, key.encode())
        assert sorted([i.key async for i in storage.list("files/")]) == ["files/1", "files/2"]
        assert len([i async for i in storage.list()]) == 3

    @pytest.mark.parametrize("key", ["", "../x", "/abs", "a//b", "a/../b", "a/./b", ".hidden", "sp ace", "a\\b"])
    async def test_invalid_keys_are_refused(self, storage: Storage, key: str) -> None:
        with pytest.raises(InvalidKey):
            storage.create(key)
        with pytest.raises((InvalidKey, ObjectNotFound)):
            await storage.stat(key)

    async def test_concurrent_writers_leave_one_complete_object(self, storage: Storage) -> None:
        blobs = [bytes([i]) * 300_000 for i in range(4)]
        await asyncio.gather(*(put(storage, "race", b) for b in blobs))
        assert await read_all(storage, "race") in blobs

    async def test_bytes_written_counts(self, storage: Storage) -> None:
        async with storage.create("count") as w:
            await w.write(b"abc")
            await w.write(memoryview(b"defg"))
            assert w.bytes_written == 7
            await w.commit({})

    async def test_if_absent_is_a_compare_and_set(self, storage: Storage) -> None:
        async with storage.create("cas", if_absent=True) as w:
            await w.write(b"first")
            await w.commit({"n": "1"})
        with pytest.raises(ObjectExists):
            async with storage.create("cas", if_absent=True) as w:
                await w.write(b"second")
                await w.commit({"n": "2"})
        assert await read_all(storage, "cas") == b"first"
        assert (await storage.stat("cas")).metadata["n"] == "1"

    async def test_concurrent_if_absent_writers_one_wins(self, storage: Storage) -> None:
        if Capability.ATOMIC_IF_ABSENT not in storage.capabilities:
            pytest.skip("this backend's conditional create is not atomic under concurrency")

        async def attempt(i: int) -> bool:
            try:
                async with storage.create("once", if_absent=True) as w:
                    await w.write(bytes([i]) * 200_000)
                    await w.commit({"i": str(i)})
                return True
            except ObjectExists:
                return False

        results = await asyncio.gather(*(attempt(i) for i in range(4)))
        assert sum(results) == 1
        winner = results.index(True)
        assert await read_all(storage, "once") == bytes([winner]) * 200_000

    async def test_compose_concatenates_in_order(self, storage: Storage) -> None:
        if Capability.COMPOSE not in storage.capabilities:
            pytest.skip("backend cannot compose")
        assert isinstance(storage, SupportsCompose)
        parts = [os.urandom(6 << 20), os.urandom(5 << 20), b"tail"]
        for i, data in enumerate(parts):
            await put(storage, f"parts/{i}", data)
        info = await storage.compose("whole", [f"parts/{i}" for i in range(3)], {"k": "v"})
        assert info.size == sum(len(p) for p in parts) and info.metadata["k"] == "v"
        assert await read_all(storage, "whole") == b"".join(parts)
        assert await read_all(storage, "parts/2") == b"tail"  # sources stay
        with pytest.raises(ObjectNotFound):
            await storage.compose("broken", ["parts/0", "parts/missing"], {})
        with pytest.raises(ObjectNotFound):
            await storage.stat("broken")
