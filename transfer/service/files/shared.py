"""Shared, reference-counted bytes: a file whose content one key already stores reuses those bytes.

    content/<scope>/<sha256>-<size>-<encoding>     one record per content a scope stores (compare-and-set):
        location    the object holding the bytes: ``files/<origin>`` (the first file's own object) until that file
                    goes while others still use them, then ``blobs/<scope>/<sha256>-<size>-<encoding>/<random>``
        refs        file id -> when it was added: every file whose bytes these are (the origin included)
        dead        the last reference went: immutable from then on, its bytes are being removed
    files/<id>      a *pointer* file (``FileRecord.content`` set) has an empty body; its bytes are at the
                    record's location

A scope is one API key (open mode: one scope for all), or the sharing group the operator put the key in
(``TRANSFER_DEDUP_GROUPS``): across scopes, "this content exists" would tell one tenant what another stores, so a
lookup never leaves the caller's scope. A file with bytes of its own notes the record it may be the location of
(``FileRecord.shared_as``) when it is published, so a key that changes group later never leaves a record pointing
at bytes its removal took.

Invariants, each kept by the order of the steps (a crash between two steps leaks at most an orphan the sweep
removes, never a reference to bytes that are gone):

- a reference is added (compare-and-set on a live record) *before* the pointer file is published, and removed
  only *after* the pointer file is gone;
- ``location == files/X`` implies ``X in refs``: the origin leaves ``refs`` only by moving its bytes to a blob
  first (a server-side compose), in the same compare-and-set that removes it;
- bytes go only once ``refs`` is empty and the record is dead; a dead record never gains a reference (a new
  upload of that content is a plain upload until the record is gone).

The sweep (:meth:`SharedContent.sweep`, listing-based, never on a request path) drops references to files that do
not exist (a publication that crashed after adding its reference), finishes dead records, and removes blobs no
record points at.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from storage.base import Capability, ObjectReader, SupportsCompose, capable
from storage.errors import ObjectNotFound
from transfer.core.model.content import ContentEncoding
from transfer.errors import Conflict, NotFound, TransferError, VersionConflict, storage_errors_translated
from transfer.service.accounting.recordstore import RecordStore, write_record
from transfer.service.files.records import FileRecord, object_key

log = logging.getLogger("transfer.shared")

CONTENT_PREFIX = "content/"
BLOB_PREFIX = "blobs/"
# a reference younger than this may belong to a publication still in flight; a dead record or a blob this young
# may be a removal or a move still in flight: the sweep leaves them alone
SWEEP_GRACE = 3600.0


def scope_of(owner: str | None, group: str | None = None) -> str:
    """The sharing scope of an owner: its group's (``g-`` and the group name hashed, never a key's folder), else
    its key's (hashed, as its folder); open mode is one scope."""
    if owner is None:
        return "open"
    if group is not None:
        return "g-" + hashlib.sha256(group.encode("utf-8")).hexdigest()[:32]
    return hashlib.sha256(owner.encode("utf-8")).hexdigest()[:32]


def content_key(owner: str | None, sha256: str, size: int, encoding: ContentEncoding, group: str | None = None) -> str:
    """The content record of ``sha256``/``size`` stored with ``encoding`` in the scope of ``owner`` (of its
    sharing ``group`` if it is in one)."""
    return f"{CONTENT_PREFIX}{scope_of(owner, group)}/{sha256}-{size}-{encoding.value}"


