"""REST front door for chunked deduplicating uploads (a thin adapter over :class:`ChunkService`).

GET    /v1/chunked                          the offer: the chunker to cut with (FastCDC parameters) and the bounds;
                                            a server without it answers 404 and clients upload whole
POST   /v1/chunked                          the manifest {size, checksum, chunks: [{offset, length, sha256}], name,
                                            content_type, role, description, expires_in} -> 201 {id, missing: [chunk
                                            indexes this key lacks], missing_bytes, …}
PUT    /v1/chunked/{id}/chunks/{index}      the bytes of chunk ``index`` (``?count=n``: of n consecutive chunks, back
                                            to back) -> 200 {stored, stored_bytes}; each verified on arrival
PUT    /v1/chunked/{id}/missing?start=k&count=n  the bytes of the chunks at positions k..k+n-1 of the creation's
                                            ``missing`` list, back to back: one body (one pack) for chunks that
                                            need not be consecutive -> 200 {stored, stored_bytes}
POST   /v1/chunked/probe                    {chunks: [sha256, …]} (a file's first chunks) -> 200 {held: [positions of
                                            those this key holds]}: a client sends a file whose first chunks the
                                            key lacks whole at once, and cuts the rest only when it pays
POST   /v1/chunked/{id}/complete            assemble, verify the whole SHA-256, publish -> 201 the FileContent
PUT    /v1/chunked/{id}/file                the whole file in order (the key lacks most of it): each chunk and the
                                            whole SHA-256 verified on the way, written once as the new file,
                                            published -> 201 the FileContent (no complete: one request)
DELETE /v1/chunked/{id}                     abort (the chunks stay for a retry, within their grace)
GET    /v1/files/{file_id}/chunks           the chunk manifest of a file uploaded this way, for its key
PUT    /v1/files/{file_id}/chunks           the manifest of a file of this key that went whole by another door:
                                            checked against its stored bytes, then its chunks indexed (its next
                                            version sends only what changed) -> 200 {chunks, indexed}; with
                                            ``Prefer: respond-async``, 202 once the manifest fits the file, and
                                            the chunks checked and indexed after the answer
GET    /v1/files/{file_id}/manifest?exp&kid&sig   the same for whoever holds a signed URL of the file (its query):
                                            a resolver with a cache fetches only the ranges of the chunks it lacks
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError

from transfer.api.caller import caller_of
from transfer.api.fields import NewFile
from transfer.api.streaming import request_body
from transfer.core.auth import Scope
from transfer.core.http.negotiation import preference
from transfer.core.jsontext import parse_json
from transfer.core.model.content import DownloadMethod, format_timestamp
from transfer.core.numerals import CANONICAL_DECIMAL, parse_bounded, parse_count
from transfer.core.uploads.chunking import MAX_CHUNKS
from transfer.errors import ClientDisconnected, InvalidManifest, InvalidRequest, ManifestTooLarge
from transfer.service.files.service import FileService
from transfer.service.uploads.chunked import ChunkedUpload, ChunkService
from transfer.service.uploads.chunkstore import MAX_PROBE, manifest_document

MANIFEST_BYTES_PER_CHUNK = 128  # {"offset":…,"length":…,"sha256":"<64 hex>"} with room for spaces
MAX_MANIFEST_BODY = MAX_CHUNKS * MANIFEST_BYTES_PER_CHUNK + (64 << 10)
MAX_PROBE_BODY = MAX_PROBE * 72 + (4 << 10)  # "<64 hex>", per hash with room for spaces
META_FIELDS = ("name", "content_type", "role", "description", "expires_in")

# chunk positions in the URL: canonical decimals only (a malformed one is 400 invalid_request, never another chunk)
ChunkIndex = Annotated[str, Path(pattern=CANONICAL_DECIMAL, description="the chunk's index in the manifest, from 0")]
ChunkCount = Annotated[str, Query(pattern=CANONICAL_DECIMAL, description=f"chunks in the body, 1 to {MAX_CHUNKS}")]
MissingStart = Annotated[
    str, Query(pattern=CANONICAL_DECIMAL, description="the first position in the creation's missing list, from 0")
]


def _timestamp(seconds: float) -> str:
    return format_timestamp(datetime.fromtimestamp(int(seconds), UTC))


def upload_document(upload: ChunkedUpload) -> dict[str, Any]:
    chunks = upload.manifest.chunks
    return {
        "id": upload.id,
        "state": upload.state,  # "completed" at once when the key stores this content already: complete answers it
        "file_id": upload.file_id,
        "size": upload.manifest.size,
        "chunks": len(chunks),
        "missing": list(upload.missing),
        "missing_bytes": sum(chunks[i].length for i in upload.missing),
        "expires_at": _timestamp(upload.expires_at),
        "chunks_url": f"/v1/chunked/{upload.id}/chunks/{{index}}",
        "missing_url": f"/v1/chunked/{upload.id}/missing",
        "complete_url": f"/v1/chunked/{upload.id}/complete",
        "file_url": f"/v1/chunked/{upload.id}/file",
    }


async def _manifest_body(request: Request, limit: int = MAX_MANIFEST_BODY) -> Any:
    """The request's JSON, bounded in bytes before it is parsed (a manifest is parsed whole) and in nesting while it
    is (:func:`transfer.core.jsontext.parse_json`)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ManifestTooLarge(f"a manifest is at most {limit} bytes", limit=limit)
    body = bytearray()
    try:
        async for piece in request.stream():
            body += piece
            if len(body) > limit:
                raise ManifestTooLarge(f"a manifest is at most {limit} bytes", limit=limit)
    except OSError as exc:
        raise ClientDisconnected("the client went away while sending the manifest") from exc
    try:  # JsonTooDeep (400 json_too_deep) passes through: nesting is refused with one code on every door
        return await asyncio.to_thread(parse_json, bytes(body)) if len(body) > 1 << 16 else parse_json(body)
    except ValueError as exc:
        raise InvalidManifest(f"the manifest is not JSON: {exc}") from None


