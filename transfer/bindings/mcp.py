"""MCP tools over the one service layer (official ``mcp`` SDK, 2.x ``MCPServer``), on stdio (``transfer mcp``) and
streamable HTTP (``/mcp`` of ``transfer serve``).

Large content never travels inside an MCP message: tools take a local path (or at most ``mcp_max_inline_bytes``
of given bytes / one chunk) and return Synapse descriptors (url or streaming mode); ``resolve`` writes to a path
and returns content inline only within the inline threshold. Errors come back as MCP tool errors whose text is our
JSON error body ``{"error": {"code", "message", "status", ...}}``.

File paths are confined to a root directory: on stdio the working directory (or ``TRANSFER_MCP_ROOT``); over HTTP
the file tools are disabled unless ``TRANSFER_MCP_ROOT`` is set, and server-side fetches are SSRF-guarded.
Over HTTP every request needs an API key (when keys are configured); each tool checks its own scope.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
import logging
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Literal, ParamSpec

import httpx
import xxhash
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, InputRequiredResult, TextContent
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema
from starlette.requests import Request
from starlette.types import ASGIApp

from transfer import __version__
from transfer.bindings.mcp_schemas import (
    DESCRIPTOR_INPUT_SCHEMA,
    Bundle,
    ChunkReceipt,
    Descriptor,
    DownloadAuthorization,
    FileList,
    Messages,
    OpenedSession,
    Resolved,
    SessionStatus,
    TpAnswer,
    UploadAuthorization,
    inline_enum_refs,
    tool_texts,
)
from transfer.core.agents.tp import Binding, validate_envelope
from transfer.core.auth import Authenticator, Grant
from transfer.core.auth import Scope as KeyScope
from transfer.core.model.content import (
    BundleItemRole,
    ContentBundle,
    DownloadMethod,
    FileContent,
    FileRole,
    load_descriptor,
    normalize_checksum,
)
from transfer.core.model.content import (
    TextContent as SynapseText,
)
from transfer.core.model.encodings import CODECS, storage_encoding
from transfer.core.model.mime import is_textual
from transfer.core.numerals import JsonBool, JsonInt
from transfer.core.uploads.state import FileIntent
from transfer.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    TooLarge,
    TransferError,
    UploadForbidden,
)
from transfer.service.container import Services
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.service import LIST_DEFAULT, LIST_MAX
from transfer.service.uploads.session_views import session_document
from transfer.service.uploads.sessions import ChunkDigest

P = ParamSpec("P")
logger = logging.getLogger(__name__)

# a JSON object checked by load_descriptor, published with a short schema (not the expanded union of the models)
DescriptorArgument = Annotated[dict[str, Any], WithJsonSchema(DESCRIPTOR_INPUT_SCHEMA)]

INSTRUCTIONS = (
    "Moves content too large for a chat message. Upload a file (upload_file) or a chunked stream (open_session, "
    "send_chunk, complete_session) and pass the returned Synapse FileContent descriptor to another agent; it "
    "resolves it to a local file with resolve (SHA-256 verified). Content up to the inline threshold travels inline."
)


def _as_result(
    fn: Callable[P, Awaitable[dict[str, Any]]], result: type[BaseModel]
) -> Callable[P, Awaitable[CallToolResult]]:
    """A tool's answer as an MCP result: its JSON both as text and as structured content, published and checked
    (by the SDK, on every call) as the model ``result``; our errors as ``isError`` results whose text is the JSON
    error body."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> CallToolResult:
        try:
            body = await fn(*args, **kwargs)
        except TransferError as exc:
            return error_result(exc)
        text = json.dumps(body, ensure_ascii=False)
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=body)

    # the SDK derives the output schema from the return annotation: the result model, not CallToolResult
    wrapper.__signature__ = inspect.signature(fn, eval_str=True).replace(  # type: ignore[attr-defined]
        return_annotation=result
    )
    return wrapper


