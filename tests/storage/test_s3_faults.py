"""The S3 backend behind a fault proxy (in front of the S3 test server): resets, 503 SlowDown and stalls are retried
where safe; a CompleteMultipartUpload that keeps failing is a clear error. Never a partial or corrupted object, never
an orphaned multipart upload. The tests that touch what engines do differently (completion, listing and aborting
abandoned multipart uploads) run on Swift's s3api and on Ceph's RADOS Gateway, 16.2 and 20.2."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from storage.errors import BackendUnavailable, ObjectNotFound
from storage.s3 import S3Storage
from tests.conftest import ON_ENGINES, in_progress_uploads, operator_says_atomic, running, s3_config
from tests.faultproxy import FaultProxy
from tests.storage_conformance import put, read_all
from transfer.settings import Settings

pytestmark = [pytest.mark.anyio, pytest.mark.s3]
MiB = 1 << 20


@pytest.fixture
def proxy(s3_endpoint: Any) -> Iterator[FaultProxy]:
    parts = urlsplit(s3_endpoint.url)
    fault_proxy = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 80), stall_seconds=3.0).start()
    yield fault_proxy
    fault_proxy.stop()


class _Via:
    def __init__(self, endpoint: Any, url: str) -> None:
        self.url, self.access_key, self.secret_key, self.region, self.engine = (
            url,
            endpoint.access_key,
            endpoint.secret_key,
            endpoint.region,
            endpoint.engine,
        )


class _Nowhere:
    url, access_key, secret_key, region, engine = "http://127.0.0.1:9", "k", "s", "us-east-1", "swift"


@pytest.fixture
async def storage(s3_endpoint: Any, s3_bucket: str, proxy: FaultProxy) -> AsyncIterator[S3Storage]:
    config = s3_config(
        _Via(s3_endpoint, proxy.url),
        s3_bucket,
        part_size=5 * MiB,
        buffer_size=256 << 10,
        read_timeout=1.0,
        max_attempts=4,
    )
    backend = S3Storage(config)
    await backend.start()
    yield backend
    await backend.close()
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []  # no orphaned multipart upload, whatever happened


async def test_resets_and_slowdowns_are_retried(storage: S3Storage, proxy: FaultProxy) -> None:
    data = os.urandom(12 * MiB)  # three parts
    proxy.add("UploadPart", "reset", times=2)
    proxy.add("UploadPart", "slowdown", times=1)
    proxy.add("CreateMultipartUpload", "slowdown", times=1)
    proxy.add("CompleteMultipartUpload", "internal", times=1)
    await put(storage, "files/retried", data)
    assert hashlib.sha256(await read_all(storage, "files/retried")).digest() == hashlib.sha256(data).digest()
    faults = [f for _, f in proxy.log if f != "forwarded"]
    assert sorted(faults) == ["internal", "reset", "reset", "slowdown", "slowdown"]

    small = os.urandom(100_000)
    proxy.add("PutObject", "slowdown", times=2)
    await put(storage, "files/small", small)
    assert await read_all(storage, "files/small") == small


async def test_stalled_reads_time_out_and_are_retried(storage: S3Storage, proxy: FaultProxy) -> None:
    data = os.urandom(2 * MiB)
    await put(storage, "files/stall", data)
    proxy.add("GetObject", "stall", times=1)
    assert await read_all(storage, "files/stall") == data  # 1 s read timeout, then a retry
    assert ("GetObject", "stall") in proxy.log


@ON_ENGINES
async def test_complete_that_keeps_failing_is_a_clear_error(storage: S3Storage, proxy: FaultProxy) -> None:
    proxy.add("CompleteMultipartUpload", "error200", times=-1)  # S3's "200 OK" with an error inside
    with pytest.raises(BackendUnavailable):
        await put(storage, "files/never", os.urandom(11 * MiB))
    with pytest.raises(ObjectNotFound):
        await storage.stat("files/never")
    assert any(op == "AbortMultipartUpload" for op, _ in proxy.log)


async def test_an_endpoint_that_never_answers_fails_in_bounded_time(
    s3_endpoint: Any, s3_bucket: str, proxy: FaultProxy
) -> None:
    # botocore alone would make all 20 attempts, 1 s of read timeout each plus a backoff of up to 20 s between
    # them: minutes. The call budget (6 s) lets a retry start only if it can end in time: one or two attempts.
    config = s3_config(
        _Via(s3_endpoint, proxy.url), s3_bucket, read_timeout=1.0, connect_timeout=1.0, max_attempts=20, call_budget=6.0
    )
    storage = S3Storage(config)
    await storage.start()
    try:
        proxy.add("PutObject", "stall", times=-1)
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await put(storage, "files/stuck", os.urandom(1000))
        elapsed = time.monotonic() - started
        attempts = sum(1 for op, fault in proxy.log if (op, fault) == ("PutObject", "stall"))
        assert 1 <= attempts <= 2, proxy.log
        assert elapsed < 30, elapsed  # generous (the budget is 6 s), and far below botocore's own minutes
        proxy.rules.clear()
        with pytest.raises(ObjectNotFound):
            await storage.stat("files/stuck")
    finally:
        await storage.close()


def test_a_budget_that_cannot_hold_one_attempt_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="call_budget"):
        S3Storage(s3_config(_Via(_Nowhere(), "http://127.0.0.1:9"), "b", read_timeout=20.0, call_budget=10.0))
    with pytest.raises(ValueError, match="TRANSFER_S3_CALL_BUDGET"):
        Settings(data_dir=tmp_path, s3_read_timeout=40.0, s3_call_budget=30.0)


async def test_service_answers_503_in_bounded_time_when_the_gateway_hangs(
    s3_endpoint: Any, s3_bucket: str, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in {
        "AWS_ACCESS_KEY_ID": s3_endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_key,
        "AWS_REGION": s3_endpoint.region,
    }.items():
        monkeypatch.setenv(k, v)
    settings = Settings(
        data_dir=tmp_path / "data",
        storage="s3",
        s3_bucket=s3_bucket,
        s3_endpoint_url=proxy.url,
        s3_addressing_style="path",
        s3_atomic_if_absent=operator_says_atomic(s3_endpoint),
        s3_atomic_if_match=operator_says_atomic(s3_endpoint),
        single_replica=not operator_says_atomic(s3_endpoint),
        s3_connect_timeout=1.0,
        s3_read_timeout=1.0,
        s3_max_attempts=20,
        s3_call_budget=6.0,
        signing_keys={"t": "0123456789abcdef0123"},
    )
    with running(settings) as live:
        for op in ("PutObject", "GetObject", "HeadObject", "UploadPart", "CreateMultipartUpload"):
            proxy.add(op, "stall", times=-1)
        before = len(proxy.log)
        async with httpx.AsyncClient(timeout=120) as http:
            started = time.monotonic()
            response = await http.post(f"{live.url}/v1/files", params={"name": "x.bin"}, content=os.urandom(100_000))
            elapsed = time.monotonic() - started
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "storage_unavailable"
        seen = zip(proxy.log[before:], proxy.targets[before:], strict=True)
        # (the sweeps' listings may stall meanwhile too: not the request's)
        stalled = [op for (op, fault), (_, target) in seen if fault == "stall" and "list-type" not in target]
        # every storage call of the request (the publication and its clean-up) gets at most two attempts, and
        # the service retries none of them (botocore alone: 20 attempts per call, 43 requests in 79 s)
        assert 1 <= len(stalled) <= 6, stalled
        assert elapsed < 60, elapsed


async def test_service_answers_503_and_stores_nothing(
    s3_endpoint: Any, s3_bucket: str, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in {
        "AWS_ACCESS_KEY_ID": s3_endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_key,
        "AWS_REGION": s3_endpoint.region,
    }.items():
        monkeypatch.setenv(k, v)
    settings = Settings(
        data_dir=tmp_path / "data",
        storage="s3",
        s3_bucket=s3_bucket,
        s3_endpoint_url=proxy.url,
        s3_addressing_style="path",
        s3_atomic_if_absent=False,
        s3_atomic_if_match=False,  # Swift's s3api refuses If-Match on PUT
        signing_keys={"t": "0123456789abcdef0123"},
    )
    with running(settings) as live:
        proxy.add("CompleteMultipartUpload", "internal", times=-1)
        async with httpx.AsyncClient(timeout=60) as http:
            response = await http.post(f"{live.url}/v1/files", params={"name": "x.bin"}, content=os.urandom(20 * MiB))
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "storage_unavailable"
            assert (await http.get(f"{live.url}/v1/files")).json()["files"] == []
            proxy.rules.clear()
            data = os.urandom(9 * MiB)
            proxy.add("UploadPart", "reset", times=1)
            ok = await http.post(f"{live.url}/v1/files", params={"name": "y.bin"}, content=data)
            assert ok.status_code == 201
            assert (await http.get(ok.json()["url"])).content == data
    assert in_progress_uploads(s3_endpoint, s3_bucket) == []


def _send_part_of_an_upload(url: str, declared: int, sent: int) -> int:
    """Send the head and ``sent`` bytes of a ``declared``-byte upload, then vanish. A server that goes away first
    (killed: the point of some tests) ends it early: that is an outcome here, not an error, and it must not escape
    from a sender thread (pytest reports it as an unhandled thread exception, an error under -W error).
    Returns the body bytes sent."""
    host, port = url.removeprefix("http://").split(":")
    done = 0
    try:
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                f"POST /v1/files HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/octet-stream\r\n"
                f"Content-Length: {declared}\r\n\r\n".encode()
            )
            block = os.urandom(1 << 20)
            for _ in range(sent >> 20):
                s.sendall(block)
                done += len(block)
    except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError):
        pass
    return done


def _wait(condition: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


def test_client_gone_mid_upload_on_s3_leaves_no_multipart_upload(
    s3_env: dict[str, str], s3_endpoint: Any, s3_bucket: str, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})
    with running(settings) as live:
        _send_part_of_an_upload(live.url, 40 * MiB, 16 * MiB)  # parts were on their way, then the client vanished
        _wait(lambda: in_progress_uploads(s3_endpoint, s3_bucket) == [])
        assert httpx.get(f"{live.url}/v1/files").json()["files"] == []


@ON_ENGINES
def test_server_killed_mid_upload_leaves_an_upload_the_sweeper_aborts(
    s3_env: dict[str, str], s3_endpoint: Any, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from devtools.serving import free_port
    from tests.uploads.test_sessions_resume import start_server

    url = f"http://127.0.0.1:{free_port()}"
    first = start_server(url, tmp_path / "data")
    try:
        sender = threading.Thread(target=_send_part_of_an_upload, args=(url, 60 * MiB, 30 * MiB), daemon=True)
        sender.start()
        _wait(lambda: in_progress_uploads(s3_endpoint, s3_bucket) != [])
        first.send_signal(signal.SIGKILL)  # nobody is left to complete or abort it
        first.wait()
        sender.join(30)  # it ends with the server: nothing of this test runs on into the next
        assert not sender.is_alive()
    finally:
        if first.poll() is None:
            first.kill()
    assert in_progress_uploads(s3_endpoint, s3_bucket) != []  # orphaned, for now
    monkeypatch.setenv("TRANSFER_S3_ABANDONED_UPLOAD_AGE", "0.5")
    monkeypatch.setenv("TRANSFER_SESSION_GC_INTERVAL", "0.3")
    second = start_server(url, tmp_path / "data")
    try:
        _wait(lambda: in_progress_uploads(s3_endpoint, s3_bucket) == [])
        assert httpx.get(f"{url}/v1/files").json()["files"] == []  # and nothing half-published
    finally:
        second.kill()
        second.wait()
