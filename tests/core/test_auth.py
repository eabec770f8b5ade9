"""API keys and scopes: 401 without or with a bad key, 403 without the scope, signed URLs need no key, and the
client and CLI carry the key only to the service."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Clock, LiveServer, running
from tests.uploads.test_api_upload import assert_error
from transfer.client import AsyncTransferClient
from transfer.core.auth import new_token, token_hash
from transfer.hosts import create_app
from transfer.settings import Settings

TOKENS = {name: new_token() for name in ("uploader", "reader", "admin")}
SCOPES = {"uploader": ["upload"], "reader": ["read"], "admin": ["admin"]}


def bearer(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


@pytest.fixture
def secured(tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    keys = {name: {"sha256": token_hash(TOKENS[name]), "scopes": SCOPES[name]} for name in TOKENS}
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys)
    with running(settings, clock) as live:
        yield live


def test_401_403_and_signed_urls(secured: LiveServer) -> None:
    data = os.urandom((1 << 20) + 1)
    with httpx.Client(base_url=secured.url, timeout=60) as http:
        assert_error(http.post("/v1/files", content=data), 401, "unauthenticated")
        assert "Bearer" in http.post("/v1/files", content=b"x").headers["www-authenticate"]
        assert_error(
            http.post("/v1/files", content=b"x", headers={"authorization": "Bearer tk_wrong"}), 401, "unauthenticated"
        )
        assert_error(
            http.post("/v1/files", content=b"x", headers={"authorization": "Basic abc"}), 401, "unauthenticated"
        )
        assert_error(http.post("/v1/files", content=b"x", headers=bearer("reader")), 403, "insufficient_scope")
        d = http.post("/v1/files", content=data, headers=bearer("uploader")).json()
        file_id = d["metadata"]["file_id"]
        assert http.get(d["url"]).content == data  # the signed URL is its own authorisation
        assert_error(http.get("/v1/files"), 401, "unauthenticated")
        assert_error(http.get("/v1/files", headers=bearer("uploader")), 403, "insufficient_scope")
        assert http.get("/v1/files", headers=bearer("reader")).status_code == 200
        assert http.get(f"/v1/files/{file_id}", headers=bearer("admin")).status_code == 200  # admin implies read
        assert_error(http.delete(f"/v1/files/{file_id}", headers=bearer("uploader")), 403, "insufficient_scope")
        assert http.delete(f"/v1/files/{file_id}", headers=bearer("admin")).status_code == 204
        assert_error(http.get(d["url"]), 404, "not_found")  # deleting revokes its URLs
        assert_error(http.post("/v1/sessions", json={}), 401, "unauthenticated")
        assert_error(
            http.post("/tus/files", headers={"tus-resumable": "1.0.0", "upload-length": "1"}), 401, "unauthenticated"
        )
        assert http.options("/tus/files").status_code == 204  # capabilities stay public
        assert http.get("/healthz").status_code == 200


@pytest.mark.anyio
async def test_client_and_cli_send_the_key(secured: LiveServer, tmp_path: Path) -> None:
    async with AsyncTransferClient(secured.url, api_key=TOKENS["uploader"]) as client:
        d = await client.upload(os.urandom((1 << 20) + 5))
        assert await client.resolve(d) is not None
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(1000))
    env = {**os.environ, "TRANSFER_API_KEY": TOKENS["uploader"]}
    ok = subprocess.run(
        [sys.executable, "-m", "transfer", "upload", "--server", secured.url, str(src)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["size"] == 1000
    denied = subprocess.run(
        [sys.executable, "-m", "transfer", "upload", "--server", secured.url, str(src)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert denied.returncode == 1 and denied.stderr.startswith("transfer: unauthenticated:")


def test_keys_new_prints_a_working_entry(tmp_path: Path, clock: Clock) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "transfer", "keys", "new", "ci", "--scopes", "upload,read"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    token = out.stdout.split("stored anywhere): ")[1].split()[0]
    entry = json.loads(out.stdout.split("TRANSFER_API_KEYS: ")[1])
    assert entry["ci"]["scopes"] == ["read", "upload"] and entry["ci"]["sha256"] == token_hash(token)
    assert token not in json.dumps(entry)  # only the hash is meant to be stored
    settings = Settings(data_dir=tmp_path / "d", signing_keys={"t": "0123456789abcdef0123"}, api_keys=entry)
    with running(settings, clock) as live:
        r = httpx.post(f"{live.url}/v1/files", content=b"hi", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 201


def test_malformed_key_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="sha256"):
        create_app(Settings(api_keys={"x": {"sha256": "nope", "scopes": ["read"]}}))
    with pytest.raises(ValueError, match="scopes"):
        create_app(Settings(api_keys={"x": {"sha256": "0" * 64, "scopes": ["root"]}}))
