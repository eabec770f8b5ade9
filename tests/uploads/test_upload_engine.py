"""The one upload engine behind tus and chunked sessions: its transition table, its records (read, never a listing,
on every per-request path; updated by compare-and-set, so concurrent writers and replicas lose no part), its locks
(gone when an upload ends) and its hashing (off the event loop)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import xxhash

from storage.base import Capability, ObjectInfo
from storage.errors import ObjectExists
from storage.local import LocalStorage, LocalWriter
from transfer.core.auth import TRUSTED, ApiKey, Grant, Scope
from transfer.core.uploads.state import TRANSITIONS, FileIntent, UploadEvent, UploadState, transition
from transfer.errors import (
    ChunkConflict,
    SessionAborted,
    SessionCompleted,
    SessionExpired,
    TransferError,
    VersionConflict,
)
from transfer.service.container import Services
from transfer.service.hashing import OFFLOAD_BYTES, PieceHasher
from transfer.service.uploads.sessions import ChunkDigest, chunk_key
from transfer.settings import Settings

pytestmark = pytest.mark.anyio
CHUNK = 64 << 10
ALICE = Grant(ApiKey("alice", "0" * 64, frozenset({Scope.UPLOAD, Scope.READ})))


# -- the transition table ---------------------------------------------------------------------------------------


# the table as the engine's documentation states it, written out here by hand (not read from TRANSITIONS): a
# changed rule in the code must be changed here too, on purpose
DOCUMENTED = {
    ("open", "put_part"): "open",
    ("open", "declare_length"): "open",
    ("open", "complete"): "completed",
    ("open", "abort"): "aborted",
    ("open", "expire"): "expired",
    ("completed", "complete"): "completed",
    ("expired", "expire"): "expired",
}


def test_the_table_is_the_documented_one_and_transition_follows_it() -> None:
    for state, event in itertools.product(UploadState, UploadEvent):
        expected = DOCUMENTED.get((state.value, event.value))
        if expected is None:
            with pytest.raises(TransferError):
                transition(state, event)
        else:
            assert transition(state, event) is UploadState(expected)
    assert {(s.value, e.value): after.value for (s, e), after in TRANSITIONS.items()} == DOCUMENTED


@pytest.mark.parametrize(
    ("state", "event"),
    [pair for pair in itertools.product(UploadState, UploadEvent) if pair not in TRANSITIONS],
)
def test_every_pair_the_table_does_not_list_is_refused(state: UploadState, event: UploadEvent) -> None:
    refusal = {
        UploadState.COMPLETED: SessionCompleted,
        UploadState.ABORTED: SessionAborted,
        UploadState.EXPIRED: SessionExpired,
    }[state]
    with pytest.raises(refusal) as caught:
        transition(state, event, upload_id="u")
    assert isinstance(caught.value, TransferError)
    assert caught.value.detail["state"] == state.value and caught.value.detail["event"] == event.value


def test_an_open_upload_may_do_anything_and_ended_ones_almost_nothing() -> None:
    assert all((UploadState.OPEN, event) in TRANSITIONS for event in UploadEvent)
    ended = [
        pair for pair in TRANSITIONS if pair[0] in (UploadState.COMPLETED, UploadState.ABORTED, UploadState.EXPIRED)
    ]
    # completing again has one outcome; the sweep records what the clock decided
    assert ended == [(UploadState.COMPLETED, UploadEvent.COMPLETE), (UploadState.EXPIRED, UploadEvent.EXPIRE)]


# -- a storage that counts what the service asks of it ----------------------------------------------------------


class CountingStorage(LocalStorage):
    """The local backend, recording every list() prefix."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listed: list[str] = []

    def list(self, prefix: str = "", **kwargs: Any) -> AsyncIterator[ObjectInfo]:
        self.listed.append(prefix)
        return super().list(prefix)


async def _body(data: bytes, piece: int = 256 << 10) -> AsyncIterator[bytes]:
    for i in range(0, len(data), piece):
        yield data[i : i + piece]


def _digest(data: bytes) -> ChunkDigest:
    return ChunkDigest("xxh3-128", xxhash.xxh3_128_hexdigest(data))


