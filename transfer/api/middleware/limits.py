"""Size limits on request headers, and on control-plane request bodies (JSON: sessions, bundles, imports, TP,
JSON-RPC, MCP); and the minimum-rate rule every request body is held to (:class:`MinRate`).

Those bodies are parsed whole, so they are capped before parsing: a ``Content-Length`` over the limit is refused at
once, and a chunked body is cut off as soon as it passes the limit (413 ``payload_too_large``). Data-plane bodies
(file uploads, session chunks, tus PATCH) stream to storage and have their own limits.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from transfer.api.responses import AsciiJSONResponse
from transfer.core.numerals import decimal
from transfer.errors import HeadersTooLarge, TooLarge

CONTROL_PREFIXES = ("/v1/bundles", "/v1/imports", "/tp/v1", "/a2a", "/mcp")


def _is_control(method: str, path: str) -> bool:
    if path.startswith(CONTROL_PREFIXES):
        return True
    # session create and complete are JSON; chunk PUTs are data
    return method == "POST" and (
        path == "/v1/sessions" or (path.startswith("/v1/sessions/") and path.endswith("/complete"))
    )


class MinRate:
    """A body must keep arriving at ``min_rate`` bytes/s over a sliding window of ``window`` seconds (a leaky
    bucket): the client may keep the server waiting ``window`` seconds at first, each byte it sends buys another
    ``1 / min_rate`` seconds, and what it has bought never adds up to more than ``window`` seconds. So a body that
    stalls after a fast start is cut ``window`` seconds into the stall, not after ``received / min_rate`` seconds
    (an average rate, which a fast first gigabyte would have let idle for an hour and more). Pure: the caller
    measures the waiting."""

    __slots__ = ("window", "min_rate", "credit")

    def __init__(self, window: float, min_rate: float) -> None:
        self.window = window
        self.min_rate = min_rate
        self.credit = window  # seconds the client may still keep the server waiting

    def allowance(self) -> float:
        """Seconds the next wait may last."""
        return max(0.0, self.credit)

    def account(self, waited: float, received: int) -> None:
        """``waited`` seconds passed waiting for the client, and ``received`` bytes came."""
        self.credit = min(self.window, self.credit - waited + received / self.min_rate)


class _BodyTooLarge(HTTPException):
    """An HTTPException, so that FastAPI's body parsing lets it through as a 413 (it turns other errors into 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


class ControlBodyLimit:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _is_control(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        error = TooLarge(f"request body larger than {self.limit} bytes", limit=self.limit)
        for name, value in scope.get("headers", []):
            length = decimal(value.decode("latin-1")) if name == b"content-length" else None
            if length is not None and length > self.limit:
                await AsciiJSONResponse(error.to_payload(), status_code=413)(scope, receive, send)
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise _BodyTooLarge(self.limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await AsciiJSONResponse(error.to_payload(), status_code=413)(scope, receive, send)


class HeaderLimit:
    """431 when the request's header fields together exceed ``limit`` bytes (the HTTP parser itself has no cap)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            size = sum(len(k) + len(v) + 4 for k, v in scope.get("headers", []))
            if size > self.limit:
                error = HeadersTooLarge(f"request header fields exceed {self.limit} bytes", limit=self.limit)
                if scope["type"] == "http":
                    await AsciiJSONResponse(error.to_payload(), status_code=431)(scope, receive, send)
                else:
                    await send({"type": "websocket.close", "code": 1009, "reason": "headers too large"})
                return
        await self.app(scope, receive, send)
