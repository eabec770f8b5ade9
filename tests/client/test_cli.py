"""The ``transfer`` command as a user runs it: a real ``transfer serve`` process, upload, resolve elsewhere,
inspect, and one clear error line for every failure."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.e2e import service
from devtools.serving import free_port

MiB = 1 << 20


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transfer", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        input=stdin,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("serve")
    with service(workdir, env={**os.environ, "TRANSFER_URL_TTL": "600"}) as (url, _pid):
        assert (workdir / "transfer-data").is_dir()  # the documented default data directory
        yield url


@pytest.mark.slow
def test_upload_then_resolve_in_another_directory(server: str, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(5 * MiB + 3))
    up = run("upload", "--server", server, str(src))
    assert up.returncode == 0, up.stderr
    descriptor = json.loads(up.stdout)
    assert descriptor["type"] == "url" and descriptor["range_supported"] is True
    assert descriptor["checksum"] == "sha256:" + hashlib.sha256(src.read_bytes()).hexdigest()
    assert descriptor["name"] == "big.bin" and descriptor["url_expires_at"].endswith("Z")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "descriptor.json").write_text(up.stdout)
    res = run("resolve", "descriptor.json", "-o", "out.bin", cwd=elsewhere)
    assert res.returncode == 0, res.stderr
    assert (elsewhere / "out.bin").read_bytes() == src.read_bytes()
    again = run("resolve", "descriptor.json", "-o", "out.bin", cwd=elsewhere)
    assert again.returncode == 1 and "exists" in again.stderr  # never silently overwrites
    piped = run("resolve", "-", "-o", str(elsewhere / "piped.bin"), stdin=up.stdout)
    assert piped.returncode == 0 and (elsewhere / "piped.bin").read_bytes() == src.read_bytes()


def test_small_file_inline_and_several_files(server: str, tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.json"
    a.write_text("hello\n")
    b.write_text('{"k": 1}')
    up = run("upload", "--server", server, str(a), str(b))
    assert up.returncode == 0, up.stderr
    docs = json.loads(up.stdout)
    assert [d["type"] for d in docs] == ["inline", "inline"]
    assert docs[1]["content_type"] == "application/json"
    forced = run("upload", "--server", server, "--url", "--encoding", "zstd", str(a))
    assert json.loads(forced.stdout)["type"] == "url"


def test_inspect(tmp_path: Path, server: str) -> None:
    good = tmp_path / "d.json"
    good.write_text(
        json.dumps(
            {
                "type": "url",
                "content_type": "video/mp4",
                "size": 10,
                "name": "v.mp4",
                "url": "https://example.com/v",
                "url_expires_at": "2020-01-01T00:00:00Z",
            }
        )
    )
    out = run("inspect", str(good))
    assert out.returncode == 0 and "EXPIRED" in out.stdout and "mode: url" in out.stdout


@pytest.mark.parametrize(
    ("content", "code"),
    [
        ("{not json", "invalid_descriptor"),
        ('{"type": "url", "content_type": "a/b", "name": "x"}', "invalid_descriptor"),
        ('{"type": "inline", "content_type": "a/b", "name": "x", "data": "!!"}', "invalid_descriptor"),
    ],
)
def test_bad_descriptors_get_one_error_line(tmp_path: Path, content: str, code: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    for command in ("inspect", "resolve"):
        out = run(command, str(path), cwd=tmp_path)
        assert out.returncode == 1
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"transfer: {code}:"), out.stderr
        assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_errors_are_one_line(tmp_path: Path, server: str) -> None:
    missing = run("upload", "--server", server, str(tmp_path / "nope.bin"))
    assert missing.returncode == 1 and missing.stderr.startswith("transfer: invalid_request:")
    dead = run("upload", "--server", f"http://127.0.0.1:{free_port()}", __file__)
    assert dead.returncode == 1 and dead.stderr.startswith("transfer: unreachable:")
    assert len(dead.stderr.strip().splitlines()) == 1
    expired = tmp_path / "expired.json"
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(MiB + 1))
    d = json.loads(run("upload", "--server", server, str(src)).stdout)
    d["url"] = d["url"].replace("sig=", "sig=x")
    expired.write_text(json.dumps(d))
    out = run("resolve", str(expired), "-o", str(tmp_path / "o.bin"))
    assert out.returncode == 1 and out.stderr.startswith("transfer: signature_invalid:")
    assert not (tmp_path / "o.bin").exists()
    usage = run("upload")
    assert usage.returncode == 2


@pytest.mark.slow
def test_serve_refuses_bad_settings_in_one_line(tmp_path: Path) -> None:
    bad_port = run("serve", env={**os.environ, "TRANSFER_PORT": "abc"}, cwd=tmp_path)
    assert bad_port.returncode == 1 and bad_port.stderr.startswith("transfer: invalid_settings: TRANSFER_PORT")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad_dir = run("serve", "--data-dir", str(blocker / "data"), cwd=tmp_path)
    assert bad_dir.returncode == 1 and "cannot use data directory" in bad_dir.stderr
    assert "Traceback" not in bad_port.stderr + bad_dir.stderr


def test_bench_measures_a_deployment(server: str, tmp_path: Path) -> None:
    own = tmp_path / "mine.bin"
    own.write_bytes(os.urandom(3 * MiB))
    out = run("bench", "--server", server, "--sizes", "2M", "--file", str(own), "--small", "20", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [r["label"] for r in report["sizes"]] == ["2 MiB random", "mine.bin"]
    assert all(r["upload_mbps"] > 0 and r["resolve_mbps"] > 0 for r in report["sizes"])
    assert report["small_objects"]["p99_ms"] >= report["small_objects"]["p50_ms"] > 0
    bad = run("bench", "--server", server, "--sizes", "lots")
    assert bad.returncode == 1 and bad.stderr.startswith("transfer: invalid_request:")


def test_oversized_descriptor_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)  # sparse: 64 MiB of NULs
    out = run("inspect", str(huge))
    assert out.returncode == 1 and "larger than" in out.stderr and out.stderr.startswith("transfer: invalid_descriptor")
