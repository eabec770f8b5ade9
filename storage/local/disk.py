"""File operations the local backend builds on: durable writes (fsync of files and folders, a folder's fsync
shared by concurrent renames), temp files created under their lock, version tokens, and errno translation."""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path
from typing import Any

from storage.errors import BackendUnavailable, ObjectNotFound, StorageError, StorageFull

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


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
