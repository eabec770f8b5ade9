"""Local filesystem backend (the embedded default), on aiofiles.

Layout under ``root``::

    objects/<folder>/@<shard>/<name>   the bytes of the published object ``<folder>/<name>``
    meta/<key>.json      its metadata (written and renamed into place before the bytes are)
    tmp/                 objects being written: ``<random>.part`` and ``<random>.meta``
    locks/<n>.lock       lock stripes: every publish and delete of a key holds its stripe's ``flock``
    layout               the version of this layout (absent: every object lies at ``objects/<key>``)

Objects are sharded by the first characters of their name (``files/f_3a9c…`` lies in ``files/@f_3a/``), so one
folder of keys is a few hundred shard directories, none holding more than a slice of the keys, and a page of a
listing reads the shard names and the shards it passes through, not every key of the folder: shards sort in the
order of the keys they hold. ``@`` never starts a key segment, so a shard cannot be mistaken for a folder of keys.
Data directories of the earlier flat layout are migrated at start-up (:meth:`LocalStorage.migrate_layout`), one
hard link and one unlink per object, so an interrupted migration leaves each object under its old name, its new
name or both (the same inode), and the next start finishes it.

Publishing is temp file + fsync + rename (+ fsync of the directory), so a reader sees either nothing or the whole
object with its metadata; a crash leaves only files under ``tmp/``, which :meth:`LocalStorage.start` sweeps.

Small objects are durable at the cost of a few fsyncs each, and fsync latency, not CPU, bounds how many a second
can be stored if each pays its own. So a durable object whose bytes all fit in memory (``small_object``) is
published by a **group commit** (``group_sync``, setting ``TRANSFER_LOCAL_SYNC``): the objects committed while
earlier commits wait on the disk are taken together by one I/O thread (up to ``group_commits`` commits in flight),
which

1. writes every object's temp file and temp metadata (no fsync);
2. makes them durable: ``syncfs`` mode, one ``syncfs(2)`` of the filesystem (every dirty page and inode in it,
   ours included); ``fsync`` mode, an fsync of each temp file and temp metadata, all at once on helper threads
   (concurrent fsyncs share the journal's commits);
3. renames each object into place under its key's lock stripe (compare-and-set as for any publish);
4. makes the renames durable: a second ``syncfs``, or one fsync of each folder they were made in;
5. only then answers every caller of the batch (an error in 2 or 4 fails all of them; a refused rename in 3
   fails only its own).

When a caller hears "stored", its bytes and metadata were on disk before its names were made (2 before 3), and its
names are on disk (4): a power cut after the answer loses nothing, and one before it leaves at worst temp files,
which the start-up sweep removes, or an object published but never acknowledged. ``syncfs`` reports write-back
errors only since Linux 5.8 (and only those after its descriptor was opened, which is before the batch's first
write): elsewhere the ``fsync`` mode is used. ``syncfs`` also flushes other writers' dirty data on the same
filesystem: on a volume shared with busy writers the ``fsync`` mode keeps small objects' latency their own.

Large objects (and ``group_sync="off"``) publish one by one on the storage's own I/O pool (``io_threads``: many
publishes wait on the disk at once), with the bytes' fsync alongside the metadata's and the directory fsyncs of
concurrent publishes shared (:class:`_DirectorySync`: one fsync of a directory covers every rename made in it
before that fsync started).

Several processes may share one data directory, so the sweep must tell a dead writer's temp file from a live one's:
each writer holds an exclusive ``flock`` on its ``.part`` file from creation until it is published or removed (the
kernel drops it when the process dies, kill -9 included), and a sweep deletes only the ``.part`` files it can lock
itself without waiting. A ``<token>.meta`` exists only while its ``<token>.part`` does, so one without its part is
an orphan. Creating and locking a part is not one system call: writers do both under a shared ``flock`` of ``tmp/``
and the sweep holds it exclusively, so it never sees a part created but not yet locked. (``flock`` is per open file
description: this holds between processes on one host and between storages in one process alike; on NFS it needs
working lock support.)

Compare-and-set: each publish writes a new version token into the metadata record (with the inode and mtime of
the bytes it belongs to, so a reader that catches a publish between its two renames notices and reads again).
``create(key, if_match=v)`` compares the current token with ``v`` and publishes while holding the key's lock stripe
(``flock`` on ``locks/<n>.lock``, one of a fixed number, so they never need removing), which every other publish
and delete of that key takes too: the compare and the renames are one step for every process on the host.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import heapq
import itertools
import json
import os
import platform
import re
import secrets
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import aiofiles
import aiofiles.os
from aiofiles.threadpool.binary import AsyncFileIO

from storage.base import Capability, ObjectInfo, ObjectReader, ReaderContext, WriterContext, validate_key
from storage.errors import (
    BackendUnavailable,
    ObjectChanged,
    ObjectExists,
    ObjectNotFound,
    StorageError,
    StorageFull,
)
from storage.local_staged import OFD_LOCKS, StagedFiles

T = TypeVar("T")

_cleanups: set[asyncio.Future[None]] = set()  # clean-ups of opens that finished after their caller was cancelled

_LIST_BATCH = 256  # keys stat-ed per thread hop while listing
# what every local storage offers (asked on every descriptor: one set, not a new one per call)
_CAPABILITIES = frozenset(
    {Capability.COMPOSE, Capability.COPY_RANGE, Capability.ATOMIC_IF_ABSENT, Capability.ATOMIC_IF_MATCH}
    | ({Capability.WRITE_AT_OFFSET} if OFD_LOCKS else set())
)
_FOLDER, _SHARD, _NAME = 0, 1, 2  # what a listing walk's heap holds: a sub-folder, a shard, a key
_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")  # folders keys can be in

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
COPY_MIN = 1 << 20  # the shortest range a writer's copy_range takes (a shorter one is written: see copy_lead)
LOCK_STRIPES = 256  # lock files under locks/: keys share them by hash (a publish holds one for microseconds)
MAX_SHARED_DIRECTORIES = 1024  # directories with a group-commit fsync; any others are fsynced alone
MAX_KNOWN_FOLDERS = 16384  # folders remembered as existing (others cost a failing mkdir per publish)

SHARD_MARK = "@"  # starts a shard directory's name; no key segment can start with it
SHARD_WIDTH = 4  # a name's first characters that choose its shard: ``f_`` + two hex digits for file ids
LAYOUT_VERSION = "2"  # what the ``layout`` file of a data directory in this layout holds


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


def shard_of(name: str) -> str:
    """The shard directory that holds the object named ``name`` (the last segment of its key)."""
    return SHARD_MARK + name[:SHARD_WIDTH]


def _translate(exc: OSError, what: str) -> StorageError:
    if exc.errno in _FULL_ERRNOS:
        return StorageFull(f"no space left while {what}")
    if exc.errno == errno.ENOENT:
        return ObjectNotFound(what)
    return BackendUnavailable(f"filesystem error while {what}: {exc.strerror or exc}")


def _create_locked(path: Path, tmp_dir: Path) -> int:
    """Create ``path`` (it must not exist) for writing, holding an exclusive flock on it: the mark of a live
    writer that the temp-file sweep respects. Returns the descriptor; the lock lasts until it is closed."""
    dfd = os.open(tmp_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(dfd, fcntl.LOCK_SH)  # no sweep between our create and our lock
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else can hold it
        except BaseException:
            os.close(fd)
            os.remove(path)
            raise
        return fd
    finally:
        os.close(dfd)  # releases the shared lock


def _version(record: dict[str, Any], st: os.stat_result) -> str:
    """The version token of a published object: the one its publish wrote, or (a record written before tokens
    existed) one derived from the bytes' inode, mtime and size."""
    token = record.get("version")
    return str(token) if token else f"i{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"


