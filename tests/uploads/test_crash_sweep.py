"""Temp files of a killed server are swept at start-up; those of a live server sharing the data directory are not.
Real ``transfer serve`` processes, real kill -9."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from devtools.serving import free_port
from tests.uploads.test_sessions_resume import start_server

pytestmark = pytest.mark.e2e
MiB = 1 << 20


def _start_upload(url: str, declared: int, sent: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)))
    s.sendall(
        f"POST /v1/files?name=big.bin HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {declared}\r\n\r\n".encode()
        + sent
    )
    return s


def _read_response(s: socket.socket, timeout: float = 120) -> bytes:
    """One HTTP/1.1 response with a Content-Length body (what the service sends for an upload)."""
    s.settimeout(timeout)
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = s.recv(65536)
        if not chunk:
            return answer
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")),
        0,
    )
    while len(body) < length and (chunk := s.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def _parts(data_dir: Path) -> list[str]:
    tmp = data_dir / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []


def _wait_for(condition: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.05)


@pytest.mark.slow
def test_temp_files_of_a_killed_server_are_swept_at_start_up(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    url = f"http://127.0.0.1:{free_port()}"
    first = start_server(url, data_dir)
    try:
        with _start_upload(url, 64 * MiB, os.urandom(8 * MiB)):
            _wait_for(lambda: any(n.endswith(".part") for n in _parts(data_dir)), "the upload's temp file")
            first.send_signal(signal.SIGKILL)
            first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert any(n.endswith(".part") for n in _parts(data_dir))  # left behind by the dead writer
    second = start_server(url, data_dir)
    try:
        assert _parts(data_dir) == []
    finally:
        second.kill()
        second.wait()


@pytest.mark.slow
def test_a_second_server_on_the_same_directory_keeps_a_live_upload(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first_url, second_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    first = start_server(first_url, data_dir)
    second = None
    try:
        data = os.urandom(16 * MiB)
        with _start_upload(first_url, len(data), data[: 8 * MiB]) as s:
            _wait_for(lambda: any(n.endswith(".part") for n in _parts(data_dir)), "the upload's temp file")
            in_flight = _parts(data_dir)
            second = start_server(second_url, data_dir)  # its start-up sweep runs now
            assert _parts(data_dir) == in_flight
            s.sendall(data[8 * MiB :])
            # no half-close: a server may take an EOF from the client for a client gone before it has answered
            # (a race lost when the machine is busy), so the response is read by its own length
            answer = _read_response(s)
        assert answer.startswith(b"HTTP/1.1 201"), answer[:300]
        assert _parts(data_dir) == []
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()