class PerChunkStorage(LocalStorage):
    """Local storage without WRITE_AT_OFFSET: sessions store each chunk as an object of its own and compose them
    at completion (what S3 does, and what sessions opened before staged files keep doing)."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        return super().capabilities - {Capability.WRITE_AT_OFFSET}


async def _services(tmp_path: Path, storage: LocalStorage | None = None) -> Services:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"test": "0123456789abcdef0123456789abcdef"})
    services = Services.build(settings, storage or CountingStorage(tmp_path / "data"))
    await services.start()
    return services


async def _fill(storage: LocalStorage, n: int) -> None:
    """Objects by other clients: what a listing would walk."""
    for i in range(n):
        async with storage.create(f"files/other-{i:05d}") as w:
            await w.write(b"x" * 64)
            await w.commit({})


async def test_no_per_request_path_lists_storage(tmp_path: Path) -> None:
    """tus create, PATCH, HEAD, termination; session open, chunk PUT, status, completion, abort: each reads its
    upload's record, none lists storage (before: every tus PATCH and HEAD, every session status, completion and
    abort listed, and the local listing walked every stored object whatever the prefix)."""
    services = await _services(tmp_path)
    storage = services.files.storage.inner  # the backend under the metrics wrapper
    assert isinstance(storage, CountingStorage)
    await _fill(storage, 200)
    try:
        for caller in (TRUSTED, ALICE):
            data = os.urandom(3 * CHUNK + 5)
            upload = await services.tus.create(length=len(data), metadata={"filename": "a.bin"}, caller=caller)
            await services.tus.current(upload.id, caller)
            _, offset = await services.tus.append(upload.id, 0, _body(data[:CHUNK]), caller)
            await services.tus.current(upload.id, caller)
            done, offset = await services.tus.append(upload.id, offset, _body(data[CHUNK:]), caller)
            assert offset == len(data) and done.file_id is not None
            record = await services.files.record(done.file_id, caller)
            assert record.sha256 == hashlib.sha256(data).hexdigest()
            ended = await services.tus.create(length=10, metadata={}, caller=caller)
            await services.tus.terminate(ended.id, caller)

            session = await services.sessions.create(
                size=len(data),
                chunk_size=CHUNK,
                checksum=None,
                ttl=None,
                owner=caller.owner,
                intent=FileIntent(name="s.bin"),
            )
            for index in (3, 1, 0, 2):  # out of order
                chunk = data[index * CHUNK : (index + 1) * CHUNK]
                await services.sessions.put_chunk(session.id, index, _body(chunk), _digest(chunk), None, caller)
                await services.sessions.status(session.id, caller)
            _, file = await services.sessions.complete(session.id, caller)
            assert file.sha256 == hashlib.sha256(data).hexdigest()
            other = await services.sessions.create(
                size=None, chunk_size=CHUNK, checksum=None, ttl=None, owner=caller.owner, intent=FileIntent()
            )
            await services.sessions.abort(other.id, caller)
            await asyncio.sleep(0)
            # a key's open sessions are one compare-and-set record, not a listing of markers: nothing is listed,
            # with a key or without
            assert storage.listed == []
    finally:
        await services.close()


async def test_concurrent_chunks_from_two_replicas_are_all_recorded(tmp_path: Path) -> None:
    """Two service instances (as two replicas, each with its own locks) on one data directory put the chunks of
    one session at once: every chunk enters the one record (compare-and-set; before, there was no record to
    lose them from, only the listing)."""
    a = await _services(tmp_path, LocalStorage(tmp_path / "data"))
    b = await _services(tmp_path, LocalStorage(tmp_path / "data"))
    try:
        data = os.urandom(16 * CHUNK)
        session = await a.sessions.create(
            size=len(data), chunk_size=CHUNK, checksum=None, ttl=None, intent=FileIntent(name="r.bin")
        )

        async def send(services: Services, index: int) -> None:
            chunk = data[index * CHUNK : (index + 1) * CHUNK]
            await services.sessions.put_chunk(session.id, index, _body(chunk), _digest(chunk), None, TRUSTED)

        await asyncio.gather(*(send(a if i % 2 else b, i) for i in range(16)))
        status = await b.sessions.status(session.id, TRUSTED)
        assert status["stored"] == [[0, 15]] and status["bytes_received"] == len(data)
        _, file = await a.sessions.complete(session.id, TRUSTED)
        assert file.sha256 == hashlib.sha256(data).hexdigest()
    finally:
        await a.close()
        await b.close()


async def test_a_chunk_stored_before_a_crash_but_not_recorded_is_adopted(tmp_path: Path) -> None:
    """The state a process leaves when it stops between storing a chunk and recording it: the client, told
    nothing, sends the chunk again; the same bytes are a no-op that enters the stored chunk in the record. (Chunks
    stored one by one; for chunks written into a staged file see tests/uploads/test_sessions_staged.py.)"""
    services = await _services(tmp_path, PerChunkStorage(tmp_path / "data"))
    try:
        data = os.urandom(2 * CHUNK)
        session = await services.sessions.create(
            size=len(data), chunk_size=CHUNK, checksum=None, ttl=None, intent=FileIntent()
        )
        first = data[:CHUNK]
        async with services.files.storage.create(chunk_key(session.id, 0)) as w:
            await w.write(first)
            await w.commit({"xxh3": xxhash.xxh3_128_hexdigest(first), "sha256": ""})
        assert (await services.sessions.status(session.id, TRUSTED))["stored"] == []
        receipt = await services.sessions.put_chunk(session.id, 0, _body(first), _digest(first), None, TRUSTED)
        assert receipt.duplicate
        assert (await services.sessions.status(session.id, TRUSTED))["stored"] == [[0, 0]]
        second = data[CHUNK:]
        await services.sessions.put_chunk(session.id, 1, _body(second), _digest(second), None, TRUSTED)
        _, file = await services.sessions.complete(session.id, TRUSTED)
        assert file.sha256 == hashlib.sha256(data).hexdigest()
    finally:
        await services.close()


class _RefusedWhileInFlight(LocalWriter):
    """What S3 on Ceph answers a conditional create of a key another request is still writing: 409
    ConditionalRequestConflict (ObjectExists here), while the key has no object yet."""

    async def commit(self, metadata: Mapping[str, str]) -> ObjectInfo:
        await self.abort()
        raise ObjectExists("a concurrent conditional write of this key is in flight")


class InFlightRaceStorage(PerChunkStorage):
    """Per-chunk storage where the conditional create of the keys in ``racing`` loses to a writer not done yet."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.racing: set[str] = set()

    def create(self, key: str, **kwargs: Any) -> LocalWriter:
        if key in self.racing:
            return _RefusedWhileInFlight(self, key, kwargs.get("size_hint"), True, False, None)
        return super().create(key, **kwargs)


