"""Open sessions per API key (chunked sessions and tus uploads together), counted through the storage backend so
that every replica sees the same number; the same counter, in folders of their own, bounds a key's open direct
upload plans (``plans/``) and upload authorisations (``authorizations/``).

Each open session leaves a marker ``owners/<key hash>/sessions/<session id>``; the count is the number of markers, and
only when it reaches the limit are the markers checked against their sessions (finished or expired ones are dropped).
Counting lists only that key's folder and stops at the limit, so it costs at most ``limit`` entries (one LIST call on
S3) whatever else is stored. Two replicas racing for the last slot may both win it: the limit is exact to within the
number of replicas.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from storage.base import Storage
from storage.errors import ObjectNotFound
from transfer.errors import TooManySessions, TransferError, storage_errors_translated
from transfer.service.records import owner_folder

IsOpen = Callable[[str], Awaitable[bool]]


class SessionQuota:
    """Shared by the session and tus services: each registers how to tell whether one of its ids is still open.
    ``folder``, ``noun`` and ``error`` make it the counter of another kind of open resource."""

    def __init__(
        self,
        storage: Storage,
        limit: int,
        *,
        folder: str = "sessions",
        noun: str = "open sessions",
        error: type[TransferError] = TooManySessions,
    ) -> None:
        self.storage = storage
        self.limit = limit
        self.folder = folder
        self.noun = noun
        self.error = error
        self._checkers: list[tuple[Callable[[str], bool], IsOpen]] = []

    def _prefix(self, owner: str) -> str:
        return f"{owner_folder(owner)}{self.folder}/"

    def register(self, owns: Callable[[str], bool], is_open: IsOpen) -> None:
        """Count the uploads whose ids ``owns`` recognises, asking ``is_open`` whether each still holds a slot."""
        self._checkers.append((owns, is_open))

    async def _is_open(self, session_id: str) -> bool:
        for owns, is_open in self._checkers:
            if owns(session_id):
                return await is_open(session_id)
        return False

    async def acquire(self, owner: str | None, session_id: str) -> None:
        """Count ``session_id`` against ``owner`` (None: no key, no limit); ``error`` (TooManySessions) at the
        limit."""
        if owner is None:
            return
        prefix = self._prefix(owner)
        with storage_errors_translated():
            ids = [info.key[len(prefix) :] async for info in self.storage.list(prefix, limit=self.limit)]
            if len(ids) >= self.limit:
                still_open = 0
                for sid in ids:
                    if await self._is_open(sid):
                        still_open += 1
                    else:
                        await self._drop(prefix + sid)
                if still_open >= self.limit:
                    raise self.error(
                        f"this API key has {still_open} {self.noun}, the limit is {self.limit}; complete or "
                        "abort one first",
                        limit=self.limit,
                        headers={"retry-after": "60"},
                    )
            async with self.storage.create(prefix + session_id, size_hint=0, durable=False) as writer:
                await writer.commit({})

    @asynccontextmanager
    async def claim(self, owner: str | None, session_id: str) -> AsyncIterator[None]:
        """Acquire for the block that records the new session; if that block fails, the slot is given back."""
        await self.acquire(owner, session_id)
        try:
            yield
        except BaseException:
            await self.release(owner, session_id)
            raise

    async def release(self, owner: str | None, session_id: str) -> None:
        """Give back the slot ``session_id`` holds among ``owner``'s (idempotent; nothing for no owner)."""
        if owner is not None:
            with storage_errors_translated():
                await self._drop(self._prefix(owner) + session_id)

    async def _drop(self, key: str) -> None:
        try:
            await self.storage.delete(key)
        except ObjectNotFound:
            pass
