"""The MCP server: every tool registered with its texts and result model, every failure of a call as our JSON
error, and the streamable HTTP app of ``/mcp``."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, ParamSpec

import httpx
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, InputRequiredResult, TextContent
from pydantic import BaseModel, Field, ValidationError
from starlette.types import ASGIApp

from transfer import __version__
from transfer.bindings.mcp.files import FileTools
from transfer.bindings.mcp.resolve import ResolveTools
from transfer.bindings.mcp.sessions import SessionTools
from transfer.bindings.mcp.tp import TpTools
from transfer.bindings.mcp.uploads import UploadTools
from transfer.bindings.mcp_schemas import (
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
from transfer.errors import InvalidRequest, NotFound, TransferError
from transfer.service.container import Services
from transfer.service.identity.directory import Identities

P = ParamSpec("P")


logger = logging.getLogger(__name__)


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


class McpBinding(UploadTools, SessionTools, FileTools, ResolveTools, TpTools):
    """The tools, bound to one Services; ``http`` says whether calls come over HTTP (remote callers)."""


def build_mcp(
    services: Services, auth: Identities | None, *, http: bool, root: Path | None, base_url: str | None = None
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


def mcp_http_app(services: Services, auth: Identities) -> tuple[ASGIApp, StreamableHTTPSessionManager]:
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
