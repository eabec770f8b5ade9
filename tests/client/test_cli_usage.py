"""The ``transfer`` command's promises to the person at the terminal: a usage error is one line, ``-`` means stdout,
a chunked upload names its session and a reader can follow it with the descriptor the CLI prints, and a server
never starts on a port it cannot have."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.e2e import service

MiB = 1 << 20


def run(*args: str, cwd: Path | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "transfer", *args], capture_output=True, timeout=120, cwd=cwd, input=stdin
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("serve")
    with service(workdir, env={**os.environ, "TRANSFER_URL_TTL": "600"}) as (url, _pid):
        yield url


@pytest.mark.parametrize(
    "argv",
    [
        ("upload",),  # a required argument missing
        ("resolve", "d.json", "--connections", "many"),  # a bad value
        ("serve", "--storage", "floppy"),  # a bad choice
        ("frobnicate",),  # no such command
        ("session",),  # a sub-command missing
        ("upload", "x", "--no-such-flag"),  # an unknown flag
    ],
)
def test_usage_errors_are_one_line(argv: tuple[str, ...], tmp_path: Path) -> None:
    out = run(*argv, cwd=tmp_path)
    lines = out.stderr.decode().strip().splitlines()
    assert out.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("transfer: invalid_usage: "), out.stderr
    assert not lines[0].startswith("usage:")  # not argparse's usage block


@pytest.mark.parametrize("size", [100, 3 * MiB + 7])  # inline and url mode
def test_dash_output_is_stdout(server: str, tmp_path: Path, size: int) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(size)
    src.write_bytes(data)
    up = run("upload", "--server", server, str(src))
    assert up.returncode == 0, up.stderr
    out = run("resolve", "-", "-o", "-", cwd=tmp_path, stdin=up.stdout)
    assert out.returncode == 0, out.stderr
    assert out.stdout == data
    assert not (tmp_path / "-").exists()


def test_dash_output_refuses_a_bundle(tmp_path: Path) -> None:
    bundle = {
        "id": "b",
        "created_at": "2026-01-01T00:00:00Z",
        "items": [
            {"id": "t", "role": "main", "content": {"type": "inline", "content_type": "text/plain", "data": "x"}}
        ],
    }
    out = run("resolve", "-", "-o", "-", cwd=tmp_path, stdin=json.dumps(bundle).encode())
    assert out.returncode == 1 and out.stderr.decode().startswith("transfer: invalid_request:")
    assert out.stdout == b"" and not (tmp_path / "-").exists()


def test_chunked_upload_names_its_session_and_readers_can_follow_it(server: str, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    data = os.urandom(3 * MiB + 5)
    src.write_bytes(data)
    up = run(
        "upload",
        "--server",
        server,
        "--chunked",
        "--chunk-size",
        str(MiB),
        "--state-dir",
        str(tmp_path / "st"),
        str(src),
    )
    assert up.returncode == 0, up.stderr
    said = up.stderr.decode()
    sid = json.loads(up.stdout)["metadata"]["file_id"].replace("f_", "s_", 1)
    assert f"session {sid}:" in said and f"transfer session descriptor {sid}" in said
    described = run("session", "descriptor", sid, "--server", server)
    assert described.returncode == 0, described.stderr
    descriptor = json.loads(described.stdout)
    assert descriptor["type"] == "streaming" and descriptor["streaming_session_id"] == sid
    followed = run("resolve", "-", "--follow", "-o", "-", stdin=described.stdout)
    assert followed.returncode == 0, followed.stderr
    assert hashlib.sha256(followed.stdout).hexdigest() == hashlib.sha256(data).hexdigest()
    missing = run("session", "descriptor", "s_" + "0" * 32, "--server", server)
    assert missing.returncode == 1 and missing.stderr.decode().startswith("transfer: not_found:")


def test_serve_on_a_taken_port_is_one_error_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for argv in (("serve", "--port", port), ("mcp", "--port", port)):
            out = subprocess.run(
                [sys.executable, "-m", "transfer", *argv, "--data-dir", str(tmp_path / "data")],
                capture_output=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                cwd=tmp_path,
            )
            lines = out.stderr.decode().strip().splitlines()
            assert out.returncode == 1, out.stderr
            assert lines[-1].startswith("transfer: address_in_use: ") and port in lines[-1], out.stderr
            assert "Traceback" not in out.stderr.decode()