def _torn(record: dict[str, Any], st: os.stat_result) -> bool:
    """True when ``record`` was published with other bytes than the file ``st`` describes (a reader between a
    publish's two renames)."""
    ino, mtime = record.get("ino"), record.get("mtime_ns")
    return ino is not None and (ino != st.st_ino or mtime != st.st_mtime_ns)


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    _fsync_path(path, directory=True)


class _DirectorySync:
    """Group commit for one directory's fsync (blocking: call from worker threads).

    :meth:`sync` returns once an fsync of the directory that *started after the call* has finished: that fsync
    covers every rename the caller made before calling. One fsync runs at a time; callers that arrive while one
    runs all wait for the next, which one of them runs for everybody, so N concurrent publishes cost about two
    fsyncs of the directory instead of N."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._started = 0  # fsyncs started so far (the number of the latest)
        self._finished = 0  # the latest fsync that has finished
        self._running = False
        self._succeeded = 0  # the latest fsync that succeeded
        self._error: OSError | None = None  # the failure of the latest failed fsync

    def sync(self) -> None:
        with self._cond:
            # the first fsync to start from now on is the one that covers our renames
            needed = self._started + 1
            while self._finished < needed:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                self._started += 1
                mine = self._started
                self._cond.release()
                error: OSError | None = None
                try:
                    _fsync_dir(self.path)
                except OSError as exc:
                    error = exc
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._finished = mine
                    if error is None:
                        self._succeeded = mine
                    else:
                        self._error = error
                    self._cond.notify_all()
            # any fsync that started after our call covers our renames; if none of them succeeded, the latest failed
            if self._succeeded < needed and self._error is not None:
                raise self._error


def _load_syncfs() -> Callable[[int], None] | None:
    """``syncfs(2)`` (not in Python's os module) where it reports write-back errors: Linux 5.8 and later (before,
    it returned 0 whatever happened to the data). None elsewhere: every object then fsyncs its own files."""
    if sys.platform != "linux":
        return None
    try:
        major, minor = (int(part) for part in platform.release().split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (5, 8):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        call = libc.syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int]
    call.restype = ctypes.c_int

    def syncfs(fd: int) -> None:
        # ctypes releases the GIL for the call: the event loop runs while the disk works
        if call(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return syncfs


_syncfs = _load_syncfs()


@dataclass(slots=True, eq=False)
class _SmallCommit:
    """One small object waiting for a group commit: its bytes and record, where they go, and its answer."""

    tmp: Path
    tmp_meta: Path
    data: bytes
    record: dict[str, Any]
    final: Path
    final_meta: Path
    if_absent: bool
    if_match: str | None
    fd: int = -1
    info: ObjectInfo | None = None
    error: BaseException | None = None
    future: asyncio.Future[ObjectInfo] | None = None


def _settle(batch: list[_SmallCommit]) -> None:
    """Hand each caller of a group commit its answer (on the event loop)."""
    for commit in batch:
        future = commit.future
        if future is None or future.done():
            continue
        if commit.error is not None:
            future.set_exception(commit.error)
        elif commit.info is not None:
            future.set_result(commit.info)
        else:
            future.set_exception(BackendUnavailable("group commit ended without an answer"))


class LocalWriter(WriterContext):
    """A temp file that becomes ``objects/<key>`` on commit."""

    def __init__(
        self,
        storage: LocalStorage,
        key: str,
        size_hint: int | None,
        if_absent: bool = False,
        durable: bool = True,
        if_match: str | None = None,
    ) -> None:
        self._storage = storage
        self._key = key
        self._size_hint = size_hint
        self._if_absent = if_absent
        self._if_match = if_match
        self._durable = durable
        token = secrets.token_hex(12)
        self._tmp = storage.tmp_dir / f"{token}.part"
        self._tmp_meta = storage.tmp_dir / f"{token}.meta"
        self._file: AsyncFileIO | None = None
        self._pending: list[bytes] = []  # bytes not yet in a file: the whole object, while it is small
        self._written = 0
        self._synced = 0
        self._sync_every = storage.sync_every if durable else 0
        self._done = False
        self._syncing: asyncio.Future[None] | None = None  # the flush in flight (see write)
        self._copying: asyncio.Future[None] | None = None  # the copy_range in flight (see abort)

    @property
    def bytes_written(self) -> int:
        return self._written

    @property
    def flushes_earlier_writes(self) -> bool:
        """True while a commit would be a ``syncfs`` group commit (the whole object in memory, durable): its first
        ``syncfs`` starts after the commit does, and flushes every write finished before (see
        :func:`storage.base.flushes_earlier_writes`)."""
        s = self._storage
        return self._file is None and self._durable and s.group_sync == "syncfs" and not self._done

    async def _open(self) -> AsyncFileIO:
        if self._file is None:
            opening = asyncio.ensure_future(aiofiles.open(self._tmp, "xb", buffering=0, opener=self._create))
            try:
                f = await asyncio.shield(opening)
            except asyncio.CancelledError:
                # the open goes on in its thread: close and remove what it creates, or both would leak
                opening.add_done_callback(self._discard_opened)
                raise
            except OSError as exc:
                raise _translate(exc, "creating a temp file") from exc
            if self._done:  # aborted while the open was in flight
                await aiofiles.os.remove(self._tmp)
                await f.close()
                raise BackendUnavailable("writer was aborted")
            self._file = f
        return self._file

    def _create(self, path: str, flags: int) -> int:
        return _create_locked(Path(path), self._storage.tmp_dir)

    def _discard_opened(self, opening: asyncio.Future[AsyncFileIO]) -> None:
        if opening.cancelled() or opening.exception() is not None:
            return

        async def discard(f: AsyncFileIO) -> None:
            try:
                await aiofiles.os.remove(self._tmp)
            except FileNotFoundError:
                pass
            await f.close()

        task = asyncio.ensure_future(discard(opening.result()))
        _cleanups.add(task)
        task.add_done_callback(_cleanups.discard)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._done:
            raise BackendUnavailable("write after commit or abort")
        if self._file is None and self._written + len(data) <= self._storage.small_object:
            self._pending.append(bytes(data))  # kept until commit (a copy only if the caller's buffer is mutable)
            self._written += len(data)
            return
        await self.write_many([data])

    async def write_many(self, pieces: Sequence[bytes | bytearray | memoryview]) -> None:
        """:meth:`write` of ``pieces`` in turn, in one system call (``writev``) once the object is in its file: a
        caller holding several socket reads need not join them into one buffer first (a copy of every byte)."""
        if self._done:
            raise BackendUnavailable("write after commit or abort")
        if self._file is None and self._written + sum(map(len, pieces)) <= self._storage.small_object:
            for piece in pieces:
                await self.write(piece)
            return
        f = await self._open()
        if self._pending:
            await self._write_pending(f)
        views = [memoryview(piece) for piece in pieces if piece]
        try:
            while views:  # an unbuffered write may be partial
                n = await (f.write(views[0]) if len(views) == 1 else asyncio.to_thread(os.writev, f.fileno(), views))
                self._written += n
                while views and n >= len(views[0]):  # the pieces written whole
                    n -= len(views[0])
                    views.pop(0)
                if n:
                    views[0] = views[0][n:]  # the one written in part
            await self._flush_as_we_go(f)
        except OSError as exc:
            raise _translate(exc, "writing") from exc

    async def _flush_as_we_go(self, f: AsyncFileIO) -> None:
        if self._sync_every and self._written - self._synced >= self._sync_every:
            # Flush as we go: the disk works while the network delivers, instead of one long fsync at commit
            # with gigabytes of dirty pages behind it. Not awaited: waiting here would stop the upload for
            # every flush (the writes, the hashing and the socket reads all wait on this write), so receiving
            # and flushing would take turns. One flush at a time: at most two intervals' bytes are dirty.
            await self._flushed()
            self._synced = self._written
            self._syncing = asyncio.ensure_future(asyncio.to_thread(os.fdatasync, f.fileno()))

    def copy_lead(self, length: int) -> int | None:
        """Any range of at least :data:`COPY_MIN` bytes is copied whole; a shorter one is written (its copy would
        cost a thread hop for no saving)."""
        return 0 if length >= COPY_MIN else None

    async def copy_range(self, source: ObjectReader, start: int, end: int) -> None:
        """``copy_file_range`` from the descriptor ``source`` holds (the version it opened, even if the key was
        replaced or deleted since) to the end of this writer's file: the kernel copies the pages, or shares the
        extents where the filesystem reflinks (XFS, btrfs; ext4 copies). Where the kernel cannot copy between
        the two (another filesystem), the bytes are read and written instead."""
        if self._done:
            raise BackendUnavailable("write after commit or abort")
        if not isinstance(source, LocalReader):
            raise ValueError("copy_range copies from a local object")
        if self.copy_lead(end - start) != 0:
            raise ValueError(f"a range of {end - start} bytes is written, not copied")
        f = await self._open()
        if self._pending:
            await self._write_pending(f)
        # shielded, and awaited by abort: the copy goes on in its thread whatever happens to this caller, and
        # neither descriptor may close under it
        self._copying = asyncio.ensure_future(
            asyncio.to_thread(_copy_file_range, source.fileno(), f.fileno(), start, end)
        )
        try:
            await asyncio.shield(self._copying)
            self._written += end - start
            await self._flush_as_we_go(f)
        except OSError as exc:
            raise _translate(exc, "copying") from exc
        finally:
            if self._copying.done():
                self._copying = None

    async def _flushed(self) -> None:
        """Until the flush in flight (if any) has ended; raises its error. Shielded: the flush runs on in its
        thread whatever happens to the caller, and the file must stay open until it ends."""
        syncing, self._syncing = self._syncing, None
        if syncing is not None:
            try:
                await asyncio.shield(syncing)
            except BaseException:
                self._syncing = syncing if not syncing.done() else None  # still in flight: abort waits for it
                raise

    async def _write_pending(self, f: AsyncFileIO) -> None:
        pending, self._pending = b"".join(self._pending), []
        view = memoryview(pending)
        try:
            while view:
                view = view[await f.write(view) :]
        except OSError as exc:
            raise _translate(exc, "writing") from exc

    async def commit(self, metadata: Mapping[str, str]) -> ObjectInfo:
        if self._done:
            raise BackendUnavailable("commit after commit or abort")
        record = {"metadata": dict(metadata), "size": self._written}
        try:
            await self._flushed()
        except OSError as exc:
            await self.abort()
            raise _translate(exc, "writing") from exc
        try:
            if self._file is None and self._durable and self._storage.group_sync != "off":
                # the whole object is in memory: it joins the next group commit (see the module docstring), which
                # goes on whatever happens to this caller (nothing to shield: the future is only its answer)
                data, self._pending = b"".join(self._pending), []
                info = await self._storage.commit_small(self._pending_commit(data, record))
            else:
                # all the file work of a commit in one call on the storage's I/O pool (see the module docstring)
                finishing = asyncio.ensure_future(self._storage.run_io(self._commit_blocking, record))
                info = await asyncio.shield(finishing)  # a publish is not interrupted half way
            if self._file is not None:
                await self._file.close()
        except FileExistsError as exc:
            await self.abort()
            raise ObjectExists(self._key) from exc
        except ObjectChanged:
            await self.abort()
            raise
        except OSError as exc:
            await self.abort()
            raise _translate(exc, "publishing") from exc
        self._done = True
        return info

    def _pending_commit(self, data: bytes, record: dict[str, Any]) -> _SmallCommit:
        s = self._storage
        return _SmallCommit(
            self._tmp,
            self._tmp_meta,
            data,
            record,
            s.object_path(self._key),
            s.meta_path(self._key),
            self._if_absent,
            self._if_match,
        )

    def _commit_blocking(self, record: dict[str, Any]) -> ObjectInfo:
        """Write what is still in memory, fsync, publish, close and stat (blocking: runs on the I/O pool)."""
        if self._file is not None:
            return self._finish_blocking(self._file.fileno(), record)  # the caller closes the file
        # the whole object is in memory: its temp file exists only inside this call, which removes it on failure
        fd = _create_locked(self._tmp, self._storage.tmp_dir)
        try:
            view = memoryview(b"".join(self._pending))
            self._pending = []
            while view:
                view = view[os.write(fd, view) :]
            info = self._finish_blocking(fd, record)
        except BaseException:
            for path in (self._tmp_meta, self._tmp):  # the meta first: it never outlives its part
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass
            raise
        finally:
            os.close(fd)
        return info

    def _finish_blocking(self, fd: int, record: dict[str, Any]) -> ObjectInfo:
        # published while still open: our lock keeps a sweep off the temp file until it has its final name; the
        # publish fsyncs the bytes (alongside the metadata) before renaming anything; it returns what it published
        # (a stat afterwards may already see a later publish)
        return self._storage.publish(
            self._tmp,
            self._tmp_meta,
            record,
            self._storage.object_path(self._key),
            self._storage.meta_path(self._key),
            if_absent=self._if_absent,
            if_match=self._if_match,
            durable=self._durable,
            data_fd=fd,
        )

    async def abort(self) -> None:
        self._done = True
        self._pending = []
        if self._file is None:
            return  # nothing was written to a file (a small object), or the open is still in flight and will
            # see ``_done`` and remove what it creates
        for path in (self._tmp_meta, self._tmp):  # the meta first: it never outlives its part
            try:
                await aiofiles.os.remove(path)
            except FileNotFoundError:
                pass
        # never close the descriptor under a copy in flight (its caller was cancelled) or a flush in flight
        await _ended(self._copying)
        await _ended(self._syncing)
        self._copying = self._syncing = None
        if self._file is not None:
            try:
                await self._file.close()
            except OSError:
                pass


async def _ended(work: asyncio.Future[None] | None) -> None:
    """Until ``work`` (if any) has ended, its error retrieved: the upload failed for another reason already."""
    if work is None:
        return
    await asyncio.wait([work])
    if not work.cancelled():
        work.exception()


def _copy_file_range(src: int, dst: int, start: int, end: int) -> None:
    """Bytes ``[start, end)`` of ``src`` appended at ``dst``'s position (blocking)."""
    at = start
    try:
        while at < end:
            n = os.copy_file_range(src, dst, min(end - at, 1 << 30), at)
            if n == 0:
                raise BackendUnavailable("the source of a copy ended before the range did")
            at += n
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        while at < end:  # no copy between these two files: through a buffer
            data = os.pread(src, min(end - at, 1 << 20), at)
            if not data:
                raise BackendUnavailable("the source of a copy ended before the range did") from exc
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view) :]
            at += len(data)