@dataclass(frozen=True, slots=True)
class Content:
    """One content record (see the module text)."""

    location: str
    refs: dict[str, float]
    encoding: ContentEncoding
    encoded_size: int
    encoded_sha256: str
    content_type: str
    dead: bool = False
    dead_at: float | None = None
    head: bytes | None = None  # the first original bytes: a later upload of this content is sniffed as if read

    def to_json(self) -> dict[str, Any]:
        """The content record (JSON), as stored; ``v``: its format version."""
        return {
            "v": 1,
            "location": self.location,
            "refs": self.refs,
            "encoding": self.encoding.value,
            "encoded_size": self.encoded_size,
            "encoded_sha256": self.encoded_sha256,
            "content_type": self.content_type,
            "dead": self.dead,
            "dead_at": self.dead_at,
            **({} if self.head is None else {"head": base64.b64encode(self.head).decode()}),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Content:
        """The content record as read back from storage."""
        return cls(
            location=str(doc["location"]),
            refs={str(k): float(v) for k, v in doc["refs"].items()},
            encoding=ContentEncoding(doc["encoding"]),
            encoded_size=int(doc["encoded_size"]),
            encoded_sha256=str(doc["encoded_sha256"]),
            content_type=str(doc["content_type"]),
            dead=bool(doc.get("dead")),
            dead_at=doc.get("dead_at"),
            head=base64.b64decode(doc["head"]) if isinstance(doc.get("head"), str) else None,
        )


class SharedContent:
    """The content records of every scope: lookup and reference on publication, release on removal, the sweep."""

    def __init__(
        self,
        records: RecordStore,
        *,
        min_size: int,
        enabled: bool,
        clock: Callable[[], float],
        groups: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self.storage = storage = records.storage
        # key name -> its sharing group (TRANSFER_DEDUP_GROUPS; settings checked a key is in one group at most)
        self.group_of = {name: group for group, names in (groups or {}).items() for name in names}
        self.records = records
        self.min_size = min_size
        self.clock = clock
        self.composer = capable(storage, Capability.COMPOSE, SupportsCompose)
        # the origin's bytes move by a server-side compose when it goes first: without one, nothing is shared
        self.enabled = enabled and self.composer is not None
        # (a source larger than one copy moves, S3's UploadPartCopy above 5 GiB, is composed in ranges: any size
        # is shared)

    def tracks(self, size: int) -> bool:
        """Whether files of ``size`` bytes are shared at all (small ones cost more in records than they save)."""
        return self.enabled and size >= self.min_size

    def key_for(self, owner: str | None, sha256: str, size: int, encoding: ContentEncoding) -> str | None:
        """The content record this content would have in ``owner``'s scope now (None: files of ``size`` bytes are
        not shared)."""
        if not self.tracks(size):
            return None
        group = None if owner is None else self.group_of.get(owner)
        return content_key(owner, sha256, size, encoding, group)

    def _own_key(self, record: FileRecord) -> str | None:
        """The content record a file with bytes of its own may be the location of: the one noted at its
        publication (even if sharing is off or its size below the minimum now: files may use its bytes), else
        (published before the note) its key's own scope."""
        if record.shared_as is not None:
            return record.shared_as
        if not self.tracks(record.size):
            return None
        return content_key(record.owner, record.sha256, record.size, record.encoding)

    async def _read(self, key: str) -> Content | None:
        try:
            doc, _ = await self.records.read(key)
        except NotFound:
            return None
        return Content.from_json(doc)

    async def _update(self, key: str, change: Callable[[Content], Content | None]) -> Content:
        return await self.records.update(key, Content.from_json, change, Content.to_json)

    # -- publication -------------------------------------------------------------------------------------------

    async def reference(
        self, owner: str | None, sha256: str, size: int, encoding: ContentEncoding, file_id: str
    ) -> tuple[str, Content] | None:
        """Add ``file_id`` (about to be published as a pointer) to the live content record of this content in
        ``owner``'s scope; None when the scope stores no such content (the door takes the body as usual)."""
        key = self.key_for(owner, sha256, size, encoding)
        if key is None:
            return None
        now = self.clock()

        def add(current: Content) -> Content | None:
            if current.dead:
                raise _Dead
            if file_id in current.refs:
                return None
            return replace(current, refs={**current.refs, file_id: now})

        try:
            return key, await self._update(key, add)
        except (NotFound, _Dead):
            return None

    async def track(self, record: FileRecord, head: bytes) -> None:
        """A file just published with bytes of its own (``head``: its first original bytes): its content record is
        created (its object the location) unless the scope has one already. Best effort: a file left untracked
        just is not shared."""
        key = None if record.content is not None else self._own_key(record)
        if key is None:
            return
        content = Content(
            location=object_key(record.id),
            refs={record.id: self.clock()},
            encoding=record.encoding,
            encoded_size=record.encoded_size,
            encoded_sha256=record.encoded_sha256,
            content_type=record.content_type,
            head=head,
        )
        try:
            await self.records.create(key, content.to_json())
        except Conflict:
            return  # the scope stores it already (this copy stays its own), or a dead record is being removed
        except TransferError as exc:
            log.warning("%s is not shared: its content record could not be written: %s", record.id, exc)

    async def unreference(self, key: str, file_id: str) -> None:
        """Best effort after a pointer's publication failed: its reference goes (else the sweep drops it)."""
        try:
            await self.release(key, file_id, own=None)
        except TransferError as exc:
            log.warning("the reference of %s in %s stays until the sweep: %s", file_id, key, exc)

    # -- reading -----------------------------------------------------------------------------------------------

    async def location(self, record: FileRecord) -> str:
        """Where the bytes of ``record`` are: its own object, or for a pointer its content record's location."""
        if record.content is None:
            return object_key(record.id)
        content = await self._read(record.content)
        if content is None or content.dead or record.id not in content.refs:
            raise NotFound(f"no file {record.id!r}")  # a reference the sweep removed: not a readable file
        return content.location

    async def open(self, record: FileRecord) -> ObjectReader:
        """An open reader of ``record``'s bytes (a pointer's: where its content record says; if they moved
        between the lookup and the open, looked up once more)."""
        for attempt in range(2):
            key = await self.location(record)
            try:
                with storage_errors_translated():
                    return await self.storage.open(key)
            except NotFound:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    # -- removal -----------------------------------------------------------------------------------------------

    async def before_removal(self, record: FileRecord) -> str | None:
        """Before the object of ``record`` (bytes of its own, perhaps shared) is deleted: if other files use its
        bytes, they move to a blob and this file leaves the content record. Returns the key of the content record
        to finish with :meth:`after_removal` (None: nothing to do)."""
        if record.content is not None:
            return record.content  # a pointer: its reference goes after its object
        key = self._own_key(record)
        if key is None:
            return None
        own = object_key(record.id)
        content = await self._read(key)
        if content is None or content.location != own:
            return None  # not the bytes the scope shares: its own, removed with it
        blob: str | None = None
        if set(content.refs) - {record.id}:
            assert self.composer is not None
            blob = f"{BLOB_PREFIX}{key.removeprefix(CONTENT_PREFIX)}/{secrets.token_hex(8)}"
            with storage_errors_translated():
                await self.composer.compose(blob, [own], {})

        def move(current: Content) -> Content | None:
            if current.location != own:
                return None
            others = {k: v for k, v in current.refs.items() if k != record.id}
            if not others:
                return replace(current, refs={}, dead=True, dead_at=self.clock())
            if blob is None:
                raise _Moved  # another file took a reference since: move the bytes first
            return replace(current, location=blob, refs=others)

        try:
            try:
                after = await self._update(key, move)
            except _Moved:
                return await self.before_removal(record)
        except BaseException:
            if blob is not None:
                await self._delete(blob)
            raise
        if blob is not None and after.location != blob:
            await self._delete(blob)  # every other reference went meanwhile: not needed
        return key if after.dead else None

    async def after_removal(self, key: str, record: FileRecord) -> None:
        """After the object of ``record`` is gone: its reference goes; the last one takes the bytes with it."""
        await self.release(key, record.id, own=object_key(record.id))

    async def release(self, key: str, file_id: str, *, own: str | None) -> None:
        """Remove ``file_id``'s reference; when none is left, the record dies, then its bytes and it go."""

        def drop(current: Content) -> Content | None:
            if file_id not in current.refs:
                return None
            others = {k: v for k, v in current.refs.items() if k != file_id}
            if others:
                return replace(current, refs=others)
            return replace(current, refs={}, dead=True, dead_at=self.clock())

        try:
            after = await self._update(key, drop)
        except NotFound:
            return
        if after.dead:
            await self._finish_dead(key, after)

    async def _finish_dead(self, key: str, content: Content) -> None:
        if content.location.startswith(BLOB_PREFIX):
            await self._delete(content.location)
        # a dead record never changes, and only this removal (or the sweep, long after) deletes it
        await self._delete(key)

    async def _delete(self, key: str) -> None:
        with storage_errors_translated():
            try:
                await self.storage.delete(key)
            except ObjectNotFound:
                pass

    # -- sweep -------------------------------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Reconcile every content record with the files that exist: references to missing files older than
        :data:`SWEEP_GRACE` go (a publication that crashed), dead records that old are finished, blobs no record
        points at are removed. Returns how many references, records and blobs it removed."""
        if not self.enabled:
            return 0
        removed = 0
        now = self.clock()
        with storage_errors_translated():
            keys = [info.key async for info in self.storage.list(CONTENT_PREFIX)]
        for key in keys:
            content = await self._read(key)
            if content is None:
                continue
            if content.dead:
                if content.dead_at is None or content.dead_at < now - SWEEP_GRACE:
                    await self._claim_and_finish(key)
                    removed += 1
                continue
            for file_id, added in content.refs.items():
                if added >= now - SWEEP_GRACE or object_key(file_id) == content.location:
                    continue
                try:
                    with storage_errors_translated():
                        await self.storage.stat(object_key(file_id))
                except NotFound:
                    await self.release(key, file_id, own=None)
                    removed += 1
        with storage_errors_translated():
            blobs = [info async for info in self.storage.list(BLOB_PREFIX)]
        for info in blobs:
            record_key = CONTENT_PREFIX + info.key.removeprefix(BLOB_PREFIX).rsplit("/", 1)[0]
            if info.modified is not None and info.modified.timestamp() >= now - SWEEP_GRACE:
                continue
            content = await self._read(record_key)
            if content is None or content.dead or content.location != info.key:
                await self._delete(info.key)
                removed += 1
        return removed

    async def _claim_and_finish(self, key: str) -> None:
        """Finish a dead record another process left: claim it by a compare-and-set first, so that two sweeps
        never both delete (the second would find a new record of the same content by then)."""
        try:
            doc, etag = await self.records.read(key)
            # a new token: the same bytes would keep the same ETag on S3 (its MD5) and let a second claim pass
            await write_record(self.storage, key, {**doc, "claim": secrets.token_hex(8)}, if_match=etag)
        except (NotFound, VersionConflict):
            return
        await self._finish_dead(key, Content.from_json(doc))


class _Dead(Exception):
    """The content record is dead: no reference may join it."""


class _Moved(Exception):
    """The origin must move its bytes before it leaves (another file took a reference)."""
