"""The resource server's rules that need no network: issuer configuration (refused when unsafe), audience
matching (RFC 8707), scope mapping, the Bearer challenge (RFC 6750 §3), where metadata lives (RFC 9728 §3.1), and
the settings that tie them together."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from transfer.core.auth import Scope
from transfer.core.oauth import audience_matches, bearer_challenge, looks_like_jwt, parse_issuers
from transfer.service.identity.directory import metadata_url
from transfer.service.identity.issuers import discovery_urls, fits
from transfer.settings import Settings


def test_unsafe_or_malformed_issuers_are_refused_by_name() -> None:
    for entry, words in [
        ({"issuer": "https://id.example", "algorithms": ["none"]}, "never none"),
        ({"issuer": "https://id.example", "algorithms": ["HS256", "RS256"]}, "HS*"),
        ({"issuer": "http://id.example"}, "https"),  # plain http only to loopback
        ({"issuer": "https://id.example#x"}, "fragment"),
        ({"issuer": "https://id.example", "scopes": {"write": "files:write"}}, "upload, read and admin"),
        ({"issuer": "https://id.example", "introspection": {"client_id": "x"}}, "client_secret"),
        ({"issuer": "https://id.example", "max_bytes": 0}, "positive"),
        ({"issuer": "https://id.example", "audience": "x"}, "unknown fields"),
    ]:
        with pytest.raises(ValueError, match=words.replace("*", r"\*")):
            parse_issuers([entry])
    with pytest.raises(ValueError, match="twice"):
        parse_issuers([{"issuer": "https://id.example"}, {"issuer": "https://id.example"}])
    [loopback] = parse_issuers([{"issuer": "http://127.0.0.1:9000"}])
    assert loopback.require_typ and "none" not in loopback.algorithms


def test_scopes_map_to_the_service_and_audiences_compare_without_the_trailing_slash() -> None:
    [policy] = parse_issuers([{"issuer": "https://id.example", "scopes": {"upload": "files:write"}}])
    assert policy.granted("files:write read other") == {Scope.UPLOAD, Scope.READ}
    assert policy.granted(["admin"]) == {Scope.ADMIN} and policy.granted(None) == frozenset()
    assert policy.granted("upload") == frozenset()  # renamed: the service's own name no longer grants it
    assert audience_matches("https://svc.example/", ["https://svc.example"])
    assert audience_matches(["other", "https://svc.example"], ["https://svc.example/"])
    assert not audience_matches("https://svc.example.evil", ["https://svc.example"])
    assert not audience_matches(None, ["https://svc.example"]) and not audience_matches(7, ["x"])


def test_the_challenge_quotes_what_it_carries() -> None:
    value = bearer_challenge({"realm": "transfer", "resource_metadata": None, "error_description": 'a "b" \\ é\n'})
    assert value == 'Bearer realm="transfer", error_description="a ?b? ? ??"'
    assert metadata_url("https://svc.example") == "https://svc.example/.well-known/oauth-protected-resource"
    assert metadata_url("https://h.example/base/") == "https://h.example/.well-known/oauth-protected-resource/base"
    assert discovery_urls("https://id.example/realms/a") == [
        "https://id.example/.well-known/oauth-authorization-server/realms/a",
        "https://id.example/realms/a/.well-known/openid-configuration",
    ]


def test_a_key_is_used_only_with_an_algorithm_of_its_kind() -> None:
    rsa, ec = {"kty": "RSA", "n": "x", "e": "AQAB"}, {"kty": "EC", "crv": "P-256"}
    assert fits(rsa, "RS256") and fits(rsa, "PS384") and not fits(rsa, "ES256") and not fits(rsa, "HS256")
    assert fits(ec, "ES256") and not fits(ec, "ES384") and not fits({"kty": "oct", "k": "x"}, "HS256")
    assert not fits({**rsa, "alg": "RS512"}, "RS256") and not fits({**rsa, "use": "enc"}, "RS256")
    assert looks_like_jwt("a.b.") and looks_like_jwt("a.b.c") and not looks_like_jwt("a..c")
    assert not looks_like_jwt("opaque-token")


def test_settings_need_a_resource_identifier_for_issuers(tmp_path: Path) -> None:
    issuers = [{"issuer": "https://id.example"}]
    with pytest.raises(ValidationError, match="TRANSFER_OAUTH_RESOURCE"):
        Settings(data_dir=tmp_path, oauth_issuers=issuers)
    with pytest.raises(ValidationError, match="never none"):
        Settings(data_dir=tmp_path, oauth_issuers=[{**issuers[0], "algorithms": ["none"]}], public_url="https://s")
    # trusted issuers close the service like keys do: no open-mode refusal on a public address
    closed = Settings(data_dir=tmp_path, host="0.0.0.0", oauth_issuers=issuers, oauth_resource="https://svc.example")
    assert closed.oauth_resource == "https://svc.example"
