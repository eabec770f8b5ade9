"""Streaming codings: round trips, multi-member/frame streams, raw deflate, truncation, corruption, bombs."""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import replace
from typing import Any

import pytest
import zstandard

from transfer.core.model.content import ContentEncoding
from transfer.core.model.encodings import (
    CODECS,
    DecodeLimits,
    choose_response_coding,
    coding_from_http,
    make_decoder,
    make_encoder,
)
from transfer.errors import DecodedSizeLimit, MalformedBody, UnsupportedEncoding

CODINGS = [ContentEncoding.GZIP, ContentEncoding.DEFLATE, ContentEncoding.ZSTD]
BIG = 1 << 40


def decode(encoding: ContentEncoding, data: bytes, limit: int = BIG, feed: int = 7777, piece: int = 1 << 16) -> bytes:
    d = make_decoder(encoding, DecodeLimits(limit), piece_size=piece)
    out = []
    for i in range(0, len(data), feed):
        for p in d.feed(data[i : i + feed]):
            assert len(p) <= piece
            out.append(p)
    out.extend(d.finish())
    return b"".join(out)


def encode(encoding: ContentEncoding, data: bytes) -> bytes:
    e = make_encoder(encoding)
    return b"".join([e.encode(data[i : i + 100_000]) for i in range(0, len(data), 100_000)] + [e.finish()])


PAYLOAD = os.urandom(200_000) + b"hello world " * 50_000


@pytest.mark.parametrize("encoding", CODINGS)
def test_round_trip(encoding: ContentEncoding) -> None:
    assert decode(encoding, encode(encoding, PAYLOAD)) == PAYLOAD


def test_standard_library_streams_decode() -> None:
    assert decode(ContentEncoding.GZIP, gzip.compress(PAYLOAD)) == PAYLOAD
    assert decode(ContentEncoding.DEFLATE, zlib.compress(PAYLOAD)) == PAYLOAD
    raw = zlib.compressobj(wbits=-15)
    assert decode(ContentEncoding.DEFLATE, raw.compress(PAYLOAD) + raw.flush()) == PAYLOAD  # raw deflate too
    assert decode(ContentEncoding.ZSTD, zstandard.ZstdCompressor().compress(PAYLOAD)) == PAYLOAD


def test_multiple_gzip_members_and_zstd_frames() -> None:
    assert decode(ContentEncoding.GZIP, gzip.compress(b"a" * 10) + gzip.compress(b"b" * 10)) == b"a" * 10 + b"b" * 10
    z = zstandard.ZstdCompressor()
    assert decode(ContentEncoding.ZSTD, z.compress(b"x" * 5) + z.compress(b"y" * 5)) == b"xxxxxyyyyy"


@pytest.mark.parametrize("encoding", CODINGS)
def test_truncated_stream_is_malformed(encoding: ContentEncoding) -> None:
    data = encode(encoding, PAYLOAD)
    with pytest.raises(MalformedBody):
        decode(encoding, data[: len(data) // 2])


@pytest.mark.parametrize("encoding", CODINGS)
def test_empty_stream_is_malformed(encoding: ContentEncoding) -> None:
    with pytest.raises(MalformedBody):
        decode(encoding, b"")


@pytest.mark.parametrize("encoding", CODINGS)
def test_garbage_is_malformed(encoding: ContentEncoding) -> None:
    with pytest.raises(MalformedBody):
        decode(encoding, b"\x00\xff" * 1000)


@pytest.mark.parametrize("encoding", CODINGS)
def test_decompression_bomb_stops_at_the_limit(encoding: ContentEncoding) -> None:
    bomb = encode(encoding, b"\0" * (64 << 20))  # 64 MiB of zeros, a few KiB encoded
    assert len(bomb) < 1 << 20
    with pytest.raises(DecodedSizeLimit):
        decode(encoding, bomb, limit=1 << 20, feed=len(bomb))  # one feed: output must still be bounded


def test_expansion_ratio_limit() -> None:
    bomb = encode(ContentEncoding.GZIP, b"\0" * (40 << 20))
    d = make_decoder(ContentEncoding.GZIP, DecodeLimits(BIG, max_ratio=100, ratio_grace=1 << 20))
    with pytest.raises(DecodedSizeLimit, match="100:1"):
        for _ in d.feed(bomb):
            pass


def test_zstd_window_over_8_mib_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    streaming = zstandard.ZstdCompressor(compression_params=params).compressobj()  # size unknown: 128 MiB window
    data = streaming.compress(os.urandom(1 << 20) * 2) + streaming.flush()
    with pytest.raises(MalformedBody):
        decode(ContentEncoding.ZSTD, data)


def test_coding_names() -> None:
    assert coding_from_http("gzip") is ContentEncoding.GZIP
    assert coding_from_http("X-GZIP") is ContentEncoding.GZIP
    assert coding_from_http("identity") is ContentEncoding.NONE
    for bad in ("br", "gzip, zstd", "compress"):
        with pytest.raises(UnsupportedEncoding):
            coding_from_http(bad)


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, None),
        ("", None),
        ("identity", None),
        ("gzip", "gzip"),
        ("gzip, zstd", "zstd"),
        ("gzip;q=1, zstd;q=0.5", "gzip"),
        ("zstd;q=0, gzip", "gzip"),
        ("*", "zstd"),
        ("*, zstd;q=0", "gzip"),
        ("br", None),
        ("gzip;q=0", None),
    ],
)
def test_accept_encoding(accept: str | None, chosen: str | None) -> None:
    assert choose_response_coding(accept) == chosen


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 196607, 196608, 196609, (1 << 20) + 5])
def test_base64_encoder_matches_the_standard_and_reuses_its_buffer(size: int) -> None:
    import base64

    from transfer.core.model.encodings import Base64Encoder

    encoder = Base64Encoder()
    data = os.urandom(size)
    assert bytes(encoder.encode(data)) == base64.b64encode(data)
    smaller = os.urandom(size // 2)
    assert bytes(encoder.encode(memoryview(smaller))) == base64.b64encode(smaller)  # the same buffer, shorter view


def test_each_codec_takes_its_level_from_the_settings_by_its_entry() -> None:
    """Levels travel as one mapping read from the settings by each codec's ``level_setting``: a codec with a
    tunable level is its registry entry plus its settings field, nothing in between names it."""
    from transfer.core.model.encodings import Codec, encoder_levels
    from transfer.settings import Settings

    assert encoder_levels(Settings(gzip_level=3, zstd_level=7)) == {"gzip_level": 3, "zstd_level": 7}
    data = b"abcdefgh" * 50_000 + bytes(range(256)) * 400
    fast = make_encoder(ContentEncoding.ZSTD, levels={"zstd_level": 1})
    small = make_encoder(ContentEncoding.ZSTD, levels=encoder_levels(Settings(zstd_level=19)))
    assert len(small.encode(data) + small.finish()) < len(fast.encode(data) + fast.finish())

    seen: list[int | None] = []
    zstd = CODECS.get(ContentEncoding.ZSTD)
    assert zstd is not None

    def encoder(level: int | None) -> Any:
        seen.append(level)
        return zstd.encoder(level)

    class WithLevel:
        gzip_level, zstd_level, zstd_test_level = 1, 3, 11

    previous = CODECS.register(replace(zstd, encoder=encoder, level_setting="zstd_test_level"))
    try:
        make_encoder(ContentEncoding.ZSTD, levels=encoder_levels(WithLevel()))
    finally:
        assert previous is not None
        CODECS.register(previous)
    assert seen == [11]
    assert isinstance(previous, Codec)
