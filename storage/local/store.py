"""The local backend as the service sees it: the storage protocol (create, open, stat, delete, list), compose,
and the start-up that prepares, migrates and sweeps the data directory."""

from __future__ import annotations

import asyncio
import bisect
import fcntl
import heapq
import itertools
import os
import re
import secrets
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from storage.base import Capability, ObjectInfo, validate_key
from storage.errors import BackendUnavailable, ObjectNotFound, StorageError
from storage.local.disk import _create_locked, _DirectorySync, _torn, _translate
from storage.local.groupcommit import GroupCommits, _SmallCommit, _syncfs
from storage.local.layout import SHARD_MARK
from storage.local.reader import LocalReader
from storage.local.staged import OFD_LOCKS, StagedFiles
from storage.local.writer import LocalWriter

_LIST_BATCH = 256  # keys stat-ed per thread hop while listing


# what every local storage offers (asked on every descriptor: one set, not a new one per call)
_CAPABILITIES = frozenset(
    {Capability.COMPOSE, Capability.COPY_RANGE, Capability.ATOMIC_IF_ABSENT, Capability.ATOMIC_IF_MATCH}
    | ({Capability.WRITE_AT_OFFSET} if OFD_LOCKS else set())
)


_FOLDER, _SHARD, _NAME = 0, 1, 2  # what a listing walk's heap holds: a sub-folder, a shard, a key


_FOLDER, _SHARD, _NAME = 0, 1, 2  # what a listing walk's heap holds: a sub-folder, a shard, a key


_FOLDER, _SHARD, _NAME = 0, 1, 2  # what a listing walk's heap holds: a sub-folder, a shard, a key


_SEGMENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")  # folders keys can be in


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


class _MetadataUnreadable(Exception):
    pass


def _close_opened(opening: asyncio.Future[tuple[int, os.stat_result, dict[str, Any]]]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        os.close(opening.result()[0])


class LocalStorage(GroupCommits, StagedFiles):
    """Objects as files under one directory. Capabilities: ranged reads, compose, staged objects written at offsets
    (storage/local/staged.py)."""

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

    @property
    def capabilities(self) -> frozenset[Capability]:
        return _CAPABILITIES

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
