"""The lean path: the data-plane requests (uploads, signed downloads, tus PATCH/HEAD, session chunk PUTs) served
without FastAPI's routing, dependency solving and middleware stack.

Small requests spent most of their server CPU in the framework, not in the service: a 4 KiB upload went through
fourteen ASGI layers and a dependency solve before the service saw a byte. Here :class:`ObservabilityMiddleware`
(which every request passes once anyway: request id, metrics, access log, in-flight set) asks :meth:`HotPath.match`
whether the request is one of these routes *and* passes every check the stack would run on it — the trust boundary
(Host allow-list, cross-site refusal), the header-size limit, tus's ``Tus-Resumable`` — each run once, here. Then it
calls the route's own endpoint (the same function FastAPI calls, so the same service-layer calls and the same owner
and scope checks) with its parameters read from the request exactly as FastAPI would read them, and answers errors
through the application's own exception handlers (the same error JSON).

Anything else goes the full way, unchanged: a request that some check refuses (the stack answers the refusal), one
from a browser (``Origin``: CORS is the stack's), one whose parameters would need the framework's validation
(upload options in the query beyond ``name`` and ``inline``, a non-decimal chunk index) — so no error message of
the API can differ between the two paths. The lean path is an optimisation of requests that succeed at the HTTP
layer, never a second API.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transfer.api.middleware.observability import Observability, ObservabilityMiddleware
from transfer.api.middleware.trust import TrustBoundary
from transfer.api.responses import AsciiJSONResponse
from transfer.api.tus import PREFIX as TUS_PREFIX
from transfer.api.tus import TUS_VERSION
from transfer.core.auth import Scope as KeyScope
from transfer.service.events.hook import CLIENT_ADDRESS

Authorize = Callable[[Request, KeyScope], Awaitable[None]]
UploadOptionsOf = Callable[[Request], Awaitable[Any]]

_DECIMAL_RE = re.compile(r"[0-9]{1,18}")  # what the framework's int parsing turns into the same int
_NAME_MAX = 1024  # the upload routes' name limit (Query/Path max_length)
_BOOLEANS = {"true": True, "false": False, "1": True, "0": False}  # a subset of what pydantic reads as a bool
_TUS_ITEM = TUS_PREFIX + "/"
_HANDLER = "transfer.lean_handler"  # the scope key LeanApp hands the matched handler on with


class LeanApp(FastAPI):
    """FastAPI with the lean path in front of its middleware stack: a request :attr:`hot_path` matches goes through
    the observability middleware (request id, metrics, access log, in-flight set) straight to its endpoint; any
    other request takes the whole stack as before."""

    hot_path: HotPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        CLIENT_ADDRESS.set(str(client[0]) if client else None)  # what the pre-upload hook is told (every request)
        hot = self.hot_path
        if hot is not None:
            handler = hot.match(scope)
            if handler is not None:
                scope["app"] = self
                scope[_HANDLER] = handler
                await hot.observed(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _run_matched(scope: Scope, receive: Receive, send: Send) -> None:
    await scope.pop(_HANDLER)(scope, receive, send)


class HotPath:
    """Finds and serves the lean routes of one application (see the module docstring)."""

    def __init__(
        self,
        app: FastAPI,
        *,
        observability: Observability,
        authorize: Authorize,
        upload_options: UploadOptionsOf,
        trust: TrustBoundary,
        header_limit: int,
        vary_origin: bool = False,
    ) -> None:
        self.app = app
        self.observed = ObservabilityMiddleware(_run_matched, observability)
        self.authorize = authorize
        self.upload_options = upload_options
        self.trust = trust
        self.header_limit = header_limit
        self.vary_origin = vary_origin  # CORS is configured: its middleware adds Vary: Origin to every answer
        routes: dict[tuple[str, str], APIRoute] = {}
        for context in iter_route_contexts(app.routes):  # the routes of the included routers too
            route = context.original_route
            if isinstance(route, APIRoute):
                for method in route.methods or ():
                    routes.setdefault((method, route.path), route)
        self.routes = routes

    def match(self, scope: Scope) -> ASGIApp | None:
        """The lean handler of this request, or None: then the full application serves it."""
        if scope["type"] != "http" or scope.get("root_path"):
            return None
        method: str = scope["method"]
        path: str = scope["path"]
        query: bytes = scope.get("query_string", b"")
        found: tuple[APIRoute, dict[str, str], Callable[[Request, APIRoute, dict[str, str]], Awaitable[Any]]] | None
        found = None
        if path.startswith("/v1/files"):
            rest = path[len("/v1/files") :]
            if rest == "" and method in ("POST", "PUT"):
                plain, name, inline = _upload_query(query)
                if plain:
                    params = {} if name is None else {"name": name}
                    if inline is not None:
                        params["inline"] = "true" if inline else "false"
                    found = (self.routes[(method, "/v1/files")], params, self._upload)
            elif rest.startswith("/"):
                rest = rest[1:]
                if method == "PUT" and rest and "/" not in rest and len(rest) <= _NAME_MAX and not query:
                    found = (self.routes[("PUT", "/v1/files/{name}")], {"name": rest}, self._upload)
                elif method in ("GET", "HEAD", "POST") and rest.endswith("/content"):
                    file_id = rest[: -len("/content")]
                    if file_id and "/" not in file_id:
                        route = self.routes[(method, "/v1/files/{file_id}/content")]
                        found = (route, {"file_id": file_id}, self._download)
        elif path.startswith(_TUS_ITEM) and method in ("PATCH", "HEAD"):
            uid = path[len(_TUS_ITEM) :]
            if uid and "/" not in uid:
                found = (self.routes[(method, TUS_PREFIX + "/{uid}")], {"uid": uid}, self._tus)
        elif path.startswith("/v1/sessions/") and method == "PUT":
            parts = path.split("/")  # "", v1, sessions, sid, chunks, index
            if len(parts) == 6 and parts[3] and parts[4] == "chunks" and _DECIMAL_RE.fullmatch(parts[5]):
                route = self.routes[("PUT", "/v1/sessions/{sid}/chunks/{index}")]
                found = (route, {"sid": parts[3], "index": parts[5]}, self._chunk)
        if found is None or not self._passes_checks(scope):
            return None
        route, params, handler = found

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            await self._serve(scope, receive, send, route, params, handler)

        return serve

    def _passes_checks(self, scope: Scope) -> bool:
        """The checks of the middleware stack, once: the lean path takes only what they let through."""
        size = 0
        tus = scope["path"].startswith(_TUS_ITEM)
        resumable = None
        for name, value in scope["headers"]:
            size += len(name) + len(value) + 4
            if name == b"origin":
                return False  # a browser's request: CORS and the cross-site rules are the stack's
            elif name == b"content-length" and not _DECIMAL_RE.fullmatch(value.decode("latin-1")):
                return False  # the framework's int parsing would answer it
            elif tus and name == b"tus-resumable":
                resumable = value  # the last one, as TusMiddleware reads it
        if size > self.header_limit:
            return False
        if tus and resumable != TUS_VERSION.encode("ascii"):
            return False
        return self.trust.refusal(scope) is None

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: APIRoute,
        params: dict[str, str],
        handler: Callable[[Request, APIRoute, dict[str, str]], Awaitable[Any]],
    ) -> None:
        # what Starlette's application and router would have put in the scope
        scope["app"] = self.app
        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = params
        request = Request(scope, receive, send)
        outer = send  # where Starlette's outermost layer (ServerErrorMiddleware) answers an unexpected error
        if self.vary_origin:
            send = _with_vary_origin(send)
        if route.path.startswith(TUS_PREFIX):
            send = _with_tus_version(send)
        try:
            response = await handler(request, route, params)
        except Exception as exc:
            handled = self._handler_of(exc)
            if handled is None:  # the stack's ServerErrorMiddleware: its answer, then the error goes on up
                unexpected = self.app.exception_handlers.get(Exception)
                if unexpected is not None:
                    await (await unexpected(request, exc))(scope, receive, outer)  # type: ignore[misc]
                raise
            response = await handled(request, exc)
        await response(scope, receive, send)

    def _handler_of(self, exc: Exception) -> Callable[[Request, Exception], Awaitable[Response]] | None:
        """The exception handler the stack's ExceptionMiddleware would give ``exc`` (Starlette's lookup: by the
        class's MRO), or None when only the outermost handler of ``Exception`` would answer it."""
        handlers = self.app.exception_handlers
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            found = handlers.get(cls)
            if found is not None:
                return found  # type: ignore[return-value]  # ours are all async
        return None

    # --- the routes: parameters as FastAPI reads them, then the route's own endpoint ---

    async def _upload(self, request: Request, route: APIRoute, params: dict[str, str]) -> Response:
        await self.authorize(request, KeyScope.UPLOAD)
        options = await self.upload_options(request)
        if "inline" in params:
            options = dataclasses.replace(options, inline=params["inline"] == "true")
        sub = _HeaderFields()
        content = await route.endpoint(request=request, response=sub, options=options, name=params.get("name"))
        response = AsciiJSONResponse(content, status_code=route.status_code or 200)
        response.raw_headers.extend(sub.raw_headers)  # as FastAPI adds the endpoint's (Location)
        return response

    async def _download(self, request: Request, route: APIRoute, params: dict[str, str]) -> Response:
        response: Response = await route.endpoint(request=request, file_id=params["file_id"])
        return response

    async def _tus(self, request: Request, route: APIRoute, params: dict[str, str]) -> Response:
        await self.authorize(request, KeyScope.UPLOAD)
        headers = request.headers
        if request.method == "HEAD":
            response: Response = await route.endpoint(request=request, uid=params["uid"])
            return response
        response = await route.endpoint(
            request=request,
            uid=params["uid"],
            upload_offset=headers.get("upload-offset"),
            upload_checksum=headers.get("upload-checksum"),
            upload_length=headers.get("upload-length"),
            content_type=headers.get("content-type"),
        )
        return response

    async def _chunk(self, request: Request, route: APIRoute, params: dict[str, str]) -> Response:
        await self.authorize(request, KeyScope.UPLOAD)
        headers = request.headers
        length = headers.get("content-length")
        response: Response = await route.endpoint(
            request=request,
            sid=params["sid"],
            index=int(params["index"]),
            chunk_checksum=headers.get("chunk-checksum"),
            content_digest=headers.get("content-digest"),
            content_length=int(length) if length is not None and _DECIMAL_RE.fullmatch(length) else None,
        )
        return response


