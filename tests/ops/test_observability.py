"""Operating the service, tested on real server processes: /metrics scraped and parsed with the Prometheus client's
own parser, the access log parsed as JSON and searched for every secret the requests carried, /readyz, request ids,
and SIGTERM during uploads (on local storage and on S3)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.serving import free_port
from tests.conftest import in_progress_uploads, running, s3_client
from tests.layout import stored_keys
from transfer.api.middleware.observability import redact
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

MiB = 1 << 20
SIGNING = {"t": "0123456789abcdef0123"}


# --- helpers ---


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics parsed by prometheus_client's parser: {(sample name, sorted labels): value}."""
    response = httpx.get(f"{url}/metrics", headers={"accept": "text/plain", **(headers or {})}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels`` (0 when there is none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


@dataclass
class Proc:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    data_dir: Path

    def lines(self) -> list[dict[str, Any]]:
        """Every log line of the process, each parsed as JSON (a line that is not JSON fails the test)."""
        text = self.log.read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def access(self) -> list[dict[str, Any]]:
        return [e for e in self.lines() if e["logger"] == "transfer.access"]


@contextmanager
def serve(tmp_path: Path, env: dict[str, str] | None = None, *args: str) -> Iterator[Proc]:
    """``transfer serve --log-format json`` as an operator runs it, stderr captured to a file."""
    port = free_port()
    data_dir = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    full_env = {**os.environ, "TRANSFER_SIGNING_KEYS": json.dumps(SIGNING), **(env or {})}
    command = [sys.executable, "-m", "transfer", "serve", "--port", str(port), "--data-dir", str(data_dir)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*command, "--log-format", "json", "--log-level", "info", *args],
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=full_env,
            cwd=tmp_path,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("service did not start: " + log_path.read_text())
            time.sleep(0.05)
        yield Proc(url, proc, log_path, data_dir)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # no drain
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- metrics ---


@pytest.mark.e2e
def test_metrics_count_requests_bytes_storage_sweeps_and_rejections(tmp_path: Path) -> None:
    env = {"TRANSFER_SESSION_GC_INTERVAL": "0.2"}
    with serve(tmp_path, env) as srv:
        data = os.urandom(3 * MiB)
        up = httpx.post(f"{srv.url}/v1/files", params={"name": "a.bin"}, content=data, timeout=60)
        assert up.status_code == 201
        signed = up.json()["url"]
        assert httpx.get(signed, timeout=60).content == data
        path = urlsplit(signed).path
        for query in ("exp=1&kid=t&sig=AAAA", "exp=1&kid=nope&sig=AAAA", "sig=x", "exp=99999999999&kid=t&sig=AAAA"):
            assert httpx.get(f"{srv.url}{path}?{query}").status_code == 403
        variant = path.replace("/v1/files/f_", "/v1/files/%66_")  # an encoded variant of the signed path
        assert httpx.get(f"{srv.url}{variant}?{urlsplit(signed).query}").status_code == 403
        assert httpx.get(f"{srv.url}/v1/files/f_0123/nothing-here").status_code == 404

        deadline = time.monotonic() + 30
        while value(samples := scrape(srv.url), "transfer_sweeps_total", sweep="uploads", outcome="ok") < 1:
            assert time.monotonic() < deadline, "no sweep ran"
            time.sleep(0.2)

    # requests by route template (never the raw path) and status
    assert value(samples, "transfer_http_requests_total", method="POST", route="/v1/files", status="201") == 1
    content = "/v1/files/{file_id}/content"
    assert value(samples, "transfer_http_requests_total", method="GET", route=content, status="200") == 1
    assert value(samples, "transfer_http_requests_total", method="GET", route=content, status="403") >= 4
    assert value(samples, "transfer_http_requests_total", route="unmatched", status="404") >= 1
    assert not any("f_" in dict(labels).get("route", "") for _, labels in samples)
    # bytes both ways, duration histograms of uploads and downloads
    assert value(samples, "transfer_http_received_bytes_total", route="/v1/files") == len(data)
    assert value(samples, "transfer_http_sent_bytes_total", route=content) >= len(data)
    assert value(samples, "transfer_upload_duration_seconds_count", kind="file", outcome="ok") == 1
    assert value(samples, "transfer_download_duration_seconds_count", kind="file", outcome="ok") == 1
    assert value(samples, "transfer_download_duration_seconds_bucket", kind="file", outcome="ok", le="+Inf") == 1
    # in progress: the scrape itself is the one request being served
    assert value(samples, "transfer_uploads_in_progress") == 0
    assert value(samples, "transfer_http_requests_in_progress") == 1
    # storage operations, and errors by kind (the failed reads of unknown files)
    assert value(samples, "transfer_storage_operations_total", operation="create") >= 1
    assert value(samples, "transfer_storage_operations_total", operation="open") >= 1
    assert value(samples, "transfer_storage_operations_total", operation="list") >= 1
    # signed-URL rejections by reason
    for reason in ("mismatch", "unknown_key", "malformed", "path_variant"):
        assert value(samples, "transfer_signed_url_rejections_total", reason=reason) >= 1, reason
    assert value(samples, "transfer_sweep_last_success_timestamp_seconds", sweep="uploads") > 0
    assert value(samples, "transfer_ready") in (0, 1)


@pytest.mark.e2e
def test_metrics_take_an_admin_key_when_keys_are_on(tmp_path: Path) -> None:
    tokens = {name: new_token() for name in ("ops", "uploader")}
    scopes = {"ops": ["admin"], "uploader": ["upload", "read"]}
    keys = {name: {"sha256": token_hash(tokens[name]), "scopes": scopes[name]} for name in tokens}
    with running(Settings(data_dir=tmp_path / "data", signing_keys=SIGNING, api_keys=keys)) as live:
        assert httpx.get(f"{live.url}/metrics").status_code == 401
        denied = httpx.get(f"{live.url}/metrics", headers={"authorization": f"Bearer {tokens['uploader']}"})
        assert denied.status_code == 403 and denied.json()["error"]["code"] == "insufficient_scope"
        assert scrape(live.url, {"authorization": f"Bearer {tokens['ops']}"})
        assert httpx.get(f"{live.url}/readyz").status_code == 200  # probes carry no key
        assert httpx.get(f"{live.url}/healthz").status_code == 200


@pytest.mark.s3
@pytest.mark.anyio
async def test_s3_retries_are_counted(s3_endpoint: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.faultproxy import FaultProxy

    parts = urlsplit(s3_endpoint.url)
    proxy = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 80)).start()
    for k, v in {
        "AWS_ACCESS_KEY_ID": s3_endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_key,
        "AWS_REGION": s3_endpoint.region,
    }.items():
        monkeypatch.setenv(k, v)
    settings = Settings(
        storage="s3",
        s3_bucket=s3_bucket,
        s3_endpoint_url=proxy.url,
        s3_addressing_style="path",
        s3_atomic_if_absent=False,
        signing_keys=SIGNING,
    )
    try:
        with running(settings) as live:
            before = value(scrape(live.url), "transfer_s3_retries_total", operation="PutObject")
            proxy.add("PutObject", "slowdown", times=2)
            async with httpx.AsyncClient(timeout=60) as http:
                ok = await http.post(f"{live.url}/v1/files", params={"name": "r.bin"}, content=os.urandom(100_000))
            assert ok.status_code == 201
            after = value(scrape(live.url), "transfer_s3_retries_total", operation="PutObject")
            assert after - before == 2
    finally:
        proxy.stop()


# --- request ids ---


def test_request_ids_are_kept_when_sane_and_made_otherwise(tmp_path: Path) -> None:
    keys = {"k": {"sha256": token_hash(new_token()), "scopes": ["admin"]}}
    with running(Settings(data_dir=tmp_path / "data", signing_keys=SIGNING, api_keys=keys)) as live:
        kept = httpx.get(f"{live.url}/healthz", headers={"x-request-id": "3f2a9c1e-7b4d-4e8a-9f00-aa11bb22cc33"})
        assert kept.headers["x-request-id"] == "3f2a9c1e-7b4d-4e8a-9f00-aa11bb22cc33"
        for hostile in ("a" * 129, "<script>", "id with spaces", "-starts-with-dash", "x;y", "é"):
            got = httpx.get(f"{live.url}/healthz", headers={"x-request-id": hostile.encode("utf-8")})
            assert got.headers["x-request-id"] != hostile
            assert len(got.headers["x-request-id"]) == 24 and int(got.headers["x-request-id"], 16) >= 0
        # every answer carries one, errors included: no key, unknown route, refused host, bad signature
        errors = [
            httpx.post(f"{live.url}/v1/files", content=b"x"),
            httpx.get(f"{live.url}/nowhere"),
            httpx.get(f"{live.url}/healthz", headers={"host": "evil.example"}),
            httpx.get(f"{live.url}/v1/files/f_00/content?exp=1&kid=t&sig=x"),
        ]
        assert [r.status_code for r in errors] == [401, 404, 400, 403]
        for response in errors:
            assert len(response.headers.get_list("x-request-id")) == 1
            assert response.json()["error"]["code"]


# --- logs ---


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_one_json_line_per_request_and_no_secret_in_any_line(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    admin, stranger = new_token(), new_token()
    env = {"TRANSFER_API_KEYS": json.dumps({"ops-team": {"sha256": token_hash(admin), "scopes": ["admin"]}})}
    if backend == "s3":
        env.update(request.getfixturevalue("s3_env"))
    auth = {"authorization": f"Bearer {admin}"}
    secrets: list[str] = [admin, stranger]
    with serve(tmp_path, env) as srv:
        data = os.urandom(200_000)
        up = httpx.post(
            f"{srv.url}/v1/files",
            params={"name": "s.bin", "inline": "false"},
            content=data,
            headers={**auth, "x-request-id": "req-upload-1"},
            timeout=60,
        )
        assert up.status_code == 201
        signed = up.json()["url"]
        secrets.append(urlsplit(signed).query.rsplit("sig=", 1)[1])
        assert httpx.get(signed).content == data
        # tampered and expired signatures, a wrong key, a malformed Authorization, a key in the query
        httpx.get(signed[:-3] + "AAA")
        httpx.get(f"{srv.url}/v1/files", headers={"authorization": f"Bearer {stranger}"})
        httpx.get(f"{srv.url}/v1/files", headers={"authorization": f"Basic {stranger}"})
        httpx.get(f"{srv.url}/v1/files?api_key={stranger}&sig={secrets[2]}")
        if backend == "s3":  # a presigned S3 URL in a descriptor (download_method=signed_url)
            described = httpx.get(
                f"{srv.url}/v1/files/{up.json()['metadata']['file_id']}",
                params={"download_method": "signed_url", "inline": "false"},
                headers=auth,
            ).json()
            presigned = described["url"]
            assert "X-Amz-Signature=" in presigned
            secrets.append(presigned.split("X-Amz-Signature=")[1].split("&")[0])
            assert httpx.get(presigned).content == data
            httpx.get(f"{srv.url}/v1/files/x/content?{urlsplit(presigned).query}")  # someone pastes it here
        lines = srv.access()
        everything = srv.log.read_text()

    assert all(len(s) >= 16 for s in secrets)
    for secret in secrets:
        assert secret not in everything, f"a secret reached the log: {secret[:6]}…"
    assert "X-Amz-Signature=" not in everything and "sig=" not in everything
    upload = [e for e in lines if e["request_id"] == "req-upload-1"]
    assert len(upload) == 1
    line = upload[0]
    assert line["key"] == "ops-team" and line["route"] == "/v1/files" and line["status"] == 201
    assert line["method"] == "POST" and line["bytes_in"] == len(data) and line["bytes_out"] > 0
    assert line["duration_ms"] >= 0
    statuses = [e["status"] for e in lines]
    assert statuses.count(401) >= 2 and statuses.count(403) >= 1
    for entry in lines:
        assert len(entry["request_id"]) >= 1 and entry["route"] and "?" not in entry["route"]


def test_redaction_masks_secrets_in_any_message() -> None:
    token = new_token()
    text = redact(
        f"GET /v1/files/f_1/content?exp=1&kid=t&sig=SIGVALUE123 Authorization: Bearer {token} "
        "https://s3/b/k?X-Amz-Credential=AKIA%2F&X-Amz-Signature=abcdef0123 {'authorization': 'AWS4-HMAC-SHA256 x'} "
        f"key {token}"
    )
    for secret in ("SIGVALUE123", token, "abcdef0123", "AKIA", "AWS4-HMAC-SHA256 x"):
        assert secret not in text
    assert "sig=[redacted]" in text and "X-Amz-Signature=[redacted]" in text


# --- readiness ---


def wait_ready(url: str, within: float = 30.0) -> httpx.Response:
    """The first 200 of ``/readyz``; fails with the last answer if none came ``within`` seconds."""
    deadline = time.monotonic() + within
    while (ready := httpx.get(f"{url}/readyz")).status_code != 200:
        assert time.monotonic() < deadline, ready.text
        time.sleep(0.05)
    return ready


def test_readyz_probes_storage_and_sweeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", signing_keys=SIGNING, readiness_probe_interval=0.01, session_gc_interval=0.1
    )
    with running(settings) as live:
        # every sweep must have run within 3 intervals + 1 s: on a loaded machine the first answer may come before
        # a slow first run of one of them, so wait (bounded) for the replica to become ready
        ready = wait_ready(live.url)
        checks = ready.json()["checks"]
        assert checks["storage"] == "ok" and checks["sweep:uploads"] == "ok"
        assert set(checks.values()) == {"ok"}  # every sweep of Services.maintenance is watched
        # storage that refuses writes (its temporary directory replaced by a file): not ready; then ready again
        tmp = live.data_dir / "tmp"
        shutil.rmtree(tmp)
        tmp.write_bytes(b"")
        time.sleep(0.02)
        broken = httpx.get(f"{live.url}/readyz")
        assert broken.status_code == 503 and broken.json()["checks"]["storage"] != "ok"
        assert httpx.get(f"{live.url}/healthz").status_code == 200  # still alive: liveness is not readiness
        tmp.unlink()
        tmp.mkdir()
        time.sleep(0.02)
        wait_ready(live.url)
        # the probe writes one reserved object, always the same
        assert [o for o in live.objects() if "readyz" in o] in ([], ["readyz/probe"])

        # a sweep that hangs (a fault no request can cause): readiness says which one, once 3 intervals passed
        async def hang() -> dict[str, int]:
            import asyncio

            await asyncio.Event().wait()
            return {}

    # the sweeps are bound when the services start: a replica whose uploads sweep hangs from the start
    from transfer.service.uploads.lifecycle import UploadLifecycle

    monkeypatch.setattr(UploadLifecycle, "sweep", lambda self: hang())
    with running(settings) as live:
        deadline = time.monotonic() + 30
        while (stuck := httpx.get(f"{live.url}/readyz")).status_code == 200:
            assert time.monotonic() < deadline, "a hung sweep never made the replica unready"
            time.sleep(0.1)
        assert stuck.status_code == 503 and stuck.json()["checks"]["sweep:uploads"].startswith("no run for")


# --- graceful shutdown ---


def _open_upload(url: str, declared: int) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=120)
    s.sendall(
        f"POST /v1/files?name=up.bin HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {declared}\r\n\r\n".encode()
    )
    return s


