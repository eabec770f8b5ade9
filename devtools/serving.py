"""A real uvicorn serving an app on a loopback port, in a thread: what the tests and the benchmarks run against."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI

from transfer.api.protocol.server import uvicorn_config
from transfer.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve_in_thread(app: FastAPI) -> tuple[str, Any, threading.Thread]:
    port = free_port()
    settings = app.state.services.settings if hasattr(app.state, "services") else Settings()
    server = uvicorn.Server(uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # generous: the suite runs beside other work on two cores
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    return f"http://127.0.0.1:{port}", server, thread
