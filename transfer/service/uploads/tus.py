"""tus 1.0.0 uploads (https://tus.io/protocols/resumable-upload): the operations behind the tus front door, the
offset-addressed door of the one upload lifecycle (:mod:`transfer.service.uploads.lifecycle`).

An upload is one record plus the segments its PATCH requests delivered, all in the storage backend:

    tus/<id>/info.json               length (or deferred), metadata and the file's intent drawn from it, concat
                                     role, expiry, state, and the index of its segments (offset -> size, xxh3-128),
                                     updated by compare-and-set through the lifecycle
    tus/<id>/seg/<offset:016d>       the bytes of one PATCH, created if-absent: two PATCHes at one offset -> 409

The offset is where the recorded segments end, so any replica, or a restarted process, knows it from one record
read: create, PATCH, HEAD and termination never list storage. A segment stored by a process that stopped before
its record said so is adopted (its object's metadata has its digest) by the next HEAD or PATCH. A PATCH cut short
keeps what arrived (tus servers SHOULD), unless it carried an Upload-Checksum. When the offset reaches the length,
the segments become an ordinary stored file (FileRecord; name and type from Upload-Metadata), the upload records
its file id and the segments are deleted (the offset of a finished upload is its length). Partial uploads
(concatenation) are kept as segments until they expire: a final upload concatenates them, and tus lets several.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Self

from storage.base import Storage
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import is_id, new_id
from transfer.core.model.content import FileRole
from transfer.core.model.mime import is_media_type
from transfer.core.uploads.lifetimes import parse_expires_in
from transfer.core.uploads.state import (
    FileIntent,
    Part,
    UploadEvent,
    UploadRecord,
    UploadState,
    next_offset,
    parts_from_json,
    parts_to_json,
    with_part,
)
from transfer.errors import (
    ChecksumMismatch,
    ClientDisconnected,
    Conflict,
    Gone,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    TooLarge,
    TransferError,
    TusChecksumMismatch,
    UploadForbidden,
    storage_errors_translated,
)
from transfer.service.accounting.slots import OpenSlots
from transfer.service.files.documents import publish_composed
from transfer.service.files.publisher import Candidate
from transfer.service.files.records import FileRecord
from transfer.service.uploads.engine import PartExists, StoredPart, UploadEngine
from transfer.service.uploads.lifecycle import UploadKind, UploadLifecycle
from transfer.settings import Settings

log = logging.getLogger("transfer.tus")

CHECKSUM_ALGORITHMS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256, "md5": hashlib.md5}
PREFIX = "tus/"


def new_upload_id() -> str:
    """A fresh tus upload id (``t_`` and 128 random bits)."""
    return new_id("t_")


def is_upload_id(value: str) -> bool:
    """Whether ``value`` is a tus upload id."""
    return is_id(value, "t_")


# Upload metadata key holding the SHA-256 (hex) the whole upload must have: checked before anything is published
DECLARED_SHA256 = "sha256"

MAX_METADATA = 4096  # bytes of Upload-Metadata: it is stored with the upload and echoed on every HEAD


def parse_metadata(value: str | None) -> dict[str, str]:
    """``Upload-Metadata``: comma-separated ``key base64value`` pairs (value optional); keys unique."""
    out: dict[str, str] = {}
    if not value:
        return out
    if len(value) > MAX_METADATA:
        raise InvalidRequest(f"Upload-Metadata is longer than {MAX_METADATA} bytes", limit=MAX_METADATA)
    for pair in value.split(","):
        pair = pair.strip()
        if not pair:
            continue
        key, _, encoded = pair.partition(" ")
        if not key or " " in encoded.strip() or key in out:
            raise InvalidRequest(f"malformed Upload-Metadata pair {pair[:60]!r}")
        try:
            out[key] = base64.b64decode(encoded.strip(), validate=True).decode("utf-8") if encoded.strip() else ""
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"Upload-Metadata value of {key!r} is not base64 of UTF-8") from exc
    return out


def encode_metadata(metadata: dict[str, str]) -> str:
    """``Upload-Metadata`` from a mapping (values base64, a key without value alone)."""
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" if v else k for k, v in metadata.items())


def intent_of(metadata: dict[str, str], *, strict: bool = True) -> FileIntent:
    """The file an upload's ``Upload-Metadata`` asks for: its name (``filename``, as tus-js-client and Uppy send
    it, or ``name``), media type (``content_type`` is the client's word; ``filetype`` is the browser's guess from
    the extension, a hint like a Content-Type header), ``role``, ``description`` and lifetime (``expires_in``).
    ``strict`` False (a record stored before intents were kept): what does not parse is dropped, not refused."""
    role = metadata.get("role") or None
    if role is not None and role not in {r.value for r in FileRole}:
        if strict:
            raise InvalidRequest(f"Upload-Metadata role must be one of {', '.join(r.value for r in FileRole)}")
        role = None
    declared, hinted = metadata.get("content_type") or None, metadata.get("filetype") or None
    lifetime: int | None = None
    try:
        lifetime = parse_expires_in(metadata.get("expires_in"), "Upload-Metadata expires_in")
    except TransferError:
        if strict:
            raise
    return FileIntent(
        name=metadata.get("filename") or metadata.get("name") or None,
        content_type=declared if strict or declared is None or is_media_type(declared) else None,
        hinted_type=hinted if strict or hinted is None or is_media_type(hinted) else None,
        role=FileRole(role) if role else None,
        description=metadata.get("description"),
        lifetime=lifetime,
    )


def _info_key(uid: str, owner: str | None = None) -> str:
    return f"{PREFIX}{uid}/info.json"


def _segment_key(uid: str, offset: int) -> str:
    return f"{PREFIX}{uid}/seg/{offset:016d}"


def _listed(key: str) -> tuple[str, bool] | None:
    uid, sep, rest = key[len(PREFIX) :].partition("/")
    return (uid, rest == "info.json") if sep and rest else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Upload(UploadRecord):
    """A tus upload's record: the shared fields of every upload, and its declared length (None while deferred),
    metadata, concatenation role and the segments stored so far."""

    length: int | None = None  # None: deferred
    metadata: dict[str, str] = field(default_factory=dict)
    concat: str = ""  # "", "partial" or "final"
    parts: list[str] = field(default_factory=list)  # final: the partial upload ids, in order
    segments: dict[int, Part] = field(default_factory=dict)  # offset -> size and xxh3 of each stored PATCH

    @property
    def received(self) -> int:
        """Bytes stored so far: where the recorded segments end."""
        return next_offset(self.segments)

    @property
    def offset(self) -> int:
        """The tus ``Upload-Offset``: the length once finished (its segments were freed when it was published)
        or for a final concatenation, else the bytes received so far."""
        if (self.file_id is not None or self.concat == "final") and self.length is not None:
            return self.length
        return self.received

    def ordered_segments(self) -> list[tuple[int, str, Part]]:
        """The stored segments as (offset, key, part), in offset order."""
        return [(off, _segment_key(self.id, off), self.segments[off]) for off in sorted(self.segments)]

    def to_json(self) -> dict[str, Any]:
        """The upload record as stored."""
        return {
            **self.base_json(),
            "length": self.length,
            "metadata": self.metadata,
            "concat": self.concat,
            "parts": self.parts,
            "segments": parts_to_json(self.segments),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        """The record as stored (one written before states were recorded: its state from its flags; before intents
        were kept whole: its intent from its metadata)."""
        fields = cls.base_fields(doc)
        metadata = dict(doc.get("metadata") or {})
        if "intent" not in doc:
            fields["intent"] = replace(intent_of(metadata, strict=False), lifetime=doc.get("file_ttl"))
        return cls(
            **fields,
            length=doc.get("length"),
            metadata=metadata,
            concat=str(doc.get("concat") or ""),
            parts=list(doc.get("parts") or []),
            segments=parts_from_json(doc.get("segments")),
        )


def _gone(upload: Upload, state: UploadState) -> TransferError:
    return Gone(f"upload {upload.id} was terminated or has expired")


class _Mismatch(Exception):
    """The upload's bytes are not the declared SHA-256: it ends once its completion has let it go."""

    def __init__(self, error: TransferError) -> None:
        super().__init__(error.message)
        self.error = error