async def test_a_chunk_lost_to_a_writer_still_in_flight_is_a_conflict_not_a_404(tmp_path: Path) -> None:
    """Six replicas PUT one chunk on Ceph: a loser's conditional create is refused while the winner is still
    writing, so the chunk's object is not there to compare with. That is a lost race (409, send it again), and once
    the winner's object appears the loser's bytes are compared with it as usual."""
    storage = InFlightRaceStorage(tmp_path / "data")
    services = await _services(tmp_path, storage)
    try:
        data = os.urandom(2 * CHUNK)
        session = await services.sessions.create(
            size=len(data), chunk_size=CHUNK, checksum=None, ttl=None, intent=FileIntent()
        )
        first, other = data[:CHUNK], os.urandom(CHUNK)
        key = chunk_key(session.id, 0)
        storage.racing.add(key)
        with pytest.raises(VersionConflict):
            await services.sessions.put_chunk(session.id, 0, _body(first), _digest(first), None, TRUSTED)

        async def winner_finishes() -> None:
            await asyncio.sleep(0.1)
            async with LocalWriter(storage, key, None, True, False, None) as w:
                await w.write(first)
                await w.commit({"xxh3": xxhash.xxh3_128_hexdigest(first), "sha256": ""})

        finishing = asyncio.create_task(winner_finishes())
        with pytest.raises(ChunkConflict):
            await services.sessions.put_chunk(session.id, 0, _body(other), _digest(other), None, TRUSTED)
        await finishing
        storage.racing.clear()
        assert (await services.sessions.put_chunk(session.id, 0, _body(first), _digest(first), None, TRUSTED)).duplicate
        await services.sessions.put_chunk(session.id, 1, _body(data[CHUNK:]), _digest(data[CHUNK:]), None, TRUSTED)
        _, file = await services.sessions.complete(session.id, TRUSTED)
        assert file.sha256 == hashlib.sha256(data).hexdigest()
    finally:
        await services.close()


