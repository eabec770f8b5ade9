"""Chunked uploads from the client and the CLI: parallel upload, streaming-mode resolve, following a live session,
resuming after the client process is killed, and after the server is killed (SIGKILL) and restarted."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import xxhash

from benchmarks.e2e import free_port
from tests.conftest import LiveServer
from tests.layout import stored_keys
from transfer.client import AsyncTransferClient, ResolveOptions, load_descriptor
from transfer.core.model.content import FileContent

MiB = 1 << 20


@pytest.mark.anyio
async def test_chunked_upload_then_streaming_and_url_resolve(live_server: LiveServer, tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    data = os.urandom(9 * MiB + 11)
    src.write_bytes(data)
    async with AsyncTransferClient(live_server.url, options=ResolveOptions(connections=4)) as client:
        d = await client.upload_chunked(src, chunk_size=MiB, remember=tmp_path / "state")
        assert d.type.value == "url" and d.checksum == "sha256:" + hashlib.sha256(data).hexdigest()
        assert await client.resolve(d) == data
        file_id = (d.metadata or {})["file_id"]
        assert list((tmp_path / "state").iterdir()) == []  # nothing left to resume
        sid = stored_keys(live_server.data_dir, "sessions/")[0].split("/")[1]
        streaming = load_descriptor((await client.http.get(f"{live_server.url}/v1/sessions/{sid}/descriptor")).json())
        assert isinstance(streaming, FileContent) and streaming.type.value == "streaming"
        assert streaming.total_chunks == 10 and (streaming.metadata or {})["file_id"] == file_id
        out = await client.resolve(streaming, tmp_path / "via-chunks.bin")
        assert Path(out).read_bytes() == data
        assert b"".join([c async for c in client.stream(streaming)]) == data


@pytest.mark.anyio
async def test_follow_a_session_while_it_is_uploaded(live_server: LiveServer) -> None:
    data = os.urandom(4 * MiB)
    chunk = MiB
    async with httpx.AsyncClient(base_url=live_server.url, timeout=60) as http:
        doc = (
            await http.post(
                "/v1/sessions",
                json={"size": len(data), "chunk_size": chunk, "checksum": "sha256:" + hashlib.sha256(data).hexdigest()},
            )
        ).json()
        descriptor = load_descriptor(doc["descriptor"])
        assert isinstance(descriptor, FileContent)
        sid = doc["streaming_session_id"]
        first_read_at: list[float] = []
        uploaded_last_at: list[float] = []

        async def produce() -> None:
            for i in range(4):
                await asyncio.sleep(0.3)
                piece = data[i * chunk : (i + 1) * chunk]
                r = await http.put(
                    f"/v1/sessions/{sid}/chunks/{i}",
                    content=piece,
                    headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(piece)},
                )
                assert r.status_code == 201
            uploaded_last_at.append(time.monotonic())

        async def consume() -> bytes:
            async with AsyncTransferClient(live_server.url) as client:
                parts = []
                async for piece in client.resolver.follow(descriptor):
                    if not parts:
                        first_read_at.append(time.monotonic())
                    parts.append(piece)
                return b"".join(parts)

        _, got = await asyncio.gather(produce(), consume())
        assert got == data
        assert first_read_at[0] < uploaded_last_at[0]  # the reader started before the writer finished


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "transfer", *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.slow
def test_cli_resumes_after_the_client_is_killed(server: LiveServer, tmp_path: Path) -> None:
    live_server = server
    src = tmp_path / "resume.bin"
    data = os.urandom(80 * MiB)  # 16 chunks of 5 MiB (the S3 minimum): time to kill it part way
    src.write_bytes(data)
    state = tmp_path / "state"
    args = [
        "upload",
        "--server",
        live_server.url,
        "--chunked",
        "--chunk-size",
        str(5 * MiB),
        "--connections",
        "1",
        "--state-dir",
        str(state),
        "--no-progress",
        str(src),
    ]
    proc = subprocess.Popen([sys.executable, "-m", "transfer", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    sid = None
    while time.monotonic() < deadline:
        files = list(state.glob("*.json")) if state.exists() else []
        if files:
            sid = json.loads(files[0].read_text())["session"]
            status = httpx.get(f"{live_server.url}/v1/sessions/{sid}").json()
            if status["stored_count"] >= 3:
                break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert sid is not None, err
    before = httpx.get(f"{live_server.url}/v1/sessions/{sid}").json()
    assert 3 <= before["stored_count"] < 16 and before["state"] == "open"
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    descriptor = json.loads(again.stdout)
    assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    after = httpx.get(f"{live_server.url}/v1/sessions/{sid}").json()
    assert after["state"] == "completed" and after["file_id"] == descriptor["metadata"]["file_id"]  # same session


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def killable_server(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[list[subprocess.Popen[bytes]], str, Path]]:
    """Server processes (started by the test) on one port and one store: local data dir, or the S3 test bucket."""
    if request.param == "s3":
        request.getfixturevalue("s3_env")  # the environment the processes inherit names the bucket
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    yield procs, f"http://127.0.0.1:{port}", tmp_path / "data"
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def start_server(url: str, data_dir: Path) -> subprocess.Popen[bytes]:
    port = url.rsplit(":", 1)[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "transfer",
            "serve",
            "--port",
            port,
            "--data-dir",
            str(data_dir),
            "--log-level",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120  # generous: a loaded 2-core machine takes seconds to import and start
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not start")


@pytest.mark.slow
def test_resume_after_the_server_is_killed(killable_server: tuple[list[subprocess.Popen[bytes]], str, Path]) -> None:
    procs, url, data_dir = killable_server
    chunk = 5 * MiB  # S3 composes parts of at least 5 MiB
    data = os.urandom(6 * chunk + 5)
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    procs.append(start_server(url, data_dir))
    sid = httpx.post(
        f"{url}/v1/sessions",
        json={"size": len(data), "chunk_size": chunk, "checksum": "sha256:" + hashlib.sha256(data).hexdigest()},
    ).json()["streaming_session_id"]

    def put(i: int) -> int:
        return httpx.put(
            f"{url}/v1/sessions/{sid}/chunks/{i}",
            content=pieces[i],
            timeout=30,
            headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(pieces[i])},
        ).status_code

    assert [put(i) for i in (0, 1, 5)] == [201, 201, 201]
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    procs.append(start_server(url, data_dir))  # a new process: nothing but the data directory carries over
    status = httpx.get(f"{url}/v1/sessions/{sid}").json()
    assert status["stored"] == [[0, 1], [5, 5]] and status["missing"] == [[2, 4], [6, 6]]
    assert put(1) == 200  # already there
    assert [put(i) for i in (2, 3, 4, 6)] == [201, 201, 201, 201]
    d = httpx.post(f"{url}/v1/sessions/{sid}/complete", json={}, timeout=60).json()
    assert d["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()  # rebuilt from stored chunks
    assert httpx.get(d["url"], timeout=60).content == data
    if (data_dir / "tmp").exists():
        assert list((data_dir / "tmp").iterdir()) == []
