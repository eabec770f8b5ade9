"""The tools on stored files: a fresh descriptor, a page of the listing, a download URL, a bundle."""

from __future__ import annotations

import json
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from transfer.bindings.mcp.context import McpContext
from transfer.core.auth import Scope as KeyScope
from transfer.core.model.content import BundleItemRole, DownloadMethod
from transfer.core.numerals import JsonInt
from transfer.errors import InvalidRequest
from transfer.service.files.service import LIST_DEFAULT, LIST_MAX


def _content_text(value: Any) -> Any:
    """An item's content given as an object (what callers that are not strict send) becomes its JSON text."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else value


class BundleItemInput(BaseModel):
    """One bundle item: a stored file (file_id) or inline text, JSON or code (content)."""

    # ``content`` is the Synapse content object as JSON text (an object is taken too). Its schema says string, not
    # object, so that the tool suits strict callers (openai-agents' strict mode wants every object closed with every
    # property listed): the seed's JSONContent.data and every content's metadata are any JSON value, which no closed
    # schema can state without renaming or narrowing the seed's fields. The text is parsed and checked by the same
    # loader as every other door (parse_descriptor), with errors that name the field.
    model_config = ConfigDict(extra="forbid")

    role: BundleItemRole
    id: str | None = Field(default=None, max_length=256)
    file_id: str | None = Field(default=None, pattern=r"^f_[0-9a-f]{32}$")
    content: Annotated[str | None, BeforeValidator(_content_text)] = Field(
        default=None,
        max_length=16 << 20,
        description='the item as a Synapse TextContent, JSONContent or CodeContent in JSON text, e.g. {"type": '
        '"inline", "content_type": "text/plain", "charset": "utf-8", "data": "..."}',
    )

    def as_item(self, n: int) -> dict[str, Any]:
        """The item as the bundle service takes it (content parsed from its JSON text)."""
        doc = self.model_dump(exclude_none=True)
        if self.content is not None:
            try:
                doc["content"] = json.loads(self.content)
            except ValueError as exc:
                raise InvalidRequest(f"item {n}: content is not JSON text: {exc}") from None
        return doc


class FileTools(McpContext):
    """describe, list_files, authorize_download, create_bundle."""

    async def describe(
        self,
        file_id: Annotated[str, Field(description="the f_ id of a stored file")],
        ttl: Annotated[JsonInt | None, Field(gt=0, description="seconds the signed URL lives")] = None,
        download_method: DownloadMethod | None = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """A fresh FileContent descriptor (new signed URL) for a stored file."""
        grant = self.grant(ctx)
        grant(KeyScope.READ)
        files = self.services.files
        record = await files.record(file_id, grant)
        described = await files.describe(record, self.base_url(ctx), ttl=ttl, download_method=download_method)
        return described.to_json()

    async def list_files(
        self,
        limit: Annotated[int, Field(ge=1, le=LIST_MAX, description="files per page")] = LIST_DEFAULT,
        cursor: Annotated[
            str | None, Field(max_length=200, description="next_cursor of the previous page (opaque)")
        ] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """A page of stored files with the cursor of the next page."""
        grant = self.grant(ctx)
        grant(KeyScope.READ)
        files = self.services.files
        page = await files.list(grant, limit, cursor)
        base = self.base_url(ctx)
        items = [await files.describe_json(r, base, inline=False) for r in page.records]
        return {"files": items, "next_cursor": page.next_cursor}

    async def authorize_download(
        self,
        file_id: Annotated[str, Field(description="the f_ id of a stored file")],
        ttl: Annotated[
            JsonInt | None, Field(gt=0, description="seconds the URL lives (default 900, at most 3600)")
        ] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """An expiring GET URL for a stored file (SEP-2631 ``files/authorizeDownload``)."""
        grant = self.grant(ctx)
        grant(KeyScope.READ)
        return await self._authorizations.authorize_download(file_id, grant, self.base_url(ctx), ttl=ttl)

    async def create_bundle(
        self,
        items: Annotated[list[BundleItemInput], Field(min_length=1)],
        name: str | None = None,
        description: str | None = None,
        expires_in: Annotated[
            JsonInt | None, Field(gt=0, description="seconds the bundle lives (default: the key's or server's)")
        ] = None,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Group stored files and inline content into a ContentBundle."""
        grant = self.grant(ctx)
        grant(KeyScope.UPLOAD)
        bundles = self.services.bundles
        docs = [item.as_item(n) for n, item in enumerate(items)]
        bundle_id = await bundles.create(docs, grant, name=name, description=description, expires_in=expires_in)
        return (await bundles.describe(bundle_id, self.base_url(ctx), grant)).to_json()
