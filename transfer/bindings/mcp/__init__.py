"""MCP tools over the one service layer (official ``mcp`` SDK, 2.x ``MCPServer``), on stdio (``transfer mcp``) and
streamable HTTP (``/mcp`` of ``transfer serve``).

Large content never travels inside an MCP message: tools take a local path (or at most ``mcp_max_inline_bytes``
of given bytes / one chunk) and return Synapse descriptors (url or streaming mode); ``resolve`` writes to a path
and returns content inline only within the inline threshold. Errors come back as MCP tool errors whose text is our
JSON error body ``{"error": {"code", "message", "status", ...}}``.

File paths are confined to a root directory: on stdio the working directory (or ``TRANSFER_MCP_ROOT``); over HTTP
the file tools are disabled unless ``TRANSFER_MCP_ROOT`` is set, and server-side fetches are SSRF-guarded.
Over HTTP every request needs an API key (when keys are configured); each tool checks its own scope.

The tools by area, each a class over :class:`~transfer.bindings.mcp.context.McpContext` (who calls, where URLs
point, which paths are allowed): ``uploads``, ``sessions``, ``files``, ``resolve``, ``tp``; ``server`` gathers them
into :class:`~transfer.bindings.mcp.server.McpBinding` and registers them with the SDK's server.
"""

from transfer.bindings.mcp.server import McpBinding, build_mcp, error_result, mcp_http_app

__all__ = ["McpBinding", "build_mcp", "error_result", "mcp_http_app"]
