"""The Telepathy Protocol over MCP tools (``tp_<message_type>`` with a ``tp_envelope``, and ``tp_poll_messages``)."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context
from pydantic import Field

from transfer.bindings.mcp.context import McpContext
from transfer.core.agents.tp import Binding, validate_envelope
from transfer.errors import InvalidRequest, TooLarge


class TpTools(McpContext):
    """tp (behind the tp_<message_type> tools) and tp_poll_messages."""

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
