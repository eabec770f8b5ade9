"""A pre-upload hook for the tests, written as an operator would (docs/HOOKS.md has the same rules): a real HTTP
server on loopback that refuses by name, size and owner, and gives what it allows a lifetime and metadata. It keeps
every request it was sent, and can answer slowly or with nonsense."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook

LIMIT = 100_000


def decide(data: dict[str, Any]) -> dict[str, Any]:
    """The policy: no executables, nothing above LIMIT bytes, nothing from mallory; a day's lifetime and a project."""
    name = data.get("name") or ""
    if name.lower().endswith(".exe"):
        return {"allow": False, "reason": "no executables here"}
    if (data.get("size") or 0) > LIMIT:
        return {"allow": False, "reason": f"files above {LIMIT} bytes go elsewhere"}
    if data.get("owner") == "mallory":
        return {"allow": False, "reason": "mallory may not upload"}
    return {"allow": True, "lifetime": 86400, "metadata": {"project": "apollo", "door": data["door"]}}


@dataclass
class HookServer:
    secret: str | None = None  # verify the service's signature with it
    delay: float = 0.0
    garbage: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    unverified: int = 0
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/pre-upload"

    def start(self) -> HookServer:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if hook.secret is not None:
                    try:
                        Webhook(hook.secret).verify(body, {k.lower(): v for k, v in self.headers.items()})
                    except Exception:  # noqa: BLE001 - the library's WebhookVerificationError
                        hook.unverified += 1
                        self.send_response(401)
                        self.end_headers()
                        return
                doc = json.loads(body)
                hook.requests.append(doc)
                if hook.delay:
                    time.sleep(hook.delay)
                answer = b"<html>oops</html>" if hook.garbage else json.dumps(decide(doc["data"])).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the http.server signature
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
