"""Resumable Uploads for HTTP (draft-ietf-httpbis-resumable-upload, interop version 9; 8 still spoken) at
``/v1/uploads``.

A thin front door over :class:`TusService`, the upload engine tus uses: an upload resource here is a tus upload
(``/v1/uploads/{id}`` and ``/tus/files/{id}`` name the same upload), so one created by either protocol can be
resumed, finished or read through the other; the finished upload is an ordinary stored file with its descriptor.
Section names below are the draft's (its numbering moves between revisions); :mod:`transfer.core.http.resumable` says
which revision.

- creation (§"Upload Creation"): ``POST /v1/uploads`` with ``Upload-Complete``; ``104 Upload Resumption
  Supported`` with the resource's ``Location``, ``Upload-Limit`` and the interop version before the body is read,
  to a client that announces a version spoken here (8 or 9; none to any other: appendix "Draft Version
  Identification") when the server can send interim responses (:mod:`transfer.api.protocol.informational` on
  HTTP/1.1, an interim HEADERS frame on HTTP/2); the body is appended as it arrives and kept if the client goes away.
- offset retrieval (§"Offset Retrieval"): ``HEAD`` (or ``GET``) -> 204 with ``Upload-Offset``, ``Upload-Complete``,
  ``Upload-Length``, ``Upload-Limit``, ``Cache-Control: no-store``.
- append (§"Upload Append"): ``PATCH`` with ``Content-Type: application/partial-upload``, ``Upload-Offset``,
  ``Upload-Complete``. An append to a completed upload that is valid (its offset, no content) replays the final
  response (interop 9); at interop 8 it is 410 with the ``completed-upload`` problem type, as -11 said.
- cancellation (§"Upload Cancellation"): ``DELETE``.
- limits (§"Limits"): ``Upload-Limit`` carries ``max-size``, ``min-size``, ``max-append-size`` and
  ``min-append-size`` when set, and ``max-age``; every one is enforced, the append sizes as the body arrives (a
  request past ``max-append-size`` stops being read there and keeps nothing), and every refusal for a limit answers
  ``Upload-Limit`` with the ``Upload-Offset`` to go on from. An upload below ``min-size`` gets no upload resource:
  sent whole it is taken as ``POST /v1/files`` would take it, else refused.
- content codings (§"Content Codings"): offsets count the representation's bytes as sent. This door takes only
  ``identity`` (415 with ``Accept-Encoding: identity`` before any resource exists, RFC 9110 §15.5.16): the engine
  publishes the bytes it received, and the descriptor's SHA-256 is of the original bytes.
- digests (RFC 9530; the draft dropped its own integrity section in -12): ``Repr-Digest: sha-256=…`` at creation is
  the SHA-256 the whole representation must have (checked before anything is published: a mismatch is the processing
  of the representation failing, so ``Upload-Complete: ?1``); a completed upload answers ``Repr-Digest``.
- errors are RFC 9457 problem details (``application/problem+json``), with the draft's problem types for a
  mismatching offset (409, ``expected-offset``/``provided-offset``) and inconsistent lengths (400), and our stable
  ``code`` as an extension member.

The completed upload answers what ``POST /v1/files`` answers (201 and the FileContent descriptor), with
``Upload-Complete: ?1``. No progress ``104`` is sent while a body arrives: the engine makes bytes durable when the
request ends, so an earlier ``Upload-Offset`` would promise bytes a crash could still lose (§"Offset": an
acknowledged offset is a guarantee that no retransmission is needed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
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
from transfer.core.http.digests import format_digest_field, sha256_from_digest_field
from transfer.core.http.resumable import (
    COMPLETED_UPLOAD,
    INCONSISTENT_LENGTH,
    INTEROP_HEADER,
    MISMATCHING_OFFSET,
    PARTIAL_UPLOAD,
    PROBLEM_JSON,
    UploadLimits,
    boolean_item,
    check_append_size,
    integer_item,
    problem,
    serialize_boolean,
    spoken_version,
)
from transfer.core.model.content import normalize_checksum
from transfer.core.model.naming import filename_from_content_disposition
from transfer.core.numerals import parse_count
from transfer.core.uploads.lifetimes import parse_expires_in
from transfer.core.uploads.state import FileIntent
from transfer.errors import (
    AppendTooSmall,
    Conflict,
    InconsistentUploadLength,
    IntegrityError,
    InvalidRequest,
    TooLarge,
    TransferError,
    UnsupportedMediaType,
    UploadBelowMinSize,
    UploadCompleted,
    UploadOffsetMismatch,
)
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.service import FileService
from transfer.service.uploads.tus import DECLARED_SHA256, TusService, Upload

PREFIX = "/v1/uploads"

# Response header fields of this protocol that browser code must be able to read (CORS Expose-Headers)
EXPOSED_HEADERS = ("upload-complete", "upload-limit", INTEROP_HEADER)  # Upload-Offset/-Length: tus lists them

# Refusals for a limit: their responses carry Upload-Limit (§"Limits", PR #3466) and the offset to go on from
LIMIT_ERRORS = (TooLarge, AppendTooSmall, UploadBelowMinSize)


def is_resumable_path(path: str) -> bool:
    """Whether a request path belongs to this front door (its errors are rendered as problem details)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def problem_response(exc: TransferError) -> Response:
    """``exc`` as RFC 9457 problem details; the draft's problem types where one applies, else ``about:blank`` with
    the status phrase as title (RFC 9457 §4.2.1). ``code`` and ``detail`` carry what the service's JSON error body
    carries, so a client of either format learns the same."""
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
    elif isinstance(exc, UploadCompleted):
        body = problem(COMPLETED_UPLOAD, "upload is already completed", exc.status, **members)
    else:
        try:
            title = HTTPStatus(exc.status).phrase
        except ValueError:
            title = exc.code
        body = problem("about:blank", title, exc.status, **members)
        if exc.detail:
            body["error-detail"] = exc.detail
    # §"Completeness": false = the resumable-upload protocol answered, not the processing of the representation; a
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


