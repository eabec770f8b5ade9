"""Upload and download authorisations (shaped after MCP SEP-2631 ``files/authorizeUpload`` /
``files/authorizeDownload``): a caller asks for a place to put a file, or a way to fetch one, and gets an expiring
URL, the method and header fields to use and the size limit. The bytes never travel inside the asking protocol.

An upload authorisation is one record in the storage backend::

    authz/<id>/grant.json     owner, the file's intent (name, content type, lifetime), size limit, start deadline,
                              keep-until (its expiry), and its state in the one upload lifecycle (open ->
                              completed with the stored file's id, moved by compare-and-set: one PUT or confirm
                              completes it; a second confirm answers the same file)
    authz/<id>/object         on a backend with presigned PUTs (S3): where the client's PUT lands

Two expiries: the signed PUT URL must be *started* before ``start_by`` (short: a leaked URL is soon worthless); the
authorisation and its result are kept until ``keep_until`` (longer: time to upload a large file and confirm it).
Where the backend presigns PUTs (S3), the URL is the bucket's own: the bytes never pass through the service, and
``confirm`` checks the size, hashes the object by reading it back, and publishes it by a server-side copy. Elsewhere
(local storage) the URL is the service's ``PUT /v1/authorized/{id}``, signed like a download URL, which streams
through :meth:`FileService.upload` (hashing, size limit, atomic publish). Either way nothing is published before its
SHA-256 is known, and ``confirm`` answers the descriptor with it. A presigned PUT needs the exact ``size``: the bucket
holds the client to it (the length is signed) and the key's quota reserves it until the authorisation ends, so what
the bucket holds before ``confirm`` is always counted.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self

from storage.base import Capability, SupportsPresignPut
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import new_id
from transfer.core.model.content import checksum_hex
from transfer.core.uploads.state import NO_INTENT, FileIntent, UploadRecord, UploadState
from transfer.errors import (
    Conflict,
    Gone,
    InvalidRequest,
    NotFound,
    SessionCompleted,
    SizeMismatch,
    TooLarge,
    TransferError,
    storage_errors_translated,
)
from transfer.service.accounting.slots import OpenSlots
from transfer.service.files.documents import publish_composed
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.publisher import SNIFF_BYTES, Candidate, file_id_for
from transfer.service.files.records import FileRecord
from transfer.service.files.service import FileService
from transfer.service.hashing import read_back
from transfer.service.uploads.lifecycle import UploadKind, UploadLifecycle

START_TTL = 15 * 60  # seconds to start the PUT (default; at most ``MAX_START_TTL``)
MAX_START_TTL = 3600
KEEP_TTL = 24 * 3600  # seconds the authorisation and its result are kept
PREFIX = "authz/"


def new_authorization_id() -> str:
    """A fresh upload authorisation id (``az_`` and 128 random bits)."""
    return new_id("az_")


def _staged(aid: str) -> str:
    return f"{PREFIX}{aid}/object"


def _grant_key(aid: str, owner: str | None = None) -> str:
    return f"{PREFIX}{aid}/grant.json"


def _listed(key: str) -> tuple[str, bool] | None:
    aid, sep, rest = key[len(PREFIX) :].partition("/")
    return (aid, rest == "grant.json") if sep and rest else None


def upload_path(aid: str) -> str:
    """The service path a signed upload URL of authorisation ``aid`` points at (local storage)."""
    return f"/v1/authorized/{aid}"


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadGrant(UploadRecord):
    """An MCP ``authorize_upload`` grant: who may send what (the intent's name and type, at most ``max_size`` bytes)
    to its upload URL, until when (``start_by``; the grant itself is kept until its ``expires_at``)."""

    max_size: int
    start_by: int
    size: int | None = None  # the exact size asked for: signed into a presigned PUT, reserved against the quota

    def to_json(self) -> dict[str, Any]:
        """The grant record as stored."""
        return {**self.base_json(), "max_size": self.max_size, "start_by": self.start_by, "size": self.size}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        """A grant record as stored (one written before the shared form kept its expiry as ``keep_until``)."""
        fields = cls.base_fields(doc)
        if "keep_until" in doc and "expires_at" not in doc:
            fields["expires_at"] = float(doc["keep_until"])
        return cls(**fields, max_size=int(doc["max_size"]), start_by=int(doc["start_by"]), size=doc.get("size"))


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gone(grant: UploadGrant, state: UploadState) -> TransferError:
    return Gone(f"authorization {grant.id} " + ("was aborted" if state is UploadState.ABORTED else "has expired"))


async def _bounded(body: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    received = 0
    async for piece in body:
        received += len(piece)
        if received > limit:
            raise TooLarge(f"the body is larger than the authorised {limit} bytes", limit=limit)
        yield piece


class Authorizations:
    """Upload/download authorisations over the one FileService (state in its storage backend: any replica): the
    authorisation door of the one upload lifecycle."""

    def __init__(self, files: FileService, lifecycle: UploadLifecycle, slots: OpenSlots) -> None:
        self.files = files
        self.storage = files.storage
        self.lifecycle = lifecycle
        self.kind = lifecycle.register(
            UploadKind(
                name="authorization",
                noun="authorization",
                prefix="az",
                decode=UploadGrant.from_json,
                encode=UploadGrant.to_json,
                key=_grant_key,
                listing=PREFIX,
                listed=_listed,
                slots=slots,
                discard=self._discard,
                gone=_gone,
            )
        )

    async def authorize_upload(
        self,
        caller: Grant,
        base_url: str,
        *,
        intent: FileIntent = NO_INTENT,
        max_size: int | None = None,
        size: int | None = None,
        start_ttl: int | None = None,
        checksum: str | None = None,
    ) -> dict[str, Any]:
        """A new upload authorisation for the caller's key: where to PUT, until when, how much; ``intent``: the file
        it receives (its lifetime refused now when above the key's or the service's maximum).

        ``size``: the exact length of the file to come. Then the PUT must carry exactly that ``Content-Length``:
        a presigned PUT signs it, so the bucket itself refuses any other body (and nothing oversize is ever
        stored), and the service's own PUT URL refuses it before reading; the size is reserved against the key's
        quota now (413 ``quota_exceeded`` before a URL is issued) while the PUT goes to the bucket. A presigned PUT
        needs it (400 without): what the bucket holds is counted from the start. Through the service, ``max_size``
        may bound the body instead, checked as it streams.

        ``checksum`` and ``size``: content the key already stores is published at once, sharing its bytes
        (``complete``: no PUT is needed, ``confirm_upload`` answers its descriptor); other content, or another
        key's, gets the same answer with ``complete`` false."""
        limit = self.files.settings.max_upload_size
        declared = None
        if checksum is not None:
            if size is None:
                raise InvalidRequest("a checksum needs the file's exact size", field="size")
            try:
                declared = checksum_hex(checksum)
            except ValueError as exc:
                raise InvalidRequest(f"checksum: {exc}", field="checksum") from exc
            if max_size is not None and size > max_size:
                raise InvalidRequest("size is larger than max_size", field="size")
        if max_size is not None and not 0 < max_size <= limit:
            raise InvalidRequest(f"max_size must be between 1 and {limit}", limit=limit)
        if size is not None and not 0 <= size <= (max_size or limit):
            raise InvalidRequest(f"size must be between 0 and {max_size or limit}", limit=max_size or limit)
        if size is None and self.direct:
            raise InvalidRequest(
                "size is required: the upload goes straight to the bucket, which is held to the exact length and "
                "counted against the key's quota from the start",
                field="size",
            )
        if start_ttl is not None and not 0 < start_ttl <= MAX_START_TTL:
            raise InvalidRequest(f"start_ttl must be between 1 and {MAX_START_TTL} seconds")
        now = int(self.files.clock())
        grant = UploadGrant(
            id=new_authorization_id(),
            owner=caller.owner,
            created_at=now,
            expires_at=now + KEEP_TTL,
            intent=intent,
            max_size=size if size is not None else max_size or limit,
            start_by=now + (start_ttl or START_TTL),
            size=size,
        )
        # through the service, the PUT reserves as any upload does; straight to the bucket, the grant does
        known = None if declared is None or size is None else (declared, size)
        grant = await self.lifecycle.open(self.kind, grant, reserve=size, reserving=self.direct, known=known)
        # Content-Length is signed but not among the fields to set: every HTTP client sends the length of what it
        # sends (browsers may not set it), and a body of any other length does not match the signature
        headers = {"content-type": grant.intent.content_type or "application/octet-stream"}
        if self.direct:
            # straight to the bucket: the service never sees the bytes; confirm_upload verifies and publishes
            assert isinstance(self.storage, SupportsPresignPut)
            with storage_errors_translated():
                url = await self.storage.presign_put(
                    _staged(grant.id),
                    expires_in=grant.start_by - now,
                    content_type=headers["content-type"],
                    content_length=size,
                )
        else:
            url, _ = self.files.signed_url_for_path(base_url, upload_path(grant.id), "PUT", grant.start_by - now)
        out = {
            "authorization_id": grant.id,
            "upload": {"url": url, "method": "PUT", "headers": headers, "expires_at": _iso(grant.start_by)},
            "max_size": grant.max_size,
            "expires_at": _iso(grant.expires_at),
            "direct": self.direct,
            "complete": grant.state is UploadState.COMPLETED,
        }
        if size is not None:
            out["size"] = size
        return out

    @property
    def direct(self) -> bool:
        """Whether uploads go straight to the backend (presigned PUT) rather than through the service."""
        return isinstance(self.storage, SupportsPresignPut) and Capability.PRESIGN in self.storage.capabilities

    async def _grant(self, aid: str, caller: Grant = TRUSTED) -> UploadGrant:
        """The grant ``aid`` (the caller's; NotFound for another key's); Gone once it is past its keep-until."""
        grant = await self.lifecycle.load(self.kind, aid, caller)
        if self.files.clock() >= grant.expires_at:
            raise Gone(f"authorization {aid} has expired")
        return grant

    async def receive(self, aid: str, query: str, body: AsyncIterator[bytes], *, content_length: int | None) -> str:
        """The PUT of a signed upload URL (the URL is the capability: no key): verify the signature and the start
        deadline (``url_expired`` after it), stream the body into the authorisation's file, record it. One PUT
        succeeds per authorisation: one after it is refused (409 ``conflict``), and of two PUTs received at once
        one publishes the file and the other is refused. Returns the new file's id."""
        self.files.signer.verify("PUT", upload_path(aid), query, self.files.clock())
        grant = await self._grant(aid)
        if content_length is not None and content_length > grant.max_size:
            raise TooLarge(f"Content-Length {content_length} exceeds the authorised {grant.max_size} bytes")
        if grant.size is not None and content_length != grant.size:
            raise SizeMismatch(
                f"authorization {aid} is for exactly {grant.size} bytes: send that Content-Length",
                expected=grant.size,
                received=content_length,
            )

        async def publish(grant: UploadGrant) -> FileRecord:
            # through FileService.upload: the key's quota and the file's lifetime apply as to any upload
            request = UploadRequest(intent=grant.intent, owner=grant.owner, declared_length=content_length)
            bounded = _bounded(body, grant.max_size)
            return await self.files.upload(
                bounded, request, source="authorization", file_id=file_id_for(grant.id), screened=True
            )

        if grant.state is UploadState.COMPLETED:
            raise Conflict(f"authorization {aid} was already used")
        try:
            _, record = await self.lifecycle.finish(self.kind, aid, TRUSTED, publish=publish, again=False, loaded=grant)
        except SessionCompleted:  # another PUT completed it meanwhile
            raise Conflict(f"authorization {aid} was already used") from None
        return record.id

    async def descriptor(self, file_id: str, base_url: str) -> dict[str, Any]:
        """The url-mode descriptor of a file an authorisation received (its owner was checked by the caller)."""
        record = await self.files.record(file_id, TRUSTED)
        return await self.files.describe_json(record, base_url, inline=False)

    async def confirm(self, aid: str, caller: Grant, base_url: str) -> dict[str, Any]:
        """The descriptor (with its SHA-256) of the file an authorisation received; Conflict while nothing is. Two
        confirms racing (on one replica or two) answer the same file."""
        grant = await self._grant(aid, caller)
        if grant.state is UploadState.COMPLETED and grant.file_id is not None:
            return await self.descriptor(grant.file_id, base_url)
        if not self.direct:
            raise Conflict(f"nothing was uploaded to authorization {aid} yet", start_by=_iso(grant.start_by))
        _, record = await self.lifecycle.finish(self.kind, aid, caller, self._gather_staged, loaded=grant)
        await self._drop_staged(aid)
        return await self.descriptor(record.id, base_url)

    async def _gather_staged(self, grant: UploadGrant) -> tuple[Candidate, Any]:
        """Verify what a presigned PUT left in the bucket: its size against the grant, its SHA-256 by streaming it
        back inside the service's network (S3 keeps no whole-object SHA-256 of a plain PUT that we could trust
        without the client's declaration); published by a server-side copy under the file's name."""
        staged = _staged(grant.id)
        try:
            with storage_errors_translated():
                info = await self.storage.stat(staged)
        except NotFound:
            raise Conflict(
                f"nothing was uploaded to authorization {grant.id} yet", start_by=_iso(grant.start_by)
            ) from None
        if info.size > grant.max_size or (grant.size is not None and info.size != grant.size):
            await self._drop_staged(grant.id)  # a bucket that ignored the signed length: what it took goes
            if grant.size is not None:
                raise SizeMismatch(
                    f"the upload is {info.size} bytes, not the authorised {grant.size}",
                    expected=grant.size,
                    received=info.size,
                )
            raise TooLarge(f"the upload is {info.size} bytes, more than the authorised {grant.max_size}")
        # before the read-back: over quota, nothing is published and the staged bytes stay until the authorisation
        # expires (the key may make room and confirm again)
        await self.lifecycle.require_room(grant, info.size, retry="delete files and confirm again")
        sha = hashlib.sha256()
        with storage_errors_translated():
            async with await self.storage.open(staged) as reader:
                got = await read_back(reader.read(), sha, head=SNIFF_BYTES)
        candidate = self.lifecycle.candidate(
            grant, size=got.size, sha256=sha.hexdigest(), head=got.head, source="authorization"
        )
        return candidate, lambda record: publish_composed(self.storage, record, [staged])

    async def _drop_staged(self, aid: str) -> None:
        with storage_errors_translated():
            try:
                await self.storage.delete(_staged(aid))
            except NotFound:
                pass

    async def _discard(self, grant: UploadGrant) -> None:
        """What an ended authorisation holds beside its record: the object a presigned PUT left, never confirmed."""
        await self._drop_staged(grant.id)

    async def authorize_download(
        self, file_id: str, caller: Grant, base_url: str, *, ttl: int | None = None
    ) -> dict[str, Any]:
        """An expiring GET URL for one of the caller's files, with its size and SHA-256 to check."""
        record = await self.files.record(file_id, caller)
        url, expires = self.files.signed_url(base_url, record.id, "GET", min(ttl or START_TTL, MAX_START_TTL))
        return {
            "download": {
                "url": url,
                "method": "GET",
                "headers": {},
                "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "size": record.size,
            "checksum": "sha256:" + record.sha256,
            "content_type": record.content_type,
            "name": record.name,
        }
