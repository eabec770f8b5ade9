"""Writing an object: bytes held in memory while small (then published by a group commit), else a temp file
flushed as it grows; server-side copies of ranges; published on commit, removed on abort."""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiofiles
import aiofiles.os
from aiofiles.threadpool.binary import AsyncFileIO

from storage.base import ObjectInfo, ObjectReader, WriterContext
from storage.errors import BackendUnavailable, ObjectChanged, ObjectExists
from storage.local.disk import _create_locked, _translate
from storage.local.groupcommit import GroupCommits, _SmallCommit
from storage.local.reader import LocalReader

_cleanups: set[asyncio.Future[None]] = set()  # clean-ups of opens that finished after their caller was cancelled


COPY_MIN = 1 << 20  # the shortest range a writer's copy_range takes (a shorter one is written: see copy_lead)


class LocalWriter(WriterContext):
    """A temp file that becomes ``objects/<key>`` on commit."""

    def __init__(
        self,
        storage: GroupCommits,
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
