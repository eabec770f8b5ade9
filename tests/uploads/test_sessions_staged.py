"""Chunked sessions on local storage write each chunk at its offset into one staged file (capability
WRITE_AT_OFFSET) and complete by renaming it: no byte is copied at completion. What must hold: the published file
is the staged file itself; a recorded chunk's bytes are never written again (a repeat with other bytes, or two
writers of one chunk at once, cannot change what was hashed); a crash between writing a chunk and recording it
loses nothing; abort and expiry remove the staged file; two processes share one session."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import xxhash

from storage.base import Capability, SupportsWriteAtOffset, capable
from storage.local import LocalStorage
from tests.layout import object_file
from transfer.core.auth import TRUSTED
from transfer.core.uploads.state import FileIntent
from transfer.errors import ChunkConflict, TransferError
from transfer.service.container import Services
from transfer.service.uploads.sessions import ChunkDigest, staged_key
from transfer.settings import Settings

pytestmark = pytest.mark.anyio
CHUNK = 256 << 10
SIGNING = {"test": "0123456789abcdef0123456789abcdef"}


async def _body(data: bytes, piece: int = 64 << 10, pause: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    for i in range(0, len(data), piece):
        if pause is not None and i:
            await pause.wait()  # half sent: the writer holds its region here
        yield data[i : i + piece]


def _digest(data: bytes) -> ChunkDigest:
    return ChunkDigest("xxh3-128", xxhash.xxh3_128_hexdigest(data))


async def _services(tmp_path: Path, now: list[float] | None = None) -> Services:
    settings = Settings(data_dir=tmp_path / "data", signing_keys=SIGNING)
    clock: dict[str, Any] = {} if now is None else {"clock": lambda: now[0]}
    services = Services.build(settings, LocalStorage(tmp_path / "data"), **clock)
    await services.start()
    return services


async def _enter_and_leave(region: Any) -> None:
    async with region:
        pass


def _staged_file(tmp_path: Path, sid: str) -> Path:
    return tmp_path / "data" / "staging" / staged_key(sid)


async def _open(services: Services, size: int) -> str:
    session = await services.sessions.create(
        size=size, chunk_size=CHUNK, checksum=None, ttl=None, intent=FileIntent(name="s.bin")
    )
    assert session.staged
    return session.id


async def _put(services: Services, sid: str, index: int, data: bytes) -> Any:
    chunk = data[index * CHUNK : (index + 1) * CHUNK]
    return await services.sessions.put_chunk(sid, index, _body(chunk), _digest(chunk), None, TRUSTED)


async def test_local_storage_declares_write_at_offset(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path)
    assert capable(storage, Capability.WRITE_AT_OFFSET, SupportsWriteAtOffset) is storage


async def test_completion_publishes_the_staged_file_itself(tmp_path: Path) -> None:
    """Before, completion composed the chunks into a new file (a second write of every byte: ~1 s per GiB here);
    now the published object is the very file the chunks were written into (same inode), and nothing is left."""
    services = await _services(tmp_path)
    try:
        data = os.urandom(4 * CHUNK + 1000)
        sid = await _open(services, len(data))
        for index in (4, 2, 0, 3, 1):  # out of order
            await _put(services, sid, index, data)
        staged = _staged_file(tmp_path, sid)
        inode = staged.stat().st_ino
        _, record = await services.sessions.complete(sid, TRUSTED)
        assert record.sha256 == hashlib.sha256(data).hexdigest() and record.size == len(data)
        published = object_file(tmp_path / "data", f"files/{record.id}")
        assert published.stat().st_ino == inode and published.read_bytes() == data
        assert not staged.exists() and not staged.parent.exists()
        assert not [info.key async for info in services.files.storage.list("sessions/") if "/chunks/" in info.key]
    finally:
        await services.close()


async def test_a_repeat_with_other_bytes_never_overwrites_a_recorded_chunk(tmp_path: Path) -> None:
    """A recorded chunk sent again with other (self-consistent) bytes is ChunkConflict and its region is not
    written: the bytes the hasher verified are the ones published."""
    services = await _services(tmp_path)
    try:
        data = os.urandom(2 * CHUNK)
        sid = await _open(services, len(data))
        await _put(services, sid, 0, data)
        other = os.urandom(CHUNK)
        with pytest.raises(ChunkConflict):
            await services.sessions.put_chunk(sid, 0, _body(other), _digest(other), None, TRUSTED)
        assert (await _put(services, sid, 0, data)).duplicate  # the same bytes: a no-op
        await _put(services, sid, 1, data)
        _, record = await services.sessions.complete(sid, TRUSTED)
        assert record.sha256 == hashlib.sha256(data).hexdigest()
    finally:
        await services.close()


async def test_two_writers_of_one_chunk_take_turns(tmp_path: Path) -> None:
    """Two PUTs of chunk 0 with different bytes at once: the second waits for the first's region, then finds
    the chunk recorded and only compares (ChunkConflict); the first's bytes are intact."""
    services = await _services(tmp_path)
    try:
        data = os.urandom(2 * CHUNK)
        sid = await _open(services, len(data))
        first, other = data[:CHUNK], os.urandom(CHUNK)
        pause = asyncio.Event()
        a = asyncio.ensure_future(
            services.sessions.put_chunk(sid, 0, _body(first, pause=pause), _digest(first), None, TRUSTED)
        )
        await asyncio.sleep(0.2)  # a holds the region, half written
        b = asyncio.ensure_future(services.sessions.put_chunk(sid, 0, _body(other), _digest(other), None, TRUSTED))
        await asyncio.sleep(0.2)
        assert not b.done()  # waiting for the region, not writing into it
        pause.set()
        assert not (await a).duplicate
        with pytest.raises(ChunkConflict):
            await b
        await _put(services, sid, 1, data)
        _, record = await services.sessions.complete(sid, TRUSTED)
        assert record.sha256 == hashlib.sha256(data).hexdigest()
    finally:
        await services.close()


