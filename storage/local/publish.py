"""Publishing one object: temp file and temp metadata renamed into place under the key's lock stripe, the
compare-and-set decided there, the renames made durable (fsync of the folders, shared between publishes)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from storage.base import ObjectInfo
from storage.errors import ObjectChanged
from storage.local.disk import _DirectorySync, _fsync_dir, _version
from storage.local.layout import DataDirectory

T = TypeVar("T")


MAX_SHARED_DIRECTORIES = 1024  # directories with a group-commit fsync; any others are fsynced alone


MAX_KNOWN_FOLDERS = 16384  # folders remembered as existing (others cost a failing mkdir per publish)


class Publisher(DataDirectory):
    """What every publish of a local storage goes through, and the I/O pools it runs on."""

    # set by LocalStorage.__init__
    io_threads: int
    _io: ThreadPoolExecutor | None
    _helpers: ThreadPoolExecutor | None
    _folders: set[Path]  # folders of objects and metadata known to exist
    _dir_syncs: dict[Path, _DirectorySync]
    _dir_syncs_lock: threading.Lock

    async def run_io(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking file work (publishes: fsyncs) on the storage's I/O pool; threads start as needed."""
        if self._io is None:
            self._io = ThreadPoolExecutor(self.io_threads, thread_name_prefix="local-storage-io")
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

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
