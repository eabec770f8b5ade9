"""The service's liveness answer (``/healthz``): up, and which version; readiness (``/readyz``) is the
observability layer's, which knows the checks."""

from __future__ import annotations

from fastapi import APIRouter

from transfer import __version__


def health_router() -> APIRouter:
    """``/healthz``, as a router for the application to include."""
    router = APIRouter()

    @router.get("/healthz", tags=["service"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    return router
