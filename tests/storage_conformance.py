"""The conformance suite every storage backend must pass. A backend's test module subclasses
:class:`StorageConformance` and provides a ``storage`` fixture (started, empty) — nothing else."""

from __future__ import annotations

import asyncio
import os

import pytest

from storage.base import Capability, CopiesRanges, Storage, SupportsCompose
from storage.errors import InvalidKey, ObjectChanged, ObjectExists, ObjectNotFound

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

    async def test_list_is_in_byte_order_across_folders(self, storage: Storage) -> None:
        # "/" sorts between "-"/"." and the digits: a folder's keys interleave with its siblings' by byte order
        keys = ["a-b", "a.c", "a/x", "a/y/z", "a0", "ab", "b", "B", "a/y-1", "a/y/0"]
        for key in keys:
            await put(storage, key, b"k")
        listed = [i.key async for i in storage.list()]
        assert listed == sorted(keys, key=lambda k: k.encode())

    async def test_list_pages_with_start_after_and_limit(self, storage: Storage) -> None:
        keys = [f"p/{i:03d}" for i in range(23)] + [f"p/sub/{i}" for i in range(3)] + ["q/0"]
        for key in keys:
            await put(storage, key, key.encode())
        under_p = sorted((k for k in keys if k.startswith("p/")), key=lambda k: k.encode())
        seen: list[str] = []
        after: str | None = None
        while True:
            page = [i.key async for i in storage.list("p/", start_after=after, limit=5)]
            assert len(page) <= 5
            seen += page
            if len(page) < 5:
                break
            after = page[-1]
        assert seen == under_p  # each once, in order, nothing from q/
        # start_after need not be a key, and may lie inside a folder or before / after the prefix
        assert [i.key async for i in storage.list("p/", start_after="p/0105", limit=2)] == ["p/011", "p/012"]
        assert [i.key async for i in storage.list("p/", start_after="p/sub/0")] == ["p/sub/1", "p/sub/2"]
        assert [i.key async for i in storage.list("p/", start_after="a", limit=1)] == ["p/000"]
        assert [i.key async for i in storage.list("p/", start_after="p/~")] == []
        assert [i.key async for i in storage.list("p/", limit=0)] == []

    async def test_list_prefix_is_a_string_prefix_and_isolates(self, storage: Storage) -> None:
        # (a key cannot also be a folder of other keys on every backend: the local one stores folders)
        for key in ("files/a/1", "files/ab/2", "files/abc", "files/b", "filesx"):
            await put(storage, key, b"x")
        assert [i.key async for i in storage.list("files/a/")] == ["files/a/1"]
        assert [i.key async for i in storage.list("files/ab/")] == ["files/ab/2"]
        assert [i.key async for i in storage.list("files/a")] == ["files/a/1", "files/ab/2", "files/abc"]
        assert [i.key async for i in storage.list("files/ab")] == ["files/ab/2", "files/abc"]
        assert [i.key async for i in storage.list("files/")] == ["files/a/1", "files/ab/2", "files/abc", "files/b"]
        assert [i.key async for i in storage.list("files")] == [
            "files/a/1",
            "files/ab/2",
            "files/abc",
            "files/b",
            "filesx",
        ]
        assert [i.key async for i in storage.list("nothing/here/")] == []

    async def test_list_reads_metadata_only_when_asked(self, storage: Storage) -> None:
        await put(storage, "m/1", b"12345", {"k": "v"})
        [bare] = [i async for i in storage.list("m/")]
        assert (bare.key, bare.size, dict(bare.metadata)) == ("m/1", 5, {})
        [full] = [i async for i in storage.list("m/", metadata=True)]
        assert (full.key, full.size, dict(full.metadata)) == ("m/1", 5, {"k": "v"})
        assert abs((full.modified - bare.modified).total_seconds()) < 2

    async def test_list_skips_keys_deleted_while_paging(self, storage: Storage) -> None:
        for i in range(6):
            await put(storage, f"d/{i}", b"x")
        listed = []
        async for info in storage.list("d/", metadata=True):
            listed.append(info.key)
            if info.key == "d/1":
                await storage.delete("d/3")
        assert listed[:3] == ["d/0", "d/1", "d/2"] and listed[-2:] == ["d/4", "d/5"]
        assert "d/3" not in listed or len(listed) == 6

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

    # -- copy_range (COPY_RANGE) -----------------------------------------------------------------------------

    async def test_copy_range_appends_a_range_of_another_object(self, storage: Storage) -> None:
        if Capability.COPY_RANGE not in storage.capabilities:
            pytest.skip("backend's writers cannot copy ranges")
        source, head, tail = os.urandom(12 << 20), os.urandom(6 << 20), os.urandom(1 << 20)
        await put(storage, "src", source)
        async with await storage.open("src") as r, storage.create("out", size_hint=17 << 20) as w:
            assert isinstance(w, CopiesRanges)
            await w.write(head)
            lead = w.copy_lead(10 << 20)  # what must be written first for the engine's rules (S3: 5 MiB parts)
            assert lead is not None and lead < 10 << 20
            await w.write(source[2 << 20 : (2 << 20) + lead])
            await w.copy_range(r, (2 << 20) + lead, 12 << 20)
            await w.write(tail)
            assert w.bytes_written == 17 << 20
            info = await w.commit({"k": "v"})
        assert info.size == 17 << 20
        assert await read_all(storage, "out") == head + source[2 << 20 : 12 << 20] + tail
        assert await read_all(storage, "src") == source  # the source stays

    async def test_copy_range_copies_the_version_open_or_nothing(self, storage: Storage) -> None:
        """A source replaced after it was opened: the copy is of the version open (what its reads gave), or the
        commit fails with ObjectChanged and publishes nothing; never the new version's bytes."""
        if Capability.COPY_RANGE not in storage.capabilities:
            pytest.skip("backend's writers cannot copy ranges")
        old, new = os.urandom(8 << 20), os.urandom(8 << 20)
        await put(storage, "src", old)
        async with await storage.open("src") as r, storage.create("out", size_hint=8 << 20) as w:
            assert isinstance(w, CopiesRanges)
            await put(storage, "src", new)
            try:
                await w.copy_range(r, 0, 8 << 20)
                await w.commit({})
            except ObjectChanged:
                with pytest.raises(ObjectNotFound):
                    await storage.stat("out")
                return
        assert await read_all(storage, "out") == old

    # -- compare-and-set (if_match) --------------------------------------------------------------------------

    async def test_a_publish_of_other_bytes_has_a_new_etag(self, storage: Storage) -> None:
        """(S3's ETag of a single PUT is the MD5 of the bytes: the same bytes again may keep it. A compare-and-set
        on bytes that are equal is still sound: what the writer read is what is there.)"""
        await put(storage, "v", b"first")
        first = (await storage.stat("v")).etag
        await put(storage, "v", b"second")
        second = (await storage.stat("v")).etag
        assert first and second and first != second
        async with await storage.open("v") as r:
            assert r.info.etag == second

    async def test_if_match_publishes_on_the_current_version(self, storage: Storage) -> None:
        await put(storage, "rec", b"v1", {"n": "1"})
        etag = (await storage.stat("rec")).etag
        async with storage.create("rec", if_match=etag) as w:
            await w.write(b"v2")
            info = await w.commit({"n": "2"})
        assert await read_all(storage, "rec") == b"v2"
        now = await storage.stat("rec")
        assert now.metadata["n"] == "2" and now.etag == info.etag != etag

    async def test_a_stale_etag_is_refused_and_nothing_changes(self, storage: Storage) -> None:
        await put(storage, "rec", b"v1", {"n": "1"})
        stale = (await storage.stat("rec")).etag
        await put(storage, "rec", b"v2", {"n": "2"})  # another writer got there first
        current = await storage.stat("rec")
        with pytest.raises(ObjectChanged):
            async with storage.create("rec", if_match=stale) as w:
                await w.write(b"v3 from stale state" * 50_000)  # large enough for a multipart upload on S3
                await w.commit({"n": "3"})
        assert await read_all(storage, "rec") == b"v2"
        after = await storage.stat("rec")
        assert after.metadata["n"] == "2" and after.etag == current.etag

    async def test_if_match_on_a_deleted_object_is_refused(self, storage: Storage) -> None:
        await put(storage, "gone", b"v1")
        etag = (await storage.stat("gone")).etag
        await storage.delete("gone")
        with pytest.raises(ObjectChanged):
            async with storage.create("gone", if_match=etag) as w:
                await w.write(b"v2")
                await w.commit({})
        with pytest.raises(ObjectNotFound):
            await storage.stat("gone")

    async def test_if_match_and_if_absent_are_exclusive(self, storage: Storage) -> None:
        with pytest.raises(ValueError, match="exclusive"):
            storage.create("x", if_absent=True, if_match="e")

    async def test_concurrent_if_match_writers_from_one_version_one_wins(self, storage: Storage) -> None:
        """Within one process every backend holds this; across processes only with ATOMIC_IF_MATCH (the local
        backend proves that one in its own module)."""
        await put(storage, "counter", b"0", {"by": "start"})
        base = (await storage.stat("counter")).etag

        async def attempt(i: int) -> bool:
            try:
                async with storage.create("counter", if_match=base) as w:
                    await w.write(str(i).encode() * 10_000)
                    await w.commit({"by": str(i)})
                return True
            except ObjectChanged:
                return False

        results = await asyncio.gather(*(attempt(i) for i in range(1, 6)))
        assert sum(results) == 1
        winner = results.index(True) + 1
        assert await read_all(storage, "counter") == str(winner).encode() * 10_000
        assert (await storage.stat("counter")).metadata["by"] == str(winner)

    async def test_a_read_modify_write_loop_loses_no_update(self, storage: Storage) -> None:
        """The way records are updated: read with the etag, write back if_match, retry on ObjectChanged."""
        await put(storage, "n", b"0")

        async def increment() -> None:
            while True:
                try:  # a pinned reader whose object was replaced raises ObjectChanged too (S3: If-Match on GET)
                    async with await storage.open("n") as r:
                        value = int(b"".join([c async for c in r.read()]))
                        etag = r.info.etag
                    async with storage.create("n", if_match=etag) as w:
                        await w.write(str(value + 1).encode())
                        await w.commit({})
                    return
                except ObjectChanged:
                    await asyncio.sleep(0)

        await asyncio.gather(*(increment() for _ in range(8)))
        assert await read_all(storage, "n") == b"8"
