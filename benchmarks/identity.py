"""What checking the caller costs per request: an API key of the environment, a key record, a JWT access token
(RS256, ES256) verified once and then remembered, and verified on every request (token cache off).

Two parts:
- in process: ``Identities.grant`` per call (µs), and the issuer's HTTP requests it made after the warm-up (0: no
  network round trip once the JWKS is cached);
- end to end: the small-objects load (4 KiB uploads, 64 concurrent, every object durable) against ``transfer
  serve`` with each kind of credential, in turn, several rounds: req/s and server CPU ms per request.

The issuer is a static one in this process (metadata + JWKS over HTTP on loopback, counting its hits); tokens are
signed here with its keys. Run: ``python -m benchmarks.identity [--requests N] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from benchmarks.e2e import pin, service
from benchmarks.network import LOAD_SCRIPT, _cpu_seconds
from transfer.core.auth import new_token, token_hash

RESOURCE = "https://transfer.bench.example"


class StaticIssuer:
    """An authorization server's metadata and JWKS on a loopback port; ``hits`` counts its requests."""

    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        public = [
            {**json.loads(RSAAlgorithm.to_jwk(self.rsa.public_key())), "kid": "rsa", "alg": "RS256", "use": "sig"},
            {**json.loads(ECAlgorithm.to_jwk(self.ec.public_key())), "kid": "ec", "alg": "ES256", "use": "sig"},
        ]
        self.hits = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                issuer.hits += 1
                if self.path == "/jwks":
                    body = {"keys": public}
                else:
                    body = {"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks"}
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def token(self, alg: str, sub: str = "bench-agent") -> str:
        now = int(time.time())
        claims = {"iss": self.url, "sub": sub, "aud": RESOURCE, "iat": now, "exp": now + 3600, "scope": "upload read"}
        key, kid = (self.rsa, "rsa") if alg == "RS256" else (self.ec, "ec")
        return jwt.encode(claims, key, algorithm=alg, headers={"kid": kid, "typ": "at+jwt"})

    def close(self) -> None:
        self.server.shutdown()


def in_process(issuer: StaticIssuer, iterations: int) -> dict[str, Any]:
    """µs per ``Identities.grant`` for each credential, with the issuer's hits after the warm-up."""
    from transfer.service.accounting.recordstore import RecordStore
    from transfer.service.backends import make_storage
    from transfer.service.identity.directory import Identities
    from transfer.settings import Settings

    admin = new_token()

    async def run(cache: float, data: Path) -> dict[str, float]:
        settings = Settings(
            data_dir=data,
            api_keys={"admin": {"sha256": token_hash(admin), "scopes": ["admin"]}},
            oauth_issuers=[{"issuer": issuer.url}],
            oauth_resource=RESOURCE,
            oauth_token_cache_seconds=cache,
        )
        storage = make_storage(settings)
        await storage.start()
        identities = Identities(settings, RecordStore(storage))
        made = await identities.keys.create("bench-record", {"scopes": ["upload", "read"]}, created_by="admin")
        tokens = {
            "env key": admin,
            "key record": made.token,
            "JWT RS256": issuer.token("RS256"),
            "JWT ES256": issuer.token("ES256"),
        }
        for token in tokens.values():  # warm-up: the JWKS fetched, the record read
            await identities.grant(f"Bearer {token}")
        hits = issuer.hits
        out: dict[str, float] = {}
        for name, token in tokens.items():
            header = f"Bearer {token}"
            start = time.perf_counter()
            for _ in range(iterations):
                await identities.grant(header)
            out[name] = round((time.perf_counter() - start) / iterations * 1e6, 1)
        out["issuer requests after warm-up"] = issuer.hits - hits
        await identities.close()
        await storage.close()
        return out

    with tempfile.TemporaryDirectory() as tmp:
        return {
            "token cache on": asyncio.run(run(60.0, Path(tmp) / "a")),
            "token cache off": asyncio.run(run(0.0, Path(tmp) / "b")),
        }


