"""Signed download URLs: HMAC-SHA256 over the method, the path and the expiry, with a key id so keys rotate.

A signed URL carries exactly three query parameters, ``exp`` (Unix seconds), ``kid`` and ``sig`` (base64url, no
padding). Anything else in the query, a repeated parameter, a changed path, method, expiry or key id makes the
signature invalid. Comparison is constant-time. The signature is checked before the expiry, so a tampered URL is
reported as ``signature_invalid`` whether or not it has also expired.

HEAD is verified as GET (RFC 9110 §9.3.2: HEAD is GET without content).

The signature covers the path as the client sent it. Servers percent-decode the path before routing, so
``/v1/files/f_%61…`` and ``/v1%2Ffiles/…`` would reach the object a URL signed for ``/v1/files/f_a…`` names; the front
door passes the raw request path to :func:`require_signed_path`, and every variant of a signed path is refused.
"""

from __future__ import annotations

import base64
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass

from transfer.errors import SignatureInvalid, UrlExpired

_PARAMS = ("exp", "kid", "sig")
_SAFE_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_EXP_RE = re.compile(r"^[1-9][0-9]{0,11}$")  # canonical: no sign, no leading zero


def require_signed_path(raw_path: bytes | str | None, signed_paths: tuple[str, ...]) -> None:
    """SignatureInvalid unless the request's path, exactly as sent (``scope["raw_path"]``, still percent-encoded),
    is one of ``signed_paths``. ``None`` (a server that does not report the raw path) checks nothing."""
    if raw_path is None:
        return
    text = raw_path.decode("latin-1") if isinstance(raw_path, bytes) else raw_path
    if text not in signed_paths:
        raise SignatureInvalid(
            "the URL's path is not the path that was signed (an encoded variant is another URL)", reason="path_variant"
        )


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


@dataclass(frozen=True, slots=True)
class SignedQuery:
    """The signature of a signed URL: its expiry, the id of the signing key, and the HMAC."""

    expires: int
    kid: str
    sig: str

    def encode(self) -> str:
        """The query string of the signature (``exp``, ``kid``, ``sig``): as ``urlencode`` would write it, since no
        value has a character it would quote (digits; a key id and base64url, both of ``[A-Za-z0-9._-]``, which
        the signer and the verifier require), without its per-character quoting (most of a signed URL's cost)."""
        return f"exp={self.expires}&kid={self.kid}&sig={self.sig}"


class UrlSigner:
    """Signs and verifies (method, path, expiry) triples with one of several named keys."""

    def __init__(self, keys: Mapping[str, bytes], active_kid: str) -> None:
        if active_kid not in keys:
            raise ValueError(f"active key id {active_kid!r} is not among the signing keys")
        if not all(_SAFE_RE.match(kid) for kid in keys):
            raise ValueError("key ids may use only letters, digits, '.', '_' and '-'")
        if any(len(secret) < 16 for secret in keys.values()):
            raise ValueError("signing keys must be at least 16 bytes")
        self._keys = dict(keys)
        self._active = active_kid

    @staticmethod
    def _canonical_method(method: str) -> str:
        method = method.upper()
        return "GET" if method == "HEAD" else method

    def _mac(self, kid: str, method: str, path: str, expires: int) -> str:
        message = f"v1\n{self._canonical_method(method)}\n{path}\n{expires}\n{kid}".encode()
        return _b64url(hmac.digest(self._keys[kid], message, "sha256"))

    def sign(self, method: str, path: str, expires: int) -> SignedQuery:
        """Sign ``method path`` until Unix time ``expires`` with the active key."""
        return SignedQuery(expires, self._active, self._mac(self._active, method, path, expires))

    def knows(self, query_string: str) -> bool:
        """Whether ``query_string`` names one of this signer's key ids (the URL may be one it signed; only
        :meth:`verify` says whether it is, and still valid)."""
        for part in query_string.split("&"):
            name, _, value = part.partition("=")
            if name == "kid":
                return value in self._keys
        return False

    def verify(self, method: str, path: str, query_string: str, now: float) -> SignedQuery:
        """Return the verified parameters, or raise SignatureInvalid / UrlExpired."""
        # The raw query is read without percent-decoding, so an escaped or re-encoded variant of a valid URL is a
        # different URL and fails, as every other change does.
        pairs = [part.partition("=") for part in query_string.split("&")] if query_string else []
        if sorted(k for k, _, _ in pairs) != sorted(_PARAMS) or any(not sep for _, sep, _ in pairs):
            raise SignatureInvalid("signed URL must carry exactly the parameters exp, kid and sig", reason="malformed")
        params = {k: v for k, _, v in pairs}
        kid, sig, exp_text = params["kid"], params["sig"], params["exp"]
        if not all(_SAFE_RE.match(v) for v in (kid, sig)):
            raise SignatureInvalid("malformed key id or signature in signed URL", reason="malformed")
        if not _EXP_RE.match(exp_text):
            raise SignatureInvalid("malformed expiry in signed URL", reason="malformed")
        expires = int(exp_text)
        if kid not in self._keys:
            raise SignatureInvalid("signed URL names an unknown key id", reason="unknown_key")
        expected = self._mac(kid, method, path, expires)
        if not hmac.compare_digest(expected.encode("ascii"), sig.encode("ascii")):
            raise SignatureInvalid("signature does not match this URL")
        if now >= expires:
            raise UrlExpired("signed URL has expired", expired_at=expires)
        return SignedQuery(expires, kid, sig)
