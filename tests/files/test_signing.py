"""Signed URLs: any change is rejected, expiry is enforced, keys rotate."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transfer.core.http.signing import UrlSigner
from transfer.errors import SignatureInvalid, UrlExpired

KEYS = {"k1": b"k1-secret-0123456789", "k2": b"k2-secret-0123456789"}
PATH = "/v1/files/f_0123456789abcdef0123456789abcdef/content"
NOW = 1_800_000_000


def signed(method: str = "GET", path: str = PATH, expires: int = NOW + 60, kid: str = "k1") -> str:
    return UrlSigner(KEYS, kid).sign(method, path, expires).encode()


def test_valid_url_verifies_and_head_uses_get_signature() -> None:
    signer = UrlSigner(KEYS, "k1")
    q = signed()
    assert signer.verify("GET", PATH, q, NOW).kid == "k1"
    signer.verify("HEAD", PATH, q, NOW)
    with pytest.raises(SignatureInvalid):
        signer.verify("POST", PATH, q, NOW)  # bound to the method


def test_expired_url() -> None:
    with pytest.raises(UrlExpired):
        UrlSigner(KEYS, "k1").verify("GET", PATH, signed(expires=NOW), NOW)


def test_rotation_old_key_still_verifies_unknown_key_does_not() -> None:
    q = signed(kid="k1")
    assert UrlSigner(KEYS, "k2").verify("GET", PATH, q, NOW).kid == "k1"
    with pytest.raises(SignatureInvalid, match="unknown key"):
        UrlSigner({"k2": KEYS["k2"]}, "k2").verify("GET", PATH, q, NOW)


@pytest.mark.parametrize(
    "query",
    [
        "",
        "exp=1&kid=k1",
        signed() + "&extra=1",
        signed() + "&sig=x",
        "exp=abc&kid=k1&sig=x",
        "exp=-5&kid=k1&sig=x",
        signed().replace("exp=", "exp=0"),
    ],
)
def test_malformed_queries_are_rejected(query: str) -> None:
    with pytest.raises(SignatureInvalid):
        UrlSigner(KEYS, "k1").verify("GET", PATH, query, NOW)


@given(st.data())
def test_any_single_character_change_is_rejected(data: st.DataObject) -> None:
    url = PATH + "?" + signed()
    i = data.draw(st.integers(0, len(url) - 1))
    c = data.draw(st.characters(min_codepoint=33, max_codepoint=126).filter(lambda ch: ch != url[i]))
    tampered = url[:i] + c + url[i + 1 :]
    path, _, query = tampered.partition("?")
    with pytest.raises((SignatureInvalid, UrlExpired)) as info:
        UrlSigner(KEYS, "k1").verify("GET", path, query, NOW)
    # a change can only be reported as expiry if it produced a still-valid signature: never
    assert isinstance(info.value, SignatureInvalid)


def test_tampered_and_expired_reports_tampering() -> None:
    q = signed(expires=NOW - 10).replace("exp=", "exp=1")
    with pytest.raises(SignatureInvalid):
        UrlSigner(KEYS, "k1").verify("GET", PATH, q, NOW)


@pytest.mark.parametrize("variant", ["exp=0{exp}", "kid=%6B1", "sig={sig}%3D", "exp=+{exp}"])
def test_re_encoded_variants_are_rejected(variant: str) -> None:
    q = dict(p.split("=", 1) for p in signed().split("&"))
    parts = {"exp": f"exp={q['exp']}", "kid": f"kid={q['kid']}", "sig": f"sig={q['sig']}"}
    name = variant.split("=", 1)[0]
    parts[name] = variant.format(exp=q["exp"], sig=q["sig"])
    with pytest.raises(SignatureInvalid):
        UrlSigner(KEYS, "k1").verify("GET", PATH, "&".join(parts.values()), NOW)


@given(
    kid=st.from_regex(r"\A[A-Za-z0-9._-]{1,128}\Z"),
    expires=st.integers(min_value=1, max_value=10**12 - 1),
    path=st.text(min_size=1, max_size=80),
)
def test_the_signed_query_is_what_urlencode_writes_and_verifies(kid: str, expires: int, path: str) -> None:
    """The query is written without urlencode's quoting: it must still be exactly what urlencode would write, for
    any key id the signer accepts, and verify."""
    signer = UrlSigner({kid: b"a-secret-0123456789"}, kid)
    query = signer.sign("GET", path, expires)
    assert query.encode() == urlencode({"exp": str(expires), "kid": query.kid, "sig": query.sig})
    assert signer.verify("GET", path, query.encode(), expires - 1) == query
