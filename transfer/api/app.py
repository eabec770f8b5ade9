"""The REST front door (FastAPI): routes over the service layer, nothing else. Every error leaves as JSON
``{"error": {"code", "message", "status"}}`` with the status of its class in ``transfer.errors``. The application a
host serves (this plus the bindings and the web page, and the lifetime of the services) is assembled in
:mod:`transfer.hosts`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.routing import iter_route_contexts
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from storage.errors import StorageError
from transfer import __version__
from transfer.api.admin import admin_router
from transfer.api.authorized import authorized_router
from transfer.api.bundles import bundles_router
from transfer.api.chunked import chunked_router
from transfer.api.direct import direct_router
from transfer.api.events import events_router
from transfer.api.files import files_router, header_upload_options
from transfer.api.health import health_router, observability_router
from transfer.api.hotpath import HotPath, LeanApp
from transfer.api.identity import identity_router
from transfer.api.jobs import jobs_router
from transfer.api.middleware import observability
from transfer.api.middleware.limits import ControlBodyLimit, HeaderLimit
from transfer.api.middleware.trust import BrowserPolicy, HostPolicy, TrustBoundary
from transfer.api.ownurls import serve_own_urls
from transfer.api.responses import AsciiJSONResponse
from transfer.api.resumable import EXPOSED_HEADERS as RESUMABLE_HEADERS
from transfer.api.resumable import is_resumable_path, problem_response, resumable_router
from transfer.api.sessions import sessions_router
from transfer.api.tus import TusMiddleware, tus_router
from transfer.core.auth import Scope
from transfer.errors import InvalidRequest, JsonTooDeep, TransferError, from_storage_error
from transfer.service.container import Services
from transfer.service.identity.directory import Identities
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


def build_routes(app: FastAPI) -> None:
    """Build every route of ``app``'s included routers now, at construction. FastAPI (0.165) builds an included
    router's routes (their dependencies, parameter and body fields, through pydantic) on the first request that
    reaches them, and two applications in one process (replicas in a test, MCP stdio beside HTTP) that receive
    their first requests at once, on two threads, build pydantic schemas of the same types at once: pydantic then
    fails (``AttributeError: __pydantic_core_schema__``) and the request answers 500. Built here, on the thread
    that builds the application, no request builds anything. Call it again after including more routers."""
    for _ in iter_route_contexts(app.routes):
        pass


def error_response(exc: TransferError) -> JSONResponse:
    return AsciiJSONResponse(exc.to_payload(), status_code=exc.status, headers=exc.headers or None)


def public_base_url(settings: Settings) -> Callable[[Request], str]:
    """Where descriptors point: the public URL, else the request's Host, which TrustBoundary has checked against
    the allow-list (a forged Host never reaches a route)."""

    known: dict[tuple[Any, ...], str] = {}  # (scheme, server, root path, Host) -> the base URL they make

    def base_url(request: Request) -> str:
        if settings.public_url:
            return settings.public_url
        scope = request.scope
        root = scope.get("app_root_path", scope.get("root_path", ""))
        server = scope.get("server")  # ASGI: a two-item iterable; uvicorn gives a tuple, Starlette's TestClient a list
        key = (scope["scheme"], None if server is None else tuple(server), root, request.headers.get("host"))
        found = known.get(key)
        if found is None:  # Starlette's URL parsing, once per Host (the allow-list bounds how many there are)
            if len(known) > 1024:
                known.clear()
            found = known[key] = str(request.base_url).rstrip("/")
        return found

    return base_url


def rest_app(
    services: Services,
    auth: Identities,
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
    bearer = HTTPBearer(
        auto_error=False, description="an API key (`transfer keys create`) or an OAuth access token for this service"
    )

    async def grant_for(request: Request, credentials: HTTPAuthorizationCredentials | None, scope: Scope) -> None:
        grant = await auth.grant(None if credentials is None else f"Bearer {credentials.credentials}")
        grant(scope)
        request.state.grant = grant  # what the route's operations act as (see caller_of)

    def needs(scope: Scope) -> Any:
        """A route dependency: the request's API key must carry ``scope`` (open when no keys are configured)."""

        # a default, not an Annotated string: `bearer` is local to rest_app, out of reach of postponed annotations
        async def check(
            request: Request,
            credentials: HTTPAuthorizationCredentials | None = Depends(bearer),  # noqa: B008
        ) -> None:
            await grant_for(request, credentials, scope)

        return Depends(check)

    async def authorize(request: Request, scope: Scope) -> None:
        """What ``needs(scope)`` checks, for the lean path (the same bearer parsing, the same grant)."""
        await grant_for(request, await bearer(request), scope)

    app = LeanApp(
        title="Agent large-content transfer service",
        version=__version__,
        description="Upload content once, hand agents a Synapse descriptor, resolve it anywhere: signed URLs with "
        "RFC 9110 ranges, SHA-256 verified end to end.",
        lifespan=lifespan,
        default_response_class=AsciiJSONResponse,
        docs_url=None,  # served by transfer.web.web_router from local assets: the CDN defaults are blank offline
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
        if exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
            # FastAPI's own body parsing (json.loads) ran out of stack on nested JSON: the code every door gives it
            return error_response(JsonTooDeep("JSON nested too deeply to parse"))
        # FastAPI raises 400 only when a JSON body does not parse
        codes = {400: "malformed_body", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
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
    app.include_router(sessions_router(sessions, service, base_url, needs))
    app.include_router(direct_router(services.direct, service, base_url, needs))
    app.include_router(chunked_router(services.chunks, service, base_url, needs))
    app.include_router(admin_router(services, needs))
    app.include_router(identity_router(auth, needs))
    app.include_router(events_router(services, needs))
    app.include_router(bundles_router(services.bundles, base_url, needs))
    app.include_router(tus_router(tus, service, base_url, needs))
    app.include_router(resumable_router(tus, service, base_url, needs))
    app.include_router(authorized_router(services.authorizations, base_url))
    app.include_router(jobs_router(services, base_url, needs))
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
    watch = observability.install(app, settings, service.storage)
    app.include_router(observability_router(watch, needs))
    for sweep in services.maintenance():
        watch.expect_sweep(sweep.name, sweep.interval)
    app.include_router(health_router())
    app.include_router(files_router(services, base_url, needs))

    # the data plane's lean path (transfer.api.hotpath): the same endpoints, without the framework per request
    app.hot_path = HotPath(
        app,
        observability=watch,
        authorize=authorize,
        upload_options=header_upload_options,
        trust=TrustBoundary(app, hosts, browsers),  # its checks only: the stack keeps its own for the rest
        header_limit=settings.max_header_size,
        vary_origin=bool(settings.cors_allow_origins),
    )
    build_routes(app)
    return app