class TusService:
    """tus 1.0 (creation, creation-with-upload, creation-defer-length, termination, checksum, concatenation,
    expiration) and the IETF resumable upload draft: the offset-addressed door of the one upload lifecycle."""

    def __init__(
        self,
        storage: Storage,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        lifecycle: UploadLifecycle,
        slots: OpenSlots,
        engine: UploadEngine,
    ) -> None:
        # collaborators come from the composition root (Services.build), shared with every other door
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.lifecycle = lifecycle
        self.terms = lifecycle.terms
        self.engine = engine
        self.kind = lifecycle.register(
            UploadKind(
                name="tus",
                noun="upload",
                prefix="t",
                decode=Upload.from_json,
                encode=Upload.to_json,
                key=_info_key,
                listing=PREFIX,
                listed=_listed,
                slots=slots,
                discard=self._discard,
                retention=float(settings.session_retention),
                gone=_gone,
            )
        )

    async def _change(self, upload: Upload, change: Callable[[Upload], Upload | None]) -> Upload:
        return await self.lifecycle.change(self.kind, upload, change)

    async def load(self, uid: str, caller: Grant, *, allow_ended: bool = False) -> Upload:
        """The upload, if the caller may see it (its own; any for admin); NotFound otherwise, whether or not it
        exists (tus §3.2.4 allows 404 for an unknown upload); Gone once terminated or expired."""
        return await self.lifecycle.load(self.kind, uid, caller, allow_ended=allow_ended)

    async def segments(self, uid: str) -> list[tuple[int, int]]:
        """(offset, size) of the recorded segments, in order."""
        upload = await self.load(uid, TRUSTED, allow_ended=True)
        return [(off, upload.segments[off].size) for off in sorted(upload.segments)]

    async def offset(self, uid: str) -> int:
        """Bytes received so far (a finished upload's segments are gone: see :attr:`Upload.offset`)."""
        return (await self.load(uid, TRUSTED, allow_ended=True)).received

    async def create(
        self,
        *,
        length: int | None,
        metadata: dict[str, str],
        concat: str = "",
        parts: list[str] | None = None,
        caller: Grant,
        body_pending: bool = False,
    ) -> Upload:
        """A new upload owned by the caller's key; a final upload (concatenation) may only name the caller's own
        partial uploads. ``body_pending``: no byte has come yet; if the metadata declares the SHA-256 (and the
        length is known) of content the key already stores, the upload is finished at once, sharing those bytes
        (its offset is its length: nothing is to be sent)."""
        if length is not None and length > self.settings.max_upload_size:
            raise TooLarge(f"Upload-Length exceeds Tus-Max-Size {self.settings.max_upload_size}")
        now = self.clock()
        upload = Upload(
            id=new_upload_id(),
            owner=caller.owner,
            created_at=now,
            expires_at=now + self.settings.session_ttl,
            intent=intent_of(metadata),
            length=length,
            metadata=metadata,
            concat=concat,
            parts=parts or [],
        )
        if concat == "final":
            total = 0
            for pid in upload.parts:
                part = await self.load(pid, caller)
                if part.concat != "partial":
                    raise InvalidRequest(f"{pid} is not a partial upload")
                if part.length is None or part.offset != part.length:
                    raise InvalidRequest(f"partial upload {pid} is not complete")
                total += part.length
            if total > self.settings.max_upload_size:
                raise TooLarge("the concatenated upload exceeds Tus-Max-Size")
            upload = replace(upload, length=total)
            # its bytes are its parts': nothing to reserve, no slot (it is finished at once), charged when published
            upload = await self.lifecycle.open(self.kind, upload, reserving=False, slot=False)
            return await self._finish(upload)
        declared = (metadata.get(DECLARED_SHA256) or "").lower().removeprefix("sha256:")
        known = None
        if body_pending and not concat and length is not None and _is_sha256(declared):
            known = (declared, length)
        return await self.lifecycle.open(self.kind, upload, reserve=length, known=known)

    async def create_from_request(
        self,
        *,
        length: int | None,
        defer_length: str | None,
        metadata: str | None,
        concat: str | None,
        caller: Grant,
        body: AsyncIterator[bytes] | None = None,
        checksum: tuple[str, bytes] | None = None,
        body_pending: bool = False,
    ) -> tuple[Upload, int | None]:
        """tus creation as the headers ask (tus 1.0.0 §creation, §creation-defer-length, §concatenation,
        §creation-with-upload): exactly one of ``Upload-Length`` and ``Upload-Defer-Length: 1`` (neither for a
        final upload, which names its partial uploads' URLs); with ``body``, the creation's own bytes are the
        first PATCH. Returns the upload and, with a body, the offset after it."""
        kind, parts = "", []
        if concat:
            raw_kind, _, urls = concat.partition(";")
            kind = raw_kind.strip()
            if kind == "final":
                parts = [url.rstrip("/").rsplit("/", 1)[-1] for url in urls.split()]
                if not parts:
                    raise InvalidRequest("Upload-Concat: final needs the partial uploads' URLs")
                if length is not None:
                    raise InvalidRequest("a final upload takes no Upload-Length")
            elif kind != "partial":
                raise InvalidRequest("Upload-Concat must be 'partial' or 'final;<urls>'")
        if kind != "final":
            deferred = defer_length is not None
            if deferred and defer_length != "1":
                raise InvalidRequest("Upload-Defer-Length must be 1")
            if (length is None) == (not deferred):
                raise InvalidRequest("send exactly one of Upload-Length and Upload-Defer-Length: 1")
        upload = await self.create(
            length=length,
            metadata=parse_metadata(metadata),
            concat=kind,
            parts=parts,
            caller=caller,
            body_pending=body is None or body_pending,
        )
        if upload.file_id is not None and not kind:
            return upload, upload.offset  # content the key stores: finished without a byte (its offset is its length)
        if body is None or kind == "final":
            return upload, None
        upload, offset = await self.append(upload.id, 0, body, caller, checksum=checksum)
        return upload, offset

    async def current(self, uid: str, caller: Grant, *, allow_ended: bool = False) -> tuple[Upload, int]:
        """The upload and its offset, for HEAD and GET. A segment stored by a PATCH whose process stopped before
        recording it is adopted first; an upload whose bytes have all arrived but that is not published (the
        process stopped between the last PATCH and publishing) is published now, so a client that resumes after
        a restart and finds nothing left to send still gets its file."""
        upload = await self.load(uid, caller, allow_ended=allow_ended)
        if upload.state_at(self.clock()) is UploadState.OPEN and upload.concat != "final":
            upload = await self._adopt(upload)
            if upload.concat == "" and upload.length == upload.received:
                upload = await self._finish(upload)
        return upload, upload.offset

    async def _adopt(self, upload: Upload) -> Upload:
        """Enter in the record the segments stored at its end but not recorded (one stat when there are none)."""
        while upload.length is None or upload.received < upload.length:
            offset = upload.received
            try:
                with storage_errors_translated():
                    info = await self.storage.stat(_segment_key(upload.id, offset))
            except NotFound:
                return upload
            if info.size == 0:
                return upload
            upload = await self._record_segment(upload, offset, Part(info.size, info.metadata.get("xxh3", "")))
        return upload

    async def _record_segment(self, upload: Upload, offset: int, part: Part) -> Upload:
        now = self.clock()

        def change(current: Upload) -> Upload | None:
            if offset in current.segments:
                return None  # recorded already (adopted by a HEAD, or by this very PATCH's retry)
            if current.received != offset:
                raise Conflict(f"upload {current.id} has no byte {offset - 1} yet", offset=current.received)
            return current.after(UploadEvent.PUT_PART, now, segments=with_part(current.segments, offset, part))

        return await self._change(upload, change)

    async def append(
        self,
        uid: str,
        offset: int,
        body: AsyncIterator[bytes],
        caller: Grant,
        *,
        checksum: tuple[str, bytes] | None = None,
        declare_length: int | None = None,
        body_length: int | None = None,
    ) -> tuple[Upload, int]:
        """Apply a PATCH at ``offset``; returns the upload and its new offset (RFC: 409 on a wrong offset).
        ``body_length``: the PATCH's Content-Length, when it has one (what a deferred-length upload reserves)."""
        upload = await self.load(uid, caller)
        if upload.concat == "final":
            raise UploadForbidden("a final upload cannot be patched")
        current = upload.offset
        if declare_length is not None:
            upload = await self._declare_length(upload, declare_length, current)
        if offset != current:
            raise Conflict(f"Upload-Offset {offset} does not match the upload's offset {current}", offset=current)
        upload.after(UploadEvent.PUT_PART, self.clock())  # refused unless parts may be stored now
        # a deferred length is still bounded by Tus-Max-Size (tus 1.0.0 §creation-defer-length) and by the quota
        length = upload.length
        limit = (self.settings.max_upload_size if length is None else length) - current
        room = await self.terms.room_for(upload.owner, uid) if length is None else None
        if room is not None and room - current < limit:
            limit = room - current
            if limit <= 0:
                raise QuotaExceeded(f"this key's quota has no room beyond the {current} bytes received", room=room)
        grown = False
        if room is not None:
            # a deferred length reserves as it grows, before the bytes are stored: this PATCH's length, or (without
            # one) all the room there is, given back afterwards to what was stored
            if body_length is not None:
                if current + body_length > room:
                    raise QuotaExceeded(
                        f"this PATCH's {body_length} bytes go beyond the {room} bytes of this key's quota", room=room
                    )
                limit = min(limit, body_length)
            await self.terms.grow(upload.owner, uid, current + limit, upload.expires_at)
            grown = body_length is None
        # the running SHA-256 follows the bytes of this process's PATCHes when they arrive in order
        hasher = self.engine.hashers.get(uid)
        if hasher is None and current == 0:
            hasher = self.engine.hasher(uid)
        feed = hasher if hasher is not None and hasher.position == current == hasher.next_part else None
        staged = feed.staged() if feed is not None else None  # a PATCH that is not kept leaves the hasher as it was
        check = CHECKSUM_ALGORITHMS[checksum[0]]() if checksum else None

        def too_long(received: int) -> TransferError:
            if room is not None and current + received > room:
                return QuotaExceeded(f"the upload goes beyond the {room} bytes of this key's quota", room=room)
            if length is not None:
                return TooLarge(f"PATCH goes beyond Upload-Length {length}")
            return TooLarge(f"PATCH goes beyond Tus-Max-Size {self.settings.max_upload_size}")

        def verify(_: StoredPart) -> None:
            if check is not None and checksum is not None and check.digest() != checksum[1]:
                raise TusChecksumMismatch("Upload-Checksum does not match the PATCH body")

        try:
            result = await self._store_patch(
                grown,
                upload,
                current,
                _segment_key(uid, current),
                body,
                limit=limit,
                too_long=too_long,
                size_hint=None if length is None else limit,  # not the size limit: backends plan (and S3 parts) by it
                extra=check,
                live=staged,
                verify=verify,
                keep_partial=None if check is not None else ClientDisconnected,  # a cut body cannot be checked
            )
        except PartExists:
            await self._adopt(upload)  # what another PATCH (or a process that stopped) stored there
            raise Conflict("another PATCH at this offset won the race; HEAD for the current offset") from None
        if result.stored:
            if feed is not None and staged is not None:
                feed.advance(staged, result.size, current + result.size)
            upload = await self._record_segment(upload, current, Part(result.size, result.xxh3))
        new_offset = current + (result.size if result.stored else 0)
        if grown:
            await self.terms.reserve(upload.owner, uid, new_offset, upload.expires_at)
        if result.cut is not None:
            raise ClientDisconnected("PATCH was cut short; the bytes received were kept")
        if upload.length is not None and new_offset == upload.length and upload.concat != "partial":
            upload = await self._finish(upload)
        return upload, new_offset

    async def _declare_length(self, upload: Upload, length: int, received: int) -> Upload:
        """tus creation-defer-length: the length, declared once, reserved against the key's quota before a byte of
        it is stored."""
        if upload.length is not None and upload.length != length:
            raise InvalidRequest("Upload-Length cannot change once set")
        if length > self.settings.max_upload_size:
            raise TooLarge(f"Upload-Length exceeds Tus-Max-Size {self.settings.max_upload_size}")
        if length < received:  # it could never be reached: every later PATCH would be refused as too long
            raise InvalidRequest(
                f"Upload-Length {length} is smaller than the {received} bytes already received", offset=received
            )
        if upload.length is not None:
            return upload
        await self.terms.admit(upload.owner, upload.id, length, upload.expires_at)
        now = self.clock()

        def declared(current: Upload) -> Upload | None:
            if current.length == length:
                return None
            if current.length is not None:
                raise InvalidRequest("Upload-Length cannot change once set")
            return current.after(UploadEvent.DECLARE_LENGTH, now, length=length)

        return await self._change(upload, declared)

    async def _store_patch(self, grown: bool, upload: Upload, current: int, *args: Any, **kwargs: Any) -> Any:
        """``engine.store_part``; when the PATCH reserved all the room there was (``grown``) and fails, its
        reservation goes back to the bytes stored before it (a failed PATCH keeps none of its own)."""
        try:
            return await self.engine.store_part(*args, **kwargs)
        except BaseException:
            if grown:
                try:
                    await self.terms.reserve(upload.owner, upload.id, current, upload.expires_at)
                except TransferError as exc:
                    log.warning("upload %s keeps its reservation until it ends: %s", upload.id, exc)
            raise

    async def _finish(self, upload: Upload) -> Upload:
        """Publish a complete upload as a stored file (through the lifecycle: one completion, one file)."""

        async def gather(latest: Upload) -> tuple[Candidate, Any]:
            ordered: list[tuple[int, str, Part]] = []
            if latest.concat == "final":
                start = 0
                for pid in latest.parts:
                    partial = await self.load(pid, TRUSTED, allow_ended=True)
                    for _, key, part in partial.ordered_segments():
                        ordered.append((start, key, part))
                        start += part.size
            else:
                if latest.received != latest.length:
                    raise Conflict(f"upload {latest.id} changed while it was being finished; HEAD and retry")
                ordered = latest.ordered_segments()
            sources = [key for _, key, _ in ordered]
            hasher = await self.engine.catch_up(latest.id, ordered, by_offset=True)
            if hasher.position != latest.length:
                await self._truncate(latest, hasher.next_part)
                raise Conflict(
                    f"upload {latest.id} lost bytes from offset {hasher.next_part}; HEAD and send them again",
                    offset=hasher.next_part,
                )
            sha_hex = hasher.sha.hexdigest()
            declared = latest.metadata.get(DECLARED_SHA256)
            if declared and declared.lower().removeprefix("sha256:") != sha_hex:
                # Repr-Digest at creation (IETF front door) or a tus client's ``sha256`` metadata: nothing is published
                # and the upload ends, its bytes freed (draft-ietf-httpbis-resumable-upload §10.1: consider it failed)
                raise _Mismatch(
                    ChecksumMismatch(
                        f"the upload's SHA-256 {sha_hex} is not the declared {declared}", actual="sha256:" + sha_hex
                    )
                )
            if latest.concat == "final":
                # its bytes are its parts': their reservations give way to this file's charge (else they would
                # count twice against the quota while it is checked)
                for pid in latest.parts:
                    await self.terms.release(latest.owner, pid)
            size = latest.length or 0
            candidate = self.lifecycle.candidate(
                latest, size=size, sha256=sha_hex, head=bytes(hasher.head), source="tus"
            )

            async def place(record: FileRecord) -> None:
                await publish_composed(self.storage, record, sources)

            return candidate, place

        try:
            done, _ = await self.lifecycle.finish(self.kind, upload.id, TRUSTED, gather, loaded=upload)
        except _Mismatch as mismatch:
            await self.lifecycle.abort(self.kind, upload.id, TRUSTED)
            raise mismatch.error from None
        self.engine.forget(upload.id)
        # the file is published and the record says so: its segments are copies now (or were composed into it
        # server-side) and go at once, not at expiry. A crash before this line leaves them to the sweep.
        # Partial uploads stay: tus lets several final uploads reuse them, and they expire like any upload.
        if done.concat != "final":
            await self._free_segments(done)
        return done

    async def _truncate(self, upload: Upload, at: int) -> None:
        """Drop the segments from offset ``at`` on (their bytes are not what was acknowledged, or follow such):
        the client sends them again from there."""
        doomed = [off for off in upload.segments if off >= at]
        if doomed:
            await self._change(upload, lambda u: replace(u, segments={o: p for o, p in u.segments.items() if o < at}))
        await self.engine.delete([_segment_key(upload.id, off) for off in doomed])

    async def terminate(self, uid: str, caller: Grant) -> None:
        """tus termination: the upload ends (ABORT) and its segments go; a PATCH in flight finds it ended."""
        await self.load(uid, caller)  # Gone once ended
        await self.lifecycle.abort(self.kind, uid, caller)

    async def _discard(self, upload: Upload) -> None:
        """What an ended upload holds beside its record: its segments (and this process's running hash)."""
        self.engine.forget(upload.id)
        keys = [key for _, key, _ in upload.ordered_segments()]
        if upload.state is UploadState.COMPLETED or upload.concat == "final":
            return  # freed when it was published; a final upload's segments are its partial uploads'
        await self.engine.delete(keys)

    async def _free_segments(self, upload: Upload) -> None:
        """Delete a published upload's segments; a failure is logged, never reported: the file is safe and the
        sweep removes what is left when the upload expires."""
        try:
            await self.engine.delete([key for _, key, _ in upload.ordered_segments()])
        except TransferError as exc:
            log.warning("segments of the finished upload %s stay until it expires: %s", upload.id, exc)


def _is_sha256(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def http_date(seconds: float) -> str:
    """``seconds`` as an HTTP date (RFC 9110 §5.6.7), e.g. for ``Upload-Expires``."""
    from transfer.core.http.conditional import http_date as fmt

    return fmt(datetime.fromtimestamp(seconds, UTC))
