"""How many connections the process holds, and the answer to one more.

Every accepted connection is counted from ``connection_made`` of the listener's protocol until the socket closes,
whichever protocol holds it by then (HTTP/1.1, HTTP/2, or the WebSocket it upgraded to): a :class:`Ticket` goes
with the connection from one protocol to the next and is given back once.

- ``http_max_connections`` (1,000) per process, whatever the protocol;
- ``http_max_connections_per_client`` (32) per client address, except for addresses in ``trusted_proxies``
  (loopback by default): a proxy's connections carry many clients, and the address a proxy names in a header
  is not known before the request is read.

A client address whose HTTP/2 connection broke a bound of :mod:`transfer.api.protocol.h2guard` (it was sent
``GOAWAY(ENHANCE_YOUR_CALM)``) is refused new connections for ``h2_abuse_penalty`` seconds (10), closed at once
without an answer: otherwise it reconnects and starts over, and each connection buys it another round of what the
bounds allow (rapid reset: ``h2_reset_allowance`` streams parsed each time). Addresses in ``trusted_proxies`` are
never penalised (a proxy carries everyone's connections), and at most ``PENALISED`` addresses are remembered.

A connection over a limit is answered in its own protocol, then closed: HTTP/1.1 gets
``503 too_many_connections`` (the JSON error body, ``Retry-After: 1``, ``Connection: close``) once its request
head has arrived; HTTP/2 gets the same 503 on its first stream, then ``GOAWAY`` with that stream as the last one
processed (RFC 9113 §6.8), so no other stream is retried as if it had been seen. A refused connection is held at
most ``REFUSE_WAIT`` seconds and ``REFUSE_READ`` bytes, and at most ``REFUSING`` of them at once: beyond that one
is closed without an answer (a flood of connections must not be held open to be told it is one).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from transfer import metrics
from transfer.errors import TooManyConnections

log = logging.getLogger("transfer.ops")

REFUSE_WAIT = 2.0  # seconds a refused connection may take to send the request its answer goes to
REFUSE_READ = 64 << 10  # bytes read from a refused connection, at most
REFUSING = 64  # refused connections waiting for their request at once, at most
PENALISED = 10_000  # addresses remembered as penalised, at most (the oldest penalty goes first)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Ticket:
    """One admitted connection's place in :class:`ConnectionLimits`; :meth:`release` gives it back once."""

    __slots__ = ("limits", "client", "counted", "released")

    def __init__(self, limits: ConnectionLimits, client: str | None, counted: bool) -> None:
        self.limits = limits
        self.client = client  # the client's own address (None: none, or a trusted proxy's)
        self.counted = counted  # against the per-client limit
        self.released = False

    def punish(self) -> None:
        """The connection broke an HTTP/2 bound: its address waits out the penalty."""
        self.limits.punish(self.client)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.limits._release(self)


