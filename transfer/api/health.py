"""The service's own endpoints: liveness (``/healthz``: up, and which version), readiness (``/readyz``: the checks
of the observability layer) and this process's metrics (``/metrics``), as routers the application includes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import choose_encoder

from transfer import __version__, metrics
from transfer.api.middleware.observability import Observability
from transfer.api.responses import AsciiJSONResponse
from transfer.core.auth import Scope


def health_router() -> APIRouter:
    """``/healthz``, as a router for the application to include."""
    router = APIRouter()

    @router.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    return router


def observability_router(obs: Observability, needs: Callable[[Scope], Any]) -> APIRouter:
    """``/metrics`` and ``/readyz`` over ``obs``, as a router for the application to include. ``needs`` is the
    application's scope dependency: ``/metrics`` takes an admin key when keys are configured, as the other admin
    endpoints do."""
    router = APIRouter()

    @router.get("/metrics", dependencies=[needs(Scope.ADMIN)], tags=["service"], include_in_schema=True)
    async def prometheus_metrics(request: Request) -> Response:
        """This process's metrics in the exposition format the scraper's Accept asks for (Prometheus text or
        OpenMetrics); an admin key when keys are configured."""
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(metrics.registry), headers={"content-type": content_type})

    @router.get("/readyz", tags=["service"], responses={503: {"description": "not ready: see checks"}})
    async def readyz() -> JSONResponse:
        """Readiness: storage reachable and writable, sweeps running, not shutting down. ``/healthz`` stays a
        liveness check (the process answers)."""
        ok, checks = await obs.readiness()
        body = {"status": "ready" if ok else "not_ready", "version": __version__, "checks": checks}
        return AsciiJSONResponse(body, status_code=200 if ok else 503, headers={"cache-control": "no-store"})

    return router
