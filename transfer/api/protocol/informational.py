"""Interim (1xx) responses on uvicorn's HTTP/1.1 protocol, as the ASGI extension ``http.response.informational``.

uvicorn (0.54) writes only ``100 Continue`` on HTTP/1.1 and ``103 Early Hints`` on HTTP/2 (zttp); an application has
no way to send ``104 Upload Resumption Supported`` (draft-ietf-httpbis-resumable-upload §5). This protocol adds it:
the request scope carries ``extensions["http.response.informational"]`` and the application may send, any number of
times before ``http.response.start``::

    {"type": "http.response.informational", "status": 104, "headers": [(b"location", b"...")]}

The interim response is written to the transport at once, on the event loop, with no copy of the body path: the
final response is uvicorn's own code, the request body :mod:`transfer.api.protocol.bodyread`'s.

Rules kept (RFC 9110 §15.2): never to an HTTP/1.0 client (the extension is not offered), never 101 (it ends the
exchange) nor a status outside 1xx, never after the final response started; header fields are validated like any
response header (no CR, LF or NUL: a value could otherwise inject a response).
"""

from __future__ import annotations

from typing import Any

from transfer.api.protocol.bodyread import BodyCycle, BodyProtocol, drain_within

EXTENSION = "http.response.informational"

REASONS = {100: b"Continue", 102: b"Processing", 103: b"Early Hints", 104: b"Upload Resumption Supported"}
_FORBIDDEN = frozenset(b"\r\n\x00")


def interim_head(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The bytes of one HTTP/1.1 interim response; ValueError for a status or field that may not be sent."""
    if not 100 <= status <= 199 or status == 101:
        raise ValueError(f"{status} is not an interim status (1xx other than 101)")
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"Informational"))]
    for name, value in headers:
        if not name or _FORBIDDEN.intersection(name) or b":" in name or _FORBIDDEN.intersection(value):
            raise ValueError(f"invalid header field {name!r}")
        lines.append(name + b": " + value + b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


class InformationalCycle(BodyCycle):
    """uvicorn's request/response cycle that also accepts ``http.response.informational`` messages."""

    async def send(self, message: Any) -> None:
        if message["type"] != "http.response.informational":
            await super().send(message)
            return
        if self.response_started:
            raise RuntimeError("an interim response cannot follow the final response")
        head = interim_head(int(message["status"]), list(message.get("headers", [])))
        if self.disconnected or self.transport.is_closing():
            return
        if self.flow.write_paused:
            if self.send_timeout is None:
                await self.flow.drain()
            else:
                await drain_within(self, self.send_timeout)
            if self.disconnected:
                return
        self.transport.write(head)


class InformationalProtocol(BodyProtocol):
    """uvicorn's httptools protocol offering :data:`EXTENSION` to every HTTP/1.1 request."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # the cycle was made for this request just now; its task has not run yet, so the scope and the class may
        # still change. An upgrade (WebSocket) leaves no cycle; HTTP/1.0 clients must not get 1xx (RFC 9110 §15.2)
        if cycle is None or cycle.scope is not self.scope or type(cycle) is not BodyCycle:
            return
        if self.scope.get("http_version") != "1.1":
            return
        cycle.__class__ = InformationalCycle
        extensions: dict[str, Any] = dict(self.scope.get("extensions") or {})
        extensions[EXTENSION] = {}
        self.scope["extensions"] = extensions
