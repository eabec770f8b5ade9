"""``PUT /v1/authorized/{id}``: the signed upload URL of an upload authorisation (MCP ``authorize_upload``).

The signed URL is the capability (like a signed download URL): no API key; the signature, the start deadline and
the authorisation's size limit are checked by :class:`Authorizations`. Answers 201 with the stored file's
FileContent descriptor (its SHA-256 in ``checksum``), the same as ``confirm_upload`` later.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from transfer.api.responses import AsciiJSONResponse
from transfer.api.streaming import request_body
from transfer.core.numerals import parse_count
from transfer.service.uploads.authorizations import Authorizations


def authorized_router(authorizations: Authorizations, base_url: Callable[[Request], str]) -> APIRouter:
    router = APIRouter()

    @router.put(
        "/v1/authorized/{aid}",
        tags=["files"],
        summary="Upload to a signed URL from authorize_upload (the URL is the capability)",
        status_code=201,
        response_class=Response,
    )
    async def authorized_put(request: Request, aid: str) -> Response:
        length = request.headers.get("content-length")
        file_id = await authorizations.receive(
            aid,
            request.url.query,
            request_body(request),
            content_length=None if length is None else parse_count(length, "Content-Length"),
        )
        body = await authorizations.descriptor(file_id, base_url(request))
        return AsciiJSONResponse(body, status_code=201, headers={"location": f"/v1/files/{file_id}"})

    return router
