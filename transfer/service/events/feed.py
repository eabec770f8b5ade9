"""The caller's own events as a stream: every event is also written, once, under its owner's folder of the feed
(``events/feed/<owner hash>/<cursor>``), where ``GET /v1/events`` reads it. The cursor (the SSE ``id``) is the time
the event entered the feed, in milliseconds, and its event id: listed in key order, the feed is in time order, and a
stream that resumes with ``Last-Event-ID`` lists after it (a page of a key's own folder, not the whole store).

The feed is written by whichever replica first takes the event from the outbox, so it follows the outbox by the
delivery loop's delay; replicas' clocks should agree (NTP), since the cursor orders by them. Entries older than
``events_feed_retention`` are removed by the feed's sweep.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from storage.errors import ObjectNotFound
from transfer.errors import Conflict, InvalidRequest, NotFound, storage_errors_translated
from transfer.service.accounting.recordstore import RecordStore, write_record
from transfer.service.events.model import FEED, Event, is_event_id

CURSOR_DIGITS = 13  # milliseconds since 1970 until the year 2286


def owner_feed(owner: str | None) -> str:
    """The folder of ``owner``'s events (None: files stored without a key)."""
    name = "" if owner is None else owner
    return FEED + hashlib.sha256(("k:" + name).encode("utf-8")).hexdigest()[:32] + "/"


def cursor_of(when: float, event_id: str) -> str:
    """The cursor of ``event_id`` entering the feed at ``when``."""
    return f"{int(when * 1000):0{CURSOR_DIGITS}d}-{event_id}"


def check_cursor(cursor: str) -> str:
    """``cursor`` if it is one this feed hands out (InvalidRequest otherwise: a ``Last-Event-ID`` from elsewhere)."""
    millis, sep, event_id = cursor.partition("-")
    if not (sep and len(millis) == CURSOR_DIGITS and millis.isdigit() and is_event_id(event_id)):
        raise InvalidRequest("Last-Event-ID is not an id of this stream; connect without it", field="Last-Event-ID")
    return cursor


def cursor_time(cursor: str) -> float:
    """When the event of ``cursor`` entered the feed."""
    return int(cursor[:CURSOR_DIGITS]) / 1000


class Feed:
    """The feed's records (see the module text)."""

    def __init__(self, records: RecordStore, *, retention: float, clock: Callable[[], float] = time.time) -> None:
        self.records = records
        self.storage = records.storage
        self.retention = retention
        self.clock = clock

    async def append(self, event: Event) -> None:
        """Put ``event`` in its owner's feed, now."""
        key = owner_feed(event.owner) + cursor_of(self.clock(), event.id)
        doc = {"id": event.id, **event.payload()}
        try:
            # not flushed: the outbox entry that says the feed has it is written, flushed, after this
            await write_record(self.storage, key, doc, if_absent=True, durable=False)
        except Conflict:
            pass

    async def after(
        self, owner: str | None, cursor: str | None, *, limit: int = 100
    ) -> list[tuple[str, dict[str, Any]]]:
        """Up to ``limit`` events of ``owner`` after ``cursor`` (None: from the oldest kept), oldest first, each
        with its cursor."""
        folder = owner_feed(owner)
        with storage_errors_translated():
            keys = [
                info.key
                async for info in self.storage.list(
                    folder, start_after=None if cursor is None else folder + cursor, limit=limit
                )
            ]
        out: list[tuple[str, dict[str, Any]]] = []
        for key in keys:
            try:
                doc, _ = await self.records.read(key)
            except NotFound:
                continue  # swept meanwhile
            out.append((key[len(folder) :], doc))
        return out

    async def sweep(self) -> int:
        """Remove entries older than the retention; how many."""
        before = self.clock() - self.retention
        doomed: list[str] = []
        with storage_errors_translated():
            async for info in self.storage.list(FEED):
                cursor = info.key.rsplit("/", 1)[-1]
                try:
                    if cursor_time(check_cursor(cursor)) < before:
                        doomed.append(info.key)
                except InvalidRequest:
                    continue
            for key in doomed:
                try:
                    await self.storage.delete(key)
                except ObjectNotFound:
                    pass
        return len(doomed)
