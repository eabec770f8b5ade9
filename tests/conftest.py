"""Shared fixtures: settings on a temp directory, the in-process app, and a real uvicorn server on loopback."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from fastapi import FastAPI

from devtools.ceph import CephCluster, ceph_cluster, ceph_missing
from devtools.s3server import S3Endpoint, s3_client, swift_s3_server
from devtools.serving import ThreadServer, serve_in_thread
from tests.layout import stored_keys
from transfer import metrics
from transfer.hosts import create_app
from transfer.settings import Settings

# `transfer serve` processes the tests start end with SIGTERM: without the drain (readiness 503 while still accepting,
# for load balancers) each would take 5 s to stop. tests/ops/test_observability.py sets it where it is the subject.
os.environ.setdefault("TRANSFER_SHUTDOWN_DRAIN", "0")
# An engine without atomic compare-and-set (Swift's s3api) refuses replicas unless told the process runs alone. The
# tests' servers on Swift say so (the test that checks the refusal clears it); servers on Ceph, the engine the
# replica tests run on, have the compare-and-set and do not need it.
os.environ.setdefault("TRANSFER_SINGLE_REPLICA", "true")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    """A clock the tests move by hand (Unix seconds)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", signing_keys={"test": "0123456789abcdef0123456789abcdef"})


@pytest.fixture
def app(settings: Settings, clock: Clock) -> FastAPI:
    return create_app(settings, clock=clock)


T = TypeVar("T")


