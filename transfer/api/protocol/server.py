"""How the app is served: one uvicorn configuration for ``transfer serve``, the tests and the benchmarks.

WebSocket keep-alive follows TP §9.2.2: a ping every ``tp_ping_interval`` (30 s), a pong due within
``tp_pong_timeout`` (10 s), and after two consecutive missed pongs the connection is closed with 1008 and a TPError
(TP-TRA010) as the close reason. ASGI gives applications no access to ping/pong frames, so this lives in a small
subclass of uvicorn's sans-I/O websockets protocol (uvicorn's own rule is one miss -> 1011).

Slow clients are shed in two places (a connection must not be held open at a byte per second):

- the request head: uvicorn has no header timeout, so :class:`HeadTimeoutProtocol` (uvicorn's httptools protocol
  plus one timer) gives each request ``http_header_timeout`` seconds from its first byte (from the connection, for
  the first request) to its last header field; then 408 ``request_timeout`` and the connection is closed. It has to
  be in the protocol: the ASGI application only exists once the head is complete.
- the body: :class:`BodyRateGuard` (ASGI) holds a body to ``http_body_min_rate`` bytes/s over a sliding window of
  ``http_body_grace`` seconds (:class:`transfer.api.middleware.limits.MinRate`: a stall after a fast start is cut after
  the window, not after bytes ÷ rate), counting only the time spent waiting for the client (not time the
  application spent writing to storage); then 408 and the application sees the client as gone, so an upload aborts
  and removes its temp file exactly as for a client that disconnected.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from transfer.api.middleware.limits import MinRate
from transfer.api.protocol import zerocopy
from transfer.api.protocol.admission import Ticket
from transfer.api.protocol.informational import InformationalProtocol
from transfer.errors import HeadersTooLarge, InvalidHost, RequestTimeout, TransferError
from transfer.settings import Settings

HEARTBEAT_CLOSE_REASON = json.dumps(
    {"code": "TP-TRA010", "message": "two pongs missed", "retryable": True}, separators=(",", ":")
)


class TPWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol with TP's heartbeat rule: close 1008 + TPError after two missed pongs."""

    missed_pongs = 0
    ticket: Ticket | None = None  # the connection's place in the limits, handed on at the upgrade

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None
        super().connection_lost(exc)

    def handle_pong(self, event: Any) -> None:
        if self.pending_ping_payload is not None and bytes(event.data) == self.pending_ping_payload:
            self.missed_pongs = 0
        super().handle_pong(event)

    def shutdown(self) -> None:
        """uvicorn's shutdown (close 1012, "service restart"), except on a connection whose peer has closed it
        already: the library has answered that close and the transport is closing; a second close frame is refused
        (``InvalidState``), and uvicorn's shutdown, which calls this for every connection in turn, ended there —
        the other connections left open and the application's lifespan shutdown never run. Then only the transport
        is closed, as uvicorn does once a closing handshake is complete."""
        if self.handshake_complete and not self.close_sent and self.conn.state is not State.OPEN:
            self.stop_keepalive()
            self.transport.close()
            return
        super().shutdown()

    def keepalive_timeout(self) -> None:
        self.pong_timer = None
        self.pending_ping_payload = None
        if self.close_sent or self.transport.is_closing():
            return
        self.missed_pongs += 1
        if self.missed_pongs < 2:
            self.schedule_ping()
            return
        self.conn.send_close(1008, HEARTBEAT_CLOSE_REASON)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.transport.close()


def _error_body(error: TransferError) -> bytes:
    return json.dumps(error.to_payload(), separators=(",", ":")).encode("ascii")


def _timeout_body(message: str) -> bytes:
    return _error_body(RequestTimeout(message))


SHUTDOWN_STALL = 1.0  # seconds a response may make no progress once the server shuts down (else send_timeout)
HEAD_LINE = 16 << 10  # bytes of a request line, besides the header fields (a signed URL is a few hundred)
LINGER, LINGER_BYTES = 1.0, 4 << 20  # after an answer that ends the connection (HeadTimeoutProtocol._answer_and_close)


