"""OAuth 2.1 access tokens beside API keys, against a real authorization server (oidc-provider on loopback,
tokens by client credentials): discovery documents, the 401 challenge, the same token on REST and tus, each way a
token is refused with its own code, introspection of opaque tokens, and key rotation at the issuer while the
service runs."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from tusclient import client as tus_client

from tests.identity.conftest import (
    AGENT,
    BRIEF,
    OPAQUE,
    READER,
    Deployment,
    Issuer,
    deployment,
    issuer_entry,
    signing_key,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def service(issuer: Issuer, tmp_path: Path) -> Iterator[Deployment]:
    with deployment(
        tmp_path / "data", oauth_issuers=[issuer_entry(issuer)], oauth_token_cache_seconds=0.5, oauth_leeway=0
    ) as running:
        yield running


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def refused(url: str, token: str) -> tuple[int, str, str]:
    """Status, error code and WWW-Authenticate of a listing with ``token``."""
    response = httpx.get(f"{url}/v1/files", headers=bearer(token), timeout=30)
    return response.status_code, response.json()["error"]["code"], response.headers.get("www-authenticate", "")


def b64(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def test_discovery_documents_and_the_challenge(service: Deployment, issuer: Issuer) -> None:
    """A client without a token learns from the 401 where the metadata is (RFC 9728 §5.1), and the metadata names
    the issuer and the scopes; the path-suffixed form names /mcp's identifier (RFC 9728 §3.1, §3.3)."""
    url = service.url
    response = httpx.post(f"{url}/v1/files", content=b"x", timeout=30)
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ") and "error=" not in challenge  # RFC 6750 §3.1: no token, no error code
    assert f'resource_metadata="{url}/.well-known/oauth-protected-resource"' in challenge
    doc = httpx.get(f"{url}/.well-known/oauth-protected-resource", timeout=30).json()
    assert doc["resource"] == url and doc["authorization_servers"] == [issuer.url]
    assert set(doc["scopes_supported"]) == {"upload", "read", "admin"} and doc["bearer_methods_supported"] == ["header"]
    suffixed = httpx.get(f"{url}/.well-known/oauth-protected-resource/mcp", timeout=30).json()
    assert suffixed["resource"] == f"{url}/mcp"
    assert httpx.get(f"{url}/.well-known/oauth-protected-resource/other", timeout=30).status_code == 404
    # the same challenge on /mcp, before MCP sees the request
    mcp = httpx.post(f"{url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=30)
    assert mcp.status_code == 401 and "resource_metadata=" in mcp.headers["www-authenticate"]


def test_one_token_on_rest_and_tus_owned_by_its_subject(service: Deployment, issuer: Issuer, tmp_path: Path) -> None:
    """A token the issuer made for this service uploads over REST and tus; what it stores belongs to its subject
    (the client id of a client-credentials token), which another subject does not see."""
    token = issuer.token(AGENT, service.url)
    with httpx.Client(base_url=service.url, headers=bearer(token), timeout=30) as http:
        made = http.post("/v1/files", content=b"hello", params={"name": "a.txt"})
        assert made.status_code == 201, made.text
        file_id = made.json()["file_id"] if "file_id" in made.json() else made.headers["location"].rsplit("/", 1)[1]
        assert http.get("/v1/usage").json()["key"] == "agent"
    src = tmp_path / "b.bin"
    src.write_bytes(b"tus" * 1000)
    with open(src, "rb") as stream:
        uploader = tus_client.TusClient(f"{service.url}/tus/files", headers=bearer(token)).uploader(
            file_stream=stream, chunk_size=1 << 20, metadata={"filename": "b.bin"}
        )
        uploader.upload()
    described = httpx.get(uploader.url, headers={"accept": "application/json", **bearer(token)}, timeout=30)
    assert described.status_code == 200 and described.json()["size"] == 3000
    # the admin sees the owner named by the subject
    admin = httpx.get(
        f"{service.url}/v1/admin/files", headers=bearer(service.admin), params={"owner": "agent"}, timeout=30
    )
    owners = {f["owner"] for f in admin.json()["files"]}
    assert owners == {"agent"} and len(admin.json()["files"]) == 2
    # another subject of the same issuer does not see them
    other = issuer.token(READER, service.url, scope="read")
    assert httpx.get(f"{service.url}/v1/files/{file_id}", headers=bearer(other), timeout=30).status_code == 404


def test_insufficient_scope_names_the_scope_to_ask_for(service: Deployment, issuer: Issuer) -> None:
    """RFC 6750 §3.1: 403 insufficient_scope with the scope needed, and where the metadata is (the step-up flow
    of the MCP authorization spec)."""
    reader = issuer.token(READER, service.url, scope="read")
    response = httpx.post(f"{service.url}/v1/files", content=b"x", headers=bearer(reader), timeout=30)
    assert response.status_code == 403 and response.json()["error"]["code"] == "insufficient_scope"
    challenge = response.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="upload"' in challenge
    assert "resource_metadata=" in challenge
    assert httpx.get(f"{service.url}/v1/files", headers=bearer(reader), timeout=30).status_code == 200


def test_each_bad_token_is_refused_with_its_own_code(service: Deployment, issuer: Issuer) -> None:
    """Another audience, expired, tampered, alg none, HS256 keyed with the public key, an unknown signing key, an
    unknown issuer, a wrong typ: each is 401 with its code and error="invalid_token" in the challenge."""
    url = service.url
    good = issuer.token(AGENT, url)
    assert httpx.get(f"{url}/v1/files", headers=bearer(good), timeout=30).status_code == 200
    header, payload, signature = good.split(".")
    claims = jwt.decode(good, options={"verify_signature": False})
    at_jwt = {"typ": "at+jwt"}

    other_audience = issuer.token(AGENT, "https://elsewhere.example")
    status, code, challenge = refused(url, other_audience)
    assert (status, code) == (401, "token_audience_mismatch") and 'error="invalid_token"' in challenge

    brief = issuer.token(BRIEF, url)  # lives one second; the service allows no skew here
    time.sleep(2.1)
    assert refused(url, brief)[:2] == (401, "token_expired")

    tampered = ".".join([header, b64({**claims, "sub": "root", "scope": "upload read admin"}), signature])
    assert refused(url, tampered)[:2] == (401, "token_signature_invalid")

    none = ".".join([b64({"alg": "none", "typ": "at+jwt"}), payload, ""])
    assert refused(url, none)[:2] == (401, "token_algorithm_refused")

    jwks = httpx.get(f"{issuer.url}/jwks", timeout=10).json()
    public_pem = jwt.PyJWK(jwks["keys"][0]).key.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    signing_input = ".".join([b64({"alg": "HS256", "typ": "at+jwt", "kid": "key-1"}), payload]).encode()
    forged_mac = base64.urlsafe_b64encode(hmac.digest(public_pem, signing_input, "sha256")).rstrip(b"=").decode()
    assert refused(url, signing_input.decode() + "." + forged_mac)[:2] == (401, "token_algorithm_refused")

    stranger = signing_key("stranger")
    forged = jwt.encode(
        claims, jwt.PyJWK(stranger).key, algorithm="RS256", headers={"kid": "stranger", "typ": "at+jwt"}
    )
    assert refused(url, forged)[:2] == (401, "token_key_unknown")

    elsewhere = jwt.encode(
        {**claims, "iss": "https://evil.example"}, jwt.PyJWK(stranger).key, algorithm="RS256", headers={"typ": "at+jwt"}
    )
    assert refused(url, elsewhere)[:2] == (401, "token_issuer_unknown")

    issuer_key = jwt.PyJWK(issuer.keys[0]).key  # the issuer's own key, signing an ID-token-typed JWT
    id_token_typed = jwt.encode(claims, issuer_key, algorithm="RS256", headers={"kid": "key-1", "typ": "JWT"})
    assert refused(url, id_token_typed)[:2] == (401, "token_type_refused")
    bound = jwt.encode(
        {**claims, "cnf": {"jkt": "x"}}, issuer_key, algorithm="RS256", headers={"kid": "key-1", **at_jwt}
    )
    assert refused(url, bound)[:2] == (401, "token_type_refused")  # DPoP-bound: no bearer token

    future = jwt.encode(
        {**claims, "nbf": int(time.time()) + 600},
        issuer_key,
        algorithm="RS256",
        headers={"kid": "key-1", "typ": "at+jwt"},
    )
    assert refused(url, future)[:2] == (401, "token_not_yet_valid")

    assert refused(url, "not-a-token")[:2] == (401, "token_inactive")  # opaque: the issuer says it is not active
    assert refused(url, "tk_" + "A" * 43)[:2] == (401, "unauthenticated")  # a key nobody made


def test_opaque_tokens_are_introspected_and_revocation_is_seen(service: Deployment, issuer: Issuer) -> None:
    """An opaque token is asked of the issuer (RFC 7662); revoked there (RFC 7009), it is refused once the answer
    cached for TRANSFER_OAUTH_TOKEN_CACHE_SECONDS (0.5 s here) is stale."""
    token = issuer.token(OPAQUE, service.url)
    assert "." not in token
    made = httpx.post(f"{service.url}/v1/files", content=b"opaque", headers=bearer(token), timeout=30)
    assert made.status_code == 201, made.text
    assert httpx.get(f"{service.url}/v1/usage", headers=bearer(token), timeout=30).json()["key"] == "opaque-agent"
    revoked = httpx.post(
        f"{issuer.url}/token/revocation", data={"token": token, "token_type_hint": "access_token"}, auth=OPAQUE
    )
    assert revoked.status_code == 200
    time.sleep(0.7)
    assert refused(service.url, token)[:2] == (401, "token_inactive")


def test_signing_key_rotation_at_the_issuer_while_the_service_runs(service: Deployment, issuer: Issuer) -> None:
    """The issuer starts signing with a new key: the first token naming it makes the service fetch the JWKS
    again (once), and both old and new tokens work; a key the issuer dropped stops verifying new tokens."""
    old_key = issuer.keys[0]
    before = issuer.token(AGENT, service.url)
    assert httpx.get(f"{service.url}/v1/files", headers=bearer(before), timeout=30).status_code == 200
    identities = service.replicas[0].app.state.services.identities
    assert identities.tokens is not None
    [client] = identities.tokens.issuers.values()
    fetched = client.fetches
    new_key = signing_key("key-2")
    issuer.restart([new_key, old_key])  # oidc-provider signs with the first key of its set
    after = issuer.token(AGENT, service.url)
    assert jwt.get_unverified_header(after)["kid"] == "key-2"
    assert httpx.get(f"{service.url}/v1/files", headers=bearer(after), timeout=30).status_code == 200
    assert client.fetches == fetched + 1
    for _ in range(3):  # known now: no more fetches
        assert httpx.get(f"{service.url}/v1/files", headers=bearer(after), timeout=30).status_code == 200
    assert client.fetches == fetched + 1
    issuer.restart([new_key])  # the old key retired: a token signed with it now names a key the issuer dropped
    claims = jwt.decode(before, options={"verify_signature": False})
    late = jwt.encode(
        {**claims, "jti": hashlib.sha256(b"late").hexdigest()},
        jwt.PyJWK(old_key).key,
        algorithm="RS256",
        headers={"kid": "key-1", "typ": "at+jwt"},
    )
    client._loaded_at = -1e9  # as if the JWKS had aged past TRANSFER_OAUTH_JWKS_MAX_AGE
    assert refused(service.url, late)[:2] == (401, "token_key_unknown")
