"""HTTP/2 next to HTTP/1.1 on one listener: ``transfer serve`` speaks h2 (RFC 9113) by ALPN over TLS and by prior
knowledge (h2c, RFC 9113 §3.3) in cleartext, for a proxy in front; every other connection is uvicorn's HTTP/1.1
exactly as before (the protocol work of :mod:`transfer.api.protocol.server`: head timeouts, bodies without copies,
``104``).

How a connection is admitted and routed (:class:`ListenerProtocol`, the first protocol of every accepted connection):

- admitted against the connection limits first (:mod:`transfer.api.protocol.admission`): over a limit, it is
  answered ``503 too_many_connections`` in its own protocol and closed;
- TLS: after the handshake, ALPN ``h2`` goes to HTTP/2; ``http/1.1`` or no ALPN (curl --http1.1, the
  ``websockets`` client) to uvicorn's protocol.
- cleartext: the first bytes decide. The HTTP/2 connection preface (``PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n``)
  goes to HTTP/2; anything else is handed to uvicorn with the bytes read so far. Only a request whose first
  bytes match the preface's (a method ``PRI``) waits for more before the choice.

HTTP/2 is Hypercorn's sans-I/O protocol (h2 frames through the ``h2`` library) under the same ASGI application
and the same lifespan as uvicorn: the service is built once, in one process (chosen by measurement against
Granian; README "TLS and HTTP/2"). What this service changes in it (flow control per stream, the bounds of
frames, header blocks, frame rates, stream counts and response buffers, ``REFUSED_STREAM``, interim responses) is
:mod:`transfer.api.protocol.h2protocol`'s; this module owns the socket: a connection whose socket takes no bytes for
``http_send_timeout`` seconds is closed, and closing never waits on the client longer than that either.

Per stream, the rest holds as per HTTP/1.1 connection: sizes are the service's, slow bodies are shed by
:class:`transfer.api.protocol.server.BodyRateGuard` (ASGI, so per stream), and a connection stays open idle for
``http_keep_alive`` seconds. Shutdown: each HTTP/2 connection is one of uvicorn's connections, so
:class:`transfer.api.protocol.shutdown.GracefulServer` drains it like the others; on shutdown it refuses new streams,
lets running ones finish, then sends GOAWAY and closes. Zero-copy send is not offered on HTTP/2 (its frames
carry the bytes), nor over TLS at all (sendfile would bypass the encryption).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import uvicorn
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.asyncio.task_group import TaskGroup
from hypercorn.asyncio.worker_context import AsyncioSingleTask, WorkerContext
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.typing import ConnectionState
from hypercorn.utils import parse_socket_addr
from uvicorn.server import ServerState

from transfer import metrics
from transfer.api.protocol.admission import ConnectionLimits, Refusal, Ticket, peer_address, refuse
from transfer.api.protocol.h2protocol import FlowControlledH2, H2Options
from transfer.api.protocol.tls import ListenerTLS
from transfer.settings import Settings

__all__ = ["H2Options", "H2Connection", "ListenerProtocol", "listener_protocol", "serve_config"]

log = logging.getLogger("transfer.ops")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_RECV = 1 << 18  # bytes per socket read
# after a GOAWAY for an error, what the client still sends is read and dropped for this long (or this many bytes)
# before the socket closes: closed with unread bytes, the kernel answers them with a reset, and a reset arriving
# before the client read the GOAWAY destroys it (nginx's lingering close)
LINGER = 1.0
LINGER_BYTES = 4 << 20


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
        ticket: Ticket | None = None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.options = options
        self.config = options.hypercorn()
        self.context = WorkerContext(None)
        self.server_state = server_state
        self.app = ASGIWrapper(app)
        self.app_state = app_state
        self.ticket = ticket
        self.transport = transport
        self.reader = asyncio.StreamReader(limit=MAX_RECV, loop=self.loop)
        protocol = self._stream_protocol = asyncio.StreamReaderProtocol(self.reader, loop=self.loop)
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
        if self.ticket is not None:
            self.ticket.release()

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
                    on_abuse=self.ticket.punish if self.ticket is not None else None,
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
                    if getattr(self._stream_protocol, "_paused", True):  # over the high-water mark: wait for the client
                        # it must keep taking bytes (a client that stops reading altogether, window or not);
                        # drain() alone would wait for it for ever, holding every stream of the connection
                        async with asyncio.timeout(self.options.send_timeout):
                            await self.writer.drain()
                except TimeoutError:
                    metrics.send_timeouts.labels("h2_connection").inc()
                    log.info(
                        "HTTP/2 client %s took no bytes for %g s: connection closed",
                        self._who(),
                        self.options.send_timeout,
                    )
                    self.transport.abort()  # what it did not take is dropped with it
                    assert self.protocol is not None
                    await self.protocol.handle(Closed())
                except (ConnectionError, RuntimeError):
                    assert self.protocol is not None
                    await self.protocol.handle(Closed())
        elif isinstance(event, Closed):
            await self._close()
        elif isinstance(event, Updated):
            if event.idle and not (self.protocol is not None and self.protocol.closed):
                await self.idle_task.restart(self._task_group, self._idle_timeout)
            else:  # busy, or closed: the keep-alive timer would hold the task group (and the socket) for its length
                await self.idle_task.stop()

    def _who(self) -> str:
        peer = self.transport.get_extra_info("peername")
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"

    async def _read(self) -> None:
        assert self.protocol is not None
        while not self.reader.at_eof():
            try:
                data = await self.reader.read(MAX_RECV)
            except (ConnectionError, OSError, ssl.SSLError):
                break
            await self.protocol.handle(RawData(data))
        await self.protocol.handle(Closed())
        await self.idle_task.stop()  # nothing to keep alive: the task group ends with the streams' applications

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

    async def _linger(self) -> None:
        """The module's LINGER: the GOAWAY and a FIN go out, the client's bytes are dropped for a moment."""
        self._lingered = True
        try:
            if self.transport.can_write_eof():
                self.transport.write_eof()
            dropped = 0
            async with asyncio.timeout(LINGER):
                while dropped < LINGER_BYTES and (chunk := await self.reader.read(MAX_RECV)):
                    dropped += len(chunk)
        except (TimeoutError, ConnectionError, OSError, RuntimeError, ssl.SSLError):
            pass

    _lingered = False

    async def _close(self) -> None:
        try:
            if self.protocol is not None and self.protocol.failed and not self._lingered:
                await self._linger()
            self.writer.close()
            # close() sends what is queued first; a client that takes nothing would hold the socket for ever
            async with asyncio.timeout(self.options.send_timeout):
                await self.writer.wait_closed()
        except TimeoutError:
            self.transport.abort()
        except (ConnectionError, RuntimeError, ssl.SSLError, asyncio.CancelledError):
            pass
        finally:
            await self.idle_task.stop()


class ListenerProtocol(asyncio.Protocol):
    """The first protocol of each connection: admits it (:mod:`transfer.api.protocol.admission`) and routes it to
    HTTP/2 or to uvicorn's HTTP/1.1 protocol (module docstring). Made for one configuration by
    :func:`listener_protocol`."""

    http1: type[asyncio.Protocol]
    options: H2Options
    http2: bool = True
    sniff_timeout: float = 30.0
    limits: ConnectionLimits | None = None

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
        self.ticket: Ticket | None = None
        self.refusal: Refusal | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        ssl_object = transport.get_extra_info("ssl_object")
        if self.limits is not None:
            admitted = self.limits.admit(peer_address(transport))
            if isinstance(admitted, str):
                self.refusal = refuse(self.transport, self.limits, admitted)  # type: ignore[arg-type]
                if self.refusal is not None and ssl_object is not None:
                    if ssl_object.selected_alpn_protocol() == "h2":
                        self.refusal.alpn_h2()
                return
            self.ticket = admitted
        if ssl_object is not None:  # the handshake is done: ALPN decides
            if self.http2 and ssl_object.selected_alpn_protocol() == "h2":
                self._to_http2()
            else:
                self._to_http1()
            return
        if not self.http2:
            self._to_http1()
            return
        self._timer = self.loop.call_later(self.sniff_timeout, self._silent)

    def data_received(self, data: bytes) -> None:
        if self.refusal is not None:
            self.refusal.data(data)
            return
        self.buffer += data
        if self.buffer.startswith(PREFACE):
            self._to_http2()
        elif not PREFACE.startswith(self.buffer):
            self._to_http1()

    def eof_received(self) -> bool | None:
        if self.refusal is not None:
            self.refusal.finish()
            return None
        if not self.buffer:
            return None  # closed before a byte: nothing to answer
        protocol = self._to_http1()  # a partial request is uvicorn's to answer, as it is today
        return protocol.eof_received() if hasattr(protocol, "eof_received") else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self.refusal is not None:
            self.refusal.finish()
        if self.ticket is not None:  # closed before it was handed on
            self.ticket.release()
            self.ticket = None

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

    def _hand_on(self) -> Ticket | None:
        ticket, self.ticket = self.ticket, None
        return ticket

    def _to_http1(self) -> asyncio.Protocol:
        self._cancel_timer()
        assert self.transport is not None
        protocol = self.http1(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.app_state, _loop=self.loop
        )
        protocol.ticket = self._hand_on()  # type: ignore[attr-defined]  # server.HeadTimeoutProtocol gives it back
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
            ticket=self._hand_on(),
        )


def listener_protocol(
    http1: type[asyncio.Protocol],
    options: H2Options,
    *,
    sniff_timeout: float = 30.0,
    http2: bool = True,
    limits: ConnectionLimits | None = None,
) -> type[ListenerProtocol]:
    """The listener's protocol class: HTTP/2 with ``options`` (unless ``http2`` is off), else ``http1`` (uvicorn's
    protocol class); connections admitted against ``limits`` when given."""
    attributes = {
        "http1": http1,
        "options": options,
        "sniff_timeout": sniff_timeout,
        "http2": http2,
        "limits": limits,
    }
    return type("ListenerProtocol", (ListenerProtocol,), attributes)


def serve_config(
    app: Any, settings: Settings, *, host: str, port: int, tls: ListenerTLS | None = None, **kwargs: Any
) -> uvicorn.Config:
    """The uvicorn configuration of ``transfer serve``: :func:`transfer.api.protocol.server.uvicorn_config`, plus the
    connection limits, HTTP/2 on the same listener (unless ``settings.http2`` is off) and TLS when ``tls`` is given
    (its files watched for a renewed certificate). Loaded already."""
    from transfer.api.protocol.server import uvicorn_config

    config = uvicorn_config(app, settings, host=host, port=port, **kwargs)
    assert isinstance(config.http, type)
    limits = ConnectionLimits(
        settings.http_max_connections,
        settings.http_max_connections_per_client,
        settings.trusted_proxies,
        penalty=settings.h2_abuse_penalty,
    )
    config.http = listener_protocol(
        config.http,
        H2Options.from_settings(settings),
        sniff_timeout=settings.http_header_timeout,
        http2=settings.http2,
        limits=limits,
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
