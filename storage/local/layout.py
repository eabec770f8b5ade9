"""Where things lie in a data directory: objects sharded by the first characters of their name, metadata beside
them, temp files and their sweep, lock stripes; the migration from the earlier flat layout."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from storage.base import validate_key
from storage.errors import StorageError
from storage.local.disk import _fsync_dir, _move_once, _read_text

LOCK_STRIPES = 256  # lock files under locks/: keys share them by hash (a publish holds one for microseconds)


SHARD_MARK = "@"  # starts a shard directory's name; no key segment can start with it


SHARD_WIDTH = 4  # a name's first characters that choose its shard: ``f_`` + two hex digits for file ids


LAYOUT_VERSION = "2"  # what the ``layout`` file of a data directory in this layout holds


def shard_of(name: str) -> str:
    """The shard directory that holds the object named ``name`` (the last segment of its key)."""
    return SHARD_MARK + name[:SHARD_WIDTH]


class DataDirectory:
    """The data directory of a local storage: the paths of keys, the lock stripe of each, the start-up sweep and
    migration."""

    # set by LocalStorage.__init__
    root: Path
    objects_dir: Path
    meta_dir: Path
    tmp_dir: Path
    locks_dir: Path
    stale_after: float

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