class ConnectionLimits:
    """The counts of the module docstring, for one process (one event loop)."""

    def __init__(
        self,
        max_connections: int,
        per_client: int,
        trusted: Iterable[str],
        *,
        penalty: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_connections = max_connections
        self.per_client = per_client
        self.trusted = [ipaddress.ip_network(net, strict=False) for net in trusted]
        self.penalty = penalty
        self.clock = clock
        self.open = 0
        self.by_client: dict[str, int] = {}
        self.penalised: dict[str, float] = {}  # address -> until (insertion order: oldest first)
        self.refusing = 0

    def _client(self, client: str | None) -> str | None:
        """``client`` when it is an address of its own (None: none, or a trusted proxy's)."""
        if client is None:
            return None
        try:
            address = ipaddress.ip_address(client)
        except ValueError:
            return None  # a Unix socket: no client address
        if any(address in net for net in self.trusted):
            return None
        return client

    def punish(self, address: str | None) -> None:
        """``address`` (not a trusted proxy's) broke an HTTP/2 bound: no new connection from it for ``penalty``
        seconds."""
        address = self._client(address)
        if address is None or self.penalty <= 0:
            return
        now = self.clock()
        self.penalised.pop(address, None)
        self.penalised[address] = now + self.penalty
        if len(self.penalised) > PENALISED:
            for old in [a for a, until in self.penalised.items() if until <= now] or list(self.penalised)[:1]:
                del self.penalised[old]

    def admit(self, client: str | None) -> Ticket | str:
        """A ticket for a new connection from ``client`` (its IP address), or the limit it would break
        (``process``, ``client``, or ``penalty``)."""
        address = self._client(client)
        if address is not None and address in self.penalised:
            if self.penalised[address] > self.clock():
                return "penalty"
            del self.penalised[address]
        if self.open >= self.max_connections:
            return "process"
        counted = address is not None and self.per_client > 0
        if address is not None and counted:
            if self.by_client.get(address, 0) >= self.per_client:
                return "client"
            self.by_client[address] = self.by_client.get(address, 0) + 1
        self.open += 1
        metrics.connections_open.set(self.open)
        return Ticket(self, address, counted)

    def _release(self, ticket: Ticket) -> None:
        self.open -= 1
        if ticket.counted and ticket.client is not None:
            left = self.by_client[ticket.client] - 1
            if left:
                self.by_client[ticket.client] = left
            else:
                del self.by_client[ticket.client]
        metrics.connections_open.set(self.open)

    def message(self, limit: str) -> TooManyConnections:
        if limit == "process":
            text = f"this server holds {self.max_connections} connections, its limit; retry shortly"
        else:
            text = f"this client address holds {self.per_client} connections, its limit; reuse or close one"
        return TooManyConnections(text, headers={"retry-after": "1"}, limit=limit)


def _body(error: TooManyConnections) -> bytes:
    return json.dumps(error.to_payload(), separators=(",", ":")).encode("ascii")


class Refusal:
    """Answers one refused connection in its own protocol (module docstring), then closes it. Feed it what the
    connection sends (:meth:`data`); it closes the transport itself once answered or after ``REFUSE_WAIT``."""

    def __init__(self, transport: asyncio.Transport, error: TooManyConnections, limits: ConnectionLimits) -> None:
        self.transport = transport
        self.error = error
        self.limits = limits
        self.buffer = b""
        self.h2: h2.connection.H2Connection | None = None
        self.answered = False
        self.done = False
        limits.refusing += 1
        self.timer = asyncio.get_running_loop().call_later(REFUSE_WAIT, self.finish)

    def alpn_h2(self) -> None:
        """The TLS handshake chose h2: what follows is an HTTP/2 connection preface."""
        self._start_h2()

    def data(self, data: bytes) -> None:
        if self.done:
            return
        self.buffer += data
        if self.h2 is None and self.buffer.startswith(PREFACE):
            self._start_h2()
        if self.h2 is not None:
            pending, self.buffer = self.buffer, b""
            try:
                events = self.h2.receive_data(pending)
            except h2.exceptions.ProtocolError:
                self.finish()
                return
            for event in events:
                if isinstance(event, h2.events.RequestReceived):
                    self._answer_h2(event.stream_id)
                    return
            self.transport.write(self.h2.data_to_send())
        elif not PREFACE.startswith(self.buffer[: len(PREFACE)]) and b"\r\n\r\n" in self.buffer:
            self._answer_http1()
        if len(self.buffer) > REFUSE_READ and not self.done:
            self.finish()

    def _start_h2(self) -> None:
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.h2.initiate_connection()

    def _answer_http1(self) -> None:
        body = _body(self.error)
        head = (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        self.transport.write(head + body)
        self.finish()

    def _answer_h2(self, stream_id: int) -> None:
        assert self.h2 is not None
        body = _body(self.error)
        headers = [
            (b":status", b"503"),
            (b"content-type", b"application/json"),
            (b"retry-after", b"1"),
            (b"content-length", str(len(body)).encode("ascii")),
        ]
        try:
            self.h2.send_headers(stream_id, headers)
            self.h2.send_data(stream_id, body, end_stream=True)  # a few hundred bytes: within any window
        except h2.exceptions.ProtocolError:
            pass
        self.h2.close_connection(last_stream_id=stream_id)
        self.answered = True
        self.transport.write(self.h2.data_to_send())
        self.finish()

    def finish(self) -> None:
        """Close the connection (after what was answered, if anything)."""
        if self.done:
            return
        self.done = True
        self.timer.cancel()
        self.limits.refusing -= 1
        if self.h2 is not None and not self.answered and not self.transport.is_closing():
            self.h2.close_connection()  # no request came: GOAWAY, last stream 0 (none was processed)
            self.transport.write(self.h2.data_to_send())
        self.transport.close()


def peer_address(transport: Any) -> str | None:
    """The IP address a transport's peer connected from (None for a Unix socket)."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return None


class _Quiet:
    """One log line per ``every`` seconds at most, saying how many refusals it stands for."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self.last = -every
        self.count = 0

    def note(self, limits: ConnectionLimits, limit: str) -> None:
        self.count += 1
        now = asyncio.get_running_loop().time()
        if now - self.last >= self.every:
            log.warning(
                "refusing connections: %d refused since the last line (limit reached: %s; %d open)",
                self.count,
                limit,
                limits.open,
            )
            self.last = now
            self.count = 0


_quiet = _Quiet()


def refuse(transport: asyncio.Transport, limits: ConnectionLimits, limit: str) -> Refusal | None:
    """Start answering a connection over ``limit``; None when too many are being answered already (then it is
    closed at once)."""
    metrics.connections_refused.labels(limit).inc()
    _quiet.note(limits, limit)
    if limit == "penalty" or limits.refusing >= REFUSING:
        transport.abort()
        return None
    return Refusal(transport, limits.message(limit), limits)
