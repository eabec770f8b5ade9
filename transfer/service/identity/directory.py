"""Who is calling, and what limits apply to an owner: the one interface every front door and the accounting use.

A request's ``Authorization: Bearer <token>`` is, in this order (RFC 6750 §2.1):

    tk_...        an API key: of TRANSFER_API_KEYS (read-only, in memory), else a key record (run-time keys,
                  :mod:`~transfer.service.identity.keyrecords`, cached for TRANSFER_KEY_CACHE_SECONDS)
    a JWT         an access token of a trusted issuer (:mod:`~transfer.service.identity.tokens`)
    anything else an opaque access token, introspected at the issuers that allow it

The answer is a :class:`~transfer.core.auth.Grant`; a refusal is a 401 whose ``WWW-Authenticate`` says how to get
in: with trusted issuers, ``Bearer resource_metadata="<this service>/.well-known/oauth-protected-resource"``
(RFC 9728 §5.1, what MCP clients follow), ``error="invalid_token"`` when a token was presented (RFC 6750 §3.1).

Owners' limits (byte quota, file lifetimes) are read through :meth:`Identities.limits`, whichever kind of identity
owns the files: the keys of the environment, key records, or a token issuer's settings for its subjects.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from transfer.core.auth import TOKEN_PREFIX, ApiKey, Grant, Scope, parse_keys, token_hash
from transfer.core.oauth import bearer_challenge, normalize_resource, parse_issuers
from transfer.errors import KeyRecordsRefused, NotFound, Unauthenticated
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.identity.keyrecords import KeyRecords
from transfer.service.identity.tokens import TokenVerifier
from transfer.settings import Settings

OPEN = Grant(None)
WELL_KNOWN = "/.well-known/oauth-protected-resource"  # RFC 9728 §3
MCP_PATH = "/mcp"


def metadata_url(resource: str) -> str:
    """Where the metadata of ``resource`` is (RFC 9728 §3.1: the well-known path goes between host and path)."""
    parts = urlsplit(resource)
    return urlunsplit((parts.scheme, parts.netloc, WELL_KNOWN + parts.path.rstrip("/"), parts.query, ""))


class Identities:
    """The callers of one service: API keys (environment and records) and OAuth access tokens."""

    def __init__(self, settings: Settings, records: RecordStore, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.env = parse_keys(settings.api_keys or {})
        self._env_by_hash = {key.sha256: key for key in self.env.values()}
        self.keys = KeyRecords(records, ttl=settings.key_cache_seconds, reserved=self.env.__contains__, clock=clock)
        issuers = parse_issuers(settings.oauth_issuers or [])
        self.issuers = issuers
        self.resource: str | None = None
        self.tokens: TokenVerifier | None = None
        if issuers:
            resource = settings.oauth_resource or settings.public_url
            assert resource is not None  # the settings refuse issuers without one
            self.resource = normalize_resource(resource)
            self.tokens = TokenVerifier(
                issuers,
                [self.resource, self.resource + MCP_PATH],  # both identifiers this service publishes metadata for
                leeway=settings.oauth_leeway,
                cache_seconds=settings.oauth_token_cache_seconds,
                jwks_max_age=settings.oauth_jwks_max_age,
                jwks_min_interval=settings.oauth_jwks_min_interval,
                timeout=settings.oauth_http_timeout,
                reserved=self.env.__contains__,
                clock=clock,
            )
        self.resource_metadata = None if self.resource is None else metadata_url(self.resource)
        self._warming: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        """Whether callers must prove who they are (keys configured, or trusted issuers); else the service runs
        open: every caller is admin (development), and key records are not consulted."""
        return bool(self.env) or self.tokens is not None

    async def start(self) -> None:
        """Fetch the issuers' metadata and keys in the background from now, so the first token waits for no
        network (start-up does not wait for an issuer)."""
        if self.tokens is not None:
            self._warming = asyncio.create_task(self.tokens.warm(), name="identity: issuers' keys")

    async def close(self) -> None:
        """Stop fetching issuers' keys and close the connections to the issuers."""
        if self._warming is not None:
            self._warming.cancel()
            await asyncio.gather(self._warming, return_exceptions=True)
        if self.tokens is not None:
            await self.tokens.close()

    # -- the request path ----------------------------------------------------------------------------------------

    def challenge(self, error: str | None = None, description: str | None = None) -> str:
        """The ``WWW-Authenticate`` value of a 401 (RFC 6750 §3; RFC 9728 §5.1 with trusted issuers)."""
        return bearer_challenge(
            {
                "realm": "transfer",
                "resource_metadata": self.resource_metadata,
                "error": error,
                "error_description": description,
            }
        )

    async def grant(self, authorization: str | None) -> Grant:
        """What the caller of a request with this ``Authorization`` header may do; Unauthenticated (401, or a
        subclass saying why) with the challenge that tells a client how to get in. Open mode: every caller."""
        if not self.enabled:
            return OPEN
        if not authorization:
            raise Unauthenticated(
                "this endpoint needs an API key or an access token: Authorization: Bearer <token>",
                headers={"www-authenticate": self.challenge()},
            )
        kind, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if kind.lower() != "bearer" or not token:
            raise Unauthenticated(
                "use Authorization: Bearer <token>", headers={"www-authenticate": self.challenge("invalid_request")}
            )
        try:
            key = await self._caller(token)
        except Unauthenticated as exc:
            exc.headers = {**exc.headers, "www-authenticate": self.challenge("invalid_token", exc.code)}
            raise
        return Grant(key, self.resource_metadata)

    async def _caller(self, token: str) -> ApiKey:
        digest = token_hash(token)
        key = self._env_by_hash.get(digest)  # the environment's keys may be any secret, not only tk_...
        if key is not None:
            return key
        if token.startswith(TOKEN_PREFIX):  # what `transfer keys create` makes (never a JWT, never opaque OAuth)
            key = await self.keys.lookup(digest)
            if key is None:
                raise Unauthenticated("unknown or revoked API key")
            return key
        if self.tokens is None:
            raise Unauthenticated("unknown or revoked API key")
        return await self.tokens.verify(token)

    # -- owners ----------------------------------------------------------------------------------------------------

    async def limits(self, owner: str | None) -> ApiKey | None:
        """The limits of ``owner`` (max_bytes, default and max file lifetime): its environment key's, its key
        record's, or for a token subject its issuer's; None when nothing limits it (open mode, unknown owner)."""
        if owner is None:
            return None
        key = self.env.get(owner)
        if key is not None:
            return key
        if self.enabled:
            key = await self.keys.owner(owner)
            if key is not None:
                return key
        if self.tokens is not None:
            policy = self.tokens.policy_for_owner(owner)
            if policy is not None:
                return ApiKey(
                    owner,
                    "",
                    frozenset(),
                    max_bytes=policy.max_bytes,
                    default_file_ttl=policy.default_file_ttl,
                    max_file_ttl=policy.max_file_ttl,
                    via="token",
                )
        return None

    def known_owners(self) -> list[str]:
        """The owners named in the configuration (the environment's keys): what a usage report lists by default."""
        return sorted(self.env)

    # -- administration ----------------------------------------------------------------------------------------

    def require_closed(self) -> None:
        """Key records count only where callers must authenticate: refuse to make them on an open service."""
        if not self.enabled:
            raise KeyRecordsRefused(
                "this service runs open (no TRANSFER_API_KEYS, no trusted issuer): a key made now would change "
                "nothing. Start it with a bootstrap admin key in TRANSFER_API_KEYS"
            )

    def protected_resource(self, suffix: str) -> dict[str, Any]:
        """The Protected Resource Metadata (RFC 9728 §2) for the resource identifier ``suffix`` names: the
        service's own ("") or its MCP endpoint's ("/mcp"); NotFound for any other (or without issuers)."""
        if self.resource is None or suffix.rstrip("/") not in ("", MCP_PATH):
            raise NotFound("no protected resource here")
        scopes = sorted({name for p in self.issuers for name in p.scopes.values()})
        return {
            "resource": self.resource + suffix.rstrip("/"),
            "authorization_servers": [p.issuer for p in self.issuers],
            "scopes_supported": scopes,
            "bearer_methods_supported": ["header"],  # RFC 6750 §2.1 only: never query or body (no token in logs)
            "resource_name": "Agent large-content transfer service",
            "resource_documentation": (self.settings.public_url or self.resource) + "/docs",
        }

    def scope_name(self, scope: Scope) -> str:
        """The token scope that grants ``scope`` at the first issuer (documentation; challenges name the caller's)."""
        return self.issuers[0].scopes[scope] if self.issuers else scope.value
