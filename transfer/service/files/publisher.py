"""The one publisher: every door hands over a :class:`Candidate`, and what gets published is decided here alone.

    door (plain, multipart, tus, IETF, sessions, direct plans, MCP authorisations, imports, bundles' uploads)
      gathers the bytes (unpublished: a writer not yet committed, staged chunks, an assembled multipart object)
      and their size, SHA-256 and first bytes
        --> Publisher.publish(candidate, place)
              check_fields      every field against the settings (one place for each limit, whatever the door)
              file id           from the upload id (``file_id_for``: stable, one outcome for two completions)
              sniff             the media type from the first bytes, off the event loop unless it is cheap
              FileRecord        built once, here
              expiry index      the entry written before the file exists (the sweep drops one left by a failure)
              charge            the owner's usage, at most once per upload id (a compare-and-set on the usage
                                record decides; see ``UsageLedger.charge``)
              place             the door's own way of making the bytes the file (commit, rename, compose, copy)
              track             a file of ``dedup_min_size`` or more: its content record, so that a later upload of
                                the same content by the same key can share its bytes (``transfer.service.files.shared``)
            index             the owner's file index
            on failure          the charge this call made is taken back, unless the file is published anyway
                                (another completion of the same upload placed it)

        --> Publisher.publish_known(candidate)   a door that knows the SHA-256 and size before any byte came:
              the key's content record takes a reference to the new file, then the file is published as above, a
              pointer to those bytes (no body read); None when the key stores no such content (the door goes on)

A door keeps what only it knows (how its bytes are gathered and placed, its upload record's state); it writes no
FileRecord, sniffs nothing and charges nothing itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

from transfer.core.model.content import ContentEncoding
from transfer.core.model.mime import require_media_type
from transfer.core.model.naming import resolve_content_type, sanitize_filename, sniff_is_cheap
from transfer.core.uploads.lifetimes import expiry_key
from transfer.core.uploads.state import FileIntent
from transfer.errors import (
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    StorageUnavailable,
    TransferError,
    storage_errors_translated,
)
from transfer.service.accounting.lifecycle import Lifecycle
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.events.sink import NO_EVENTS, EventSink
from transfer.service.files.documents import index_file, unindex_file
from transfer.service.files.records import FileRecord, object_key
from transfer.service.files.shared import SharedContent
from transfer.settings import Settings

log = logging.getLogger("transfer.publisher")

MAX_NAME = 1024  # characters of a file name as asked (the stored name is sanitised and shorter)
SNIFF_BYTES = 4096  # the first bytes of a file a door keeps for its media type
# a completion of the same upload may still come this long after the upload's own expiry (one started just before
# it): the upload stays marked as charged until then
CHARGE_MARK_GRACE = 3600.0


def file_id_for(upload_id: str) -> str:
    """The id of the file that upload ``upload_id`` (``s_…``, ``t_…``, ``d_…``, ``az_…``) publishes: its random
    part under the file prefix, so every completion of one upload names the same file."""
    kind, sep, random_part = upload_id.partition("_")
    if not sep or not kind or not random_part:
        raise ValueError(f"not an upload id: {upload_id!r}")
    return "f_" + random_part


@dataclass(frozen=True, slots=True)
class Candidate:
    """What a door gathered about the file it wants published."""

    owner: str | None  # the API key it belongs to (None: open mode)
    upload_id: str  # the upload (reservation) it comes from; a plain upload's is the new file's id
    size: int  # original bytes
    sha256: str  # hex, of the original bytes
    head: bytes  # the first original bytes (up to SNIFF_BYTES): the media type is sniffed from them
    source: str  # the door, for the log
    intent: FileIntent = FileIntent()  # what the file is to be (its lifetime already settled against the policy)
    encoding: ContentEncoding = ContentEncoding.NONE  # of the stored bytes
    encoded_size: int | None = None  # stored bytes (None: the original size)
    encoded_sha256: str | None = None  # hex, of the stored bytes (None: the original's)
    republishable_until: float | None = None  # the upload may be completed twice (replicas) until then: charge once
    file_id: str | None = None  # None: derived from ``upload_id``
    content: str | None = None  # the content record whose bytes it shares (set by ``publish_known`` only)
    # placing the file flushes every earlier write to disk with it (storage.base.flushes_earlier_writes): the
    # expiry entry and the charge need no flush of their own (one wait on the disk for all, still before the file)
    flushed_by_place: bool = False


class Publisher:
    """Validates, records, charges, places and indexes every file the service publishes (see the module text)."""

    def __init__(
        self, records: RecordStore, settings: Settings, lifecycle: Lifecycle, *, clock: Callable[[], float]
    ) -> None:
        self.storage = records.storage
        self.settings = settings
        self.lifecycle = lifecycle
        self.clock = clock
        self.events: EventSink = NO_EVENTS  # what is told of each publication and removal (set by the container)
        self.shared = SharedContent(
            records,
            min_size=settings.dedup_min_size,
            enabled=settings.dedup,
            clock=clock,
            groups=settings.dedup_groups,
        )

    def check_intent(self, intent: FileIntent) -> None:
        """Refuse what no door may publish: a description above ``max_description_length``, a malformed media type,
        a name longer than ``MAX_NAME`` characters. The upload engine calls it when an upload opens and a plain
        upload before it reads a byte; :meth:`publish` calls it again on what it is handed, so a field that arrives
        with the body (a multipart form field) meets the same rule, whatever the door."""
        limit = self.settings.max_description_length
        if intent.description is not None and len(intent.description) > limit:
            raise InvalidRequest(f"description longer than {limit} characters", field="description", limit=limit)
        if intent.name is not None and len(intent.name) > MAX_NAME:
            raise InvalidRequest(f"name longer than {MAX_NAME} characters", field="name", limit=MAX_NAME)
        if intent.content_type is not None:
            require_media_type(intent.content_type)
        if intent.hinted_type is not None:
            require_media_type(intent.hinted_type, "Content-Type")

    async def require_room(self, owner: str | None, upload_id: str, size: int, *, what: str, retry: str) -> None:
        """Before a door does costly work (assembling, reading back) for ``size`` bytes of upload ``upload_id``:
        QuotaExceeded when they cannot fit in ``owner``'s quota (the upload's own reservation counts as its room).
        The upload stays as it is: the key may make room and try again (``retry`` says how). The charge at
        publication checks again, exactly."""
        room = await self.lifecycle.room_for(owner, upload_id, at_least=size)
        if room is not None and size > room:
            refusal = QuotaExceeded(
                f"the {size} bytes of {what} go beyond the {room} bytes this key's quota has room for; {retry}",
                room=room,
                requested=size,
            )
            await self.events.quota_exceeded(refusal, subject=upload_id, owner=owner, door="upload")
            raise refusal

    def now(self) -> datetime:
        """The service clock as a record's timestamp (whole seconds, UTC)."""
        return datetime.fromtimestamp(self.clock(), UTC).replace(microsecond=0)

    async def record(self, candidate: Candidate) -> FileRecord:
        """The FileRecord ``candidate`` becomes: its fields checked, its media type sniffed (off the event loop
        unless declared or cheap), its expiry from its lifetime."""
        c, intent = candidate, candidate.intent
        self.check_intent(intent)
        file_id = c.file_id or file_id_for(c.upload_id)
        head = c.head[:SNIFF_BYTES]
        declared, hinted = intent.content_type, intent.hinted_type
        sniff = partial(resolve_content_type, head, intent.name, declared=declared, hinted=hinted)
        # puremagic's full scan costs about a millisecond of CPU: not on the event loop; without it sniffing costs
        # less than the thread hop
        content_type = sniff() if declared or sniff_is_cheap(head) else await asyncio.to_thread(sniff)
        require_media_type(content_type)
        created = self.now()
        return FileRecord(
            id=file_id,
            name=sanitize_filename(intent.name, default=file_id),
            content_type=content_type,
            size=c.size,
            sha256=c.sha256,
            encoding=c.encoding,
            encoded_size=c.size if c.encoded_size is None else c.encoded_size,
            encoded_sha256=c.sha256 if c.encoded_sha256 is None else c.encoded_sha256,
            created_at=created,
            role=intent.role,
            description=intent.description,
            owner=c.owner,
            expires_at=self.lifecycle.expiry(created, intent.lifetime),
            content=c.content,
            shared_as=None if c.content is not None else self.shared.key_for(c.owner, c.sha256, c.size, c.encoding),
            metadata=dict(intent.metadata) if intent.metadata else None,
        )

    async def publish(self, candidate: Candidate, place: Callable[[FileRecord], Awaitable[object]]) -> FileRecord:
        """Publish ``candidate``: build its record, write its expiry index entry, charge its owner (QuotaExceeded:
        nothing is placed), ``place(record)`` (the door makes its bytes the file, with the record as metadata),
        enter it in its owner's index. Returns the record. If placing fails, the charge this call made is taken
        back, unless the file is there anyway (another completion of the same upload placed it)."""
        record = await self.record(candidate)
        if record.expires_at is not None:
            with storage_errors_translated():
                key, durable = expiry_key(record.expires_at, record.id), not candidate.flushed_by_place
                async with self.storage.create(key, size_hint=0, durable=durable) as writer:
                    await writer.commit({})
        # its event staged before the file exists, in the id its file gives it: a crash after the placing loses it
        # not, and a second completion of the same upload writes no second event
        staged = await self.events.publishing(
            record, upload_id=candidate.upload_id, door=candidate.source, durable=not candidate.flushed_by_place
        )
        until = candidate.republishable_until
        try:
            charged = await self.lifecycle.usage.charge(
                record.owner,
                candidate.upload_id,
                record.size,
                until=None if until is None else until + CHARGE_MARK_GRACE,
                durable=not candidate.flushed_by_place,
            )
        except QuotaExceeded as exc:
            await self.events.quota_exceeded(
                exc, subject=candidate.upload_id, owner=record.owner, door=candidate.source
            )
            raise
        try:
            await place(record)
        except BaseException:
            if charged and not await self._placed(record):
                try:
                    if until is None:  # a charge not marked by its upload id (a plain upload): its bytes go back
                        await self.lifecycle.usage.refund(record.owner, record.size, rid=candidate.upload_id)
                    else:
                        await self.lifecycle.usage.withdraw(record.owner, candidate.upload_id, record.size)
                except TransferError as exc:  # the publication's own error is the one to report
                    log.warning(
                        "%s (%s) was not published; its %d bytes stay counted: %s",
                        record.id,
                        candidate.source,
                        record.size,
                        exc,
                    )
            raise
        await self.shared.track(record, candidate.head[:SNIFF_BYTES])
        await index_file(self.storage, record)
        self.events.made(staged)
        return record

    async def publish_known(self, candidate: Candidate) -> FileRecord | None:
        """Publish ``candidate`` without its bytes if its owner's scope already stores that content (SHA-256, size
        and stored encoding): a new file of its own (id, name, lifetime, charge) sharing those bytes. None when the
        scope stores no such content (or the size is below ``dedup_min_size``): the door reads the body as usual.
        Only the owner's own scope is looked at, so the answer tells a key nothing about another key's files."""
        c = candidate
        file_id = c.file_id or file_id_for(c.upload_id)
        found = await self.shared.reference(c.owner, c.sha256, c.size, c.encoding, file_id)
        if found is None:
            return None
        key, content = found
        shared = replace(
            c,
            file_id=file_id,
            # named as if its bytes were read (the stored head, sniffed with this upload's name); a record written
            # before heads were kept: the type the content was given at first
            head=content.head or b"",
            intent=c.intent
            if content.head is not None
            else replace(c.intent, content_type=c.intent.content_type or content.content_type),
            encoding=content.encoding,
            encoded_size=content.encoded_size,
            encoded_sha256=content.encoded_sha256,
            content=key,
        )

        async def place(record: FileRecord) -> None:
            with storage_errors_translated():
                async with self.storage.create(object_key(record.id), size_hint=0, if_absent=True) as writer:
                    await writer.commit(record.to_metadata())

        try:
            return await self.publish(shared, place)
        except BaseException:
            try:
                with storage_errors_translated():
                    await self.storage.stat(object_key(file_id))
            except NotFound:  # not published: its reference goes (only then: a file must never lose its bytes)
                await self.shared.unreference(key, file_id)
            except TransferError:
                pass  # unknown: the reference stays, and the sweep drops it once the file is known to be missing
            raise

    async def unpublish(self, record: FileRecord, *, expired: bool = False) -> bool:
        """The one way a file goes (delete, expiry sweep — ``expired`` —, a completion that lost its upload to an
        abort): True for the one caller that removed it, False for every other (:meth:`Lifecycle.remove_charged`:
        claimed, removed, refunded once); then it leaves its expiry index and its owner's file index."""
        shared = self.shared
        content: str | None = None
        staged: str | None = None

        async def move_shared_bytes() -> None:  # bytes other files share leave its object before it goes
            nonlocal content, staged
            staged = await self.events.removing(record, expired=expired)  # by the one claimer, before it goes
            content = await shared.before_removal(record)

        removed = await self.lifecycle.remove_charged(
            object_key(record.id), record.owner, record.id, record.size, before_delete=move_shared_bytes
        )
        if not removed:
            return False
        self.events.made(staged)
        if content is not None:  # a pointer's reference goes after its file
            try:
                await shared.after_removal(content, record)
            except TransferError as exc:  # the file is gone: a reference left behind is the sweep's to drop
                log.warning("%s is removed; its reference in %s stays until the sweep: %s", record.id, content, exc)
        await self.lifecycle.deleted(record.id, record.expires_at)
        await unindex_file(self.storage, record)  # after: a crash in between leaves an entry the listing skips
        return True

    async def _placed(self, record: FileRecord) -> bool:
        """Whether the file of ``record`` (these bytes) is published, whoever placed it; False when unknown."""
        try:
            with storage_errors_translated():
                info = await self.storage.stat(object_key(record.id))
            return FileRecord.from_metadata(info.metadata).sha256 == record.sha256
        except (NotFound, StorageUnavailable):
            return False
        except TransferError:
            return False
