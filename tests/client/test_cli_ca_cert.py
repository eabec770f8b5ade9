"""The command line against an HTTPS service whose certificate comes from a private CA.

Without being told about the CA the client must say what is wrong and how to fix it (not "unreachable"); with
``--ca-cert`` or ``SSL_CERT_FILE`` it uploads and resolves as over plain HTTP. A real ``transfer serve`` with a
certificate from a test CA (trustme), driven by the ``transfer`` command in subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from devtools.ports import free_port

pytestmark = pytest.mark.e2e


def transfer(*args: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR", "TRANSFER_SERVER")}
    return subprocess.run(
        [sys.executable, "-m", "transfer", *args],
        env={**base, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def https_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``transfer serve`` over TLS with a certificate of a CA nobody trusts by default; yields its URL and the CA."""
    where = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = where / "cert.pem", where / "key.pem", where / "ca.pem"
    leaf.private_key_pem.write_to_path(str(key))
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    ca.cert_pem.write_to_path(str(ca_file))
    port = free_port()
    log = where / "server.log"
    command = [sys.executable, "-m", "transfer", "serve", "--port", str(port), "--data-dir", str(where / "data")]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*command, "--tls-cert", str(cert), "--tls-key", str(key)], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"https://127.0.0.1:{port}"
    trusting = ssl.create_default_context(cafile=str(ca_file))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", verify=trusting, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        yield url, ca_file
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_untrusted_certificate_is_named_with_the_way_to_trust_it(
    https_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = https_server
    (tmp_path / "f.bin").write_bytes(b"x" * 2000)
    done = transfer("upload", "--server", url, "f.bin", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("transfer: untrusted_certificate: ") and "--ca-cert" in done.stderr, done.stderr
    assert "SSL_CERT_FILE" in done.stderr and "unreachable" not in done.stderr


def test_ca_cert_and_ssl_cert_file_each_make_the_private_ca_trusted(
    https_server: tuple[str, Path], tmp_path: Path
) -> None:
    url, ca_file = https_server
    data = os.urandom(3 << 20)
    (tmp_path / "f.bin").write_bytes(data)
    done = transfer("upload", "--url", "--server", url, "--ca-cert", str(ca_file), "f.bin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    descriptor = json.loads(done.stdout)
    assert (
        descriptor["url"].startswith(f"{url}/")
        and descriptor["checksum"] == f"sha256:{hashlib.sha256(data).hexdigest()}"
    )
    (tmp_path / "d.json").write_text(done.stdout)

    resolved = transfer("resolve", "d.json", "-o", "out.bin", "--ca-cert", str(ca_file), cwd=tmp_path)
    assert resolved.returncode == 0, resolved.stderr
    assert (tmp_path / "out.bin").read_bytes() == data

    listed = transfer("ls", "--server", url, env={"SSL_CERT_FILE": str(ca_file)}, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert descriptor["metadata"]["file_id"] in listed.stdout


def test_a_ca_cert_that_is_not_a_certificate_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "not.pem").write_text("hello")
    done = transfer("ls", "--server", "https://127.0.0.1:9", "--ca-cert", "not.pem", cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("transfer: invalid_usage: --ca-cert not.pem"), done.stderr
