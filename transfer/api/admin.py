"""REST front door for usage and administration (thin: the operations are in ``transfer.service.admin``).

GET    /v1/usage                      the calling key's bytes used, files, reserved bytes and quota
GET    /v1/admin/files                stored files of every key, with owner and expiry (``limit``, ``cursor``,
                                      ``owner``); DELETE /v1/files/{id} removes one (admin scope)
GET    /v1/admin/usage                usage of every configured key
POST   /v1/admin/usage/repair         recount every key's usage from the file records; ``fix=true`` sets a
                                      differing ledger to the count (``transfer usage repair``)
POST   /v1/admin/gc                   run every sweep of Services.maintenance() once, now; what each removed
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from transfer.api.caller import caller_of
from transfer.core.auth import Scope
from transfer.service import admin
from transfer.service.container import Services


def admin_router(services: Services, needs: Callable[[Scope], Any]) -> APIRouter:
    """The usage and admin endpoints, as a router for the application to include."""
    router = APIRouter()
    lifecycle = services.files.lifecycle

    @router.get(
        "/v1/usage",
        dependencies=[needs(Scope.UPLOAD)],
        tags=["usage"],
        summary="The calling key's stored bytes, files, bytes reserved by unfinished uploads, and quota",
    )
    async def usage(request: Request) -> dict[str, Any]:
        owner = caller_of(request).owner
        return {"key": owner, **(await lifecycle.usage.usage(owner)).to_json()}

    @router.get(
        "/v1/admin/files",
        dependencies=[needs(Scope.ADMIN)],
        tags=["admin"],
        summary="Stored files of every key with owner and expiry, in id order, a page at a time",
    )
    async def admin_files(
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        cursor: Annotated[str | None, Query(max_length=64, description="next_cursor of the previous page")] = None,
        owner: Annotated[str | None, Query(max_length=200, description="only this key's files")] = None,
    ) -> dict[str, Any]:
        records, next_cursor = await admin.list_files(services, limit=limit, after=cursor, owner=owner)
        return {"files": [admin.record_summary(r) for r in records], "next_cursor": next_cursor}

    @router.get(
        "/v1/admin/usage",
        dependencies=[needs(Scope.ADMIN)],
        tags=["admin"],
        summary='Usage of every configured key ("" : files stored without a key)',
    )
    async def admin_usage() -> dict[str, Any]:
        return {"keys": await admin.usage_of_keys(services)}

    @router.post(
        "/v1/admin/usage/repair",
        dependencies=[needs(Scope.ADMIN)],
        tags=["admin"],
        summary="Recount every key's bytes and files from the stored file records and report any difference from "
        "its usage ledger; with fix=true, set a differing ledger to the count",
    )
    async def repair_usage(
        fix: Annotated[bool, Query(description="write the count to a ledger that differs")] = False,
    ) -> dict[str, Any]:
        return await admin.repair_usage(services, fix=fix)

    @router.post(
        "/v1/admin/gc",
        dependencies=[needs(Scope.ADMIN)],
        tags=["admin"],
        summary="Run every maintenance sweep once, now; what each removed by name (-1: that sweep failed)",
    )
    async def gc() -> dict[str, Any]:
        return {"removed": await admin.run_sweeps(services)}

    return router