def refuse_content_coding(request: Request) -> None:
    """415 for a body with a content coding other than ``identity``, before anything is created or read."""
    request_body(request)  # raises UnsupportedEncoding; builds (does not start) the body iterator otherwise


async def bounded(
    body: AsyncIterator[bytes], limits: UploadLimits, *, completes: bool, creation: bool
) -> AsyncIterator[bytes]:
    """``body`` with the append limits enforced as it arrives: past ``max-append-size`` it stops there, and a body
    that ends below ``min-append-size`` without completing the upload is refused at its end; either way the engine
    keeps nothing of this request (a cut body is still kept: the client resumes it)."""
    received = 0
    async for piece in body:
        received += len(piece)
        check_append_size(limits, received, completes=True)  # only the upper bound while bytes still come
        yield piece
    check_append_size(limits, received, completes=completes, creation=creation)


def has_body(request: Request) -> bool:
    """Whether the request announces content (a non-zero Content-Length, or a chunked body)."""
    return request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers


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
        return UploadLimits(
            max_size=settings.max_upload_size,
            min_size=settings.resumable_min_size,
            max_append_size=settings.resumable_max_append_size,
            min_append_size=settings.resumable_min_append_size,
            max_age=age,
        )

    @contextmanager
    def limits_told(upload: Upload | None, offset: int | None) -> Iterator[None]:
        """A refusal for a limit raised in the block answers the limits, and the offset to go on from."""
        try:
            yield
        except LIMIT_ERRORS as exc:
            exc.headers.setdefault("upload-limit", limits(upload).header())
            if offset is not None:
                exc.headers.setdefault("upload-offset", str(offset))
            raise

    def content_length(request: Request) -> int | None:
        value = request.headers.get("content-length")
        return None if value is None else parse_count(value, "Content-Length")

    def required_complete(request: Request) -> bool:
        complete = boolean_item(request.headers.get("upload-complete"))
        if complete is None:  # absent, or not a Boolean (§"Completeness": ignored, so absent)
            raise InvalidRequest("Upload-Complete must be ?0 or ?1 (an RFC 9651 Boolean)")
        return complete

    def length_of(request: Request, offset: int, complete: bool) -> int | None:
        """The representation's length this request indicates (§"Length"): ``Upload-Length``, or offset +
        ``Content-Length`` when it completes the upload; both present must agree."""
        declared = integer_item(request.headers.get("upload-length"))
        size = content_length(request)
        implied = offset + size if complete and size is not None else None
        if declared is not None and implied is not None and declared != implied:
            raise InconsistentUploadLength(
                f"Upload-Length {declared} disagrees with Upload-Offset + Content-Length = {implied}"
            )
        return declared if declared is not None else implied

    def within_max_size(length: int | None) -> None:
        if length is not None and length > settings.max_upload_size:
            raise TooLarge(f"the upload's length {length} exceeds max-size {settings.max_upload_size}")

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

    async def receive(
        upload: Upload, offset: int, complete: bool, request: Request, caller: Grant, *, creation: bool = False
    ) -> tuple[Upload, int]:
        """Append the request body at ``offset`` within the append limits; when the request completes the upload,
        publish it (its length must then be the offset reached: §"Length", PR #3463)."""
        body = bounded(request_body(request), limits(upload), completes=complete, creation=creation)
        try:
            upload, offset = await append(upload.id, offset, body, caller)
        except TooLarge as exc:
            if type(exc) is TooLarge and upload.length is not None:
                # past the length the client declared: §"Upload Append" (server behaviour) -- reject the request,
                # mark the upload resource invalid and reject any further interaction with it
                await tus.terminate(upload.id, caller)
                exc.message += "; the upload is cancelled"
            raise
        if complete and upload.file_id is None:
            if upload.length is not None and upload.length != offset:
                raise InconsistentUploadLength(
                    f"Upload-Complete: ?1 at offset {offset}, but the upload's length is {upload.length}"
                )
            # the length was not known: it is what arrived (§"Length"), and declaring it publishes the upload
            upload, offset = await append(upload.id, offset, _nothing(), caller, declare_length=offset)
        return upload, offset

    async def answer(request: Request, upload: Upload, offset: int, *, status: int, location: str | None) -> Response:
        headers = {"upload-offset": str(offset), "upload-limit": limits(upload).header()}
        if location is not None:
            headers["location"] = location
        if upload.file_id is None:
            headers["upload-complete"] = serialize_boolean(False)
            return Response(status_code=status, headers=headers)
        # complete: what POST /v1/files would have answered for the whole representation (§"Upload Append")
        caller = caller_of(request)
        record = await files.record(upload.file_id, caller)
        descriptor = await files.describe(record, base_url(request), inline=False)
        headers["upload-complete"] = serialize_boolean(True)
        headers["content-location"] = f"/v1/files/{record.id}"
        headers["repr-digest"] = format_digest_field(record.sha256)
        return AsciiJSONResponse(descriptor.to_json(), status_code=201, headers=headers)

    async def whole(request: Request, length: int | None) -> Response:
        """A complete upload below ``min-size``: no upload resource, the representation taken as ``POST
        /v1/files`` takes it (§"Limits": accepted without the ability to resume)."""
        caller = caller_of(request)
        disposition = request.headers.get("content-disposition")
        req = UploadRequest(
            intent=FileIntent(
                name=filename_from_content_disposition(disposition) if disposition else None,
                hinted_type=request.headers.get("content-type", "").strip() or None,
                lifetime=parse_expires_in(request.headers.get("expires-in"), "Expires-In"),
            ),
            declared_length=length,
            owner=caller.owner,
        )
        digest = request.headers.get("repr-digest")
        if digest:
            req.body_sha256 = sha256_from_digest_field(digest)
        record = await files.upload(request_body(request), req)
        descriptor = await files.describe(record, base_url(request), inline=False)
        headers = {
            "upload-complete": serialize_boolean(True),
            "content-location": f"/v1/files/{record.id}",
            "repr-digest": format_digest_field(record.sha256),
            "upload-limit": limits(None).header(),
        }
        return AsciiJSONResponse(descriptor.to_json(), status_code=201, headers=headers)

    async def completed_append(request: Request, upload: Upload, offset: int, version: int | None) -> Response:
        """An append to an upload already completed (its final response may have been lost)."""
        assert upload.length is not None  # a completed upload's length is what it published
        content = has_body(request)
        if version == 8:  # -11 §4.4.2
            if content:
                raise InconsistentUploadLength(f"the upload is complete: its length is {upload.length}")
            raise UploadCompleted(
                f"upload {upload.id} is complete", headers={"location": f"/v1/files/{upload.file_id}"}
            )
        if offset != upload.length:
            raise UploadOffsetMismatch(
                f"Upload-Offset {offset} does not match the upload's offset {upload.length}",
                expected_offset=upload.length,
                provided_offset=offset,
            )
        async for piece in request_body(request):
            if piece:
                raise InconsistentUploadLength(f"the upload is complete: its length is {upload.length}")
        # a valid append to a completed upload: the final response again (§"Upload Append", server behaviour)
        return await answer(request, upload, upload.length, status=201, location=None)

    @router.options(PREFIX, tags=["resumable uploads"], summary="IETF resumable uploads: limits (Upload-Limit)")
    @router.options(PREFIX + "/{uid}", include_in_schema=False)
    async def resumable_options() -> Response:
        # §"Limits": an OPTIONS without Upload-Complete learns the limits (MUST); Accept-Patch names the append media
        # type (a MUST at interop 8, harmless at 9)
        return Response(
            status_code=204,
            headers={"upload-limit": limits(None).header(), "accept-patch": PARTIAL_UPLOAD, "allow": "OPTIONS, POST"},
        )

    @router.post(
        PREFIX,
        dependencies=may_upload,
        status_code=201,
        tags=["resumable uploads"],
        summary="Create an upload (draft-ietf-httpbis-resumable-upload, Upload Creation); 104 with its Location first",
        response_class=Response,
    )
    async def resumable_create(request: Request) -> Response:
        caller = caller_of(request)
        version = spoken_version(request.headers.get(INTEROP_HEADER))
        refuse_content_coding(request)
        complete = required_complete(request)
        length = length_of(request, 0, complete)
        with limits_told(None, None):
            within_max_size(length)
            if settings.resumable_min_size and (length is None or length < settings.resumable_min_size):
                if not complete:
                    raise UploadBelowMinSize(
                        f"uploads below min-size {settings.resumable_min_size} bytes (or of unknown length) are not "
                        "resumable here: send the representation whole, with Upload-Complete: ?1"
                    )
                return await whole(request, length)
            check_append_size(limits(None), content_length(request), completes=complete, creation=True)
        metadata: dict[str, str] = {}
        disposition = request.headers.get("content-disposition")
        name = filename_from_content_disposition(disposition) if disposition else None
        if name:
            metadata["filename"] = name
        media_type = request.headers.get("content-type", "").strip()
        if media_type and media_type.split(";")[0].strip().lower() != PARTIAL_UPLOAD:
            metadata["filetype"] = media_type  # a hint, like Content-Type on POST /v1/files
        lifetime = request.headers.get("expires-in")
        if lifetime is not None:
            metadata["expires_in"] = lifetime.strip()  # checked by the engine, like Upload-Metadata expires_in
        digest = request.headers.get("repr-digest")
        sha256 = sha256_from_digest_field(digest) if digest else None
        if sha256 is not None:
            metadata[DECLARED_SHA256] = normalize_checksum(sha256.hex()).removeprefix("sha256:")
        # no byte is read yet when the request has no body or waits for 100 Continue: content the key already
        # stores (Repr-Digest and a known length) completes the upload at once, its offset its length
        pending = not has_body(request) or request.headers.get("expect", "").lower() == "100-continue"
        upload = await tus.create(length=length, metadata=metadata, caller=caller, body_pending=pending)
        location = f"{base_url(request)}{PREFIX}/{upload.id}"
        if version is not None:
            # appendix "Draft Version Identification": only to a client of a version spoken here, which it echoes
            await send_interim(
                request, {"location": location, "upload-limit": limits(upload).header(), INTEROP_HEADER: str(version)}
            )
        if upload.file_id is not None:
            return await answer(request, upload, upload.offset, status=201, location=location)
        with limits_told(upload, 0):
            upload, offset = await receive(upload, 0, complete, request, caller, creation=True)
        return await answer(request, upload, offset, status=201, location=location)

    @router.head(PREFIX + "/{uid}", dependencies=may_upload, tags=["resumable uploads"], summary="Upload offset")
    @router.get(PREFIX + "/{uid}", dependencies=may_upload, include_in_schema=False, response_class=Response)
    async def resumable_offset(request: Request, uid: str) -> Response:
        upload, offset = await tus.current(uid, caller_of(request))
        headers = {
            "upload-offset": str(offset),
            # required up to -12, optional after PR #3493; kept: interop 8 clients rely on it
            "upload-complete": serialize_boolean(upload.file_id is not None),
            "upload-limit": limits(upload).header(),
            "cache-control": "no-store",  # §"Offset Retrieval": an offset must never come from a cache
        }
        if upload.length is not None:
            headers["upload-length"] = str(upload.length)
        if upload.file_id is not None:
            record = await files.record(upload.file_id, caller_of(request))
            headers["repr-digest"] = format_digest_field(record.sha256)
        return Response(status_code=204, headers=headers)

    @router.patch(
        PREFIX + "/{uid}",
        dependencies=may_upload,
        tags=["resumable uploads"],
        summary="Append at Upload-Offset (application/partial-upload)",
        response_class=Response,
    )
    async def resumable_append(request: Request, uid: str) -> Response:
        caller = caller_of(request)
        version = spoken_version(request.headers.get(INTEROP_HEADER))
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != PARTIAL_UPLOAD:
            raise UnsupportedMediaType(
                f"an append is Content-Type: {PARTIAL_UPLOAD}", headers={"accept-patch": PARTIAL_UPLOAD}
            )
        refuse_content_coding(request)
        offset = integer_item(request.headers.get("upload-offset"))
        if offset is None:
            raise InvalidRequest("an append needs Upload-Offset (a non-negative RFC 9651 Integer)")
        complete = required_complete(request)
        length = length_of(request, offset, complete)
        upload = await tus.load(uid, caller)
        if upload.file_id is not None:
            return await completed_append(request, upload, offset, version)
        with limits_told(upload, upload.offset):
            if length is not None:
                if upload.length is not None and upload.length != length:
                    raise InconsistentUploadLength(
                        f"the upload's length is {upload.length}, this request says {length}"
                    )
                within_max_size(length)
            if upload.offset == offset:  # a wrong offset is answered 409 by the engine, whatever the size
                check_append_size(limits(upload), content_length(request), completes=complete)
            if length is not None and upload.length is None:
                # recorded before the body (§"Upload Append": the server MUST record it), so the engine bounds
                # this append by it
                upload, _ = await append(uid, offset, _nothing(), caller, declare_length=length)
            upload, new_offset = await receive(upload, offset, complete, request, caller)
        return await answer(request, upload, new_offset, status=204, location=None)

    @router.delete(
        PREFIX + "/{uid}",
        dependencies=may_upload,
        status_code=204,
        tags=["resumable uploads"],
        summary="Cancel an upload",
    )
    async def resumable_cancel(request: Request, uid: str) -> Response:
        await tus.terminate(uid, caller_of(request))
        return Response(status_code=204)

    return router
