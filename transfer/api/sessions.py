"""REST front door for chunked sessions (a thin adapter over :class:`SessionService`).

POST   /v1/sessions                            create -> 201 session document (ids, sizes, URLs)
PUT    /v1/sessions/{id}/chunks/{index}        one chunk; ``Chunk-Checksum: xxh3-128:<hex>`` or ``sha256:<hex>``
                                               (or RFC 9530 ``Content-Digest: sha-256=:…:``) -> 201, or 200 if
                                               the same bytes were already stored
GET    /v1/sessions/{id}                       status: stored / missing chunk ranges, bytes, state, expiry
POST   /v1/sessions/{id}/complete              verify + publish -> FileContent (url or streaming mode)
DELETE /v1/sessions/{id}                       abort
GET    /v1/sessions/{id}/chunks?<signed>       the status, for holders of a streaming descriptor
GET    /v1/sessions/{id}/chunks/{index}?<signed>  chunk bytes with ``Chunk-Checksum``; while the session is
                                               still uploading, waits for the chunk (``Prefer: wait=<s>``)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from transfer.api.caller import caller_of
from transfer.api.fields import JsonInt, NewFile
from transfer.api.responses import AsciiJSONResponse
from transfer.api.streaming import OwningStreamResponse, request_body
from transfer.core.auth import Scope
from transfer.core.http.delivery import CONTENT_SAFETY_HEADERS
from transfer.core.http.digests import sha256_from_digest_field
from transfer.core.http.negotiation import preference
from transfer.core.model.content import (
    DownloadMethod,
    FileContent,
)
from transfer.core.numerals import decimal
from transfer.errors import InvalidRequest, SessionIncomplete
from transfer.service.files.service import FileService
from transfer.service.uploads import session_views
from transfer.service.uploads.sessions import ChunkDigest, SessionService

# a chunk index in a URL is ASCII digits (a sign for a refusal that names the range): "1.0" or "+1" is no index
ChunkIndex = Annotated[str, Path(pattern=r"^-?[0-9]{1,18}$", description="the chunk's index, from 0")]


class SessionCreate(NewFile):
    size: JsonInt | None = Field(default=None, ge=0, description="total bytes; omit if unknown until completion")
    chunk_size: JsonInt | None = Field(default=None, gt=0)
    ttl: JsonInt | None = Field(default=None, gt=0, description="seconds the session may stay unfinished")


class SessionComplete(BaseModel):
    size: JsonInt | None = Field(default=None, ge=0, description="required when the size was not declared")
    mode: Literal["url", "streaming"] = "url"
    download_method: DownloadMethod | None = None
    ttl: JsonInt | None = Field(default=None, gt=0)


def parse_prefer_wait(value: str | None, default: float, maximum: float) -> float:
    """``Prefer: wait=<seconds>`` (RFC 7240 §4.3); the service's default when absent."""
    # delta-seconds is 1*DIGIT (RFC 9111 §1.2.2); a value that is not is ignored, as any preference the server does
    # not understand (RFC 7240 §2)
    seconds = decimal(preference(value, "wait") or "", max_digits=9)
    return default if seconds is None else min(float(seconds), maximum)


