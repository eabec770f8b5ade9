"""Closed by default: without API keys the service serves on loopback only unless told by name; a secret that is a
placeholder (or too short, or a published default) is refused at start, named and never repeated; the URL signing
key is never kept in a bucket; and /metrics is served without a key only on a port of its own. Process-level tests
run `transfer serve` as the image starts it (the Dockerfile's ENV and CMD), outside a container."""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from dockerfile_parse import DockerfileParser
from pydantic import ValidationError

from devtools.ports import free_port
from storage.s3 import S3Storage
from tests.conftest import s3_config
from transfer.core.auth import new_token, token_hash
from transfer.core.secretcheck import BUCKET_SECRET_MIN, SIGNING_KEY_MIN, secret_problem
from transfer.errors import SigningKeysRequired
from transfer.service.backends import SIGNING_KEYS_KEY, load_signing_keys
from transfer.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ADMIN = new_token()
KEYS = json.dumps({"admin": {"sha256": token_hash(ADMIN), "scopes": ["admin"]}})
SIGNING = json.dumps({"k1": secrets.token_urlsafe(32)})


def image_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment the image gives `transfer serve` (its ENV: TRANSFER_HOST=0.0.0.0 among them), on a free port
    and a data directory of this test, without any TRANSFER_* or AWS_* of the test run's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRANSFER_", "AWS_"))}
    env.update(DockerfileParser(path=str(ROOT / "Dockerfile")).envs)
    assert env["TRANSFER_HOST"] == "0.0.0.0"  # what makes the image's open mode refuse
    env.update(TRANSFER_PORT=str(free_port()), TRANSFER_DATA_DIR=str(tmp_path / "data"), TRANSFER_SHUTDOWN_DRAIN="0")
    env.update(extra)
    return env