@dataclass
class LiveServer:
    url: str
    app: FastAPI
    settings: Settings
    server: ThreadServer | None = None

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` (a call into ``app.state.services``) on the server's event loop, where the services'
        locks and clients live; awaited from the test's loop. Calling them from the test's loop directly races
        the server thread on the same asyncio objects ("bound to a different event loop" under load)."""
        if self.server is None:
            work.close()
            raise RuntimeError("not served by serving(): await the services directly")
        return await self.server.call(work)

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    def leftovers(self) -> list[str]:
        """Files under tmp/ — must be empty once no upload is in flight."""
        tmp = self.data_dir / "tmp"
        return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []

    def objects(self) -> list[str]:
        """The keys of every object stored (read from the data directory)."""
        return stored_keys(self.data_dir)


def wait_indexed(base_url: str, file_id: str, timeout: float = 30.0) -> None:
    """Until the service has checked and indexed file ``file_id``'s chunks (its manifest answers 200): the default
    deduplicating upload leaves that to the service after its answer (``Prefer: respond-async``), so a test whose
    next upload relies on the index waits for it first, as a client that uploads its next version later would."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base_url, timeout=10) as http:
        while (status := http.get(f"/v1/files/{file_id}/chunks").status_code) != 200:
            assert status == 404 and time.monotonic() < deadline, f"file {file_id} was never indexed ({status})"
            time.sleep(0.02)


def requests_ended(method: str, route: str) -> float:
    """Requests of ``method`` on the route template ``route`` that this process's servers have ended (answered, or
    given up on when the client left): wait for it to grow before checking what a request left behind, since
    checked earlier, nothing may have been written yet."""
    return sum(
        sample.value
        for metric in metrics.requests.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and (sample.labels["method"], sample.labels["route"]) == (method, route)
    )


@pytest.fixture
def live_server(app: FastAPI, settings: Settings) -> Iterator[LiveServer]:
    """The app served by a real uvicorn (uvloop + httptools) on a loopback port, in a thread."""
    with serving(app, settings) as live:
        yield live


@pytest.fixture
def http(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.url, timeout=30) as client:
        yield client


# --- S3: a real S3-compatible server (Swift's s3api, started here) or the endpoint named by the environment ---

S3_ENV = "TRANSFER_TEST_S3_ENDPOINT"


@pytest.fixture(scope="session")
def swift_endpoint() -> Iterator[S3Endpoint]:
    """``TRANSFER_TEST_S3_ENDPOINT`` (+ ``TRANSFER_TEST_S3_ACCESS_KEY``, ``..._SECRET_KEY``, ``..._REGION``), e.g. the
    MinIO of ``docker compose up``; otherwise a Swift s3api server started for this test session."""

    if os.environ.get(S3_ENV):
        yield S3Endpoint(
            os.environ[S3_ENV],
            os.environ.get("TRANSFER_TEST_S3_ACCESS_KEY", "transfer"),
            os.environ.get("TRANSFER_TEST_S3_SECRET_KEY", "transfer-secret"),
            os.environ.get("TRANSFER_TEST_S3_REGION", "us-east-1"),
        )
        return
    with swift_s3_server() as endpoint:
        yield endpoint


def _ceph(release: str) -> Iterator[CephCluster]:
    reason = ceph_missing(release)
    if reason:
        pytest.skip(reason)
    with ceph_cluster(gateways=2, release=release) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def ceph16() -> Iterator[CephCluster]:
    """A throw-away Ceph 16.2 cluster (Debian 12's packages: one monitor, one memstore OSD, two RADOS Gateways) for
    this test session; the tests that need it skip, saying why, on a machine that cannot run it."""
    yield from _ceph("16.2")


@pytest.fixture(scope="session")
def ceph20() -> Iterator[CephCluster]:
    """The same with Ceph 20.2, the current release, from a Debian sid root made on first use (devtools/sidroot.py;
    the first worker to ask makes it, about two minutes, the others wait for it)."""
    yield from _ceph("20.2")


CEPH = [pytest.param(name, marks=pytest.mark.ceph) for name in ("ceph16", "ceph20")]


@pytest.fixture(scope="session", params=CEPH)
def ceph(request: pytest.FixtureRequest) -> CephCluster:
    """Each Ceph release in turn (a test that takes ``ceph`` runs on both): 16.2, end of life but what Debian 12
    carries, and 20.2, which honours conditions on CompleteMultipartUpload and verifies part checksums."""
    cluster: CephCluster = request.getfixturevalue(request.param)
    return cluster


# The tests that say something about the engine run on each: ``@ON_ENGINES`` (or ``params=ENGINES`` in a module's
# own ``s3_endpoint``); every other S3 test runs on the session's default engine (Swift, or the named endpoint).
ENGINES = ["swift", *CEPH]
ON_ENGINES = pytest.mark.parametrize("s3_endpoint", ENGINES, indirect=True)


def engine_endpoint(request: pytest.FixtureRequest, engine: str) -> S3Endpoint:
    if engine.startswith("ceph"):
        cluster: CephCluster = request.getfixturevalue(engine)
        return cluster.endpoint
    endpoint: S3Endpoint = request.getfixturevalue("swift_endpoint")
    return endpoint


@pytest.fixture(scope="session")
def s3_endpoint(request: pytest.FixtureRequest) -> S3Endpoint:
    """The S3 engine of the test: Swift (or the named endpoint) unless parametrized with ``ENGINES``."""
    return engine_endpoint(request, getattr(request, "param", "swift"))


def in_progress_uploads(endpoint: Any, bucket: str) -> list[Any]:
    uploads: list[Any] = s3_client(endpoint).list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return uploads


@pytest.fixture
def s3_bucket(s3_endpoint: Any) -> Iterator[str]:
    """A fresh, empty bucket; emptied and removed afterwards."""
    client = s3_client(s3_endpoint)
    name = f"t-{uuid.uuid4().hex[:20]}"
    client.create_bucket(Bucket=name)
    yield name
    for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
        client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=name, Key=item["Key"])
    client.delete_bucket(Bucket=name)


def operator_says_atomic(endpoint: Any) -> bool:
    """What the tests' configuration says of the engine's compare-and-set: "no" for Swift (its probes see it too,
    but the race probe of create-if-absent can be won by one writer by chance); elsewhere the probes decide."""
    return getattr(endpoint, "engine", "s3") != "swift"


def s3_config(endpoint: Any, bucket: str, **overrides: Any) -> Any:
    from storage.s3 import S3Config

    overrides.setdefault("atomic_if_absent", operator_says_atomic(endpoint))  # Swift's check is not atomic
    overrides.setdefault("atomic_if_match", operator_says_atomic(endpoint))  # Swift refuses If-Match on PUT
    return S3Config(
        bucket=bucket,
        endpoint_url=endpoint.url,
        region=endpoint.region,
        access_key_id=endpoint.access_key,
        secret_access_key=endpoint.secret_key,
        addressing_style="path",
        **overrides,
    )


@pytest.fixture
def s3_env(s3_endpoint: Any, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Settings for the service on the test bucket, the way a deployment sets them (TRANSFER_* and AWS_*)."""
    env = {
        "TRANSFER_STORAGE": "s3",
        "TRANSFER_S3_BUCKET": s3_bucket,
        "TRANSFER_S3_ENDPOINT_URL": s3_endpoint.url,
        "TRANSFER_S3_ADDRESSING_STYLE": "path",
        "TRANSFER_S3_PART_SIZE": str(5 << 20),
        "TRANSFER_S3_ATOMIC_IF_ABSENT": "true" if operator_says_atomic(s3_endpoint) else "false",
        "TRANSFER_S3_ATOMIC_IF_MATCH": "true" if operator_says_atomic(s3_endpoint) else "false",
        "AWS_ACCESS_KEY_ID": s3_endpoint.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret_key,
        "AWS_REGION": s3_endpoint.region,
        # on a bucket the signing keys are configured, never kept in it (every replica of a test gets this one)
        "TRANSFER_SIGNING_KEYS": '{"t": "0123456789abcdef0123"}',
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@contextmanager
def serving(app: FastAPI, settings: Settings) -> Iterator[LiveServer]:
    """``app`` served by uvicorn on a loopback port, in a thread, for the block's duration."""
    url, server, thread = serve_in_thread(app)
    try:
        yield LiveServer(url, app, settings, server)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def running(settings: Settings, clock: Any = None) -> Iterator[LiveServer]:
    """The app built from ``settings``, served for the block's duration."""
    with serving(create_app(settings, clock=clock or time.time), settings) as live:
        yield live


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def server(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    """A live server on local storage, and again on the S3 test server (tests using it run on both)."""
    extra: dict[str, Any] = {}
    if request.param == "s3":
        request.getfixturevalue("s3_env")  # TRANSFER_STORAGE=s3 and friends in the environment
        extra = {"storage": "s3"}
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        live_read_timeout=5,
        session_gc_interval=0.2,
        **extra,
    )
    with running(settings, clock) as live:
        yield live
