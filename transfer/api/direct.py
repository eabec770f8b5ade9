"""REST front door for direct-to-storage uploads (a thin adapter over :class:`DirectService`).

POST   /v1/direct                   plan -> 201 {id, part_size, part_count, expires_at, …}; 409
                                    ``direct_upload_unsupported`` when the backend cannot take parts (fall back)
POST   /v1/direct/{id}/parts        {"parts": [{"number", "sha256"}]} -> presigned PUT URLs, each with the headers to
                                    send (``x-amz-checksum-sha256``: the bucket refuses other bytes) and its expiry
GET    /v1/direct/{id}              the plan and the parts the bucket holds (resume: send only the missing ones)
POST   /v1/direct/{id}/complete     {"checksum": "sha256:…"} -> verify every part and the whole SHA-256, publish,
                                    answer the FileContent descriptor
DELETE /v1/direct/{id}              abort: parts deleted, nothing published
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, field_validator

from transfer.api.caller import caller_of
from transfer.api.fields import JsonInt, NewFile
from transfer.core.auth import Scope
from transfer.core.model.content import DownloadMethod, format_timestamp, normalize_checksum
from transfer.core.uploads.state import UploadState
from transfer.service.files.service import FileService
from transfer.service.uploads.direct import DirectService, Plan

SHA256_HEX = r"^(sha256:)?[0-9a-fA-F]{64}$"


class PlanCreate(NewFile):
    size: JsonInt = Field(ge=0, description="total bytes of the file")


class PartRequest(BaseModel):
    number: JsonInt = Field(ge=1, le=10_000)
    sha256: str = Field(pattern=SHA256_HEX, description="SHA-256 of the part's bytes, 64 hex digits")


class PartsRequest(BaseModel):
    parts: list[PartRequest] = Field(min_length=1, max_length=1000)


class PlanComplete(BaseModel):
    checksum: str | None = Field(default=None, description="sha256:<hex> of the whole file, if not declared before")
    download_method: DownloadMethod | None = None
    ttl: JsonInt | None = Field(default=None, gt=0)

    @field_validator("checksum")
    @classmethod
    def _checksum(cls, v: str | None) -> str | None:
        return None if v is None else normalize_checksum(v)


def _timestamp(seconds: float) -> str:
    return format_timestamp(datetime.fromtimestamp(int(seconds), UTC))


def plan_document(plan: Plan) -> dict[str, Any]:
    return {
        "id": plan.id,
        "state": plan.state,
        "size": plan.size,
        "part_size": plan.part_size,
        "part_count": plan.part_count,
        "checksum_algorithm": "sha256",
        "expires_at": _timestamp(plan.expires_at),
        "file_id": plan.file_id,
        "parts_url": f"/v1/direct/{plan.id}/parts",
        "complete_url": f"/v1/direct/{plan.id}/complete",
    }


def direct_router(
    direct: DirectService,
    files: FileService,
    base_url: Callable[[Request], str],
    needs: Callable[[Scope], Any],
) -> APIRouter:
    """The direct-upload endpoints, as a router for the application to include."""
    router = APIRouter()
    upload = [needs(Scope.UPLOAD)]

    @router.post("/v1/direct", dependencies=upload, status_code=201, tags=["direct"], summary="Plan a direct upload")
    async def create_plan(request: Request, body: PlanCreate) -> dict[str, Any]:
        plan = await direct.create(
            size=body.size,
            caller=caller_of(request),
            intent=body.intent(),
            checksum=body.checksum,
        )
        return plan_document(plan)

    @router.post("/v1/direct/{pid}/parts", dependencies=upload, tags=["direct"], summary="Presigned URLs for parts")
    async def part_urls(request: Request, pid: str, body: PartsRequest) -> dict[str, Any]:
        now = direct.clock()
        urls = await direct.part_urls(pid, [(p.number, p.sha256) for p in body.parts], caller_of(request))
        return {
            "parts": [
                {
                    "number": number,
                    "url": url.url,
                    "method": url.method,
                    "headers": dict(url.headers),
                    "expires_at": _timestamp(now + url.expires_in),
                }
                for number, url in urls
            ]
        }

    @router.get("/v1/direct/{pid}", dependencies=upload, tags=["direct"], summary="The plan and the parts stored")
    async def plan_status(request: Request, pid: str) -> dict[str, Any]:
        plan, parts = await direct.status(pid, caller_of(request))
        held = {p.number for p in parts}
        doc = plan_document(plan)
        doc["stored"] = [{"number": p.number, "size": p.size} for p in parts]
        missing = [n for n in range(1, plan.part_count + 1) if n not in held]
        doc["missing"] = missing if plan.state is UploadState.OPEN else []
        return doc

    @router.post("/v1/direct/{pid}/complete", dependencies=upload, tags=["direct"], summary="Verify and publish")
    async def complete_plan(request: Request, pid: str, body: PlanComplete | None = None) -> dict[str, Any]:
        body = body or PlanComplete()
        _plan, record = await direct.complete(pid, caller_of(request), checksum=body.checksum)
        descriptor = await files.describe(
            record, base_url(request), download_method=body.download_method, ttl=body.ttl, inline=False
        )
        return descriptor.to_json()

    @router.delete("/v1/direct/{pid}", dependencies=upload, status_code=204, tags=["direct"], summary="Abort a plan")
    async def abort_plan(request: Request, pid: str) -> Response:
        await direct.abort(pid, caller_of(request))
        return Response(status_code=204)

    return router