class LocalReader(ReaderContext):
    """An open file descriptor plus the metadata published with it."""

    def __init__(self, fd: int, info: ObjectInfo, buffer_size: int) -> None:
        self._fd = fd
        self._info = info
        self._buffer_size = buffer_size

    @property
    def info(self) -> ObjectInfo:
        return self._info

    def fileno(self) -> int:
        """The open descriptor of the object's bytes (for sendfile), valid until :meth:`close`; it reads the
        version that was opened, whatever is published under the key afterwards."""
        if self._fd < 0:
            raise BackendUnavailable("reader is closed")
        return self._fd

    async def read(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        stop = self._info.size if end is None else min(end, self._info.size)
        pos = start
        while pos < stop:
            want = min(self._buffer_size, stop - pos)
            try:
                # pread: no shared file position, so several ranges of one reader may be read at once
                chunk = await asyncio.to_thread(os.pread, self._fd, want, pos)
            except OSError as exc:
                raise _translate(exc, "reading") from exc
            if not chunk:
                raise BackendUnavailable(f"object {self._info.key} shrank while being read")
            pos += len(chunk)
            yield chunk

    async def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)  # closing a regular file's descriptor does not block


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None


def _move_once(old: Path, new: Path) -> None:
    """Give the file ``old`` the name ``new`` and drop ``old``, so that a crash at any point leaves it under at
    least one of them (call holding the key's lock stripe). Found under both names, the later publish wins."""
    try:
        os.link(old, new)
    except FileExistsError:
        st_old, st_new = os.stat(old), os.stat(new)
        if not os.path.samestat(st_old, st_new) and st_old.st_mtime_ns > st_new.st_mtime_ns:
            os.replace(old, new)  # the flat name holds the later publish
            return
    os.remove(old)


