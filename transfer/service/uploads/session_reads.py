"""Reading a session's chunks: live while it uploads (a chunk is served once it is recorded, waiting for it up to a
bound), or after it completed (ranges of the published file), by the holder of the streaming descriptor's signed
URL (its signature is the reader's authority) or a caller who may see the session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, Self

import xxhash

from storage.base import ObjectInfo, ObjectReader, Storage, SupportsWriteAtOffset
from transfer.core.auth import TRUSTED, Grant
from transfer.core.model.content import format_timestamp
from transfer.core.uploads.lifetimes import is_expired
from transfer.core.uploads.sessions import Session, SessionState
from transfer.errors import ChunkNotReady, FileExpired, NotFound, storage_errors_translated
from transfer.service.files.publisher import Publisher
from transfer.service.files.records import FileRecord, object_key
from transfer.service.hashing import read_back
from transfer.service.uploads.session_views import chunks_path

POLL_SECONDS = 0.1

# FileService.check_signed: (method, signed path, query, raw path, the paths it may be) -> None or an error, counted
SignatureCheck = Callable[[str, str, str, bytes | str | None, tuple[str, ...]], None]


def chunk_key(sid: str, index: int) -> str:
    """The storage key of chunk ``index`` of session ``sid`` (sessions with chunk objects)."""
    return f"sessions/{sid}/chunks/{index:08d}"


def staged_key(sid: str) -> str:
    """The staged object a session's chunks are written into at their offsets (backends with WRITE_AT_OFFSET)."""
    return f"sessions/{sid}/file"


