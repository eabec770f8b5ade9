"""The ASGI ``http.response.zerocopysend`` extension for uvicorn's httptools protocol: a response body sent from an
open file with ``sendfile(2)``, so its bytes never enter this process (what nginx does with ``sendfile on``).

uvicorn offers no zero-copy send and uvloop implements no ``loop.sendfile``, so :func:`enable` adds one to a
request-response cycle: it advertises the extension in the request's scope and lets the cycle's ``send`` take the
message (ASGI extensions, "Zero Copy Send"): ``{"type": "http.response.zerocopysend", "file": <file object or
descriptor>, "offset": int, "count": int, "more_body": bool}``. Every other message goes to uvicorn's ``send``
unchanged, which keeps the framing rules: a zero-copy body needs a ``content-length`` response (no chunked
framing), and it counts against that length like any body.

The socket is written directly, bypassing the transport's buffer, so two rules keep the byte stream in order:
the transport's buffer must be empty before ``sendfile`` writes (the headers uvicorn queued go first), and nothing
else writes to the connection while a zero-copy body is in flight (the only other writer, the head-timeout 408 of
:mod:`transfer.api.protocol.server`, writes only between responses). Every ``sendfile`` call runs on the event loop
right after checking that the transport is still open, so the descriptor cannot have been closed and reused in between.
A full socket buffer waits for writability on one ``epoll`` instance per event loop (uvloop refuses ``add_writer``
on a descriptor its transport owns; an epoll descriptor it does not own is fine).

A client that takes no bytes for ``send_timeout`` seconds (the socket stays full, or the transport's own buffer does
not shrink) ends the connection (``abort``) and the application sees ``http.disconnect``, so its file is closed:
the zero-copy path waited on writability with no deadline, holding the file and the socket for as long as the
client kept its receive window shut.

``sendfile`` copies from the page cache inside the kernel on the calling thread (asyncio's own ``loop.sendfile``
does the same on its loop); each call is capped at ``CHUNK`` bytes so one call never holds the loop for long.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from transfer import metrics

log = logging.getLogger("transfer.ops")

EXTENSION = "http.response.zerocopysend"
CHUNK = 8 << 20  # bytes per sendfile call at most: bounds the time one call holds the event loop


class _Writability:
    """Wakes coroutines waiting for sockets to become writable, through one edge-free, one-shot epoll set
    registered as a reader on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._epoll = select.epoll()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._loop = loop
        loop.add_reader(self._epoll.fileno(), self._ready)

    def _ready(self) -> None:
        for fd, _events in self._epoll.poll(0):
            waiter = self._waiters.pop(fd, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    async def wait(self, fd: int) -> None:
        """Until ``fd`` can be written (or has an error or hang-up, which the next write reports)."""
        waiter = self._loop.create_future()
        self._waiters[fd] = waiter
        mask = select.EPOLLOUT | select.EPOLLONESHOT
        try:
            self._epoll.register(fd, mask)
        except FileExistsError:  # registered by an earlier wait on this connection, disarmed since (one-shot)
            self._epoll.modify(fd, mask)
        try:
            await waiter
        finally:
            if self._waiters.get(fd) is waiter:
                del self._waiters[fd]

    def forget(self, fd: int) -> None:
        """Drop ``fd`` from the set (its transport keeps the socket open, so the kernel would not)."""
        try:
            self._epoll.unregister(fd)
        except (FileNotFoundError, OSError):
            pass


_pollers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Writability] = weakref.WeakKeyDictionary()


def _poller() -> _Writability:
    loop = asyncio.get_running_loop()
    poller = _pollers.get(loop)
    if poller is None:
        poller = _pollers[loop] = _Writability(loop)
    return poller


class _Gone(Exception):
    """The connection closed (client gone, or the server closed it) before the body was sent."""


class _Stalled(_Gone):
    """The client took no bytes for the send timeout."""


