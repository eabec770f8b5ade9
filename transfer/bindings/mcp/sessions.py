"""The tools of a chunked, resumable upload session: open, send chunks (any order), complete, status."""

from __future__ import annotations

from typing import Annotated, Any

import xxhash
from mcp.server.mcpserver import Context
from pydantic import Field

from transfer.bindings.mcp.context import ExpiresIn, McpContext, _checksum, _decode, _one
from transfer.core.auth import Scope as KeyScope
from transfer.core.numerals import JsonInt
from transfer.core.uploads.state import FileIntent
from transfer.service.uploads.session_views import session_document
from transfer.service.uploads.sessions import ChunkDigest


class SessionTools(McpContext):
    """open_session, send_chunk, complete_session, session_status."""

    async def open_session(
        self,
        name: Annotated[str, Field(min_length=1, max_length=1024)],
        size: Annotated[JsonInt | None, Field(ge=0, description="total bytes, if known")] = None,
        content_type: str | None = None,
        chunk_size: Annotated[JsonInt | None, Field(gt=0, description="bytes per chunk (default: server)")] = None,
        checksum: Annotated[str | None, Field(description="sha256:<hex> of the whole content")] = None,
        ttl: Annotated[JsonInt | None, Field(gt=0, description="seconds the session may stay open")] = None,
        expires_in: ExpiresIn = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Open a chunked, resumable upload session; returns its id, chunk size and (size known) a streaming
        descriptor other agents can already follow."""
        grant = self.grant(ctx)
        grant(KeyScope.UPLOAD)
        if chunk_size is None:
            chunk_size = min(self.settings.session_chunk_size, self.settings.mcp_max_inline_bytes)
        sessions = self.services.sessions
        session = await sessions.create(
            intent=FileIntent(name=name, content_type=content_type, lifetime=expires_in),
            size=size,
            chunk_size=chunk_size,
            checksum=_checksum(checksum),
            ttl=ttl,
            owner=grant.owner,
        )
        return session_document(self.services.files, session, self.base_url(ctx))

    async def send_chunk(
        self,
        session_id: str,
        index: Annotated[JsonInt, Field(ge=0)],
        data: Annotated[str, Field(description="the chunk's bytes, base64")],
        checksum: Annotated[
            str | None, Field(description="xxh3-128:<32 hex> or sha256:<64 hex> of the chunk (recommended)")
        ] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Store chunk ``index`` (any order; the same bytes again are a no-op)."""
        grant = self.grant(ctx)
        grant(KeyScope.UPLOAD)
        raw = _decode(data, "base64")
        self._limit(len(raw), "a chunk")
        digest = ChunkDigest.parse(checksum) if checksum else ChunkDigest("xxh3-128", xxhash.xxh3_128_hexdigest(raw))
        receipt = await self.services.sessions.put_chunk(session_id, index, _one(raw), digest, len(raw), grant)
        doc = {"index": receipt.index, "size": receipt.size, "xxh3": receipt.xxh3, "duplicate": receipt.duplicate}
        return doc

    async def complete_session(
        self,
        session_id: str,
        size: Annotated[JsonInt | None, Field(ge=0, description="required if not given when opening")] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Verify and publish the session's content; returns its url-mode FileContent descriptor."""
        grant = self.grant(ctx)
        grant(KeyScope.UPLOAD)
        _session, record = await self.services.sessions.complete(session_id, grant, size)
        described = await self.services.files.describe(record, self.base_url(ctx), inline=False)
        return described.to_json()

    async def session_status(self, session_id: str, ctx: Context | None = None) -> dict[str, Any]:
        """Which chunks are stored and which are missing, bytes received, state and expiry."""
        grant = self.grant(ctx)
        grant(KeyScope.READ)
        return await self.services.sessions.status(session_id, grant)