def error_result(exc: TransferError) -> CallToolResult:
    """The MCP form of an error: ``isError`` with our JSON error body (plus ``retryable``) as its text. No
    structured content: clients check structured content against the tool's output schema, which describes
    results, and reject the whole answer when an error body does not fit it (the Inspector does)."""
    body = exc.to_payload()
    body["error"]["retryable"] = exc.retryable
    text = json.dumps(body, ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


class TransferMcpServer(MCPServer):
    """The SDK's server, with every failure of a call as our JSON error: arguments that do not fit the tool's input
    schema are ``invalid_request`` (naming each field and what is wrong, never echoing the value), an unknown tool
    is ``not_found``, and anything unforeseen is ``internal_error`` without a stack trace."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self._tool_manager.get_tool(name)
        if tool is None:
            return error_result(NotFound(f"no tool {name!r}; tools/list names the tools of this server"))
        # the SDK drops arguments its model does not know; a caller who misspells one must hear so
        unknown = sorted(set(arguments) - set(tool.parameters.get("properties", {})))
        if unknown:
            problems = [{"field": field, "problem": "not an argument of this tool"} for field in unknown[:20]]
            return error_result(
                InvalidRequest(f"{name}: unknown arguments: {', '.join(unknown)[:200]}", errors=problems)
            )
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError) and not isinstance(exc, UnexpectedToolError):
                problems = [
                    {"field": ".".join(str(p) for p in e["loc"]) or "arguments", "problem": e["msg"]}
                    for e in cause.errors(include_url=False, include_input=False)
                ]
                summary = "; ".join(f"{p['field']}: {p['problem']}" for p in problems[:5])
                return error_result(InvalidRequest(f"{name}: invalid arguments: {summary}", errors=problems[:20]))
            logger.exception("tool %r failed", name)
            return error_result(TransferError(f"{name} failed unexpectedly"))


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


# every tool that stores a file takes its lifetime the same way
ExpiresIn = Annotated[
    JsonInt | None, Field(gt=0, description="seconds the stored file lives (default: the key's or server's)")
]


class McpBinding:
    """The tools, bound to one Services; ``http`` says whether calls come over HTTP (remote callers)."""

    def __init__(
        self,
        services: Services,
        auth: Authenticator | None,
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

    # -- context: who calls, where URLs point, which paths are allowed ------------------------------------------

    def _request(self, ctx: Context | None) -> Request | None:
        if ctx is None:
            return None
        try:
            request = ctx.request_context.request
        except (AttributeError, ValueError):
            return None
        return request if isinstance(request, Request) else None

    def grant(self, ctx: Context | None) -> Grant:
        """The caller's key over HTTP; a local stdio caller may do everything."""
        request = self._request(ctx)
        if self.http and self.auth is not None:
            return self.auth.authorizer(request.headers.get("authorization") if request else None)
        return Grant(None)

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

    # -- tools ---------------------------------------------------------------------------------------------------

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

    async def resolve(
        self,
        descriptor: DescriptorArgument,
        path: Annotated[
            str | None, Field(description="where to write (a directory for a bundle); omit for small content")
        ] = None,
        overwrite: Annotated[JsonBool, Field(description="replace existing files at path")] = False,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """Download, verify (SHA-256, size) and decode content to a local path. Without a path, content within the
        inline threshold comes back in the result (text as text, other bytes as base64). Writing to a path needs
        the upload scope and never replaces an existing file unless ``overwrite`` is true."""
        grant = self.grant(ctx)
        grant(KeyScope.READ)
        if path is not None:
            grant(KeyScope.UPLOAD)  # it writes to the server's disk
        parsed = load_descriptor(descriptor, inline_threshold=self.settings.inline_threshold)
        async with self.services.resolve.resolver(guarded=self.http) as resolver:
            if isinstance(parsed, ContentBundle):
                if path is None:
                    raise InvalidRequest("a bundle resolves into a directory: give path")
                target = self.path(path, must_exist=False)
                target.mkdir(parents=True, exist_ok=True)
                with _staging(target) as staging:
                    resolved = await resolver.bundle_to_dir(parsed, staging)
                    placed = _place_all([(p, target / p.name) for p in resolved], overwrite=overwrite)
                return {"directory": str(target), "files": [str(p) for p in placed]}
            if path is None:
                self.services.resolve.check_small(parsed)
                data = await resolver.to_bytes(parsed, max_size=self.settings.inline_threshold)
                media = parsed.content_type if isinstance(parsed, FileContent) else "text/plain"
                if isinstance(parsed, SynapseText) or is_textual(media or ""):
                    try:
                        return {"content": data.decode("utf-8"), "content_encoding": "utf-8", "size": len(data)}
                    except UnicodeDecodeError:
                        pass
                return {"content": base64.b64encode(data).decode(), "content_encoding": "base64", "size": len(data)}
            dest = self.path(path, must_exist=False)
            if dest.exists() and not overwrite:  # early answer; _place_all checks again when it places the file
                raise Conflict(f"{path!r} exists; pass overwrite=true to replace it")
            dest.parent.mkdir(parents=True, exist_ok=True)
            with _staging(dest.parent) as staging:
                resolved_file = await resolver.to_path(parsed, staging / dest.name)
                (written,) = _place_all([(resolved_file, dest)], overwrite=overwrite)
            out: dict[str, Any] = {"path": str(written), "size": written.stat().st_size}
            if isinstance(parsed, FileContent) and parsed.checksum:
                out["checksum"] = parsed.checksum
            return out

    async def resolve_inline(self, descriptor: DescriptorArgument, ctx: Context | None = None) -> dict[str, Any]:
        """``resolve`` where tools may not touch local paths (HTTP without an allowed directory): small content
        only, returned in the result."""
        return await self.resolve(descriptor, None, False, ctx)

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

    async def tp(self, message_type: str, tp_envelope: dict[str, Any], ctx: Context | None) -> dict[str, Any]:
        envelope = validate_envelope(tp_envelope)
        if len(envelope.raw) > self.settings.tp_max_envelope_size:
            raise TooLarge("envelope too large", limit=self.settings.tp_max_envelope_size)
        if envelope.message_type != message_type:
            raise InvalidRequest(f"this tool takes {message_type}; the envelope is {envelope.message_type}")
        outcome = await self.services.tp.handle(envelope, Binding.MCP_TOOL_CALL, self.grant(ctx), self.base_url(ctx))
        return outcome.body()

    async def tp_poll_messages(
        self,
        receiver: Annotated[str | dict[str, Any], Field(description="your TP identity (the envelopes' receiver)")],
        limit: Annotated[int, Field(ge=1, le=500)] = 50,
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        """TP messages waiting for ``receiver`` (oldest first; each is delivered once)."""
        return {"messages": await self.services.tp.poll(receiver, self.grant(ctx), limit)}


def build_mcp(
    services: Services, auth: Authenticator | None, *, http: bool, root: Path | None, base_url: str | None = None
) -> MCPServer:
    """The MCP server with the tools that work on this host: over HTTP without an allowed directory there is no
    upload_file and resolve takes no path (they could only be refused). ``base_url``: where a stdio host serves
    the URLs it hands out (HTTP callers get the address they called)."""
    binding = McpBinding(services, auth, http=http, root=root, base_url=base_url)
    server = TransferMcpServer(
        "transfer", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING", warn_on_duplicate_tools=True
    )
    settings = services.settings
    file_tools = binding.root is not None
    texts = tool_texts(inline=settings.inline_threshold, message=settings.mcp_max_inline_bytes, file_tools=file_tools)
    tools: list[tuple[str, Callable[..., Awaitable[dict[str, Any]]], type[BaseModel]]] = [
        ("upload_file", binding.upload_file, Descriptor),
        ("upload_content", binding.upload_content, Descriptor),
        ("open_session", binding.open_session, OpenedSession),
        ("send_chunk", binding.send_chunk, ChunkReceipt),
        ("complete_session", binding.complete_session, Descriptor),
        ("session_status", binding.session_status, SessionStatus),
        ("describe", binding.describe, Descriptor),
        ("list_files", binding.list_files, FileList),
        ("authorize_upload", binding.authorize_upload, UploadAuthorization),
        ("confirm_upload", binding.confirm_upload, Descriptor),
        ("authorize_download", binding.authorize_download, DownloadAuthorization),
        ("resolve", binding.resolve if file_tools else binding.resolve_inline, Resolved),
        ("create_bundle", binding.create_bundle, Bundle),
        ("tp_poll_messages", binding.tp_poll_messages, Messages),
    ]
    for mtype in ("resource_mount", "resource_unmount", "resource_notify"):
        tools.append((f"tp_{mtype}", _tp_tool(binding, mtype), TpAnswer))
    for name, fn, result in tools:
        if name == "upload_file" and not file_tools:
            continue
        description, annotations = texts[name]
        server.add_tool(
            _as_result(fn, result),
            name=name,
            description=description,
            annotations=annotations,
            structured_output=True,
        )
        tool = server._tool_manager.get_tool(name)
        assert tool is not None
        inline_enum_refs(tool.parameters)
        if tool.output_schema is not None:
            inline_enum_refs(tool.output_schema)
    return server


def _tp_tool(binding: McpBinding, message_type: str) -> Callable[..., Awaitable[dict[str, Any]]]:
    async def tool(
        tp_envelope: Annotated[
            dict[str, Any],
            Field(description="a complete TP MessageEnvelope of the message type this tool is named for"),
        ],
        ctx: Context | None = None,
    ) -> dict[str, Any]:
        return await binding.tp(message_type, tp_envelope, ctx)

    tool.__name__ = f"tp_{message_type}"
    return tool


def mcp_http_app(services: Services, auth: Authenticator) -> tuple[ASGIApp, StreamableHTTPSessionManager]:
    """The MCP tools over streamable HTTP: the ASGI app that serves ``/mcp`` and the session manager that must run
    (``async with manager.run()``) while it serves. API keys are checked before this app is called
    (:mod:`transfer.bindings.mcp_http`); each tool checks its own scope."""
    settings = services.settings
    server = build_mcp(services, auth if auth.enabled else None, http=True, root=settings.mcp_root)
    allowed_hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    if settings.public_url:
        allowed_hosts.append(httpx.URL(settings.public_url).netloc.decode())
    # DNS-rebinding protection matters when the service runs open on a developer's machine; with keys, the key
    # is the protection and any Host may reach it
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=not auth.enabled and settings.host in ("127.0.0.1", "localhost", "::1"),
        allowed_hosts=allowed_hosts,
        allowed_origins=[f"http://{h}" for h in allowed_hosts],
    )
    server.streamable_http_app(
        transport_security=security, max_request_body_size=settings.mcp_max_inline_bytes * 2 + (1 << 20)
    )
    return StreamableHTTPASGIApp(server.session_manager), server.session_manager


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


@contextmanager
def _staging(directory: Path) -> Iterator[Path]:
    """A private directory beside the destination (same file system, so placing is a link, not a copy); removed
    with whatever is left in it."""
    staging = directory / f".transfer-{secrets.token_hex(6)}"
    staging.mkdir()
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _place_all(moves: list[tuple[Path, Path]], *, overwrite: bool) -> list[Path]:
    """Move verified files to their destinations. Without ``overwrite`` every destination must be free: checked
    for all first, then each placed with link(2), which fails rather than replace a file that appeared meanwhile
    (Conflict; what this call already placed is taken back)."""
    if not overwrite:
        taken = [str(dest) for _, dest in moves if dest.exists()]
        if taken:
            raise Conflict(f"{', '.join(taken)[:200]} exists; pass overwrite=true to replace", existing=taken[:20])
    placed: list[Path] = []
    try:
        for source, dest in moves:
            if overwrite:
                os.replace(source, dest)
            else:
                os.link(source, dest)
            placed.append(dest)
    except FileExistsError as exc:
        for dest in placed:
            dest.unlink(missing_ok=True)
        raise Conflict(f"{exc.filename} appeared while resolving; nothing was replaced") from None
    return placed
