"""API keys and scopes. Pure: no I/O.

A key is a random bearer token (``tk_`` + 43 base64url characters, 256 bits). The service keeps only its SHA-256
(the token has full entropy, so a plain hash is enough; no password stretching is needed), with a name and scopes:

    upload   create files, sessions, tus uploads and bundles
    read     list files, fresh descriptors, session status, bundles
    admin    delete files; implies upload and read

Signed URLs carry their own authorisation (one object, one method, until expiry) and need no key.
With no keys configured the service runs open (development), and says so at start-up.

A caller is an :class:`ApiKey`, whichever way it proved who it is: a key of ``TRANSFER_API_KEYS``, a run-time key
record (``transfer keys create``) or an OAuth access token (its subject is the name): the name owns what the caller
creates, and the limits travel with it. How each is looked up is :mod:`transfer.service.identity`.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from transfer.errors import InsufficientScope, Unauthenticated, UploadForbidden

TOKEN_PREFIX = "tk_"


class Scope(enum.StrEnum):
    """What an API key may do: upload, read, or administer (every key's resources)."""

    UPLOAD = "upload"
    READ = "read"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured API key: its name, the SHA-256 of its token (the token itself is never kept), scopes, and per-
    key limits."""

    name: str
    sha256: str  # hex of the token's SHA-256
    scopes: frozenset[Scope]
    tp_identities: frozenset[str] = frozenset()  # TP receivers whose mailbox this key may read
    max_bytes: int | None = None  # byte quota: original bytes of the files it stores (None: no quota)
    default_file_ttl: int | None = None  # seconds its files live when an upload asks for no lifetime
    max_file_ttl: int | None = None  # the longest lifetime an upload may ask for (None: the service's maximum)
    via: str = "key"  # how the caller proved it: "key" (TRANSFER_API_KEYS), "record" (a key record), "token" (OAuth)
    expires_at: float | None = None  # Unix seconds past which it is refused (a key record's or a token's expiry)
    scope_names: tuple[tuple[str, str], ...] = ()  # a token's: service scope -> the token scope that grants it

    def allows(self, scope: Scope) -> bool:
        """Whether the key holds ``scope`` (admin holds every scope)."""
        return scope in self.scopes or Scope.ADMIN in self.scopes

    def may_receive_as(self, identity: str) -> bool:
        """Whether the key may receive TP messages addressed to ``identity``."""
        return Scope.ADMIN in self.scopes or identity in self.tp_identities

    def scope_name(self, scope: Scope) -> str:
        """What the caller must hold to get ``scope``: the service's name, or for a token its issuer's."""
        return dict(self.scope_names).get(scope.value, scope.value)


def new_token() -> str:
    """A new random API key token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """The hash a token is known by (tokens themselves are never stored)."""
    return hashlib.sha256(token.encode()).hexdigest()


class Authenticator:
    """Maps ``Authorization: Bearer <token>`` to a key and checks its scope."""

    def __init__(self, keys: Mapping[str, ApiKey]) -> None:
        self._by_hash = {key.sha256: key for key in keys.values()}

    @property
    def enabled(self) -> bool:
        """Whether any key is configured (without keys every caller is trusted)."""
        return bool(self._by_hash)

    def authenticate(self, authorization: str | None) -> ApiKey | None:
        """The key of a request (None when authentication is disabled); Unauthenticated otherwise."""
        if not self.enabled:
            return None
        challenge = {"www-authenticate": 'Bearer realm="transfer"'}
        if not authorization:
            raise Unauthenticated("this endpoint needs an API key: Authorization: Bearer <key>", headers=challenge)
        kind, _, token = authorization.strip().partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise Unauthenticated("use Authorization: Bearer <key>", headers=challenge)
        digest = token_hash(token.strip())
        for known, key in self._by_hash.items():
            if hmac.compare_digest(known, digest):
                return key
        raise Unauthenticated(
            "unknown or revoked API key",
            headers={**challenge, "www-authenticate": 'Bearer realm="transfer", error="invalid_token"'},
        )

    def require(self, authorization: str | None, scope: Scope) -> ApiKey | None:
        """Authenticate and check ``scope`` (InsufficientScope: 403)."""
        key = self.authenticate(authorization)
        check_scope(key, scope)
        return key

    def authorizer(self, authorization: str | None) -> Grant:
        """Authenticate now; the returned grant checks a scope later (when the operation, hence the scope it
        needs, is known only after parsing a message)."""
        return Grant(self.authenticate(authorization))


@dataclass(frozen=True, slots=True)
class Grant:
    """What an authenticated caller may do: call it with a scope to check it (InsufficientScope otherwise)."""

    key: ApiKey | None  # None: keys are not configured (or a local caller, e.g. MCP over stdio)
    resource_metadata: str | None = None  # RFC 9728 §5.1: where a refused client learns how to get a token

    def __call__(self, scope: Scope) -> None:
        check_scope(self.key, scope, self.resource_metadata)

    def may_receive_as(self, identity: str) -> bool:
        """Whether the caller may receive TP messages addressed to ``identity``."""
        return self.key is None or self.key.may_receive_as(identity)

    def require_identity(self, identity: str, *, speaking: bool = False) -> None:
        """Reading TP messages addressed to ``identity`` (a receiver), or sending as it (``speaking``: a sender),
        both as its canonical text: the key must list it in its ``tp_identities`` (admin: any)."""
        if not self.may_receive_as(identity):
            assert self.key is not None
            act = "send messages as" if speaking else "read messages for"
            raise UploadForbidden(
                f"the key {self.key.name!r} may not {act} {identity[:80]!r} (its tp_identities)",
                identity=identity[:200],
            )

    @property
    def owner(self) -> str | None:
        """The key's name: what the caller creates belongs to it, and open sessions are counted against it."""
        return None if self.key is None else self.key.name

    @property
    def is_admin(self) -> bool:
        """Whether the caller sees every owner's resources."""
        return self.key is None or Scope.ADMIN in self.key.scopes

    def sees(self, owner: str | None) -> bool:
        """Whether the caller may see and act on a resource created by ``owner`` (a key name; None: made in open
        mode). Its own resources, all of them for admin keys and for callers without keys (open mode, local
        callers such as MCP over stdio)."""
        return self.is_admin or (self.key is not None and owner == self.key.name)


# A caller inside the service itself (sweeps, followers) or holding a signed URL: ownership was settled elsewhere.
TRUSTED = Grant(None)


def check_scope(key: ApiKey | None, scope: Scope, resource_metadata: str | None = None) -> None:
    """Raise InsufficientScope unless ``key`` (None: no keys configured) holds ``scope``, with the challenge of
    RFC 6750 §3.1 naming the scope to ask for (a token's issuer's name for it: the MCP step-up flow)."""
    if key is not None and not key.allows(scope):
        name = key.scope_name(scope)
        params = 'Bearer realm="transfer", error="insufficient_scope", scope="' + name.replace('"', "") + '"'
        if resource_metadata:
            params += f', resource_metadata="{resource_metadata}"'
        caller = "the token of" if key.via == "token" else "the key"
        raise InsufficientScope(
            f"{caller} {key.name!r} lacks the {name!r} scope",
            needed=scope.value,
            headers={"www-authenticate": params},
        )


def _limit(name: str, spec: Mapping[str, object], field: str) -> int | None:
    """An optional positive whole number of a key's configuration (bytes or seconds)."""
    value = spec.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"API key {name!r}: {field} must be a positive whole number")
    return value


