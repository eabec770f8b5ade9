"""``/mcp`` of ``transfer serve``: the MCP tools over streamable HTTP, loaded on the first call that passes the key.

The MCP SDK and the tool schemas built from it are the largest part of the server's start-up heap (about 22 MB of
the ~100 MB an idle local-storage server holds, and a third of its start-up time), and most deployments never call
``/mcp``. So the route is here, light: it checks the API key (401 before MCP sees anything, as before), and the
first request that passes imports :mod:`transfer.bindings.mcp` (in a thread: the event loop goes on serving),
builds the server and starts its session manager in a task of its own, which runs until the application's lifespan
ends. Every later request goes straight to the same MCP app; what a client sees does not change. If the binding
cannot be imported (an install without a working MCP SDK), the call answers 503 ``mcp_unavailable`` and the rest of
the API serves on; the next call tries again.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from transfer.api.app import error_response
from transfer.errors import McpUnavailable, ShuttingDown, TransferError

if TYPE_CHECKING:
    from transfer.service.container import Services
    from transfer.service.identity.directory import Identities

log = logging.getLogger("transfer.mcp")


def add_mcp_endpoint(app: FastAPI, services: Services, auth: Identities) -> None:
    """Serve the MCP tools at ``/mcp`` (streamable HTTP) of the app; API keys are checked before MCP sees it."""
    endpoint = LazyMcp(services, auth)
    endpoint.route = Route("/mcp", endpoint=endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    app.router.routes.append(endpoint.route)
    app.state.lifespan_contexts.append(endpoint.lifetime)


class LazyMcp:
    """An ASGI app (a class, so that Starlette routes to it raw): 401 without a valid key, else MCP, built on the
    first such request. Its session manager runs from then until :meth:`lifetime` ends."""

    def __init__(self, services: Services, auth: Identities) -> None:
        self.services = services
        self.auth = auth
        self.inner: ASGIApp | None = None
        self.route: Route | None = None  # what a request's metrics and access log name it by (else "other")
        self._loading = asyncio.Lock()
        self._closing = asyncio.Event()  # set when the lifespan ends: no session manager starts after it
        self._runner: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = self.route  # as FastAPI's routes set it: the observability middleware reads it at the end
        try:
            authorization = None
            for name, value in scope.get("headers", []):
                if name.lower() == b"authorization":
                    authorization = value.decode("latin-1")
            # the caller, checked once per HTTP request (401 with the MCP authorization spec's challenge before MCP
            # sees anything); the tools read it from the request's state, the access log names it
            scope.setdefault("state", {})["grant"] = await self.auth.grant(authorization)
            inner = self.inner or await self._load()
        except TransferError as exc:
            await error_response(exc)(scope, receive, send)  # the API's error JSON, as every route answers it
            return
        await inner(scope, receive, send)

    async def _load(self) -> ASGIApp:
        async with self._loading:
            if self.inner is not None:
                return self.inner
            if self._closing.is_set():
                raise ShuttingDown("the server is shutting down: MCP is not started now")
            # the import is the slow part (hundreds of modules): off the event loop
            try:
                await asyncio.to_thread(importlib.import_module, "transfer.bindings.mcp")
            except ImportError as exc:  # an install without a working MCP SDK: a clear 503, not a 500
                log.error("MCP over streamable HTTP cannot load: %s", exc)
                raise McpUnavailable(
                    f"MCP is not available on this server: {exc} (reinstall the service with its dependencies)"
                ) from None
            from transfer.bindings.mcp import mcp_http_app  # imported now: at once

            inner, manager = mcp_http_app(self.services, self.auth)
            started: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            async def run() -> None:
                try:
                    async with manager.run():
                        started.set_result(None)
                        await self._closing.wait()
                except BaseException as exc:
                    if not started.done():
                        started.set_exception(exc)
                    raise

            self._runner = asyncio.create_task(run(), name="mcp session manager")
            await started
            if gc.get_freeze_count():
                # the host froze its start-up heap (``transfer serve``) so the collector does not walk it on every
                # old-generation pass: what the MCP import just added lives as long, and is frozen with it
                gc.freeze()
            self.inner = inner
            log.info("MCP over streamable HTTP loaded on its first request")
            return inner

    @asynccontextmanager
    async def lifetime(self) -> AsyncIterator[None]:
        """The application's lifespan: on its end, the session manager (if it ever started) stops, as it did when
        it ran for the whole lifespan: its open sessions end."""
        try:
            yield
        finally:
            self._closing.set()
            if self._runner is not None:
                await self._runner