class ChunkReading:
    """The reading side of :class:`~transfer.service.uploads.sessions.SessionService` (a mixin: it reads the
    session records and waits on the arrivals the service records)."""

    storage: Storage
    publisher: Publisher
    staging: SupportsWriteAtOffset | None
    clock: Callable[[], float]
    _check_signed: SignatureCheck | None
    _arrivals: dict[str, asyncio.Event]

    async def load(self, sid: str, caller: Grant) -> Session:
        """The session, if the caller may see it (the service's)."""
        raise NotImplementedError

    async def status(self, sid: str, caller: Grant) -> dict[str, Any]:
        """What is stored and missing (the service's)."""
        raise NotImplementedError

    def _verify_signed(self, sid: str, method: str, raw_path: bytes | str | None, path: str, query: str) -> None:
        """The URL's path is exactly ``path`` as sent (the chunks path, or it plus a chunk's index) and its
        signature over the chunks path is valid and unexpired: the signature is the reader's authority."""
        if self._check_signed is None:
            raise NotFound("signed session URLs are not served here")
        self._check_signed(method, chunks_path(sid), query, raw_path, (path,))

    async def signed_status(self, sid: str, raw_path: bytes | str | None, query: str) -> dict[str, Any]:
        """The status, for the holder of a streaming descriptor's signed chunks URL."""
        self._verify_signed(sid, "GET", raw_path, chunks_path(sid), query)
        return await self.status(sid, TRUSTED)

    async def open_signed_chunk(
        self, sid: str, index: int, method: str, raw_path: bytes | str | None, query: str, wait: float
    ) -> tuple[Session, ReaderStream, int, str]:
        """:meth:`open_chunk` for the holder of a signed chunks URL (its path plus the index, written canonically)."""
        self._verify_signed(sid, method, raw_path, f"{chunks_path(sid)}/{index}", query)
        return await self.open_chunk(sid, index, wait)

    async def open_chunk(self, sid: str, index: int, wait: float) -> tuple[Session, ReaderStream, int, str]:
        """The bytes of chunk ``index`` with its length and xxh3-128; for a session still uploading, waits up to
        ``wait`` seconds for the chunk to arrive (a live read). The caller owns the stream: ``aclose()`` it (or
        use ``async with``) whether or not it iterates it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            session = await self.load(sid, TRUSTED)  # the caller holds a signed URL for this session's chunks
            session.require_readable(self.clock())
            session.check_index(index)  # after completion the size is known, so this bounds the index too
            if session.state is SessionState.COMPLETED:
                assert session.file_id is not None and session.size is not None
                start = index * session.chunk_size
                end = min(start + session.chunk_size, session.size)
                with storage_errors_translated():
                    reader = await self.storage.open(object_key(session.file_id))
                digest = session.chunk_digests[index]
                try:  # its file's expiry ends its chunk URLs too, as it ends the file's own, swept or not
                    record = FileRecord.from_metadata(reader.info.metadata)
                    _require_live(record, self.clock())
                    if not digest:  # born sharing stored bytes, none read: the chunk is hashed, then read again
                        x3 = xxhash.xxh3_128()
                        async with await self.publisher.shared.open(record) as hashed:
                            await read_back(hashed.read(start, end), x3)
                        digest = x3.hexdigest()
                    if record.content is not None:  # its object holds no bytes: they are where its record says
                        shared = await self.publisher.shared.open(record)
                        await reader.close()
                        reader = shared
                except BaseException:
                    await reader.close()
                    raise
                return session, ReaderStream(reader, start, end), end - start, digest
            if session.staged and self.staging is not None:
                part = session.parts.get(index)
                if part is not None:  # recorded: its bytes are in place and never written again
                    start = index * session.chunk_size
                    staged = _StagedChunk(self.staging, staged_key(sid), start, part.size)
                    return session, ReaderStream(staged, 0, part.size), part.size, part.xxh3
            else:
                try:
                    with storage_errors_translated():
                        reader = await self.storage.open(chunk_key(sid, index))
                    size, xxh3 = reader.info.size, reader.info.metadata.get("xxh3", "")
                    return session, ReaderStream(reader, 0, None), size, xxh3
                except NotFound:
                    pass
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ChunkNotReady(f"chunk {index} has not arrived yet", headers={"retry-after": "1"})
            event = self._arrivals.setdefault(sid, asyncio.Event())
            try:  # woken by an arrival in this process, or polling for one at another replica
                await asyncio.wait_for(event.wait(), timeout=min(POLL_SECONDS * 5, remaining))
            except TimeoutError:
                pass


def _require_live(record: FileRecord, now: float) -> None:
    """FileExpired (410) from the file's expiry on (service clock), whether or not the sweep has removed it."""
    if is_expired(record.expires_at, now):
        assert record.expires_at is not None
        expired_at = format_timestamp(record.expires_at)
        raise FileExpired(f"file {record.id} expired at {expired_at}", expired_at=expired_at)


class _StagedChunk:
    """One recorded chunk of a staged session's file, read as an :class:`ObjectReader` of its own."""

    def __init__(self, staging: SupportsWriteAtOffset, staged: str, start: int, size: int) -> None:
        self._staging = staging
        self._staged = staged
        self._start = start
        self._info = ObjectInfo(key=staged, size=size, modified=datetime.now(UTC))

    @property
    def info(self) -> ObjectInfo:
        return self._info

    async def read(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        stop = self._info.size if end is None else min(end, self._info.size)
        with storage_errors_translated():
            async for piece in self._staging.read_staged(self._staged, self._start + start, self._start + stop):
                yield piece

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class ReaderStream:
    """Bytes ``[start, end)`` of an open storage reader, owning it: ``aclose()`` closes the reader whether or not
    iteration ever started. (An async generator wrapping the reader would not: closing a generator that never
    ran does not run its ``finally``, so a HEAD, or a client gone before the first byte, leaked the descriptor.)"""

    def __init__(self, reader: ObjectReader, start: int, end: int | None) -> None:
        self._reader: ObjectReader | None = reader
        self._start = start
        self._end = end

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._reader is None:
            raise RuntimeError("the stream is closed")
        return self._reader.read(self._start, self._end)

    async def aclose(self) -> None:
        """Close the underlying reader."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()

    async def __aenter__(self) -> ReaderStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