def _load(url: str, token: str, requests: int, concurrency: int) -> dict[str, float]:
    import subprocess

    script = LOAD_SCRIPT.replace(
        "Host: {u.netloc}\\r\\n", "Host: {u.netloc}\\r\\nAuthorization: Bearer {sys.argv[4]}\\r\\n"
    )
    assert script != LOAD_SCRIPT
    out = subprocess.run(
        [*pin(1), sys.executable, "-c", script, url, str(requests), str(concurrency), token],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return {k: round(v, 1) for k, v in json.loads(out.stdout).items()}


@contextmanager
def serving(issuer: StaticIssuer, workdir: Path, cache: float, admin: str) -> Iterator[tuple[str, int]]:
    env = {
        **os.environ,
        "TRANSFER_API_KEYS": json.dumps({"admin": {"sha256": token_hash(admin), "scopes": ["admin"]}}),
        "TRANSFER_OAUTH_ISSUERS": json.dumps([{"issuer": issuer.url}]),
        "TRANSFER_OAUTH_RESOURCE": RESOURCE,
        "TRANSFER_OAUTH_TOKEN_CACHE_SECONDS": str(cache),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    with service(workdir, workdir / "data", env) as running:
        yield running


def end_to_end(issuer: StaticIssuer, requests: int, concurrency: int, rounds: int, workdir: Path) -> dict[str, Any]:
    """Small-object uploads with each credential, in turn, ``rounds`` times: medians of req/s and CPU ms/request."""
    admin = new_token()
    results: dict[str, list[dict[str, float]]] = {}
    hits: dict[str, int] = {}
    for cache in (60.0, 0.0):
        label = "cache on" if cache else "cache off"
        with serving(issuer, workdir / label.replace(" ", "-"), cache, admin) as (url, pid):
            made = httpx.post(
                f"{url}/v1/admin/keys",
                json={"name": "bench-record", "scopes": ["upload", "read"]},
                headers={"authorization": f"Bearer {admin}"},
                timeout=30,
            ).json()
            tokens = {"JWT RS256": issuer.token("RS256"), "JWT ES256": issuer.token("ES256")}
            if cache:
                tokens = {"env key": admin, "key record": made["key"], **tokens}
            for token in tokens.values():
                _load(f"{url}/v1/files", token, min(200, requests), concurrency)  # warm-up
            before_hits = issuer.hits
            for _ in range(rounds):
                for name, token in tokens.items():
                    before = _cpu_seconds(pid)
                    row = _load(f"{url}/v1/files", token, requests, concurrency)
                    row["cpu_ms_per_request"] = round((_cpu_seconds(pid) - before) * 1000 / requests, 3)
                    results.setdefault(f"{name} ({label})" if name.startswith("JWT") else name, []).append(row)
            hits[label] = issuer.hits - before_hits
    out: dict[str, Any] = {"requests": requests, "concurrency": concurrency, "rounds": rounds, "issuer_hits": hits}
    for name, rows in results.items():
        out[name] = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    return out


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()
    issuer = StaticIssuer()
    try:
        micro = in_process(issuer, args.iterations)
        with tempfile.TemporaryDirectory() as tmp:
            e2e = end_to_end(issuer, args.requests, args.concurrency, args.rounds, Path(tmp))
    finally:
        issuer.close()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores)")
    print("\nIdentities.grant per call (µs, in process):")
    print("| credential | token cache on | token cache off |\n|---|---|---|")
    on, off = micro["token cache on"], micro["token cache off"]
    for name in on:
        print(f"| {name} | {on[name]} | {off[name]} |")
    print(
        f"\nSmall objects ({e2e['requests']} uploads of 4 KiB, {e2e['concurrency']} concurrent, median of "
        f"{e2e['rounds']} rounds), issuer requests during the load: {e2e['issuer_hits']}"
    )
    print("| credential | req/s | p50 ms | p99 ms | server CPU ms/request |\n|---|---|---|---|---|")
    for name, row in e2e.items():
        if isinstance(row, dict) and "rps" in row:
            print(f"| {name} | {row['rps']:.0f} | {row['p50_ms']} | {row['p99_ms']} | {row['cpu_ms_per_request']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
