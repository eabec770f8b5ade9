"""REST front door for bundles: ``POST /v1/bundles`` (create), ``GET /v1/bundles/{id}`` (a fresh ContentBundle)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from transfer.api.caller import caller_of
from transfer.api.fields import JsonInt
from transfer.core.auth import Scope
from transfer.service.bundles import BundleService


class BundleCreate(BaseModel):
    name: str | None = Field(default=None, max_length=1024)
    description: str | None = Field(default=None, max_length=4096)
    items: list[dict[str, Any]] = Field(
        description='each {"id"?, "role", "file_id"} for a stored file or {"id"?, "role", "content": {...}} inline'
    )
    ttl: JsonInt | None = Field(default=None, gt=0, description="seconds the items' signed URLs live")


def add_bundle_routes(
    app: FastAPI, bundles: BundleService, base_url: Callable[[Request], str], needs: Callable[[Scope], Any]
) -> None:
    @app.post(
        "/v1/bundles",
        dependencies=[needs(Scope.UPLOAD)],
        status_code=201,
        tags=["bundles"],
        summary="Create a ContentBundle",
    )
    async def create_bundle(request: Request, body: BundleCreate) -> dict[str, Any]:
        caller = caller_of(request)
        bundle_id = await bundles.create(body.items, caller, name=body.name, description=body.description)
        return (await bundles.describe(bundle_id, base_url(request), caller, ttl=body.ttl)).to_json()

    @app.get(
        "/v1/bundles/{bundle_id}",
        dependencies=[needs(Scope.READ)],
        tags=["bundles"],
        summary="A bundle with fresh URLs for its files",
    )
    async def get_bundle(request: Request, bundle_id: str, ttl: int | None = None) -> dict[str, Any]:
        return (await bundles.describe(bundle_id, base_url(request), caller_of(request), ttl=ttl)).to_json()
