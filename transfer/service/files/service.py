"""The service layer for stored files: every operation lives here once, whatever the front door.

upload -> :meth:`FileService.upload`, descriptor -> :meth:`FileService.describe`, download ->
:meth:`FileService.open_download` (signature check + RFC 9110 plan + an open reader), delete, list.
Storage errors are translated here with the one table of ``transfer.errors``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pybase64

from storage.base import Capability, ObjectReader, SupportsAbandonedUploads, SupportsPresign, capable
from storage.errors import StorageError
from storage.rules import rules_of
from transfer import metrics
from transfer.core.auth import TRUSTED, Grant
from transfer.core.http.delivery import DeliveryPlan, DeliveryPolicy, Representation, plan_delivery
from transfer.core.http.signing import UrlSigner, require_signed_path
from transfer.core.model.content import (
    ContentEncoding,
    DownloadMethod,
    FileContent,
    TransferMode,
    format_timestamp,
    url_descriptor_json,
)
from transfer.core.model.encodings import DecodeLimits, encoder_levels, http_coding, make_decoder
from transfer.core.model.mime import is_active_type, is_compressible, is_media_type
from transfer.core.model.naming import content_disposition
from transfer.core.uploads.lifetimes import expiry_bucket, expiry_key, is_expired
from transfer.errors import (
    FileExpired,
    InvalidCursor,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    QuotaExceeded,
    SignatureInvalid,
    StorageUnavailable,
    TransferError,
    UrlExpired,
    storage_errors_translated,
)
from transfer.service.backends import load_signing_keys
from transfer.service.files.ingest import UploadRequest, ingest, request_candidate
from transfer.service.files.publisher import Publisher
from transfer.service.files.records import FileRecord, is_file_id, new_file_id, object_key, owner_files_prefix
from transfer.settings import MAX_URL_TTL, Settings

log = logging.getLogger("transfer.files")

CONTENT_PATH = "/v1/files/{file_id}/content"
LIST_DEFAULT = 100
LIST_MAX = 1000
_CURSOR_TAG = "f1:"  # inside the opaque cursor: which listing it belongs to, and its version
ORPHAN_GRACE = 2 * 3600  # seconds after its hour before an expiry index entry without a file is dropped


FRESH_ORIGINALS = 1024  # small files' bytes kept for the descriptor of their upload (4 KiB each at most)


def content_path(file_id: str) -> str:
    """The service path of file ``file_id``'s bytes (what download URLs sign)."""
    return CONTENT_PATH.format(file_id=file_id)


@dataclass(slots=True)
class Download:
    """A planned response and, when it has a body, the open reader to stream it from (close it when done)."""

    plan: DeliveryPlan
    reader: ObjectReader | None
    record: FileRecord

    async def close(self) -> None:
        """Release the download's reader (idempotent)."""
        if self.reader is not None:
            await self.reader.close()
            self.reader = None


@dataclass(frozen=True, slots=True)
class FilePage:
    """One page of a listing: the records in file-id order and the cursor of the next page (None: the end)."""

    records: list[FileRecord]
    next_cursor: str | None