def refused(env: dict[str, str], cwd: Path, *args: str, command: str = "serve") -> str:
    """Run `transfer <command>`; assert it exits 1 without listening, and return its one line on stderr."""
    out = subprocess.run(
        [sys.executable, "-m", "transfer", command, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    with pytest.raises(OSError):  # nothing was ever listening there
        socket.create_connection(("127.0.0.1", int(env["TRANSFER_PORT"])), timeout=2).close()
    return lines[0]


@contextmanager
def serving(env: dict[str, str], cwd: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`transfer serve` with ``env`` until its /healthz answers; yields its loopback URL and the process."""
    log = cwd / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "transfer", "serve"], env=env, cwd=cwd, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{env['TRANSFER_PORT']}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        yield url, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- open mode ----------------------------------------------------------------------------------------------------


def test_the_image_without_keys_refuses_to_serve_open(tmp_path: Path) -> None:
    line = refused(image_env(tmp_path), tmp_path)
    assert line.startswith("transfer: open_mode_refused: ") and "'0.0.0.0' is not a loopback address" in line
    assert "TRANSFER_ALLOW_OPEN_MODE" in line and "--allow-open" in line
    # the MCP server over HTTP and over stdio (which serves the HTTP API beside it) as well
    assert refused(image_env(tmp_path), tmp_path, "--transport", "streamable-http", command="mcp").startswith(
        "transfer: open_mode_refused: "
    )
    assert refused(image_env(tmp_path), tmp_path, command="mcp").startswith("transfer: open_mode_refused: ")


def test_open_mode_beyond_loopback_is_a_choice_made_by_name(tmp_path: Path) -> None:
    # asked for, the open-mode check passes (shown by the next check failing: S3 without a signing key), and
    # nothing ever listens open here
    for asked in (["--allow-open"], []):
        env = image_env(tmp_path, TRANSFER_STORAGE="s3")
        if not asked:
            env["TRANSFER_ALLOW_OPEN_MODE"] = "true"
        line = refused(env, tmp_path, *asked)
        assert line.startswith("transfer: signing_keys_required: "), line
    # with keys, no flag is needed on any address
    with serving(image_env(tmp_path, TRANSFER_API_KEYS=KEYS), tmp_path) as (url, _):
        assert httpx.get(url + "/v1/files").status_code == 401
        assert httpx.get(url + "/v1/files", headers={"authorization": f"Bearer {ADMIN}"}).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"])
def test_loopback_serves_open_without_being_asked(host: str) -> None:
    assert Settings(host=host).api_keys is None


@pytest.mark.parametrize("host", ["0.0.0.0", "", "::", "10.0.0.5", "192.168.1.2", "example.org", "::ffff:10.0.0.1"])
def test_any_other_address_needs_keys_or_the_flag(host: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(host=host)
    assert [e["type"] for e in caught.value.errors()] == ["open_mode_refused"]
    with pytest.raises(ValidationError):
        Settings(host=host, api_keys={})  # an empty set of keys is no keys
    assert Settings(host=host, allow_open_mode=True).allow_open_mode
    assert Settings(host=host, api_keys=json.loads(KEYS)).api_keys


# --- secrets ------------------------------------------------------------------------------------------------------

PLACEHOLDER_KEYS = [
    "REPLACE-with-32-random-bytes-as-hex-or-base64",  # deploy/kubernetes/secret.yaml as shipped
    "changeme-changeme-changeme",
    "<your signing key goes here>",
    "${TRANSFER_SIGNING_KEY}",
    "0123456789abcde",  # 15 bytes
    "a" * 64,
    "abababababababababab",
    "minioadmin",
]


@pytest.mark.parametrize("secret", PLACEHOLDER_KEYS)
def test_a_placeholder_signing_key_is_refused_and_not_repeated(secret: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(signing_keys={"k1": "a real one: " + secrets.token_urlsafe(32), "k2": secret})
    (error,) = caught.value.errors()
    assert error["type"] == "placeholder_secret" and "'k2'" in error["msg"]
    assert secret not in str(caught.value)


def test_api_key_placeholders_and_pasted_keys_are_refused() -> None:
    for digest, reason in (
        ("REPLACE-with-the-sha256-from-transfer-keys-new", "placeholder"),
        (new_token(), "is a key itself"),
        ("", "empty"),
    ):
        with pytest.raises(ValidationError) as caught:
            Settings(api_keys={"agents": {"sha256": digest, "scopes": ["upload"]}})
        (error,) = caught.value.errors()
        assert error["type"] == "placeholder_secret" and reason in error["msg"] and "'agents'" in error["msg"]
        assert not digest or digest not in str(caught.value)
    with pytest.raises(ValidationError, match="64 hex digits"):
        Settings(api_keys={"agents": {"sha256": "abc", "scopes": ["upload"]}})  # malformed: refused with the rest


@pytest.mark.parametrize(
    ("key_id", "secret", "reason"),
    [
        ("REPLACE", "x" * 40, "AWS_ACCESS_KEY_ID is a placeholder"),
        ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "is a placeholder"),  # AWS's docs
        ("transfer", "transfer-secret", "AWS_SECRET_ACCESS_KEY is a published default"),  # old docker-compose.yml
        ("minioadmin", "minioadmin", "published default"),
        ("ak", "1234567", "shorter than 8 bytes"),
        ("ak", "REPLACE", "is a placeholder"),
    ],
)
def test_bucket_credentials_that_are_not_secret_are_refused(
    monkeypatch: pytest.MonkeyPatch, key_id: str, secret: str, reason: str
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with pytest.raises(ValidationError) as caught:
        Settings(storage="s3", s3_bucket="b", signing_keys=json.loads(SIGNING))
    assert reason in str(caught.value) and secret not in str(caught.value)
    assert Settings(storage="local").storage == "local"  # read for S3 only: local storage has no bucket


def test_random_secrets_are_never_taken_for_placeholders(monkeypatch: pytest.MonkeyPatch) -> None:
    """The markers are long enough that random keys in the usual encodings do not contain them."""
    for _ in range(20_000):
        raw = secrets.token_bytes(32)
        for secret in (raw.hex(), base64.b64encode(raw).decode(), secrets.token_urlsafe(32)):
            assert secret_problem(secret, min_length=SIGNING_KEY_MIN) is None, secret
        aws_like = base64.b64encode(raw[:30]).decode()  # 40 characters, as AWS issues them
        assert secret_problem(aws_like, min_length=BUCKET_SECRET_MIN) is None, aws_like
    # and through the settings, which call it
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA" + secrets.token_hex(8).upper())
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", base64.b64encode(secrets.token_bytes(30)).decode())
    assert Settings(storage="s3", s3_bucket="b", signing_keys={"k": secrets.token_urlsafe(32)}).storage == "s3"


# --- the signing key and the bucket --------------------------------------------------------------------------------


def test_serve_on_s3_without_signing_keys_refuses_before_touching_the_bucket(tmp_path: Path) -> None:
    env = image_env(
        tmp_path,
        TRANSFER_API_KEYS=KEYS,
        TRANSFER_STORAGE="s3",
        TRANSFER_S3_BUCKET="b",
        TRANSFER_S3_ENDPOINT_URL="http://127.0.0.1:9",  # nothing there: the refusal comes first
    )
    line = refused(env, tmp_path)
    assert line.startswith("transfer: signing_keys_required: storage 's3' needs TRANSFER_SIGNING_KEYS"), line
    assert SIGNING_KEYS_KEY in line  # where an earlier version kept it, to carry it over


@pytest.mark.s3
@pytest.mark.anyio
async def test_no_signing_key_is_ever_written_into_a_bucket(s3_endpoint: Any, s3_bucket: str, tmp_path: Path) -> None:
    from devtools.s3server import s3_client

    storage = S3Storage(s3_config(s3_endpoint, s3_bucket))
    await storage.start()
    try:
        settings = Settings(data_dir=tmp_path, storage="s3", s3_bucket=s3_bucket, signing_keys=None)
        with pytest.raises(SigningKeysRequired):
            await load_signing_keys(settings, storage)
        configured = Settings(data_dir=tmp_path, storage="s3", s3_bucket=s3_bucket, signing_keys=json.loads(SIGNING))
        keys, active = await load_signing_keys(configured, storage)
        assert active == "k1" and keys["k1"] == json.loads(SIGNING)["k1"].encode()
    finally:
        await storage.close()
    listed = s3_client(s3_endpoint).list_objects_v2(Bucket=s3_bucket).get("Contents", [])
    assert not [o["Key"] for o in listed if "signing" in o["Key"]]


# --- the metrics port ---------------------------------------------------------------------------------------------


def test_metrics_have_a_port_of_their_own_without_a_key(tmp_path: Path) -> None:
    metrics_port = free_port()
    env = image_env(
        tmp_path, TRANSFER_API_KEYS=KEYS, TRANSFER_HOST="127.0.0.1", TRANSFER_METRICS_PORT=str(metrics_port)
    )
    with serving(env, tmp_path) as (url, _):
        scrape = f"http://127.0.0.1:{metrics_port}"
        assert "/metrics without a key on http://127.0.0.1:" in (tmp_path / "serve.log").read_text()
        text = httpx.get(scrape + "/metrics")
        assert text.status_code == 200 and "transfer_http_requests" in text.text
        assert text.headers["content-type"].startswith("text/plain")
        openmetrics = httpx.get(scrape + "/metrics", headers={"accept": "application/openmetrics-text"})
        assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
        assert httpx.head(scrape + "/metrics").status_code == 200
        with httpx.Client(http1=False, http2=True) as h2:  # h2c by prior knowledge: the same rule on that path
            over_h2 = h2.get(scrape + "/metrics")
            assert over_h2.http_version == "HTTP/2" and over_h2.status_code == 200
        # nothing else answers there, not even with a key
        admin = {"authorization": f"Bearer {ADMIN}"}
        for path in ("/v1/files", "/healthz", "/metrics/", "/docs"):
            r = httpx.get(scrape + path, headers=admin)
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", path
        post = httpx.post(scrape + "/metrics", content=b"x")
        assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
        # the API port keeps asking for an admin key
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/metrics", headers=admin).status_code == 200
    with pytest.raises(ValidationError, match="must differ"):
        Settings(port=9090, metrics_port=9090)
