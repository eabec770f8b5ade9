"""API keys as records managed at run time, over three replicas of the service sharing one data directory: made
with ``transfer keys create`` against one replica, a key works on the others at once; revoked, it is refused on
every replica within TRANSFER_KEY_CACHE_SECONDS; rotation, expiry, limits, and what is never stored."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.identity.conftest import Deployment, deployment
from transfer.core.auth import new_token, token_hash

pytestmark = pytest.mark.timeout(180)

BOUND = 1.0  # TRANSFER_KEY_CACHE_SECONDS of these replicas


def transfer(deploy: Deployment, *args: str, replica: int = 0) -> dict[str, Any]:
    """``transfer keys ...`` as an operator runs it, against one replica, with the bootstrap admin key."""
    done = subprocess.run(
        [sys.executable, "-m", "transfer.cli", "keys", *args, "--json", "--server", deploy.replicas[replica].url],
        capture_output=True,
        timeout=60,
        env={"TRANSFER_API_KEY": deploy.admin, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr.decode()
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def status(url: str, key: str, path: str = "/v1/files") -> tuple[int, str | None]:
    response = httpx.get(f"{url}{path}", headers={"authorization": f"Bearer {key}"}, timeout=30)
    code = response.json().get("error", {}).get("code") if response.status_code >= 400 else None
    return response.status_code, code


def test_a_key_made_on_one_replica_works_on_all_and_its_revocation_reaches_all(tmp_path: Path) -> None:
    with deployment(tmp_path / "data", replicas=3, key_cache_seconds=BOUND) as deploy:
        urls = [r.url for r in deploy.replicas]
        made = transfer(deploy, "create", "alice", "--scopes", "upload,read", "--max-bytes", "10")
        key = made["key"]
        assert key.startswith("tk_") and made["name"] == "alice" and made["scopes"] == ["read", "upload"]
        # at once, on every replica (none has seen it, so none has cached a refusal)
        assert [status(url, key)[0] for url in urls] == [200, 200, 200]
        # the record's limits hold wherever the key is used: its quota of 10 bytes
        big = httpx.post(f"{urls[2]}/v1/files", content=b"x" * 11, headers={"authorization": f"Bearer {key}"})
        assert big.status_code == 413 and big.json()["error"]["code"] == "quota_exceeded"
        small = httpx.post(f"{urls[1]}/v1/files", content=b"x" * 10, headers={"authorization": f"Bearer {key}"})
        assert small.status_code == 201
        time.sleep(BOUND + 0.1)  # what replica 0 cached of alice is stale: her limits are read from her record
        usage = httpx.get(f"{urls[0]}/v1/admin/usage", headers={"authorization": f"Bearer {deploy.admin}"}).json()
        assert usage["keys"]["alice"]["quota_bytes"] == 10 and usage["keys"]["alice"]["bytes_used"] == 10
        # what is stored: the hash, never the token
        stored = b"".join(p.read_bytes() for p in (tmp_path / "data").rglob("*") if p.is_file())
        assert key.encode() not in stored and token_hash(key).encode() in stored
        listed = transfer(deploy, "list", replica=1)
        assert [e["name"] for e in listed] == ["alice"]
        assert "sha256" not in json.dumps(listed) and listed[0]["keys"][0]["created_by"] == "root"
        # revoked through replica 0: refused there at once, and on the others within the bound
        revoked = transfer(deploy, "revoke", "alice")
        started = time.monotonic()
        assert revoked["revoked"] == [made["key_id"]]
        assert status(urls[0], key) == (401, "unauthenticated")
        waits = []
        for url in urls[1:]:
            while status(url, key)[0] != 401:
                assert time.monotonic() - started < BOUND + 2, "a revoked key still works past the bound"
                time.sleep(0.05)
            waits.append(time.monotonic() - started)
        assert max(waits) <= BOUND + 2


def test_rotation_grace_expiry_and_refusals(tmp_path: Path) -> None:
    with deployment(tmp_path / "data", replicas=2, key_cache_seconds=BOUND) as deploy:
        a, b = (r.url for r in deploy.replicas)
        first = transfer(deploy, "create", "bob", "--scopes", "read")["key"]
        assert status(b, first)[0] == 200
        # rotation with a grace: both work during it; the old one is refused with key_expired after it
        rotated = transfer(deploy, "rotate", "bob", "--grace", "2")
        second = rotated["key"]
        assert rotated["scopes"] == ["read"] and len(rotated["keys"]) == 2
        assert status(b, second)[0] == 200 and status(a, first)[0] == 200
        time.sleep(2 + BOUND + 0.2)
        assert status(b, first) == (401, "key_expired") and status(a, second)[0] == 200
        # rotation without a grace: the old one goes at once
        third = transfer(deploy, "rotate", "bob", replica=1)["key"]
        assert status(b, second) == (401, "unauthenticated") and status(b, third)[0] == 200
        # a key made with a lifetime expires on its own, with its own code
        brief = transfer(deploy, "create", "carol", "--scopes", "read", "--expires-in", "4")["key"]
        assert status(a, brief)[0] == 200
        time.sleep(4.2)
        assert status(a, brief) == (401, "key_expired")
        # the scopes of a record hold: a read key cannot make keys, nor upload
        assert status(a, third, "/v1/admin/keys") == (403, "insufficient_scope")
        assert (
            httpx.post(f"{a}/v1/files", content=b"x", headers={"authorization": f"Bearer {third}"}).status_code == 403
        )
        # names: a live name is taken, the environment's names are read-only
        admin = {"authorization": f"Bearer {deploy.admin}"}
        again = httpx.post(f"{a}/v1/admin/keys", json={"name": "bob", "scopes": ["read"]}, headers=admin)
        assert again.status_code == 409 and again.json()["error"]["code"] == "key_name_taken"
        root = httpx.post(f"{a}/v1/admin/keys", json={"name": "root", "scopes": ["read"]}, headers=admin)
        assert root.status_code == 409 and root.json()["error"]["code"] == "key_name_taken"
        bad = httpx.post(f"{a}/v1/admin/keys", json={"name": "x", "scopes": ["everything"]}, headers=admin)
        assert bad.status_code == 400
        gone = httpx.post(f"{a}/v1/admin/keys/revoke", json={"name": "nobody"}, headers=admin)
        assert gone.status_code == 404
        # a revoked name is free again
        transfer(deploy, "revoke", "carol")
        assert transfer(deploy, "create", "carol", "--scopes", "read")["name"] == "carol"


def test_an_open_service_refuses_to_make_keys(tmp_path: Path) -> None:
    """Without a bootstrap key every caller is admin: a key made then would change nothing, so none is made."""
    from tests.conftest import running
    from transfer.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", signing_keys={"test": "0123456789abcdef0123456789abcdef"})
    with running(settings) as live:
        response = httpx.post(f"{live.url}/v1/admin/keys", json={"name": "dave", "scopes": ["read"]})
        assert response.status_code == 400 and response.json()["error"]["code"] == "key_records_refused"


def test_the_environment_keys_stay_read_only_and_any_secret_works(tmp_path: Path) -> None:
    """TRANSFER_API_KEYS still admits keys of any form (a hash of any secret), beside the records."""
    secret = "a-secret-that-is-no-tk-key-0123456789"
    with deployment(tmp_path / "data", api_keys={"ops": {"sha256": token_hash(secret), "scopes": ["admin"]}}) as deploy:
        assert status(deploy.url, secret)[0] == 200
        assert status(deploy.url, new_token()) == (401, "unauthenticated")
