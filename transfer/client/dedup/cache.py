"""A directory of chunks kept from what was resolved, one file per SHA-256, trimmed least recently used first."""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from transfer.client.dedup.cutting import cut_file
from transfer.core.uploads.chunking import Manifest


class ChunkCache:
    """Chunks kept on disk, one file per SHA-256 (``<dir>/<2 hex>/<sha256>``), written atomically. With
    ``max_bytes``, :meth:`trim` evicts the least recently used chunks (a hit or a store marks a chunk used: its
    mtime) until the cache holds at most that many bytes."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("a cache size is a number of bytes, 0 or more")
        self.directory = Path(directory)
        self.max_bytes = max_bytes

    def path(self, sha: str) -> Path:
        return self.directory / sha[:2] / sha

    def get(self, sha: str, length: int) -> bytes | None:
        """The chunk's bytes if cached and intact (a damaged file is removed); a hit marks it recently used."""
        try:
            data = self.path(sha).read_bytes()
        except OSError:
            return None
        if len(data) == length and hashlib.sha256(data).hexdigest() == sha:
            self._touch(sha)
            return data
        self.path(sha).unlink(missing_ok=True)
        return None

    def read(self, sha: str, length: int) -> bytes | None:
        """The chunk's bytes if cached at its length, not hashed (for a caller that verifies the whole file they
        go into, and then :meth:`get` only on a mismatch); a hit marks it recently used."""
        try:
            data = self.path(sha).read_bytes()
        except OSError:
            return None
        if len(data) != length:
            self.path(sha).unlink(missing_ok=True)
            return None
        self._touch(sha)
        return data

    def _touch(self, sha: str) -> None:
        try:
            os.utime(self.path(sha))
        except OSError:  # evicted meanwhile by another resolver sharing the directory: nothing to mark
            pass

    def holds(self, shas: list[str]) -> set[str]:
        """Which of ``shas`` have a file in the cache (not read or checked: :meth:`get` does that)."""
        return {sha for sha in set(shas) if self.path(sha).is_file()}

    def put(self, sha: str, data: bytes | memoryview) -> None:
        final = self.path(sha)
        if final.exists():
            self._touch(sha)
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{sha}.{secrets.token_hex(4)}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)

    def trim(self) -> int:
        """Evict the least recently used chunks until at most ``max_bytes`` are kept (nothing without a limit);
        returns how many were evicted. Reads the cache directory (a client's own disk, once per resolve)."""
        if self.max_bytes is None or not self.directory.is_dir():
            return 0
        kept: list[tuple[int, int, Path]] = []  # (mtime ns, size, path)
        total = 0
        for folder in os.scandir(self.directory):
            if not folder.is_dir(follow_symlinks=False) or len(folder.name) != 2:
                continue
            for entry in os.scandir(folder.path):
                if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                    continue  # a chunk being written (or not ours)
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                kept.append((info.st_mtime_ns, info.st_size, Path(entry.path)))
                total += info.st_size
        evicted = 0
        for _, size, path in sorted(kept, key=lambda k: (k[0], k[2].name)):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            evicted += 1
        return evicted

    def keep_file(self, path: str | os.PathLike[str], manifest: Manifest | None = None) -> int:
        """Keep the chunks of the file at ``path`` (cut with the service's parameters unless ``manifest`` says how
        it is cut); returns how many were new."""
        manifest = manifest or cut_file(path)
        added = 0
        with open(path, "rb") as f:
            for chunk in manifest.chunks:
                if self.path(chunk.sha256).exists():
                    continue
                data = os.pread(f.fileno(), chunk.length, chunk.offset)
                if hashlib.sha256(data).hexdigest() == chunk.sha256:
                    self.put(chunk.sha256, data)
                    added += 1
        return added
