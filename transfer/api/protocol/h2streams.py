"""One HTTP/2 stream's pieces on top of Hypercorn's: its application-facing stream (:class:`InformationalStream`),
its response buffer (:class:`OutboundBuffer`), the request-body frames waiting for its application
(:class:`Inbound`), and the connection's budget of response bytes waiting for the client (:class:`SendBudget`).

What a stream's response may hold, and for how long:

- a response's bytes wait in its :class:`OutboundBuffer` until the client's flow-control window lets them go; the
  application's ``send`` waits once ``BUFFER_HIGH_WATER`` bytes are queued, so a stream holds at most the piece the
  application handed over last (downloads: ``buffer_size``, 1 MiB);
- all streams of a connection together hold at most ``h2_send_buffer`` bytes (16 MiB) that way, plus one piece: a
  response starts (its application's ``http.response.start`` returns) only while the connection holds less, and
  then one piece (``buffer_size``) is counted for it until its first piece arrives, so a client that opens 100
  streams and no window makes the server read 16 MiB for it, not 100 pieces (:class:`SendBudget`);
- bytes that made no progress for ``http_send_timeout`` seconds, waiting for window or for room in the budget, end
  their stream (:meth:`transfer.api.protocol.h2protocol.FlowControlledH2.expire_stalled`);
- when the stream is reset or the connection ends, its buffer is emptied and every ``send`` waiting on it returns
  (the application then sees ``http.disconnect``): nothing waits for a window that will never open.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from hypercorn.protocol.events import Body, EndBody, InformationalResponse, Request, StreamClosed
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h2 import BUFFER_HIGH_WATER, BUFFER_LOW_WATER, BufferCompleteError, StreamBuffer
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.utils import build_and_validate_headers

from transfer.api.protocol.informational import EXTENSION as INFORMATIONAL


class SendBudget:
    """Response bytes one connection holds for its client, against ``limit`` (module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.closed = False
        self._room = asyncio.Event()
        self._room.set()

    def add(self, size: int) -> None:
        self.held += size
        if self.held >= self.limit:
            self._room.clear()

    def remove(self, size: int) -> None:
        self.held -= size
        if self.held < self.limit:
            self._room.set()

    def poke(self) -> None:
        """Wake every waiter to look again (a stream it waits for may have closed)."""
        self._room.set()
        if self.held >= self.limit and not self.closed:
            self._room.clear()

    def close(self) -> None:
        """The connection ended: nobody waits any more."""
        self.closed = True
        self._room.set()

    async def room(self, buffer: OutboundBuffer, piece: int) -> None:
        """Until the connection holds less than ``limit`` bytes (or ``buffer``'s stream or the connection ends),
        then ``piece`` bytes reserved for ``buffer``'s first piece: responses that start together would otherwise
        all pass before any of them has pushed a byte. The wait counts as a stalled send of ``buffer`` (its send
        timeout runs)."""
        if self.held >= self.limit and not self.closed:
            buffer.gate_waiting = True
            buffer.progress = time.monotonic()
            try:
                while self.held >= self.limit and not self.closed and not buffer.closed:
                    await self._room.wait()
            finally:
                buffer.gate_waiting = False
        if not buffer.closed and not self.closed:
            buffer.reserve(piece)


class OutboundBuffer(StreamBuffer):
    """Hypercorn's response buffer of a stream without its quadratic cost (it deleted each 16 KiB frame from the
    front of a ``bytearray``, moving the rest of a 1 MiB ``send`` every time): the pieces the application sent and a
    read offset into the first, framed out as views. It counts what it holds in the connection's
    :class:`SendBudget` and when its bytes last moved (``progress``, for the send timeout)."""

    def __init__(self, event_class: Any, budget: SendBudget) -> None:
        super().__init__(event_class)
        self.pieces: collections.deque[memoryview] = collections.deque()
        self.size = 0
        self.budget = budget
        self.closed = False
        self.gate_waiting = False  # its application waits for room in the budget to start the response
        self.progress = time.monotonic()  # when bytes last left (or began to wait)
        self.reserved = 0  # counted in the budget for the first piece, until it comes (SendBudget.room)

    def reserve(self, size: int) -> None:
        self.reserved = size
        self.budget.add(size)

    def _unreserve(self) -> None:
        if self.reserved:
            self.budget.remove(self.reserved)
            self.reserved = 0

    def set_complete(self) -> None:
        self._unreserve()
        super().set_complete()

    @property
    def complete(self) -> bool:
        return self._complete and self.size == 0

    @property
    def stalled(self) -> bool:
        """Bytes (or a response start) wait for the client; how long: ``progress``."""
        return not self.closed and (self.size > 0 or self.gate_waiting)

    async def close(self) -> None:
        """Drop what is queued and release every ``send`` waiting on this buffer."""
        self.closed = True
        self.pieces.clear()
        self._unreserve()
        self.budget.remove(self.size)
        self.size = 0
        self.budget.poke()
        await super().close()

    async def push(self, data: bytes) -> None:
        if self._complete:
            raise BufferCompleteError()
        self._unreserve()  # the piece is here: counted as itself from now on
        if data:
            if self.size == 0:
                self.progress = time.monotonic()  # waiting starts now, not when the last piece left
            self.pieces.append(memoryview(data))
            self.size += len(data)
            self.budget.add(len(data))
        await self._is_empty.clear()
        if self.size >= BUFFER_HIGH_WATER:
            await self._paused.wait()
            await self._paused.clear()

    def take(self, max_length: int) -> list[memoryview]:
        """Up to ``max_length`` bytes from the front, as views (no copy)."""
        taken: list[memoryview] = []
        moved = 0
        while max_length > 0 and self.pieces:
            first = self.pieces[0]
            if len(first) <= max_length:
                taken.append(self.pieces.popleft())
            else:
                taken.append(first[:max_length])
                self.pieces[0] = first[max_length:]
            max_length -= len(taken[-1])
            moved += len(taken[-1])
        if moved:
            self.size -= moved
            self.budget.remove(moved)
            self.progress = time.monotonic()
        return taken

    async def settle(self) -> None:
        """Wake the application's ``send`` once the buffer has drained enough (Hypercorn's ``pop`` did this)."""
        if self.size < BUFFER_LOW_WATER:
            await self._paused.set()
        if self.size == 0:
            await self._is_empty.set()


class InformationalStream(HTTPStream):
    """Hypercorn's HTTP stream with the ``http.response.informational`` extension (1xx before the response), a
    response start that waits for room in the connection's :class:`SendBudget`, and a closing that never waits on
    its application.

    The application's queue holds one message (``H2Options.hypercorn``). A body the application never reads (a
    GET's end of body; an upload answered 413 before its end) would make the next put wait forever: the feeder's
    (``FlowControlledH2._feed``), or the ``http.disconnect`` of the closing stream, put from inside the
    application's own last send when the stream closes because its response ended. That task, and with it the
    connection and the server's shutdown, would never finish. So once the stream closes, a put still waiting is
    cancelled and the unread body dropped (nobody will read it) before ``http.disconnect`` goes in."""

    _body_put: asyncio.Future[None] | None = None
    _body_stopped = False
    buffer: OutboundBuffer | None = None  # set by the protocol that made this stream
    piece = 1 << 20  # what the application sends at once, at most (the service's buffer_size)

    async def handle(self, event: StreamEvent) -> None:
        if isinstance(event, (Body, EndBody)):
            await self._hand_body(event)
            return
        if isinstance(event, StreamClosed):
            self._stop_body()
        await super().handle(event)
        if isinstance(event, Request) and not self.closed:
            # the application's task was created above but has not run yet (nothing awaited since): it sees this
            self.scope["extensions"][INFORMATIONAL] = {}

    async def _hand_body(self, event: Body | EndBody) -> None:
        if self.closed:
            return  # nobody reads a closed stream's body
        queue = getattr(self.app_put, "__self__", None)
        if not isinstance(queue, asyncio.Queue) or not queue.full():
            await super().handle(event)  # room for it: no wait to cancel
            return
        put = self._body_put = asyncio.ensure_future(super().handle(event))
        try:
            await put
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not (put.cancelled() and self._body_stopped) or (task is not None and task.cancelling()):
                raise  # the feeder itself was cancelled, not the put by the stream's closing
        finally:
            self._body_put = None

    def _stop_body(self) -> None:
        self._body_stopped = True
        if self._body_put is not None:
            self._body_put.cancel()
        queue = getattr(self.app_put, "__self__", None)
        while isinstance(queue, asyncio.Queue) and not queue.empty():
            queue.get_nowait()

    async def app_send(self, message: Any) -> None:
        if message is not None and message["type"] == INFORMATIONAL:
            status = int(message["status"])
            if not 100 <= status < 200 or status == 101:  # RFC 9113 §8.6: no 101 on HTTP/2
                raise RuntimeError(f"{status} is not an interim response status")
            if self.state != ASGIHTTPState.REQUEST:
                raise RuntimeError(f"'{INFORMATIONAL}' after the response started")
            if not self.closed:
                headers = build_and_validate_headers(message.get("headers", []))
                await self.send(InformationalResponse(stream_id=self.stream_id, headers=headers, status_code=status))
            return
        if message is not None and message["type"] == "http.response.start" and self.buffer is not None:
            # before the application reads what it will send (a download opens its file, then starts, then reads)
            await self.buffer.budget.room(self.buffer, self.piece)
        await super().app_send(message)


class Inbound:
    """Body frames of one stream not yet taken by its application, with the flow-controlled length of each."""

    __slots__ = ("pieces", "feeding")

    def __init__(self) -> None:
        self.pieces: collections.deque[tuple[bytes, int] | None] = collections.deque()  # None: the body ended
        self.feeding = False
