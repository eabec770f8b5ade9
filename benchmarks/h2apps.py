"""Null ASGI applications for the HTTP/2 server comparison of :mod:`benchmarks.http2`: ``sink`` reads a request
body and answers its length, ``source`` answers 256 MiB (``?mib=N``: N MiB) of zeros in 1 MiB pieces.
``python -m benchmarks.h2apps APP PORT`` serves one on the listener of ``transfer serve`` (uvicorn +
transfer.api.protocol.http2), cleartext."""

from __future__ import annotations

import sys
from typing import Any

SOURCE_SIZE = 256 << 20
_PIECE = bytes(1 << 20)


async def sink(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    received = 0
    while True:
        message = await receive()
        received += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": str(received).encode()})


async def source(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    size = SOURCE_SIZE  # or ?mib=N
    query = scope.get("query_string", b"").decode()
    if query.startswith("mib=") and query[4:].isdigit():
        size = int(query[4:]) << 20
    headers = [(b"content-type", b"application/octet-stream"), (b"content-length", str(size).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    pieces = size // len(_PIECE)
    for n in range(pieces):
        await send({"type": "http.response.body", "body": _PIECE, "more_body": n < pieces - 1})


def main() -> None:
    import uvicorn

    from transfer.api.protocol.http2 import H2Options, listener_protocol
    from transfer.api.protocol.server import head_timeout_protocol

    app = {"sink": sink, "source": source}[sys.argv[1]]
    http = listener_protocol(head_timeout_protocol(30.0), H2Options())
    config = uvicorn.Config(app, port=int(sys.argv[2]), loop="uvloop", http=http, log_level="warning", lifespan="off")
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
