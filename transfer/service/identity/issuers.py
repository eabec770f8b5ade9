"""What this service fetches from a trusted authorization server: its metadata (RFC 8414, else OpenID Connect
Discovery 1.0), its signing keys (the JWKS of RFC 7517, cached and refreshed on rotation) and, for opaque tokens,
its introspection endpoint (RFC 7662).

Network calls happen off the request path once the keys are cached: a token signed by a known key is checked with
what is in memory. A token naming a key id the cache lacks (the issuer rotated its keys) prompts one fetch of the
JWKS, at most once per ``min_interval`` seconds per issuer (a flood of forged key ids costs one fetch per
interval), shared by every request that waits for it. The keys are fetched again after ``max_age`` seconds.
Answers are bounded in size (``MAX_DOCUMENT`` bytes, ``MAX_KEYS`` keys) and time (``timeout`` per call).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from jwt import PyJWK
from jwt.exceptions import PyJWKError

from transfer.core.oauth import IssuerPolicy, check_url
from transfer.errors import IssuerUnavailable

log = logging.getLogger("transfer.identity")

MAX_DOCUMENT = 512 << 10  # bytes of one metadata, JWKS or introspection answer
MAX_KEYS = 100  # keys of one JWKS kept (the rest are ignored, with a log line)

# RFC 7518 §6: which key types can verify which algorithms (a JWK is used only with an algorithm of its kind)
_KINDS = {
    "RS256": ("RSA", None),
    "RS384": ("RSA", None),
    "RS512": ("RSA", None),
    "PS256": ("RSA", None),
    "PS384": ("RSA", None),
    "PS512": ("RSA", None),
    "ES256": ("EC", "P-256"),
    "ES384": ("EC", "P-384"),
    "ES512": ("EC", "P-521"),
    "EdDSA": ("OKP", None),
}


def discovery_urls(issuer: str) -> list[str]:
    """Where the metadata of ``issuer`` may be: RFC 8414 §3.1 (well-known path inserted before the issuer's path),
    then OpenID Connect Discovery 1.0 §4 (appended to it)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    oauth = urlunsplit((parts.scheme, parts.netloc, "/.well-known/oauth-authorization-server" + path, "", ""))
    oidc = urlunsplit((parts.scheme, parts.netloc, path + "/.well-known/openid-configuration", "", ""))
    return [oauth, oidc]


def fits(jwk: dict[str, Any], alg: str) -> bool:
    """Whether the JWK may verify a signature made with ``alg``: its key type (and curve) is of that algorithm, its
    own ``alg`` (if it names one) is that one, and its ``use`` (if any) is ``sig`` (RFC 7517 §4.2, §4.4)."""
    kind = _KINDS.get(alg)
    if kind is None or jwk.get("kty") != kind[0]:
        return False
    if kind[1] is not None and jwk.get("crv") != kind[1]:
        return False
    if jwk.get("alg") not in (None, alg):
        return False
    return jwk.get("use") in (None, "sig")


class IssuerClient:
    """One trusted issuer's metadata, keys and introspection, fetched with ``http`` and cached."""

    def __init__(
        self,
        policy: IssuerPolicy,
        http: httpx.AsyncClient,
        *,
        max_age: float,
        min_interval: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.http = http
        self.max_age = max_age
        self.min_interval = min_interval
        self.monotonic = monotonic
        self._metadata: dict[str, Any] | None = None
        self._jwks: list[dict[str, Any]] = []
        self._fetched_at: float | None = None  # when the JWKS was last fetched (successfully or not)
        self._loaded_at: float | None = None  # when it was last fetched successfully
        self._prompted_at: float | None = None  # when an unknown key id last made it fetch
        self._lock = asyncio.Lock()
        self._verifiers: dict[tuple[str | None, str, int], PyJWK] = {}
        self.fetches = 0  # JWKS fetches (the tests and the benchmark read it)

    async def _get_json(self, url: str, what: str, method: str = "GET", **request: Any) -> dict[str, Any]:
        """A JSON object from ``url``: IssuerUnavailable when unreachable, not 200, too large or not an object."""
        try:
            async with self.http.stream(method, url, headers={"accept": "application/json"}, **request) as response:
                if response.status_code != 200:
                    raise IssuerUnavailable(f"{what} of {self.policy.issuer} answered HTTP {response.status_code}")
                body = bytearray()
                async for piece in response.aiter_bytes():
                    body += piece
                    if len(body) > MAX_DOCUMENT:
                        raise IssuerUnavailable(f"{what} of {self.policy.issuer} is larger than {MAX_DOCUMENT} bytes")
        except httpx.HTTPError as exc:
            raise IssuerUnavailable(f"{what} of {self.policy.issuer} unreachable: {type(exc).__name__}") from None
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise IssuerUnavailable(f"{what} of {self.policy.issuer} is not a JSON object")
        return doc

    async def metadata(self) -> dict[str, Any]:
        """The issuer's metadata, discovered once (again after a failure). Its ``issuer`` must be the configured one
        exactly (RFC 8414 §3.3; OpenID Discovery §4.3): a document for another issuer is refused."""
        if self._metadata is not None:
            return self._metadata
        urls = [self.policy.metadata_url] if self.policy.metadata_url else discovery_urls(self.policy.issuer)
        problem: IssuerUnavailable | None = None
        for url in urls:
            try:
                doc = await self._get_json(url, "the metadata")
            except IssuerUnavailable as exc:
                problem = exc
                continue
            if doc.get("issuer") != self.policy.issuer:
                raise IssuerUnavailable(
                    f"the metadata at {url} names issuer {str(doc.get('issuer'))[:200]!r}, not {self.policy.issuer!r}"
                )
            self._metadata = doc
            return doc
        assert problem is not None
        raise problem

    async def jwks_uri(self) -> str:
        """Where the issuer's signing keys are: the configured URL, else its metadata's (IssuerUnavailable when
        neither is a usable URL)."""
        if self.policy.jwks_uri:
            return self.policy.jwks_uri
        uri = (await self.metadata()).get("jwks_uri")
        try:
            return check_url(uri, "jwks_uri")
        except ValueError as exc:
            raise IssuerUnavailable(f"{self.policy.issuer}: {exc}") from None

    async def introspection_endpoint(self) -> str:
        """The issuer's token introspection endpoint (RFC 7662) from its metadata (IssuerUnavailable if none)."""
        uri = (await self.metadata()).get("introspection_endpoint")
        try:
            return check_url(uri, "introspection_endpoint")
        except ValueError as exc:
            raise IssuerUnavailable(f"{self.policy.issuer} has no usable introspection endpoint: {exc}") from None

    async def _refresh(self, *, because_unknown: bool) -> None:
        """Fetch the JWKS again unless another caller just did (one fetch for all who wait on the lock)."""
        started = self.monotonic()
        async with self._lock:
            if self._fetched_at is not None and self._fetched_at >= started:
                return  # fetched while this caller waited
            if because_unknown:
                if self._prompted_at is not None and started - self._prompted_at < self.min_interval:
                    return  # unknown key ids make it fetch once per interval at most
                self._prompted_at = started
            self._fetched_at = self.monotonic()
            self.fetches += 1
            doc = await self._get_json(await self.jwks_uri(), "the JWKS")
            keys = doc.get("keys")
            if not isinstance(keys, list):
                raise IssuerUnavailable(f"the JWKS of {self.policy.issuer} has no keys list")
            usable = [k for k in keys if isinstance(k, dict) and k.get("kty") in ("RSA", "EC", "OKP")]
            if len(usable) > MAX_KEYS:
                log.warning("the JWKS of %s has %d keys: %d are used", self.policy.issuer, len(usable), MAX_KEYS)
            self._jwks = usable[:MAX_KEYS]
            self._verifiers.clear()
            self._loaded_at = self._fetched_at

    async def keys_for(self, kid: str | None, alg: str) -> list[PyJWK]:
        """The issuer's keys that may have signed a token with key id ``kid`` (None: every key of the kind) and
        algorithm ``alg``; fetched again when stale or when ``kid`` is unknown (rotation). Empty: no such key."""
        if self._loaded_at is None or self.monotonic() - self._loaded_at >= self.max_age:
            await self._refresh(because_unknown=False)
        found = self._matching(kid, alg)
        if not found and kid is not None:
            await self._refresh(because_unknown=True)
            found = self._matching(kid, alg)
        return found

    def _matching(self, kid: str | None, alg: str) -> list[PyJWK]:
        out = []
        for index, jwk in enumerate(self._jwks):
            if (kid is not None and jwk.get("kid") != kid) or not fits(jwk, alg):
                continue
            cached = self._verifiers.get((kid, alg, index))
            if cached is None:
                try:
                    cached = PyJWK(jwk, algorithm=alg)  # bound to alg: PyJWT verifies with it and nothing else
                except PyJWKError:
                    continue  # a key this install cannot use (or a malformed one): as if absent
                self._verifiers[(kid, alg, index)] = cached
            out.append(cached)
        return out

    async def introspect(self, token: str) -> dict[str, Any]:
        """The issuer's answer about ``token`` (RFC 7662 §2.2), authenticated with this service's client
        credentials (client_secret_basic, RFC 6749 §2.3.1)."""
        intro = self.policy.introspection
        assert intro is not None
        return await self._get_json(
            await self.introspection_endpoint(),
            "the introspection endpoint",
            "POST",
            data={"token": token, "token_type_hint": "access_token"},
            auth=(intro.client_id, intro.client_secret),
        )