async def test_a_crash_between_writing_a_chunk_and_recording_it_loses_nothing(tmp_path: Path) -> None:
    """The process stops after the chunk's bytes are in the staged file (flushed, even) but before the record
    says so: the client, told nothing, sends the chunk again; it is written again and recorded. The same for a
    chunk cut half way with garbage left in its region."""
    services = await _services(tmp_path)
    try:
        data = os.urandom(3 * CHUNK)
        sid = await _open(services, len(data))
        uploads = services.uploads  # every record change goes through the one lifecycle
        real_update = uploads.change
        calls = 0

        async def crash_once(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("process stopped before the record was written")
            return await real_update(*args, **kwargs)

        uploads.change = crash_once  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            await _put(services, sid, 1, data)
        uploads.change = real_update  # type: ignore[method-assign]
        assert _staged_file(tmp_path, sid).read_bytes()[CHUNK : 2 * CHUNK] == data[CHUNK : 2 * CHUNK]
        assert (await services.sessions.status(sid, TRUSTED))["stored"] == []
        # a chunk cut half way: garbage in its region, nothing recorded
        staging = services.sessions.staging
        assert staging is not None
        async with staging.write_region(staged_key(sid), 2 * CHUNK, CHUNK) as region:
            await region.write(os.urandom(CHUNK // 2))
        for index in (1, 2, 0):
            assert not (await _put(services, sid, index, data)).duplicate
        _, record = await services.sessions.complete(sid, TRUSTED)
        assert record.sha256 == hashlib.sha256(data).hexdigest()
    finally:
        await services.close()


async def test_abort_and_expiry_remove_the_staged_file(tmp_path: Path) -> None:
    now = [1_000_000.0]
    services = await _services(tmp_path, now)
    try:
        data = os.urandom(2 * CHUNK)
        aborted, expiring = await _open(services, len(data)), await _open(services, len(data))
        for sid in (aborted, expiring):
            await _put(services, sid, 0, data)
            assert _staged_file(tmp_path, sid).exists()
        await services.sessions.abort(aborted, TRUSTED)
        assert not _staged_file(tmp_path, aborted).exists()
        with pytest.raises(TransferError):  # a chunk after the abort is refused and writes nothing back
            await _put(services, aborted, 1, data)
        assert not _staged_file(tmp_path, aborted).exists()
        await asyncio.gather(*services.sessions._background)
        settings = services.sessions.settings
        now[0] += settings.session_ttl + settings.session_max_ttl + 1
        assert await services.uploads.sweep() >= 1
        assert not _staged_file(tmp_path, expiring).exists()
        assert (await services.sessions.status(expiring, TRUSTED))["state"] == "expired"
        now[0] += settings.session_retention + settings.session_max_ttl + 1  # the ended sessions' records go too
        await services.uploads.sweep()
        assert not [info.key async for info in services.files.storage.list("sessions/")]
        assert [p.name for p in (tmp_path / "data" / "staging").rglob("*")] == ["sessions"]  # the shared folder
    finally:
        await services.close()


async def test_two_processes_share_one_session_and_its_regions(tmp_path: Path) -> None:
    """Two service instances (two replicas on one data directory, each with its own storage object and so its own
    descriptors) write chunks of one session at once and complete on either; a region one of them holds is
    waited for by the other (OFD locks hold between descriptors, not only between processes)."""
    a, b = await _services(tmp_path), await _services(tmp_path)
    try:
        data = os.urandom(8 * CHUNK)
        sid = await _open(a, len(data))
        await asyncio.gather(*(_put(a if i % 2 else b, sid, i, data) for i in range(8)))
        assert (await a.sessions.status(sid, TRUSTED))["stored"] == [[0, 7]]
        staging_a, staging_b = a.sessions.staging, b.sessions.staging
        assert staging_a is not None and staging_b is not None
        await staging_a.create_staged("sessions/probe", 20)
        held = staging_a.write_region("sessions/probe", 0, 10)
        await held.__aenter__()
        waiting = asyncio.ensure_future(_enter_and_leave(staging_b.write_region("sessions/probe", 5, 10)))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # overlapping: waits
        async with staging_b.write_region("sessions/probe", 10, 10):  # not overlapping: enters at once
            pass
        await held.__aexit__(None, None, None)
        await asyncio.wait_for(waiting, 10)
        await staging_a.discard_staged("sessions/probe")
        _, record = await b.sessions.complete(sid, TRUSTED)
        assert record.sha256 == hashlib.sha256(data).hexdigest()
    finally:
        await a.close()
        await b.close()
