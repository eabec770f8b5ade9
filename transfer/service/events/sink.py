"""What the upload lifecycle, the publisher and the file service tell about the changes they make, at one point
each: the pre-upload screening (open, plain upload), a publication, a removal, an abort, a quota refusal. This base
does nothing (a deployment without hooks or events); :class:`transfer.service.events.service.EventService` records
and sends them."""

from __future__ import annotations

from transfer.core.uploads.state import FileIntent, UploadRecord
from transfer.errors import QuotaExceeded
from transfer.service.files.records import FileRecord


class EventSink:
    """Hook points of the service's state changes; each does nothing here."""

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
        """Before upload ``upload_id`` stores a byte: the pre-upload hook's decision. Returns the intent as the hook
        left it (its lifetime, its metadata); UploadRefused or HookUnavailable when the upload may not go on."""
        return intent

    async def publishing(self, record: FileRecord, *, upload_id: str, door: str, durable: bool) -> str | None:
        """Before ``record``'s file is placed: its ``file.published`` event staged; its id (None: none recorded).
        ``durable=False``: the placing flushes it to disk."""
        return None

    async def removing(self, record: FileRecord, *, expired: bool) -> str | None:
        """Before ``record``'s file is deleted by the one caller that claimed its removal: its ``file.deleted`` (or
        ``file.expired``) event staged; its id."""
        return None

    async def aborting(self, record: UploadRecord, *, kind: str, key: str) -> str | None:
        """Before upload ``record`` (of kind ``kind``, its record at ``key``) is aborted: its ``upload.aborted``
        event staged; its id."""
        return None

    def made(self, event_id: str | None) -> None:
        """The change of staged event ``event_id`` is made (in this process): it is sent now."""

    async def quota_exceeded(self, error: QuotaExceeded, *, subject: str, owner: str | None, door: str) -> None:
        """Upload or file ``subject`` of ``owner`` was refused by the key's quota (``error``)."""


NO_EVENTS = EventSink()
