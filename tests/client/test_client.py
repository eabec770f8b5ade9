"""The Python client and resolver against a real server: parallel ranges, resume after cut connections (through a
loopback proxy that really cuts them), decoding, verification failures that leave nothing at the destination."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Clock, LiveServer, wait_indexed
from transfer.client import AsyncTransferClient, ResolveOptions, TransferClient, load_descriptor
from transfer.core.model.content import FileContent
from transfer.errors import ChecksumMismatch, InvalidDescriptor, NotFound, SizeMismatch, UrlExpired

pytestmark = pytest.mark.anyio
MiB = 1 << 20


class CuttingProxy:
    """A TCP proxy on loopback that cuts the first ``cuts`` responses after ``cut_after`` bytes — a real broken
    connection, as a flaky network produces, not a mock."""

    def __init__(self, upstream_port: int, cut_after: int, cuts: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after = cut_after
        self.cuts_left = cuts
        self.connections = 0
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                cut = self.cuts_left > 0
                self.cuts_left -= 1 if cut else 0
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(upstream, client, self.cut_after if cut else None), daemon=True
            ).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if limit is not None and sent + len(data) > limit:
                    dst.sendall(data[: limit - sent])
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def rewrite(self, url: str, server: LiveServer) -> str:
        return url.replace(server.url, f"http://127.0.0.1:{self.port}")

    def close(self) -> None:
        self.closed = True
        self.listener.close()


@pytest.fixture
async def client(live_server: LiveServer) -> AsyncIterator[AsyncTransferClient]:
    options = ResolveOptions(parallel_min_size=MiB, connections=4, buffer_size=256 << 10)
    async with AsyncTransferClient(live_server.url, options=options) as c:
        yield c


@pytest.fixture
def proxy_factory(live_server: LiveServer) -> Iterator[Any]:
    proxies: list[CuttingProxy] = []

    def make(cut_after: int, cuts: int) -> CuttingProxy:
        port = int(live_server.url.rsplit(":", 1)[1])
        p = CuttingProxy(port, cut_after, cuts)
        proxies.append(p)
        return p

    yield make
    for p in proxies:
        p.close()


def no_leftovers(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.startswith(".")]


async def test_upload_and_resolve_parallel(
    client: AsyncTransferClient, tmp_path: Path, proxy_factory: Any, live_server: LiveServer
) -> None:
    data = os.urandom(6 * MiB + 123)
    d = await client.upload(data, name="six.bin")
    assert d.type.value == "url" and d.size == len(data)
    proxy = proxy_factory(cut_after=10**12, cuts=0)
    routed = d.model_copy(update={"url": proxy.rewrite(d.url or "", live_server)})
    out = await client.resolve(routed, tmp_path / "six.bin")
    assert Path(out).read_bytes() == data
    assert proxy.connections >= 4  # fetched in parallel ranges
    assert no_leftovers(tmp_path)


@pytest.mark.parametrize("connections", [1, 4])
async def test_resume_after_cut_connections(
    live_server: LiveServer, tmp_path: Path, proxy_factory: Any, connections: int
) -> None:
    data = os.urandom(5 * MiB)
    options = ResolveOptions(parallel_min_size=MiB, connections=connections, buffer_size=128 << 10)
    async with AsyncTransferClient(live_server.url, options=options) as c:
        d = await c.upload(data)
        proxy = proxy_factory(cut_after=700_000, cuts=3)
        routed = d.model_copy(update={"url": proxy.rewrite(d.url or "", live_server)})
        out = await c.resolve(routed, tmp_path / "resumed.bin")
    assert Path(out).read_bytes() == data
    assert proxy.cuts_left <= 0 and proxy.connections > connections  # really cut, really resumed
    assert no_leftovers(tmp_path)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "zstd"])
async def test_encoded_content_resolves_to_the_original(
    client: AsyncTransferClient, tmp_path: Path, encoding: str
) -> None:
    data = b"0123456789abcdef" * (300 << 10)
    d = await client.upload(data, encoding=encoding)
    assert d.encoding is not None and d.encoding.value == encoding and (d.encoded_size or 0) < len(data)
    out = await client.resolve(d, tmp_path / "decoded.bin")
    assert Path(out).read_bytes() == data
    assert await client.resolve(d) == data
    assert no_leftovers(tmp_path)


async def test_verification_failures_leave_nothing(client: AsyncTransferClient, tmp_path: Path) -> None:
    data = os.urandom(2 * MiB)
    d = await client.upload(data)
    dest = tmp_path / "out.bin"
    wrong_sum = d.model_copy(update={"checksum": "sha256:" + hashlib.sha256(b"x").hexdigest()})
    with pytest.raises(ChecksumMismatch):
        await client.resolve(wrong_sum, dest)
    assert not dest.exists() and no_leftovers(tmp_path)
    wrong_size = d.model_copy(update={"size": len(data) - 1})
    with pytest.raises(SizeMismatch):
        await client.resolve(wrong_size, dest)
    assert not dest.exists() and no_leftovers(tmp_path)


async def test_expired_and_deleted(client: AsyncTransferClient, tmp_path: Path, clock: Clock) -> None:
    d = await client.upload(os.urandom(2 * MiB))
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    dest = downloads / "x"
    clock.advance(4000)
    with pytest.raises(UrlExpired):
        await client.resolve(d, dest)
    clock.advance(-4000)
    file_id = (d.metadata or {})["file_id"]
    await client.delete(file_id)
    with pytest.raises(NotFound):
        await client.resolve(d, dest)
    with pytest.raises(NotFound):
        await client.describe(file_id)
    assert list(downloads.iterdir()) == []


async def test_inline_and_structured_content(client: AsyncTransferClient, tmp_path: Path) -> None:
    d = await client.upload(b"tiny")
    assert d.type.value == "inline"
    assert await client.resolve(d) == b"tiny"
    assert Path(await client.resolve(d, tmp_path / "t")).read_bytes() == b"tiny"
    text = {"type": "inline", "content_type": "text/plain", "charset": "utf-8", "data": "héllo"}
    assert await client.resolve(text) == "héllo".encode()
    code = {"type": "inline", "content_type": "text/plain", "language": "python", "data": "print(1)"}
    assert await client.resolve(code) == b"print(1)"
    doc = {"type": "inline", "content_type": "application/json", "data": {"a": [1, 2]}}
    assert json.loads(await client.resolve(doc)) == {"a": [1, 2]}
    tampered = {**d.to_json(), "checksum": "sha256:" + "0" * 64}
    with pytest.raises(ChecksumMismatch):
        await client.resolve(tampered, tmp_path / "never")
    assert not (tmp_path / "never").exists()


async def test_stream_yields_verified_bytes(client: AsyncTransferClient) -> None:
    data = os.urandom(3 * MiB)
    d = await client.upload(data)
    assert b"".join([c async for c in client.stream(d)]) == data
    bad = d.model_copy(update={"checksum": "sha256:" + "1" * 64})
    with pytest.raises(ChecksumMismatch):
        async for _ in client.stream(bad):
            pass


async def test_upload_from_async_iterator_and_path(client: AsyncTransferClient, tmp_path: Path) -> None:
    async def produce() -> AsyncIterator[bytes]:
        for i in range(20):
            yield bytes([i]) * 100_000

    d = await client.upload(produce(), name="gen.bin")
    assert d.size == 2_000_000
    path = tmp_path / "local.dat"
    path.write_bytes(os.urandom(MiB + 7))
    d2 = await client.upload(path)
    assert d2.name == "local.dat" and await client.resolve(d2) == path.read_bytes()


def test_load_descriptor_errors() -> None:
    with pytest.raises(InvalidDescriptor, match="not JSON"):
        load_descriptor("{nope")
    with pytest.raises(InvalidDescriptor, match="url mode requires"):
        load_descriptor({"type": "url", "content_type": "a/b", "name": "x"})


def test_sync_client_round_trip(live_server: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(2 * MiB)
    with TransferClient(live_server.url) as c:
        d = c.upload(data, name="sync.bin")
        assert isinstance(d, FileContent) and d.name == "sync.bin"
        assert c.resolve(d) == data
        assert Path(c.resolve(d.to_json(), tmp_path / "s.bin")).read_bytes() == data


def test_sync_client_sends_a_new_version_in_changed_chunks(live_server: LiveServer, tmp_path: Path) -> None:
    v1 = bytearray(os.urandom(6 * MiB))
    (tmp_path / "v1.bin").write_bytes(v1)
    v1[3 * MiB : 3 * MiB + 100] = os.urandom(100)
    (tmp_path / "v2.bin").write_bytes(v1)
    with TransferClient(live_server.url) as c:
        first = c.upload_dedup(tmp_path / "v1.bin")
        assert first is not None and first.how == "whole" and first.index_error is None
        wait_indexed(live_server.url, first.descriptor.metadata["file_id"])
        second = c.upload_dedup(tmp_path / "v2.bin", name="v2")
        assert second is not None and second.how == "chunks" and 0 < second.sent_bytes < MiB
        assert second.descriptor.name == "v2" and c.resolve(second.descriptor) == bytes(v1)
