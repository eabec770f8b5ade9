"""Resumable Uploads for HTTP (draft-ietf-httpbis-resumable-upload, interop version 8) at ``/v1/uploads``.

A thin front door over :class:`TusService`, the upload engine tus uses: an upload resource here is a tus upload
(``/v1/uploads/{id}`` and ``/tus/files/{id}`` name the same upload), so one created by either protocol can be
resumed, finished or read through the other; the finished upload is an ordinary stored file with its descriptor.

- creation (draft §5.1): ``POST /v1/uploads`` with ``Upload-Complete``; ``104 Upload Resumption Supported`` with
  the resource's ``Location`` and ``Upload-Limit`` before the body is read (when the client sent
  ``Upload-Draft-Interop-Version: 8`` and the server can send interim responses, see
  :mod:`transfer.api.protocol.informational`); the body is appended as it arrives and kept if the client goes away.
- offset retrieval (§5.2): ``HEAD`` (or ``GET``) -> 204 with ``Upload-Offset``, ``Upload-Complete``,
  ``Upload-Length``, ``Upload-Limit``, ``Cache-Control: no-store``.
- append (§5.3): ``PATCH`` with ``Content-Type: application/partial-upload``, ``Upload-Offset``, ``Upload-Complete``.
- cancellation (§5.4): ``DELETE``.
- digests (§10, RFC 9530): ``Repr-Digest: sha-256=…`` at creation is the SHA-256 the whole upload must have (checked
  by the engine before anything is published); a completed upload answers ``Repr-Digest`` with its SHA-256.
- errors are RFC 9457 problem details (``application/problem+json``), with the draft's problem types for a
  mismatching offset (409, ``expected-offset``/``provided-offset``) and inconsistent lengths (400), and our stable
  ``code`` as an extension member.

The completed upload answers what ``POST /v1/files`` answers (201 and the FileContent descriptor), with
``Upload-Complete: ?1`` (§5.3.2). No progress ``104`` is sent while a body arrives: the engine makes bytes durable
when the request ends, so an earlier ``Upload-Offset`` would promise bytes a crash could still lose (§4.1.1).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from transfer.api.caller import caller_of
from transfer.api.protocol.informational import EXTENSION
from transfer.api.responses import AsciiJSONResponse
from transfer.api.streaming import request_body
from transfer.core.auth import Grant
from transfer.core.auth import Scope as AuthScope
from transfer.core.http.digests import sha256_from_digest_field
from transfer.core.http.resumable import (
    INCONSISTENT_LENGTH,
    INTEROP_HEADER,
    INTEROP_VERSION,
    MISMATCHING_OFFSET,
    PARTIAL_UPLOAD,
    PROBLEM_JSON,
    UploadLimits,
    boolean_item,
    integer_item,
    interop_version,
    problem,
    serialize_boolean,
)
from transfer.core.model.content import normalize_checksum
from transfer.core.model.naming import filename_from_content_disposition
from transfer.core.numerals import parse_count
from transfer.errors import (
    Conflict,
    InconsistentUploadLength,
    IntegrityError,
    InvalidRequest,
    TooLarge,
    TransferError,
    UnsupportedMediaType,
    UploadOffsetMismatch,
)
from transfer.service.files.service import FileService
from transfer.service.uploads.tus import DECLARED_SHA256, TusService, Upload

PREFIX = "/v1/uploads"

# Response header fields of this protocol that browser code must be able to read (CORS Expose-Headers)
EXPOSED_HEADERS = ("upload-complete", "upload-limit", INTEROP_HEADER)  # Upload-Offset/-Length: tus lists them


def is_resumable_path(path: str) -> bool:
    """Whether a request path belongs to this front door (its errors are rendered as problem details)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def problem_response(exc: TransferError) -> Response:
    """``exc`` as RFC 9457 problem details; the draft's problem types where one applies (§9), else ``about:blank``
    with the status phrase as title (RFC 9457 §4.2.1). ``code`` and ``detail`` carry what the service's JSON error
    body carries, so a client of either format learns the same."""
    members: dict[str, Any] = {"detail": exc.message, "code": exc.code}
    headers = dict(exc.headers)
    if isinstance(exc, UploadOffsetMismatch):
        body = problem(
            MISMATCHING_OFFSET,
            "offset from request does not match offset of resource",
            exc.status,
            **{
                "expected-offset": exc.detail.get("expected_offset"),
                "provided-offset": exc.detail.get("provided_offset"),
            },
            **members,
        )
        headers["upload-offset"] = str(exc.detail.get("expected_offset"))
    elif isinstance(exc, InconsistentUploadLength):
        body = problem(INCONSISTENT_LENGTH, "inconsistent length values for upload", exc.status, **members)
    else:
        try:
            title = HTTPStatus(exc.status).phrase
        except ValueError:
            title = exc.code
        body = problem("about:blank", title, exc.status, **members)
        if exc.detail:
            body["error-detail"] = exc.detail
    # §4.1.2: false = the resumable-upload protocol answered, not the processing of a complete representation; a
    # failed digest check is that processing's answer (the upload is over: do not resume)
    headers.setdefault("upload-complete", serialize_boolean(isinstance(exc, IntegrityError)))
    return AsciiJSONResponse(body, status_code=exc.status, headers=headers, media_type=PROBLEM_JSON)


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover  (makes this an async generator)