# -- locks and hashers end with their uploads -------------------------------------------------------------------


async def test_no_lock_or_hasher_outlives_its_upload(tmp_path: Path) -> None:
    """Before, TusService kept one lock per upload it ever finished, forever; sessions one per session."""
    services = await _services(tmp_path)
    engine = services.tus.engine
    assert services.sessions.engine is engine  # one engine: one set of hashers; one lifecycle: one lock table
    try:
        for _ in range(20):
            data = os.urandom(CHUNK + 1)
            upload = await services.tus.create(length=len(data), metadata={}, caller=TRUSTED)
            _, offset = await services.tus.append(upload.id, 0, _body(data[:100]), TRUSTED)
            await services.tus.current(upload.id, TRUSTED)
            await services.tus.append(upload.id, offset, _body(data[100:]), TRUSTED)
            session = await services.sessions.create(
                size=len(data), chunk_size=CHUNK, checksum=None, ttl=None, intent=FileIntent()
            )
            for index in range(2):
                chunk = data[index * CHUNK : (index + 1) * CHUNK]
                await services.sessions.put_chunk(session.id, index, _body(chunk), _digest(chunk), None, TRUSTED)
            await services.sessions.complete(session.id, TRUSTED)
            dropped = await services.tus.create(length=10, metadata={}, caller=TRUSTED)
            await services.tus.append(dropped.id, 0, _body(b"12345"), TRUSTED)
            await services.tus.terminate(dropped.id, TRUSTED)
        await asyncio.gather(*services.sessions._background)  # the sessions' hashing, run after each chunk
        assert len(services.uploads.locks) == 0
        assert engine.hashers == {}
    finally:
        await services.close()


# -- hashing stays off the event loop ---------------------------------------------------------------------------


class _ThreadRecorder:
    def __init__(self) -> None:
        self.threads: list[int] = []

    def update(self, data: bytes, /) -> None:
        self.threads.append(threading.get_ident())


async def test_large_pieces_are_hashed_in_a_thread_small_ones_inline() -> None:
    recorder = _ThreadRecorder()
    hasher = PieceHasher(recorder, None)
    await hasher.update(b"x" * OFFLOAD_BYTES)
    await hasher.update(b"x" * 100)
    loop_thread = threading.get_ident()
    assert recorder.threads[0] != loop_thread and recorder.threads[1] == loop_thread


# -- one expiry sweep per view, counting what it removed --------------------------------------------------------


async def test_sweep_expired_ends_expired_uploads_and_sessions_and_counts_them(tmp_path: Path) -> None:
    now = [1_000_000.0]
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"test": "0123456789abcdef0123456789abcdef"})
    services = Services.build(settings, LocalStorage(tmp_path / "data"), clock=lambda: now[0])
    await services.start()
    storage = services.files.storage
    try:
        upload = await services.tus.create(length=10, metadata={}, caller=TRUSTED)
        await services.tus.append(upload.id, 0, _body(b"12345"), TRUSTED)
        session = await services.sessions.create(
            size=2 * CHUNK, chunk_size=CHUNK, checksum=None, ttl=None, intent=FileIntent()
        )
        chunk = os.urandom(CHUNK)
        await services.sessions.put_chunk(session.id, 0, _body(chunk), _digest(chunk), None, TRUSTED)
        await asyncio.gather(*services.sessions._background)
        assert await services.uploads.sweep() == 0
        now[0] += settings.session_ttl + settings.session_max_ttl + 1  # past both expiries
        assert await services.uploads.sweep() == 2  # the tus upload and the session
        left = [info.key async for info in storage.list("tus/")] + [
            info.key async for info in storage.list("sessions/")
        ]
        assert not [key for key in left if "/seg/" in key or "/chunks/" in key]  # the bytes went, the records stay
        status = await services.sessions.status(session.id, TRUSTED)
        assert status["state"] == "expired" and status["stored"] == []
    finally:
        await services.close()
