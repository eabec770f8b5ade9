"""Trust boundaries of the HTTP front door, checked for every request before any route runs.

Host. Descriptors, signed URLs and tus ``Location`` fields are built from the request's ``Host`` when no public URL
is configured, so a forged ``Host: evil.example`` would make the service hand out validly signed links to another
server. A request may only name an allowed host: the public URL's host, the bound address, a loopback name
(``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``::1``) or one of ``TRANSFER_ALLOWED_HOSTS``; any other is
400 ``host_not_allowed``. This also defeats DNS rebinding against a service on loopback (the browser then sends the
attacker's name as Host).

Browsers from other sites. Without API keys anyone who reaches the port may upload, and a web page can make a
browser send a "simple" cross-site request (a ``text/plain`` POST needs no CORS preflight): the page cannot read the
answer, but the file is stored. So a request that a browser marks as coming from another site (an ``Origin`` that
is not this service's, or ``Sec-Fetch-Site: cross-site`` / ``same-site``) is refused with 403
``cross_site_refused`` unless:

* its ``Origin`` is one of ``TRANSFER_CORS_ALLOW_ORIGINS`` (the operator opened the API to that site), or
* it is a GET or HEAD of a signed URL (file content, streaming chunks and their status). A signed URL is a bearer
  capability: whoever holds it may read what it signs, from anywhere, and a page that holds one learns nothing by
  making a browser fetch it. Reading the answer from script still needs CORS; ``<img>``/``<video>`` embedding works,
  and the content headers (attachment for scriptable types, ``nosniff``, CSP sandbox) keep it inert.

Requests without ``Origin`` and without ``Sec-Fetch-Site`` (curl, SDKs, agents) are not browser requests from
another site and pass. WebSocket handshakes are checked the same way (browsers do not apply CORS to WebSockets).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from transfer.api.responses import AsciiJSONResponse
from transfer.core.numerals import decimal
from transfer.errors import CrossSiteRefused, HostNotAllowed, TransferError

_WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::", "[::]"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_FOREIGN_SITES = frozenset({"cross-site", "same-site"})  # Fetch Metadata (W3C), Sec-Fetch-Site
# GET/HEAD paths whose requests carry a signed query (bearer capabilities); matched on the decoded path
_SIGNED_PATH_RE = re.compile(r"/v1/files/[^/]+/content|/v1/sessions/[^/]+/chunks(?:/[^/]+)?")
_MAX_HOST_LENGTH = 300  # a DNS name is at most 253 characters; a port and brackets add a few


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(host, port)`` of a ``Host`` field value (RFC 9110 §7.2: ``uri-host [":" port]``, RFC 3986 §3.2.2): the
    host lower-cased without a trailing dot, an IPv6 literal in its compressed form. None when malformed."""
    value = value.strip()
    if not value or len(value) > _MAX_HOST_LENGTH:
        return None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        try:
            host = ipaddress.IPv6Address(value[1:end]).compressed
        except ValueError:
            return None
        rest = value[end + 1 :]
    else:
        host, sep, port_text = value.partition(":")
        rest = sep + port_text
    port = None
    if rest:
        port = decimal(rest[1:], max_digits=5) if rest.startswith(":") else None
        if port is None or port > 65535:
            return None
    host = host.lower().rstrip(".")
    return (host, port) if host else None


def _normal_name(name: str) -> str:
    """A configured host name as :func:`split_host` would report it (a port, if given, is dropped)."""
    name = name.strip()
    try:
        return ipaddress.ip_address(name.strip("[]")).compressed
    except ValueError:
        pass
    parsed = split_host(name)
    return parsed[0] if parsed is not None else name.lower().rstrip(".")


@dataclass(frozen=True, slots=True)
class HostPolicy:
    """Which Host names requests may carry (so that URLs built from them point at this service)."""

    names: frozenset[str]
    any_host: bool = False

    @classmethod
    def build(cls, bind_host: str, public_url: str | None, allowed: Iterable[str]) -> HostPolicy:
        names = {_normal_name(n) for n in allowed if n.strip() and n.strip() != "*"}
        if bind_host.strip() not in _WILDCARD_BINDS:
            names.add(_normal_name(bind_host))
        if public_url:
            public_host = urlsplit(public_url).hostname
            if public_host:
                names.add(_normal_name(public_host))
        return cls(frozenset(names), any_host=any(n.strip() == "*" for n in allowed))

    def allows(self, host: str) -> bool:
        """``host`` as :func:`split_host` returns it."""
        if self.any_host or host in self.names or host == "localhost" or host.endswith(".localhost"):
            return True  # *.localhost resolves to loopback (RFC 6761 §6.3)
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False


