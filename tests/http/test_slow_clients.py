"""Slow-drip clients are shed (a header timeout in the HTTP protocol, a minimum body rate in ASGI) while normal
requests on other connections go on. Real sockets against a real server; the only time bound is a generous one."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, running
from transfer.settings import Settings

pytestmark = pytest.mark.anyio
GENEROUS = 30.0  # seconds: "closed within", never a latency claim


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        http_header_timeout=1.0,
        http_body_grace=1.0,
        http_body_min_rate=256 << 10,
    )
    with running(settings) as server:
        yield server


def _address(live: LiveServer) -> tuple[str, int]:
    host, port = live.url.removeprefix("http://").split(":")
    return host, int(port)


async def _drip(writer: asyncio.StreamWriter, data: bytes, every: float) -> None:
    """Write ``data`` a byte at a time until the server closes the connection."""
    try:
        for i in range(len(data)):
            writer.write(data[i : i + 1])
            await writer.drain()
            await asyncio.sleep(every)
    except (ConnectionError, OSError):
        pass


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before closing (a reset after its answer counts as closed)."""
    out = b""
    try:
        while piece := await reader.read(65536):
            out += piece
    except (ConnectionError, OSError):
        pass
    return out


async def test_connections_dripping_header_fields_are_closed_and_others_are_served(live: LiveServer) -> None:
    host, port = _address(live)
    head = f"GET /healthz HTTP/1.1\r\nHost: {host}:{port}\r\nX-Slow: ".encode() + b"a" * 10_000 + b"\r\n\r\n"
    conns = [await asyncio.open_connection(host, port) for _ in range(100)]
    drips = [asyncio.create_task(_drip(w, head, 0.2)) for _, w in conns[:90]]  # the rest send nothing at all
    try:
        async with httpx.AsyncClient(base_url=live.url, timeout=GENEROUS) as http:
            assert (await http.get("/healthz")).status_code == 200  # while they drip
            answers = await asyncio.wait_for(asyncio.gather(*(_answer(r) for r, _ in conns)), GENEROUS)
            assert (await http.get("/healthz")).status_code == 200
    finally:  # closed on every path: a socket left to the garbage collector fails a later test under -W error
        for task in drips:
            task.cancel()
        for _, w in conns:
            w.close()
    for answer in answers:  # each was closed, with a 408 when the answer made it through
        if answer:
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert any(answers)


async def test_a_dripping_upload_is_shed_and_leaves_no_temp_file(live: LiveServer) -> None:
    host, port = _address(live)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"POST /v1/files?name=slow.bin HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
        + b"Content-Type: application/octet-stream\r\nContent-Length: 10485760\r\n\r\n"
    )
    body = os.urandom(1 << 20)

    async def drip_body() -> None:  # ~20 KiB/s, far below the minimum
        try:
            for i in range(0, len(body), 1024):
                writer.write(body[i : i + 1024])
                await writer.drain()
                await asyncio.sleep(0.05)
        except (ConnectionError, OSError):
            pass

    dripping = asyncio.create_task(drip_body())
    try:
        async with httpx.AsyncClient(base_url=live.url, timeout=GENEROUS) as http:
            normal = await http.post("/v1/files", params={"name": "ok.bin"}, content=os.urandom(3 << 20))
            assert normal.status_code == 201, normal.text
            answer = await asyncio.wait_for(_answer(reader), GENEROUS)
    finally:  # closed on every path: a socket left to the garbage collector fails a later test under -W error
        dripping.cancel()
        writer.close()
    if answer:  # a reset may beat the answer while the client is still sending
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        doc: dict[str, Any] = json.loads(answer.split(b"\r\n\r\n", 1)[1])
        assert doc["error"]["code"] == "request_timeout" and doc["error"]["status"] == 408
    for _ in range(300):
        if live.leftovers() == []:
            break
        await asyncio.sleep(0.1)
    assert live.leftovers() == []
    assert [name for name in live.objects() if "slow" in name] == []
    async with httpx.AsyncClient(base_url=live.url, timeout=GENEROUS) as http:
        listing = (await http.get("/v1/files")).json()["files"]
    assert [f["name"] for f in listing] == ["ok.bin"]


async def test_a_body_that_stalls_after_a_fast_start_is_shed(live: LiveServer) -> None:
    """The minimum rate holds over a sliding window (http_body_grace), not on average: 64 MiB at loopback speed,
    then nothing, is shed once the window has passed (an average rate of 256 KiB/s would have let it idle
    for 257 s, far past the generous bound here)."""
    host, port = _address(live)
    reader, writer = await asyncio.open_connection(host, port)
    size = 64 << 20
    try:
        writer.write(
            f"POST /v1/files?name=stall.bin HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
            + f"Content-Type: application/octet-stream\r\nContent-Length: {size + 1}\r\n\r\n".encode()
        )
        piece = os.urandom(1 << 20)
        for _ in range(size >> 20):
            writer.write(piece)
            await writer.drain()
        answer = await asyncio.wait_for(_answer(reader), GENEROUS)  # and the last byte never comes
    finally:
        writer.close()
    if answer:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    for _ in range(300):
        if live.leftovers() == []:
            break
        await asyncio.sleep(0.1)
    assert live.leftovers() == []


def test_min_rate_is_a_sliding_window() -> None:
    from transfer.api.middleware.limits import MinRate

    rate = MinRate(window=2.0, min_rate=100.0)
    assert rate.allowance() == 2.0
    rate.account(waited=0.1, received=10**9)  # a fast start banks no more than the window
    assert rate.allowance() == 2.0
    rate.account(waited=1.5, received=0)
    assert rate.allowance() == 0.5
    rate.account(waited=0.5, received=50)  # 50 bytes buy half a second back
    assert rate.allowance() == 0.5
    rate.account(waited=1.0, received=0)
    assert rate.allowance() == 0.0
