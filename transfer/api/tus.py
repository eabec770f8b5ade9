"""tus 1.0.0 front door at ``/tus/files`` and ``/tus/files/`` (both answered, never redirected: tus-js-client and
Uppy treat a 307 on creation as a failure), with core, creation, creation-with-upload, creation-defer-length,
checksum, termination, expiration, concatenation. A thin adapter over :class:`TusService`.

When an upload is complete, ``GET /tus/files/{id}`` serves the uploaded bytes as tusd does (RFC 9110 ranges and
conditionals, the same plan as signed downloads), or the file's Synapse ``FileContent`` descriptor to a request
that names ``Accept: application/json``; ``GET /tus/files/{id}/descriptor`` always answers the descriptor. Both are
for the upload's owner (or admin); other keys get 404. The last PATCH answers with ``Upload-File-Id``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transfer.api.caller import caller_of
from transfer.api.responses import AsciiJSONResponse
from transfer.api.streaming import DownloadResponse, combined_headers, request_body
from transfer.core.auth import Scope as AuthScope
from transfer.core.http.negotiation import explicitly_accepts
from transfer.core.model.encodings import encoder_levels
from transfer.core.numerals import parse_count
from transfer.errors import InvalidRequest, NotFound, TusVersionUnsupported, UnsupportedMediaType
from transfer.service.files.service import FileService
from transfer.service.uploads.tus import CHECKSUM_ALGORITHMS, TusService, encode_metadata, http_date

TUS_VERSION = "1.0.0"
EXTENSIONS = "creation,creation-with-upload,creation-defer-length,checksum,termination,expiration,concatenation"
OFFSET_TYPE = "application/offset+octet-stream"
PREFIX = "/tus/files"


class TusMiddleware:
    """For every ``/tus/`` request: ``X-HTTP-Method-Override`` (for clients that can only POST), the
    ``Tus-Resumable`` check (412 with ``Tus-Version``), and ``Tus-Resumable`` on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/tus/"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        override = headers.get("x-http-method-override")
        if override and scope["method"] == "POST":
            scope = {**scope, "method": override.upper()}
        method = scope["method"]
        if method not in ("OPTIONS", "GET") and headers.get("tus-resumable") != TUS_VERSION:
            err = TusVersionUnsupported(f"Tus-Resumable must be {TUS_VERSION}")
            response = AsciiJSONResponse(
                err.to_payload(), status_code=412, headers={"tus-version": TUS_VERSION, "tus-resumable": TUS_VERSION}
            )
            await response(scope, receive, send)
            return

        async def send_with_version(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"tus-resumable", b"1.0.0")]}
            await send(message)

        await self.app(scope, receive, send_with_version)


def _parse_checksum(value: str | None) -> tuple[str, bytes] | None:
    if not value:
        return None
    algorithm, _, digest = value.strip().partition(" ")
    if algorithm not in CHECKSUM_ALGORITHMS:
        raise InvalidRequest(
            f"unsupported checksum algorithm {algorithm[:40]!r}; use one of {sorted(CHECKSUM_ALGORITHMS)}"
        )
    try:
        return algorithm, base64.b64decode(digest.strip(), validate=True)
    except ValueError as exc:  # binascii.Error, or a non-ASCII character (plain ValueError)
        raise InvalidRequest("Upload-Checksum digest is not base64") from exc


def _non_negative(value: str | None, name: str) -> int | None:
    return None if value is None else parse_count(value, name)


