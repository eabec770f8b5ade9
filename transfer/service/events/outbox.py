"""The event outbox: one record per event under ``events/outbox/<event id>``, created if absent (so a change made
twice writes one event), changed by compare-and-set (claims, results), deleted once every subscription took it.
Events some subscription never took go to ``events/dead/<event id>`` for an admin to see and send again.

The outbox is bounded (``events_outbox_limit``): this process knows how many entries it saw at the last look and
how many it wrote since; above the bound a new event is not written but counted in ``transfer_events_dropped``
(and logged), so a receiver that is down for days costs a bounded amount of storage. Below it nothing is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from storage.errors import ObjectNotFound
from transfer import metrics
from transfer.errors import Conflict, NotFound, storage_errors_translated
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.events.model import DEAD, OUTBOX, DeadLetter, Entry, Target, is_event_id

log = logging.getLogger("transfer.events")


def outbox_key(event_id: str) -> str:
    """Where event ``event_id`` waits."""
    return OUTBOX + event_id


def dead_key(event_id: str) -> str:
    """Where event ``event_id`` is kept once dead-lettered."""
    return DEAD + event_id


class Outbox:
    """The outbox records of one process (see the module text)."""

    def __init__(self, records: RecordStore, *, limit: int) -> None:
        self.records = records
        self.storage = records.storage
        self.limit = limit
        self.seen = 0  # entries at the last look
        self.added = 0  # entries this process wrote since

    @property
    def full(self) -> bool:
        """Whether the outbox holds its limit (as far as this process knows)."""
        return self.seen + self.added >= self.limit

    async def put(self, entry: Entry, *, durable: bool = True) -> bool:
        """Write ``entry`` if no event of its id is there: True when this call wrote it; False when it was there
        already (the same change made again) or the outbox is full (then it is dropped and counted).
        ``durable=False``: the caller's next write flushes it to disk with itself."""
        event = entry.event
        if self.full:
            metrics.events_dropped.labels(event.type.value).inc()
            log.warning("event outbox full (%d events): %s %s dropped", self.limit, event.type.value, event.id)
            return False
        try:
            await self.records.write(outbox_key(event.id), entry.to_json(), None, durable=durable)
        except Conflict:
            return False
        self.added += 1
        metrics.events_recorded.labels(event.type.value).inc()
        return True

    async def read(self, event_id: str) -> Entry | None:
        """The entry of ``event_id`` as stored now (None: not in the outbox)."""
        try:
            doc, _ = await self.records.read(outbox_key(event_id))
        except NotFound:
            return None
        return Entry.from_json(doc)

    async def update(self, event_id: str, change: Callable[[Entry], Entry | None]) -> Entry | None:
        """Change the entry of ``event_id`` by compare-and-set (``change`` may run more than once and returns None
        for no change); None when it is not in the outbox."""
        try:
            return await self.records.update(outbox_key(event_id), Entry.from_json, change, Entry.to_json)
        except NotFound:
            return None

    async def confirm(self, event_id: str) -> None:
        """Mark a staged entry's change as made (nothing if it is confirmed already or gone)."""
        await self.update(event_id, lambda e: e.confirmed() if e.staged else None)

    async def remove(self, event_id: str) -> None:
        """Delete the entry of ``event_id`` (gone already: nothing to do)."""
        with storage_errors_translated():
            try:
                await self.storage.delete(outbox_key(event_id))
            except ObjectNotFound:
                pass

    async def ids(self) -> list[str]:
        """The id of every event waiting (a listing of the outbox: for the delivery loop only)."""
        with storage_errors_translated():
            found = [info.key[len(OUTBOX) :] async for info in self.storage.list(OUTBOX)]
        ids = [i for i in found if is_event_id(i)]
        self.seen, self.added = len(ids), 0
        metrics.events_waiting.set(len(ids))
        return ids

    async def bury(self, entry: Entry, failed: dict[str, Target]) -> None:
        """Keep ``entry``'s event as dead-lettered for the subscriptions ``failed`` names (added to any it had)."""

        def merged(raw: Any) -> DeadLetter:
            if not raw:
                return DeadLetter(entry.event, {})
            return DeadLetter.from_json(raw)

        def change(letter: DeadLetter) -> DeadLetter:
            return DeadLetter(letter.event, {**letter.failed, **failed})

        await self.records.update(dead_key(entry.event.id), merged, change, DeadLetter.to_json, absent={})

    async def dead(self, *, limit: int, after: str | None = None) -> tuple[list[DeadLetter], str | None]:
        """A page of dead-lettered events in id order, and the id to continue after (None: the end)."""
        letters: list[DeadLetter] = []
        with storage_errors_translated():
            keys = [
                info.key
                async for info in self.storage.list(
                    DEAD, start_after=None if after is None else DEAD + after, limit=limit + 1
                )
            ]
        for key in keys[:limit]:
            try:
                doc, _ = await self.records.read(key)
            except NotFound:
                continue
            letters.append(DeadLetter.from_json(doc))
        more = len(keys) > limit
        return letters, (keys[limit - 1][len(DEAD) :] if more and keys[:limit] else None)

    async def revive(self, event_id: str, now: float) -> Entry:
        """Send a dead-lettered event again to the subscriptions it failed for: back in the outbox with fresh
        attempts (NotFound when no such dead letter)."""
        try:
            doc, _ = await self.records.read(dead_key(event_id))
        except NotFound:
            raise NotFound(f"no dead-lettered event {event_id!r}") from None
        letter = DeadLetter.from_json(doc)
        targets = {sid: Target(0, now, now, "") for sid in letter.failed}
        entry = Entry(letter.event, targets=targets, fed=True)
        try:
            await self.records.create(outbox_key(event_id), entry.to_json())
        except Conflict:  # still waiting for others: its failed subscriptions join it
            await self.update(
                event_id, lambda e: Entry(e.event, e.check, e.lease, {**(e.targets or {}), **targets}, e.fed)
            )
        with storage_errors_translated():
            try:
                await self.storage.delete(dead_key(event_id))
            except ObjectNotFound:
                pass
        return entry