async def send_interim(request: Request, headers: dict[str, str]) -> bool:
    """Send ``104 Upload Resumption Supported`` now, if the server offers interim responses for this request;
    returns whether it was sent."""
    if EXTENSION not in (request.scope.get("extensions") or {}):
        return False
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    # Request keeps the ASGI send it was built with (Starlette's own early hints use it the same way)
    await request._send({"type": "http.response.informational", "status": 104, "headers": raw})
    return True


def resumable_router(
    tus: TusService,
    files: FileService,
    base_url: Callable[[Request], str],
    needs: Callable[[AuthScope], Any],
) -> APIRouter:
    router = APIRouter()
    settings = files.settings
    may_upload = [needs(AuthScope.UPLOAD)]

    def limits(upload: Upload | None) -> UploadLimits:
        age = settings.session_ttl if upload is None else int(upload.expires_at - tus.clock())
        return UploadLimits(max_size=settings.max_upload_size, max_age=age)

    def content_length(request: Request) -> int | None:
        value = request.headers.get("content-length")
        return None if value is None else parse_count(value, "Content-Length")

    def required_complete(request: Request) -> bool:
        complete = boolean_item(request.headers.get("upload-complete"))
        if complete is None:  # absent, or not a Boolean (§4.1.2: ignored, so absent)
            raise InvalidRequest("Upload-Complete must be ?0 or ?1 (an RFC 9651 Boolean)")
        return complete

    def length_of(request: Request, offset: int, complete: bool) -> int | None:
        """The length this request indicates (§4.1.3): ``Upload-Length``, or offset + ``Content-Length`` when it
        completes the upload; both present must agree."""
        declared = integer_item(request.headers.get("upload-length"))
        size = content_length(request)
        implied = offset + size if complete and size is not None else None
        if declared is not None and implied is not None and declared != implied:
            raise InconsistentUploadLength(
                f"Upload-Length {declared} disagrees with Upload-Offset + Content-Length = {implied}"
            )
        return declared if declared is not None else implied

    async def append(
        uid: str, offset: int, body: AsyncIterator[bytes], caller: Grant, declare_length: int | None = None
    ) -> tuple[Upload, int]:
        """The engine's append, with a wrong offset reported as the draft's mismatching-offset problem."""
        try:
            return await tus.append(uid, offset, body, caller, declare_length=declare_length)
        except Conflict as exc:
            expected = exc.detail.get("offset")
            if expected is None:  # a concurrent append won the race: not an offset the client sent wrongly
                raise
            raise UploadOffsetMismatch(
                exc.message, expected_offset=expected, provided_offset=offset, headers=exc.headers
            ) from exc

    async def receive(uid: str, offset: int, complete: bool, request: Request, caller: Grant) -> tuple[Upload, int]:
        """Append the request body at ``offset``; when the request completes the upload, publish it."""
        upload, offset = await append(uid, offset, request_body(request), caller)
        if complete and upload.file_id is None:
            if upload.length is not None and upload.length != offset:
                raise InconsistentUploadLength(
                    f"Upload-Complete: ?1 at offset {offset}, but the upload's length is {upload.length}"
                )
            # the length was not known: it is what arrived (§4.1.3), and declaring it publishes the upload
            upload, offset = await append(uid, offset, _nothing(), caller, declare_length=offset)
        return upload, offset

    async def answer(request: Request, upload: Upload, offset: int, *, status: int, location: str | None) -> Response:
        headers = {"upload-offset": str(offset), "upload-limit": limits(upload).header()}
        if location is not None:
            headers["location"] = location
        if upload.file_id is None:
            headers["upload-complete"] = serialize_boolean(False)
            return Response(status_code=status, headers=headers)
        # complete: what POST /v1/files would have answered for the whole representation (§5.3.2)
        caller = caller_of(request)
        record = await files.record(upload.file_id, caller)
        descriptor = await files.describe(record, base_url(request), inline=False)
        headers["upload-complete"] = serialize_boolean(True)
        headers["content-location"] = f"/v1/files/{record.id}"
        headers["repr-digest"] = f"sha-256=:{base64.b64encode(bytes.fromhex(record.sha256)).decode('ascii')}:"
        return AsciiJSONResponse(descriptor.to_json(), status_code=201, headers=headers)

    @router.options(PREFIX, tags=["resumable uploads"], summary="IETF resumable uploads: limits (Upload-Limit)")
    @router.options(PREFIX + "/{uid}", include_in_schema=False)
    async def resumable_options() -> Response:
        # §4.1.4: an OPTIONS without Upload-Complete learns the limits; Accept-Patch names the append media type
        return Response(
            status_code=204,
            headers={"upload-limit": limits(None).header(), "accept-patch": PARTIAL_UPLOAD, "allow": "OPTIONS, POST"},
        )

    @router.post(
        PREFIX,
        dependencies=may_upload,
        status_code=201,
        tags=["resumable uploads"],
        summary="Create an upload (draft-ietf-httpbis-resumable-upload §5.1); 104 with its Location first",
        response_class=Response,
    )
    async def resumable_create(request: Request) -> Response:
        caller = caller_of(request)
        complete = required_complete(request)
        length = length_of(request, 0, complete)
        if length is not None and length > settings.max_upload_size:
            raise TooLarge(
                f"the upload's length {length} exceeds max-size {settings.max_upload_size}",
                headers={"upload-limit": limits(None).header()},
            )
        metadata: dict[str, str] = {}
        disposition = request.headers.get("content-disposition")
        name = filename_from_content_disposition(disposition) if disposition else None
        if name:
            metadata["filename"] = name
        media_type = request.headers.get("content-type", "").strip()
        if media_type and media_type.split(";")[0].strip().lower() != PARTIAL_UPLOAD:
            metadata["filetype"] = media_type  # a hint, like Content-Type on POST /v1/files
        digest = request.headers.get("repr-digest")
        sha256 = sha256_from_digest_field(digest) if digest else None
        if sha256 is not None:
            metadata[DECLARED_SHA256] = normalize_checksum(sha256.hex()).removeprefix("sha256:")
        # no byte is read yet when the request has no body or waits for 100 Continue: content the key already
        # stores (Repr-Digest and a known length) completes the upload at once, its offset its length
        sent = request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
        pending = not sent or request.headers.get("expect", "").lower() == "100-continue"
        upload = await tus.create(length=length, metadata=metadata, caller=caller, body_pending=pending)
        location = f"{base_url(request)}{PREFIX}/{upload.id}"
        if interop_version(request.headers.get(INTEROP_HEADER)) == INTEROP_VERSION:
            # draft appendix "Draft Version Identification": only to a client of the same interop version
            await send_interim(
                request,
                {"location": location, "upload-limit": limits(upload).header(), INTEROP_HEADER: str(INTEROP_VERSION)},
            )
        if upload.file_id is not None:
            return await answer(request, upload, upload.offset, status=201, location=location)
        upload, offset = await receive(upload.id, 0, complete, request, caller)
        return await answer(request, upload, offset, status=201, location=location)

    @router.head(PREFIX + "/{uid}", dependencies=may_upload, tags=["resumable uploads"], summary="Upload offset (§5.2)")
    @router.get(PREFIX + "/{uid}", dependencies=may_upload, include_in_schema=False, response_class=Response)
    async def resumable_offset(request: Request, uid: str) -> Response:
        upload, offset = await tus.current(uid, caller_of(request))
        headers = {
            "upload-offset": str(offset),
            "upload-complete": serialize_boolean(upload.file_id is not None),
            "upload-limit": limits(upload).header(),
            "cache-control": "no-store",  # §5.2.2: an offset must never come from a cache
        }
        if upload.length is not None:
            headers["upload-length"] = str(upload.length)
        if upload.file_id is not None:
            record = await files.record(upload.file_id, caller_of(request))
            headers["repr-digest"] = f"sha-256=:{base64.b64encode(bytes.fromhex(record.sha256)).decode('ascii')}:"
        return Response(status_code=204, headers=headers)

    @router.patch(
        PREFIX + "/{uid}",
        dependencies=may_upload,
        tags=["resumable uploads"],
        summary="Append at Upload-Offset (application/partial-upload, §5.3)",
        response_class=Response,
    )
    async def resumable_append(request: Request, uid: str) -> Response:
        caller = caller_of(request)
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != PARTIAL_UPLOAD:
            raise UnsupportedMediaType(
                f"an append is Content-Type: {PARTIAL_UPLOAD}", headers={"accept-patch": PARTIAL_UPLOAD}
            )
        offset = integer_item(request.headers.get("upload-offset"))
        if offset is None:
            raise InvalidRequest("an append needs Upload-Offset (a non-negative RFC 9651 Integer)")
        complete = required_complete(request)
        length = length_of(request, offset, complete)
        upload = await tus.load(uid, caller)
        if length is not None:
            if upload.length is not None and upload.length != length:
                raise InconsistentUploadLength(f"the upload's length is {upload.length}, this request says {length}")
            if length > settings.max_upload_size:
                raise TooLarge(
                    f"the upload's length {length} exceeds max-size {settings.max_upload_size}",
                    headers={"upload-limit": limits(upload).header()},
                )
            if upload.length is None:
                # recorded before the body (§5.3.2), so the engine bounds this append by it
                upload, _ = await append(uid, offset, _nothing(), caller, declare_length=length)
        upload, new_offset = await receive(uid, offset, complete, request, caller)
        return await answer(request, upload, new_offset, status=204, location=None)

    @router.delete(
        PREFIX + "/{uid}",
        dependencies=may_upload,
        status_code=204,
        tags=["resumable uploads"],
        summary="Cancel an upload (§5.4)",
    )
    async def resumable_cancel(request: Request, uid: str) -> Response:
        await tus.terminate(uid, caller_of(request))
        return Response(status_code=204)

    return router
