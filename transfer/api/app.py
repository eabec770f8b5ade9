"""The REST front door (FastAPI): routes over the service layer, nothing else. Every error leaves as JSON
``{"error": {"code", "message", "status"}}`` with the status of its class in ``transfer.errors``. The application a
host serves (this plus the bindings and the web page, and the lifetime of the services) is assembled in
:mod:`transfer.hosts`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from storage.errors import StorageError
from transfer import __version__
from transfer.api.admin import add_admin_routes
from transfer.api.authorized import add_authorized_routes
from transfer.api.bundles import add_bundle_routes
from transfer.api.caller import caller_of
from transfer.api.chunked import add_chunked_routes
from transfer.api.direct import add_direct_routes
from transfer.api.hotpath import HotPath, LeanApp
from transfer.api.jobs import add_job_routes
from transfer.api.middleware import observability
from transfer.api.middleware.limits import ControlBodyLimit, HeaderLimit
from transfer.api.middleware.trust import BrowserPolicy, HostPolicy, TrustBoundary
from transfer.api.multipart import multipart_boundary, parse_form
from transfer.api.ownurls import serve_own_urls
from transfer.api.responses import AsciiJSONResponse
from transfer.api.resumable import EXPOSED_HEADERS as RESUMABLE_HEADERS
from transfer.api.resumable import add_resumable_routes, is_resumable_path, problem_response
from transfer.api.sessions import add_session_routes
from transfer.api.streaming import DownloadResponse, combined_headers, request_body
from transfer.api.tus import TusMiddleware, add_tus_routes
from transfer.core.auth import Authenticator, Scope
from transfer.core.content import DownloadMethod, FileRole, TransferMode, normalize_checksum
from transfer.core.digests import sha256_from_digest_field
from transfer.core.encodings import CODECS, coding_from_http, encoder_levels, storage_encoding
from transfer.core.lifecycle import parse_expires_in
from transfer.core.naming import filename_from_content_disposition
from transfer.core.numerals import parse_bounded, parse_count
from transfer.errors import (
    ClientDisconnected,
    InvalidRequest,
    TransferError,
    from_storage_error,
)
from transfer.service.container import Services
from transfer.service.files import LIST_DEFAULT, LIST_MAX
from transfer.service.ingest import UploadRequest
from transfer.service.progress import counted
from transfer.settings import Settings

log = logging.getLogger("transfer.api")

# Response header fields browser code may read from another origin (Fetch: CORS-unsafelisted response headers are
# hidden from script unless listed in Access-Control-Expose-Headers). Content-Length is safelisted by today's Fetch,
# listed anyway for older browsers. Every tus header the service sends (tus 1.0.0 core, creation, expiration,
# checksum, concatenation, creation-defer-length) is here: tus-js-client and Uppy read them to resume.
EXPOSED_HEADERS: tuple[str, ...] = (
    # downloads: ranges (RFC 9110 §14), validators (§8.8), integrity (RFC 9530), names, retry hints
    "accept-ranges",
    "content-range",
    "content-length",
    "content-encoding",
    "content-disposition",
    "etag",
    "last-modified",
    "repr-digest",
    "chunk-checksum",
    "retry-after",
    "x-request-id",  # the id to quote when reporting a failure (every answer carries it)
    # uploads: where the new resource is, and the codings a 415 would have accepted (RFC 9110 §15.5.16)
    "location",
    "accept-encoding",
    # tus 1.0.0
    "tus-resumable",
    "tus-version",
    "tus-extension",
    "tus-max-size",
    "tus-checksum-algorithm",
    "upload-offset",
    "upload-length",
    "upload-metadata",
    "upload-expires",
    "upload-concat",
    "upload-defer-length",
    "upload-file-id",
    # IETF resumable uploads (draft-ietf-httpbis-resumable-upload)
    *RESUMABLE_HEADERS,
)

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


def error_response(exc: TransferError) -> JSONResponse:
    return AsciiJSONResponse(exc.to_payload(), status_code=exc.status, headers=exc.headers or None)


def public_base_url(settings: Settings) -> Callable[[Request], str]:
    """Where descriptors point: the public URL, else the request's Host, which TrustBoundary has checked against
    the allow-list (a forged Host never reaches a route)."""

    def base_url(request: Request) -> str:
        return settings.public_url or str(request.base_url).rstrip("/")

    return base_url


def rest_app(
    services: Services,
    auth: Authenticator,
    *,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    """The REST front door over ``services``: its routes (files, sessions, bundles, tus, jobs), error handlers and
    the middleware every front door of the application shares (trust boundary, CORS, limits). It routes only: the
    other front doors and the lifetime of ``services`` are the host's (transfer.hosts.create_app)."""
    settings = services.settings
    service = services.files
    sessions = services.sessions
    tus = services.tus
    bearer = HTTPBearer(auto_error=False, description="an API key (`transfer keys new`)")

    def grant_for(request: Request, credentials: HTTPAuthorizationCredentials | None, scope: Scope) -> None:
        grant = auth.authorizer(None if credentials is None else f"Bearer {credentials.credentials}")
        grant(scope)
        request.state.grant = grant  # what the route's operations act as (see caller_of)

    def needs(scope: Scope) -> Any:
        """A route dependency: the request's API key must carry ``scope`` (open when no keys are configured)."""

        # a default, not an Annotated string: `bearer` is local to rest_app, out of reach of postponed annotations
        async def check(
            request: Request,
            credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
        ) -> None:
            grant_for(request, credentials, scope)

        return Depends(check)

    async def authorize(request: Request, scope: Scope) -> None:
        """What ``needs(scope)`` checks, for the lean path (the same bearer parsing, the same grant)."""
        grant_for(request, await bearer(request), scope)

    app = LeanApp(
        title="Agent large-content transfer service",
        version=__version__,
        description="Upload content once, hand agents a Synapse descriptor, resolve it anywhere: signed URLs with "
        "RFC 9110 ranges, SHA-256 verified end to end.",
        lifespan=lifespan,
        default_response_class=AsciiJSONResponse,
        docs_url=None,  # served by add_web_routes from local assets: the CDN defaults are blank offline
        redoc_url=None,
    )
    app.state.services = services
    serve_own_urls(services)  # its own signed URLs, fetched by itself (MCP resolve, A2A url parts), read in-process
    app.state.lifespan_contexts = []  # front doors that need to run something for the app's lifetime (MCP)

    @app.exception_handler(TransferError)
    async def _transfer_error(request: Request, exc: TransferError) -> Response:
        if is_resumable_path(request.url.path):  # that protocol's errors are RFC 9457 problem details
            return problem_response(exc)
        return error_response(exc)

    @app.exception_handler(StorageError)
    async def _storage_error(request: Request, exc: StorageError) -> Response:
        return await _transfer_error(request, from_storage_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        err = TransferError(str(exc.detail), headers=dict(exc.headers or {}))
        body = err.to_payload()
        body["error"].update(code=codes.get(exc.status_code, "http_error"), status=exc.status_code)
        return AsciiJSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return error_response(InvalidRequest("; ".join(problems) or "invalid request"))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(TransferError("internal error; see the server log"))

    base_url = public_base_url(settings)
    add_session_routes(app, sessions, service, base_url, needs)
    add_direct_routes(app, services.direct, service, base_url, needs)
    add_chunked_routes(app, services.chunks, service, base_url, needs)
    add_admin_routes(app, services, needs)
    add_bundle_routes(app, services.bundles, base_url, needs)
    add_tus_routes(app, tus, service, base_url, needs)
    add_resumable_routes(app, tus, service, base_url, needs)
    add_authorized_routes(app, services.authorizations, base_url)
    add_job_routes(app, services, base_url, needs)
    app.add_middleware(TusMiddleware)
    app.add_middleware(ControlBodyLimit, limit=settings.max_json_body)
    app.add_middleware(HeaderLimit, limit=settings.max_header_size)
    if settings.cors_allow_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=list(EXPOSED_HEADERS),
            max_age=600,
        )
    # outermost: no route, and no URL built from the Host, sees a request this refuses
    hosts = HostPolicy.build(settings.host, settings.public_url, settings.allowed_hosts)
    browsers = BrowserPolicy.build(settings.cors_allow_origins, settings.public_url)
    app.add_middleware(TrustBoundary, hosts=hosts, browsers=browsers)
    # outermost of all: metrics, the access log and X-Request-ID see every answer, refusals included
    watch = observability.install(app, settings, service.storage, needs)
    for sweep in services.maintenance():
        watch.expect_sweep(sweep.name, sweep.interval)

    @app.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

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
            name=name,
            content_type=options.content_type,
            role=options.role,
            description=options.description,
            checksum=declared_checksum,
            expected_size=options.size,
            store_encoding=storage_encoding(options.encoding),
            owner=caller_of(request).owner,
            expires_in=options.expires_in,
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
            req.hinted_type = (
                raw_type.strip() or None
            )  # a tool's default or the client's word: see resolve_content_type
            disposition = request.headers.get("content-disposition")
            if req.name is None and disposition:
                req.name = filename_from_content_disposition(disposition)
        job = None
        if options.job_id is not None:
            job = services.hub.open(options.job_id, "upload", owner=req.owner)
            job.start(req.name, options.size if options.size is not None else req.declared_length)
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
    @app.put("/v1/files", summary="The same as POST /v1/files", **upload_doc)
    @app.post(
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

    @app.put(
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

    @app.get(
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
        items = [(await service.describe(r, base_url(request), inline=False)).to_json() for r in page.records]
        return {"files": items, "next_cursor": page.next_cursor}

    @app.get(
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
        descriptor = await service.describe(
            record, base_url(request), download_method=download_method, ttl=ttl, inline=inline
        )
        return descriptor.to_json()

    @app.delete(
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
    @app.get("/v1/files/{file_id}/content", operation_id="download_get", **download_doc)
    @app.head("/v1/files/{file_id}/content", operation_id="download_head", **download_doc)
    @app.post("/v1/files/{file_id}/content", operation_id="download_post", **download_doc)
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

    # the data plane's lean path (transfer.api.hotpath): the same endpoints, without the framework per request
    app.hot_path = HotPath(
        app,
        observability=watch,
        authorize=authorize,
        upload_options=header_upload_options,
        trust=TrustBoundary(app, hosts, browsers),  # its checks only: the stack keeps its own for the rest
        header_limit=settings.max_header_size,
    )
    return app
