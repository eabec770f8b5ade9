"""The files resource of the REST front door: upload (POST/PUT ``/v1/files``, PUT ``/v1/files/{name}``), list,
describe, delete, and the signed-URL download (``/v1/files/{file_id}/content``), as one router. The options an
upload takes (query parameters and header fields) are read here too, for the lean path's uploads as well."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request
from fastapi.responses import Response

from transfer.api.caller import caller_of
from transfer.api.multipart import multipart_boundary, parse_form
from transfer.api.streaming import DownloadResponse, combined_headers, request_body
from transfer.core.auth import Scope
from transfer.core.http.digests import sha256_from_digest_field
from transfer.core.model.content import DownloadMethod, FileRole, TransferMode, normalize_checksum
from transfer.core.model.encodings import CODECS, coding_from_http, encoder_levels, storage_encoding
from transfer.core.model.naming import filename_from_content_disposition
from transfer.core.numerals import parse_bounded, parse_count
from transfer.core.uploads.lifetimes import parse_expires_in
from transfer.core.uploads.state import FileIntent
from transfer.errors import ClientDisconnected, InvalidRequest, TransferError
from transfer.service.container import Services
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.service import LIST_DEFAULT, LIST_MAX
from transfer.service.jobs.progress import counted

ERROR_SCHEMA: dict[str, Any] = {
    "description": "error",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {
                    "error": {
                        "type": "object",
                        "properties": {
                            "code": {"type": "string"},
                            "message": {"type": "string"},
                            "status": {"type": "integer"},
                            "detail": {"type": "object"},
                        },
                        "required": ["code", "message", "status"],
                    }
                },
            }
        }
    },
}


@dataclass(frozen=True, slots=True)
class UploadOptions:
    """The query parameters and header fields of an upload, whichever route received it."""

    content_type: str | None
    role: FileRole | None
    description: str | None
    checksum: str | None
    size: int | None
    encoding: str
    download_method: DownloadMethod | None
    ttl: int | None
    inline: bool | None
    job_id: str | None
    content_encoding: str | None
    content_digest: str | None
    repr_digest: str | None
    expires_in: int | None = None


async def upload_options(  # async: FastAPI runs a plain def dependency on a worker thread, a hop per upload
    content_type: Annotated[
        str | None, Query(max_length=255, description="media type (else Content-Type; else sniffed)")
    ] = None,
    role: FileRole | None = None,
    description: Annotated[str | None, Query(max_length=4096)] = None,
    checksum: Annotated[str | None, Query(description="sha256:<hex> of the original bytes, verified")] = None,
    size: Annotated[int | None, Query(ge=0, description="original size in bytes, verified")] = None,
    encoding: Annotated[
        str, Query(description=f"how to store and serve it: {', '.join(CODECS.storage_names())}")
    ] = "none",
    download_method: DownloadMethod | None = None,
    ttl: Annotated[int | None, Query(gt=0, description="seconds the signed URL lives (max 7 days)")] = None,
    inline: Annotated[bool | None, Query(description="force inline (only up to the threshold) or url mode")] = None,
    job_id: Annotated[
        str | None,
        Query(
            pattern=r"^[A-Za-z0-9_-]{8,64}$",
            description="your id for this upload; follow it at /v1/jobs/{job_id}/events (open that first)",
        ),
    ] = None,
    content_encoding: Annotated[str | None, Header()] = None,
    content_digest: Annotated[str | None, Header()] = None,
    repr_digest: Annotated[str | None, Header()] = None,
    expires_in: Annotated[
        str | None,
        Query(max_length=20, description="seconds the file lives; above the key's or service's maximum: 400"),
    ] = None,
    expires_in_header: Annotated[
        str | None, Header(alias="expires-in", description="the same as the expires_in query parameter")
    ] = None,
) -> UploadOptions:
    """A route dependency: the upload options both upload routes take."""
    lifetime = parse_expires_in(expires_in)
    from_header = parse_expires_in(expires_in_header, "Expires-In")
    if lifetime is not None and from_header is not None and lifetime != from_header:
        raise InvalidRequest("the expires_in query parameter and the Expires-In header field disagree")
    return UploadOptions(
        content_type,
        role,
        description,
        checksum,
        size,
        encoding,
        download_method,
        ttl,
        inline,
        job_id,
        content_encoding,
        content_digest,
        repr_digest,
        lifetime if lifetime is not None else from_header,
    )


async def header_upload_options(request: Request) -> UploadOptions:
    """:func:`upload_options` of a request whose query names no option (the lean path's uploads): from the header
    fields only, through the same function."""
    headers = request.headers
    return await upload_options(
        content_encoding=headers.get("content-encoding"),
        content_digest=headers.get("content-digest"),
        repr_digest=headers.get("repr-digest"),
        expires_in_header=headers.get("expires-in"),
    )


def files_router(services: Services, base_url: Callable[[Request], str], needs: Callable[[Scope], Any]) -> APIRouter:
    """The files endpoints over ``services.files``, as a router for the application to include."""
    router = APIRouter()
    settings = services.settings
    service = services.files

    upload_doc: dict[str, Any] = dict(
        dependencies=[needs(Scope.UPLOAD)],
        status_code=201,
        tags=["files"],
        responses={400: ERROR_SCHEMA, 413: ERROR_SCHEMA, 415: ERROR_SCHEMA, 422: ERROR_SCHEMA, 507: ERROR_SCHEMA},
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "file": {"type": "string", "format": "binary"},
                                "name": {"type": "string"},
                                "content_type": {"type": "string"},
                                "role": {"type": "string", "enum": [r.value for r in FileRole]},
                                "description": {"type": "string"},
                                "checksum": {"type": "string"},
                            },
                            "required": ["file"],
                        }
                    },
                },
            }
        },
    )

    async def receive_upload(
        request: Request, response: Response, options: UploadOptions, name: str | None
    ) -> dict[str, Any]:
        """The one upload path of the HTTP front door (POST ``/v1/files`` and PUT ``/v1/files/{name}``): streams
        the body to storage, hashing it on the way; nothing is published unless it verifies."""
        try:
            declared_checksum = normalize_checksum(options.checksum) if options.checksum else None
        except ValueError as exc:
            raise InvalidRequest(f"checksum: {exc}") from exc
        req = UploadRequest(
            intent=FileIntent(
                name=name,
                content_type=options.content_type,
                role=options.role,
                description=options.description,
                lifetime=options.expires_in,
            ),
            checksum=declared_checksum,
            expected_size=options.size,
            store_encoding=storage_encoding(options.encoding),
            owner=caller_of(request).owner,
        )
        if options.content_encoding:
            req.body_encoding = coding_from_http(options.content_encoding)
        for field in (options.content_digest, options.repr_digest):
            if field:
                sha = sha256_from_digest_field(field)
                if sha is not None:
                    if req.body_sha256 is not None and req.body_sha256 != sha:
                        raise InvalidRequest("Content-Digest and Repr-Digest disagree")
                    req.body_sha256 = sha
        length = request.headers.get("content-length")
        if length is not None:
            req.declared_length = parse_count(length, "Content-Length")
        raw_type = request.headers.get("content-type", "")
        boundary = multipart_boundary(raw_type) if raw_type else None
        stream = request_body(request, decodes=True)  # Content-Encoding was read above
        form = None
        if boundary is not None:
            form, stream = parse_form(stream, boundary)
            req.declared_length = None  # the length covers the form framing, not the file
            if req.body_sha256 is not None:
                raise InvalidRequest("digest fields cover the whole multipart body; send 'checksum' instead")
        else:
            # a tool's default or the client's word: see resolve_content_type
            req.intent = replace(req.intent, hinted_type=raw_type.strip() or None)
            disposition = request.headers.get("content-disposition")
            if req.intent.name is None and disposition:
                req.intent = replace(req.intent, name=filename_from_content_disposition(disposition))
        job = None
        if options.job_id is not None:
            job = services.hub.open(options.job_id, "upload", owner=req.owner)
            job.start(req.intent.name, options.size if options.size is not None else req.declared_length)
            stream = counted(stream, job)
        try:
            # Expect: 100-continue (RFC 9110 §10.1.1): no byte is asked for until the service reads the body, so
            # content the key already stores (declared by checksum + size) is answered 201 before the body
            waits = request.headers.get("expect", "").lower() == "100-continue"
            record = await service.upload(
                stream, req, with_body=None if form is None else form.apply, body_pending=waits and form is None
            )
            response.headers["location"] = f"/v1/files/{record.id}"
            descriptor = await service.describe(
                record,
                base_url(request),
                download_method=options.download_method,
                ttl=options.ttl,
                inline=options.inline,
            )
        except BaseException as exc:  # the job must end whatever happened (cancelled: the client went away)
            if job is not None:
                job.fail(exc if isinstance(exc, TransferError) else ClientDisconnected("upload interrupted"))
                if isinstance(exc, TransferError):
                    await job.settled()  # the answer comes once every replica can read the job's end
            raise
        if job is not None:
            # the job (kept, replayed, journalled for other replicas) holds no bytes of the file: a URL, which
            # stops working when the file is deleted or expires
            kept = descriptor
            if descriptor.type is TransferMode.INLINE:
                kept = await service.describe(record, base_url(request), ttl=options.ttl, inline=False)
            job.succeed({"file_id": record.id, "descriptor": kept.to_json()})
            await job.settled()
        return descriptor.to_json()

    # PUT on the collection too: `curl -T file http://host/v1/files` names no file, so curl sends exactly that
    @router.put("/v1/files", summary="The same as POST /v1/files", **upload_doc)
    @router.post(
        "/v1/files",
        summary="Upload content (raw body or multipart/form-data); returns a Synapse FileContent descriptor",
        **upload_doc,
    )
    async def upload(
        request: Request,
        response: Response,
        options: Annotated[UploadOptions, Depends(upload_options)],
        name: Annotated[str | None, Query(max_length=1024, description="file name (else Content-Disposition)")] = None,
    ) -> dict[str, Any]:
        """Metadata comes from query parameters; for raw bodies also from `Content-Type` and
        `Content-Disposition: attachment; filename*=UTF-8''…`; for multipart bodies from the file part and the
        form fields. `Content-Digest`/`Repr-Digest` (RFC 9530, sha-256) are verified against the body as sent;
        `checksum` against the original bytes. A body with `Content-Encoding` is decoded while streaming. Nothing
        is published unless it verifies."""
        return await receive_upload(request, response, options, name)

    @router.put(
        "/v1/files/{name}",
        summary="Upload content named by the path (`curl -T file URL/`); the same as POST /v1/files?name=…",
        **upload_doc,
    )
    async def upload_put(
        request: Request,
        response: Response,
        name: Annotated[str, Path(max_length=1024, description="file name (a label: the file gets a new id)")],
        options: Annotated[UploadOptions, Depends(upload_options)],
    ) -> dict[str, Any]:
        """The upload of POST /v1/files with the file name in the path, as `curl -T`, `wget --method=PUT` and
        HTTPie send it. Each PUT stores a new file and answers 201 with its descriptor and `Location`
        (RFC 9110 §9.3.4): names only label content, so the same name never overwrites another file."""
        return await receive_upload(request, response, options, name)

    @router.get(
        "/v1/files",
        dependencies=[needs(Scope.READ)],
        tags=["files"],
        summary="List stored files as descriptors (url mode, fresh signed URLs)",
    )
    async def list_files(
        request: Request,
        limit: Annotated[
            str | None, Query(max_length=20, description=f"page size, 1 to {LIST_MAX} (default {LIST_DEFAULT})")
        ] = None,
        cursor: Annotated[
            str | None, Query(max_length=200, description="the `next_cursor` of the previous page (opaque)")
        ] = None,
    ) -> dict[str, Any]:
        """A page of the caller's files (all files for admin) in a stable order (by file id), with `next_cursor`
        to fetch the next page (null after the last). A cursor this service did not hand out is a 400
        `invalid_cursor`."""
        size = LIST_DEFAULT if limit is None else parse_bounded(limit, "limit", low=1, high=LIST_MAX)
        page = await service.list(caller_of(request), size, cursor)
        origin = base_url(request)
        items = [await service.describe_json(r, origin, inline=False) for r in page.records]
        return {"files": items, "next_cursor": page.next_cursor}

    @router.get(
        "/v1/files/{file_id}",
        dependencies=[needs(Scope.READ)],
        tags=["files"],
        summary="A fresh descriptor for a stored file",
        responses={404: ERROR_SCHEMA},
    )
    async def describe(
        request: Request,
        file_id: str,
        download_method: DownloadMethod | None = None,
        ttl: Annotated[int | None, Query(gt=0)] = None,
        inline: bool | None = None,
    ) -> dict[str, Any]:
        record = await service.record(file_id, caller_of(request))
        return await service.describe_json(
            record, base_url(request), download_method=download_method, ttl=ttl, inline=inline
        )

    @router.delete(
        "/v1/files/{file_id}",
        dependencies=[needs(Scope.ADMIN)],
        status_code=204,
        tags=["files"],
        responses={404: ERROR_SCHEMA},
    )
    async def delete(request: Request, file_id: str) -> Response:
        await service.delete(file_id, caller_of(request))
        return Response(status_code=204)

    download_doc: dict[str, Any] = dict(
        tags=["files"],
        summary="Download through a signed URL (RFC 9110: ranges, conditionals, HEAD)",
        response_class=Response,
        responses={
            200: {"description": "the content", "content": {"application/octet-stream": {}}},
            206: {"description": "one range, or multipart/byteranges"},
            304: {"description": "not modified"},
            403: ERROR_SCHEMA,
            404: ERROR_SCHEMA,
            412: ERROR_SCHEMA,
            416: ERROR_SCHEMA,
        },
    )

    # one route per method, so that each has its own OpenAPI operation id
    @router.get("/v1/files/{file_id}/content", operation_id="download_get", **download_doc)
    @router.head("/v1/files/{file_id}/content", operation_id="download_head", **download_doc)
    @router.post("/v1/files/{file_id}/content", operation_id="download_post", **download_doc)
    async def content(
        request: Request,
        file_id: str,
        exp: Annotated[str, Query(description="expiry, Unix seconds (signed)")] = "",
        kid: Annotated[str, Query(description="signing key id (signed)")] = "",
        sig: Annotated[str, Query(description="HMAC-SHA256 signature")] = "",
    ) -> Response:
        download = await service.open_download(
            file_id,
            request.method,
            request.url.query,
            combined_headers(request),
            raw_path=request.scope.get("raw_path"),
        )
        return DownloadResponse(download, encoder_levels(settings))

    return router
