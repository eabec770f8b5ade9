"""REST front door for bundles: ``POST /v1/bundles`` (create), ``GET /v1/bundles/{id}`` (a fresh ContentBundle),
``DELETE /v1/bundles/{id}`` (its bytes go back to its key; its files stay)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from transfer.api.caller import caller_of
from transfer.api.fields import JsonInt
from transfer.core.auth import Scope
from transfer.service.files.bundles import BundleService


class BundleCreate(BaseModel):
    name: str | None = Field(default=None, max_length=1024)
    description: str | None = Field(default=None, max_length=4096)
    items: list[dict[str, Any]] = Field(
        description='each {"id"?, "role", "file_id"} for a stored file or {"id"?, "role", "content": {...}} inline'
    )
    ttl: JsonInt | None = Field(default=None, gt=0, description="seconds the items' signed URLs live")
    expires_in: JsonInt | None = Field(
        default=None, gt=0, description="seconds the bundle lives; above the key's or service's maximum: 400"
    )


def bundles_router(
    bundles: BundleService, base_url: Callable[[Request], str], needs: Callable[[Scope], Any]
) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/v1/bundles",
        dependencies=[needs(Scope.UPLOAD)],
        status_code=201,
        tags=["bundles"],
        summary="Create a ContentBundle",
    )
    async def create_bundle(request: Request, body: BundleCreate) -> dict[str, Any]:
        caller = caller_of(request)
        bundle_id = await bundles.create(
            body.items, caller, name=body.name, description=body.description, expires_in=body.expires_in
        )
        return (await bundles.describe(bundle_id, base_url(request), caller, ttl=body.ttl)).to_json()

    @router.get(
        "/v1/bundles/{bundle_id}",
        dependencies=[needs(Scope.READ)],
        tags=["bundles"],
        summary="A bundle with fresh URLs for its files",
    )
    async def get_bundle(request: Request, bundle_id: str, ttl: int | None = None) -> dict[str, Any]:
        return (await bundles.describe(bundle_id, base_url(request), caller_of(request), ttl=ttl)).to_json()

    @router.delete(
        "/v1/bundles/{bundle_id}",
        dependencies=[needs(Scope.ADMIN)],
        status_code=204,
        tags=["bundles"],
        summary="Delete a bundle (its files stay)",
    )
    async def delete_bundle(request: Request, bundle_id: str) -> Response:
        await bundles.delete(bundle_id, caller_of(request))
        return Response(status_code=204)

    return router
