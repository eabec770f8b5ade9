"""The IETF resumable upload client (:mod:`transfer.client.resumable`) and ``transfer upload --resumable`` against a
real server: created with the first bytes, appends within the server's ``Upload-Limit``, a state file that survives
a killed process (SIGKILL at 40 %, then a rerun that sends only what the server lacked, counted on the wire by a
proxy in between), an expired upload left for a new one, a lost final response replayed, a file above ``max-size``
refused before a byte is sent."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, running
from transfer.client import AsyncTransferClient
from transfer.client.resumable import _remember, _state_file
from transfer.core.http.resumable import UploadLimits
from transfer.errors import TooLarge
from transfer.settings import Settings

KiB, MiB = 1 << 10, 1 << 20
V9 = {"upload-draft-interop-version": "9"}


def settings_for(tmp_path: Path, **limits: int) -> Settings:
    return Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, **limits)


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[LiveServer]:
    with running(settings_for(tmp_path)) as live:
        yield live


def write_random(path: Path, size: int) -> str:
    data = os.urandom(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


@pytest.mark.anyio
async def test_appends_stay_within_the_servers_limits(tmp_path: Path) -> None:
    limits = {"resumable_max_append_size": MiB, "resumable_min_append_size": 64 * KiB}
    src = tmp_path / "f.bin"
    sha = write_random(src, 3 * MiB + 500)
    seen: list[tuple[int, int | None]] = []
    with running(settings_for(tmp_path, **limits)) as live:
        async with AsyncTransferClient(live.url) as client:
            descriptor = await client.upload_resumable(
                src, remember=tmp_path / "state", progress=lambda done, total: seen.append((done, total))
            )
            done = client.last_resumable
    assert descriptor.checksum == "sha256:" + sha and descriptor.size == 3 * MiB + 500 and descriptor.name == "f.bin"
    assert done is not None and done.requests == ["POST", "PATCH", "PATCH", "PATCH"]  # 1 MiB each, then 500 bytes
    assert done.sent == 3 * MiB + 500 and done.resumed_from is None
    assert seen[-1] == (3 * MiB + 500, 3 * MiB + 500)
    assert list((tmp_path / "state").iterdir()) == []  # nothing left to resume


@pytest.mark.anyio
async def test_above_max_size_nothing_is_sent(tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    write_random(src, 2 * MiB)
    with running(settings_for(tmp_path, max_upload_size=MiB)) as live:
        async with AsyncTransferClient(live.url) as client:
            with pytest.raises(TooLarge, match="max-size 1048576"):
                await client.upload_resumable(src)
        assert not [k for k in live.objects() if k.startswith("tus/")]


@pytest.mark.anyio
async def test_a_remembered_upload_is_resumed_an_expired_one_replaced(plain: LiveServer, tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    data = os.urandom(2 * MiB)
    src.write_bytes(data)
    state = tmp_path / "state"
    target = plain.url + "/v1/uploads"

    def begun(first: int) -> str:
        """An upload of this file with its first bytes on the server, remembered as a killed client leaves it."""
        created = httpx.post(
            target,
            headers={**V9, "upload-complete": "?0", "upload-length": str(len(data))},
            content=data[:first],
        )
        location = created.headers["location"]
        _remember(_state_file(state, src, target), src, location, UploadLimits(max_age=3600))
        return location

    async with AsyncTransferClient(plain.url) as client:
        first = begun(MiB)
        descriptor = await client.upload_resumable(src, remember=state)
        assert client.last_resumable is not None
        assert (client.last_resumable.resumed_from, client.last_resumable.sent) == (MiB, MiB)
        assert client.last_resumable.location == first
        assert descriptor.checksum == "sha256:" + hashlib.sha256(data).hexdigest()

        stale = begun(MiB)
        _remember(_state_file(state, src, target), src, stale, UploadLimits(max_age=-1))  # past its max-age
        again = await client.upload_resumable(src, remember=state)
        assert client.last_resumable.resumed_from is None and client.last_resumable.sent == len(data)
        assert client.last_resumable.location != stale
        assert httpx.head(stale, headers=V9).status_code == 410  # the client cancelled it
        assert again.checksum == descriptor.checksum


@pytest.mark.anyio
async def test_a_lost_final_response_is_asked_again(plain: LiveServer, tmp_path: Path) -> None:
    """The upload completed but the client died before the final response: the rerun finds it complete (HEAD) and
    gets the final response again with an empty completing append, sending no content."""
    src = tmp_path / "f.bin"
    data = os.urandom(300 * KiB)
    src.write_bytes(data)
    target = plain.url + "/v1/uploads"
    done = httpx.post(target, headers={**V9, "upload-complete": "?1"}, content=data)
    _remember(_state_file(tmp_path, src, target), src, done.headers["location"], UploadLimits())
    async with AsyncTransferClient(plain.url) as client:
        descriptor = await client.upload_resumable(src, remember=tmp_path)
        assert client.last_resumable is not None and client.last_resumable.sent == 0
    unsigned = ("url", "url_expires_at")  # the URL is signed anew for each answer
    again = {k: v for k, v in descriptor.to_json().items() if k not in unsigned}
    assert again == {k: v for k, v in done.json().items() if k not in unsigned}
    assert httpx.get(descriptor.to_json()["url"]).content == data  # the new signature reads the same bytes


class CountingProxy:
    """A TCP relay on loopback that counts the bytes clients send through it; with ``hold_after`` it forwards that
    many, then holds the rest (the client's sends stall, as on a link that died), so a test can kill the client
    with exactly that much delivered."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.sent = 0
        self.hold_after: int | None = None
        self.holding = threading.Event()
        self.writers: list[asyncio.StreamWriter] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self.thread.start()
        server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop)
        self.server = server.result(10)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self.server.close()
            for writer in self.writers:
                writer.close()
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*self.upstream)
        self.writers += [client_w, server_w]

        async def upstream() -> None:
            while data := await client_r.read(1 << 16):
                if self.hold_after is not None and self.sent + len(data) >= self.hold_after:
                    data = data[: self.hold_after - self.sent]
                    self.holding.set()
                    server_w.write(data)
                    self.sent += len(data)
                    await server_w.drain()
                    while await client_r.read(1 << 16):  # hold: read and drop until the client goes away
                        pass
                    break
                server_w.write(data)
                self.sent += len(data)
                await server_w.drain()
            server_w.close()

        async def downstream() -> None:
            while data := await server_r.read(1 << 16):
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)


