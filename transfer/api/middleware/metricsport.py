"""The metrics port (``TRANSFER_METRICS_PORT``): a second listening socket of the same server on which only
``GET /metrics`` (and HEAD) is answered, without a key, so that Prometheus scrapes without holding an admin key.
Every other request there is 404 and never reaches the application; on the main port ``/metrics`` keeps asking for
an admin key when keys are configured.

One server with two sockets rather than a second server (``prometheus_client.start_http_server``): the metrics
port then has the main port's protection against slow or oversized request heads, its HTTP/2 limits, its TLS when
configured and its drain on SIGTERM, and no thread per connection. Requests are told apart by the local port they
arrived on (ASGI ``scope["server"]``), which the client cannot choose.
"""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from transfer import metrics
from transfer.api.responses import AsciiJSONResponse
from transfer.errors import MethodNotAllowed, NotFound

METRICS_PATH = "/metrics"


class MetricsPort:
    """ASGI: requests that arrived on local port ``port`` get the metrics (``GET``/``HEAD /metrics``) or a 404/405;
    all others go to ``app``."""

    def __init__(self, app: ASGIApp, port: int) -> None:
        self.app = app
        self.port = port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") if scope["type"] in ("http", "websocket") else None
        if server is None or server[1] != self.port:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # before accept: the server answers 403
            return
        if scope["path"] != METRICS_PATH:
            error: NotFound | MethodNotAllowed = NotFound("this port serves only GET /metrics")
            await AsciiJSONResponse(error.to_payload(), status_code=error.status)(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD"):
            error = MethodNotAllowed("GET or HEAD /metrics")
            response = AsciiJSONResponse(error.to_payload(), status_code=error.status, headers={"allow": "GET, HEAD"})
            await response(scope, receive, send)
            return
        accept = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"accept"), "")
        encode, content_type = choose_encoder(accept)
        headers = {"content-type": content_type, "cache-control": "no-store"}
        await Response(encode(metrics.registry), headers=headers)(scope, receive, send)
