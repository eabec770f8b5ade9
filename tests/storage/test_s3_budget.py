"""One budget of part buffers for every S3 upload of a process: concurrent uploads share it and wait for it (so the
memory they hold does not grow with their number), first come first served, without deadlock, and a cancelled
waiter gives back what it held or was about to get."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from storage.budget import ByteBudget
from storage.s3 import S3Storage, S3Writer
from tests.conftest import in_progress_uploads, running, s3_config
from tests.storage_conformance import read_all
from transfer.api.protocol.bodyread import HIGH_WATER
from transfer.service.files.ingest import PACED_BATCH, _batches
from transfer.settings import Settings

pytestmark = [pytest.mark.anyio]
MiB = 1 << 20


async def test_waiters_are_served_in_arrival_order_and_nobody_overtakes() -> None:
    budget = ByteBudget(10)
    assert await budget.acquire(8) == 8
    order: list[str] = []

    async def take(name: str, n: int) -> None:
        await budget.acquire(n)
        order.append(name)

    big = asyncio.create_task(take("big", 5))
    await asyncio.sleep(0)
    small = asyncio.create_task(take("small", 1))  # would fit now, but arrived after "big"
    await asyncio.sleep(0.01)
    assert order == [] and budget.in_use == 8
    budget.release(8)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and budget.in_use == 6 and budget.peak <= 10


async def test_a_request_larger_than_the_budget_holds_the_whole_budget() -> None:
    budget = ByteBudget(10)
    assert await budget.acquire(25) == 10
    budget.release(10)
    assert budget.in_use == 0


async def test_a_cancelled_waiter_takes_nothing_and_lets_the_next_one_in() -> None:
    budget = ByteBudget(10)
    await budget.acquire(6)
    stuck = asyncio.create_task(budget.acquire(8))
    await asyncio.sleep(0)
    behind = asyncio.create_task(budget.acquire(4))
    await asyncio.sleep(0)
    assert not behind.done()  # behind the head of the queue
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert await asyncio.wait_for(behind, 5) == 4
    assert budget.in_use == 10
    with pytest.raises(RuntimeError):
        budget.release(11)


@pytest.mark.s3
async def test_concurrent_uploads_share_one_budget(s3_endpoint: Any, s3_bucket: str) -> None:
    """Six uploads of 16 MiB at once (four parts of 5 MiB each) with a budget of two parts: at no moment are more
    than two parts' bytes on their way to S3 or being filled, and every object is stored whole. (Without the budget
    each upload keeps up to 10 parts of its own in flight: 12 or more at once here.)"""
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB, buffer_budget=10 * MiB))
    await backend.start()
    lock = threading.Lock()
    sending = {"now": 0, "peak": 0}
    upload_part = backend.client.upload_part

    def counted(**kwargs: Any) -> Any:
        with lock:
            sending["now"] += len(kwargs["Body"])
            sending["peak"] = max(sending["peak"], sending["now"])
        try:
            return upload_part(**kwargs)
        finally:
            with lock:
                sending["now"] -= len(kwargs["Body"])

    backend.client.upload_part = counted  # type: ignore[method-assign]
    blobs = [os.urandom(16 * MiB) for _ in range(6)]

    async def upload(i: int) -> None:
        async with backend.create(f"files/b{i}") as writer:
            for at in range(0, len(blobs[i]), MiB):
                await writer.write(blobs[i][at : at + MiB])
            await writer.commit({})

    try:
        await asyncio.wait_for(asyncio.gather(*(upload(i) for i in range(6))), 300)
        assert 0 < sending["peak"] <= 10 * MiB, sending
        assert backend.buffers.peak <= 10 * MiB and backend.buffers.in_use == 0
        for i, blob in enumerate(blobs):
            stored = await read_all(backend, f"files/b{i}")
            assert hashlib.sha256(stored).digest() == hashlib.sha256(blob).digest()
    finally:
        await backend.close()
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []


@pytest.mark.s3
async def test_uploads_holding_the_whole_budget_still_write_their_records(s3_endpoint: Any, s3_bucket: str) -> None:
    """Three large writers and a budget of two parts: the two that hold it each write a small object (a record,
    as every upload does before it finishes) — that must not wait for the budget, or all three wait for ever."""
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB, buffer_budget=10 * MiB))
    await backend.start()
    data = os.urandom(2 * MiB)

    async def upload(i: int) -> None:
        async with backend.create(f"files/big{i}") as writer:
            await writer.write(data[:MiB])
            await writer.write(data[MiB:])  # past the unbudgeted first MiB: this one holds a part of the budget
            await asyncio.sleep(0.2)  # all three are holding or waiting now
            async with backend.create(f"records/r{i}") as record:
                await record.write(b'{"n": %d}' % i)
                await record.commit({})
            await writer.commit({})

    try:
        await asyncio.wait_for(asyncio.gather(*(upload(i) for i in range(3))), 120)
        for i in range(3):
            assert await read_all(backend, f"files/big{i}") == data
            assert await read_all(backend, f"records/r{i}") == b'{"n": %d}' % i
        assert backend.buffers.in_use == 0
    finally:
        await backend.close()


@pytest.mark.s3
async def test_a_part_occupies_no_more_memory_than_its_bytes(s3_endpoint: Any, s3_bucket: str) -> None:
    """The budget counts a part's bytes, so the buffer behind a part must not be larger: a part grown by appending
    pieces carried up to an eighth more as slack (12 parts held 130 MiB of memory under a 96 MiB budget)."""
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB))
    await backend.start()
    slack: list[int] = []
    upload_part = backend.client.upload_part
    empty = sys.getsizeof(bytearray())

    def measured(**kwargs: Any) -> Any:
        slack.append(sys.getsizeof(kwargs["Body"]) - empty - len(kwargs["Body"]))
        return upload_part(**kwargs)

    backend.client.upload_part = measured  # type: ignore[method-assign]
    blob = os.urandom(12 * MiB)
    piece = 300 << 10  # pieces that do not end on a part's boundary
    try:
        async with backend.create("files/slack") as writer:
            for at in range(0, len(blob), piece):
                await writer.write(blob[at : at + piece])
            await writer.commit({})
        assert await read_all(backend, "files/slack") == blob
    finally:
        await backend.close()
    # every part but the last is full (the last one may sit in a buffer held for a whole part: budgeted, too)
    assert len(slack) >= 2 and max(slack[:-1]) <= 64, slack


async def test_given_back_buffers_are_kept_within_the_total() -> None:
    budget = ByteBudget(10)
    held = await budget.acquire(4)
    first = budget.buffer(held)
    budget.give_back(first, held)
    assert budget.kept == 4 and budget.in_use == 0
    assert budget.buffer(await budget.acquire(4)) is first  # the same buffer serves the next holder
    other = await budget.acquire(6)
    assert budget.buffer(other) is not first and budget.in_use + budget.kept <= 10
    budget.give_back(bytearray(3), 6)  # not the size held: released, not kept
    assert budget.kept == 0 and budget.in_use == 4


@pytest.mark.s3
async def test_part_buffers_are_allocated_once_and_reused(s3_endpoint: Any, s3_bucket: str) -> None:
    """Three uploads of 21 MiB (three parts of 7 MiB: no size hint, planned for the largest object) with a budget of
    two parts: every full part is sent from one of two buffers, filled again part after part (a fresh buffer per part
    costs page faults and zeroing on the event loop), and every object is still stored whole."""
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB, buffer_budget=14 * MiB))
    await backend.start()
    bodies: list[bytearray] = []  # held, so that a freed buffer's id cannot be taken by a new one
    upload_part = backend.client.upload_part

    def seen(**kwargs: Any) -> Any:
        if len(kwargs["Body"]) == 7 * MiB:
            bodies.append(kwargs["Body"])
        return upload_part(**kwargs)

    backend.client.upload_part = seen  # type: ignore[method-assign]
    blobs = [os.urandom(21 * MiB) for _ in range(3)]  # no short last part (one that takes its buffer with it)

    async def upload(i: int) -> None:
        async with backend.create(f"files/r{i}") as writer:
            for at in range(0, len(blobs[i]), 700 << 10):
                await writer.write(blobs[i][at : at + (700 << 10)])
            await writer.commit({})

    try:
        await asyncio.wait_for(asyncio.gather(*(upload(i) for i in range(3))), 300)
        distinct = len({id(b) for b in bodies})
        assert len(bodies) == 9 and distinct <= 2, (len(bodies), distinct)
        assert backend.buffers.in_use == 0 and backend.buffers.kept <= 14 * MiB
        for i, blob in enumerate(blobs):
            assert hashlib.sha256(await read_all(backend, f"files/r{i}")).digest() == hashlib.sha256(blob).digest()
    finally:
        await backend.close()


async def test_the_body_is_read_no_further_than_the_writer_has_room() -> None:
    """The ingest pipeline asks the writer before each batch: while the writer has no room (it waits for a part
    buffer), no more of the body is read, and no batch is larger than the room."""
    pulled = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(64):
            pulled += 64 << 10
            yield b"x" * (64 << 10)

    free = asyncio.Event()

    async def room(received: int) -> int:
        if received >= 256 << 10:
            await free.wait()  # a writer waiting for the budget
            return MiB
        return (256 << 10) - received

    batches: list[int] = []

    async def read() -> None:
        async for batch in _batches(body(), MiB, 1 << 30, None, room):
            batches.append(sum(map(len, batch)))

    task = asyncio.create_task(read())
    for _ in range(20):
        await asyncio.sleep(0)
    assert pulled == 256 << 10 and sum(batches) == 256 << 10 and not task.done()
    free.set()
    await task
    assert sum(batches) == pulled == 4 * MiB and max(batches) <= MiB


@pytest.mark.s3
async def test_a_writer_without_a_part_buffer_has_no_room_until_one_is_free(s3_endpoint: Any, s3_bucket: str) -> None:
    """Two uploads and a budget of one part: the second has room for its first bytes (outside the budget), then
    none while the first holds the budget, then a part's worth once the first is stored; both objects whole."""
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB, buffer_budget=5 * MiB))
    await backend.start()
    first, second = os.urandom(5 * MiB), os.urandom(6 * MiB)  # the first: one part, held until its commit
    try:
        async with backend.create("files/first", size_hint=len(first)) as a:
            await a.write(first[:MiB])  # holds the whole budget
            async with backend.create("files/second", size_hint=len(second)) as b:
                head = await b.room_after(0)
                assert 0 < head <= 256 << 10
                await b.write(second[:head])
                waiting = asyncio.create_task(b.room_after(head))
                await asyncio.sleep(0.2)
                assert not waiting.done() and backend.buffers.in_use == 5 * MiB
                await a.write(first[MiB:])
                await a.commit({})
                assert await asyncio.wait_for(waiting, 60) == 5 * MiB - head
                await b.write(second[head:])
                await b.commit({})
        assert await read_all(backend, "files/first") == first
        assert await read_all(backend, "files/second") == second
        assert backend.buffers.in_use == 0
    finally:
        await backend.close()