@pytest.mark.slow
def test_cli_killed_at_40_percent_sends_only_what_the_server_lacked(plain: LiveServer, tmp_path: Path) -> None:
    size = 64 * MiB
    src = tmp_path / "big.bin"
    sha = write_random(src, size)
    state = tmp_path / "state"
    with CountingProxy(plain.url) as proxy:
        args = [sys.executable, "-m", "transfer", "upload", str(src), "--resumable", "--no-progress"]
        args += ["--server", proxy.url, "--state-dir", str(state)]
        proxy.hold_after = int(size * 0.4)
        first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert proxy.holding.wait(120), "the first run never reached 40 %"
            assert len(list(state.iterdir())) == 1  # the 104's Location was remembered before the body went
        finally:
            first.send_signal(signal.SIGKILL)
            first.communicate()
        held, proxy.hold_after = proxy.sent, None
        location = json.loads(next(state.iterdir()).read_text())["location"]
        deadline = time.monotonic() + 30  # the server keeps what arrived once it sees the connection end
        while int(httpx.head(location, headers=V9).headers["upload-offset"]) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        offset = int(httpx.head(location, headers=V9).headers["upload-offset"])
        assert size * 0.39 < offset <= size * 0.4

        proxy.sent = 0
        second = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout)["checksum"] == "sha256:" + sha
        said = re.search(r"resumed \S+ at byte (\d+); sent (\d+) of (\d+) bytes", second.stderr)
        assert said is not None, second.stderr
        assert [int(n) for n in said.groups()] == [offset, size - offset, size]
        # on the wire: the rest of the file, and a few header blocks (HEAD, OPTIONS-free resume, one PATCH)
        assert size - offset <= proxy.sent < size - offset + 16 * KiB, (proxy.sent, size - offset, held)
    assert list(state.iterdir()) == []