def tus_router(
    tus: TusService,
    files: FileService,
    base_url: Callable[[Request], str],
    needs: Callable[[AuthScope], Any],
) -> APIRouter:
    router = APIRouter()
    settings = files.settings
    may_upload = [needs(AuthScope.UPLOAD)]

    def capability_headers() -> dict[str, str]:
        return {
            "tus-version": TUS_VERSION,
            "tus-extension": EXTENSIONS,
            "tus-max-size": str(settings.max_upload_size),
            "tus-checksum-algorithm": ",".join(sorted(CHECKSUM_ALGORITHMS)),
        }

    @router.options(PREFIX, tags=["tus"], summary="tus capabilities")
    @router.options(PREFIX + "/", include_in_schema=False)
    @router.options(PREFIX + "/{uid}", tags=["tus"], include_in_schema=False)
    async def tus_options() -> Response:
        return Response(status_code=204, headers=capability_headers())

    # the creation URL with and without its trailing slash: the README and tus clients' examples use the former
    @router.post(PREFIX + "/", dependencies=may_upload, status_code=201, include_in_schema=False)
    @router.post(
        PREFIX,
        dependencies=may_upload,
        status_code=201,
        tags=["tus"],
        summary="tus creation (+ with-upload, defer-length, concat); also at /tus/files/",
    )
    async def tus_create(
        request: Request,
        upload_length: Annotated[str | None, Header()] = None,
        upload_defer_length: Annotated[str | None, Header()] = None,
        upload_metadata: Annotated[str | None, Header()] = None,
        upload_concat: Annotated[str | None, Header()] = None,
        upload_checksum: Annotated[str | None, Header()] = None,
        content_type: Annotated[str | None, Header()] = None,
    ) -> Response:
        with_upload = (content_type or "").split(";")[0].strip() == OFFSET_TYPE  # tus §creation-with-upload
        upload, offset = await tus.create_from_request(
            length=_non_negative(upload_length, "Upload-Length"),
            defer_length=upload_defer_length,
            metadata=upload_metadata,
            concat=upload_concat,
            caller=caller_of(request),
            body=request_body(request) if with_upload else None,
            checksum=_parse_checksum(upload_checksum) if with_upload else None,
            body_pending=request.headers.get("expect", "").lower() == "100-continue",
        )
        headers = {
            "location": f"{base_url(request)}{PREFIX}/{upload.id}",
            "upload-expires": http_date(upload.expires_at),
        }
        if offset is not None:
            headers["upload-offset"] = str(offset)
        if upload.file_id:
            headers["upload-file-id"] = upload.file_id
        return Response(status_code=201, headers=headers)

    @router.head(PREFIX + "/{uid}", dependencies=may_upload, tags=["tus"], summary="tus offset")
    async def tus_head(request: Request, uid: str) -> Response:
        upload, offset = await tus.current(uid, caller_of(request))
        headers = {"cache-control": "no-store", "upload-expires": http_date(upload.expires_at)}
        headers["upload-offset"] = str(offset)
        if upload.length is None:
            headers["upload-defer-length"] = "1"
        else:
            headers["upload-length"] = str(upload.length)
        if upload.metadata:
            headers["upload-metadata"] = encode_metadata(upload.metadata)
        if upload.concat == "partial":
            headers["upload-concat"] = "partial"
        elif upload.concat == "final":
            headers["upload-concat"] = "final;" + " ".join(f"{PREFIX}/{p}" for p in upload.parts)
        return Response(status_code=200, headers=headers)

    @router.patch(
        PREFIX + "/{uid}", dependencies=may_upload, status_code=204, tags=["tus"], summary="tus append at Upload-Offset"
    )
    async def tus_patch(
        request: Request,
        uid: str,
        upload_offset: Annotated[str | None, Header()] = None,
        upload_checksum: Annotated[str | None, Header()] = None,
        upload_length: Annotated[str | None, Header()] = None,
        content_type: Annotated[str | None, Header()] = None,
    ) -> Response:
        if (content_type or "").split(";")[0].strip() != OFFSET_TYPE:
            raise UnsupportedMediaType(f"PATCH needs Content-Type: {OFFSET_TYPE}")
        offset = _non_negative(upload_offset, "Upload-Offset")
        if offset is None:
            raise InvalidRequest("PATCH needs Upload-Offset")
        upload, new_offset = await tus.append(
            uid,
            offset,
            request_body(request),
            caller_of(request),
            checksum=_parse_checksum(upload_checksum),
            declare_length=_non_negative(upload_length, "Upload-Length"),
            body_length=_non_negative(request.headers.get("content-length"), "Content-Length"),
        )
        headers = {"upload-offset": str(new_offset), "upload-expires": http_date(upload.expires_at)}
        if upload.file_id:
            headers["upload-file-id"] = upload.file_id
        return Response(status_code=204, headers=headers)

    @router.delete(PREFIX + "/{uid}", dependencies=may_upload, status_code=204, tags=["tus"], summary="tus termination")
    async def tus_delete(request: Request, uid: str) -> Response:
        await tus.terminate(uid, caller_of(request))
        return Response(status_code=204)

    async def finished_file(request: Request, uid: str) -> str:
        upload, _ = await tus.current(uid, caller_of(request), allow_ended=True)
        if not upload.file_id:
            raise NotFound(f"upload {uid} is not finished yet")
        return upload.file_id

    async def descriptor(request: Request, uid: str) -> Response:
        caller = caller_of(request)
        record = await files.record(await finished_file(request, uid), caller)
        body = await files.describe_json(record, base_url(request), inline=False)
        return AsciiJSONResponse(body, headers={"cache-control": "no-store"})

    read_doc: dict[str, Any] = dict(dependencies=[needs(AuthScope.READ)], tags=["tus"], response_class=Response)

    @router.get(
        PREFIX + "/{uid}",
        summary="The bytes of a finished tus upload (ranges); its descriptor with Accept: application/json",
        responses={
            200: {"description": "the uploaded bytes, or the FileContent descriptor"},
            206: {"description": "one range, or multipart/byteranges"},
            404: {"description": "no such upload for this key, or not finished yet"},
        },
        **read_doc,
    )
    async def tus_get(request: Request, uid: str) -> Response:
        # RFC 9110 §12.5.1: proactive negotiation; caches must keep the two representations apart (§12.5.5)
        if explicitly_accepts(request.headers.get("accept"), "application/json"):
            response = await descriptor(request, uid)
        else:
            file_id = await finished_file(request, uid)
            download = await files.open_owned(file_id, "GET", combined_headers(request), caller_of(request))
            response = DownloadResponse(download, encoder_levels(settings))
        vary = [v for k, v in response.headers.items() if k == "vary"]
        del response.headers["vary"]
        response.headers["vary"] = ", ".join([*vary, "accept"])
        return response

    @router.get(
        PREFIX + "/{uid}/descriptor",
        summary="The FileContent descriptor of a finished tus upload (whatever Accept says)",
        **read_doc,
    )
    async def tus_descriptor(request: Request, uid: str) -> Response:
        return await descriptor(request, uid)

    return router