def sessions_router(
    sessions: SessionService,
    files: FileService,
    base_url: Callable[[Request], str],
    needs: Callable[[Scope], Any],
) -> APIRouter:
    """The session endpoints, as a router for the application to include."""
    router = APIRouter()
    settings = files.settings

    def streaming_descriptor(session: Any, base: str, ttl: int | None, record: Any = None) -> FileContent:
        return session_views.streaming_descriptor(files, session, base, ttl, record)

    def session_document(session: Any, base: str) -> dict[str, Any]:
        return session_views.session_document(files, session, base)

    upload, read = [needs(Scope.UPLOAD)], [needs(Scope.READ)]

    @router.post("/v1/sessions", dependencies=upload, status_code=201, tags=["sessions"], summary="Open a session")
    async def create_session(request: Request, body: SessionCreate) -> dict[str, Any]:
        session = await sessions.create(
            intent=body.intent(),
            size=body.size,
            chunk_size=body.chunk_size,
            checksum=body.checksum,
            ttl=body.ttl,
            owner=caller_of(request).owner,
        )
        return session_document(session, base_url(request))

    @router.put(
        "/v1/sessions/{sid}/chunks/{index}",
        dependencies=upload,
        tags=["sessions"],
        summary="Upload one chunk (any order, in parallel); verified against Chunk-Checksum",
        openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {}}}},
    )
    async def put_chunk(
        request: Request,
        sid: str,
        index: ChunkIndex,
        chunk_checksum: Annotated[str | None, Header(description="xxh3-128:<32 hex> or sha256:<64 hex>")] = None,
        content_digest: Annotated[str | None, Header()] = None,
        content_length: Annotated[int | None, Header()] = None,
    ) -> Response:
        if chunk_checksum:
            digest = ChunkDigest.parse(chunk_checksum)
        elif content_digest:
            sha = sha256_from_digest_field(content_digest)
            if sha is None:
                raise InvalidRequest("Content-Digest carries no sha-256")
            digest = ChunkDigest("sha256", sha.hex())
        else:
            raise InvalidRequest("a chunk needs its checksum: Chunk-Checksum: xxh3-128:<hex> (or sha256:<hex>)")

        receipt = await sessions.put_chunk(
            sid, int(index), request_body(request), digest, content_length, caller_of(request)
        )
        return AsciiJSONResponse(
            {"index": receipt.index, "size": receipt.size, "xxh3": receipt.xxh3, "duplicate": receipt.duplicate},
            status_code=200 if receipt.duplicate else 201,
        )

    @router.get(
        "/v1/sessions/{sid}", dependencies=read, tags=["sessions"], summary="Session status: stored and missing chunks"
    )
    async def session_status(request: Request, sid: str) -> dict[str, Any]:
        return await sessions.status(sid, caller_of(request))

    @router.post(
        "/v1/sessions/{sid}/complete",
        dependencies=upload,
        tags=["sessions"],
        summary="Verify and publish; returns a FileContent",
    )
    async def complete_session(request: Request, sid: str, body: SessionComplete | None = None) -> dict[str, Any]:
        body = body or SessionComplete()
        session, record = await sessions.complete(sid, caller_of(request), body.size)
        if body.mode == "streaming":
            return streaming_descriptor(session, base_url(request), body.ttl, record).to_json()
        descriptor = await files.describe(
            record, base_url(request), download_method=body.download_method, ttl=body.ttl, inline=False
        )
        return descriptor.to_json()

    @router.delete(
        "/v1/sessions/{sid}", dependencies=upload, status_code=204, tags=["sessions"], summary="Abort a session"
    )
    async def abort_session(request: Request, sid: str) -> Response:
        await sessions.abort(sid, caller_of(request))
        return Response(status_code=204)

    @router.get(
        "/v1/sessions/{sid}/descriptor",
        dependencies=read,
        tags=["sessions"],
        summary="A streaming descriptor for the session",
    )
    async def session_descriptor(request: Request, sid: str, ttl: int | None = None) -> dict[str, Any]:
        caller = caller_of(request)
        session = await sessions.load(sid, caller)
        if session.size is None:
            raise SessionIncomplete(
                "the size of this session is unknown until it completes: no streaming descriptor yet"
            )
        record = await files.record(session.file_id, caller) if session.file_id else None
        return streaming_descriptor(session, base_url(request), ttl, record).to_json()

    @router.get("/v1/sessions/{sid}/chunks", tags=["sessions"], summary="Status through a streaming descriptor's URL")
    async def signed_status(request: Request, sid: str) -> dict[str, Any]:
        return await sessions.signed_status(sid, request.scope.get("raw_path"), request.url.query)

    chunk_doc: dict[str, Any] = dict(
        tags=["sessions"],
        summary="Read one chunk (signed); waits for chunks not uploaded yet (Prefer: wait=<seconds>)",
        response_class=Response,
    )

    @router.get("/v1/sessions/{sid}/chunks/{index}", operation_id="chunk_get", **chunk_doc)
    @router.head("/v1/sessions/{sid}/chunks/{index}", operation_id="chunk_head", **chunk_doc)
    async def get_chunk(
        request: Request, sid: str, index: ChunkIndex, prefer: Annotated[str | None, Header()] = None
    ) -> Response:
        wait = parse_prefer_wait(prefer, settings.live_read_timeout, max(settings.live_read_timeout, 300))
        _session, stream, length, xxh3 = await sessions.open_signed_chunk(
            sid, int(index), request.method, request.scope.get("raw_path"), request.url.query, wait
        )
        headers = {
            "content-length": str(length),
            "chunk-checksum": f"xxh3-128:{xxh3}",
            "cache-control": "private, max-age=0",
            **dict(CONTENT_SAFETY_HEADERS),
        }
        return OwningStreamResponse(stream, headers=headers, media_type="application/octet-stream")

    return router
