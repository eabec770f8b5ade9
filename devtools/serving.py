"""A real uvicorn serving an app on a loopback port, in a thread: what the tests and the benchmarks run against."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI

from devtools.ports import free_port, free_ports
from transfer.api.protocol.server import uvicorn_config
from transfer.settings import Settings

__all__ = ["ThreadServer", "free_port", "free_ports", "listening_socket", "serve_in_thread"]

T = TypeVar("T")


class ThreadServer(uvicorn.Server):
    """uvicorn's server, remembering the event loop it serves on: the app's services (their locks, their S3
    clients) belong to that loop, so a test that calls them directly does so there (:meth:`call`), never from
    its own loop in another thread."""

    loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on the server's loop and wait for it from the caller's loop."""
        if self.loop is None:
            work.close()
            raise RuntimeError("the server is not serving")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))


def listening_socket() -> socket.socket:
    """A TCP socket bound to a free loopback port, for a server to listen on. A port found free by a probe and
    bound later can be taken in between, by another test's server or by any outgoing connection's ephemeral port
    (drawn from the same range): seen as "address already in use" under a parallel suite."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
    except BaseException:
        sock.close()
        raise
    return sock


def serve_in_thread(app: FastAPI) -> tuple[str, ThreadServer, threading.Thread]:
    sock = listening_socket()  # bound before the server starts, and handed to it: nobody can take the port
    port = sock.getsockname()[1]
    settings = app.state.services.settings if hasattr(app.state, "services") else Settings()
    server = ThreadServer(uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning"))

    def run() -> None:
        with sock:  # closed however the server ends (it listens on a duplicate of it, or on it)
            server.run(sockets=[sock])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # generous: the suite runs beside other work on two cores
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, thread
