"""Open uploads per API key and kind: one record per key and kind (``folder``) that every replica changes by
compare-and-set. The composition root builds one counter per folder: ``sessions`` (chunked sessions and tus/IETF
uploads together), ``plans`` (direct upload plans), ``authorizations`` (upload authorisations) and ``chunked``
(chunked deduplicating uploads); the upload engine registers each kind's uploads with its counter.

The record ``owners/<key hash>/open/<folder>`` holds ``{"ids": [...], "since": {id: acquired at}}``, the ids holding
a slot, never more than the limit. Acquiring adds an id below the limit; only at the limit are the ids checked
against their uploads (finished or expired ones are dropped, in the same compare-and-set that adds the new id); an
id acquired less than FRESH seconds ago counts as open without asking, since its upload's record may not be written
yet (a replica racing the creation would otherwise take it for finished). Releasing removes the id. Both are
idempotent (an id already in, or already out, changes nothing) and neither lists anything: one record read and one
conditional write at most, and on a replica that wrote the record last, the write alone (:class:`RecordStore`
remembers the version). Two replicas racing for the last slot: one write wins, the other reads the record again
and finds it full, so the limit is exact across replicas.

Markers from before this record (``owners/<key hash>/<folder>/<id>``, one empty object per id that was open at the
upgrade) are ignored: nothing reads or lists them any more, they cost no request, and deleting them (at most the
limit per key and kind, zero bytes each) is safe at any time. The uploads they stood for are not counted, so for the
uploads open at the upgrade a key may briefly hold up to twice its limit; releasing one of them changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from transfer.core.ids import owner_folder
from transfer.errors import TooManySessions, TransferError, storage_errors_translated
from transfer.service.accounting.recordstore import RecordStore

IsOpen = Callable[[str | None, str], Awaitable[bool]]  # (owner, upload id) -> holds its slot
EMPTY: dict[str, Any] = {"ids": []}
FRESH = 60.0  # seconds an id counts as open without asking: its record may not be written yet (claim's block)


class _Full(Exception):
    """Raised by a change that found every slot taken (carries the ids that hold them, and when each was acquired
    as the record it was judged on says)."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(f"{len(ids)} ids")
        self.ids = ids
        self.since: dict[str, float] = {}


def _ids(doc: Any) -> list[str]:
    ids = doc.get("ids") if isinstance(doc, dict) else None
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []


def _since(doc: Any) -> dict[str, float]:
    since = doc.get("since") if isinstance(doc, dict) else None
    if not isinstance(since, dict):
        return {}
    return {k: float(v) for k, v in since.items() if isinstance(k, str) and isinstance(v, (int, float))}


class OpenSlots:
    """One key's open uploads of the kinds registered with it, at most ``limit`` at once (``noun`` and ``error`` say
    so when refused); each kind registers how to tell whether one of its ids is still open."""

    def __init__(
        self,
        records: RecordStore,
        limit: int,
        *,
        folder: str = "sessions",
        noun: str = "open sessions",
        error: type[TransferError] = TooManySessions,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        self.records = records
        self.limit = limit
        self.folder = folder
        self.noun = noun
        self.error = error
        self._checkers: list[tuple[Callable[[str], bool], IsOpen]] = []

    def record_key(self, owner: str) -> str:
        """Where ``owner``'s open ids of this kind are kept."""
        return f"{owner_folder(owner)}open/{self.folder}"

    def register(self, owns: Callable[[str], bool], is_open: IsOpen) -> None:
        """Count the uploads whose ids ``owns`` recognises, asking ``is_open(owner, id)`` whether each still holds a
        slot."""
        self._checkers.append((owns, is_open))

    async def _is_open(self, owner: str, session_id: str) -> bool:
        for owns, is_open in self._checkers:
            if owns(session_id):
                return await is_open(owner, session_id)
        return False

    async def _still_open(self, owner: str, sid: str, since: dict[str, float]) -> bool:
        """Whether ``sid`` holds its slot: recorded as acquired less than FRESH seconds ago (its upload's record may
        still be on its way: a replica racing the creation must not take it for finished), or open by its service."""
        return self.clock() - since.get(sid, 0.0) < FRESH or await self._is_open(owner, sid)

    async def _change(self, owner: str, change: Callable[[list[str]], list[str] | None]) -> list[str]:
        # not durable: a record lost in a power cut only forgets slots (the limit is a guard, not an account)
        since: dict[str, float] = {}

        def decode(doc: Any) -> list[str]:
            since.clear()
            since.update(_since(doc))
            return _ids(doc)

        def encode(ids: list[str]) -> dict[str, Any]:
            now = self.clock()
            return {"ids": ids, "since": {i: since.get(i, now) for i in ids}}

        try:
            return await self.records.update(
                self.record_key(owner), decode, change, encode, absent=EMPTY, durable=False
            )
        except _Full as full:  # the acquisition times of the record the change found full, for the caller to judge
            full.since = {i: since[i] for i in full.ids if i in since}
            raise

    async def open_ids(self, owner: str) -> list[str]:
        """The ids holding a slot of ``owner``'s (as recorded: finished ones stay until the limit is reached)."""
        return await self._change(owner, lambda ids: None)

    async def acquire(self, owner: str | None, session_id: str) -> None:
        """Count ``session_id`` against ``owner`` (None: no key, no limit); ``error`` (TooManySessions) at the
        limit. Idempotent: an id already counted keeps its one slot."""
        if owner is None:
            return

        def add(closed: frozenset[str]) -> Callable[[list[str]], list[str] | None]:
            def change(ids: list[str]) -> list[str] | None:
                kept = [i for i in ids if i not in closed]
                if session_id in kept:
                    return None if kept == ids else kept
                if len(kept) >= self.limit:
                    raise _Full(kept)
                return [*kept, session_id]

            return change

        with storage_errors_translated():
            try:
                await self._change(owner, add(frozenset()))
                return
            except _Full as full:
                taken, since = full.ids, full.since
            # at the limit: ask each holder whether it is still open, and drop the others with the same write
            closed = frozenset([sid for sid in taken if not await self._still_open(owner, sid, since)])
            try:
                await self._change(owner, add(closed))
            except _Full as full:
                raise self.error(
                    f"this API key has {len(full.ids)} {self.noun}, the limit is {self.limit}; complete or "
                    "abort one first",
                    limit=self.limit,
                    headers={"retry-after": "60"},
                ) from None

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
        if owner is None:
            return

        def remove(ids: list[str]) -> list[str] | None:
            return [i for i in ids if i != session_id] if session_id in ids else None

        with storage_errors_translated():
            await self._change(owner, remove)