def parse_keys(config: Mapping[str, Mapping[str, object]]) -> dict[str, ApiKey]:
    """``{"name": {"sha256": "<hex>", "scopes": ["upload", "read"]}}`` from settings, with optional
    ``max_bytes`` (byte quota), ``default_file_ttl`` and ``max_file_ttl`` (seconds); ValueError when malformed."""
    keys = {}
    for name, spec in config.items():
        digest = str(spec.get("sha256", "")).lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"API key {name!r}: sha256 must be 64 hex digits")
        raw_scopes = spec.get("scopes", [])
        if not isinstance(raw_scopes, list | tuple) or not raw_scopes:
            raise ValueError(f"API key {name!r}: scopes must be a non-empty list")
        try:
            scopes = frozenset(Scope(str(s)) for s in raw_scopes)
        except ValueError as exc:
            raise ValueError(f"API key {name!r}: scopes are upload, read and admin") from exc
        identities = spec.get("tp_identities", [])
        if not isinstance(identities, list | tuple) or not all(isinstance(i, str) and i for i in identities):
            raise ValueError(f"API key {name!r}: tp_identities must be a list of TP identities (strings)")
        max_bytes = _limit(name, spec, "max_bytes")
        default_ttl = _limit(name, spec, "default_file_ttl")
        max_ttl = _limit(name, spec, "max_file_ttl")
        if default_ttl is not None and max_ttl is not None and default_ttl > max_ttl:
            raise ValueError(f"API key {name!r}: default_file_ttl is longer than its max_file_ttl")
        keys[name] = ApiKey(name, digest, scopes, frozenset(identities), max_bytes, default_ttl, max_ttl)
    return keys
