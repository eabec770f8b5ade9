"""Shared fixtures: settings on a temp directory, the in-process app, and a real uvicorn server on loopback."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from transfer.api.app import create_app
from transfer.settings import Settings


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    """A clock the tests move by hand (Unix seconds)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", signing_keys={"test": "0123456789abcdef0123456789abcdef"})


@pytest.fixture
def app(settings: Settings, clock: Clock) -> FastAPI:
    return create_app(settings, clock=clock)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LiveServer:
    url: str
    app: FastAPI
    settings: Settings

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    def leftovers(self) -> list[str]:
        """Files under tmp/ — must be empty once no upload is in flight."""
        tmp = self.data_dir / "tmp"
        return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []

    def objects(self) -> list[str]:
        root = self.data_dir / "objects"
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def live_server(app: FastAPI, settings: Settings) -> Iterator[LiveServer]:
    """The app served by a real uvicorn (uvloop + httptools) on a loopback port, in a thread."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", app, settings)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def http(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        yield client
