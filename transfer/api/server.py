"""How the app is served: one uvicorn configuration for ``transfer serve``, the tests and the benchmarks.

WebSocket keep-alive follows TP §9.2.2: a ping every ``tp_ping_interval`` (30 s), a pong due within
``tp_pong_timeout`` (10 s), and after two consecutive missed pongs the connection is closed with 1008 and a TPError
(TP-TRA010) as the close reason. ASGI gives applications no access to ping/pong frames, so this lives in a small
subclass of uvicorn's sans-I/O websockets protocol (uvicorn's own rule is one miss -> 1011).
"""

from __future__ import annotations

import json
from typing import Any

import uvicorn
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from transfer.settings import Settings

HEARTBEAT_CLOSE_REASON = json.dumps(
    {"code": "TP-TRA010", "message": "two pongs missed", "retryable": True}, separators=(",", ":")
)


class TPWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets protocol with TP's heartbeat rule: close 1008 + TPError after two missed pongs."""

    missed_pongs = 0

    def handle_pong(self, event: Any) -> None:
        if self.pending_ping_payload is not None and bytes(event.data) == self.pending_ping_payload:
            self.missed_pongs = 0
        super().handle_pong(event)

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


def uvicorn_config(app: Any, settings: Settings, *, host: str, port: int, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        ws=TPWebSocketProtocol,
        ws_ping_interval=settings.tp_ping_interval,
        ws_ping_timeout=settings.tp_pong_timeout,
        ws_max_size=settings.tp_max_envelope_size,
        ws_per_message_deflate=True,
        # longer than clients keep idle connections (httpx: 5 s): otherwise a client reusing a connection the server
        # is closing at that moment sees a reset (found by the soak at 300 clients)
        timeout_keep_alive=settings.http_keep_alive,
        **kwargs,
    )