@pytest.mark.s3
async def test_a_part_filled_to_its_last_byte_makes_room(s3_endpoint: Any, s3_bucket: str) -> None:
    """Body pieces that end exactly on a part's boundary: the full part is sent and the next one has room (the
    writer would otherwise wait for a byte the reader waits to read, for ever)."""
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket, part_size=5 * MiB, buffer_budget=10 * MiB))
    await backend.start()
    blob = os.urandom(12 * MiB)
    try:
        async with backend.create("files/edge", size_hint=len(blob)) as writer:
            await writer.write(blob[: 5 * MiB])
            assert await asyncio.wait_for(writer.room_after(5 * MiB), 60) > 0
            await writer.write(blob[5 * MiB :])
            await writer.commit({})
        assert await read_all(backend, "files/edge") == blob
        assert backend.buffers.in_use == 0
    finally:
        await backend.close()


@pytest.mark.s3
async def test_part_buffers_of_concurrent_uploads_stay_within_the_default_budget(
    s3_endpoint: Any, s3_bucket: str
) -> None:
    """With the service's defaults (8 MiB parts, the default budget), ten uploads that each start a part at once
    never have more than 64 MiB of part buffers handed out and kept together: the figure the 200 MB peak-RSS goal
    is built on (96 MiB of buffers left ~330 MB of RSS at 32 uploads). Counted in bytes of buffers, not RSS."""
    from transfer.settings import Settings

    default = Settings.model_fields["s3_buffer_budget"].default
    backend = S3Storage(s3_config(s3_endpoint, s3_bucket))
    assert backend.buffers.total == default, "the storage and the settings must agree on the default"
    await backend.start()
    budget = backend.buffers
    out: dict[int, int] = {}  # id -> bytes of each buffer handed out and not given back yet
    handed = {"peak": 0}
    take, give_back = budget.buffer, budget.give_back

    def counted(n: int) -> bytearray:
        buf = take(n)
        out[id(buf)] = len(buf)
        handed["peak"] = max(handed["peak"], sum(out.values()) + budget.kept)
        return buf

    def returned(buf: bytearray, held: int) -> None:
        out.pop(id(buf), None)
        give_back(buf, held)

    budget.buffer = counted  # type: ignore[method-assign]
    budget.give_back = returned  # type: ignore[method-assign]
    blobs = [os.urandom(9 * MiB) for _ in range(10)]  # a full 8 MiB part and a short one each

    async def upload(i: int) -> None:
        async with backend.create(f"files/d{i}") as writer:
            for at in range(0, len(blobs[i]), MiB):
                await writer.write(blobs[i][at : at + MiB])
            await writer.commit({})

    try:
        await asyncio.wait_for(asyncio.gather(*(upload(i) for i in range(10))), 300)
        assert 0 < handed["peak"] <= 64 * MiB and budget.peak <= 64 * MiB, (handed, budget.peak)
        assert budget.in_use == 0
        for i, blob in enumerate(blobs):
            assert hashlib.sha256(await read_all(backend, f"files/d{i}")).digest() == hashlib.sha256(blob).digest()
    finally:
        await backend.close()
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []


@pytest.mark.s3
def test_an_upload_into_s3_is_written_in_batches_of_a_socket_read_or_two(
    s3_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3's writer copies each batch into a part buffer it already holds, so the pipeline keeps its batches small
    (:data:`PACED_BATCH` and at most one body message more) and few: bytes read but not yet written are bytes held
    twice, outside the budget."""
    sizes: list[int] = []
    ahead: list[int] = []  # body bytes read past what the writer has taken, each time the pipeline asks for more
    write = S3Writer.write
    room_after = S3Writer.room_after

    async def spied(self: S3Writer, data: bytes | bytearray | memoryview) -> None:
        sizes.append(len(data))
        await write(self, data)

    async def asked(self: S3Writer, received: int) -> int:
        ahead.append(received - self.bytes_written)
        return await room_after(self, received)

    monkeypatch.setattr(S3Writer, "write", spied)
    monkeypatch.setattr(S3Writer, "room_after", asked)
    data = os.urandom(24 * MiB)
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, storage="s3")
    with running(settings) as live:
        made = httpx.post(f"{live.url}/v1/files", params={"inline": "false"}, content=data, timeout=120)
        assert made.status_code == 201, made.text
        assert made.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert sum(sizes) > len(data)  # the file, and its records
    assert len(ahead) > 20
    # a batch being read, one queued, one being hashed or written, each of PACED_BATCH and up to a socket read more:
    # 0.77 MB here; 2.05 MB with 256 KiB batches and a queue of two
    assert max(ahead) <= 3 * (PACED_BATCH + (256 << 10)), sorted(ahead)[-5:]
    assert max(sizes) <= PACED_BATCH + HIGH_WATER + (256 << 10), sorted(sizes)[-5:]  # 1 MiB batches before
