"""Fixtures of the identity tests: a real authorization server (oidc-provider, from the npm registry, pinned) on a
loopback port, and the service served on a port known before its settings are made (its resource identifier is
its own URL, as the MCP client checks)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from devtools.serving import ThreadServer, listening_socket
from tests.conftest import LiveServer
from transfer.api.protocol.server import uvicorn_config
from transfer.core.auth import new_token, token_hash
from transfer.hosts import create_app
from transfer.settings import Settings

REPO = Path(__file__).resolve().parents[2]
NODE_DIR = REPO / ".cache" / "identity-node"  # `make install` fills it (the Makefile pins the versions)
PACKAGES = ("oidc-provider@9.13.3", "@modelcontextprotocol/sdk@1.32.2")
SCRIPTS = ("issuer.mjs", "mcp_client.mjs")
SCOPE = "upload read admin"
AGENT = ("agent", "agent-secret-0123456789abcdef")
READER = ("reader-agent", "reader-secret-0123456789abcdef")
OPAQUE = ("opaque-agent", "opaque-secret-0123456789abcdef")
BRIEF = ("brief-agent", "brief-secret-0123456789abcdef")  # tokens that live 1 second
INTROSPECTOR = ("transfer", "transfer-secret-0123456789abcdef")  # the service's own client at the issuer


def node_dir() -> Path:
    """The pinned npm packages (installed once per checkout, as `make install` does) with the test scripts."""
    if not all((NODE_DIR / "node_modules" / name.rsplit("@", 1)[0]).is_dir() for name in PACKAGES):
        if shutil.which("npm") is None:
            pytest.fail("npm is missing: `make install` installs it (apt-get install npm)")
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(NODE_DIR), "--no-audit", "--no-fund", "--silent", *PACKAGES],
            check=True,
            timeout=300,
        )
    for script in SCRIPTS:  # beside node_modules: ES modules resolve packages from where the script is
        shutil.copyfile(Path(__file__).with_name(script), NODE_DIR / script)
    return NODE_DIR


def signing_key(kid: str) -> dict[str, Any]:
    """A new RSA signing key as a private JWK (what the issuer signs with, and publishes the public half of)."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk: dict[str, Any] = json.loads(RSAAlgorithm.to_jwk(private))
    jwk.update(kid=kid, use="sig", alg="RS256")
    return jwk


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Issuer:
    """oidc-provider on a loopback port; ``restart`` with other keys rotates them, at the same issuer URL."""

    workdir: Path
    keys: list[dict[str, Any]]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        config = {
            "jwks": {"keys": self.keys},
            "scope": SCOPE,
            "clients": [
                {"client_id": AGENT[0], "client_secret": AGENT[1]},
                {"client_id": READER[0], "client_secret": READER[1], "scope": "read"},
                {"client_id": OPAQUE[0], "client_secret": OPAQUE[1], "format": "opaque"},
                {"client_id": BRIEF[0], "client_secret": BRIEF[1], "ttl": 1},
                {"client_id": INTROSPECTOR[0], "client_secret": INTROSPECTOR[1], "introspector": True},
            ],
        }
        path = self.workdir / f"issuer-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(config))
        self.process = subprocess.Popen(
            ["node", str(node_dir() / "issuer.mjs"), str(self.port), str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # "listening <port>" once it accepts connections
        assert line.startswith(b"listening"), f"the issuer did not start: {line!r}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None

    def restart(self, keys: list[dict[str, Any]]) -> None:
        self.stop()
        self.keys = keys
        self.start()

    def token(self, client: tuple[str, str], resource: str, scope: str = "upload read") -> str:
        """An access token by client credentials (RFC 6749 §4.4) for ``resource`` (RFC 8707)."""
        response = httpx.post(
            f"{self.url}/token",
            data={"grant_type": "client_credentials", "scope": scope, "resource": resource},
            auth=client,
            timeout=10,
        )
        assert response.status_code == 200, response.text
        token: str = response.json()["access_token"]
        return token


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issuer]:
    running = Issuer(tmp_path_factory.mktemp("issuer"), [signing_key("key-1")])
    running.start()
    try:
        yield running
    finally:
        running.stop()


@dataclass
class Deployment:
    """Replicas of the service over one data directory, with one bootstrap admin key."""

    admin: str
    replicas: list[LiveServer]

    @property
    def url(self) -> str:
        return self.replicas[0].url


@contextmanager
def serve_on(sock: socket.socket, settings: Settings) -> Iterator[LiveServer]:
    """The service built from ``settings`` served by uvicorn on ``sock`` (bound already), in a thread."""
    app = create_app(settings)
    port = sock.getsockname()[1]
    server = ThreadServer(uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning"))

    def run() -> None:
        with sock:
            server.run(sockets=[sock])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the service did not start"
        time.sleep(0.01)
    try:
        yield LiveServer(f"http://127.0.0.1:{port}", app, settings, server)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def deployment(data_dir: Path, *, replicas: int = 1, **overrides: Any) -> Iterator[Deployment]:
    """``replicas`` servers over ``data_dir``, each its own process-like set of services and caches, closed by an
    admin key in TRANSFER_API_KEYS; ``overrides`` are more settings (``oauth_issuers`` among them). The resource
    identifier is the first replica's URL."""
    admin = new_token()
    socks = [listening_socket() for _ in range(replicas)]
    url = f"http://127.0.0.1:{socks[0].getsockname()[1]}"
    base = {
        "data_dir": data_dir,
        "signing_keys": {"test": "0123456789abcdef0123456789abcdef"},
        "api_keys": {"root": {"sha256": token_hash(admin), "scopes": ["admin"]}},
        "oauth_resource": url,
        **overrides,
    }
    with _serving(socks, Settings(**base)) as servers:
        yield Deployment(admin, servers)


@contextmanager
def _serving(socks: list[socket.socket], settings: Settings) -> Iterator[list[LiveServer]]:
    if not socks:
        yield []
        return
    with serve_on(socks[0], settings) as first, _serving(socks[1:], settings) as rest:
        yield [first, *rest]


def issuer_entry(issuer: Issuer, **extra: Any) -> dict[str, Any]:
    """The TRANSFER_OAUTH_ISSUERS entry of ``issuer``, introspecting with the service's own client."""
    return {
        "issuer": issuer.url,
        "introspection": {"client_id": INTROSPECTOR[0], "client_secret": INTROSPECTOR[1]},
        **extra,
    }


def node_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRANSFER_")}
