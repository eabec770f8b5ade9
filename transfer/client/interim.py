"""One HTTP/1.1 request whose interim (1xx) responses the caller sees, with a body read from a file.

httpx (through httpcore) reads past every 1xx but ``101`` without a word; a resumable upload's creation needs the
``104 Upload Resumption Supported`` it may get before its body is sent (draft-ietf-httpbis-resumable-upload,
§"Upload Creation"). This module writes the request httpx built (its headers, auth included) with h11 on a
connection of its own, hands every interim response to the caller as it arrives, and sends the body only once an
interim response said so (or after a short wait, for a server that sends none: RFC 9110 §10.1.1 lets a client that
sent ``Expect: 100-continue`` go on without one). A final response that comes while the body is still being sent
(an early refusal) stops the sending and is the answer.

Plain ``http`` or ``https`` (anyio's TLS); no proxy: the caller uses httpx for anything a proxy must see.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import anyio.abc
import h11
import httpx

from transfer.errors import SizeMismatch

PIECE = 1 << 20  # bytes read from the file and written per call
_HEAD_READ = 64 << 10
MAX_BODY = 4 << 20  # bytes of a final response body kept (a descriptor, a problem document): the rest is read, dropped


class ExchangeCut(Exception):
    """The exchange ended without a final response (connection refused, reset or closed, a timeout)."""


# what a connection that breaks raises
_CUTS = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
    TimeoutError,
    ssl.SSLError,
    h11.RemoteProtocolError,
    h11.LocalProtocolError,
    ExchangeCut,
)


async def _connect(url: str, timeout: httpx.Timeout, ssl_context: ssl.SSLContext | None) -> anyio.abc.ByteStream:
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if tls else 80)
    try:
        with anyio.fail_after(timeout.connect or 30):
            if tls:
                return await anyio.connect_tcp(host, port, tls=True, ssl_context=ssl_context)
            return await anyio.connect_tcp(host, port)
    except (OSError, TimeoutError, anyio.BrokenResourceError, ssl.SSLError) as exc:
        raise ExchangeCut(f"could not connect to {host}:{port}: {exc}") from exc


async def exchange(
    request: httpx.Request,
    path: Path,
    length: int,
    *,
    timeout: httpx.Timeout,
    ssl_context: ssl.SSLContext | None = None,
    wait: float = 1.0,
    interim: Callable[[h11.InformationalResponse], bool],
    sent: Callable[[int], None],
) -> tuple[h11.Response, bytes]:
    """Send ``request`` (its method, URL and headers as httpx built them) with the first ``length`` bytes of the file
    at ``path`` as its body, and return the final response with (up to :data:`MAX_BODY` of) its body.

    ``interim`` sees every interim response as it arrives and answers whether the body may go now (a ``100
    Continue``, a ``104`` it accepts); without one the body goes after ``wait`` seconds. ``sent`` is told the size of
    each piece written. Raises ExchangeCut when there is no final response; SizeMismatch when the file is shorter."""
    stream = await _connect(str(request.url), timeout, ssl_context)
    url = urlsplit(str(request.url))
    target = (url.path or "/") + (f"?{url.query}" if url.query else "")
    conn = h11.Connection(h11.CLIENT)
    head = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.multi_items()]
    go = anyio.Event()  # an interim response let the body go (or the final response began)
    responded = anyio.Event()  # the final response began: stop sending
    answer: list[tuple[h11.Response, bytes]] = []
    read_timeout = timeout.read or 60

    async def receive() -> None:
        body = bytearray()
        response: h11.Response | None = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                with anyio.fail_after(read_timeout):
                    data = await stream.receive(_HEAD_READ)
                conn.receive_data(data)
            elif isinstance(event, h11.InformationalResponse):
                if interim(event):
                    go.set()
            elif isinstance(event, h11.Response):
                response = event
                responded.set()
                go.set()
            elif isinstance(event, h11.Data):
                if len(body) < MAX_BODY:
                    body += event.data[: MAX_BODY - len(body)]
            elif isinstance(event, h11.EndOfMessage) and response is not None:
                answer.append((response, bytes(body)))
                return
            else:
                raise ExchangeCut(f"unexpected {type(event).__name__} from the server")

    async def send() -> None:
        with anyio.move_on_after(wait):
            await go.wait()
        done = 0
        fd = await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            while done < length and not responded.is_set():
                piece = await asyncio.to_thread(os.pread, fd, min(PIECE, length - done), done)
                if not piece:
                    raise SizeMismatch(f"{path} ends before byte {length} (changed while uploading?)")
                await stream.send(conn.send(h11.Data(data=piece)))
                done += len(piece)
                sent(len(piece))
            if not responded.is_set():
                await stream.send(conn.send(h11.EndOfMessage()))
        except _CUTS:
            if not responded.is_set():
                raise  # else the server answered early and stopped reading: its answer is what counts
        finally:
            os.close(fd)

    try:
        await stream.send(conn.send(h11.Request(method=request.method, target=target.encode("latin-1"), headers=head)))
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(receive)
            await send()
    except BaseExceptionGroup as group:
        if not answer:
            first = _first_error(group)
            if first is not None:
                raise first from None
            raise ExchangeCut("; ".join(str(e) or type(e).__name__ for e in group.exceptions)) from None
    except _CUTS as exc:
        if not answer:
            raise ExchangeCut(str(exc) or type(exc).__name__) from None
    finally:
        await stream.aclose()
    if not answer:
        raise ExchangeCut("the connection closed before a final response")
    return answer[0]


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first exception in ``group`` that is not a broken connection (a file that changed, a cancellation)."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            inner = _first_error(exc)
            if inner is not None:
                return inner
        elif not isinstance(exc, _CUTS):
            return exc
    return None
