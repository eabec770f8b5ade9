"""The tools that store a file: from a local path, from bytes in the call, or through an authorised PUT outside
MCP (SEP-2631)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from pydantic import Field

from transfer.bindings.mcp.context import ExpiresIn, McpContext, _checksum, _decode, _one, _read_file
from transfer.core.auth import Scope as KeyScope
from transfer.core.model.content import FileRole
from transfer.core.model.encodings import CODECS, storage_encoding
from transfer.core.numerals import JsonInt
from transfer.core.uploads.state import FileIntent
from transfer.service.files.ingest import UploadRequest


class UploadTools(McpContext):
    """upload_file, upload_content, authorize_upload, confirm_upload."""

    async def upload_file(
        self,
        path: Annotated[str, Field(description="file to upload, relative to the allowed directory")],
        name: Annotated[str | None, Field(description="name in the descriptor (default: the file's name)")] = None,
        content_type: Annotated[str | None, Field(description="media type (default: sniffed)")] = None,
        role: FileRole | None = None,
        description: Annotated[str | None, Field(max_length=1024)] = None,
        encoding: Annotated[
            str,
            Field(description="how to store and serve it", json_schema_extra={"enum": list(CODECS.storage_names())}),
        ] = "none",
        ttl: Annotated[JsonInt | None, Field(gt=0, description="seconds the signed URL lives")] = None,
        expires_in: ExpiresIn = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Upload a local file; returns its FileContent descriptor (url mode above the inline threshold)."""
        grant = self.grant(ctx)
        grant(KeyScope.UPLOAD)
        full = self.path(path, must_exist=True)
        request = UploadRequest(
            owner=grant.owner,
            intent=FileIntent(
                name=name or full.name,
                content_type=content_type,
                role=role,
                description=description,
                lifetime=expires_in,
            ),
            declared_length=full.stat().st_size,
            store_encoding=storage_encoding(encoding),
        )
        files = self.services.files
        record = await files.upload(_read_file(full, self.settings.buffer_size), request, source="mcp")
        return await files.describe_json(record, self.base_url(ctx), ttl=ttl)

    async def upload_content(
        self,
        data: Annotated[str, Field(description="the content: text, or base64 when data_encoding is base64")],
        name: Annotated[str, Field(min_length=1, max_length=1024)],
        data_encoding: Literal["utf-8", "base64"] = "utf-8",
        content_type: str | None = None,
        role: FileRole | None = None,
        description: Annotated[str | None, Field(max_length=1024)] = None,
        checksum: Annotated[str | None, Field(description="sha256:<hex> of the bytes, verified")] = None,
        ttl: Annotated[JsonInt | None, Field(gt=0, description="seconds the signed URL lives")] = None,
        expires_in: ExpiresIn = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Store bytes given in the call (at most ``mcp_max_inline_bytes``); returns the FileContent descriptor."""
        grant = self.grant(ctx)
        grant(KeyScope.UPLOAD)
        raw = _decode(data, data_encoding)
        self._limit(len(raw), "content")
        request = UploadRequest(
            owner=grant.owner,
            intent=FileIntent(
                name=name, content_type=content_type, role=role, description=description, lifetime=expires_in
            ),
            checksum=_checksum(checksum),
            expected_size=len(raw),
        )
        files = self.services.files
        record = await files.upload(_one(raw), request, source="mcp")
        return await files.describe_json(record, self.base_url(ctx), ttl=ttl)

    async def authorize_upload(
        self,
        name: Annotated[str | None, Field(description="file name for the descriptor", max_length=1024)] = None,
        content_type: Annotated[str | None, Field(description="media type (default: sniffed)")] = None,
        max_size: Annotated[JsonInt | None, Field(gt=0, description="largest size to accept, bytes")] = None,
        start_ttl: Annotated[JsonInt | None, Field(gt=0, description="seconds to start the PUT (default 900)")] = None,
        expires_in: ExpiresIn = None,
        size: Annotated[
            JsonInt | None,
            Field(
                ge=0,
                description="the file's exact size, bytes: the PUT must send this Content-Length (signed); with "
                "checksum, content this key stores needs no PUT",
            ),
        ] = None,
        checksum: Annotated[
            str | None, Field(description="sha256:<hex> of the file, with size: content this key stores needs no PUT")
        ] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """An expiring signed URL to PUT a file to, outside MCP (SEP-2631 ``files/authorizeUpload``). Give ``size``
        when it is known: the URL then takes exactly that many bytes (the storage refuses any other length); where
        the URL is the bucket's own (``direct``), ``size`` is required."""
        grant = self.grant(ctx)
        grant(KeyScope.UPLOAD)
        return await self._authorizations.authorize_upload(
            grant,
            self.base_url(ctx),
            intent=FileIntent(name=name, content_type=content_type, lifetime=expires_in),
            max_size=max_size,
            size=size,
            start_ttl=start_ttl,
            checksum=checksum,
        )

    async def confirm_upload(
        self,
        authorization_id: Annotated[str, Field(description="the az_ id from authorize_upload")],
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """The descriptor of the file an upload authorisation received."""
        grant = self.grant(ctx)
        grant(KeyScope.UPLOAD)
        return await self._authorizations.confirm(authorization_id, grant, self.base_url(ctx))
