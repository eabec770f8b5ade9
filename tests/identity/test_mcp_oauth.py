"""The MCP authorization spec on /mcp, with an MCP client nobody here wrote: the MCP TypeScript SDK's Client
(streamable HTTP) with its ClientCredentialsProvider goes from the 401 to a successful ``upload_content`` call
knowing only the server URL and a client id/secret registered at the issuer (oidc-provider on loopback). The token
it got then works on REST and tus as well."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.identity.conftest import AGENT, Deployment, Issuer, deployment, issuer_entry, node_dir, node_env

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def service(issuer: Issuer, tmp_path: Path) -> Iterator[Deployment]:
    with deployment(tmp_path / "data", oauth_issuers=[issuer_entry(issuer)]) as running:
        yield running


def test_the_sdk_client_goes_from_401_to_an_upload(service: Deployment, issuer: Issuer) -> None:
    done = subprocess.run(
        ["node", str(node_dir() / "mcp_client.mjs"), f"{service.url}/mcp", *AGENT, issuer.url, "upload read"],
        capture_output=True,
        timeout=120,
        env=node_env(),
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    seen = json.loads(done.stdout.decode().strip().splitlines()[-1])
    # what the client did, in order: the 401, the metadata, the issuer's discovery, the token, the retry
    requests = seen["requests"]
    assert requests[0] == f"POST {service.url}/mcp 401"
    assert f"GET {service.url}/.well-known/oauth-protected-resource 200" in requests
    assert any(r.startswith(f"POST {issuer.url}/token 200") for r in requests)
    assert requests.index(f"POST {service.url}/mcp 200") > requests.index(f"POST {issuer.url}/token 200")
    tool = seen["tool"]
    assert not tool.get("isError"), tool
    descriptor = tool["structuredContent"]
    assert descriptor["name"] == "from-mcp.txt" and descriptor["size"] == len(
        "uploaded by an MCP client with an OAuth token"
    )
    token = seen["token"]
    headers = {"authorization": f"Bearer {token}"}
    # the same token on REST: it sees the file the MCP call stored (one owner on every door) and uploads
    listed = httpx.get(f"{service.url}/v1/files", headers=headers, timeout=30).json()
    assert any(f["name"] == "from-mcp.txt" for f in listed["files"]), listed
    assert httpx.post(f"{service.url}/v1/files", content=b"rest", headers=headers, timeout=30).status_code == 201
    # and on tus (creation, RFC-less but tus 1.0.0)
    created = httpx.post(
        f"{service.url}/tus/files/",
        headers={**headers, "tus-resumable": "1.0.0", "upload-length": "3"},
        timeout=30,
    )
    assert created.status_code == 201, created.text
    patched = httpx.patch(
        created.headers["location"]
        if created.headers["location"].startswith("http")
        else service.url + created.headers["location"],
        content=b"tus",
        headers={
            **headers,
            "tus-resumable": "1.0.0",
            "upload-offset": "0",
            "content-type": "application/offset+octet-stream",
        },
        timeout=30,
    )
    assert patched.status_code == 204, patched.text
    # and the token of another audience is refused on /mcp too, with its code
    other = issuer.token(AGENT, "https://elsewhere.example")
    refused = httpx.post(
        f"{service.url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        headers={"authorization": f"Bearer {other}", "accept": "application/json, text/event-stream"},
        timeout=30,
    )
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "token_audience_mismatch"
    assert 'error="invalid_token"' in refused.headers["www-authenticate"]
