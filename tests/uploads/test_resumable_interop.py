"""IETF resumable uploads driven by clients nobody here wrote, on the listener of ``transfer serve`` (HTTP/1.1 and h2c
on one port): an upload announcing interop version 9 gets the ``104`` before its body (an interim response to curl
on HTTP/1.1, an interim HEADERS frame to the h2 library on HTTP/2), is cut mid-body (curl's own ``--max-time``; a
cancelled HTTP/2 stream), and curl asks the offset with ``HEAD`` and appends the rest with ``PATCH``, on the same
protocol; the published file is downloaded back and hashed. And an upload begun on
one replica is resumed and finished on another (two servers on one data directory, as two processes share it)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest

from tests.http.test_http2 import serve, service_settings
from tests.uploads.test_resumable import RawClient
from transfer.core.http.resumable import boolean_item
from transfer.hosts import create_app

MiB = 1 << 20
V9 = ["-H", "Upload-Draft-Interop-Version: 9"]


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[str]:
    settings = service_settings(tmp_path)
    with serve(create_app(settings), settings) as (url, _):
        yield url


def curl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["curl", "-sS", *args], capture_output=True, timeout=timeout, check=False)


def heads(text: str) -> list[tuple[str, dict[str, str]]]:
    """The response heads ``curl -i`` printed, in order: (status line, header fields)."""
    found: list[tuple[str, dict[str, str]]] = []
    for block in text.split("\r\n\r\n"):
        lines = block.strip("\r\n").split("\r\n")
        if not lines or not lines[0].upper().startswith("HTTP/"):
            continue
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        found.append((lines[0], fields))
    return found


def offset_after_cut(location: str) -> int:
    """The offset once the server has noticed the cut and kept what arrived (the bound is a deadline for a broken
    server, not a timing assertion)."""
    deadline = time.monotonic() + 30
    while True:
        head = httpx.head(location, headers={"upload-draft-interop-version": "9"})
        assert head.status_code == 204, head.text
        offset = int(head.headers["upload-offset"])
        if offset > 0 or time.monotonic() > deadline:
            return offset
        time.sleep(0.05)


def cut_with_curl(listener: str, src: Path) -> tuple[str, dict[str, str]]:
    """curl over HTTP/1.1 gives up part way through the body (--limit-rate and --max-time), as a client that loses
    its network; returns the interim response it printed."""
    cut = curl(
        "--http1.1", "-i", "--limit-rate", "4M", "--max-time", "2", "-X", "POST", f"{listener}/v1/uploads", *V9,
        "-H", "Upload-Complete: ?1", "-H", "Content-Type: application/octet-stream",
        "-H", 'Content-Disposition: inline; filename="big.bin"', "--data-binary", f"@{src}",
    )  # fmt: skip
    assert cut.returncode == 28, cut.stderr.decode()  # operation timed out: no final response
    printed = heads(cut.stdout.decode("latin-1"))
    statuses = [line.split()[1] for line, _ in printed]
    assert statuses[0] == "104" and "201" not in statuses, printed
    assert printed[0][0].startswith("HTTP/1.1 104 Upload Resumption Supported")
    return printed[0][1]


def cut_with_h2(listener: str, data: bytes) -> tuple[dict[str, str], socket.socket]:
    """The h2 library as a raw HTTP/2 client (prior knowledge): the 104 arrives as an interim HEADERS frame before
    any DATA is sent; 3 MiB go, then the stream is cancelled (RST_STREAM CANCEL, as a browser's aborted fetch). The
    connection stays open, as a browser's does, until the caller closes it (the socket is returned): closed while the
    server still answers the cancelled stream, it keeps the HTTP/2 listener from stopping (a fault of the listener
    reported on its own, not of this door)."""
    port = int(listener.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(
        1,
        [
            (":method", "POST"), (":path", "/v1/uploads"), (":scheme", "http"), (":authority", f"127.0.0.1:{port}"),
            ("upload-draft-interop-version", "9"), ("upload-complete", "?1"),
            ("content-disposition", 'inline; filename="big.bin"'), ("content-length", str(len(data))),
        ],
    )  # fmt: skip
    sock.sendall(conn.data_to_send())
    interim: dict[str, str] | None = None
    while interim is None:
        for event in conn.receive_data(sock.recv(65536)):
            if isinstance(event, h2.events.InformationalResponseReceived):
                interim = {k.decode(): v.decode() for k, v in event.headers}
        sock.sendall(conn.data_to_send())
    assert interim[":status"] == "104"
    sent = 0
    while sent < 3 * MiB:  # within the flow-control windows the server grants as it reads
        window = min(conn.local_flow_control_window(1), conn.max_outbound_frame_size, 3 * MiB - sent)
        if window <= 0:
            for _ in conn.receive_data(sock.recv(65536)):
                pass
            continue
        conn.send_data(1, data[sent : sent + window])
        sent += window
        sock.sendall(conn.data_to_send())
    conn.reset_stream(1, error_code=h2.errors.ErrorCodes.CANCEL)
    sock.sendall(conn.data_to_send())
    return interim, sock


@pytest.mark.slow
@pytest.mark.parametrize("http2", [False, True], ids=["http1.1", "h2c"])
def test_104_cut_and_resume_with_curl(
    listener: str, tmp_path: Path, http2: bool, request: pytest.FixtureRequest
) -> None:
    data = os.urandom(24 * MiB)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    version = ["--http2-prior-knowledge"] if http2 else ["--http1.1"]
    if http2:
        interim, kept = cut_with_h2(listener, data)
        request.addfinalizer(kept.close)
    else:
        interim = cut_with_curl(listener, src)
    assert interim["upload-draft-interop-version"] == "9"
    assert "max-size=" in interim["upload-limit"]
    location = interim["location"]
    assert location.startswith(listener + "/v1/uploads/t_")

    offset = offset_after_cut(location)
    assert 0 < offset < len(data)
    head = curl(*version, "-I", location, *V9)
    (line, fields), *_ = heads(head.stdout.decode("latin-1"))
    assert line.split()[1] == "204" and fields["upload-offset"] == str(offset)
    assert fields["upload-length"] == str(len(data)) and fields["cache-control"] == "no-store"
    rest = tmp_path / "rest.bin"
    rest.write_bytes(data[offset:])
    done = curl(
        *version, "-X", "PATCH", location, *V9, "-H", "Content-Type: application/partial-upload",
        "-H", f"Upload-Offset: {offset}", "-H", "Upload-Complete: ?1", "--data-binary", f"@{rest}",
        "-w", "\n%{http_code} %{http_version}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    body, _, status = done.stdout.decode().rpartition("\n")
    assert status == ("201 2" if http2 else "201 1.1"), body
    descriptor = json.loads(body)
    assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert descriptor["name"] == "big.bin" and descriptor["size"] == len(data)
    fetched = curl(*version, "-o", str(tmp_path / "back.bin"), descriptor["url"])
    assert fetched.returncode == 0, fetched.stderr.decode()
    assert hashlib.sha256((tmp_path / "back.bin").read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()


def test_curl_over_h2_every_route_and_each_version(listener: str, tmp_path: Path) -> None:
    """Over HTTP/2 (h2c) too: OPTIONS announces the limits, DELETE cancels; interop 8 gets its 104 with 8 echoed,
    a client without the field none at all (draft appendix "Draft Version Identification")."""
    h2c = "--http2-prior-knowledge"
    (line, options), *_ = heads(curl(h2c, "-si", "-X", "OPTIONS", f"{listener}/v1/uploads", *V9).stdout.decode())
    assert line.startswith("HTTP/2 204") and "max-size=" in options["upload-limit"]
    created = heads(
        curl(
            h2c, "-si", "-X", "POST", f"{listener}/v1/uploads", *V9, "-H", "Upload-Complete: ?0", "-d", "abc"
        ).stdout.decode()
    )
    assert [line.split()[1] for line, _ in created] == ["104", "201"]
    location = created[-1][1]["location"]
    (line, _), *_ = heads(curl(h2c, "-si", "-X", "DELETE", location, *V9).stdout.decode())
    assert line.startswith("HTTP/2 204")
    (line, _), *_ = heads(curl(h2c, "-sI", location, *V9).stdout.decode())
    assert line.startswith("HTTP/2 410")
    src = tmp_path / "small.bin"
    src.write_bytes(os.urandom(100_000))
    for announced, expect in ((["-H", "Upload-Draft-Interop-Version: 8"], "8"), ([], None)):
        done = curl(
            "--http2-prior-knowledge", "-si", "-X", "POST", f"{listener}/v1/uploads", *announced,
            "-H", "Upload-Complete: ?1", "--data-binary", f"@{src}",
        )  # fmt: skip
        printed = heads(done.stdout.decode("latin-1"))
        statuses = [line.split()[1] for line, _ in printed]
        if expect is None:
            assert statuses == ["201"], printed
        else:
            assert statuses == ["104", "201"] and printed[0][1]["upload-draft-interop-version"] == expect


def test_an_upload_begun_on_one_replica_is_finished_on_another(tmp_path: Path) -> None:
    """Two servers on one data directory (two processes' view of shared storage): the creation is cut on A, the
    offset is asked of B, B takes the rest and publishes; A answers the same state."""
    settings = service_settings(tmp_path)
    data = os.urandom(6 * MiB + 3)
    with (
        serve(create_app(settings), settings) as (a, _),
        serve(create_app(service_settings(tmp_path)), settings) as (b, _),
    ):
        client = RawClient(a)
        client.send_head(
            "POST",
            "/v1/uploads",
            {
                "upload-draft-interop-version": "9",
                "upload-complete": "?1",
                "content-length": str(len(data)),
            },
        )
        interim = client.read_message()
        assert interim.status == 104
        location = interim.headers["location"]
        client.send(data[: 3 * MiB])
        client.close()
        path = urlsplit(location).path
        offset = offset_after_cut(b + path)
        assert 0 < offset <= 3 * MiB
        done = httpx.patch(
            b + path,
            headers={
                "upload-draft-interop-version": "9",
                "upload-offset": str(offset),
                "upload-complete": "?1",
                "content-type": "application/partial-upload",
            },
            content=data[offset:],
            timeout=60,
        )
        assert done.status_code == 201, done.text
        assert done.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
        on_a = httpx.head(a + path, headers={"upload-draft-interop-version": "9"})
        assert boolean_item(on_a.headers["upload-complete"]) is True
        assert on_a.headers["upload-offset"] == str(len(data))
        assert httpx.get(done.json()["url"], timeout=60).content == data
