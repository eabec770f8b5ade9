"""Staged objects of the local backend (capability WRITE_AT_OFFSET): one file per staged object, written at offsets
by any number of writers and processes, published by a rename — the bytes are written once.

Layout under the data directory::

    staging/<staged key>                      the bytes (preallocated when the size is known)
    staging/<staged key>.<token>.meta         the metadata of a publish in progress (renamed into meta/)

A writer holds its region with an open-file-description lock (``F_OFD_SETLK``, Linux): it excludes every other
descriptor — another request of this process as much as another process — from overlapping bytes, and the kernel
drops it when the descriptor is closed or its process dies, so a killed writer never leaves a region held. Waiting
for a region polls (no thread is parked on a lock a slow client holds).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import fcntl
import os
import secrets
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from storage.base import ObjectInfo, validate_key
from storage.errors import BackendUnavailable, ObjectNotFound, StorageError, StorageFull

T = TypeVar("T")

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
STAGED_PIECE = 4 << 20  # bytes per read of a staged object: few thread hops (it is read to be hashed)
_LOCK_WAIT_MAX = 0.1  # seconds between two tries to take a region another writer holds
# F_OFD_SETLK (Linux 3.15+, Python 3.9+): without it, no region lock that holds between threads of one process
OFD_LOCKS = hasattr(fcntl, "F_OFD_SETLK")
_SYNC_FILE_RANGE_WRITE = 2  # sync_file_range(2): start writeback of dirty pages in the range, do not wait


def _writeback_starter() -> Callable[[int, int, int], None]:
    """``start(fd, offset, length)``: the kernel begins writing the range to disk now, in the background
    (sync_file_range with SYNC_FILE_RANGE_WRITE, Linux; the os module has no binding). Without it, a part's pages
    stay dirty until its flush, which then waits for all of them; with it, the disk works while the network
    delivers and the flush waits only for the last pieces. A no-op where the call is missing."""
    libc_name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError, TypeError):
        return lambda fd, offset, length: None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int

    def start(fd: int, offset: int, length: int) -> None:
        call(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # advisory: a failure leaves the work to the flush

    return start


start_writeback = _writeback_starter()


def _translate(exc: OSError, what: str) -> StorageError:
    if exc.errno in _FULL_ERRNOS:
        return StorageFull(f"no space left while {what}")
    if exc.errno == errno.ENOENT:
        return ObjectNotFound(what)
    return BackendUnavailable(f"filesystem error while {what}: {exc.strerror or exc}")


def _flock(kind: int, offset: int, length: int) -> bytes:
    """A ``struct flock`` (fcntl(2)) for ``[offset, offset + length)``; l_pid must be 0 for OFD locks."""
    return struct.pack("@hhqqi", kind, os.SEEK_SET, offset, length, 0)


class _Host(Protocol):
    """What the mixin needs of :class:`storage.local.store.LocalStorage`."""

    root: Path
    buffer_size: int

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T: ...

    def object_path(self, key: str) -> Path: ...

    def meta_path(self, key: str) -> Path: ...

    def publish(
        self,
        tmp: Path,
        tmp_meta: Path,
        record: dict[str, Any],
        final: Path,
        final_meta: Path,
        *,
        if_absent: bool,
        if_match: str | None = None,
        durable: bool = True,
        data_fd: int | None = None,
    ) -> ObjectInfo: ...


def staged_path(host: _Host, staged: str) -> Path:
    return host.root / "staging" / validate_key(staged)


class LocalRegionWriter:
    """A writer of one region of a staged file, holding an OFD write lock on the region while entered."""

    def __init__(self, host: _Host, path: Path, offset: int, length: int) -> None:
        if offset < 0 or length <= 0:
            raise ValueError("a region has a non-negative offset and a positive length")
        self._host = host
        self._path = path
        self._offset = offset
        self._length = length
        self._written = 0
        self._fd = -1

    @property
    def bytes_written(self) -> int:
        return self._written

    async def __aenter__(self) -> Self:
        try:
            self._fd = await self._host.run_io(os.open, self._path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:  # ENOENT: not created, published or discarded
            raise _translate(exc, f"opening staged {self._path.name}") from exc
        try:
            await self._hold()
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        return self

    async def _hold(self) -> None:
        lock = _flock(fcntl.F_WRLCK, self._offset, self._length)
        wait = 0.002
        while True:
            try:
                fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, lock)  # never blocks
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise _translate(exc, "locking a region") from exc
            await asyncio.sleep(wait)  # another writer has it: ask again
            wait = min(wait * 2, _LOCK_WAIT_MAX)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)  # releases the region (OFD locks belong to the open file description)

    def _pwrite_all(self, data: bytes | bytearray | memoryview, at: int) -> None:
        view = memoryview(data)
        start, length = at, len(view)
        while view:
            n = os.pwrite(self._fd, view, at)
            view, at = view[n:], at + n
        start_writeback(self._fd, start, length)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._fd < 0:
            raise BackendUnavailable("region writer is not entered")
        if self._written + len(data) > self._length:
            raise ValueError(f"{self._written + len(data)} bytes do not fit a region of {self._length}")
        try:
            await self._host.run_io(self._pwrite_all, data, self._offset + self._written)
        except OSError as exc:
            raise _translate(exc, "writing a region") from exc
        self._written += len(data)

    async def flush(self) -> None:
        if self._fd < 0:
            raise BackendUnavailable("region writer is not entered")
        try:
            await self._host.run_io(os.fdatasync, self._fd)
        except OSError as exc:
            raise _translate(exc, "flushing a region") from exc


class StagedFiles:
    """WRITE_AT_OFFSET for :class:`storage.local.LocalStorage` (a mixin: it uses the storage's I/O pool and its
    publish, so a staged object is published exactly as any other object is)."""

    async def create_staged(self: _Host, staged: str, size: int | None) -> None:
        """Create ``staged`` empty (idempotent); with ``size``, its blocks are reserved now, so that running out
        of space is found when the upload begins, not at its last part."""
        path = staged_path(self, staged)

        def create() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                if size:
                    os.posix_fallocate(fd, 0, size)
            finally:
                os.close(fd)

        try:
            await self.run_io(create)
        except OSError as exc:
            raise _translate(exc, f"creating staged {staged}") from exc

    def write_region(self: _Host, staged: str, offset: int, length: int) -> LocalRegionWriter:
        return LocalRegionWriter(self, staged_path(self, staged), offset, length)

    async def read_staged(self: _Host, staged: str, start: int, end: int) -> AsyncIterator[bytes]:
        path = staged_path(self, staged)
        try:
            fd = await self.run_io(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise _translate(exc, f"opening staged {staged}") from exc
        try:
            pos = start
            while pos < end:
                try:
                    piece = await self.run_io(os.pread, fd, min(STAGED_PIECE, end - pos), pos)
                except OSError as exc:
                    raise _translate(exc, f"reading staged {staged}") from exc
                if not piece:
                    raise BackendUnavailable(f"staged {staged} ends at {pos}, before {end}")
                pos += len(piece)
                yield piece
        finally:
            os.close(fd)

    async def publish_staged(self: _Host, staged: str, key: str, size: int, metadata: Mapping[str, str]) -> ObjectInfo:
        path = staged_path(self, staged)
        final, final_meta = self.object_path(key), self.meta_path(key)

        def publish() -> ObjectInfo:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            tmp_meta = path.with_name(f"{path.name}.{secrets.token_hex(8)}.meta")
            try:
                os.ftruncate(fd, size)  # the reservation may be longer than what was written
                # the publish fsyncs the bytes (already flushed part by part: quick) before renaming them
                return self.publish(
                    path,
                    tmp_meta,
                    {"metadata": dict(metadata), "size": size},
                    final,
                    final_meta,
                    if_absent=False,
                    data_fd=fd,
                )
            finally:
                os.close(fd)
                try:
                    os.remove(tmp_meta)  # renamed away unless the publish failed
                except FileNotFoundError:
                    pass
                _remove_empty_folder(path.parent)

        try:
            return await self.run_io(publish)
        except StorageError:
            raise
        except OSError as exc:
            raise _translate(exc, f"publishing staged {staged}") from exc

    async def discard_staged(self: _Host, staged: str) -> None:
        path = staged_path(self, staged)

        def discard() -> None:
            try:
                names = os.listdir(path.parent)
            except FileNotFoundError:
                return
            for name in names:  # the bytes, and the metadata of a publish that stopped half way
                if name == path.name or (name.startswith(path.name + ".") and name.endswith(".meta")):
                    try:
                        os.remove(path.parent / name)
                    except FileNotFoundError:
                        pass
            _remove_empty_folder(path.parent)

        try:
            await self.run_io(discard)
        except OSError as exc:
            raise _translate(exc, f"discarding staged {staged}") from exc


def _remove_empty_folder(folder: Path) -> None:
    """Remove the staged object's own folder if it is empty now (its parents are shared: another upload may be
    creating its folder in them this moment, so they stay)."""
    try:
        folder.rmdir()
    except OSError:  # not empty, or gone
        pass
