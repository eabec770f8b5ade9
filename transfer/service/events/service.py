"""Hooks and events of one process, as the rest of the service sees them: the pre-upload hook, the outbox every
change writes its event to, the delivery to webhook subscriptions and the caller's feed. Built once by the
composition root; its delivery loop is one of the maintenance sweeps (any replica delivers any event)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx

from transfer.core.model.content import format_timestamp
from transfer.core.uploads.state import FileIntent, UploadRecord
from transfer.errors import NotFound, QuotaExceeded, StorageUnavailable, storage_errors_translated
from transfer.service.accounting.lifecycle import Lifecycle
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.accounting.usage import REMOVAL_LEASE
from transfer.service.events.delivery import Dispatcher
from transfer.service.events.feed import Feed
from transfer.service.events.hook import PreUploadHook, Screening
from transfer.service.events.model import Check, Entry, Event, EventType, event_id
from transfer.service.events.outbox import Outbox
from transfer.service.events.sink import EventSink
from transfer.service.events.subscriptions import Subscriptions
from transfer.service.files.records import FileRecord, object_key
from transfer.settings import Settings

log = logging.getLogger("transfer.events")

# how long a staged event may wait for its change before it is taken as never made: a publication may place a
# large object slowly (an S3 compose), a removal's claim lasts REMOVAL_LEASE, an abort is one compare-and-set
GRACE = {
    EventType.FILE_PUBLISHED: 3600.0,
    EventType.FILE_DELETED: REMOVAL_LEASE + 60.0,
    EventType.FILE_EXPIRED: REMOVAL_LEASE + 60.0,
    EventType.UPLOAD_ABORTED: 300.0,
}


def file_summary(record: FileRecord) -> dict[str, Any]:
    """What an event says of a file: its descriptor's identity (no URL: one would expire; the receiver asks the API
    for a descriptor when it wants the bytes)."""
    return {
        "id": record.id,
        "name": record.name,
        "size": record.size,
        "checksum": "sha256:" + record.sha256,
        "content_type": record.content_type,
        "owner": record.owner,
        "created_at": format_timestamp(record.created_at),
        "expires_at": None if record.expires_at is None else format_timestamp(record.expires_at),
        "role": None if record.role is None else record.role.value,
        "description": record.description,
        "metadata": dict(record.metadata or {}),
    }


def door_of(source: str) -> str:
    """The door a publication came by, from the source the publisher logs (``"tus (shared)"`` -> ``"tus"``)."""
    return source.split(" ", 1)[0]


class EventService(EventSink):
    """The hook and the events of one process (see the module text); inert parts stay off unless configured."""

    def __init__(
        self,
        records: RecordStore,
        settings: Settings,
        terms: Lifecycle,
        *,
        clock: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.enabled = settings.events
        self.storage = records.storage
        self.records = records
        self.terms = terms
        self.clock = clock
        self.hook = PreUploadHook(settings, transport=transport)
        self.outbox = Outbox(records, limit=settings.events_outbox_limit)
        self.subscriptions = Subscriptions(records, self.hook.policy, limit=settings.max_event_subscriptions)
        self.feed = Feed(records, retention=settings.events_feed_retention, clock=clock)
        self.dispatcher = Dispatcher(
            self.outbox,
            self.subscriptions,
            self.feed,
            settings,
            happened=self.happened,
            grace=lambda entry: GRACE.get(entry.event.type, 300.0),
            clock=clock,
            transport=transport,
        )

    def start(self) -> None:
        """Start delivering (events on)."""
        if self.enabled:
            self.dispatcher.start()

    async def close(self) -> None:
        """Stop delivering and close the hook's and the deliveries' connections."""
        await self.dispatcher.close()
        await self.hook.close()

    # -- the hook ------------------------------------------------------------------------------------------------

    async def screen(
        self,
        *,
        upload_id: str,
        owner: str | None,
        door: str,
        intent: FileIntent,
        size: int | None,
        checksum: str | None,
    ) -> FileIntent:
        """The hook's decision (see :meth:`EventSink.screen`); a lifetime it sets is kept within the maximum of the
        key and of the service."""
        if not self.hook.enabled:
            return intent
        screening = Screening(upload_id, owner, door, intent, size, checksum)
        admission = await self.hook.ask(screening)
        lifetime = intent.lifetime
        if admission.lifetime is not None:  # within the key's and the service's maximum, whatever the hook says
            maximum = (await self.terms.policy(owner)).maximum
            lifetime = admission.lifetime if maximum is None else min(admission.lifetime, maximum)
        return replace(intent, lifetime=lifetime, metadata=admission.metadata or intent.metadata)

    # -- the changes ---------------------------------------------------------------------------------------------

    async def _stage(self, event: Event, check: Check | None, *, durable: bool = True) -> str | None:
        if not self.enabled:
            return None
        dropped = self.outbox.full  # put counts it
        await self.outbox.put(Entry(event, check=check), durable=durable)
        return None if dropped else event.id

    async def publishing(self, record: FileRecord, *, upload_id: str, door: str, durable: bool) -> str | None:
        """``file.published`` staged, checked by the file's existence with its SHA-256 (see the base)."""
        if not self.enabled:
            return None
        kind = EventType.FILE_PUBLISHED
        data = {"file": file_summary(record), "door": door_of(door), "upload_id": upload_id}
        event = Event(event_id(kind, record.id), kind, record.owner, self.clock(), data)
        return await self._stage(event, Check(file=record.id, sha256=record.sha256), durable=durable)

    async def removing(self, record: FileRecord, *, expired: bool) -> str | None:
        """``file.deleted`` or ``file.expired`` staged, checked by the file's absence (see the base)."""
        if not self.enabled:
            return None
        kind = EventType.FILE_EXPIRED if expired else EventType.FILE_DELETED
        eid = event_id(kind, record.id)
        event = Event(eid, kind, record.owner, self.clock(), {"file": file_summary(record)})
        dropped = self.outbox.full
        if not await self.outbox.put(Entry(event, check=Check(file=record.id, gone=True))) and not dropped:
            # an earlier removal of this file failed and left its event staged: this removal's kind is the one
            await self.outbox.update(eid, lambda e: replace(e, event=event) if e.staged else None)
        # its publication happened, whatever a look at the storage finds once it is gone
        await self.outbox.confirm(event_id(EventType.FILE_PUBLISHED, record.id))
        return None if dropped else eid

    async def aborting(self, record: UploadRecord, *, kind: str, key: str) -> str | None:
        """``upload.aborted`` staged, checked by the upload record's state (see the base)."""
        if not self.enabled:
            return None
        t = EventType.UPLOAD_ABORTED
        data = {
            "upload_id": record.id,
            "kind": kind,
            "owner": record.owner,
            "name": record.intent.name,
        }
        event = Event(event_id(t, record.id), t, record.owner, self.clock(), data)
        return await self._stage(event, Check(record=key, state="aborted"))

    def made(self, event_id: str | None) -> None:
        """Hand ``event_id`` to this process's delivery workers now."""
        if event_id is not None and self.enabled:
            self.dispatcher.confirmed(event_id)

    async def quota_exceeded(self, error: QuotaExceeded, *, subject: str, owner: str | None, door: str) -> None:
        """``quota.exceeded`` recorded (its change, the refusal, is made: nothing to check) and sent."""
        if not self.enabled:
            return
        t = EventType.QUOTA_EXCEEDED
        detail = {k: v for k, v in error.detail.items() if isinstance(v, int | str | None)}
        data = {"upload_id": subject, "owner": owner, "door": door_of(door), "message": error.message, **detail}
        event = Event(event_id(t, subject), t, owner, self.clock(), data)
        try:
            eid = await self._stage(event, None)
        except StorageUnavailable as exc:  # the refusal is the client's answer; its event is best effort
            log.warning("quota.exceeded for %s not recorded: %s", subject, exc)
            return
        self.made(eid)

    # -- checks of staged events ---------------------------------------------------------------------------------

    async def happened(self, check: Check) -> bool:
        """Whether the change a staged event stands for is visible in the storage."""
        if check.record is not None:
            try:
                doc, _ = await self.records.read(check.record)
            except NotFound:
                return False
            return isinstance(doc, dict) and doc.get("state") == check.state
        assert check.file is not None
        try:
            with storage_errors_translated():
                info = await self.storage.stat(object_key(check.file))
        except NotFound:
            return check.gone
        if check.gone:
            return False
        try:
            return FileRecord.from_metadata(info.metadata).sha256 == check.sha256
        except StorageUnavailable:
            return False