class _MetadataUnreadable(Exception):
    pass


def _close_opened(opening: asyncio.Future[tuple[int, os.stat_result, dict[str, Any]]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        os.close(opening.result()[0])


class LocalStorage(StagedFiles):
    """Objects as files under one directory. Capabilities: ranged reads, compose, staged objects written at offsets
    (storage/local_staged.py)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        buffer_size: int = 1 << 20,
        stale_after: float = 86400,
        sync_every: int = 64 << 20,
        small_object: int = 1 << 20,
        io_threads: int = 64,
        group_sync: str = "syncfs",
        group_commits: int = 4,
    ):
        self.root = Path(root)
        # how a group commit of small objects makes them durable: "syncfs" (two calls per commit, where syncfs
        # reports write-back errors; else "fsync"), "fsync" (each file and each folder, all at once) or "off"
        # (no group commit: each object publishes on its own)
        if group_sync not in ("syncfs", "fsync", "off"):
            raise ValueError(f"group_sync must be syncfs, fsync or off, not {group_sync!r}")
        self.group_sync = "fsync" if group_sync == "syncfs" and _syncfs is None else group_sync
        self._small: list[_SmallCommit] = []  # waiting for the next group commit
        self._small_lock = threading.Lock()
        self.group_commits = max(1, group_commits)
        self._committing = 0  # threads running group commits
        self.sync_every = sync_every
        self.small_object = small_object  # objects up to this size are written in one call at commit
        self.io_threads = io_threads
        self._io: ThreadPoolExecutor | None = None
        self.objects_dir = self.root / "objects"
        self.meta_dir = self.root / "meta"
        self.tmp_dir = self.root / "tmp"
        self.locks_dir = self.root / "locks"
        self.buffer_size = buffer_size
        self.stale_after = stale_after
        self._dir_syncs: dict[Path, _DirectorySync] = {}
        self._dir_syncs_lock = threading.Lock()
        self._folders: set[Path] = set()  # folders of objects and metadata known to exist
        self._helpers: ThreadPoolExecutor | None = None

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking file work (publishes: fsyncs) on the storage's I/O pool; threads start as needed."""
        if self._io is None:
            self._io = ThreadPoolExecutor(self.io_threads, thread_name_prefix="local-storage-io")
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    def commit_small(self, commit: _SmallCommit) -> asyncio.Future[ObjectInfo]:
        """Publish a small object held in memory with the next group commit; the future settles once its bytes,
        metadata and names are on disk (or with the error that stopped it)."""
        loop = asyncio.get_running_loop()
        commit.future = loop.create_future()
        with self._small_lock:
            self._small.append(commit)
            # another commit starts while the running ones wait on the disk, up to ``group_commits`` at once
            start = self._committing < self.group_commits
            if start:
                self._committing += 1
        if start:
            if self._io is None:
                self._io = ThreadPoolExecutor(self.io_threads, thread_name_prefix="local-storage-io")
            self._io.submit(self._group_commits, loop)
        return commit.future

    def _group_commits(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run group commits until none is waiting: each takes every object queued meanwhile (while one waits on
        the disk, the next gathers)."""
        while True:
            with self._small_lock:
                batch, self._small = self._small, []
                if not batch:
                    self._committing -= 1
                    return
            try:
                self._group_commit(batch)
            except BaseException as exc:  # noqa: BLE001 - handed to every caller still without an answer
                for commit in batch:
                    if commit.info is None and commit.error is None:
                        commit.error = exc
            try:
                loop.call_soon_threadsafe(_settle, batch)
            except RuntimeError:
                pass  # the loop is closed: nobody waits for these answers any more

    def _group_commit(self, batch: list[_SmallCommit]) -> None:
        """Publish ``batch`` durably (blocking): the five steps of the module docstring. Objects are answered
        after step 4 (by :func:`_settle`, once this returns): their data, metadata and names are all durable by
        then. The descriptor syncfs reports errors through is opened before the batch's first write (syncfs
        reports only the write-back errors after its descriptor's opening)."""
        syncfs = _syncfs if self.group_sync == "syncfs" else None
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if syncfs is not None else -1
        try:
            staged: list[_SmallCommit] = []
            for commit in batch:
                try:
                    commit.fd = _create_locked(commit.tmp, self.tmp_dir)
                    view = memoryview(commit.data)
                    while view:
                        view = view[os.write(commit.fd, view) :]
                    commit.record, st = self._stage(commit.tmp, commit.tmp_meta, commit.record, durable=False)
                    commit.info = self._info(self._key_of(commit.final), commit.record, st)
                    staged.append(commit)
                except Exception as exc:  # noqa: BLE001 - this object's own failure; the others go on
                    commit.error = exc
            try:
                if syncfs is not None:
                    syncfs(root)
                else:
                    staged = self._fsync_staged(staged)
                placed: list[_SmallCommit] = []
                for commit in staged:
                    try:
                        self._place(
                            commit.tmp,
                            commit.tmp_meta,
                            commit.final,
                            commit.final_meta,
                            if_absent=commit.if_absent,
                            if_match=commit.if_match,
                        )
                        placed.append(commit)
                    except Exception as exc:  # noqa: BLE001 - refused (exists, changed) or failed: its own answer
                        commit.error = exc
                        commit.info = None
                if placed and syncfs is not None:
                    syncfs(root)
                elif placed:
                    folders = {c.final.parent for c in placed} | {c.final_meta.parent for c in placed}
                    for done in [self._alongside(self.sync_dir, folder) for folder in folders]:
                        done.result()
            except OSError as exc:
                for commit in staged:  # not known to be durable: nobody is told it is
                    if commit.error is None:
                        commit.error, commit.info = exc, None
                raise
        finally:
            if root >= 0:
                os.close(root)
            for commit in batch:
                if commit.fd >= 0:
                    os.close(commit.fd)  # after the rename: the lock kept the sweep off the temp file
                    commit.fd = -1
                if commit.error is not None:
                    for path in (commit.tmp_meta, commit.tmp):  # the meta first: it never outlives its part
                        try:
                            os.remove(path)
                        except FileNotFoundError:
                            pass
                commit.data = b""

    def _fsync_staged(self, staged: list[_SmallCommit]) -> list[_SmallCommit]:
        """fsync every staged object's bytes and metadata, all at once on helper threads (concurrent fsyncs share
        the filesystem's journal commits); returns those whose fsyncs succeeded (the others get their error)."""
        waits = [
            (commit, self._alongside(os.fsync, commit.fd), self._alongside(_fsync_path, commit.tmp_meta))
            for commit in staged
        ]
        synced: list[_SmallCommit] = []
        for commit, data_synced, meta_synced in waits:
            for done in (data_synced, meta_synced):
                try:
                    done.result()
                except OSError as exc:
                    commit.error, commit.info = exc, None
            if commit.error is None:
                synced.append(commit)
        return synced

    def sync_dir(self, path: Path) -> None:
        """fsync ``path`` so that the renames made in it so far are durable, shared with concurrent callers
        (blocking). Keys name few directories (``files/``, ``sessions/``, …): one group commit for each."""
        with self._dir_syncs_lock:
            shared = self._dir_syncs.get(path)
            if shared is None and len(self._dir_syncs) < MAX_SHARED_DIRECTORIES:
                shared = self._dir_syncs[path] = _DirectorySync(path)
        if shared is None:
            _fsync_dir(path)
        else:
            shared.sync()

    def _alongside(self, fn: Callable[..., None], *args: Any) -> Future[None]:
        """Start ``fn`` on a helper thread, to run while the calling I/O thread does other blocking work (two
        fsyncs in flight at once share one journal commit). Helpers never wait for pool work, so they cannot
        deadlock with the I/O pool."""
        if self._helpers is None:
            with self._dir_syncs_lock:
                if self._helpers is None:
                    self._helpers = ThreadPoolExecutor(self.io_threads, thread_name_prefix="local-storage-fsync")
        return self._helpers.submit(fn, *args)

    @property
    def capabilities(self) -> frozenset[Capability]:
        return _CAPABILITIES

    def object_path(self, key: str) -> Path:
        """Where the bytes of ``key`` lie: in the shard of its name, inside its folder."""
        folder, _, name = validate_key(key).rpartition("/")
        return (self.objects_dir / folder if folder else self.objects_dir) / shard_of(name) / name

    def key_of_path(self, path: Path) -> str:
        """The key whose bytes lie at ``path`` (one of :meth:`object_path`'s answers)."""
        *folders, shard, name = path.relative_to(self.objects_dir).parts
        if shard != shard_of(name):
            raise ValueError(f"{path} is not where an object's bytes lie")
        return "/".join([*folders, name])

    def meta_path(self, key: str) -> Path:
        return self.meta_dir / f"{validate_key(key)}.json"

    async def start(self) -> None:
        def prepare() -> None:
            for d in (self.objects_dir, self.meta_dir, self.tmp_dir, self.locks_dir):
                d.mkdir(parents=True, exist_ok=True)
            self.migrate_layout()
            self.sweep_tmp()
            if not os.access(self.tmp_dir, os.W_OK):
                raise BackendUnavailable(f"data directory {self.root} is not writable")

        try:
            await asyncio.to_thread(prepare)
        except OSError as exc:
            raise BackendUnavailable(f"cannot use data directory {self.root}: {exc.strerror or exc}") from exc

    def migrate_layout(self) -> int:
        """Move every object of the earlier flat layout (``objects/<key>``) into its shard, once per data
        directory; returns how many were moved. Blocking: :meth:`start` runs it before anything is served.

        Safe to interrupt anywhere (an error, kill -9, a power cut) and to run from several processes at once:
        each object is hard-linked under its new name and then unlinked under its old one, holding its key's lock
        stripe, so it always has at least one of them, and a run that finds both (the same inode) only unlinks the
        old. The ``layout`` file is written, durably, only after every move is durable; until then every start
        runs the migration again, which goes on from where the last one stopped. Processes sharing the directory
        wait for the one migrating (an exclusive ``flock`` of ``locks/layout.lock``)."""
        marker = self.root / "layout"
        if _read_text(marker) == LAYOUT_VERSION:
            return 0
        fd = os.open(self.locks_dir / "layout.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _read_text(marker) == LAYOUT_VERSION:
                return 0  # another process migrated while we waited
            moved, touched = 0, set[Path]()
            for folder, dirs, files in os.walk(self.objects_dir):
                dirs[:] = [d for d in dirs if not d.startswith(SHARD_MARK)]  # shards hold migrated objects
                for name in files:
                    old = Path(folder) / name
                    key = old.relative_to(self.objects_dir).as_posix()
                    try:
                        new = self.object_path(key)
                    except StorageError:
                        continue  # not an object's name: left where it is
                    new.parent.mkdir(exist_ok=True)
                    with self._key_locked(key):
                        _move_once(old, new)
                    touched.update((old.parent, new.parent, new.parent.parent))
                    moved += 1
            for changed in touched:  # every link and unlink durable before the marker says they are done
                _fsync_dir(changed)
            tmp = self.tmp_dir / f"layout.{secrets.token_hex(6)}"  # swept if a crash leaves it
            with open(tmp, "w", encoding="ascii") as out:
                out.write(LAYOUT_VERSION)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, marker)
            _fsync_dir(self.root)
            return moved
        finally:
            os.close(fd)

    def sweep_tmp(self) -> list[str]:
        """Remove the temp files no live writer holds (of this process or any other sharing the directory), and
        other files under ``tmp/`` older than ``stale_after``. Returns the names removed. Blocking: run it in a
        thread."""
        removed: list[str] = []

        def remove(name: str) -> None:
            try:
                os.remove(self.tmp_dir / name)
                removed.append(name)
            except FileNotFoundError:
                pass

        dfd = os.open(self.tmp_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX)  # no part is created meanwhile (writers hold it shared for microseconds)
            names = os.listdir(self.tmp_dir)
            parts = {name.removesuffix(".part") for name in names if name.endswith(".part")}
            cutoff = time.time() - self.stale_after
            for name in names:
                if name.endswith(".part"):
                    try:
                        fd = os.open(self.tmp_dir / name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                    except FileNotFoundError:
                        continue
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # a live writer holds it
                    else:
                        remove(name.removesuffix(".part") + ".meta")
                        remove(name)
                    finally:
                        os.close(fd)
                elif name.endswith(".meta"):
                    if name.removesuffix(".meta") not in parts:
                        remove(name)  # its part is gone: a publish or abort cut short
                else:
                    try:
                        if os.lstat(self.tmp_dir / name).st_mtime < cutoff:
                            remove(name)
                    except FileNotFoundError:
                        pass
        finally:
            os.close(dfd)
        return removed

    async def close(self) -> None:
        for pool in (self._io, self._helpers):
            if pool is not None:
                pool.shutdown(wait=False)  # idle threads exit; a publish in flight finishes first
        self._io = self._helpers = None

    def create(
        self,
        key: str,
        *,
        size_hint: int | None = None,
        if_absent: bool = False,
        if_match: str | None = None,
        durable: bool = True,
    ) -> LocalWriter:
        validate_key(key)
        if if_absent and if_match is not None:
            raise ValueError("if_absent and if_match are exclusive")
        return LocalWriter(self, key, size_hint, if_absent, durable, if_match)

    @contextlib.contextmanager
    def _key_locked(self, key: str, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
        """Hold ``key``'s lock stripe (blocking: call in a thread): exclusively to publish or delete, shared to
        read a consistent pair of bytes and metadata."""
        stripe = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest()) % LOCK_STRIPES
        fd = os.open(self.locks_dir / f"{stripe:03d}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _current_version(self, key: str) -> str | None:
        """The version of ``key``'s published object, None when it has none (call holding its lock stripe)."""
        try:
            st = os.stat(self.object_path(key))
            return _version(self._read_meta(key), st)
        except FileNotFoundError:
            return None

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
    ) -> ObjectInfo:
        """Make a finished temp file the object: visible once both its bytes and its metadata are in place;
        returns what was published (not a stat afterwards, which may already see a later publish).

        Replace: metadata first, then the bytes (the visibility point). If absent: the bytes are hard-linked into
        place first — link fails if the name exists, which is the compare-and-set — then the metadata. If match:
        as replace, after checking the current version under the key's lock (ObjectChanged if it differs).

        ``data_fd`` (durable only): the temp file's descriptor, not yet fsynced; its fsync runs alongside the
        metadata's, and both finish before any rename."""
        key = self._key_of(final)
        record, st = self._stage(tmp, tmp_meta, record, durable=durable, data_fd=data_fd)
        self._place(tmp, tmp_meta, final, final_meta, if_absent=if_absent, if_match=if_match)
        if durable:
            objects_synced = self._alongside(self.sync_dir, final.parent)
            try:
                self.sync_dir(final_meta.parent)
            finally:
                objects_synced.result()
        return self._info(key, record, st)

    def _key_of(self, final: Path) -> str:
        return self.key_of_path(final)

    def _stage(
        self, tmp: Path, tmp_meta: Path, record: dict[str, Any], *, durable: bool, data_fd: int | None = None
    ) -> tuple[dict[str, Any], os.stat_result]:
        """Write the temp metadata of the written temp file ``tmp`` with a new version token; durable: fsync
        both (``data_fd``'s fsync alongside the metadata's) before returning. Returns the record and the stat."""
        st = os.stat(tmp)
        # the bytes keep their inode and mtime through the rename: a reader checks its pair against them
        record = {**record, "version": secrets.token_hex(12), "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}
        data_synced = self._alongside(os.fsync, data_fd) if durable and data_fd is not None else None
        try:
            # json.dumps, not json.dump: dump streams through the pure-Python encoder
            meta_bytes = json.dumps(record, ensure_ascii=True).encode("ascii")
            mfd = os.open(tmp_meta, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                view = memoryview(meta_bytes)
                while view:
                    view = view[os.write(mfd, view) :]
                if durable:
                    os.fsync(mfd)
            finally:
                os.close(mfd)
        finally:
            if data_synced is not None:
                data_synced.result()  # never rename bytes that may not be on disk (raises the fsync's error)
        return record, st

    def _place(
        self, tmp: Path, tmp_meta: Path, final: Path, final_meta: Path, *, if_absent: bool, if_match: str | None
    ) -> None:
        """Rename the staged temp files into place: the compare and the renames under the key's lock stripe."""
        key = self._key_of(final)
        folders = (final.parent, final_meta.parent)
        for folder in folders:
            if folder not in self._folders:  # made once: a mkdir per publish is two failing system calls
                folder.mkdir(parents=True, exist_ok=True)
                if len(self._folders) < MAX_KNOWN_FOLDERS:
                    self._folders.add(folder)
        if if_absent:
            # FileExistsError at the link: another writer published first; the temp part goes last, so a temp meta
            # never outlives its part (see the sweep)
            steps = [lambda: os.link(tmp, final), lambda: os.replace(tmp_meta, final_meta), lambda: os.remove(tmp)]
        else:
            steps = [lambda: os.replace(tmp_meta, final_meta), lambda: os.replace(tmp, final)]
        with self._key_locked(key):  # the compare and the renames: one step for every process (microseconds)
            if if_match is not None:
                current = self._current_version(key)
                if current != if_match:
                    raise ObjectChanged(f"{key} is at version {current or 'none'}, not {if_match}")
            done, remade = 0, 0
            while done < len(steps):
                try:
                    steps[done]()
                except FileNotFoundError:
                    # a folder removed behind our back (by hand, or a restore): made again, and the publish goes on
                    # from the step that failed, so its metadata is never left in place without its bytes; a
                    # missing temp file is not that, and fails as it is
                    self._folders.clear()
                    missing = [folder for folder in folders if not folder.is_dir()]
                    if not missing or remade == 2:
                        raise
                    remade += 1
                    for folder in missing:
                        folder.mkdir(parents=True, exist_ok=True)
                    continue
                done += 1

    async def compose(self, key: str, sources: list[str], metadata: Mapping[str, str]) -> ObjectInfo:
        """Concatenate ``sources`` into ``key`` with copy_file_range (the bytes never enter this process)."""
        token = secrets.token_hex(12)
        tmp, tmp_meta = self.tmp_dir / f"{token}.part", self.tmp_dir / f"{token}.meta"

        def run() -> ObjectInfo:
            try:
                with os.fdopen(_create_locked(tmp, self.tmp_dir), "wb") as out:
                    for source in sources:
                        with open(self.object_path(source), "rb") as src:
                            left = os.fstat(src.fileno()).st_size
                            while left > 0:
                                n = os.copy_file_range(src.fileno(), out.fileno(), min(left, 1 << 30))
                                if n == 0:
                                    raise BackendUnavailable(f"{source} shrank while being composed")
                                left -= n
                    out.flush()
                    os.fsync(out.fileno())
                    return self.publish(  # while the part is open and locked
                        tmp,
                        tmp_meta,
                        {"metadata": dict(metadata), "size": out.tell()},
                        self.object_path(key),
                        self.meta_path(key),
                        if_absent=False,
                    )
            finally:
                for leftover in (tmp_meta, tmp):
                    try:
                        os.remove(leftover)
                    except FileNotFoundError:
                        pass

        try:
            return await asyncio.to_thread(run)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"compose source missing: {exc.filename}") from exc
        except OSError as exc:
            raise _translate(exc, f"composing {key}") from exc

    def _read_meta(self, key: str) -> dict[str, Any]:
        with open(self.meta_path(key), encoding="ascii") as mf:
            record: dict[str, Any] = json.load(mf)
        return record

    def _info(self, key: str, record: dict[str, Any], st: os.stat_result) -> ObjectInfo:
        return ObjectInfo(
            key=key,
            size=st.st_size,
            modified=datetime.fromtimestamp(st.st_mtime, UTC),
            metadata={str(k): str(v) for k, v in record.get("metadata", {}).items()},
            etag=_version(record, st),
        )

    async def open(self, key: str) -> LocalReader:
        path = self.object_path(key)

        def do_open() -> tuple[int, os.stat_result, dict[str, Any]]:
            fd, st, record = open_once()
            if not _torn(record, st):
                return fd, st, record
            os.close(fd)
            with self._key_locked(key, fcntl.LOCK_SH):  # caught mid-publish: read again once it is done
                return open_once()

        def open_once() -> tuple[int, os.stat_result, dict[str, Any]]:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                # re-stat the open descriptor: what we report is what this descriptor will read
                return fd, os.fstat(fd), self._read_meta(key)
            except FileNotFoundError:
                os.close(fd)
                raise
            except (OSError, ValueError) as exc:
                os.close(fd)
                raise _MetadataUnreadable from exc
            except BaseException:
                os.close(fd)
                raise

        opening = asyncio.get_running_loop().run_in_executor(None, do_open)
        try:
            fd, st, record = await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_opened)  # the open finishes in its thread: close what it opens
            raise
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        except _MetadataUnreadable as exc:
            raise BackendUnavailable(f"unreadable metadata for {key}") from exc.__cause__
        except StorageError:
            raise
        except OSError as exc:
            raise _translate(exc, f"opening {key}") from exc
        return LocalReader(fd, self._info(key, record, st), self.buffer_size)

    def stat_blocking(self, key: str) -> ObjectInfo:
        """:meth:`stat` for a worker thread (raises OSError/ValueError as they come)."""
        st = os.stat(self.object_path(key))
        record = self._read_meta(key)
        if _torn(record, st):
            with self._key_locked(key, fcntl.LOCK_SH):  # caught mid-publish: read again once it is done
                st = os.stat(self.object_path(key))
                record = self._read_meta(key)
        return self._info(key, record, st)

    async def stat(self, key: str) -> ObjectInfo:
        try:
            return await asyncio.to_thread(self.stat_blocking, key)
        except FileNotFoundError as exc:
            raise ObjectNotFound(key) from exc
        except StorageError:
            raise
        except (OSError, ValueError) as exc:
            raise BackendUnavailable(f"cannot stat {key}") from exc

    async def delete(self, key: str) -> None:
        paths = (self.object_path(key), self.meta_path(key))  # validates the key

        def remove() -> None:
            with self._key_locked(key):  # a compare-and-set in flight sees the object or its absence, never half
                for path in paths:  # bytes first: the object stops being visible before its metadata goes
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass

        try:
            await asyncio.to_thread(remove)
        except OSError as exc:
            raise _translate(exc, f"deleting {key}") from exc

    def _walk(self, prefix: str, start_after: str | None) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """Keys under ``prefix`` greater than ``start_after``, in ascending byte order, with their directory entries.

        Only the directory that holds ``prefix`` is read, one level at a time as the walk goes, and a directory is
        entered only if keys after ``start_after`` can lie in it, so a page costs the directories it passes through,
        not everything stored. Siblings sort as ``name`` for a file and ``name + "/"`` for a directory: that is the
        byte order of the keys they hold (``a-b`` < ``a/x`` < ``a0``). Blocking: run it in a thread."""
        folder, _, first = prefix.rpartition("/")
        if folder and not _SEGMENT_RE.fullmatch(folder):
            return  # no object key lies under a prefix that is not a path of valid segments
        base = self.objects_dir / folder if folder else self.objects_dir
        yield from self._walk_dir(base, f"{folder}/" if folder else "", first, start_after)

    def _walk_dir(
        self, path: Path, above: str, first: str, start_after: str | None
    ) -> Iterator[tuple[str, os.DirEntry[str]]]:
        """The keys of folder ``path`` (keys ``above + name``) whose names start with ``first``, in byte order.

        The folder holds shards (files, by the first characters of their names) and sub-folders. Each is a range
        of keys: a shard ``@p`` the names starting with ``p`` (or ``p`` itself), a sub-folder ``d`` the keys under
        ``d/``. They go into one heap by where their range starts; a shard is read only when it reaches the top,
        and its names go into the heap in turn, so the walk yields in byte order while reading only the shards and
        folders a page reaches, and none whose keys all sort at or before ``start_after``."""
        if start_after is not None and not start_after.startswith(above):
            if start_after > above:
                return  # every key here sorts before start_after
            start_after = None  # every key here sorts after it
        after = None if start_after is None else start_after[len(above) :]
        heap: list[tuple[str, int, int, Any]] = []  # (where the range starts, kind, tie-break, path or entry)
        order = itertools.count()
        try:
            with os.scandir(path) as it:
                for e in it:
                    name = e.name
                    if name.startswith(SHARD_MARK):
                        start = name[1:]
                        if not (start.startswith(first) or first.startswith(start)):
                            continue  # holds no name starting with first
                        if after is not None and start < after and not after.startswith(start):
                            continue  # every name in it sorts before start_after
                        heap.append((start, _SHARD, next(order), e.path))
                    elif name.startswith(first) and e.is_dir(follow_symlinks=False):
                        start = name + "/"
                        if after is not None and after >= start and not after.startswith(start):
                            continue  # every key in it sorts before start_after
                        heap.append((start, _FOLDER, next(order), e.path))
        except (FileNotFoundError, NotADirectoryError):
            return
        heapq.heapify(heap)
        while heap:
            start, kind, _, item = heapq.heappop(heap)
            if kind == _FOLDER:
                yield from self._walk_dir(Path(item), above + start, "", start_after)
            elif kind == _SHARD:
                try:
                    with os.scandir(item) as it:
                        names = [(e.name, e) for e in it if e.name.startswith(first)]
                except (FileNotFoundError, NotADirectoryError):
                    continue  # removed meanwhile
                names.sort(key=_first)
                if after is not None:
                    names = names[bisect.bisect_right(names, after, key=_first) :]
                if names:  # the shard's names, in order, enter the heap one at a time
                    rest = iter(names)
                    name, entry = next(rest)
                    heapq.heappush(heap, (name, _NAME, next(order), (entry, rest)))
            else:
                entry, rest = item
                yield above + start, entry
                following = next(rest, None)
                if following is not None:
                    heapq.heappush(heap, (following[0], _NAME, next(order), (following[1], rest)))

    async def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None, metadata: bool = False
    ) -> AsyncIterator[ObjectInfo]:
        if limit is not None and limit <= 0:
            return
        walk = self._walk(prefix, start_after)
        left = limit

        def take(n: int) -> list[ObjectInfo]:
            out: list[ObjectInfo] = []
            for key, entry in walk:
                try:
                    st = entry.stat(follow_symlinks=False)
                    record = self._read_meta(key) if metadata else {}
                except FileNotFoundError:
                    continue  # deleted meanwhile
                except (OSError, ValueError) as exc:
                    raise BackendUnavailable(f"cannot stat {key} while listing") from exc
                out.append(self._info(key, record, st))
                if len(out) >= n:
                    break
            return out

        while left is None or left > 0:
            want = _LIST_BATCH if left is None else min(left, _LIST_BATCH)
            try:
                batch = await asyncio.to_thread(take, want)
            except OSError as exc:
                raise _translate(exc, f"listing {prefix!r}") from exc
            for info in batch:
                yield info
            if len(batch) < want:
                return
            if left is not None:
                left -= len(batch)