@dataclass(frozen=True, slots=True)
class BrowserPolicy:
    """Which browser requests from other sites are let through (see the module docstring)."""

    cors_origins: frozenset[str]
    public_origin: str | None = None

    @classmethod
    def build(cls, cors_origins: Iterable[str], public_url: str | None) -> BrowserPolicy:
        public_origin = None
        if public_url:
            parts = urlsplit(public_url)
            public_origin = f"{parts.scheme}://{parts.netloc}".lower()
        return cls(frozenset(o.rstrip("/").lower() for o in cors_origins), public_origin)

    def is_foreign(self, origin: str | None, fetch_site: str | None, host: tuple[str, int | None] | None) -> bool:
        """Whether a browser says this request comes from another site than this service's."""
        if origin is not None:
            return not self._same_origin(origin, host)
        return fetch_site is not None and fetch_site.strip().lower() in _FOREIGN_SITES

    def _same_origin(self, origin: str, host: tuple[str, int | None] | None) -> bool:
        origin = origin.strip().lower()
        if self.public_origin is not None and origin == self.public_origin:
            return True
        if host is None or origin == "null":
            return False
        try:
            parts = urlsplit(origin)
            origin_port = parts.port
        except ValueError:
            return False
        default = _DEFAULT_PORTS.get(parts.scheme)
        if default is None or parts.hostname is None:
            return False
        # Host carries no scheme (TLS may end at a proxy): the origin's host and port must be the Host's
        return _normal_name(parts.hostname) == host[0] and (origin_port or default) == (host[1] or default)

    def allows_foreign(self, origin: str | None, method: str, path: str) -> bool:
        if origin is not None and ("*" in self.cors_origins or origin.strip().lower() in self.cors_origins):
            return True
        return method in ("GET", "HEAD") and _SIGNED_PATH_RE.fullmatch(path) is not None


class TrustBoundary:
    """ASGI middleware: 400 ``host_not_allowed`` for a Host outside the allow-list, 403 ``cross_site_refused`` for
    a browser request from another site that is not allowed (see the module docstring)."""

    def __init__(self, app: ASGIApp, hosts: HostPolicy, browsers: BrowserPolicy) -> None:
        self.app = app
        self.hosts = hosts
        self.browsers = browsers

    def refusal(self, scope: Scope) -> TransferError | None:
        """The error this boundary answers ``scope`` with, None when it lets the request in."""
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers", []):
            headers.setdefault(name.lower(), value)
        raw_host = headers.get(b"host")
        host = None
        if raw_host is not None:  # no Host (HTTP/1.0): URLs are built from the bound address
            host = split_host(raw_host.decode("latin-1"))
            if host is None or not self.hosts.allows(host[0]):
                shown = raw_host[:80].decode("latin-1")
                return HostNotAllowed(
                    f"Host {shown!r} is not a name of this service; set TRANSFER_PUBLIC_URL or TRANSFER_ALLOWED_HOSTS"
                )
        origin_raw = headers.get(b"origin")
        site_raw = headers.get(b"sec-fetch-site")
        origin = None if origin_raw is None else origin_raw.decode("latin-1")
        site = None if site_raw is None else site_raw.decode("latin-1")
        if not self.browsers.is_foreign(origin, site, host):
            return None
        method = "GET" if scope["type"] == "websocket" else scope["method"]
        path = scope["path"] if scope["type"] == "http" else ""  # a WebSocket is never a signed read
        if self.browsers.allows_foreign(origin, method, path):
            return None
        return CrossSiteRefused(
            "browser requests from another site are refused (configure TRANSFER_CORS_ALLOW_ORIGINS to allow one)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await AsciiJSONResponse(refusal.to_payload(), status_code=refusal.status)(scope, receive, send)
        else:  # closing before accepting: the server answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.code})
