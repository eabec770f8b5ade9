"""HTTP/2 next to HTTP/1.1 on one listener: ``transfer serve`` speaks h2 (RFC 9113) by ALPN over TLS and by prior
knowledge (h2c, RFC 9113 §3.3) in cleartext, for a proxy in front; every other connection is uvicorn's HTTP/1.1
exactly as before (the protocol work of :mod:`transfer.api.protocol.server`: head timeouts, bodies without copies,
``104``).

How a connection is routed (:class:`ListenerProtocol`, the first protocol of every accepted connection):

- TLS: after the handshake, ALPN ``h2`` goes to HTTP/2; ``http/1.1`` or no ALPN (curl --http1.1, the
  ``websockets`` client) to uvicorn's protocol.
- cleartext: the first bytes decide. The HTTP/2 connection preface (``PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n``)
  goes to HTTP/2; anything else is handed to uvicorn with the bytes read so far. Only a request whose first
  bytes match the preface's (a method ``PRI``) waits for more before the choice.

HTTP/2 is Hypercorn's sans-I/O protocol (h2 frames through the ``h2`` library) under the same ASGI application
and the same lifespan as uvicorn: the service is built once, in one process (chosen by measurement against
Granian; README "TLS and HTTP/2"). On top of Hypercorn, :class:`FlowControlledH2`:

- flow control per stream (RFC 9113 §5.2): a DATA frame's window is given back only once the application took
  the bytes, and bytes wait in a queue per stream, so a stream whose application reads slowly (or not at all)
  holds at most ``h2_stream_window`` bytes and never the connection: Hypercorn handed each frame to the stream's
  application before reading the next frame, so one stalled upload stopped every stream of its connection.
  The connection window (``h2_connection_window``, 16 streams' worth by default) bounds what one connection
  makes the server hold; it takes that many stalled streams to use it up.
- ``SETTINGS_MAX_CONCURRENT_STREAMS`` = ``h2_max_streams``; streams opened while shutting down are refused with
  ``REFUSED_STREAM`` (RFC 9113 §8.7: the client may retry them elsewhere), not Hypercorn's ``NO_ERROR`` reset.
- interim responses: the ASGI extension ``http.response.informational`` (:mod:`transfer.api.protocol.informational`) as
  HEADERS frames with a 1xx ``:status`` (RFC 9113 §8.1), so the IETF upload's ``104`` works over HTTP/2 too.

Per stream, the rest holds as per HTTP/1.1 connection: sizes are the service's, slow bodies are shed by
:class:`transfer.api.protocol.server.BodyRateGuard` (ASGI, so per stream), and a connection stays open idle for
``http_keep_alive`` seconds. Shutdown: each HTTP/2 connection is one of uvicorn's connections, so
:class:`transfer.api.protocol.shutdown.GracefulServer` drains it like the others; on shutdown it refuses new streams,
lets running ones finish, then sends GOAWAY and closes. Zero-copy send is not offered on HTTP/2 (its frames
carry the bytes), nor over TLS at all (sendfile would bypass the encryption).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import sys
from dataclasses import dataclass
from typing import Any

import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import priority.priority
import uvicorn
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.task_group import TaskGroup
from hypercorn.asyncio.worker_context import AsyncioSingleTask, WorkerContext
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.events import Body, EndBody, InformationalResponse, Request, StreamClosed
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h2 import BUFFER_HIGH_WATER, BUFFER_LOW_WATER, BufferCompleteError, H2Protocol, StreamBuffer
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.typing import ConnectionState
from hypercorn.utils import build_and_validate_headers, filter_pseudo_headers, parse_socket_addr
from uvicorn.server import ServerState

from transfer.api.protocol.informational import EXTENSION as INFORMATIONAL
from transfer.api.protocol.tls import ListenerTLS
from transfer.settings import Settings

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_RECV = 1 << 18  # bytes per socket read
SEND_BATCH = 256 << 10  # response bytes framed per socket write, at most
COALESCE = 4 << 20  # bytes of body frames joined into one piece for the application, at most
MAX_WINDOW = 2**31 - 1  # RFC 9113 §6.9.1
MAX_FRAME = 1 << 20  # DATA frames up to 1 MiB (RFC 9113 §6.5.2 allows 16 MiB; default 16 KiB): fewer per upload


@dataclass(frozen=True)
class H2Options:
    """What an HTTP/2 connection is allowed (from :class:`Settings`)."""

    max_streams: int = 100
    stream_window: int = 1 << 20
    connection_window: int = 16 << 20
    keep_alive: float = 75.0
    max_header_list_size: int = 64 << 10

    @classmethod
    def from_settings(cls, settings: Settings) -> H2Options:
        return cls(
            settings.h2_max_streams,
            settings.h2_stream_window,
            settings.h2_connection_window,
            float(settings.http_keep_alive),
        )

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


class InformationalStream(HTTPStream):
    """Hypercorn's HTTP stream with the ``http.response.informational`` extension (1xx before the response), whose
    closing never waits on its application.

    The application's queue holds one message (:meth:`H2Options.hypercorn`). A body the application never reads (a
    GET's end of body; an upload answered 413 before its end) would make the next put wait forever: the feeder's
    (:meth:`FlowControlledH2._feed`), or the ``http.disconnect`` of the closing stream, put from inside the
    application's own last send when the stream closes because its response ended. That task, and with it the
    connection and the server's shutdown, would never finish. So once the stream closes, a put still waiting is
    cancelled and the unread body dropped (nobody will read it) before ``http.disconnect`` goes in."""

    _body_put: asyncio.Future[None] | None = None
    _body_stopped = False

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
        await super().app_send(message)


class OutboundBuffer(StreamBuffer):
    """Hypercorn's response buffer of a stream without its quadratic cost: it deleted each 16 KiB frame from the
    front of a ``bytearray`` (moving the rest of a 1 MiB ``send`` every time); this one keeps the pieces the
    application sent and a read offset into the first, and slices frames out of them as views."""

    def __init__(self, event_class: Any) -> None:
        super().__init__(event_class)
        self.pieces: collections.deque[memoryview] = collections.deque()
        self.size = 0

    @property
    def complete(self) -> bool:
        return self._complete and self.size == 0

    async def close(self) -> None:
        self.pieces.clear()
        self.size = 0
        await super().close()

    async def push(self, data: bytes) -> None:
        if self._complete:
            raise BufferCompleteError()
        if data:
            self.pieces.append(memoryview(data))
            self.size += len(data)
        await self._is_empty.clear()
        if self.size >= BUFFER_HIGH_WATER:
            await self._paused.wait()
            await self._paused.clear()

    def take(self, max_length: int) -> list[memoryview]:
        """Up to ``max_length`` bytes from the front, as views (no copy)."""
        taken: list[memoryview] = []
        while max_length > 0 and self.pieces:
            first = self.pieces[0]
            if len(first) <= max_length:
                taken.append(self.pieces.popleft())
            else:
                taken.append(first[:max_length])
                self.pieces[0] = first[max_length:]
            max_length -= len(taken[-1])
            self.size -= len(taken[-1])
        return taken

    async def settle(self) -> None:
        """Wake the application's ``send`` once the buffer has drained enough (Hypercorn's ``pop`` did this)."""
        if self.size < BUFFER_LOW_WATER:
            await self._paused.set()
        if self.size == 0:
            await self._is_empty.set()


class _Inbound:
    """Body frames of one stream not yet taken by its application, with the flow-controlled length of each."""

    __slots__ = ("pieces", "feeding")

    def __init__(self) -> None:
        self.pieces: collections.deque[tuple[bytes, int] | None] = collections.deque()  # None: the body ended
        self.feeding = False


class FlowControlledH2(H2Protocol):
    """Hypercorn's HTTP/2 protocol with flow control per stream, REFUSED_STREAM on shutdown and interim responses
    (module docstring)."""

    def __init__(self, *args: Any, options: H2Options, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options = options
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
        self._inbound: dict[int, _Inbound] = {}

    async def initiate(self, headers: Any = None, settings: bytes | None = None) -> None:
        await super().initiate(headers, settings)
        # the connection window (65,535 bytes until raised, RFC 9113 §6.9.2) to what all streams may hold
        target = min(MAX_WINDOW, max(self.options.connection_window, self.options.stream_window))
        increment = target - self.connection.inbound_flow_control_window
        if increment > 0:  # h2 then gives the window back half of it at a time, as it does for streams
            self.connection.increment_flow_control_window(increment)
        await self._flush()

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        rest: list[h2.events.Event] = []
        for event in events:
            if isinstance(event, h2.events.RequestReceived) and self.context.terminated.is_set():
                self.connection.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            elif isinstance(event, h2.events.DataReceived):
                await self._handle_other(rest)
                self._queue_body(event.stream_id, (event.data, event.flow_controlled_length))
            elif isinstance(event, h2.events.StreamEnded):
                await self._handle_other(rest)
                self._queue_body(event.stream_id, None)
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
        inbound = self._inbound.setdefault(stream_id, _Inbound())
        inbound.pieces.append(piece)
        if not inbound.feeding:
            inbound.feeding = True
            self.task_group.spawn(self._feed, stream_id, inbound)

    async def _feed(self, stream_id: int, inbound: _Inbound) -> None:
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
            if buffer.complete:
                self.connection.end_stream(stream_id)
                await self._flush()
                del self.stream_buffers[stream_id]
                self.priority.remove_stream(stream_id)
        except (h2.exceptions.StreamClosedError, KeyError, h2.exceptions.ProtocolError):
            # the stream or the connection closed while the data waited: drop it, as Hypercorn does
            await buffer.close()
            self.stream_buffers.pop(stream_id, None)
            self.priority.remove_stream(stream_id)

    async def _create_stream(self, request: h2.events.RequestReceived) -> None:
        """Hypercorn's, with :class:`InformationalStream` for HTTP requests."""
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
        self.streams[request.stream_id] = InformationalStream(
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
        self.stream_buffers[request.stream_id] = OutboundBuffer(self.context.event_class)
        try:
            self.priority.insert_stream(request.stream_id)
        except priority.priority.DuplicateStreamError:  # a PRIORITY frame came before the HEADERS
            pass
        else:
            self.priority.block(request.stream_id)
        await self.streams[request.stream_id].handle(
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
        await super()._close_stream(stream_id)


class H2Connection:
    """One HTTP/2 connection on an asyncio transport, counted among uvicorn's connections (so shutdown drains it);
    the counterpart of Hypercorn's ``TCPServer`` for a transport uvicorn's listener accepted."""

    def __init__(
        self,
        transport: asyncio.Transport,
        first_bytes: bytes,
        *,
        app: Any,
        options: H2Options,
        server_state: ServerState,
        app_state: dict[str, Any],
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.options = options
        self.config = options.hypercorn()
        self.context = WorkerContext(None)
        self.server_state = server_state
        self.app = ASGIWrapper(app)
        self.app_state = app_state
        self.reader = asyncio.StreamReader(limit=MAX_RECV, loop=self.loop)
        protocol = asyncio.StreamReaderProtocol(self.reader, loop=self.loop)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        self.writer = asyncio.StreamWriter(transport, protocol, self.reader, self.loop)
        if first_bytes:
            self.reader.feed_data(first_bytes)
        self.send_lock = asyncio.Lock()
        self.idle_task = AsyncioSingleTask()
        self.protocol: FlowControlledH2 | None = None
        self.task = self.loop.create_task(self.run())
        server_state.connections.add(self)  # type: ignore[arg-type]
        server_state.tasks.add(self.task)
        self.task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.server_state.connections.discard(self)
        self.server_state.tasks.discard(task)

    def shutdown(self) -> None:
        """uvicorn's shutdown: refuse new streams, let running ones finish, then GOAWAY and close."""
        self.loop.create_task(self._shutdown())

    async def _shutdown(self) -> None:
        await self.context.terminated.set()
        if self.protocol is not None and self.protocol.idle:
            await self._close_when_idle()

    async def run(self) -> None:
        sock = self.writer.get_extra_info("socket")
        try:
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
            ssl_on = self.writer.get_extra_info("sslcontext") is not None
            async with TaskGroup(self.loop) as task_group:
                self._task_group = task_group
                self.protocol = FlowControlledH2(
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.app_state.copy()),
                    ssl_on,
                    client,
                    server,
                    self._send,
                    options=self.options,
                )
                await self.protocol.initiate()
                await self.idle_task.restart(task_group, self._idle_timeout)
                await self._read()
        except OSError:
            pass
        finally:
            await self._close()

    async def _send(self, event: Event) -> None:
        if isinstance(event, RawData):
            async with self.send_lock:
                try:
                    self.writer.write(event.data)
                    await self.writer.drain()
                except (ConnectionError, RuntimeError):
                    assert self.protocol is not None
                    await self.protocol.handle(Closed())
        elif isinstance(event, Closed):
            await self._close()
        elif isinstance(event, Updated):
            if event.idle:
                await self.idle_task.restart(self._task_group, self._idle_timeout)
            else:
                await self.idle_task.stop()

    async def _read(self) -> None:
        assert self.protocol is not None
        while not self.reader.at_eof():
            try:
                data = await self.reader.read(MAX_RECV)
            except (ConnectionError, OSError, ssl.SSLError):
                break
            await self.protocol.handle(RawData(data))
        await self.protocol.handle(Closed())

    async def _idle_timeout(self) -> None:
        try:
            async with asyncio.timeout(self.options.keep_alive):
                await self.context.terminated.wait()
        except TimeoutError:
            pass
        await asyncio.shield(self._close_when_idle())

    async def _close_when_idle(self) -> None:
        assert self.protocol is not None
        if not self.protocol.closed:
            self.protocol.connection.close_connection()  # GOAWAY (NO_ERROR), last stream: the last one opened
            await self.protocol._flush()
            await self.protocol.handle(Closed())
        self.writer.close()

    async def _close(self) -> None:
        try:
            self.writer.close()
            await self.writer.wait_closed()
        except (ConnectionError, RuntimeError, ssl.SSLError, asyncio.CancelledError):
            pass
        finally:
            await self.idle_task.stop()


class ListenerProtocol(asyncio.Protocol):
    """The first protocol of each connection: routes it to HTTP/2 or to uvicorn's HTTP/1.1 protocol (module
    docstring). Made for one configuration by :func:`listener_protocol`."""

    http1: type[asyncio.Protocol]
    options: H2Options
    sniff_timeout: float = 30.0

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.config = config
        self.server_state = server_state
        self.app_state = app_state
        self.loop = _loop or asyncio.get_event_loop()
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:  # the handshake is done: ALPN decides
            if ssl_object.selected_alpn_protocol() == "h2":
                self._to_http2()
            else:
                self._to_http1()
            return
        self._timer = self.loop.call_later(self.sniff_timeout, self._silent)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.buffer.startswith(PREFACE):
            self._to_http2()
        elif not PREFACE.startswith(self.buffer):
            self._to_http1()

    def eof_received(self) -> bool | None:
        if not self.buffer:
            return None  # closed before a byte: nothing to answer
        protocol = self._to_http1()  # a partial request is uvicorn's to answer, as it is today
        return protocol.eof_received() if hasattr(protocol, "eof_received") else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()

    def _silent(self) -> None:
        # the head timeout has passed without a full preface or request line: HTTP/1.1's to answer (408 and
        # close, transfer.api.protocol.server) now, not after a second timeout of its own
        self._timer = None
        protocol = self._to_http1()
        timed_out = getattr(protocol, "_head_timed_out", None)
        if timed_out is not None:
            protocol._disarm_head_timer()  # type: ignore[attr-defined]
            timed_out()
        else:
            assert self.transport is not None
            self.transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _to_http1(self) -> asyncio.Protocol:
        self._cancel_timer()
        assert self.transport is not None
        protocol = self.http1(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.app_state, _loop=self.loop
        )
        self.transport.set_protocol(protocol)
        protocol.connection_made(self.transport)
        if self.buffer:
            buffered, self.buffer = self.buffer, b""
            protocol.data_received(buffered)
        return protocol

    def _to_http2(self) -> None:
        self._cancel_timer()
        assert self.transport is not None
        buffered, self.buffer = self.buffer, b""
        H2Connection(
            self.transport,
            buffered,
            app=self.config.loaded_app,
            options=self.options,
            server_state=self.server_state,
            app_state=self.app_state,
        )


def listener_protocol(
    http1: type[asyncio.Protocol], options: H2Options, *, sniff_timeout: float = 30.0
) -> type[ListenerProtocol]:
    """The listener's protocol class: HTTP/2 with ``options``, else ``http1`` (uvicorn's protocol class)."""
    attributes = {"http1": http1, "options": options, "sniff_timeout": sniff_timeout}
    return type("ListenerProtocol", (ListenerProtocol,), attributes)


def serve_config(
    app: Any, settings: Settings, *, host: str, port: int, tls: ListenerTLS | None = None, **kwargs: Any
) -> uvicorn.Config:
    """The uvicorn configuration of ``transfer serve``: :func:`transfer.api.protocol.server.uvicorn_config`, plus HTTP/2
    on the same listener (unless ``settings.http2`` is off) and TLS when ``tls`` is given (its files watched for a
    renewed certificate). Loaded already."""
    from transfer.api.protocol.server import uvicorn_config

    config = uvicorn_config(app, settings, host=host, port=port, **kwargs)
    if settings.http2:
        assert isinstance(config.http, type)
        config.http = listener_protocol(
            config.http, H2Options.from_settings(settings), sniff_timeout=settings.http_header_timeout
        )
    config.load()
    if tls is not None:
        config.ssl = tls.context  # after load(): uvicorn would otherwise build its own from file names
        if not settings.http2:  # ALPN must not offer what the listener will not speak (RFC 7301 §3.2)
            tls.context.set_alpn_protocols(["http/1.1"])
        # uvicorn's periodic hook on the server's loop (every ``timeout_notify`` seconds, measured on its 1 s tick):
        # a renewed certificate on disk is served without a signal
        config.callback_notify = tls.check_files
        config.timeout_notify = 0
    return config
