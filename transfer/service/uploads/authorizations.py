"""Upload and download authorisations (shaped after MCP SEP-2631 ``files/authorizeUpload`` /
``files/authorizeDownload``): a caller asks for a place to put a file, or a way to fetch one, and gets an expiring
URL, the method and header fields to use and the size limit. The bytes never travel inside the asking protocol.

An upload authorisation is one record in the storage backend::

    authz/<id>/grant.json     owner, name, content type, size limit, start deadline, keep-until, and its state in
                              the upload engine's transition table (open -> completed with the stored file's id,
                              moved by compare-and-set by the one PUT or confirm that succeeded)
    authz/<id>/result.json    (read only) where authorisations made before states were recorded kept the file id
    authz/<id>/object         on a backend with presigned PUTs (S3): where the client's PUT lands

Two expiries: the signed PUT URL must be *started* before ``start_by`` (short: a leaked URL is soon worthless); the
authorisation and its result are kept until ``keep_until`` (longer: time to upload a large file and confirm it).
Where the backend presigns PUTs (S3), the URL is the bucket's own: the bytes never pass through the service, and
``confirm`` checks the size, hashes the object by reading it back, and publishes it by a server-side copy. Elsewhere
(local storage) the URL is the service's ``PUT /v1/authorized/{id}``, signed like a download URL, which streams
through :meth:`FileService.upload` (hashing, size limit, atomic publish). Either way nothing is published before its
SHA-256 is known, and ``confirm`` answers the descriptor with it.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from storage.base import Capability, SupportsPresignPut
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import is_id, new_id
from transfer.core.model.content import checksum_hex
from transfer.core.model.mime import require_media_type
from transfer.core.model.naming import sanitize_filename
from transfer.core.uploads.state import UploadEvent, UploadState, state_at, transition
from transfer.errors import (
    Conflict,
    Gone,
    InvalidRequest,
    NotFound,
    SizeMismatch,
    TooLarge,
    TooManyAuthorizations,
    storage_errors_translated,
)
from transfer.service import cpus
from transfer.service.accounting.slots import SessionQuota
from transfer.service.files.documents import publish_composed, read_document
from transfer.service.files.publisher import SNIFF_BYTES, Candidate
from transfer.service.files.service import FileService
from transfer.service.uploads.engine import UploadEngine
from transfer.service.uploads.ingest import UploadRequest

START_TTL = 15 * 60  # seconds to start the PUT (default; at most ``MAX_START_TTL``)
MAX_START_TTL = 3600
KEEP_TTL = 24 * 3600  # seconds the authorisation and its result are kept


def new_authorization_id() -> str:
    """A fresh upload authorisation id (``az_`` and 128 random bits)."""
    return new_id("az_")


def is_authorization_id(value: str) -> bool:
    """Whether ``value`` is an upload authorisation id."""
    return is_id(value, "az_")


def _staged(aid: str) -> str:
    return f"authz/{aid}/object"


def _grant_key(aid: str) -> str:
    return f"authz/{aid}/grant.json"


def upload_path(aid: str) -> str:
    """The service path a signed upload URL of authorisation ``aid`` points at (local storage)."""
    return f"/v1/authorized/{aid}"


@dataclass(frozen=True, slots=True)
class UploadGrant:
    """An MCP ``authorize_upload`` grant: who may send what (name, type, at most ``max_size`` bytes) to its upload
    URL, until when, and how long the file it makes is kept."""

    id: str
    owner: str | None
    name: str | None
    content_type: str | None
    max_size: int
    start_by: int
    keep_until: int
    file_ttl: int | None = None  # seconds the file it receives lives (None: until deleted)
    size: int | None = None  # the exact size asked for: signed into a presigned PUT, reserved against the quota
    state: str = "open"  # an UploadState value: open, then completed (``file_id`` set)
    file_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The grant record as stored."""
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> UploadGrant:
        """A grant record as stored."""
        return cls(**doc)

    def completed_with(self, file_id: str, now: float) -> UploadGrant | None:
        """The grant once it received ``file_id`` (None: it already has; Conflict: it received another file)."""
        if self.state == UploadState.COMPLETED.value:
            if self.file_id == file_id:
                return None
            raise Conflict(f"authorization {self.id} was already used")
        # judged as of its keep-until, not its start deadline: a PUT started in time may end after it
        state = transition(state_at(UploadState(self.state), self.keep_until, now), UploadEvent.COMPLETE)
        return replace(self, state=state.value, file_id=file_id)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _bounded(body: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    received = 0
    async for piece in body:
        received += len(piece)
        if received > limit:
            raise TooLarge(f"the body is larger than the authorised {limit} bytes", limit=limit)
        yield piece


class Authorizations:
    """Upload/download authorisations over the one FileService (state in its storage backend: any replica)."""

    def __init__(self, files: FileService, engine: UploadEngine) -> None:
        self.files = files
        self.storage = files.storage
        self.engine = engine  # the process's one engine (Services.build): grant records changed by compare-and-set
        # open upload authorisations per key: a marker each, checked against its grant only at the key's limit
        self.open_grants = SessionQuota(
            files.storage,
            files.settings.max_open_authorizations_per_key,
            folder="authorizations",
            noun="open upload authorisations",
            error=TooManyAuthorizations,
            clock=files.clock,
        )
        self.open_grants.register(is_authorization_id, self._is_open)

    async def _is_open(self, aid: str) -> bool:
        """Whether authorisation ``aid`` still holds a slot of its key: kept, and no file received yet."""
        try:
            grant = await self._grant(aid)
        except (NotFound, Gone):
            return False
        return await self._received(grant) is None

    async def authorize_upload(
        self,
        caller: Grant,
        base_url: str,
        *,
        name: str | None = None,
        content_type: str | None = None,
        max_size: int | None = None,
        size: int | None = None,
        start_ttl: int | None = None,
        expires_in: int | None = None,
        checksum: str | None = None,
    ) -> dict[str, Any]:
        """A new upload authorisation for the caller's key: where to PUT, until when, how much; ``expires_in``:
        the lifetime of the file it receives (refused now when above the key's or the service's maximum).

        ``size``: the exact length of the file to come. Then the PUT must carry exactly that ``Content-Length``:
        a presigned PUT signs it, so the bucket itself refuses any other body (and nothing oversize is ever
        stored), and the service's own PUT URL refuses it before reading; the size is reserved against the key's
        quota now (413 ``quota_exceeded`` before a URL is issued) while the PUT goes to the bucket. Without it,
        ``max_size`` bounds the body: checked as it streams through the service, or at ``confirm`` for a presigned
        PUT (which removes an oversize object then).

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
        if content_type is not None:
            require_media_type(content_type, "content_type")
        if start_ttl is not None and not 0 < start_ttl <= MAX_START_TTL:
            raise InvalidRequest(f"start_ttl must be between 1 and {MAX_START_TTL} seconds")
        file_ttl = self.files.lifecycle.lifetime(caller.owner, expires_in)
        now = int(self.files.clock())
        grant = UploadGrant(
            id=new_authorization_id(),
            owner=caller.owner,
            name=sanitize_filename(name, default="upload") if name else None,
            content_type=content_type,
            max_size=size if size is not None else max_size or limit,
            start_by=now + (start_ttl or START_TTL),
            keep_until=now + KEEP_TTL,
            file_ttl=file_ttl,
            size=size,
        )
        if size is not None and self.direct:  # through the service, the PUT reserves as any upload does
            await self.files.lifecycle.admit(caller.owner, grant.id, size, grant.keep_until)
        try:
            await self.open_grants.acquire(caller.owner, grant.id)  # TooManyAuthorizations at the key's limit
            await self.engine.create(_grant_key(grant.id), grant.to_json())
        except BaseException:
            await self.files.lifecycle.release_after_failure(caller.owner, grant.id)
            raise
        complete = False
        if declared is not None and size is not None:
            shared = await self.files.publisher.publish_known(
                Candidate(
                    owner=grant.owner,
                    upload_id=grant.id,
                    size=size,
                    sha256=declared,
                    head=b"",
                    source="authorization (shared)",
                    name=grant.name,
                    content_type=content_type,
                    lifetime=file_ttl,
                )
            )
            if shared is not None:
                await self._completed(grant.id, shared.id)
                complete = True
        # Content-Length is signed but not among the fields to set: every HTTP client sends the length of what it
        # sends (browsers may not set it), and a body of any other length does not match the signature
        headers = {"content-type": content_type or "application/octet-stream"}
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
            "expires_at": _iso(grant.keep_until),
            "direct": self.direct,
            "complete": complete,
        }
        if size is not None:
            out["size"] = size
        return out

    @property
    def direct(self) -> bool:
        """Whether uploads go straight to the backend (presigned PUT) rather than through the service."""
        return isinstance(self.storage, SupportsPresignPut) and Capability.PRESIGN in self.storage.capabilities

    async def _grant(self, aid: str) -> UploadGrant:
        if not is_authorization_id(aid):
            raise NotFound(f"no authorization {aid!r}")
        try:
            doc, _ = await self.engine.read(_grant_key(aid))
        except NotFound:
            raise NotFound(f"no authorization {aid!r}") from None
        grant = UploadGrant.from_json(doc)
        if self.files.clock() >= grant.keep_until:
            raise Gone(f"authorization {aid} has expired")
        return grant

    async def receive(self, aid: str, query: str, body: AsyncIterator[bytes], *, content_length: int | None) -> str:
        """The PUT of a signed upload URL (the URL is the capability: no key): verify the signature and the start
        deadline (``url_expired`` after it), stream the body into a new file, record it. One PUT succeeds per
        authorisation; a second is refused and its file removed. Returns the new file's id."""
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
        # through FileService.upload: the key's quota and the file's lifetime apply as to any upload
        request = UploadRequest(
            name=grant.name,
            content_type=grant.content_type,
            owner=grant.owner,
            declared_length=content_length,
            expires_in=grant.file_ttl,
        )
        record = await self.files.upload(_bounded(body, grant.max_size), request, source="authorization")
        try:
            await self._completed(aid, record.id)
        except Conflict:  # another PUT won
            await self.files.delete(record.id, TRUSTED)
            raise
        return record.id

    async def _completed(self, aid: str, file_id: str) -> None:
        """Record that authorisation ``aid`` received ``file_id`` (compare-and-set: one file per authorisation)."""
        now = self.files.clock()
        grant = await self.engine.update(
            _grant_key(aid), UploadGrant.from_json, lambda g: g.completed_with(file_id, now), UploadGrant.to_json
        )
        # it holds no slot of its key any more: its marker goes now, not when the key next reaches its limit
        await self.open_grants.release(grant.owner, aid)

    async def _received(self, grant: UploadGrant) -> str | None:
        """The id of the file ``grant`` received, if any."""
        if grant.file_id is not None:
            return grant.file_id
        try:  # an authorisation made before states were recorded
            return str((await read_document(self.storage, f"authz/{grant.id}/result.json"))["file_id"])
        except NotFound:
            return None

    async def descriptor(self, file_id: str, base_url: str) -> dict[str, Any]:
        """The url-mode descriptor of a file an authorisation received (its owner was checked by the caller)."""
        record = await self.files.record(file_id, TRUSTED)
        return await self.files.describe_json(record, base_url, inline=False)

    async def confirm(self, aid: str, caller: Grant, base_url: str) -> dict[str, Any]:
        """The descriptor (with its SHA-256) of the file an authorisation received; Conflict while nothing is."""
        grant = await self._grant(aid)
        if not caller.sees(grant.owner):
            raise NotFound(f"no authorization {aid!r}")
        file_id = await self._received(grant)
        if file_id is None:
            if not self.direct:
                raise Conflict(f"nothing was uploaded to authorization {aid} yet", start_by=_iso(grant.start_by))
            file_id = await self._publish_staged(grant)
        return await self.descriptor(file_id, base_url)

    async def _publish_staged(self, grant: UploadGrant) -> str:
        """Verify and publish what a presigned PUT left in the bucket: its size against the limit, its SHA-256 by
        streaming it back inside the service's network (S3 keeps no whole-object SHA-256 of a plain PUT that we
        could trust without the client's declaration), then a server-side copy under the file's name. The file id
        follows from the authorisation id, so two confirms publish the same file once."""
        staged = _staged(grant.id)
        try:
            with storage_errors_translated():
                info = await self.storage.stat(staged)
        except NotFound:
            # a concurrent confirm published it and removed the staged object meanwhile
            done = await self._received(await self._grant(grant.id))
            if done is not None:
                return done
            raise Conflict(
                f"nothing was uploaded to authorization {grant.id} yet", start_by=_iso(grant.start_by)
            ) from None
        if info.size > grant.max_size:
            with storage_errors_translated():
                await self.storage.delete(staged)
            raise TooLarge(f"the upload is {info.size} bytes, more than the authorised {grant.max_size}")
        if grant.size is not None and info.size != grant.size:  # a bucket that ignored the signed length
            with storage_errors_translated():
                await self.storage.delete(staged)
            raise SizeMismatch(
                f"the upload is {info.size} bytes, not the authorised {grant.size}",
                expected=grant.size,
                received=info.size,
            )
        # before the read-back: over quota, nothing is published and the staged bytes stay until the authorisation
        # expires (the key may make room and confirm again)
        await self.files.publisher.require_room(
            grant.owner, grant.id, info.size, what="the upload", retry="delete files and confirm again"
        )
        sha = hashlib.sha256()
        head = bytearray()
        with storage_errors_translated():
            async with await self.storage.open(staged) as reader:
                async for piece in reader.read():
                    await cpus.hashed(sha.update, len(piece), piece)
                    if len(head) < SNIFF_BYTES:
                        head += piece[: SNIFF_BYTES - len(head)]
        candidate = Candidate(
            owner=grant.owner,
            upload_id=grant.id,
            size=info.size,
            sha256=sha.hexdigest(),
            head=bytes(head),
            source="authorization",
            name=grant.name,
            content_type=grant.content_type,
            lifetime=grant.file_ttl,
            republishable_until=grant.keep_until,
        )
        record = await self.files.publisher.publish(
            candidate, lambda record: publish_composed(self.storage, record, [staged])
        )
        file_id = record.id
        await self._completed(grant.id, file_id)  # a concurrent confirm recorded the same file id: nothing to do
        with storage_errors_translated():
            await self.storage.delete(staged)
        return file_id

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

    async def sweep_authorizations(self) -> int:
        """Delete what expired authorisations left (their record, result and any staged object that was never
        confirmed); published files stay. Returns how many authorisations were removed."""
        now = self.files.clock()
        keys: dict[str, list[str]] = {}
        with storage_errors_translated():
            async for info in self.storage.list("authz/"):
                keys.setdefault(info.key.split("/")[1], []).append(info.key)
        removed = 0
        for aid, owned in keys.items():
            try:
                doc = await read_document(self.storage, _grant_key(aid))
                expired = now >= float(doc["keep_until"])
            except NotFound:
                doc, expired = {}, True  # a staged object or result without its record
            if not expired:
                continue
            with storage_errors_translated():
                for key in owned:
                    await self.storage.delete(key)
            if "owner" in doc:  # its slot marker, if a completion did not drop it
                await self.open_grants.release(doc["owner"], aid)
            removed += 1
        return removed
