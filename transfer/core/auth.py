"""API keys and scopes. Pure: no I/O.

A key is a random bearer token (``tk_`` + 43 base64url characters, 256 bits). The service keeps only its SHA-256
(the token has full entropy, so a plain hash is enough; no password stretching is needed), with a name and scopes:

    upload   create files, sessions, tus uploads and bundles
    read     list files, fresh descriptors, session status, bundles
    admin    delete files; implies upload and read

Signed URLs carry their own authorisation (one object, one method, until expiry) and need no key.
With no keys configured the service runs open (development), and says so at start-up.
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
    UPLOAD = "upload"
    READ = "read"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    sha256: str  # hex of the token's SHA-256
    scopes: frozenset[Scope]
    tp_identities: frozenset[str] = frozenset()  # TP receivers whose mailbox this key may read

    def allows(self, scope: Scope) -> bool:
        return scope in self.scopes or Scope.ADMIN in self.scopes

    def may_receive_as(self, identity: str) -> bool:
        return Scope.ADMIN in self.scopes or identity in self.tp_identities


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Authenticator:
    """Maps ``Authorization: Bearer <token>`` to a key and checks its scope."""

    def __init__(self, keys: Mapping[str, ApiKey]) -> None:
        self._by_hash = {key.sha256: key for key in keys.values()}

    @property
    def enabled(self) -> bool:
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

    def __call__(self, scope: Scope) -> None:
        check_scope(self.key, scope)

    def may_receive_as(self, identity: str) -> bool:
        return self.key is None or self.key.may_receive_as(identity)

    def require_identity(self, identity: str) -> None:
        """Reading TP messages addressed to ``identity`` (a receiver, as its canonical text)."""
        if not self.may_receive_as(identity):
            assert self.key is not None
            raise UploadForbidden(
                f"the key {self.key.name!r} may not read messages for {identity[:80]!r} (its tp_identities)",
                identity=identity[:200],
            )

    @property
    def owner(self) -> str | None:
        """The key's name: what open sessions are counted against."""
        return None if self.key is None else self.key.name


def check_scope(key: ApiKey | None, scope: Scope) -> None:
    if key is not None and not key.allows(scope):
        raise InsufficientScope(f"the key {key.name!r} lacks the {scope.value!r} scope", needed=scope.value)


def parse_keys(config: Mapping[str, Mapping[str, object]]) -> dict[str, ApiKey]:
    """``{"name": {"sha256": "<hex>", "scopes": ["upload", "read"]}}`` from settings; ValueError when malformed."""
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
        keys[name] = ApiKey(name, digest, scopes, frozenset(identities))
    return keys
