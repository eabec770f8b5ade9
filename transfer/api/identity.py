"""Identity routes: the Protected Resource Metadata that OAuth clients discover, and run-time API keys.

GET    /.well-known/oauth-protected-resource       RFC 9728 §3: this service's resource identifier, the trusted
GET    /.well-known/oauth-protected-resource/mcp   authorization servers and the scopes to ask for (public; the
                                                   second for the identifier of /mcp, §3.1's path-suffixed form)
GET    /v1/admin/keys                              every key name with its live keys (ids, expiry, who made them)
POST   /v1/admin/keys                              a new key: ``{"name", "scopes", "tp_identities"?, "max_bytes"?,
                                                   "default_file_ttl"?, "max_file_ttl"?, "expires_in"?}`` → 201
                                                   with the token (shown once; only its SHA-256 is kept)
POST   /v1/admin/keys/rotate                       ``{"name", "grace"?, "expires_in"?}``: a new key for the name;
                                                   its others stop after ``grace`` seconds (0: at once) → 201
POST   /v1/admin/keys/revoke                       ``{"name", "key_id"?}``: every key of the name, or one
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from transfer.api.caller import caller_of
from transfer.api.responses import AsciiJSONResponse
from transfer.core.auth import Scope
from transfer.service.identity.directory import WELL_KNOWN, Identities

Seconds = Annotated[int, Field(gt=0, le=10 * 365 * 24 * 3600)]


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(min_length=1, max_length=200)]
    scopes: Annotated[list[Scope], Field(min_length=1)]
    tp_identities: list[Annotated[str, Field(min_length=1, max_length=1024)]] = []
    max_bytes: Annotated[int | None, Field(gt=0)] = None
    default_file_ttl: Seconds | None = None
    max_file_ttl: Seconds | None = None
    expires_in: Seconds | None = Field(default=None, description="seconds the key works (default: until revoked)")


class KeyRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(min_length=1, max_length=200)]
    grace: Annotated[int, Field(ge=0, le=30 * 24 * 3600)] = 0
    expires_in: Seconds | None = None


class KeyRevoke(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(min_length=1, max_length=200)]
    key_id: Annotated[str | None, Field(min_length=1, max_length=64)] = None


def identity_router(identities: Identities, needs: Callable[[Scope], Any]) -> APIRouter:
    """The metadata and key administration routes, as a router for the application to include."""
    router = APIRouter()
    admin = [needs(Scope.ADMIN)]

    async def metadata(suffix: str) -> AsciiJSONResponse:
        # public and the same for everyone: any origin may read it (browser-based MCP clients discover it)
        return AsciiJSONResponse(
            identities.protected_resource(suffix),
            headers={"cache-control": "public, max-age=300", "access-control-allow-origin": "*"},
        )

    @router.get(WELL_KNOWN, tags=["identity"], summary="Protected Resource Metadata (RFC 9728)")
    async def resource_metadata() -> AsciiJSONResponse:
        return await metadata("")

    @router.get(WELL_KNOWN + "/{suffix:path}", tags=["identity"], summary="Protected Resource Metadata of /mcp")
    async def resource_metadata_suffixed(suffix: str) -> AsciiJSONResponse:
        return await metadata("/" + suffix)

    @router.get("/v1/admin/keys", dependencies=admin, tags=["admin"], summary="Run-time API keys by name")
    async def list_keys() -> dict[str, Any]:
        return {"keys": await identities.keys.list()}

    @router.post(
        "/v1/admin/keys", dependencies=admin, tags=["admin"], status_code=201, summary="Make a run-time API key"
    )
    async def create_key(body: KeyCreate, request: Request) -> dict[str, Any]:
        identities.require_closed()
        spec = body.model_dump(exclude={"name", "expires_in"}, exclude_none=True)
        spec["scopes"] = [s.value for s in body.scopes]
        made = await identities.keys.create(
            body.name, spec, created_by=caller_of(request).owner, expires_in=body.expires_in
        )
        return {"key": made.token, **made.entry}

    @router.post(
        "/v1/admin/keys/rotate",
        dependencies=admin,
        tags=["admin"],
        status_code=201,
        summary="A new key for a name; its other keys stop after the grace",
    )
    async def rotate_key(body: KeyRotate, request: Request) -> dict[str, Any]:
        identities.require_closed()
        made = await identities.keys.rotate(
            body.name, created_by=caller_of(request).owner, grace=body.grace, expires_in=body.expires_in
        )
        return {"key": made.token, **made.entry}

    @router.post("/v1/admin/keys/revoke", dependencies=admin, tags=["admin"], summary="Revoke a name's keys")
    async def revoke_key(body: KeyRevoke) -> dict[str, Any]:
        identities.require_closed()
        return {"name": body.name, "revoked": await identities.keys.revoke(body.name, body.key_id)}

    return router
