"""A webhook receiver for the tests: a real HTTP server on loopback (``http.server`` in a thread) that verifies
every delivery with the ``standardwebhooks`` library, as a receiver in production would, and keeps what it took.
It can be taken down (connections refused) and brought back on the same port, or told to answer an error."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook


@dataclass
class Delivery:
    id: str
    payload: dict[str, Any]
    headers: dict[str, str]


@dataclass
class Receiver:
    """Deliveries taken (verified), and those refused by the signature check (``forged``)."""

    secrets: list[str] = field(default_factory=list)
    status: int = 204  # what it answers a verified delivery
    delay: float = 0.0  # seconds before it answers
    deliveries: list[Delivery] = field(default_factory=list)
    forged: int = 0
    attempts: int = 0
    port: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._lock:
                    receiver.attempts += 1
                if receiver.delay:
                    time.sleep(receiver.delay)
                verified = None
                for secret in receiver.secrets:
                    try:
                        verified = Webhook(secret).verify(body, headers)
                        break
                    except Exception:  # noqa: BLE001, S112 - the library's WebhookVerificationError, any secret
                        continue
                if verified is None:
                    with receiver._lock:
                        receiver.forged += 1
                    self.send_response(400)
                    self.end_headers()
                    return
                status = receiver.status
                if 200 <= status < 300:
                    with receiver._lock:
                        receiver.deliveries.append(Delivery(headers["webhook-id"], json.loads(body), headers))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server signature
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Down: its port refuses connections until :meth:`start` again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def ids(self, kind: str | None = None) -> Counter[str]:
        """How often each event id was taken (of type ``kind``)."""
        with self._lock:
            return Counter(d.id for d in self.deliveries if kind is None or d.payload["type"] == kind)

    def of(self, kind: str) -> list[Delivery]:
        with self._lock:
            return [d for d in self.deliveries if d.payload["type"] == kind]

    def wait(self, done: Callable[[Receiver], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done(self):
            if time.monotonic() > deadline:
                with self._lock:
                    got = [(d.payload["type"], d.id) for d in self.deliveries]
                raise AssertionError(f"the receiver did not get what was expected in {timeout} s; it got {got}")
            time.sleep(0.05)
