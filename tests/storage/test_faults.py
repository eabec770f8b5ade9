"""Faults that a test can really produce: a full disk (a small tmpfs mounted for the test), and a client that
goes away mid-chunk. Nothing is published half-written, temp files go, and the service keeps serving."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import xxhash

from tests.conftest import Clock, LiveServer, requests_ended, running
from tests.uploads.test_api_upload import assert_error
from transfer.settings import Settings

MiB = 1 << 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a small filesystem here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.fixture
def full_disk_server(small_disk: Path, clock: Clock) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=small_disk / "data", signing_keys={"t": "0123456789abcdef0123"}, session_chunk_size=1 * MiB
    )
    with running(settings, clock) as live:
        yield live


def test_disk_full_is_507_and_leaves_nothing(full_disk_server: LiveServer) -> None:
    server = full_disk_server
    with httpx.Client(base_url=server.url, timeout=60) as http:
        small = http.post("/v1/files", params={"inline": "false"}, content=os.urandom(2 * MiB)).json()
        r = http.post("/v1/files", content=os.urandom(20 * MiB))
        assert_error(r, 507, "insufficient_storage")
        assert server.leftovers() == []  # the temp file went with the failure
        assert http.get(small["url"]).status_code == 200  # others are still served
        again = http.post("/v1/files", params={"inline": "false"}, content=os.urandom(3 * MiB))
        assert again.status_code == 201  # and the space came back
        # local storage preallocates a session's staged file when it opens: no room for the declared size is a 507
        # at once, before a byte is sent, and nothing is left of it
        assert_error(
            http.post("/v1/sessions", json={"size": 30 * MiB, "chunk_size": 1 * MiB}), 507, "insufficient_storage"
        )
        staging = server.data_dir / "staging"
        assert not [p for p in staging.rglob("*") if p.is_file()] and server.leftovers() == []
        # a session of unknown size finds out at the chunk that does not fit
        sid = http.post("/v1/sessions", json={"chunk_size": 1 * MiB}).json()["streaming_session_id"]
        codes = []
        for i in range(30):
            piece = os.urandom(MiB)
            codes.append(
                http.put(
                    f"/v1/sessions/{sid}/chunks/{i}",
                    content=piece,
                    headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(piece)},
                ).status_code
            )
            if codes[-1] != 201:
                break
        assert codes[-1] == 507 and server.leftovers() == []
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204  # abort frees the chunks
        assert not [p for p in staging.rglob("*") if p.is_file()]
        assert http.post("/v1/files", params={"inline": "false"}, content=os.urandom(3 * MiB)).status_code == 201


def test_client_gone_mid_chunk_leaves_nothing_and_the_session_resumes(server: LiveServer) -> None:
    live_server = server  # local storage, and again on the S3 test server
    chunk = (5 << 20) if server.settings.storage == "s3" else (1 << 20)  # S3 composes parts of at least 5 chunk
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        doc = http.post("/v1/sessions", json={"size": 2 * chunk, "chunk_size": chunk}).json()
        sid = doc["streaming_session_id"]
        host, port = live_server.url.removeprefix("http://").split(":")
        piece = os.urandom(chunk)
        route = "/v1/sessions/{sid}/chunks/{index}"
        ended = requests_ended("PUT", route)
        with socket.create_connection((host, int(port))) as s:
            s.sendall(
                f"PUT /v1/sessions/{sid}/chunks/0 HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: {chunk}\r\n"
                f"Chunk-Checksum: xxh3-128:{xxhash.xxh3_128_hexdigest(piece)}\r\n\r\n".encode()
            )
            s.sendall(piece[: chunk // 2])  # half the chunk, then the client is gone
        deadline = time.monotonic() + 30
        while requests_ended("PUT", route) == ended and time.monotonic() < deadline:
            time.sleep(0.05)  # until the server has ended that request: before, its temp file may not exist yet
        assert requests_ended("PUT", route) > ended, "the server never ended the chunk whose client left"
        while live_server.leftovers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live_server.leftovers() == []
        assert http.get(f"/v1/sessions/{sid}").json()["stored"] == []  # nothing half-stored
        for i in range(2):
            data = piece if i == 0 else os.urandom(chunk)
            r = http.put(
                f"/v1/sessions/{sid}/chunks/{i}",
                content=data,
                headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)},
            )
            assert r.status_code == 201
        assert http.post(f"/v1/sessions/{sid}/complete", json={}).status_code == 200
