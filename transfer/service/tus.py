"""tus 1.0.0 uploads (https://tus.io/protocols/resumable-upload): the operations behind the tus front door.

An upload is an info record plus the segments its PATCH requests delivered, all in the storage backend:

    tus/<id>/info.json               length (or deferred), metadata, concat role, expiry, state
    tus/<id>/seg/<offset:016d>       the bytes of one PATCH, created if-absent: two PATCHes at one offset -> 409

The offset is the sum of the segment sizes, so any replica, or a restarted process, knows it. A PATCH cut short
keeps what arrived (tus servers SHOULD), unless it carried an Upload-Checksum. When the offset reaches the length,
the segments become an ordinary stored file (FileRecord; name and type from Upload-Metadata), the upload records
its file id and the segments are deleted (the offset of a finished upload is its length). Partial uploads
(concatenation) are kept as segments until they expire: a final upload concatenates them, and tus lets several.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from storage.base import Storage
from storage.errors import ObjectExists, StorageError
from transfer.core.auth import TRUSTED, Grant
from transfer.core.content import ContentEncoding
from transfer.core.lifecycle import parse_expires_in
from transfer.core.mime import is_media_type, require_media_type
from transfer.core.naming import resolve_content_type, sanitize_filename
from transfer.errors import (
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
    from_storage_error,
    storage_errors_translated,
)
from transfer.service.documents import publish_composed, read_document, write_document
from transfer.service.lifecycle import Lifecycle
from transfer.service.quota import SessionQuota
from transfer.service.records import FileRecord
from transfer.settings import Settings

log = logging.getLogger("transfer.tus")

CHECKSUM_ALGORITHMS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256, "md5": hashlib.md5}


def new_upload_id() -> str:
    return "t_" + secrets.token_hex(16)


def is_upload_id(value: str) -> bool:
    return value.startswith("t_") and len(value) == 34 and all(c in "0123456789abcdef" for c in value[2:])


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


def _declared_type(metadata: dict[str, str]) -> str | None:
    """The media type an upload's metadata declares (``filetype``, as tus-js-client sends it), if any."""
    return metadata.get("filetype") or metadata.get("content_type") or None


def encode_metadata(metadata: dict[str, str]) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" if v else k for k, v in metadata.items())


@dataclass(frozen=True, slots=True)
class Upload:
    id: str
    length: int | None  # None: deferred
    metadata: dict[str, str]
    created_at: float
    expires_at: float
    concat: str = ""  # "", "partial" or "final"
    parts: list[str] = field(default_factory=list)  # final: the partial upload ids, in order
    terminated: bool = False
    file_id: str | None = None
    owner: str | None = None  # the API key that created it (open-session quota)
    file_ttl: int | None = None  # seconds the finished file lives (Upload-Metadata expires_in, or the defaults)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Hasher:
    offset: int = 0
    sha: Any = field(default_factory=hashlib.sha256)


def _info_key(uid: str) -> str:
    return f"tus/{uid}/info.json"


def _segment_key(uid: str, offset: int) -> str:
    return f"tus/{uid}/seg/{offset:016d}"


