"""A small HTTP fault proxy on loopback, in front of the S3 test server: it recognises S3 operations and, by rule,
resets the connection, answers 503 SlowDown or 500, stalls past the client's timeout, or answers
CompleteMultipartUpload with S3's "200 OK carrying an error" — everything else is forwarded unchanged.

One request per client connection (``Connection: close``), so each request is seen and judged on its own."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
    "<RequestId>fault-proxy</RequestId></Error>"
)


def classify(method: str, target: str) -> str:
    query = parse_qs(urlsplit(target).query, keep_blank_values=True)
    if method == "PUT":
        return "UploadPart" if "partNumber" in query else "PutObject"
    if method == "POST":
        if "uploads" in query:
            return "CreateMultipartUpload"
        if "uploadId" in query:
            return "CompleteMultipartUpload"
        return "Post"
    if method == "DELETE":
        return "AbortMultipartUpload" if "uploadId" in query else "DeleteObject"
    if method == "GET":
        return "ListMultipartUploads" if "uploads" in query else "GetObject"
    return method.title() + "Object"


@dataclass
class Rule:
    op: str
    fault: str  # reset | slowdown | internal | stall | error200 | flip (one body bit changed, then forwarded)
    times: int = 1  # -1: always


@dataclass
class FaultProxy:
    upstream: tuple[str, int]
    stall_seconds: float = 5.0
    rules: list[Rule] = field(default_factory=list)
    log: list[tuple[str, str]] = field(default_factory=list)  # (operation, what happened)
    targets: list[tuple[str, str]] = field(default_factory=list)  # (operation, request target), in arrival order

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._open: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop)
        self._server = future.result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._open):  # stalled connections too
                writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def add(self, op: str, fault: str, times: int = 1) -> None:
        self.rules.append(Rule(op, fault, times))

    def _take(self, op: str) -> str | None:
        for rule in self.rules:
            if rule.op == op and rule.times != 0:
                if rule.times > 0:
                    rule.times -= 1
                return rule.fault
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            await self._serve(reader, writer)
        finally:
            self._open.discard(writer)
            if not writer.transport.is_closing():
                writer.close()  # flushes what is buffered; abort() would drop it

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = [line.split(":", 1) for line in lines[1:] if ":" in line]
        length = next((int(v) for k, v in headers if k.strip().lower() == "content-length"), 0)
        chunked = any(k.strip().lower() == "transfer-encoding" and "chunked" in v.lower() for k, v in headers)
        body = await reader.readexactly(length) if length else b""
        if chunked:
            body = await _read_chunked(reader)
        op = classify(method, target)
        fault = self._take(op)
        self.log.append((op, fault or "forwarded"))
        self.targets.append((op, target))
        if fault == "flip" and body:  # one bit flipped in flight, then forwarded as if nothing happened
            body = body[: len(body) // 2] + bytes([body[len(body) // 2] ^ 0x01]) + body[len(body) // 2 + 1 :]
        try:
            if fault == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            if fault == "stall":
                await asyncio.sleep(self.stall_seconds)
                writer.transport.abort()
                return
            if fault in ("slowdown", "internal", "error200"):
                status, code = {
                    "slowdown": ("503 Slow Down", "SlowDown"),
                    "internal": ("500 Internal Server Error", "InternalError"),
                    "error200": ("200 OK", "InternalError"),
                }[fault]
                xml = ERROR_XML.format(code=code, message="injected by the fault proxy").encode()
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {len(xml)}\r\n"
                    "Connection: close\r\n\r\n".encode()
                    + xml
                )
                await writer.drain()
                writer.close()
                return
            await self._forward(lines, headers, body, writer)
        except (ConnectionError, OSError):
            writer.transport.abort()

    async def _forward(
        self, lines: list[str], headers: list[list[str]], body: bytes, writer: asyncio.StreamWriter
    ) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._open.add(up_writer)
        kept = [
            f"{k}:{v}"
            for k, v in headers
            if k.strip().lower() not in ("connection", "transfer-encoding", "content-length")
        ]
        request = "\r\n".join([lines[0], *kept, f"Content-Length: {len(body)}", "Connection: close", "", ""])
        up_writer.write(request.encode("latin-1") + body)
        await up_writer.drain()
        response_head = (await up_reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        response_head = [h for h in response_head if h and not h.lower().startswith("connection:")]
        writer.write(("\r\n".join([*response_head, "Connection: close", "", ""])).encode("latin-1"))
        while piece := await up_reader.read(1 << 16):
            writer.write(piece)
            await writer.drain()
        self._open.discard(up_writer)
        up_writer.close()
        writer.close()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip(), 16)
        if size == 0:
            while (await reader.readline()).strip():
                pass
            return bytes(out)
        out += await reader.readexactly(size)
        await reader.readline()
