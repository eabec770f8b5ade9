"""The group commit of small objects (the five steps of :mod:`storage.local`): the objects committed while earlier
commits wait on the disk are published together, with one syncfs (or one round of fsyncs) for all of them."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import platform
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.base import ObjectInfo
from storage.errors import BackendUnavailable
from storage.local.disk import _create_locked, _fsync_path
from storage.local.publish import Publisher


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


class GroupCommits(Publisher):
    """Small objects published in group commits on the storage's I/O pool."""

    # set by LocalStorage.__init__
    group_sync: str
    group_commits: int
    small_object: int
    sync_every: int
    _small: list[_SmallCommit]
    _small_lock: threading.Lock
    _committing: int

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
