"""Request bodies on uvicorn's httptools protocol without copying them in Python.

uvicorn (0.54) copies every body byte three times on its way to the application: httptools hands each piece to
``on_body`` as a new ``bytes`` (a copy out of the read buffer), ``on_body`` appends it to the cycle's ``bytearray``
(a second copy), and ``receive`` turns that into ``bytes`` (a third); it also stops reading the socket as soon as
64 KiB are waiting, so a busy application receives many small messages. On a 1 GiB upload the copies and the
per-message overhead cost more CPU than the SHA-256 the upload needs.

Here:

- body pieces are queued as they come (no accumulation copy); ``receive`` hands out the one queued piece as it is,
  or joins several into one message (one copy, only when the application fell behind);
- a body with a ``Content-Length`` bypasses the HTTP parser once its head is parsed: each later socket read *is* a
  body piece (uvloop's ``bytes``, passed on untouched), counted down to the declared length; at the end the request
  is completed and a fresh parser takes the next request on the connection (keep-alive, pipelining). Chunked bodies
  (RFC 9112 §7.1) and upgrades stay with the parser, which removes the chunk framing;
- reading pauses once ``HIGH_WATER`` bytes wait for the application (back-pressure on the client, bounded memory per
  connection) and resumes on its next ``receive``;
- the rest of a body the application answered without reading (401, 413, ...) is read and dropped so the connection
  can be reused (RFC 9112 §9.6), but no longer than a body that is read may take: it must keep arriving at
  ``discard_min_rate`` bytes/s over a sliding window of ``discard_grace`` seconds from the answer (the rule of
  :class:`transfer.api.protocol.server.BodyRateGuard`, :class:`transfer.api.middleware.limits.MinRate`), or the
  connection is closed; and once it has arrived an idle connection is closed after the keep-alive timeout as after any
  response. uvicorn's own protocol read such a body
  with no deadline at all (each read cancels the keep-alive timer), so a client could hold a connection open
  forever at a byte a minute after its answer.

An answer sent before the ``100 Continue`` a request with ``Expect: 100-continue`` waits for carries
``Connection: close`` and ends the connection: the client may send the body then or not at all, so the next bytes
could be either (uvicorn kept the connection, and read the client's next request as that body).

A response whose reader takes no bytes for ``send_timeout`` seconds (the transport's buffer stays over its high-water
mark: uvicorn's ``send`` waited for it with no deadline) ends its connection, whose unsent bytes are dropped with it
(``abort``: a ``close`` would wait to flush them to the client that takes nothing); the application sees
``http.disconnect``. nginx's ``send_timeout``: a timeout between two successive writes, not for the whole response.

Everything else is uvicorn's own behaviour, unchanged: ``100 Continue`` on the first ``receive`` (RFC 9110 §10.1.1),
``http.disconnect`` once the client has gone or the response is complete.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from transfer import metrics
from transfer.api.middleware.limits import MinRate

log = logging.getLogger("transfer.ops")

# bytes waiting for the application at which the socket stops being read: one socket read or a few small ones.
# Held per connection while an upload waits (e.g. for an S3 part buffer), so 32 paused uploads hold ~2-8 MiB here,
# not 16-32 as with 256 KiB (peak RSS of 32 uploads into S3: ~10 MB less); the kernel's socket buffer keeps the
# rest of what the client sent. A 1 GiB upload into the discarding sink costs the same server CPU with either
# (1.24 vs 1.23 s, median of 9, AMD EPYC)
HIGH_WATER = 64 << 10


class BodyCycle(RequestResponseCycle):
    """uvicorn's request/response cycle with a queue of body pieces instead of one accumulating ``bytearray``."""

    pieces: deque[bytes]
    queued: int
    send_timeout: float | None = None  # set by the protocol (transfer.api.protocol.server.HeadTimeoutProtocol)

    def start_body(self) -> None:
        self.pieces = deque()
        self.queued = 0

    def deliver(self, piece: bytes) -> None:
        self.pieces.append(piece)
        self.queued += len(piece)
        self.message_event.set()

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start" and self.waiting_for_100_continue and self.more_body:
            # an answer (401, 413, ...) before the 100 Continue the client waits for: it may send the body now or
            # never, so what comes next cannot be told apart from a request; the answer says Connection: close
            # and the connection ends with it (RFC 9110 §10.1.1, RFC 9112 §9.6)
            self.keep_alive = False
        if self.send_timeout is not None and self.flow.write_paused and not self.disconnected:
            await drain_within(self, self.send_timeout)
        await super().send(message)

    async def receive(self) -> Any:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            self.flow.resume_reading()
            if not self.pieces:  # after the last piece, this waits for the disconnect (or the response's end)
                await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        pieces = self.pieces
        if not pieces:
            body = b""
        elif len(pieces) == 1:
            body = pieces.popleft()
        else:
            body = b"".join(pieces)
            pieces.clear()
        self.queued = 0
        return {"type": "http.request", "body": body, "more_body": self.more_body}


async def drain_within(cycle: RequestResponseCycle, timeout: float) -> None:
    """Wait for ``cycle``'s transport to take its buffered bytes; after ``timeout`` seconds without that, drop them
    and the connection (module docstring), and the cycle counts as disconnected."""
    try:
        async with asyncio.timeout(timeout):
            await cycle.flow.drain()
    except TimeoutError:
        metrics.send_timeouts.labels("http1").inc()
        client = cycle.scope.get("client")
        log.info("HTTP/1.1 client %s took no bytes for %g s: connection closed", client and client[0], timeout)
        cycle.disconnected = True
        cycle.transport.abort()


class BodyProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol delivering request bodies through :class:`BodyCycle` (see the module
    docstring)."""

    # a body answered before it was read must arrive at this rate (bytes/s; 0: no deadline) after this grace (s)
    discard_grace: float = 30.0
    discard_min_rate: float = 0.0

    _seen = 0  # body bytes of the current request the parser has passed to on_body
    _raw_left = 0  # body bytes still to come past the parser (0: the parser reads the connection)
    _body_open = False  # the latest request's body has not fully arrived
    _dropping = False  # ... and its response is complete: the rest of the body is read and dropped
    _discard_rate: MinRate | None = None  # the rule the dropped rest of a body is held to
    _discard_last = 0.0  # loop time of the last bytes of it (or of the answer)
    _discard_timer: asyncio.TimerHandle | None = None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._seen = 0
        # a request is under way: not idle (the keep-alive timer may still run when this head came in the same read
        # as the end of a dropped body)
        self._unset_keepalive_if_required()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # a cycle made for this request just now (an upgrade makes none); its task has not run yet
        if cycle is not None and cycle.scope is self.scope and type(cycle) is RequestResponseCycle:
            cycle.__class__ = BodyCycle
            cycle.start_body()  # type: ignore[attr-defined]
            self._body_open = True

    def on_message_complete(self) -> None:
        self._body_open = False
        if self._dropping:  # a dropped body is complete: the connection is idle again, the keep-alive clock runs
            self._dropping = False
            if self._discard_timer is not None:
                self._discard_timer.cancel()
                self._discard_timer = None
            if not self.transport.is_closing() and not self.pipeline:
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if self._body_open and cycle.response_complete and not self.transport.is_closing():
            self._dropping = True
            if isinstance(cycle, BodyCycle):  # pieces nobody will receive: not kept while the rest is dropped
                cycle.pieces.clear()
                cycle.queued = 0
            if self.discard_min_rate > 0:
                self._discard_rate = MinRate(self.discard_grace, self.discard_min_rate)
                self._discard_last = self.loop.time()
                self._discard_timer = self.loop.call_later(self.discard_grace, self._discard_deadline)

    def _discard_deadline(self) -> None:
        """The dropped body's rest must keep arriving at ``discard_min_rate`` over ``discard_grace`` seconds."""
        rate = self._discard_rate
        assert rate is not None
        now = self.loop.time()
        left = rate.allowance() - (now - self._discard_last)
        if left > 0:
            self._discard_timer = self.loop.call_later(left, self._discard_deadline)
            return
        self._discard_timer = None
        self.logger.info("closing a connection: the body of an answered request arrives too slowly")
        self.transport.close()

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if not isinstance(cycle, BodyCycle):
            super().on_body(body)
            return
        self._seen += len(body)
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        self._deliver(cycle, body)

    def _deliver(self, cycle: BodyCycle, piece: bytes) -> None:
        cycle.deliver(piece)
        if cycle.queued >= HIGH_WATER:
            self.flow.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self._discard_timer is not None and self._discard_rate is not None:
            now = self.loop.time()
            self._discard_rate.account(now - self._discard_last, len(data))
            self._discard_last = now
        left = self._raw_left
        if left:
            self._unset_keepalive_if_required()
            cycle = self.cycle
            size = len(data)
            if size < left:
                self._raw_left = left - size
                if not cycle.response_complete:  # after an early response the rest of the body is dropped
                    self._deliver(cycle, data)  # type: ignore[arg-type]
                return
            self._raw_left = 0
            if not cycle.response_complete:
                self._deliver(cycle, data if size == left else data[:left])  # type: ignore[arg-type]
            self._end_raw_body()
            if size == left:
                return
            data = data[left:]  # the next request, pipelined
        super().data_received(data)
        self._maybe_bypass_parser()

    def connection_lost(self, exc: Exception | None) -> None:
        self._raw_left = 0
        self._body_open = self._dropping = False
        if self._discard_timer is not None:
            self._discard_timer.cancel()
            self._discard_timer = None
        super().connection_lost(exc)

    def _maybe_bypass_parser(self) -> None:
        """After the parser has taken a request's head: read the rest of a ``Content-Length`` body ourselves."""
        cycle = self.cycle
        if (
            self._raw_left
            or not isinstance(cycle, BodyCycle)
            or cycle.scope is not self.scope  # a later request's head is still incomplete
            or not cycle.more_body  # the whole body was in this read
            or self.parser is None
            or self.transport.is_closing()
            or self.parser.should_upgrade()
        ):
            return
        length: bytes | None = None
        for name, value in self.headers:
            if name == b"transfer-encoding":
                return  # chunked framing: the parser's job
            if name == b"content-length":
                if length is not None:
                    return
                length = value
        if length is None or not length.isdigit():
            return  # (the parser has refused malformed lengths already)
        left = int(length) - self._seen
        if left > 0:
            self._raw_left = left

    def _end_raw_body(self) -> None:
        """The body read past the parser is complete: end the request as the parser would, and give the
        connection a fresh parser for the next request (the old one still waits for this body)."""
        self.on_message_complete()
        self.parser = httptools.HttpRequestParser(self)
        try:
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn sets it up
        except AttributeError:  # pragma: no cover - httptools < 0.6.3
            pass
