"""A storage backend that keeps nothing large: for benchmarks that measure the network and hashing alone.

Objects up to ``keep_below`` bytes (the service's own small documents, such as its signing keys) are kept in memory
so the service can start; larger objects are counted and discarded, and afterwards are simply not found. Never use
it for data.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime

from storage.base import Capability, ObjectInfo, ReaderContext, WriterContext, validate_key
from storage.errors import BackendUnavailable, ObjectChanged, ObjectExists, ObjectNotFound


class NullWriter(WriterContext):
    def __init__(self, storage: NullStorage, key: str, if_absent: bool, if_match: str | None = None) -> None:
        self._storage = storage
        self._key = key
        self._if_absent = if_absent
        self._if_match = if_match
        self._kept: bytearray | None = bytearray()
        self._written = 0
        self._done = False

    @property
    def bytes_written(self) -> int:
        return self._written

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._done:
            raise BackendUnavailable("write after commit or abort")
        self._written += len(data)
        if self._kept is not None:
            if self._written <= self._storage.keep_below:
                self._kept += data
            else:
                self._kept = None  # large: discarded

    async def commit(self, metadata: Mapping[str, str]) -> ObjectInfo:
        # one event loop, no await between the compare and the set: atomic within the process (all it serves)
        current = self._storage.kept.get(self._key)
        if self._if_absent and current is not None:
            raise ObjectExists(self._key)
        if self._if_match is not None and (current is None or current[1].etag != self._if_match):
            await self.abort()
            raise ObjectChanged(f"{self._key} is not at version {self._if_match}")
        self._done = True
        etag = f"n{next(self._storage.versions)}"
        info = ObjectInfo(self._key, self._written, datetime.now(UTC), dict(metadata), etag=etag)
        if self._kept is not None:
            self._storage.kept[self._key] = (bytes(self._kept), info)
        return info

    async def abort(self) -> None:
        self._done = True
        self._kept = None


class NullReader(ReaderContext):
    def __init__(self, data: bytes, info: ObjectInfo) -> None:
        self._data = data
        self._info = info

    @property
    def info(self) -> ObjectInfo:
        return self._info

    async def read(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        piece = self._data[start:end]
        if piece:
            yield piece


class NullStorage:
    """Discards objects larger than ``keep_below``; keeps the small ones in memory."""

    def __init__(self, keep_below: int = 1 << 20) -> None:
        self.keep_below = keep_below
        self.kept: dict[str, tuple[bytes, ObjectInfo]] = {}
        self.versions = itertools.count(1)

    @property
    def capabilities(self) -> frozenset[Capability]:
        return frozenset({Capability.ATOMIC_IF_ABSENT, Capability.ATOMIC_IF_MATCH})  # one process, one loop

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def create(
        self,
        key: str,
        *,
        size_hint: int | None = None,
        if_absent: bool = False,
        if_match: str | None = None,
        durable: bool = True,
    ) -> NullWriter:
        if if_absent and if_match is not None:
            raise ValueError("if_absent and if_match are exclusive")
        return NullWriter(self, validate_key(key), if_absent, if_match)

    async def open(self, key: str) -> NullReader:
        try:
            data, info = self.kept[validate_key(key)]
        except KeyError:
            raise ObjectNotFound(key) from None
        return NullReader(data, info)

    async def stat(self, key: str) -> ObjectInfo:
        return (await self.open(key)).info

    async def delete(self, key: str) -> None:
        self.kept.pop(key, None)

    async def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        for key, (_, info) in sorted(self.kept.items()):
            if key.startswith(prefix):
                yield info