class _HostRule(Exception):
    """Raised inside the parser's callback: the request breaks RFC 9112 §3.2 (the parser stops there)."""


class HeadTimeoutProtocol(InformationalProtocol):
    """uvicorn's httptools protocol with a deadline for each request head (set ``header_timeout`` in a subclass:
    :func:`head_timeout_protocol`), the zero-copy send extension on every request
    (:mod:`transfer.api.protocol.zerocopy`), a send timeout on every response (``send_timeout``: a response whose
    reader takes no bytes for that long closes the connection, :class:`transfer.api.protocol.bodyread.BodyCycle`),
    and the Host rule of RFC 9112 §3.2 (an HTTP/1.1 request with no ``Host`` or several: ``400 invalid_host`` with a
    JSON error body, and the connection closes)."""

    header_timeout: float = 30.0
    send_timeout: float | None = None
    head_limit: int = (64 << 10) + HEAD_LINE  # bytes of one request head (max_header_size and its request line)
    ticket: Ticket | None = None  # the connection's place in the limits (transfer.api.protocol.admission)
    _head_timer: asyncio.TimerHandle | None = None
    _bad_host: int | None = None  # how many Host fields the refused request had
    _in_head = False  # a request head has begun and is not complete
    _head_bytes = 0  # bytes read while it was under way (from the read after the one it began in)
    _stall_check: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # a connection that sends nothing at all is shed too

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        if self._head_timer is None:  # the first request's clock started with the connection
            self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # answered and closing: what the client still sends is dropped (see _answer_and_close)
            self._lingering -= len(data)
            if self._lingering <= 0:
                self.transport.close()
            return
        # httptools holds a head's bytes (a header value of any length) until the head is complete, and has no
        # limit of its own: the header timeout alone would let a client send as much as it can in that time
        counting = self._in_head
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            if counting:  # the read the head began in may hold the end of the previous request: not counted
                self._head_bytes += len(data)
            if self._head_bytes > self.head_limit:
                self._in_head = False
                error = HeadersTooLarge(
                    f"request head over {self.head_limit} bytes (header fields and request line)", limit=self.head_limit
                )
                self._answer_and_close(b"431 Request Header Fields Too Large", error)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        if self.parser.get_http_version() == "1.1":
            hosts = sum(1 for name, _ in self.headers if name == b"host")
            if hosts != 1:  # RFC 9112 §3.2: "400 (Bad Request) ... lacks a Host header field ... or more than one"
                self._bad_host = hosts
                raise _HostRule
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle is not before:  # a new request (not an upgrade); its task has not run yet
            cycle.send_timeout = self.send_timeout  # type: ignore[attr-defined]  # read by BodyCycle.send
            # the zero-copy extension, never over TLS: sendfile(2) would write the file's plain bytes past the
            # encryption (transfer.api.protocol.tls)
            if self.transport.get_extra_info("sslcontext") is None:
                zerocopy.enable(cycle, send_timeout=self.send_timeout)

    def send_400_response(self, msg: str) -> None:
        """The Host rule's 400 with a JSON error body; any other request the parser refused gets uvicorn's own
        answer (``tests/test_body_smuggling.py`` holds the framing of those to stock uvicorn's byte for byte)."""
        if self._bad_host is None:
            super().send_400_response(msg)
            return
        error = InvalidHost(
            "an HTTP/1.1 request carries exactly one Host header field (RFC 9112 §3.2); "
            + ("none was sent" if self._bad_host == 0 else f"{self._bad_host} were sent"),
            host_fields=self._bad_host,
        )
        self._answer_and_close(b"400 Bad Request", error)

    _lingering = 0  # bytes still to drop before the socket closes, after an answer that ends the connection

    def _answer_and_close(self, status: bytes, error: TransferError) -> None:
        """Answer and end the connection, lingering: the answer and a FIN go out, what the client is still sending
        is read and dropped for up to ``LINGER`` seconds or ``LINGER_BYTES``, then the socket closes. Closed at once
        with its bytes unread, the kernel would answer them with a reset, which can destroy the answer before the
        client reads it (nginx's lingering close)."""
        body = _error_body(error)
        self.transport.write(
            b"HTTP/1.1 "
            + status
            + b"\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: "
            + str(len(body)).encode("ascii")
            + b"\r\n\r\n"
            + body
        )
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = LINGER_BYTES
        self.loop.call_later(LINGER, self.transport.close)

    def shutdown(self) -> None:
        """uvicorn's (close when idle, else after the response), and a response whose reader takes nothing during
        ``SHUTDOWN_STALL`` seconds is not waited for: its connection is aborted (the shutdown's grace is for
        transfers, not for a client that stopped reading)."""
        super().shutdown()
        if self.cycle is not None and not self.cycle.response_complete and not self.transport.is_closing():
            self._stall_check = self.loop.call_later(SHUTDOWN_STALL, self._abort_if_stalled, self._progress())

    def _progress(self) -> tuple[bool, int, int]:
        """(waiting for the client, bytes it has still to take from the transport, zero-copy bytes sent so far)."""
        cycle = self.cycle
        waiting = self.flow.write_paused or bool(getattr(cycle, "zero_copy_active", False))
        return waiting, self.transport.get_write_buffer_size(), getattr(cycle, "zero_copy_sent", 0)

    def _abort_if_stalled(self, before: tuple[bool, int, int]) -> None:
        self._stall_check = None
        if self.transport.is_closing() or self.cycle is None or self.cycle.response_complete:
            return
        now = self._progress()
        if before[0] and now[0] and now[1] >= before[1] and now[2] == before[2]:  # waited all along, nothing taken
            self.logger.info("shutting down: aborting a response whose client takes no bytes")
            self.transport.abort()
            return
        self._stall_check = self.loop.call_later(SHUTDOWN_STALL, self._abort_if_stalled, now)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        if self._stall_check is not None:
            self._stall_check.cancel()
            self._stall_check = None
        if self.ticket is not None:
            self.ticket.release()
            self.ticket = None
        super().connection_lost(exc)

    _upgrade_waiting = False  # a WebSocket upgrade came in while an earlier request's response was still due

    def handle_websocket_upgrade(self) -> None:
        # RFC 9112 §9.3.2: responses go in the order of their requests. uvicorn switched protocols at once, so a
        # 101 overtook the response of a request pipelined before it, which then landed inside the WebSocket stream
        if self.pipeline or (self.cycle is not None and not self.cycle.response_complete):
            self._upgrade_waiting = True
            self.flow.pause_reading()  # the parser has stopped at the upgrade: nothing more to read till then
            return
        self._switch_to_websocket()

    def _switch_to_websocket(self) -> None:
        super().handle_websocket_upgrade()
        protocol = self.transport.get_protocol()
        if protocol is not self and self.ticket is not None:  # the WebSocket protocol now holds the connection
            protocol.ticket = self.ticket  # type: ignore[attr-defined]
            self.ticket = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._upgrade_waiting and not self.pipeline and self.cycle.response_complete:
            self._upgrade_waiting = False
            if not self.transport.is_closing():
                self._unset_keepalive_if_required()  # armed just now for an idle connection: this one is upgrading
                self._switch_to_websocket()

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # not while a pipelined response is being written
            body = _timeout_body(f"request header fields not received within {self.header_timeout:g} s")
            # RFC 9110 §15.5.9: 408, and the server closes the connection
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                + b"content-length: "
                + str(len(body)).encode("ascii")
                + b"\r\n\r\n"
                + body
            )
        self.transport.close()


