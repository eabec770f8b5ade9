"""The HTTP/2 protocol of one connection: Hypercorn's ``H2Protocol`` (frames through the ``h2`` library) with the
flow control, bounds and answers this service needs (the listener and the socket are
:mod:`transfer.api.protocol.http2`'s).

- flow control per stream (RFC 9113 §5.2): a DATA frame's window is given back only once the application took the
  bytes, and bytes wait in a queue per stream, so a stream whose application reads slowly (or not at all) holds at
  most ``h2_stream_window`` bytes and never the connection (Hypercorn handed each frame to the stream's application
  before reading the next frame: one stalled upload stopped every stream of its connection). The connection window
  (``h2_connection_window``) bounds the request bytes one connection makes the server hold.
- response bytes: at most ``h2_send_buffer`` per connection wait for the client's window, and none longer than
  ``http_send_timeout`` without progress (:mod:`transfer.api.protocol.h2streams`), ``SHUTDOWN_STALL`` once the
  server is shutting down (the drain waits for transfers, not for clients that take nothing); a stalled stream
  is reset with ``CANCEL`` and its application sees ``http.disconnect``.
- ``SETTINGS_MAX_CONCURRENT_STREAMS`` = ``h2_max_streams``, counted as streams whose application still runs (a
  stream the client reset is still running until its application sees the disconnect, which is what rapid reset
  exploits; Go's server counts the same way). A HEADERS frame past the limit is refused with ``REFUSED_STREAM``
  (RFC 9113 §5.1.2: a stream error, the connection lives; its header block is still decoded, so HPACK's table
  stays in step), and so are streams opened while shutting down (§8.7: the client may retry them elsewhere).
- frame sizes, header blocks and frame rates are counted as frames arrive (:mod:`transfer.api.protocol.h2guard`);
  a connection past a bound gets ``GOAWAY(ENHANCE_YOUR_CALM)``, one log line and a count in
  ``transfer_h2_abuse{kind}``, and is closed. PRIORITY signals are read and ignored (RFC 9113 §5.3.2 deprecates
  them; Hypercorn kept a tree node for every stream id a PRIORITY frame named).
- interim responses: the ASGI extension ``http.response.informational`` as HEADERS frames with a 1xx ``:status``
  (RFC 9113 §8.1), so the IETF resumable upload's ``104`` works over HTTP/2 too.

Why not uvicorn's own HTTP/2 (``http="zttp"``, uvicorn 0.54 with zttp 0.0.35, measured on this service, h2c, AMD
EPYC): a GET whose application calls ``receive()`` never got its end of request (HEADERS with END_STREAM is not
passed on), so it hung; zttp's flood detector ended a legitimate h2load connection (64 streams of 4 KiB POSTs)
with ``ENHANCE_YOUR_CALM`` after ~4,040 requests, every run; a response's bytes are handed to zttp whole, with no
wait for the client's window; and the service's ``104``, per-stream request windows and graceful drain would all
have to be redone. Where it did answer, it used less CPU per small request (~300 vs ~550 us per answered
``/healthz``; 0.9 vs 1.0 ms per 4 KiB upload), and was no faster for a 200 MiB upload (1.55 vs 1.35 s).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
import priority.priority
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Body, EndBody, Request
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.typing import AppWrapper, ASGIReceiveCallable, ASGISendCallable, Scope
from hypercorn.utils import filter_pseudo_headers
from hyperframe.frame import Frame, HeadersFrame, RstStreamFrame

from transfer import metrics
from transfer.api.protocol.h2guard import Abuse, FrameGuard, GuardedFrameBuffer, H2Limits
from transfer.api.protocol.h2streams import Inbound, InformationalStream, OutboundBuffer, SendBudget
from transfer.settings import Settings

log = logging.getLogger("transfer.ops")

SEND_BATCH = 256 << 10  # response bytes framed per socket write, at most
COALESCE = 4 << 20  # bytes of body frames joined into one piece for the application, at most
MAX_WINDOW = 2**31 - 1  # RFC 9113 §6.9.1
SHUTDOWN_STALL = 1.0  # seconds a response may make no progress once the server shuts down (else http_send_timeout)
# frames the client may send us: RFC 9113's default, 16 KiB (§6.5.2). 1 MiB was no faster to upload 200 MiB (curl:
# 0.72 vs 0.74 s; httpx streaming 1 MiB pieces: 0.95 vs 0.74 s; server CPU 0.45-0.74 s either way, AMD EPYC), and it
# was what one frame of any kind could make a connection buffer before it was checked
MAX_FRAME = 1 << 14


@dataclass(frozen=True)
class H2Options:
    """What an HTTP/2 connection is allowed (from :class:`Settings`)."""

    max_streams: int = 100
    stream_window: int = 1 << 20
    connection_window: int = 16 << 20
    keep_alive: float = 75.0
    max_header_list_size: int = 64 << 10
    send_buffer: int = 16 << 20
    send_timeout: float = 60.0
    reset_allowance: int = 100
    control_per_second: int = 200
    piece: int = 1 << 20  # the most the application sends at once (buffer_size)

    @classmethod
    def from_settings(cls, settings: Settings) -> H2Options:
        return cls(
            max_streams=settings.h2_max_streams,
            stream_window=settings.h2_stream_window,
            connection_window=settings.h2_connection_window,
            keep_alive=float(settings.http_keep_alive),
            max_header_list_size=settings.max_header_size,
            send_buffer=settings.h2_send_buffer,
            send_timeout=settings.http_send_timeout,
            reset_allowance=settings.h2_reset_allowance,
            control_per_second=settings.h2_max_control_frames_per_second,
            piece=settings.buffer_size,
        )

    @property
    def limits(self) -> H2Limits:
        return H2Limits(self.max_header_list_size, self.reset_allowance, self.control_per_second)

    def hypercorn(self) -> HypercornConfig:
        config = HypercornConfig()
        config.h2_max_concurrent_streams = self.max_streams
        config.h2_max_header_list_size = self.max_header_list_size
        config.keep_alive_timeout = self.keep_alive
        # one body piece waits for the application at a time: the frames arriving meanwhile queue up in
        # FlowControlledH2 and go as one piece next (16 KiB frames one by one cost the upload two thirds of its speed)
        config.max_app_queue_size = 1
        config.keep_alive_max_requests = sys.maxsize  # Hypercorn closes after 1,000 requests; uvicorn never does
        config.include_server_header = False  # uvicorn's "server: uvicorn" is not sent either way on h2
        config.accesslog = None  # the application logs each request (transfer.api.middleware.observability)
        return config


class GuardedH2Connection(h2.connection.H2Connection):
    """``h2``'s server connection with :class:`GuardedFrameBuffer` and ``REFUSED_STREAM`` for a stream past the
    limit (``busy()``: streams whose application still runs), instead of ``h2``'s connection error."""

    def __init__(self, guard: FrameGuard, busy: Callable[[], int]) -> None:
        super().__init__(config=h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.incoming_buffer = self.frames = GuardedFrameBuffer(guard)
        self.guard = guard
        self.busy = busy
        self.refused = 0

    def _receive_headers_frame(self, frame: HeadersFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        sid = frame.stream_id
        new = sid not in self.streams and sid % 2 == 1 and sid > self.highest_inbound_stream_id
        if new and self.busy() >= self.local_settings.max_concurrent_streams:
            return self._refuse(frame)
        try:
            return super()._receive_headers_frame(frame)
        except h2.exceptions.TooManyStreamsError:  # h2's own count of open streams: refused the same way
            return self._refuse(frame)

    def _refuse(self, frame: HeadersFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        """RFC 9113 §5.1.2: a stream error; the block is decoded all the same (§4.3: the HPACK table changes)."""
        sid = frame.stream_id
        list(h2.connection._decode_headers(self.decoder, frame.data))
        self.highest_inbound_stream_id = sid  # §5.1.1: the id is used up
        self._closed_streams[sid] = h2.stream.StreamClosedBy.SEND_RST_STREAM
        self.refused += 1
        metrics.h2_refused_streams.inc()
        self.guard.reset()  # may end the connection (ENHANCE_YOUR_CALM)
        refusal = RstStreamFrame(sid)
        refusal.error_code = h2.errors.ErrorCodes.REFUSED_STREAM
        return [refusal], []


class _Counted:
    """The ASGI application of a connection's streams, counting those whose application still runs."""

    def __init__(self, app: AppWrapper) -> None:
        self.app = app
        self.running = 0

    async def __call__(
        self,
        scope: Scope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        sync_spawn: Callable[..., Any],
        call_soon: Callable[..., Any],
    ) -> None:
        self.running += 1
        try:
            await self.app(scope, receive, send, sync_spawn, call_soon)
        finally:
            self.running -= 1


class _StreamApp:
    """One stream's application: not started at all if the client reset the stream first. The start waits one turn
    of the event loop, so that a reset arriving in the same read as the request (rapid reset), parsed in the
    connection's next turn (h2guard: fairness), is seen first: the application would otherwise run whole for it."""

    def __init__(self, app: AppWrapper, stream: InformationalStream) -> None:
        self.app = app
        self.stream = stream

    async def __call__(
        self,
        scope: Scope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        sync_spawn: Callable[..., Any],
        call_soon: Callable[..., Any],
    ) -> None:
        await asyncio.sleep(0)
        if not self.stream.closed:
            await self.app(scope, receive, send, sync_spawn, call_soon)


class FlowControlledH2(H2Protocol):
    """Hypercorn's HTTP/2 protocol with the changes of the module docstring."""

    def __init__(
        self, *args: Any, options: H2Options, on_abuse: Callable[[], None] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.options = options
        self.on_abuse = on_abuse  # the address's penalty (transfer.api.protocol.admission)
        self.app = self.counted = _Counted(self.app)
        self.guard = FrameGuard(options.limits)
        self.connection = self.guarded = GuardedH2Connection(self.guard, lambda: self.counted.running)
        # in force from the first SETTINGS frame (a value changed later would wait for the client's ACK)
        self.connection.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: options.max_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: options.max_header_list_size,
                h2.settings.SettingCodes.ENABLE_CONNECT_PROTOCOL: 1,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: options.stream_window,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME,
            },
        )
        self.connection.max_inbound_frame_size = MAX_FRAME
        self.budget = SendBudget(options.send_buffer)
        self._inbound: dict[int, Inbound] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self.failed = False  # ended by a protocol error or a broken bound (its GOAWAY says which)

    async def initiate(self, headers: Any = None, settings: bytes | None = None) -> None:
        await super().initiate(headers, settings)
        # the connection window (65,535 bytes until raised, RFC 9113 §6.9.2) to what all streams may hold
        target = min(MAX_WINDOW, max(self.options.connection_window, self.options.stream_window))
        increment = target - self.connection.inbound_flow_control_window
        if increment > 0:  # h2 then gives the window back half of it at a time, as it does for streams
            self.connection.increment_flow_control_window(increment)
        await self._flush()
        self._arm_sweep()

    async def handle(self, event: Event) -> None:
        if isinstance(event, RawData):
            data = event.data
            while not self.closed:
                try:
                    events = self.connection.receive_data(data)
                except h2.exceptions.ProtocolError as exc:  # h2 has queued its GOAWAY (error code of the exception)
                    if isinstance(exc, Abuse | h2.exceptions.DenialOfServiceError):
                        kind = exc.kind if isinstance(exc, Abuse) else "header_list"
                        metrics.h2_abuse.labels(kind).inc()
                        log.warning(
                            "HTTP/2 client %s: GOAWAY(ENHANCE_YOUR_CALM), connection closed: %s", self._who(), exc
                        )
                        if self.on_abuse is not None:
                            self.on_abuse()
                    self.failed = True
                    await self._flush()
                    await self.send(Closed())
                    return
                await self._handle_events(events)
                if not self.guarded.frames.more:
                    return
                data = b""
                await asyncio.sleep(0)  # other connections' turn before the rest of this read (h2guard: fairness)
            return
        if isinstance(event, Closed):
            await super().handle(event)
            await self._release_all()
            return
        await super().handle(event)

    def _who(self) -> str:
        return f"{self.client[0]}:{self.client[1]}" if self.client else "?"

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        rest: list[h2.events.Event] = []
        # streams the client opened and reset within one read (rapid reset): never handed to the application
        reset_now = {event.stream_id for event in events if isinstance(event, h2.events.StreamReset)}
        for event in events:
            if isinstance(event, h2.events.RequestReceived) and event.stream_id in reset_now:
                continue
            if isinstance(event, h2.events.RequestReceived) and self.context.terminated.is_set():
                self.connection.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            elif isinstance(event, h2.events.DataReceived):
                await self._handle_other(rest)
                self._queue_body(event.stream_id, (event.data, event.flow_controlled_length))
            elif isinstance(event, h2.events.StreamEnded):
                await self._handle_other(rest)
                self._queue_body(event.stream_id, None)
            elif isinstance(event, h2.events.PriorityUpdated):
                continue  # RFC 9113 §5.3.2: ignored (module docstring)
            else:
                rest.append(event)
        await self._handle_other(rest)
        await self._flush()

    async def _handle_other(self, events: list[h2.events.Event]) -> None:
        if events:
            batch = list(events)
            events.clear()
            await super()._handle_events(batch)

    def _queue_body(self, stream_id: int, piece: tuple[bytes, int] | None) -> None:
        if stream_id not in self.streams:  # answered already and closed: give the window back at once
            if piece is not None:
                self._acknowledge(piece[1], stream_id)
            return
        inbound = self._inbound.setdefault(stream_id, Inbound())
        inbound.pieces.append(piece)
        if not inbound.feeding:
            inbound.feeding = True
            self.task_group.spawn(self._feed, stream_id, inbound)

    async def _feed(self, stream_id: int, inbound: Inbound) -> None:
        """Hand a stream's queued body frames to its application in order, each frame's window given back once
        taken (or at once when the stream has gone)."""
        try:
            while inbound.pieces:
                piece = inbound.pieces.popleft()
                stream = self.streams.get(stream_id)
                if piece is None:
                    if stream is not None:
                        await stream.handle(EndBody(stream_id=stream_id))
                    continue
                # the frames that arrived together go to the application as one piece: a socket read holds
                # many 16 KiB frames, and per piece the application pays a receive() and a hashing hop
                data, length = piece
                parts = [data]
                size = len(data)
                while inbound.pieces and inbound.pieces[0] is not None and size < COALESCE:
                    more, more_length = inbound.pieces.popleft()  # type: ignore[misc]
                    parts.append(more)
                    size += len(more)
                    length += more_length
                if stream is not None:
                    await stream.handle(Body(stream_id=stream_id, data=b"".join(parts) if len(parts) > 1 else data))
                self._acknowledge(length, stream_id)
                await self._flush()
        finally:
            inbound.feeding = False
            if self._inbound.get(stream_id) is inbound and not inbound.pieces:
                del self._inbound[stream_id]

    def _acknowledge(self, length: int, stream_id: int) -> None:
        if length and not self.closed:
            try:
                self.connection.acknowledge_received_data(length, stream_id)
            except h2.exceptions.ProtocolError:  # the connection is closing
                pass

    async def _send_data(self, stream_id: int) -> None:
        """Hypercorn's, but as many frames as the flow-control window and ``SEND_BATCH`` allow per write (it wrote
        and awaited each 16 KiB frame on its own)."""
        buffer = self.stream_buffers.get(stream_id)
        if not isinstance(buffer, OutboundBuffer):
            await super()._send_data(stream_id)
            return
        try:
            window = min(self.connection.local_flow_control_window(stream_id), SEND_BATCH)
            frame = self.connection.max_outbound_frame_size
            sent = False
            for view in buffer.take(max(0, window)):
                for start in range(0, len(view), frame):
                    self.connection.send_data(stream_id, view[start : start + frame])
                    sent = True
            await buffer.settle()
            if sent:
                await self._flush()
            else:
                self.priority.block(stream_id)
            if buffer.complete and not buffer.closed:
                self.connection.end_stream(stream_id)
                self.guard.response_done()
                await self._flush()
                self._forget_buffer(stream_id, buffer)
        except (h2.exceptions.StreamClosedError, KeyError, h2.exceptions.ProtocolError):
            # the stream or the connection closed while the data waited: drop it, as Hypercorn does
            await buffer.close()
            self._forget_buffer(stream_id, buffer)

    def _forget_buffer(self, stream_id: int, buffer: OutboundBuffer) -> None:
        if self.stream_buffers.get(stream_id) is buffer:
            del self.stream_buffers[stream_id]
        try:
            self.priority.remove_stream(stream_id)
        except priority.priority.MissingStreamError:
            pass

    async def _create_stream(self, request: h2.events.RequestReceived) -> None:
        """Hypercorn's, with :class:`InformationalStream` (and its :class:`OutboundBuffer`) for HTTP requests."""
        method = raw_path = None
        for name, value in request.headers:
            if name == b":method":
                method = value.decode("ascii").upper()
            elif name == b":path":
                raw_path = value
        if method == "CONNECT":  # RFC 8441 WebSockets: Hypercorn's own
            await super()._create_stream(request)
            return
        assert method is not None and raw_path is not None  # h2 validated the pseudo-header fields
        stream = InformationalStream(
            self.app,
            self.config,
            self.context,
            self.task_group,
            self.ssl,
            self.client,
            self.server,
            self.stream_send,
            request.stream_id,
        )
        stream.app = _StreamApp(self.app, stream)
        stream.buffer = OutboundBuffer(self.context.event_class, self.budget)
        stream.piece = self.options.piece
        self.streams[request.stream_id] = stream
        self.stream_buffers[request.stream_id] = stream.buffer
        try:
            self.priority.insert_stream(request.stream_id)
        except priority.priority.DuplicateStreamError:  # (left from a PRIORITY frame before PRIORITY was ignored)
            pass
        else:
            self.priority.block(request.stream_id)
        await stream.handle(
            Request(
                stream_id=request.stream_id,
                headers=filter_pseudo_headers(request.headers),
                http_version="2",
                method=method,
                raw_path=raw_path,
                state=self.connection_state,
            )
        )
        self.keep_alive_requests += 1
        await self.context.mark_request()

    async def _close_stream(self, stream_id: int) -> None:
        inbound = self._inbound.get(stream_id)
        if inbound is not None:  # bytes the application will never take: give their window back
            for piece in inbound.pieces:
                if piece is not None:
                    self._acknowledge(piece[1], stream_id)
            inbound.pieces.clear()
        buffer = self.stream_buffers.get(stream_id)
        if isinstance(buffer, OutboundBuffer) and (self.closed or self._reset(stream_id)):
            # nobody will take these bytes: free them and release the application's send (it sees the disconnect)
            await buffer.close()
            self._forget_buffer(stream_id, buffer)
        known = stream_id in self.streams
        await super()._close_stream(stream_id)
        if known and not self.closed and self.idle:
            # the last stream ended by a reset (the client's, or a send timeout's): Hypercorn said "idle" only when
            # an application ended its stream, so the keep-alive timer (or, shutting down, the close) never came
            if self.context.terminated.is_set():
                self.connection.close_connection()
                await self._flush()
            await self.send(Updated(idle=True))

    def _reset(self, stream_id: int) -> bool:
        closed_by = self.connection._stream_closed_by(stream_id)
        return closed_by in (h2.stream.StreamClosedBy.RECV_RST_STREAM, h2.stream.StreamClosedBy.SEND_RST_STREAM)

    async def _release_all(self) -> None:
        """The connection ended: every response buffer is freed and every waiting ``send`` returns."""
        self._disarm_sweep()
        for stream_id, buffer in list(self.stream_buffers.items()):
            await buffer.close()
            if isinstance(buffer, OutboundBuffer):
                self._forget_buffer(stream_id, buffer)
        self.stream_buffers.clear()
        self.budget.close()

    # -- the send timeout ---------------------------------------------------------------------------------------------

    def _arm_sweep(self) -> None:
        period = min(1.0, max(0.1, self.options.send_timeout / 4))
        self._sweep = asyncio.get_running_loop().call_later(period, self._sweep_due)

    def _disarm_sweep(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    def _sweep_due(self) -> None:
        self._sweep = None
        if self.closed:
            return
        stall = self.options.send_timeout
        if self.context.terminated.is_set():  # shutting down: a response that makes no progress is not waited for
            stall = min(stall, SHUTDOWN_STALL)
        deadline = time.monotonic() - stall
        stalled = [
            sid
            for sid, buffer in self.stream_buffers.items()
            if isinstance(buffer, OutboundBuffer) and buffer.stalled and buffer.progress < deadline
        ]
        if stalled:
            self.task_group.spawn(self.expire_stalled, stalled, stall)
        self._arm_sweep()

    async def expire_stalled(self, stream_ids: list[int], stall: float) -> None:
        """Reset (``CANCEL``) streams whose response made no progress for ``stall`` seconds."""
        for stream_id in stream_ids:
            try:
                self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            except h2.exceptions.ProtocolError:  # closed meanwhile (StreamClosedError is one)
                pass
            buffer = self.stream_buffers.get(stream_id)
            if isinstance(buffer, OutboundBuffer):
                await buffer.close()
                self._forget_buffer(stream_id, buffer)
            await self._close_stream(stream_id)
        metrics.send_timeouts.labels("h2").inc(len(stream_ids))
        log.info(
            "HTTP/2 client %s: %d stream(s) reset after %g s without taking response bytes",
            self._who(),
            len(stream_ids),
            stall,
        )
        await self._flush()