async def _drained(transport: asyncio.Transport, timeout: float | None) -> None:
    """Until the transport's own buffer is empty: what it holds must reach the socket before sendfile writes.
    :class:`_Stalled` when it does not shrink for ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    delay = 0.0005
    smallest, since = transport.get_write_buffer_size(), loop.time()
    while size := transport.get_write_buffer_size():
        if transport.is_closing():
            raise _Gone
        if size < smallest:
            smallest, since = size, loop.time()
        elif timeout is not None and loop.time() - since > timeout:
            raise _Stalled
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)


async def send_file(
    transport: asyncio.Transport,
    fd: int,
    offset: int,
    count: int,
    timeout: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Send ``count`` bytes of ``fd`` from ``offset`` on the transport's socket with sendfile(2); raises
    :class:`_Gone` when the connection closes first, :class:`_Stalled` when the socket takes no bytes for
    ``timeout`` seconds (None: no limit). ``progress`` is told each call's bytes."""
    await _drained(transport, timeout)
    sock = transport.get_extra_info("socket")
    if sock is None:
        raise _Gone
    poller = _poller()
    sock_fd = sock.fileno()
    try:
        while count > 0:
            if transport.is_closing():  # checked right before the call: sock_fd is still this connection's
                raise _Gone
            try:
                sent = os.sendfile(sock_fd, fd, offset, min(count, CHUNK))
            except BlockingIOError:
                try:
                    async with asyncio.timeout(timeout):
                        await poller.wait(sock_fd)
                except TimeoutError:
                    raise _Stalled from None
                continue
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.EBADF, errno.ENOTCONN):
                    raise _Gone from exc
                raise
            if sent == 0:
                raise OSError(errno.EIO, "file shorter than the response's content-length")
            offset += sent
            count -= sent
            if progress is not None:
                progress(sent)
    finally:
        if not transport.is_closing():
            poller.forget(sock_fd)


def enable(cycle: Any, *, send_timeout: float | None = None) -> None:
    """Give a uvicorn httptools request-response cycle the zero-copy send extension (see the module docstring),
    with ``send_timeout`` for its client (None: none). Call before its ASGI task first runs (the task reads
    ``cycle.send`` when it starts)."""
    scope = cycle.scope
    scope.setdefault("extensions", {})[EXTENSION] = {}
    plain_send: Callable[[Any], Awaitable[None]] = cycle.send
    transport: asyncio.Transport = cycle.transport
    aborted = False

    async def send(message: Any) -> None:
        nonlocal aborted
        if aborted:
            return  # the connection was closed under a zero-copy body: like uvicorn after a disconnect
        if message["type"] != EXTENSION:
            await plain_send(message)
            return
        if not cycle.response_started or cycle.response_complete:
            raise RuntimeError(f"'{EXTENSION}' outside a started response")
        if cycle.chunked_encoding or scope["method"] == "HEAD":
            raise RuntimeError(f"'{EXTENSION}' needs a content-length response with a body")
        file = message["file"]
        fd = file if isinstance(file, int) else file.fileno()
        offset = message.get("offset")
        if offset is None:
            offset = os.lseek(fd, 0, os.SEEK_CUR)
        count = message.get("count")
        if count is None:
            count = os.fstat(fd).st_size - offset
        if count > cycle.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        if cycle.disconnected:
            return

        def sent(size: int) -> None:
            cycle.zero_copy_sent = getattr(cycle, "zero_copy_sent", 0) + size

        cycle.zero_copy_active = True
        try:
            await send_file(transport, fd, offset, count, send_timeout, sent)
        except _Stalled:
            aborted = True
            metrics.send_timeouts.labels("http1").inc()
            client = scope.get("client")
            log.info("HTTP/1.1 client %s took no bytes for %g s: connection closed", client and client[0], send_timeout)
            transport.abort()  # close() would wait to flush what the client does not take
            return
        except _Gone:
            aborted = True
            transport.close()
            return
        except BaseException:
            # cancelled or failed part way: the byte stream is cut, so the connection cannot be reused
            aborted = True
            transport.close()
            raise
        finally:
            cycle.zero_copy_active = False
        cycle.expected_content_length -= count
        await plain_send({"type": "http.response.body", "body": b"", "more_body": message.get("more_body", False)})

    cycle.send = send