def _declared_length(request: Request) -> int | None:
    """The body's declared Content-Length (None for a chunked body), checked as a count."""
    declared = request.headers.get("content-length")
    return None if declared is None else parse_count(declared, "Content-Length")


def chunked_router(
    chunks: ChunkService,
    files: FileService,
    base_url: Callable[[Request], str],
    needs: Callable[[Scope], Any],
) -> APIRouter:
    """The chunked-upload endpoints, as a router for the application to include."""
    router = APIRouter()
    upload = [needs(Scope.UPLOAD)]

    @router.get("/v1/chunked", dependencies=upload, tags=["chunked"], summary="How to upload in content-defined chunks")
    async def offer() -> dict[str, Any]:
        return chunks.offer()

    @router.post("/v1/chunked", dependencies=upload, status_code=201, tags=["chunked"], summary="Send a manifest")
    async def create(request: Request) -> dict[str, Any]:
        doc = await _manifest_body(request)
        if not isinstance(doc, dict):
            raise InvalidManifest("a manifest is a JSON object with size, checksum and chunks")
        try:
            about = NewFile.model_validate({k: doc[k] for k in META_FIELDS if doc.get(k) is not None})
        except ValidationError as exc:
            problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
            raise InvalidRequest("; ".join(problems)) from None
        made = await chunks.create(doc, caller_of(request), intent=about.intent())
        return upload_document(made)

    @router.post("/v1/chunked/probe", dependencies=upload, tags=["chunked"], summary="Which of these chunks are held")
    async def probe(request: Request) -> dict[str, Any]:
        doc = await _manifest_body(request, MAX_PROBE_BODY)
        if not isinstance(doc, dict) or "chunks" not in doc:
            raise InvalidManifest('a probe is a JSON object {"chunks": [SHA-256 hex, …]}')
        return {"held": await chunks.store.probe(doc["chunks"], caller_of(request))}

    @router.put("/v1/chunked/{uid}/chunks/{index}", dependencies=upload, tags=["chunked"], summary="Send chunks")
    async def put_chunks(request: Request, uid: str, index: ChunkIndex, count: ChunkCount = "1") -> dict[str, Any]:
        stored, stored_bytes = await chunks.put_chunks(
            uid,
            int(index),
            parse_bounded(count, "count", low=1, high=MAX_CHUNKS),
            request_body(request),
            caller_of(request),
            length=_declared_length(request),
        )
        return {"stored": stored, "stored_bytes": stored_bytes}

    @router.put("/v1/chunked/{uid}/missing", dependencies=upload, tags=["chunked"], summary="Send the missing chunks")
    async def put_missing(
        request: Request,
        uid: str,
        start: MissingStart = "0",
        count: ChunkCount = "1",
    ) -> dict[str, Any]:
        stored, stored_bytes = await chunks.put_missing(
            uid,
            parse_bounded(start, "start", low=0, high=MAX_CHUNKS),
            parse_bounded(count, "count", low=1, high=MAX_CHUNKS),
            request_body(request),
            caller_of(request),
            length=_declared_length(request),
        )
        return {"stored": stored, "stored_bytes": stored_bytes}

    @router.post(
        "/v1/chunked/{uid}/complete", dependencies=upload, status_code=201, tags=["chunked"], summary="Publish"
    )
    async def complete(
        request: Request,
        uid: str,
        download_method: DownloadMethod | None = None,
        ttl: Annotated[int | None, Query(gt=0)] = None,
    ) -> dict[str, Any]:
        record = await chunks.complete(uid, caller_of(request))
        descriptor = await files.describe(
            record, base_url(request), download_method=download_method, ttl=ttl, inline=False
        )
        return descriptor.to_json()

    @router.put(
        "/v1/chunked/{uid}/file", dependencies=upload, status_code=201, tags=["chunked"], summary="Send it whole"
    )
    async def put_file(
        request: Request,
        uid: str,
        download_method: DownloadMethod | None = None,
        ttl: Annotated[int | None, Query(gt=0)] = None,
    ) -> dict[str, Any]:
        record = await chunks.put_file(uid, request_body(request), caller_of(request), length=_declared_length(request))
        descriptor = await files.describe(
            record, base_url(request), download_method=download_method, ttl=ttl, inline=False
        )
        return descriptor.to_json()

    @router.delete("/v1/chunked/{uid}", dependencies=upload, status_code=204, tags=["chunked"], summary="Abort")
    async def abort(request: Request, uid: str) -> Response:
        await chunks.abort(uid, caller_of(request))
        return Response(status_code=204)

    @router.get(
        "/v1/files/{file_id}/chunks", dependencies=[needs(Scope.READ)], tags=["files"], summary="A file's chunks"
    )
    async def file_chunks(request: Request, file_id: str) -> dict[str, Any]:
        return manifest_document(await chunks.store.manifest(file_id, caller_of(request)))

    @router.put(
        "/v1/files/{file_id}/chunks",
        dependencies=upload,
        tags=["files"],
        summary="Index a stored file's chunks",
        responses={
            202: {
                "description": "`Prefer: respond-async`: the manifest fits the file; its chunks are checked and "
                "indexed after this answer (`indexed` is null)",
                "headers": {"Preference-Applied": {"schema": {"type": "string", "enum": ["respond-async"]}}},
            }
        },
    )
    async def index_file(request: Request, response: Response, file_id: str) -> dict[str, Any]:
        """Check the manifest against the file and index its chunks: 200 {chunks, indexed}. With `Prefer:
        respond-async` (RFC 7240) the answer comes once the manifest is known to describe the file, 202 with
        `Preference-Applied: respond-async` and `indexed` null, and the chunks are checked and indexed after it
        (a chunk that is not the file's bytes then indexes nothing); a service with many checks waiting answers
        200 after its own, as without the preference."""
        doc = await _manifest_body(request)
        later = preference(",".join(request.headers.getlist("prefer")), "respond-async") is not None
        total, indexed = await chunks.store.index_file(file_id, doc, caller_of(request), later=later)
        if indexed is None:
            response.status_code = 202
            response.headers["preference-applied"] = "respond-async"
        return {"chunks": total, "indexed": indexed}

    @router.get("/v1/files/{file_id}/manifest", tags=["files"], summary="A file's chunks, with its signed URL's query")
    async def signed_chunks(request: Request, file_id: str) -> dict[str, Any]:
        manifest = await chunks.store.signed_manifest(file_id, request.url.query, request.scope.get("raw_path"))
        return manifest_document(manifest)

    return router
