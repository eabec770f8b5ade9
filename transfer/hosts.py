"""The composition root: how each host assembles the service. ``transfer serve``, the tests and the benchmarks serve
:func:`create_app`; ``transfer mcp`` over stdio runs :func:`run_mcp_stdio`. Both build one
:class:`~transfer.service.container.Services` and own its lifetime (its start runs the maintenance sweeps, its close
stops them), so every host runs the same background work.

Where things go: a new front door is an ``add_x(app, services, auth, base_url)`` in ``transfer/bindings`` (or a
route module in ``transfer/api``) called from :func:`create_app`; a new backend is a module in ``storage/`` chosen
in :func:`transfer.service.backends.make_storage`; a new sweep is a line in ``Services.maintenance``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from fastapi import FastAPI

from storage.base import Storage
from transfer.api.app import build_routes, public_base_url, rest_app
from transfer.api.protocol.server import uvicorn_config
from transfer.bindings.a2a import a2a_router
from transfer.bindings.mcp_http import add_mcp_endpoint
from transfer.bindings.tp import tp_http_router, tp_jsonrpc_router, tp_websocket_router
from transfer.service.container import Services
from transfer.settings import Settings
from transfer.web import web_router

log = logging.getLogger("transfer.api")


def create_app(
    settings: Settings | None = None,
    storage: Storage | None = None,
    *,
    clock: Callable[[], float] = time.time,
    services: Services | None = None,
) -> FastAPI:
    """The HTTP application with every front door: REST (files, sessions, bundles, tus, jobs), TP, A2A, MCP over
    streamable HTTP and the web page. Storage defaults to the one ``settings`` names; ``clock`` (Unix seconds)
    decides URL and record expiry, so tests can move time. The application's lifespan starts and closes
    ``services`` (shared with another host, such as stdio MCP, they stay open until both closed them)."""
    settings = settings or Settings()
    services = services or Services.build(settings, storage, clock=clock)
    auth = services.identities

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not auth.enabled:
            # loopback only, unless TRANSFER_ALLOW_OPEN_MODE said otherwise (the settings refuse the rest)
            log.warning("no API keys configured (TRANSFER_API_KEYS): every caller who reaches this port is admin")
        await services.start()
        try:
            async with AsyncExitStack() as stack:
                for context in app.state.lifespan_contexts:
                    await stack.enter_async_context(context())
                yield
        finally:
            await services.close()

    app = rest_app(services, auth, lifespan=lifespan)
    base_url = public_base_url(settings)
    app.include_router(tp_http_router(services, auth, base_url))
    app.include_router(tp_jsonrpc_router(services, auth, base_url))
    app.include_router(tp_websocket_router(services, auth))
    app.include_router(a2a_router(services, auth, base_url))
    add_mcp_endpoint(app, services, auth)
    app.include_router(web_router(settings, keys_enabled=auth.enabled, title=app.title, openapi_url=app.openapi_url))
    build_routes(app)
    return app


def default_app() -> FastAPI:
    """Entry point for ``uvicorn --factory transfer.hosts:default_app``: settings from the environment."""
    return create_app(Settings())


async def run_mcp_stdio(settings: Settings, *, root: Path, base_url: str | None, sock: socket.socket | None) -> int:
    """MCP over stdio until the client closes it, with the service's maintenance running; with ``sock``, the
    HTTP application is served there too (from the same services), so that descriptors' URLs reach something."""
    import uvicorn

    from transfer.bindings.mcp import build_mcp

    services = Services.build(settings)
    await services.start()
    try:
        server = build_mcp(services, None, http=False, root=root, base_url=base_url)
        http_server = http_task = None
        if sock is not None:
            app = create_app(settings, services=services)
            config = uvicorn_config(app, settings, host=settings.host, port=sock.getsockname()[1], log_level="warning")
            http_server = uvicorn.Server(config)
            http_task = asyncio.create_task(http_server.serve(sockets=[sock]))
        try:
            await server.run_stdio_async()
        finally:
            if http_server is not None and http_task is not None:
                http_server.should_exit = True  # a clean shutdown: lifespan ends, open responses finish
                await asyncio.wait([http_task], timeout=5)
    finally:
        await services.close()
    return 0
