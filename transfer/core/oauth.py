"""OAuth 2.1 resource-server rules that need no I/O: trusted-issuer configuration, audience matching (RFC 8707),
scope mapping, and the ``WWW-Authenticate: Bearer`` challenge (RFC 6750 §3, RFC 9728 §5.1).

An issuer entry of ``TRANSFER_OAUTH_ISSUERS`` (a JSON list of objects)::

    {"issuer": "https://id.example.com/realms/agents",   # exactly the issuer's "iss" (RFC 8414 §3.3)
     "scopes": {"upload": "transfer:upload", "read": "transfer:read", "admin": "transfer:admin"},
     "scope_claim": "scope",          # "scp" for Entra ID; a space-separated string or a list
     "owner_claim": "sub",            # the claim whose value owns what the token creates (e.g. a tenant id)
     "owner_prefix": "",              # put before it, to keep one issuer's subjects apart from key names
     "algorithms": ["RS256", "ES256"],   # allow-list; never none, never HS*
     "require_typ": true,             # RFC 9068 §4: typ must be at+jwt (Keycloak and Entra ID send "JWT")
     "audiences": [],                 # more accepted audiences beside the service's resource identifier
     "introspection": {"client_id": "...", "client_secret": "..."},   # opaque tokens (RFC 7662)
     "jwks_uri": null, "metadata_url": null,   # default: from the issuer's discovery document
     "max_bytes": null, "default_file_ttl": null, "max_file_ttl": null}   # limits of each subject

Everything but ``issuer`` has the default shown (``scopes``: the service's own names, ``upload``/``read``/``admin``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from transfer.core.auth import Scope

# asymmetric JWS algorithms (RFC 7518 §3.1, RFC 8037): what an issuer's public JWKS can verify. HS* would verify with a
# shared secret, and a public key used as one is the classic confusion attack; "none" is no signature at all.
ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
DEFAULT_ALGORITHMS = ASYMMETRIC_ALGORITHMS
AT_JWT_TYPES = ("at+jwt", "application/at+jwt")  # RFC 9068 §4: the typ of a JWT access token (case-insensitive)


@dataclass(frozen=True, slots=True)
class Introspection:
    """Client credentials this service presents to an issuer's introspection endpoint (RFC 7662 §2.1)."""

    client_id: str
    client_secret: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class IssuerPolicy:
    """One trusted authorization server and how its tokens map to callers of this service."""

    issuer: str
    scopes: Mapping[Scope, str]  # service scope -> the token scope that grants it
    scope_claim: str = "scope"
    owner_claim: str = "sub"
    owner_prefix: str = ""
    algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS
    require_typ: bool = True
    audiences: tuple[str, ...] = ()
    introspection: Introspection | None = None
    jwks_uri: str | None = None
    metadata_url: str | None = None
    max_bytes: int | None = None
    default_file_ttl: int | None = None
    max_file_ttl: int | None = None

    def granted(self, claim: object) -> frozenset[Scope]:
        """The service scopes a token's scope claim grants (a space-separated string, RFC 8693 §4.2, or a list)."""
        if isinstance(claim, str):
            held = set(claim.split())
        elif isinstance(claim, list | tuple):
            held = {s for s in claim if isinstance(s, str)}
        else:
            return frozenset()
        return frozenset(scope for scope, name in self.scopes.items() if name in held)

    def scope_name(self, scope: Scope) -> str:
        """The token scope a client asks its issuer for to get ``scope``."""
        return self.scopes[scope]


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` names a loopback host (where plain http is allowed: tests, a sidecar issuer)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: object, what: str) -> str:
    """``url`` if it is an absolute https URL without fragment (http only to a loopback host); ValueError else."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"{what} must be a URL")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.netloc or parts.fragment:
        raise ValueError(f"{what} must be an absolute http(s) URL without a fragment: {url!r}")
    if parts.scheme == "http" and not is_loopback_url(url):
        raise ValueError(f"{what} must use https (plain http only to a loopback address): {url!r}")
    return url


def normalize_resource(uri: str) -> str:
    """A resource identifier as compared: without a trailing slash (``https://h`` and ``https://h/`` name one
    resource; URL libraries add the slash to a pathless URL, RFC 3986 §6.2.3)."""
    return uri.rstrip("/")


def audience_matches(aud: object, accepted: Iterable[str]) -> bool:
    """Whether a token's ``aud`` (a string or a list, RFC 7519 §4.1.3) names one of the ``accepted`` resources."""
    wanted = {normalize_resource(a) for a in accepted}
    values = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    return any(isinstance(v, str) and normalize_resource(v) in wanted for v in values)


def _positive(entry: Mapping[str, Any], name: str, where: str) -> int | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: {name} must be a positive whole number")
    return value


def _text(entry: Mapping[str, Any], name: str, default: str, where: str) -> str:
    value = entry.get(name, default)
    if not isinstance(value, str) or (not value and name != "owner_prefix"):
        raise ValueError(f"{where}: {name} must be a non-empty string")
    return value


KNOWN_FIELDS = frozenset(
    {
        "issuer",
        "scopes",
        "scope_claim",
        "owner_claim",
        "owner_prefix",
        "algorithms",
        "require_typ",
        "audiences",
        "introspection",
        "jwks_uri",
        "metadata_url",
        "max_bytes",
        "default_file_ttl",
        "max_file_ttl",
    }
)


def parse_issuer(entry: Mapping[str, Any]) -> IssuerPolicy:
    """One issuer entry (see the module docstring); ValueError naming the field when it is malformed."""
    issuer = check_url(entry.get("issuer"), "issuer")
    where = f"issuer {issuer!r}"
    unknown = set(entry) - KNOWN_FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)} (known: {sorted(KNOWN_FIELDS)})")
    raw_scopes = entry.get("scopes", {})
    if not isinstance(raw_scopes, Mapping) or not all(isinstance(v, str) and v for v in raw_scopes.values()):
        raise ValueError(f'{where}: scopes map upload/read/admin to token scopes, e.g. {{"upload": "files:write"}}')
    try:
        scopes = {scope: scope.value for scope in Scope} | {Scope(k): v for k, v in raw_scopes.items()}
    except ValueError as exc:
        raise ValueError(f"{where}: scopes are keyed by upload, read and admin") from exc
    algorithms = entry.get("algorithms", list(DEFAULT_ALGORITHMS))
    if not isinstance(algorithms, list | tuple) or not algorithms:
        raise ValueError(f"{where}: algorithms must be a non-empty list")
    refused = [a for a in algorithms if a not in ASYMMETRIC_ALGORITHMS]
    if refused:
        raise ValueError(
            f"{where}: algorithms {refused} refused: only asymmetric ones ({', '.join(ASYMMETRIC_ALGORITHMS)}); "
            "never none, never HS* (a public key is no shared secret)"
        )
    audiences = entry.get("audiences", [])
    if not isinstance(audiences, list | tuple) or not all(isinstance(a, str) and a for a in audiences):
        raise ValueError(f"{where}: audiences must be a list of URIs")
    require_typ = entry.get("require_typ", True)
    if not isinstance(require_typ, bool):
        raise ValueError(f"{where}: require_typ must be true or false")
    introspection = None
    raw_intro = entry.get("introspection")
    if raw_intro is not None:
        if not isinstance(raw_intro, Mapping) or not all(
            isinstance(raw_intro.get(k), str) and raw_intro.get(k) for k in ("client_id", "client_secret")
        ):
            raise ValueError(f"{where}: introspection needs client_id and client_secret")
        introspection = Introspection(str(raw_intro["client_id"]), str(raw_intro["client_secret"]))
    default_ttl, max_ttl = _positive(entry, "default_file_ttl", where), _positive(entry, "max_file_ttl", where)
    if default_ttl is not None and max_ttl is not None and default_ttl > max_ttl:
        raise ValueError(f"{where}: default_file_ttl is longer than max_file_ttl")
    return IssuerPolicy(
        issuer=issuer,
        scopes=MappingProxyType(scopes),
        scope_claim=_text(entry, "scope_claim", "scope", where),
        owner_claim=_text(entry, "owner_claim", "sub", where),
        owner_prefix=_text(entry, "owner_prefix", "", where),
        algorithms=tuple(algorithms),
        require_typ=require_typ,
        audiences=tuple(audiences),
        introspection=introspection,
        jwks_uri=None if entry.get("jwks_uri") is None else check_url(entry.get("jwks_uri"), f"{where}: jwks_uri"),
        metadata_url=None
        if entry.get("metadata_url") is None
        else check_url(entry.get("metadata_url"), f"{where}: metadata_url"),
        max_bytes=_positive(entry, "max_bytes", where),
        default_file_ttl=default_ttl,
        max_file_ttl=max_ttl,
    )


def parse_issuers(entries: Sequence[Mapping[str, Any]]) -> tuple[IssuerPolicy, ...]:
    """Every issuer of ``TRANSFER_OAUTH_ISSUERS``; ValueError when one is malformed or named twice."""
    policies = tuple(parse_issuer(e) if isinstance(e, Mapping) else _not_object() for e in entries)
    seen = [p.issuer for p in policies]
    if len(set(seen)) != len(seen):
        raise ValueError("an issuer is listed twice")
    return policies


def _not_object() -> IssuerPolicy:
    raise ValueError("each issuer is a JSON object with at least an issuer URL")


def _quoted(value: str) -> str:
    """An RFC 9110 §5.6.4 quoted-string (RFC 6750 §3: auth-param values are quoted)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def bearer_challenge(params: Mapping[str, str | None]) -> str:
    """``Bearer k="v", ...`` (RFC 6750 §3) from the parameters that are set, in their order. Descriptions are
    limited to the characters RFC 6750 §3 allows (%x20-21 / %x23-5B / %x5D-7E): others become ``?``."""
    parts = []
    for key, value in params.items():
        if value is None:
            continue
        if key == "error_description":
            value = "".join(c if 0x20 <= ord(c) <= 0x7E and c not in '"\\' else "?" for c in value)[:200]
        parts.append(f"{key}={_quoted(value)}")
    return "Bearer " + ", ".join(parts)


def looks_like_jwt(token: str) -> bool:
    """Whether ``token`` has the JWS compact shape (three base64url parts, RFC 7515 §7.1; the signature is empty
    in an unsecured JWS, RFC 7519 §6, which is then refused for its alg, not sent elsewhere)."""
    parts = token.split(".")
    return len(parts) == 3 and bool(parts[0]) and bool(parts[1])