def head_timeout_protocol(
    header_timeout: float,
    *,
    body_grace: float = 30.0,
    body_min_rate: float = 0.0,
    send_timeout: float | None = None,
    max_header_size: int = 64 << 10,
) -> type[HeadTimeoutProtocol]:
    """The protocol class with these deadlines: ``header_timeout`` for each head, the body rule of
    :class:`BodyRateGuard` for the rest of a body the application answered without reading
    (:mod:`transfer.api.protocol.bodyread`), ``send_timeout`` (None: none) for a response's reader, and
    ``max_header_size`` for the header fields of a head (its request line may add ``HEAD_LINE``)."""
    attributes = {
        "head_limit": max_header_size + HEAD_LINE,
        "header_timeout": header_timeout,
        "discard_grace": body_grace,
        "discard_min_rate": body_min_rate,
        "send_timeout": send_timeout,
    }
    return type("HeadTimeoutProtocol", (HeadTimeoutProtocol,), attributes)


class BodyRateGuard:
    """Sheds a request whose body arrives too slowly: slower than ``min_rate`` bytes/s over a sliding window of
    ``grace`` seconds (:class:`MinRate`; Apache mod_reqtimeout's ``MinRate`` idea, measured on waiting time only). A
    shed request gets 408 with ``connection: close`` (when no response has started) and the application
    sees ``http.disconnect``; whatever it sends afterwards is dropped."""

    def __init__(self, app: ASGIApp, *, grace: float, min_rate: float) -> None:
        self.app = app
        self.grace = grace
        self.min_rate = min_rate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.min_rate <= 0:
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        rate = MinRate(self.grace, self.min_rate)
        waited = 0.0
        received = 0
        body_done = False
        shed = False
        started = False

        async def guarded_receive() -> Message:
            nonlocal waited, received, body_done, shed
            if shed:
                return {"type": "http.disconnect"}
            if body_done:  # later calls wait for the disconnect only (streaming responses): no deadline
                return await receive()
            began = loop.time()
            try:
                async with asyncio.timeout(rate.allowance()):
                    message = await receive()
            except TimeoutError:
                shed = True
                if not started:
                    body = _timeout_body(
                        f"request body slower than {self.min_rate:g} bytes/s over {self.grace:g} s: "
                        f"{received} bytes in {loop.time() - began + waited:.1f} s"
                    )
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 408,
                            "headers": [
                                (b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode("ascii")),
                                (b"connection", b"close"),
                            ],
                        }
                    )
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                return {"type": "http.disconnect"}
            waited += loop.time() - began
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                rate.account(loop.time() - began, len(message.get("body", b"")))
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if shed:
                return  # we answered already
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, guarded_receive, guarded_send)


def uvicorn_config(app: Any, settings: Settings, *, host: str, port: int, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(
        BodyRateGuard(app, grace=settings.http_body_grace, min_rate=settings.http_body_min_rate),
        host=host,
        port=port,
        loop="uvloop",
        http=head_timeout_protocol(
            settings.http_header_timeout,
            body_grace=settings.http_body_grace,
            body_min_rate=settings.http_body_min_rate,
            send_timeout=settings.http_send_timeout,
            max_header_size=settings.max_header_size,
        ),
        ws=TPWebSocketProtocol,
        ws_ping_interval=settings.tp_ping_interval,
        ws_ping_timeout=settings.tp_pong_timeout,
        ws_max_size=settings.tp_max_envelope_size,
        ws_per_message_deflate=True,
        # longer than clients keep idle connections (httpx: 5 s): otherwise a client reusing a connection the server
        # is closing at that moment sees a reset (found by the soak at 300 clients)
        timeout_keep_alive=settings.http_keep_alive,
        # uvicorn's access line carries the path with its query, i.e. the signature of a signed URL; the
        # application's own line (transfer.api.middleware.observability) names the route template instead
        access_log=False,
        **kwargs,
    )