def _upload_query(query: bytes) -> tuple[bool, str | None, bool | None]:
    """(True, ``name``, ``inline``) of an upload's query that holds at most those two, each once, in spellings the
    framework reads the same way; (False, None, None) when it holds anything else (the framework then reads and
    validates it)."""
    if not query:
        return True, None, None
    name: str | None = None
    inline: bool | None = None
    seen: set[str] = set()
    for key, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if key in seen:
            return False, None, None
        seen.add(key)
        if key == "name" and len(value) <= _NAME_MAX:
            name = value
        elif key == "inline" and value in _BOOLEANS:
            inline = _BOOLEANS[value]
        else:
            return False, None, None
    return True, name, inline


class _HeaderFields(Response):
    """The response FastAPI hands an endpoint that takes one, for its header fields only (FastAPI's sub-response,
    without building a whole response)."""

    def __init__(self) -> None:
        self.raw_headers = []


def _with_vary_origin(send: Send) -> Send:
    """``Vary: Origin`` on the response, as Starlette's CORSMiddleware adds it to an answer to a request without
    ``Origin`` (the only kind the lean path takes) when CORS is configured: joined to a ``Vary`` already there."""

    async def send_with_vary(message: Message) -> None:
        if message["type"] == "http.response.start":
            message.setdefault("headers", [])
            headers = MutableHeaders(scope=message)
            headers["Vary"] = ", ".join([*headers.getlist("Vary"), "Origin"])
        await send(message)

    return send_with_vary


def _with_tus_version(send: Send) -> Send:
    """``Tus-Resumable`` on the response, as :class:`transfer.api.tus.TusMiddleware` adds it."""

    async def send_with_version(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"tus-resumable", b"1.0.0")]}
        await send(message)

    return send_with_version
