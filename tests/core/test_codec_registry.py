"""Codecs are data: every place that names content codings reads them from ``transfer.core.model.encodings.CODECS``.

The test swaps the registry's zstd entry for a toy codec with another HTTP token (``x-xor``: every byte XOR 0x5A,
streamable both ways). If any place still knew zstd by itself, something below would break: the upload route
would refuse ``Content-Encoding: x-xor`` or take ``zstd``, a 415 would offer ``zstd``, stored content would be
real zstd, downloads would say ``content-encoding: zstd``, and the resolver could not decode what was stored."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import LiveServer
from transfer.cli import build_parser
from transfer.client.resolver import Resolver
from transfer.core.model.content import ContentEncoding, load_descriptor
from transfer.core.model.encodings import CODECS, Codec, DecodeLimits, accepted_codings, storage_encoding

TOKEN = "x-xor"
KEY = 0x5A
TABLE = bytes(b ^ KEY for b in range(256))


def xor(data: bytes | memoryview) -> bytes:
    return bytes(data).translate(TABLE)


class XorDecoder:
    def __init__(self, limits: DecodeLimits, piece: int) -> None:
        self.limits = limits
        self.encoded_in = 0
        self.decoded_out = 0

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        self.encoded_in += len(data)
        self.decoded_out += len(data)
        self.limits.check(self.decoded_out, self.encoded_in)
        if data:
            yield xor(data)

    def finish(self) -> Iterator[bytes]:
        return iter(())


class XorEncoder:
    def encode(self, data: bytes | memoryview) -> bytes:
        return xor(data)

    def finish(self) -> bytes:
        return b""


@pytest.fixture
def toy_codec() -> Iterator[Codec]:
    codec = Codec(ContentEncoding.ZSTD, TOKEN, XorDecoder, lambda _level: XorEncoder(), serve_rank=0)
    previous = CODECS.register(codec)
    assert previous is not None
    try:
        yield codec
    finally:
        CODECS.register(previous)


def test_registry_lists_are_derived(toy_codec: Codec) -> None:
    assert TOKEN in accepted_codings() and "zstd" not in accepted_codings()
    assert storage_encoding("zstd") is ContentEncoding.ZSTD  # the storage name is the descriptor's, unchanged
    assert CODECS.served()[0] == TOKEN
    for name in CODECS.storage_names():  # the CLI offers what the registry has
        assert build_parser().parse_args(["upload", "--encoding", name, "f"]).encoding == name


@pytest.mark.anyio
async def test_upload_route_download_and_resolver_follow_the_registry(
    toy_codec: Codec, live_server: LiveServer
) -> None:
    data = b"the quick brown fox " * 20_000 + os.urandom(1000)
    sha = "sha256:" + hashlib.sha256(data).hexdigest()
    async with httpx.AsyncClient(base_url=live_server.url, timeout=30) as http:
        # the upload route decodes Content-Encoding with the registry's codec for that token
        r = await http.post(
            "/v1/files", content=xor(data), headers={"content-encoding": TOKEN}, params={"inline": "false"}
        )
        assert r.status_code == 201, r.text
        assert r.json()["checksum"] == sha and r.json()["size"] == len(data)
        # a token no longer registered is refused, and the 415 offers what the registry has
        refused = await http.post("/v1/files", content=b"x", headers={"content-encoding": "zstd"})
        assert refused.status_code == 415
        offered = {t.strip() for t in refused.headers["accept-encoding"].split(",")}
        assert TOKEN in offered and "zstd" not in offered

        # stored with the codec's encoder: the download carries the codec's token and its bytes
        r = await http.post("/v1/files", content=data, params={"encoding": "zstd", "inline": "false"})
        assert r.status_code == 201, r.text
        descriptor = r.json()
        assert descriptor["encoding"] == "zstd" and descriptor["checksum"] == sha
        raw = await http.get(descriptor["url"], headers={"accept-encoding": "identity"})
        assert raw.headers.get("content-encoding") == TOKEN
        assert xor(raw.content) == data

        # the resolver decodes with the registry's codec and verifies the SHA-256
        resolved = await Resolver(http).to_bytes(load_descriptor(descriptor), max_size=len(data))
        assert resolved == data