def _response(s: socket.socket) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of the one response on ``s`` (read to the end: the server closes after it)."""
    raw = b""
    while chunk := s.recv(65536):
        raw += chunk
        head, sep, body = raw.partition(b"\r\n\r\n")
        if sep:
            length = next(
                (int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), None
            )
            if length is not None and len(body) >= length:
                break
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_sigterm_finishes_uploads_within_the_grace_and_aborts_the_rest(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = {"TRANSFER_SHUTDOWN_DRAIN": "2", "TRANSFER_SHUTDOWN_GRACE": "20"}
    s3: Any = None
    if backend == "s3":
        env.update(request.getfixturevalue("s3_env"))
        s3 = (request.getfixturevalue("s3_endpoint"), env["TRANSFER_S3_BUCKET"])
    # S3: a body of unknown final size is sent in parts of 7 MiB (64 GiB in at most 10,000 parts)
    finishing, abandoned = os.urandom(20 * MiB), os.urandom(20 * MiB)
    with serve(tmp_path, env) as srv:
        assert httpx.get(f"{srv.url}/readyz").status_code == 200
        with _open_upload(srv.url, len(finishing)) as a, _open_upload(srv.url, len(abandoned)) as b:
            a.sendall(finishing[: 10 * MiB])
            b.sendall(abandoned[: 10 * MiB])  # more than a part: on S3 a multipart upload is under way
            if s3 is not None:
                deadline = time.monotonic() + 30
                while len(in_progress_uploads(*s3)) < 2:
                    assert time.monotonic() < deadline, "the uploads never started their multipart uploads"
                    time.sleep(0.05)

            srv.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            while httpx.get(f"{srv.url}/readyz").status_code != 503:  # readiness turns false first
                assert time.monotonic() < deadline
                time.sleep(0.02)
            draining = httpx.get(f"{srv.url}/readyz")
            assert draining.json()["checks"]["shutdown"] == "draining"

            a.sendall(finishing[10 * MiB :])  # the upload in flight completes during the grace
            status, descriptor = _response(a)
            assert status == 201, descriptor
            assert descriptor["checksum"] == "sha256:" + hashlib.sha256(finishing).hexdigest()
            # the other never finishes: at the end of the grace it is stopped, told why, and nothing of it is kept
            status, error = _response(b)
            assert status == 503 and error["error"]["code"] == "shutting_down"
            assert srv.proc.wait(60) == 0
        lines = srv.lines()

    assert any("stopped 1 request" in e["message"] for e in lines)
    file_id = descriptor["metadata"]["file_id"]
    if s3 is None:
        assert sorted(p.name for p in (srv.data_dir / "tmp").iterdir()) == []  # no partial temporary file
        files = stored_keys(srv.data_dir, "files/")
    else:
        assert in_progress_uploads(*s3) == []  # no orphaned multipart upload
        listing = s3_client(s3[0]).list_objects_v2(Bucket=s3[1]).get("Contents", [])
        files = [o["Key"] for o in listing if "files/" in o["Key"]]
    assert files and all(file_id in key for key in files), files  # only the finished upload was published
