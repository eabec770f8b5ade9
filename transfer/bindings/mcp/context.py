"""What every tool needs to know about its call: who calls (the key over HTTP; a stdio caller may do
everything), where the URLs it hands out point, which local paths it may touch, how much one message may carry."""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field, WithJsonSchema
from starlette.requests import Request

from transfer.bindings.mcp_schemas import DESCRIPTOR_INPUT_SCHEMA
from transfer.core.auth import Grant
from transfer.core.auth import Scope as KeyScope
from transfer.core.model.content import normalize_checksum
from transfer.core.numerals import JsonInt
from transfer.errors import InvalidRequest, NotFound, TooLarge, TransferError, Unauthenticated, UploadForbidden
from transfer.service.container import Services
from transfer.service.identity.directory import Identities

# a JSON object checked by load_descriptor, published with a short schema (not the expanded union of the models)
DescriptorArgument = Annotated[dict[str, Any], WithJsonSchema(DESCRIPTOR_INPUT_SCHEMA)]


# every tool that stores a file takes its lifetime the same way
ExpiresIn = Annotated[
    JsonInt | None, Field(gt=0, description="seconds the stored file lives (default: the key's or server's)")
]


class McpContext:
    """The tools' view of one Services and of each call; ``http`` says whether calls come over HTTP (remote
    callers)."""

    def __init__(
        self,
        services: Services,
        auth: Identities | None,
        *,
        http: bool,
        root: Path | None,
        base_url: str | None = None,
    ) -> None:
        self.services = services
        self.settings = services.settings
        self.auth = auth
        self.http = http
        self.root = root.resolve() if root is not None else None
        self.served_at = base_url
        self._authorizations = services.authorizations

    def _request(self, ctx: Context | None) -> Request | None:
        if ctx is None:
            return None
        try:
            request = ctx.request_context.request
        except (AttributeError, ValueError):
            return None
        return request if isinstance(request, Request) else None

    def grant(self, ctx: Context | None) -> Grant:
        """The caller over HTTP (checked by the ``/mcp`` route before MCP saw the request, kept in its state); a
        local stdio caller may do everything."""
        if not (self.http and self.auth is not None):
            return Grant(None)
        request = self._request(ctx)
        grant = None if request is None else request.scope.get("state", {}).get("grant")
        if not isinstance(grant, Grant):
            raise Unauthenticated("this MCP call carries no checked caller")
        return grant

    def authorize(self, ctx: Context | None, scope: KeyScope) -> None:
        self.grant(ctx)(scope)

    def base_url(self, ctx: Context | None) -> str:
        """Where the URLs in descriptors point: the public URL, else the address this call came to (HTTP), else the
        HTTP server the stdio host runs beside it (which always exists: see ``transfer mcp``)."""
        if self.settings.public_url:
            return self.settings.public_url
        request = self._request(ctx)
        if request is not None:
            return str(request.base_url).rstrip("/")
        if self.served_at is None:
            raise TransferError("this MCP server has no HTTP address for the URLs it would hand out")
        return self.served_at

    def path(self, value: str, *, must_exist: bool) -> Path:
        if self.root is None:
            raise UploadForbidden("file tools are disabled on this MCP endpoint (set TRANSFER_MCP_ROOT to allow them)")
        candidate = Path(value)
        full = (candidate if candidate.is_absolute() else self.root / candidate).resolve()
        if not full.is_relative_to(self.root):
            raise UploadForbidden(f"{value!r} is outside the allowed directory {str(self.root)!r}")
        if must_exist and not full.is_file():
            raise NotFound(f"no file {value!r}")
        return full

    def _limit(self, size: int, what: str) -> None:
        cap = self.settings.mcp_max_inline_bytes
        if size > cap:
            raise TooLarge(
                f"{what} of {size} bytes is more than one MCP message may carry ({cap}); use upload_file with a "
                "path, or a session with smaller chunks",
                limit=cap,
            )


async def _read_file(path: Path, buffer_size: int) -> AsyncIterator[bytes]:
    import aiofiles

    async with aiofiles.open(path, "rb") as f:
        while piece := await f.read(buffer_size):
            yield piece


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _decode(data: str, encoding: str) -> bytes:
    if encoding == "utf-8":
        return data.encode("utf-8")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("data is not valid base64") from None


def _checksum(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return normalize_checksum(value)
    except ValueError as exc:
        raise InvalidRequest(f"checksum: {exc}") from None
