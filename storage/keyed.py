"""Locks by key that exist only while someone holds or waits for them, so a table of them never grows with the
number of keys ever locked (one per upload, per object being compared-and-set, …)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class KeyedLocks:
    """``async with locks.hold(key):`` — mutual exclusion per key within one event loop. An entry is created by
    the first holder and removed when the last holder or waiter leaves (cancellation included)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    def __len__(self) -> int:
        """How many keys are held or waited for right now."""
        return len(self._locks)

    def held(self, key: str) -> bool:
        entry = self._locks.get(key)
        return entry is not None and entry[0].locked()

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0 and self._locks.get(key) is entry:
                del self._locks[key]
