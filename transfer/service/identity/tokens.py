"""OAuth 2.1 access tokens as callers: JWT access tokens (RFC 9068) checked against the issuer's keys, opaque
tokens through introspection (RFC 7662), each mapped to an :class:`~transfer.core.auth.ApiKey` whose name is the
token's owner (its ``sub``, or the configured claim, after the issuer's prefix).

The cryptography is PyJWT's (with ``cryptography``): a maintained, typed library already in the service's
dependency tree (the MCP SDK needs it), which binds a JWK to one algorithm and verifies with that algorithm only,
whatever the token's header says. On top of it this module checks, in this order (each failure its own code):

    the token's shape (JWS compact)                             token_malformed
    iss is a trusted issuer                                     token_issuer_unknown
    alg is on that issuer's allow-list (never none, never HS*)  token_algorithm_refused
    typ is at+jwt (RFC 9068 §4; per issuer: require_typ)        token_type_refused
    a key of the issuer's JWKS fits kid and alg                 token_key_unknown
    the signature                                               token_signature_invalid
    exp, nbf, iat (with TRANSFER_OAUTH_LEEWAY seconds of skew)  token_expired, token_not_yet_valid
    aud names this service (RFC 8707; RFC 9068 §4)              token_audience_mismatch
    the owner claim is there                                    token_malformed

A token that passed is remembered by its SHA-256 (never the token itself) for ``TRANSFER_OAUTH_TOKEN_CACHE_SECONDS``
and never past its ``exp``: a repeated request costs a dictionary lookup, not a signature check. Introspection
answers are remembered the same way (an inactive one for at most 5 seconds), and at most ``INTROSPECTIONS``
calls are in flight at once: what a client without a valid token can make the service do is one introspection call
per distinct token, bounded in concurrency.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import jwt
from jwt.exceptions import (
    DecodeError,
    ExpiredSignatureError,
    ImmatureSignatureError,
    InvalidAlgorithmError,
    InvalidIssuedAtError,
    InvalidIssuerError,
    InvalidSignatureError,
    InvalidTokenError,
    MissingRequiredClaimError,
)

from transfer.core.auth import ApiKey
from transfer.core.oauth import AT_JWT_TYPES, IssuerPolicy, audience_matches, looks_like_jwt
from transfer.errors import (
    InvalidToken,
    TokenAlgorithmRefused,
    TokenAudienceMismatch,
    TokenExpired,
    TokenInactive,
    TokenIssuerUnknown,
    TokenKeyUnknown,
    TokenMalformed,
    TokenNotYetValid,
    TokenSignatureInvalid,
    TokenTypeRefused,
)
from transfer.service.identity.issuers import IssuerClient

CACHE_ENTRIES = 10_000  # tokens remembered per process (each entry ~0.5 KB)
INACTIVE_CACHE = 5.0  # seconds an introspection's "inactive" is remembered
INTROSPECTIONS = 16  # introspection calls in flight at once, per process
MAX_OWNER = 200  # characters of an owner claim


class TokenVerifier:
    """Checks access tokens of the trusted issuers for the accepted audiences."""

    def __init__(
        self,
        issuers: Sequence[IssuerPolicy],
        audiences: Sequence[str],
        *,
        leeway: int,
        cache_seconds: float,
        jwks_max_age: float,
        jwks_min_interval: float,
        timeout: float,
        reserved: Callable[[str], bool] = lambda owner: False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.http = httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False)
        self.issuers = {
            p.issuer: IssuerClient(p, self.http, max_age=jwks_max_age, min_interval=jwks_min_interval) for p in issuers
        }
        self.audiences = tuple(audiences)
        self.leeway = leeway
        self.cache_seconds = cache_seconds
        self.reserved = reserved  # owners a token may not take (the names of TRANSFER_API_KEYS)
        self.clock = clock
        self._verified: OrderedDict[str, tuple[float, ApiKey | InvalidToken]] = OrderedDict()
        self._introspecting = asyncio.Semaphore(INTROSPECTIONS)

    async def close(self) -> None:
        """Close the HTTP client the issuers are asked through."""
        await self.http.aclose()

    async def warm(self) -> None:
        """Fetch every issuer's metadata and keys now (at start-up), so that the first token waits for nothing;
        an issuer that cannot be reached now is tried again on its first token."""
        for client in self.issuers.values():
            try:
                await client.keys_for(None, client.policy.algorithms[0])
            except Exception:  # noqa: BLE001 - start-up goes on; the first token that needs it retries and reports
                continue

    def policy_for_owner(self, owner: str) -> IssuerPolicy | None:
        """The issuer whose subjects ``owner`` belongs to, by the longest owner prefix (for its limits)."""
        best: IssuerPolicy | None = None
        for client in self.issuers.values():
            p = client.policy
            if owner.startswith(p.owner_prefix) and (best is None or len(p.owner_prefix) > len(best.owner_prefix)):
                best = p
        return best

    # -- the request path --------------------------------------------------------------------------------------

    async def verify(self, token: str) -> ApiKey:
        """The caller a token stands for; an InvalidToken subclass (401) saying why not, or IssuerUnavailable (503)
        when its issuer cannot be asked."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        cached = self._verified.get(digest)
        if cached is not None:
            until, outcome = cached
            if time.monotonic() < until:
                if isinstance(outcome, InvalidToken):
                    raise outcome
                if outcome.expires_at is None or self.clock() < outcome.expires_at + self.leeway:
                    return outcome
            self._verified.pop(digest, None)
        if looks_like_jwt(token):
            key = await self._verify_jwt(token)
            self._remember(digest, key, self.cache_seconds)
            return key
        return await self._introspect(token, digest)

    def _remember(self, digest: str, outcome: ApiKey | InvalidToken, seconds: float) -> None:
        if seconds <= 0:
            return
        until = time.monotonic() + seconds
        if isinstance(outcome, ApiKey) and outcome.expires_at is not None:
            until = min(until, time.monotonic() + max(0.0, outcome.expires_at + self.leeway - self.clock()))
        self._verified[digest] = (until, outcome)
        self._verified.move_to_end(digest)
        while len(self._verified) > CACHE_ENTRIES:
            self._verified.popitem(last=False)

    async def _verify_jwt(self, token: str) -> ApiKey:
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except (DecodeError, ValueError) as exc:
            raise TokenMalformed(f"not a JWT: {exc}") from None
        client = self.issuers.get(str(unverified.get("iss")))
        if client is None:
            raise TokenIssuerUnknown(f"tokens of issuer {str(unverified.get('iss'))[:200]!r} are not accepted here")
        policy = client.policy
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in policy.algorithms:
            raise TokenAlgorithmRefused(
                f"alg {str(alg)[:20]!r} is refused: {policy.issuer} tokens must be signed with one of "
                f"{', '.join(policy.algorithms)}"
            )
        typ = header.get("typ")
        if policy.require_typ and (not isinstance(typ, str) or typ.lower() not in AT_JWT_TYPES):
            raise TokenTypeRefused(
                f"typ {str(typ)[:40]!r} is not at+jwt (RFC 9068 §4); an ID token is no access token. If this issuer "
                'sends other access tokens, set "require_typ": false for it'
            )
        kid = header.get("kid")
        keys = await client.keys_for(kid if isinstance(kid, str) else None, alg)
        if not keys:
            raise TokenKeyUnknown(f"no key of {policy.issuer}'s JWKS has kid {str(kid)[:80]!r} for {alg}")
        claims = self._decode(token, keys, policy)
        if not audience_matches(claims.get("aud"), (*self.audiences, *policy.audiences)):
            raise TokenAudienceMismatch(
                f"the token is for {str(claims.get('aud'))[:200]!r}, not this service ({self.audiences[0]}): ask the "
                "issuer for a token with resource=" + self.audiences[0] + " (RFC 8707)"
            )
        return self._caller(policy, claims)

    def _decode(self, token: str, keys: list[jwt.PyJWK], policy: IssuerPolicy) -> dict[str, Any]:
        """The claims of ``token`` verified with one of ``keys`` (several only when the token names no kid)."""
        failure: InvalidToken = TokenSignatureInvalid("the signature does not verify with the issuer's key")
        for key in keys:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    key,
                    algorithms=[key.algorithm_name],
                    issuer=policy.issuer,
                    leeway=self.leeway,
                    options={"require": ["exp", "iss"], "verify_aud": False},
                )
                return claims
            except InvalidSignatureError:
                continue  # another key of the set may have signed it
            except ExpiredSignatureError:
                raise TokenExpired("the token expired (exp); get a new one from its issuer") from None
            except (ImmatureSignatureError, InvalidIssuedAtError):
                raise TokenNotYetValid("the token is not valid yet (nbf or iat in the future)") from None
            except InvalidAlgorithmError as exc:
                raise TokenAlgorithmRefused(f"algorithm refused: {exc}") from None
            except MissingRequiredClaimError as exc:
                raise TokenMalformed(f"the token lacks a claim: {exc}") from None
            except InvalidIssuerError:
                raise TokenIssuerUnknown("iss does not match the trusted issuer") from None
            except (DecodeError, InvalidTokenError) as exc:
                failure = TokenMalformed(f"the token does not decode: {exc}")
        raise failure

    def _caller(self, policy: IssuerPolicy, claims: dict[str, Any]) -> ApiKey:
        """The caller of verified ``claims``: owner from the owner claim, scopes from the scope claim."""
        if "cnf" in claims:
            # bound to a key the client must prove (DPoP, RFC 9449; mTLS, RFC 8705): accepted as a plain bearer
            # token, the binding would mean nothing, so it is refused
            raise TokenTypeRefused("the token is sender-constrained (cnf): this service accepts bearer tokens only")
        subject = claims.get(policy.owner_claim)
        if subject is None and policy.owner_claim == "sub":
            # a client's own token (client credentials) may carry no sub: its client is its subject (RFC 9068 §2.2)
            subject = claims.get("client_id")
        if not isinstance(subject, str | int) or isinstance(subject, bool) or not str(subject):
            raise TokenMalformed(f"the token has no {policy.owner_claim!r} claim to own what it creates")
        owner = policy.owner_prefix + str(subject)
        if len(owner) > MAX_OWNER or not owner.isprintable():
            raise TokenMalformed(f"the token's {policy.owner_claim!r} is not a usable owner name")
        if self.reserved(owner):
            raise TokenMalformed(
                f"the token's owner {owner!r} is the name of an API key of this service: give the issuer an "
                "owner_prefix"
            )
        exp = claims.get("exp")
        return ApiKey(
            owner,
            "",
            policy.granted(claims.get(policy.scope_claim)),
            max_bytes=policy.max_bytes,
            default_file_ttl=policy.default_file_ttl,
            max_file_ttl=policy.max_file_ttl,
            via="token",
            expires_at=float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None,
            scope_names=tuple((s.value, n) for s, n in policy.scopes.items()),
        )

    async def _introspect(self, token: str, digest: str) -> ApiKey:
        """An opaque token, asked of each issuer that introspects (RFC 7662), in the configured order."""
        introspecting = [c for c in self.issuers.values() if c.policy.introspection is not None]
        if not introspecting:
            raise TokenMalformed("not an API key (tk_...) nor a JWT access token, and no issuer introspects tokens")
        async with self._introspecting:
            for client in introspecting:
                answer = await client.introspect(token)
                if answer.get("active") is not True:
                    continue
                policy = client.policy
                if "iss" in answer and answer["iss"] != policy.issuer:
                    continue
                if not audience_matches(answer.get("aud"), (*self.audiences, *policy.audiences)):
                    refused = TokenAudienceMismatch(
                        f"the token is for {str(answer.get('aud'))[:200]!r}, not this service ({self.audiences[0]})"
                    )
                    self._remember(digest, refused, INACTIVE_CACHE)
                    raise refused
                exp = answer.get("exp")
                if isinstance(exp, int | float) and exp + self.leeway <= self.clock():
                    raise TokenExpired("the token expired (exp)")
                key = self._caller(policy, answer)
                self._remember(digest, key, self.cache_seconds)
                return key
        inactive = TokenInactive("the issuer says the token is not active (expired, revoked, or not its own)")
        self._remember(digest, inactive, min(INACTIVE_CACHE, self.cache_seconds))
        raise inactive
