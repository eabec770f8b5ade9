"""A real S3-compatible server on loopback for the tests and the benchmarks: OpenStack Swift with its s3api and
tempauth middleware.

MinIO cannot be installed on these machines; moto checks no presigned signature and holds bodies in memory. Swift
streams to disk and verifies SigV4, presigned URLs included. It is installed from PyPI into a virtual environment
of its own (``.cache/swift-venv``: eventlet stays out of the project's environment), configured as one node with one
replica under a throwaway directory, and every process it starts is stopped on exit, even on failure.

Run ``python -m devtools.s3server`` to keep one running by hand (prints the endpoint and credentials).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from devtools.ports import free_ports

SWIFT_VERSION = "2.38.3"
ACCESS_KEY = "test:tester"
SECRET_KEY = "swift-s3api-testing"  # 8+ characters: the service refuses shorter bucket secrets
REGION = "us-east-1"
REPO = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("TRANSFER_SWIFT_VENV", REPO / ".cache" / "swift-venv"))


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    access_key: str
    secret_key: str
    region: str
    engine: str = "s3"  # "swift", "ceph", or "s3" for an endpoint named from outside


def s3_client(endpoint: S3Endpoint) -> Any:
    """A boto3 client for ``endpoint`` (SigV4, path-style addressing: what the service itself uses)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        aws_access_key_id=endpoint.access_key,
        aws_secret_access_key=endpoint.secret_key,
        region_name=endpoint.region,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


def ensure_swift() -> Path:
    """The bin directory of a virtual environment with Swift installed (installed on first use)."""
    bin_dir = VENV / "bin"
    if not (bin_dir / "swift-proxy-server").exists():
        VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            [str(bin_dir / "pip"), "install", "--quiet", "--disable-pip-version-check", f"swift=={SWIFT_VERSION}"],
            check=True,
        )
    return bin_dir


def _defaults(etc: Path, port: int) -> str:
    """The [DEFAULT] section every Swift server of the test node shares: loopback, one process, quiet logs."""
    return f"""[DEFAULT]
bind_ip = 127.0.0.1
bind_port = {port}
workers = 0
swift_dir = {etc}
log_level = WARNING
log_udp_host = 127.0.0.1
log_udp_port = 9
"""


def _server_conf(etc: Path, srv: Path, port: int, kind: str) -> Path:
    conf = etc / f"{kind}-server.conf"
    conf.write_text(
        _defaults(etc, port)
        + f"""devices = {srv}
mount_check = false

[pipeline:main]
pipeline = {kind}-server

[app:{kind}-server]
use = egg:swift#{kind}
"""
    )
    return conf


PIPELINE = (
    "catch_errors gatekeeper healthcheck proxy-logging listing_formats s3api tempauth copy slo dlo proxy-logging "
    "proxy-server"
)


def _proxy_conf(etc: Path, port: int) -> Path:
    conf = etc / "proxy-server.conf"
    conf.write_text(
        _defaults(etc, port)
        + f"""
[pipeline:main]
pipeline = {PIPELINE}

[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
allow_account_management = true

[filter:s3api]
use = egg:swift#s3api
location = {REGION}
max_upload_part_num = 10000

[filter:tempauth]
use = egg:swift#tempauth
user_test_tester = {SECRET_KEY} .admin

[filter:slo]
use = egg:swift#slo
max_manifest_segments = 10000

[filter:dlo]
use = egg:swift#dlo

[filter:copy]
use = egg:swift#copy

[filter:catch_errors]
use = egg:swift#catch_errors

[filter:gatekeeper]
use = egg:swift#gatekeeper

[filter:healthcheck]
use = egg:swift#healthcheck

[filter:proxy-logging]
use = egg:swift#proxy_logging

[filter:listing_formats]
use = egg:swift#listing_formats
"""
    )
    return conf


@contextmanager
def swift_s3_server(base: Path | None = None) -> Iterator[S3Endpoint]:
    """Start Swift (account, container, object and proxy servers) with s3api on loopback ports."""
    bin_dir = ensure_swift()
    owned = base is None
    root = Path(tempfile.mkdtemp(prefix="swift-s3-")) if base is None else base
    etc, srv = root / "etc", root / "srv"
    (srv / "sdb1").mkdir(parents=True, exist_ok=True)
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "swift.conf").write_text(
        "[swift-hash]\nswift_hash_path_suffix = transfer-tests\nswift_hash_path_prefix = transfer-tests\n\n"
        "[storage-policy:0]\nname = gold\ndefault = yes\n\n"
        "[swift-constraints]\nmax_file_size = 5368709122\n"
    )
    proxy_port, account_port, container_port, object_port = free_ports(4)
    for kind, port in (("account", account_port), ("container", container_port), ("object", object_port)):
        builder = f"{kind}.builder"
        ring = [str(bin_dir / "swift-ring-builder"), builder]
        subprocess.run([*ring, "create", "10", "1", "1"], cwd=etc, check=True, capture_output=True)
        subprocess.run([*ring, "add", f"r1z1-127.0.0.1:{port}/sdb1", "100"], cwd=etc, check=True, capture_output=True)
        subprocess.run([*ring, "rebalance"], cwd=etc, check=True, capture_output=True)
    confs = [
        ("account", _server_conf(etc, srv, account_port, "account")),
        ("container", _server_conf(etc, srv, container_port, "container")),
        ("object", _server_conf(etc, srv, object_port, "object")),
        ("proxy", _proxy_conf(etc, proxy_port)),
    ]
    procs: list[subprocess.Popen[bytes]] = []
    log = open(root / "swift.log", "ab")  # noqa: SIM115 - closed below
    try:
        for kind, conf in confs:
            procs.append(
                subprocess.Popen(
                    [str(bin_dir / f"swift-{kind}-server"), str(conf)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        url = f"http://127.0.0.1:{proxy_port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthcheck", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            dead = [p for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError("Swift did not start:\n" + (root / "swift.log").read_text()[-3000:])
            time.sleep(0.1)
        yield S3Endpoint(url, ACCESS_KEY, SECRET_KEY, REGION, engine="swift")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        log.close()
        if owned:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    with swift_s3_server() as endpoint:
        print(f"endpoint {endpoint.url}  access key {endpoint.access_key}  secret {endpoint.secret_key}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