def encode_cursor(file_id: str) -> str:
    """The opaque cursor that resumes a listing after ``file_id``."""
    return pybase64.urlsafe_b64encode((_CURSOR_TAG + file_id).encode("ascii")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The file id a cursor resumes after; InvalidCursor for anything :func:`encode_cursor` did not make."""
    try:
        if len(cursor) > 64:
            raise ValueError
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = pybase64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raw = ""
    file_id = raw.removeprefix(_CURSOR_TAG)
    if not raw.startswith(_CURSOR_TAG) or not is_file_id(file_id):
        raise InvalidCursor("cursor is not one this listing handed out; start again without it", field="cursor")
    return file_id


class FileService:
    """Stored files: upload, describe, download, delete, list."""

    def __init__(
        self,
        settings: Settings,
        publisher: Publisher,
        signer: UrlSigner | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = publisher.storage
        self.settings = settings
        self._signer = signer
        self.clock = clock
        self.publisher = publisher
        self.lifecycle = publisher.lifecycle
        self._fresh: dict[str, bytes] = {}  # original bytes of small files just stored (insertion order)

    async def start(self) -> None:
        """Check the backend and load the signing keys (kept in the backend unless configured)."""
        with storage_errors_translated():
            await self.storage.start()
            if self._signer is None:
                keys, active = await load_signing_keys(self.settings, self.storage)
                self._signer = UrlSigner(keys, active)

    async def close(self) -> None:
        """Close the storage backend."""
        await self.storage.close()

    async def sweep_abandoned_uploads(self) -> int:
        """Abort the backend's unfinished uploads older than its ``abandoned_upload_age`` (their writers died: a
        SIGKILL leaves S3 multipart uploads that cost storage forever); how many. Nothing to do on a backend that
        does not declare Capability.ABANDONED_UPLOADS."""
        backend = capable(self.storage, Capability.ABANDONED_UPLOADS, SupportsAbandonedUploads)
        age = rules_of(self.storage).abandoned_upload_age
        if backend is None or age is None:
            return 0
        with storage_errors_translated():
            return await backend.abort_abandoned_uploads(age)

    @property
    def signer(self) -> UrlSigner:
        """The URL signer (StorageUnavailable before :meth:`start`)."""
        if self._signer is None:
            raise StorageUnavailable("service not started")
        return self._signer

    async def upload(
        self,
        body: AsyncIterator[bytes],
        request: UploadRequest,
        *,
        source: str = "upload",
        with_body: Callable[[UploadRequest], UploadRequest] | None = None,
        body_pending: bool = False,
        file_id: str | None = None,
        screened: bool = False,
    ) -> FileRecord:
        """Store a streamed body; published only once every declared digest and size has been verified (through
        the one publisher: its fields checked there, whichever door it came by). ``request`` is only read;
        ``with_body``: how the fields that come with the body (a multipart form's) complete it, once it ended.
        ``body_pending``: no byte of the body has been asked for yet (``Expect: 100-continue``): if the request
        declares ``checksum`` and ``size`` of content its key already stores, the file is published sharing those
        bytes and the body is never read. ``file_id``: the id the file gets (an upload authorisation's, derived from
        its id; a fresh one otherwise). ``screened``: the deployment's pre-upload hook allowed this upload already
        (an upload authorisation's, when it was opened); otherwise it is asked here, before a byte is read (with
        ``with_body``: once the body's fields have come, before anything is published)."""
        s = self.settings
        lifecycle = self.lifecycle
        # the intent checked and its lifetime granted before a byte is read
        self.publisher.check_intent(request.intent)
        lifetime = await lifecycle.lifetime(request.owner, request.intent.lifetime)
        request = replace(request, intent=replace(request.intent, lifetime=lifetime))
        file_id = file_id or new_file_id()
        events = self.publisher.events

        async def screen(request: UploadRequest, size: int | None) -> UploadRequest:
            """The deployment's pre-upload hook: it may refuse, or set lifetime and metadata."""
            intent = await events.screen(
                upload_id=file_id,
                owner=request.owner,
                door=source,
                intent=request.intent,
                size=size,
                checksum=request.checksum,
            )
            return replace(request, intent=intent)

        if not screened and with_body is None:  # before a byte is read
            declared_size = request.expected_size
            if declared_size is None and request.body_encoding is ContentEncoding.NONE:
                declared_size = request.declared_length
            request = await screen(request, declared_size)
        if body_pending and with_body is None and request.checksum and request.expected_size is not None:
            known = await self.publisher.publish_known(
                request_candidate(
                    request,
                    file_id,
                    size=request.expected_size,
                    sha256=request.checksum.removeprefix("sha256:"),
                    head=b"",
                    source=source + " (shared)",
                )
            )
            if known is not None:
                return known
        # the original size, if known before reading: declared, or the body's length when it comes uncoded
        declared = request.expected_size
        if declared is None and request.body_encoding is ContentEncoding.NONE:
            declared = request.declared_length
        try:
            room = await lifecycle.admit(request.owner, file_id, declared, self.clock() + s.quota_reservation_ttl)
        except QuotaExceeded as exc:
            await events.quota_exceeded(exc, subject=file_id, owner=request.owner, door=source)
            raise
        try:
            with storage_errors_translated():
                record, original = await ingest(
                    self.storage,
                    body,
                    request,
                    file_id=file_id,
                    max_size=s.max_upload_size,
                    max_decode_ratio=s.max_decode_ratio,
                    buffer_size=s.buffer_size,
                    levels=encoder_levels(s),
                    publisher=self.publisher,
                    room=room,
                    source=source,
                    with_body=with_body,
                    # a form's fields (its file name) come with its body: the hook is asked once they have come,
                    # before anything is published
                    screen=screen if not screened and with_body is not None else None,
                )
        except BaseException as exc:
            if room is not None and declared is not None:
                await lifecycle.release_after_failure(request.owner, file_id)
            if isinstance(exc, QuotaExceeded):  # a body past the room the quota left (its length was not declared)
                await events.quota_exceeded(exc, subject=file_id, owner=request.owner, door=source)
            raise
        if original is not None:
            self._remember_original(record.id, original)
        return record

    def _remember_original(self, file_id: str, original: bytes) -> None:
        """Keep the original bytes of a file just stored whole in memory (at most ``SNIFF_BYTES`` each, the last
        ``FRESH_ORIGINALS`` files), for its inline descriptor: the upload answers with one, and reading back what
        was just written cost a file open and a read per small upload. Files never change under their id."""
        self._fresh[file_id] = original
        while len(self._fresh) > FRESH_ORIGINALS:
            del self._fresh[next(iter(self._fresh))]

    async def record(self, file_id: str, caller: Grant) -> FileRecord:
        """The record of a file the caller may see (its own; any for admin); NotFound otherwise, whether or not
        the file exists; FileExpired (410) from its expiry on, on the service clock, whether or not the sweep has
        removed it yet."""
        record = await self._stored_record(file_id, caller)
        self._require_live(record)
        return record

    def _require_live(self, record: FileRecord) -> None:
        if is_expired(record.expires_at, self.clock()):
            assert record.expires_at is not None
            raise FileExpired(
                f"file {record.id} expired at {format_timestamp(record.expires_at)}",
                expired_at=format_timestamp(record.expires_at),
            )

    async def _stored_record(self, file_id: str, caller: Grant) -> FileRecord:
        """The record of a file the caller may see, expired or not (NotFound otherwise)."""
        if not is_file_id(file_id):
            raise NotFound(f"no file {file_id!r}")
        try:
            with storage_errors_translated():
                info = await self.storage.stat(object_key(file_id))
        except NotFound:
            raise NotFound(f"no file {file_id!r}") from None
        record = FileRecord.from_metadata(info.metadata)
        if not caller.sees(record.owner):
            raise NotFound(f"no file {file_id!r}")
        return record

    async def delete(self, file_id: str, caller: Grant) -> None:
        """Delete a file (expired or not); its signed URLs stop working at once; its bytes leave its key's usage.
        Deleting a missing file is NotFound, and so is every delete of a file but the one that removed it when
        several race (on one process or across replicas)."""
        if not await self.publisher.unpublish(await self._stored_record(file_id, caller)):
            raise NotFound(f"no file {file_id!r}")

    async def sweep_shared_content(self) -> int:
        """Reconcile the records of shared bytes with the files that exist (see :meth:`SharedContent.sweep`)."""
        return await self.publisher.shared.sweep()

    async def sweep_expired_files(self) -> int:
        """Delete every file whose expiry has passed (service clock); returns how many. Reads the expiry index
        only up to the current hour, so its cost follows the number of files due, not the number stored. Index
        entries whose file is gone, or no longer expires then, are dropped."""
        removed = 0
        now = self.clock()
        # an entry is written just before its file is published: one without a file may be a publication in
        # flight, and is dropped only once its hour is well past (its file was deleted, or never published)
        orphan_before = expiry_bucket(now - ORPHAN_GRACE)
        async for key, bucket, file_id in self.lifecycle.due():
            try:
                record = await self._stored_record(file_id, TRUSTED)
            except NotFound:
                if bucket < orphan_before:
                    await self.lifecycle.drop_index_entry(key)
                continue
            except StorageUnavailable:
                log.warning("expiry sweep skips %s: its record cannot be read", file_id)
                continue
            if record.expires_at is None or expiry_key(record.expires_at, record.id) != key:
                await self.lifecycle.drop_index_entry(key)  # not this entry's file any more
                continue
            if not is_expired(record.expires_at, now):
                continue  # later in the current hour
            if await self.publisher.unpublish(record, expired=True):
                removed += 1  # by this sweep: another replica's sweep (or a delete) may have taken it first
        return removed

    async def list(self, caller: Grant, limit: int = LIST_DEFAULT, cursor: str | None = None) -> FilePage:
        """A page of at most ``limit`` (1..1000) stored files the caller may see, in file-id order, after the file
        ``cursor`` names (an opaque value from a previous page's ``next_cursor``). A key reads its own file index
        (``owners/<key hash>/files/``); admin and open mode read ``files/``; either way one page costs one listing
        of ``limit + 1`` keys plus the page's records, whatever else is stored. Files deleted while paging are
        skipped, files stored meanwhile appear if their id sorts after the cursor. An object whose record cannot be
        read or would not make a valid descriptor (written by an older version, or by hand) is skipped with a log
        line: one bad record must not take the listing down for everyone."""
        if not 1 <= limit <= LIST_MAX:
            raise InvalidRequest(f"limit must be 1 to {LIST_MAX}", field="limit")
        after = None if cursor is None else decode_cursor(cursor)
        if caller.is_admin:
            prefix = "files/"
        else:
            assert caller.owner is not None  # a caller that is not admin has a key
            prefix = owner_files_prefix(caller.owner)
        with storage_errors_translated():
            infos = [
                info
                async for info in self.storage.list(
                    prefix,
                    start_after=None if after is None else prefix + after,
                    limit=limit + 1,  # one more than the page: tells whether another page follows
                    metadata=caller.is_admin,
                )
            ]
        more = len(infos) > limit
        infos = infos[:limit]
        ids = [info.key[len(prefix) :] for info in infos]
        if caller.is_admin:
            found: list[FileRecord | None] = [self._listed(info.key, info.metadata) for info in infos]
        else:  # the index holds ids only: read each record (at once: on S3 each is a request)
            found = list(await asyncio.gather(*(self._indexed(file_id, caller) for file_id in ids)))
        records = [r for r in found if r is not None]
        return FilePage(records, encode_cursor(ids[-1]) if more and ids else None)

    async def _indexed(self, file_id: str, caller: Grant) -> FileRecord | None:
        if not is_file_id(file_id):
            return None
        try:
            record = await self.record(file_id, caller)
        except (NotFound, FileExpired):
            return None  # deleted since it was indexed, or expired (the sweep removes it and its entry)
        except StorageUnavailable:
            log.warning("listing skips %s: it has no readable file record", file_id)
            return None
        return self._listed(object_key(file_id), None, record)

    def _listed(
        self, key: str, metadata: Mapping[str, str] | None, record: FileRecord | None = None
    ) -> FileRecord | None:
        if record is None:
            if not is_file_id(key.removeprefix("files/")):
                return None
            try:
                record = FileRecord.from_metadata(metadata or {})
            except StorageUnavailable:
                log.warning("listing skips %s: it has no readable file record", key)
                return None
        if is_expired(record.expires_at, self.clock()):
            return None  # gone for its readers from its expiry on, whether or not the sweep has removed it yet
        if not is_media_type(record.content_type):
            log.warning("listing skips %s: its stored media type is not valid", key)
            return None
        return record

    def signed_url(self, base_url: str, file_id: str, method: str, ttl: int) -> tuple[str, datetime]:
        """An expiring signed URL of ``method`` on file ``file_id``, and when it expires."""
        return self.signed_url_for_path(base_url, content_path(file_id), method, ttl)

    def signed_url_for_path(self, base_url: str, path: str, method: str, ttl: int) -> tuple[str, datetime]:
        """``base_url + path`` signed for ``method`` until now + ``ttl``; returns the URL and its expiry."""
        expires = int(self.clock()) + ttl
        query = self.signer.sign(method, path, expires)
        return f"{base_url}{path}?{query.encode()}", datetime.fromtimestamp(expires, UTC)

    async def describe(
        self,
        record: FileRecord,
        base_url: str,
        *,
        download_method: DownloadMethod | None = None,
        ttl: int | None = None,
        inline: bool | None = None,
    ) -> FileContent:
        """The Synapse descriptor of a stored file: inline (base64) when at most the inline threshold (or when
        ``inline`` says so), otherwise url mode with a fresh signed URL."""
        fields = await self._descriptor_fields(record, base_url, download_method, ttl, inline)
        return FileContent(**fields)

    async def describe_json(
        self,
        record: FileRecord,
        base_url: str,
        *,
        download_method: DownloadMethod | None = None,
        ttl: int | None = None,
        inline: bool | None = None,
    ) -> dict[str, Any]:
        """``describe(…).to_json()``: the descriptor's JSON, a url-mode one rendered without building the model
        (:func:`url_descriptor_json`; a listing renders a page of them)."""
        fields = await self._descriptor_fields(record, base_url, download_method, ttl, inline)
        if fields["type"] is TransferMode.URL:
            del fields["type"], fields["range_supported"]
            return url_descriptor_json(**fields)
        return FileContent(**fields).to_json()

    async def _descriptor_fields(
        self,
        record: FileRecord,
        base_url: str,
        download_method: DownloadMethod | None,
        ttl: int | None,
        inline: bool | None,
    ) -> dict[str, Any]:
        """The fields of :meth:`describe`'s descriptor (every key the url-mode renderer takes, in url mode)."""
        s = self.settings
        ttl = min(ttl or s.url_ttl, MAX_URL_TTL)
        metadata = {**(record.metadata or {}), "file_id": record.id}  # the hook's, then the service's own
        if record.expires_at is not None:
            # the seed's FileContent has no field for the file's own expiry: it travels in the metadata the seed
            # leaves for extensions, and no URL claims to work past it
            metadata["expires_at"] = format_timestamp(record.expires_at)
            ttl = max(1, min(ttl, int(record.expires_at.timestamp()) - int(self.clock())))
        common: dict[str, Any] = dict(
            content_type=record.content_type,
            size=record.size,
            checksum="sha256:" + record.sha256,
            name=record.name,
            role=record.role,
            description=record.description,
            metadata=metadata,
        )
        want_inline = record.size <= s.inline_threshold if inline is None else inline
        if want_inline and record.size <= s.inline_threshold:
            data = self._fresh.pop(record.id, None)
            if data is None or len(data) != record.size:
                data = await self._read_original(record)
            return dict(
                type=TransferMode.INLINE,
                encoding=ContentEncoding.BASE64,
                data=pybase64.b64encode(data).decode("ascii"),
                **common,
            )
        method = download_method or s.default_download_method
        presigner = capable(self.storage, Capability.PRESIGN, SupportsPresign)
        if method is DownloadMethod.SIGNED_URL and presigner is not None:
            url, expires_at = await self._presigned_url(presigner, record, ttl)
        else:  # GET, POST, or signed_url on a backend that cannot presign: our own signed URL
            http_method = "POST" if method is DownloadMethod.POST else "GET"
            url, expires_at = self.signed_url(base_url, record.id, http_method, ttl)
        return dict(
            type=TransferMode.URL,
            encoding=record.encoding,
            encoded_size=record.encoded_size if record.encoding is not ContentEncoding.NONE else None,
            url=url,
            url_expires_at=expires_at,
            download_method=method,
            range_supported=True,
            **common,
        )

    async def _presigned_url(self, storage: SupportsPresign, record: FileRecord, ttl: int) -> tuple[str, datetime]:
        """A URL the backend serves itself (S3 presigned GET), with our content headers forced onto its response."""
        active = is_active_type(record.content_type) and not self.settings.serve_active_types_inline
        disposition = "attachment" if active else "inline"
        with storage_errors_translated():
            url = await storage.presign_get(
                await self.publisher.shared.location(record),
                expires_in=ttl,
                content_type=record.content_type,
                content_encoding=http_coding(record.encoding),
                content_disposition=content_disposition(disposition, record.name),
            )
        expires = rules_of(self.storage).presigned_expires_in(url, ttl)
        return url, datetime.fromtimestamp(int(self.clock()) + expires, UTC)

    async def _read_original(self, record: FileRecord) -> bytes:
        """The original bytes of a small file (inline descriptors only): no more than the record's
        ``encoded_size`` stored bytes are read and no more than its ``size`` decoded, in a worker thread."""
        raw = bytearray()
        with storage_errors_translated():
            async with await self.publisher.shared.open(record) as reader:
                async for chunk in reader.read(0, min(record.encoded_size, reader.info.size)):
                    raw += chunk
        if record.encoding is ContentEncoding.NONE:
            return bytes(raw)

        def decode() -> bytes:
            decoder = make_decoder(record.encoding, DecodeLimits(max(record.size, 1)))
            return b"".join([*decoder.feed(memoryview(raw)), *decoder.finish()])

        return await asyncio.to_thread(decode)

    async def open_download(
        self,
        file_id: str,
        method: str,
        query_string: str,
        headers: Mapping[str, str],
        *,
        raw_path: bytes | str | None = None,
    ) -> Download:
        """Authorise a signed request and plan its response (RFC 9110). ``raw_path`` is the request path as sent
        (percent-encoded): only the exact signed path is accepted. Raises AccessDenied subclasses for bad or
        expired signatures, NotFound, PreconditionFailed, RangeNotSatisfiable."""
        method = method.upper()
        if method not in ("GET", "HEAD", "POST"):
            raise MethodNotAllowed(f"{method} is not allowed here", headers={"allow": "GET, HEAD, POST"})
        self.check_signed(method, content_path(file_id), query_string, raw_path, (content_path(file_id),))
        expires = _expiry_of(query_string)
        return await self._open_planned(file_id, method, headers, max(0, expires - int(self.clock())), TRUSTED)

    def check_signed(
        self, method: str, signed_path: str, query_string: str, raw_path: bytes | str | None, paths: tuple[str, ...]
    ) -> None:
        """Every signed-URL check of the service: the raw path must be one of ``paths`` and the query a valid,
        unexpired signature of ``method signed_path``; SignatureInvalid / UrlExpired otherwise, counted by reason."""
        try:
            require_signed_path(raw_path, paths)
            self.signer.verify(method, signed_path, query_string, self.clock())
        except (SignatureInvalid, UrlExpired) as exc:
            metrics.signed_url_rejected(exc.reason)
            raise

    async def open_owned(self, file_id: str, method: str, headers: Mapping[str, str], caller: Grant) -> Download:
        """Plan the response to a GET or HEAD (RFC 9110: ranges, conditionals) for a caller who may see the file
        (its owner; any for admin) without a signed URL. NotFound for everyone else, whether or not it exists."""
        method = method.upper()
        if method not in ("GET", "HEAD"):
            raise MethodNotAllowed(f"{method} is not allowed here", headers={"allow": "GET, HEAD"})
        return await self._open_planned(file_id, method, headers, 0, caller)

    async def _open_planned(
        self, file_id: str, method: str, headers: Mapping[str, str], cache_max_age: int, caller: Grant
    ) -> Download:
        """Open a stored file the caller may see and plan the response with :func:`plan_delivery`: the one code
        path behind every way of reading a file's bytes."""
        if not is_file_id(file_id):
            raise NotFound(f"no file {file_id!r}")
        with storage_errors_translated():
            reader = await self.storage.open(object_key(file_id))
        try:
            record = FileRecord.from_metadata(reader.info.metadata)
            if not caller.sees(record.owner):
                raise NotFound(f"no file {file_id!r}")
            self._require_live(record)  # signed URLs too: they stop working at the file's expiry, as on delete
            if record.content is not None:  # a file sharing bytes: they are where its content record says
                await reader.close()
                reader = await self.publisher.shared.open(record)
            rep = Representation(
                length=reader.info.size,
                content_type=record.content_type,
                sha256_hex=record.encoded_sha256,
                last_modified=record.created_at,
                filename=record.name,
                content_encoding=http_coding(record.encoding),
                compressible=record.encoding is ContentEncoding.NONE and is_compressible(record.content_type),
            )
            policy = DeliveryPolicy(
                max_ranges=self.settings.max_ranges,
                cache_max_age=cache_max_age,
                compress_on_the_fly=self.settings.compress_on_the_fly,
                active_inline=self.settings.serve_active_types_inline,
            )
            plan = plan_delivery(rep, method, headers, policy, boundary=secrets.token_hex(16))
        except (TransferError, StorageError):
            await reader.close()
            raise
        if plan.status == 304 or method == "HEAD":
            await reader.close()
            return Download(plan, None, record)
        return Download(plan, reader, record)


def _expiry_of(query_string: str) -> int:
    for part in query_string.split("&"):
        if part.startswith("exp="):
            return int(part[4:])
    return 0