class TusService:
    def __init__(
        self,
        storage: Storage,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        quota: SessionQuota | None = None,
        lifecycle: Lifecycle | None = None,
    ) -> None:
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.lifecycle = lifecycle or Lifecycle(storage, settings, clock=clock)
        self.quota = quota or SessionQuota(storage, settings.max_open_sessions_per_key)
        self.quota.register(is_upload_id, self.is_open)
        self._hashers: dict[str, _Hasher] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def _save(self, upload: Upload, *, new: bool = False) -> None:
        await write_document(self.storage, _info_key(upload.id), upload.to_json(), if_absent=new)

    async def load(self, uid: str, caller: Grant, *, allow_ended: bool = False) -> Upload:
        """The upload, if the caller may see it (its own; any for admin); NotFound otherwise, whether or not it
        exists (tus §3.2.4 allows 404 for an unknown upload)."""
        if not is_upload_id(uid):
            raise NotFound(f"no upload {uid!r}")
        try:
            doc = await read_document(self.storage, _info_key(uid))
        except NotFound:
            raise NotFound(f"no upload {uid!r}") from None
        upload = Upload(**doc)
        if not caller.sees(upload.owner):
            raise NotFound(f"no upload {uid!r}")
        if not allow_ended and (upload.terminated or self.clock() >= upload.expires_at):
            raise Gone(f"upload {uid} was terminated or has expired")
        return upload

    async def segments(self, uid: str) -> list[tuple[int, int]]:
        """(offset, size) of the stored segments, in order."""
        prefix = f"tus/{uid}/seg/"
        out = []
        with storage_errors_translated():
            async for info in self.storage.list(prefix):
                out.append((int(info.key[len(prefix) :]), info.size))
        return sorted(out)

    async def offset(self, uid: str) -> int:
        """Bytes received so far: the sum of the stored segments (a finished upload's segments are gone: ask
        :meth:`offset_of`)."""
        return sum(size for _, size in await self.segments(uid))

    async def offset_of(self, upload: Upload) -> int:
        """The tus ``Upload-Offset`` of ``upload``: its length once finished (its segments were freed when it was
        published) or when it is a final concatenation, else the bytes received so far."""
        if (upload.file_id is not None or upload.concat == "final") and upload.length is not None:
            return upload.length
        return await self.offset(upload.id)

    async def create(
        self,
        *,
        length: int | None,
        metadata: dict[str, str],
        concat: str = "",
        parts: list[str] | None = None,
        caller: Grant,
    ) -> Upload:
        """A new upload owned by the caller's key; a final upload (concatenation) may only name the caller's own
        partial uploads."""
        owner = caller.owner
        if length is not None and length > self.settings.max_upload_size:
            raise TooLarge(f"Upload-Length exceeds Tus-Max-Size {self.settings.max_upload_size}")
        content_type = _declared_type(metadata)
        if content_type is not None:  # refused now, not when the finished upload is published
            require_media_type(content_type, "Upload-Metadata filetype")
        # Upload-Metadata expires_in: the finished file's lifetime, refused now if too long
        file_ttl = self.lifecycle.lifetime(
            owner, parse_expires_in(metadata.get("expires_in"), "Upload-Metadata expires_in")
        )
        now = self.clock()
        upload = Upload(
            id=new_upload_id(),
            length=length,
            metadata=metadata,
            created_at=now,
            expires_at=now + self.settings.session_ttl,
            concat=concat,
            parts=parts or [],
            owner=owner,
            file_ttl=file_ttl,
        )
        if concat == "final":
            total = 0
            for pid in upload.parts:
                part = await self.load(pid, caller)
                if part.concat != "partial":
                    raise InvalidRequest(f"{pid} is not a partial upload")
                if part.length is None or await self.offset_of(part) != part.length:
                    raise InvalidRequest(f"partial upload {pid} is not complete")
                total += part.length
            if total > self.settings.max_upload_size:
                raise TooLarge("the concatenated upload exceeds Tus-Max-Size")
            upload = replace(upload, length=total)
        if concat != "final":  # a final upload's bytes are its parts': charged when it is published
            await self.lifecycle.admit(owner, upload.id, length, upload.expires_at)
        # a final upload is finished at once: nothing stays open, nothing counts against the key
        try:
            async with self.quota.claim(owner if concat != "final" else None, upload.id):
                await self._save(upload, new=True)
        except BaseException:
            await self.lifecycle.release_after_failure(owner, upload.id)
            raise
        if concat == "final":
            upload = await self._finish(upload)
        return upload

    async def current(self, uid: str, caller: Grant, *, allow_ended: bool = False) -> tuple[Upload, int]:
        """The upload and its offset, for HEAD and GET. An upload whose bytes have all arrived but that is not
        published (the process stopped between the last PATCH and publishing) is published now, so a client that
        resumes after a restart and finds nothing left to send still gets its file."""
        upload = await self.load(uid, caller, allow_ended=allow_ended)
        offset = await self.offset_of(upload)
        if upload.file_id is None and upload.concat == "" and upload.length == offset and not upload.terminated:
            upload = await self._finish(upload)
        return upload, offset

    async def is_open(self, uid: str) -> bool:
        try:
            upload = await self.load(uid, TRUSTED)
        except (NotFound, Gone):
            return False
        return upload.file_id is None

    async def append(
        self,
        uid: str,
        offset: int,
        body: AsyncIterator[bytes],
        caller: Grant,
        *,
        checksum: tuple[str, bytes] | None = None,
        declare_length: int | None = None,
    ) -> tuple[Upload, int]:
        """Apply a PATCH at ``offset``; returns the upload and its new offset (RFC: 409 on a wrong offset)."""
        upload = await self.load(uid, caller)
        if upload.concat == "final":
            raise UploadForbidden("a final upload cannot be patched")
        current = await self.offset_of(upload)
        if declare_length is not None:
            if upload.length is not None and upload.length != declare_length:
                raise InvalidRequest("Upload-Length cannot change once set")
            if declare_length > self.settings.max_upload_size:
                raise TooLarge(f"Upload-Length exceeds Tus-Max-Size {self.settings.max_upload_size}")
            if declare_length < current:  # it could never be reached: every later PATCH would be refused as too long
                raise InvalidRequest(
                    f"Upload-Length {declare_length} is smaller than the {current} bytes already received",
                    offset=current,
                )
            if upload.length is None:
                await self.lifecycle.admit(upload.owner, uid, declare_length, upload.expires_at)
                upload = replace(upload, length=declare_length)
                await self._save(upload)
        if offset != current:
            raise Conflict(f"Upload-Offset {offset} does not match the upload's offset {current}", offset=current)
        # a deferred length is still bounded by Tus-Max-Size (tus 1.0.0 §creation-defer-length) and by the quota
        limit = (self.settings.max_upload_size if upload.length is None else upload.length) - current
        room = await self.lifecycle.room_for(upload.owner, uid) if upload.length is None else None
        if room is not None and room - current < limit:
            limit = room - current
            if limit <= 0:
                raise QuotaExceeded(f"this key's quota has no room beyond the {current} bytes received", room=room)
        # the running SHA-256 follows the bytes of this process's PATCHes when they arrive in order
        hasher = self._hashers.get(uid)
        if hasher is None and current == 0:
            hasher = self._hashers.setdefault(uid, _Hasher())
        feed = hasher if hasher is not None and hasher.offset == current else None
        check = CHECKSUM_ALGORITHMS[checksum[0]]() if checksum else None
        received = 0
        kept = False
        cut = False
        try:
            hint = None if upload.length is None else limit  # not the size limit: backends plan (and S3 parts) by it
            async with self.storage.create(_segment_key(uid, current), size_hint=hint, if_absent=True) as writer:
                try:
                    async for piece in body:
                        received += len(piece)
                        if received > limit:
                            if room is not None and current + received > room:
                                raise QuotaExceeded(f"the upload goes beyond the {room} bytes of this key's quota")
                            raise TooLarge(
                                f"PATCH goes beyond Upload-Length {upload.length}"
                                if upload.length is not None
                                else f"PATCH goes beyond Tus-Max-Size {self.settings.max_upload_size}"
                            )
                        if check is not None:
                            check.update(piece)
                        if feed is not None:
                            feed.sha.update(piece)
                        await writer.write(piece)
                except ClientDisconnected:
                    if check is not None:
                        raise  # a cut body cannot be checked: nothing is kept
                    cut = True  # keep what arrived
                if check is not None:
                    assert checksum is not None
                    if check.digest() != checksum[1]:
                        raise TusChecksumMismatch("Upload-Checksum does not match the PATCH body")
                if received:
                    await writer.commit({})
                    kept = True
        except ObjectExists:
            raise Conflict("another PATCH at this offset won the race; HEAD for the current offset") from None
        except StorageError as exc:
            raise from_storage_error(exc) from exc
        finally:
            if feed is not None:
                if kept:
                    feed.offset += received
                elif received:
                    self._hashers.pop(uid, None)  # it saw bytes that were not kept: rebuild at the end
        new_offset = current + (received if kept else 0)
        if cut:
            raise ClientDisconnected("PATCH was cut short; the bytes received were kept")
        if upload.length is not None and new_offset == upload.length and upload.concat != "partial":
            upload = await self._finish(upload)
        return upload, new_offset

    async def _finish(self, upload: Upload) -> Upload:
        """Publish a complete upload as a stored file."""
        async with self._locks.setdefault(upload.id, asyncio.Lock()):
            latest = await self.load(upload.id, TRUSTED, allow_ended=True)
            if latest.file_id is not None:  # finished meanwhile (a HEAD and the last PATCH, or another replica)
                return latest
            sources = []
            if upload.concat == "final":
                for pid in upload.parts:
                    sources += [_segment_key(pid, off) for off, _ in await self.segments(pid)]
            else:
                segments = await self.segments(upload.id)
                if sum(size for _, size in segments) != upload.length:
                    raise Conflict(f"upload {upload.id} changed while it was being finished; HEAD and retry")
                sources = [_segment_key(upload.id, off) for off, _ in segments]
            hasher = self._hashers.pop(upload.id, None)
            if hasher is not None and hasher.offset == upload.length:
                sha_hex, head = hasher.sha.hexdigest(), b""
            else:
                sha_hex, head = await self._hash_sources(sources)
            if not head:
                _, head = await self._hash_sources(sources[:1], limit=4096)
            name = upload.metadata.get("filename") or upload.metadata.get("name")
            # ``filetype`` is the browser's guess from the extension (Uppy sends application/octet-stream when it has
            # none): a hint, like a Content-Type header; ``content_type`` is the client's word. Either one from an
            # upload created before create() checked it is dropped: sniff instead
            declared, hinted = upload.metadata.get("content_type"), upload.metadata.get("filetype")
            declared = declared if declared and is_media_type(declared) else None
            hinted = hinted if hinted and is_media_type(hinted) else None
            content_type = await asyncio.to_thread(resolve_content_type, head, name, declared=declared, hinted=hinted)
            file_id = "f_" + upload.id[2:]
            record = FileRecord(
                id=file_id,
                name=sanitize_filename(name, default=file_id),
                content_type=content_type,
                size=upload.length or 0,
                sha256=sha_hex,
                encoding=ContentEncoding.NONE,
                encoded_size=upload.length or 0,
                encoded_sha256=sha_hex,
                created_at=(created := datetime.fromtimestamp(self.clock(), UTC).replace(microsecond=0)),
                owner=upload.owner,
                expires_at=self.lifecycle.expiry(created, upload.file_ttl),
            )
            async with self.lifecycle.publishing(record, upload.id):
                await publish_composed(self.storage, record, sources)
            done = replace(upload, file_id=file_id)
            await self._save(done)
            await self.quota.release(upload.owner, upload.id)
            # the file is published and the record says so: its segments are copies now (or were composed into it
            # server-side) and go at once, not at expiry. A crash before this line leaves them to the sweep.
            # Partial uploads stay: tus lets several final uploads reuse them, and they expire like any upload.
            if upload.concat != "final":
                await self._free_segments(upload.id)
            else:  # its parts' reservations are covered by this file's charge now
                for pid in upload.parts:
                    await self.lifecycle.release(upload.owner, pid)
            return done

    async def _hash_sources(self, sources: list[str], limit: int | None = None) -> tuple[str, bytes]:
        sha = hashlib.sha256()
        head = bytearray()
        with storage_errors_translated():
            for source in sources:
                async with await self.storage.open(source) as reader:
                    async for piece in reader.read(0, limit):
                        await asyncio.to_thread(sha.update, piece)
                        if len(head) < 4096:
                            head += piece[: 4096 - len(head)]
        return sha.hexdigest(), bytes(head)

    async def terminate(self, uid: str, caller: Grant) -> None:
        upload = await self.load(uid, caller)
        await self._delete_segments(uid)
        await self._save(replace(upload, terminated=True))
        await self.quota.release(upload.owner, uid)
        await self.lifecycle.release(upload.owner, uid)
        self._hashers.pop(uid, None)

    async def _free_segments(self, uid: str) -> None:
        """Delete a published upload's segments; a failure is logged, never reported: the file is safe and the
        sweep removes what is left when the upload expires."""
        try:
            await self._delete_segments(uid)
        except TransferError as exc:
            log.warning("segments of the finished upload %s stay until it expires: %s", uid, exc)

    async def _delete_segments(self, uid: str) -> None:
        for off, _ in await self.segments(uid):
            with storage_errors_translated():
                await self.storage.delete(_segment_key(uid, off))

    async def collect_garbage(self) -> int:
        """Delete expired or terminated uploads' segments and records (their stored files stay)."""
        now = self.clock()
        removed = 0
        uids = set()
        with storage_errors_translated():
            async for info in self.storage.list("tus/"):
                uids.add(info.key.split("/")[1])
        for uid in uids:
            try:
                upload = await self.load(uid, TRUSTED, allow_ended=True)
            except NotFound:
                await self._delete_segments(uid)
                continue
            if upload.terminated or now >= upload.expires_at:
                await self._delete_segments(uid)
                if now >= upload.expires_at + self.settings.session_retention:
                    with storage_errors_translated():
                        await self.storage.delete(_info_key(uid))
                removed += 1
        return removed


def http_date(seconds: float) -> str:
    from transfer.core.conditional import http_date as fmt

    return fmt(datetime.fromtimestamp(seconds, UTC))
