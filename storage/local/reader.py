"""Reading a published object: one open descriptor pinned to the version opened, ranged reads on it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from storage.base import ObjectInfo, ReaderContext
from storage.errors import BackendUnavailable
from storage.local.disk import _translate


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
