"""Streaming content codings: gzip, deflate (zlib-wrapped, raw accepted when decoding) and zstd.

Decoders are push-style and bomb-guarded: :meth:`StreamDecoder.feed` yields the decoded bytes in pieces of at most
``piece_size`` (never the whole expansion of an input chunk at once), and a :class:`DecodeLimits` stops the stream
with ``decoded_size_limit`` as soon as the decoded size or the expansion ratio passes its limit. ``finish`` raises
``malformed_body`` on a truncated stream. Multiple gzip members and multiple zstd frames are decoded in sequence
(RFC 9112 §7.2, RFC 8878 §3.1). zstd windows are limited to 8 MiB (RFC 9659).

gzip/deflate use python-isal both ways: encoding at ~1 GB/s (zlib: ~80-200 MB/s; zlib-ng level 1 is slower with a
larger output), decoding at ~2x stdlib zlib on the same stream, text or incompressible (``benchmarks/kernels.py``
compares isal, zlib-ng and stdlib zlib: zlib-ng decodes incompressible data ~1.2-1.4x faster than isal but text
~0.9x, and text is what clients compress); zstd encoding uses ``zstandard``; zstd
decoding uses ``backports.zstd`` (the stdlib ``compression.zstd`` API), whose ``decompress`` takes ``max_length`` —
``zstandard``'s push decoder has no output bound, so one crafted input chunk could expand to gigabytes.

Every coding is one :class:`Codec` entry in :data:`CODECS` (storage name, HTTP token and aliases, decoder and
encoder factories, level setting, whether responses may be compressed with it); every list of codings in the
service (what an upload may send, what a 415 offers, what a download may be compressed with, what the CLI and MCP
accept) is read from it. A new coding is its ``ContentEncoding`` member (the descriptor's name), its codec classes
and its entry here.

Pure computation, no I/O: callers decide where (which thread) the CPU work runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import pybase64
import zstandard
from isal import isal_zlib

from transfer.core.model.content import ContentEncoding
from transfer.errors import DecodedSizeLimit, MalformedBody, UnsupportedEncoding

if sys.version_info >= (3, 14):  # pragma: no cover
    from compression import zstd as _zstd
else:
    from backports import zstd as _zstd


@dataclass(frozen=True, slots=True)
class InflateBackend:
    """A zlib-compatible inflater (``isal.isal_zlib``; stdlib ``zlib`` and ``zlib_ng`` have the same API) that
    gzip/deflate decode with: its ``decompressobj(wbits=...)`` and the exception it raises on corrupt data."""

    name: str
    decompressobj: Callable[..., Any]
    error: type[Exception]


# isal's stub declares its error oddly; it is a plain Exception subclass at run time
ISAL = InflateBackend("isal", isal_zlib.decompressobj, isal_zlib.error)  # type: ignore[arg-type]
# gzip/deflate decoding (the kernels benchmark compares the candidates on the same streams; see the module doc)
INFLATE = ISAL
ZSTD_MAX_WINDOW_LOG = 23  # 8 MiB, RFC 9659 §3
DEFAULT_PIECE = 1 << 20
_INPUT_WINDOW = 256 << 10  # compressed bytes handed to zlib/isal per call (see _ZlibFamilyDecoder._run)


def coding_from_http(value: str) -> ContentEncoding:
    """The encoding named by a ``Content-Encoding`` value (one coding); UnsupportedEncoding otherwise."""
    codings = [c.strip().lower() for c in value.split(",") if c.strip()]
    if not codings:
        return ContentEncoding.NONE
    if len(codings) > 1:
        raise UnsupportedEncoding(f"stacked content codings are not supported: {value!r}", accepted=accepted_codings())
    codec = CODECS.from_token(codings[0])
    if codec is None:
        raise UnsupportedEncoding(
            f"unsupported content coding {codings[0]!r}; use {_names(CODECS.http_tokens())}",
            accepted=accepted_codings(),
        )
    return codec.encoding


def storage_encoding(value: str) -> ContentEncoding:
    """The encoding a client asks the service to store (one of :meth:`CodecRegistry.storage_names`)."""
    name = value.strip().lower()
    codec = next((c for c in CODECS if c.encoding.value == name), None)
    if codec is None:
        if name == ContentEncoding.BASE64.value:
            raise UnsupportedEncoding("base64 is only for inline content", accepted=accepted_codings())
        raise UnsupportedEncoding(
            f"unknown encoding {value!r}; use {_names(CODECS.storage_names())}", accepted=accepted_codings()
        )
    return codec.encoding


def accepted_codings() -> tuple[str, ...]:
    """What an upload's Content-Encoding may be, as a 415 lists it in Accept-Encoding (RFC 9110 §15.5.16)."""
    return (*CODECS.http_tokens(), "identity")


def http_coding(encoding: ContentEncoding) -> str | None:
    """The Content-Encoding token (RFC 9110 §8.4.1) of a stored encoding; None for none (identity)."""
    codec = CODECS.get(encoding)
    return None if codec is None or codec.encoding is ContentEncoding.NONE else codec.http_token


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds on decoded output. ``max_ratio`` applies once more than ``ratio_grace`` bytes came out."""

    max_size: int
    max_ratio: float = 10_000.0
    ratio_grace: int = 16 << 20

    def check(self, decoded: int, encoded: int) -> None:
        """Raise DecodedSizeLimit once ``decoded`` bytes from ``encoded`` pass the size or expansion limit."""
        if decoded > self.max_size:
            raise DecodedSizeLimit(f"decoded content exceeds the limit of {self.max_size} bytes", limit=self.max_size)
        if decoded > self.ratio_grace and decoded > self.max_ratio * max(encoded, 1):
            raise DecodedSizeLimit(f"decoded content expands more than {self.max_ratio:g}:1", max_ratio=self.max_ratio)


class StreamDecoder(Protocol):
    """Incremental decoding of one content coding, bounded in output per piece; ``encoded_in``/``decoded_out`` count
    bytes for bomb limits."""

    encoded_in: int
    decoded_out: int

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        """The decoded pieces of ``data``, each bounded in size."""

    def finish(self) -> Iterator[bytes]:
        """The last decoded pieces; MalformedBody when the stream was truncated."""


class _ZlibFamilyDecoder:
    """gzip (members in sequence) or deflate (zlib-wrapped, or raw if the zlib header is absent)."""

    def __init__(
        self, encoding: ContentEncoding, limits: DecodeLimits, piece_size: int, backend: InflateBackend | None = None
    ) -> None:
        self._gzip = encoding is ContentEncoding.GZIP
        self._limits = limits
        self._piece = piece_size
        self._backend = INFLATE if backend is None else backend
        self._obj: Any = None
        self._head = b""  # deflate: bytes held until the wrapper can be recognised
        self._ended = False
        self.encoded_in = 0
        self.decoded_out = 0

    def _new(self, first: bytes) -> None:
        if self._gzip:
            self._obj = self._backend.decompressobj(wbits=31)
        else:
            # zlib header: CM=8 and (CMF*256+FLG) % 31 == 0 (RFC 1950 §2.2); otherwise raw deflate (RFC 1951)
            zlib_wrapped = len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] * 256 + first[1]) % 31 == 0
            self._obj = self._backend.decompressobj(wbits=15 if zlib_wrapped else -15)

    def _run(self, data: bytes | memoryview) -> Iterator[bytes]:
        # the input goes in windows: each call that stops at max_length copies the rest of its input into
        # unconsumed_tail, so a large input batch would be copied over and over while a bomb expands
        view = memoryview(data)
        for start in range(0, len(view), _INPUT_WINDOW):
            yield from self._run_window(view[start : start + _INPUT_WINDOW])

    def _run_window(self, data: bytes | memoryview) -> Iterator[bytes]:
        """Decode ``data`` in pieces of at most ``piece_size``; also drains output the decompressor held back
        (it can hold some with all its input consumed; ``data`` empty then)."""
        while True:
            if self._obj is None:
                if not data:
                    return
                if self._ended and not self._gzip:
                    if bytes(data).strip(b"\0"):
                        raise MalformedBody("trailing bytes after the deflate stream")
                    return
                self._new(bytes(data[:2]))
                self._ended = False
            assert self._obj is not None
            try:
                out = self._obj.decompress(data, self._piece)
            except self._backend.error as exc:
                raise MalformedBody(f"corrupt {'gzip' if self._gzip else 'deflate'} data: {exc}") from exc
            if out:
                self.decoded_out += len(out)
                self._limits.check(self.decoded_out, self.encoded_in)
                yield out
            if self._obj.eof:
                data = self._obj.unused_data  # gzip: the next member, if any (RFC 1952 §2.2)
                self._obj = None
                self._ended = True
                continue
            data = self._obj.unconsumed_tail
            if not data and len(out) < self._piece:  # input used up and nothing held back
                return

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        # no bytes() copy of the input: the backend reads any buffer, and a fresh copy per call cost ~25 % on
        # incompressible data, where decoding is little more than a copy itself
        chunk: bytes | memoryview = data
        self.encoded_in += len(chunk)
        if not self._gzip and self._obj is None and not self._ended:
            self._head += bytes(chunk)
            if len(self._head) < 2:
                return
            chunk, self._head = self._head, b""
        yield from self._run(chunk)

    def finish(self) -> Iterator[bytes]:
        if self._head:
            yield from self._run(self._head)
            self._head = b""
        if self._obj is not None:
            yield from self._run_window(b"")  # what the decompressor still holds, in bounded pieces
        if self._obj is not None:
            raise MalformedBody("compressed stream is truncated")
        if not self._ended:
            raise MalformedBody("compressed stream is empty")


class _ZstdDecoder:
    def __init__(self, limits: DecodeLimits, piece_size: int) -> None:
        self._limits = limits
        self._piece = piece_size
        self._obj: _zstd.ZstdDecompressor | None = None
        self._ended = False
        self.encoded_in = 0
        self.decoded_out = 0

    def _run(self, data: bytes) -> Iterator[bytes]:
        while True:
            if self._obj is None:
                if not data:
                    return
                self._obj = _zstd.ZstdDecompressor(
                    options={_zstd.DecompressionParameter.window_log_max: ZSTD_MAX_WINDOW_LOG}
                )
                self._ended = False
            try:
                out = self._obj.decompress(data, self._piece)
            except _zstd.ZstdError as exc:
                raise MalformedBody(f"corrupt zstd data: {exc}") from exc
            data = b""
            if out:
                self.decoded_out += len(out)
                self._limits.check(self.decoded_out, self.encoded_in)
                yield out
            if self._obj.eof:
                data = self._obj.unused_data  # a following frame
                self._obj = None
                self._ended = True
                continue
            if self._obj.needs_input:
                return

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        chunk = bytes(data)
        self.encoded_in += len(chunk)
        yield from self._run(chunk)

    def finish(self) -> Iterator[bytes]:
        if self._obj is not None:
            yield from self._run(b"")
        if self._obj is not None or not self._ended:
            raise MalformedBody("zstd stream is truncated" if self._obj is not None else "zstd stream is empty")


class _IdentityDecoder:
    def __init__(self, limits: DecodeLimits) -> None:
        self._limits = limits
        self.encoded_in = 0
        self.decoded_out = 0

    def feed(self, data: bytes | memoryview) -> Iterator[bytes]:
        chunk = bytes(data)
        self.encoded_in += len(chunk)
        self.decoded_out += len(chunk)
        self._limits.check(self.decoded_out, self.encoded_in)
        if chunk:
            yield chunk

    def finish(self) -> Iterator[bytes]:
        return iter(())


def make_decoder(encoding: ContentEncoding, limits: DecodeLimits, piece_size: int = DEFAULT_PIECE) -> StreamDecoder:
    """A streaming decoder for ``encoding`` (``none`` passes bytes through, still counted against the limits)."""
    codec = CODECS.get(encoding)
    if codec is None:
        raise UnsupportedEncoding(f"cannot decode {encoding.value!r} as a stream", accepted=accepted_codings())
    return codec.decoder(limits, piece_size)


class StreamEncoder(Protocol):
    """Incremental encoding of one content coding."""

    def encode(self, data: bytes | memoryview) -> bytes:
        """The encoded bytes ``data`` gives so far (possibly empty)."""

    def finish(self) -> bytes:
        """The rest of the encoded stream."""


class _ZlibFamilyEncoder:
    def __init__(self, encoding: ContentEncoding, level: int) -> None:
        # isal levels are 0-3; level 1 is ~1 GB/s here with a smaller output than zlib level 6
        self._obj = isal_zlib.compressobj(level, isal_zlib.DEFLATED, 31 if encoding is ContentEncoding.GZIP else 15)

    def encode(self, data: bytes | memoryview) -> bytes:
        out: bytes = self._obj.compress(data)
        return out

    def finish(self) -> bytes:
        out: bytes = self._obj.flush()
        return out


class _ZstdEncoder:
    def __init__(self, level: int) -> None:
        params = zstandard.ZstdCompressionParameters.from_level(level, window_log=min(ZSTD_MAX_WINDOW_LOG, 23))
        self._obj = zstandard.ZstdCompressor(compression_params=params).compressobj()

    def encode(self, data: bytes | memoryview) -> bytes:
        return self._obj.compress(bytes(data))

    def finish(self) -> bytes:
        return self._obj.flush()


class _IdentityEncoder:
    def encode(self, data: bytes | memoryview) -> bytes:
        return bytes(data)

    def finish(self) -> bytes:
        return b""


def make_encoder(encoding: ContentEncoding, *, levels: Mapping[str, int] | None = None) -> StreamEncoder:
    """A streaming encoder; gzip/deflate levels are python-isal's (0-3), zstd levels zstandard's. Each codec takes
    the level ``levels`` holds under its entry's ``level_setting`` (see :func:`encoder_levels`), else its own
    default."""
    codec = CODECS.get(encoding)
    if codec is None:
        raise UnsupportedEncoding(f"cannot encode {encoding.value!r} as a stream")
    return codec.encoder((levels or {}).get(codec.level_setting or ""))


def encoder_levels(settings: object) -> dict[str, int]:
    """The level of every codec that has one, by its ``level_setting``, read from ``settings`` (a codec with a
    tunable level is its registry entry plus its settings field: nothing between passes levels one by one)."""
    return {c.level_setting: int(getattr(settings, c.level_setting)) for c in CODECS if c.level_setting}


@dataclass(frozen=True, slots=True)
class Codec:
    """One content coding, everything the service needs to know of it."""

    encoding: ContentEncoding  # its name in descriptors and records (``encoding``)
    http_token: str  # its Content-Encoding / Accept-Encoding token (RFC 9110 §8.4.1)
    decoder: Callable[[DecodeLimits, int], StreamDecoder]  # (limits, piece size)
    encoder: Callable[[int | None], StreamEncoder]  # (level or None: the codec's default)
    aliases: tuple[str, ...] = ()  # other tokens accepted on input (RFC 9110 §8.4.1.3: x-gzip)
    level_setting: str | None = None  # the Settings field with its level
    serve_rank: int | None = None  # responses may be compressed with it on the fly: lower ranks preferred


class CodecRegistry:
    """The codings of the service, in registration order."""

    def __init__(self, codecs: list[Codec]) -> None:
        self._codecs: dict[ContentEncoding, Codec] = {}
        for codec in codecs:
            self.register(codec)

    def register(self, codec: Codec) -> Codec | None:
        """Add ``codec`` (replacing the entry of its encoding, which is returned)."""
        previous = self._codecs.get(codec.encoding)
        self._codecs[codec.encoding] = codec
        return previous

    def __iter__(self) -> Iterator[Codec]:
        return iter(list(self._codecs.values()))

    def get(self, encoding: ContentEncoding) -> Codec | None:
        """The codec of ``encoding``, if registered."""
        return self._codecs.get(encoding)

    def from_token(self, token: str) -> Codec | None:
        """The codec an HTTP coding token names (its token or an alias)."""
        token = token.lower()
        for codec in self._codecs.values():
            if token in (codec.http_token, *codec.aliases):
                return codec
        return None

    def http_tokens(self) -> tuple[str, ...]:
        """The tokens of the real codings (not identity)."""
        return tuple(c.http_token for c in self._codecs.values() if c.encoding is not ContentEncoding.NONE)

    def storage_names(self) -> tuple[str, ...]:
        """What a client may ask the service to store content as."""
        return tuple(c.encoding.value for c in self._codecs.values())

    def served(self) -> tuple[str, ...]:
        """The tokens responses may be compressed with, preferred first."""
        ranked = [(c.serve_rank, c.http_token) for c in self._codecs.values() if c.serve_rank is not None]
        return tuple(token for _rank, token in sorted(ranked))

    def aliases_of(self, token: str) -> tuple[str, ...]:
        """The other tokens accepted for the coding ``token`` names."""
        codec = self.from_token(token)
        return () if codec is None else codec.aliases


_B64_PIECE = 3 * (64 << 10)  # input bytes per pybase64 call: a multiple of 3, output small enough to stay cached


class Base64Encoder:
    """Standard base64 (RFC 4648 §4) into one output buffer reused from call to call.

    pybase64 is ~20× stdlib on the bytes, but it returns a fresh object per call: for a 1 MiB input that is 1.4 MB
    of new memory each time, and touching fresh memory (page faults) costs more than encoding it on these hosts.
    Encoding in 192 KiB pieces into a buffer that lives as long as the encoder keeps both the pieces and the output
    warm.
    """

    def __init__(self) -> None:
        self._out = bytearray()

    def encode(self, data: bytes | memoryview) -> memoryview:
        """``data`` encoded; the view is valid until the next call (copy it with ``bytes()`` to keep it)."""
        view = memoryview(data).cast("B")
        need = 4 * -(-len(view) // 3)
        if len(self._out) < need:
            self._out = bytearray(need)
        out = memoryview(self._out)
        written = 0
        for start in range(0, len(view), _B64_PIECE):
            piece = pybase64.b64encode(view[start : start + _B64_PIECE])
            out[written : written + len(piece)] = piece
            written += len(piece)
        return out[:written]


def parse_accept_encoding(value: str) -> dict[str, float]:
    """``Accept-Encoding`` as ``{coding: qvalue}`` (RFC 9110 §12.5.3); malformed members are skipped."""
    out: dict[str, float] = {}
    for member in value.split(","):
        parts = [p.strip() for p in member.split(";")]
        coding = parts[0].lower()
        if not coding:
            continue
        q = 1.0
        for param in parts[1:]:
            name, _, val = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(val)
                except ValueError:
                    q = 0.0
        out[coding] = max(0.0, min(q, 1.0))
    return out


def choose_response_coding(accept_encoding: str | None, available: tuple[str, ...] | None = None) -> str | None:
    """The best of ``available`` (default: the codecs that serve responses, preferred first) the client accepts
    (highest q, ties in ``available`` order); None: identity."""
    if not accept_encoding:
        return None
    if available is None:
        available = CODECS.served()
    prefs = parse_accept_encoding(accept_encoding)
    best: tuple[float, int, str] | None = None
    for rank, coding in enumerate(available):
        q = prefs.get(coding, prefs.get("*", 0.0))
        alias = next((a for a in CODECS.aliases_of(coding) if a in prefs), None)
        if coding not in prefs and alias is not None:
            q = prefs[alias]
        if q > 0 and (best is None or (q, -rank) > (best[0], -best[1])):
            best = (q, rank, coding)
    return None if best is None else best[2]


CODECS = CodecRegistry(
    [
        Codec(
            ContentEncoding.NONE,
            "identity",
            lambda limits, _piece: _IdentityDecoder(limits),
            lambda _l: _IdentityEncoder(),
            aliases=("none",),  # our storage name, taken as identity on input too
        ),
        Codec(
            ContentEncoding.GZIP,
            "gzip",
            lambda limits, piece: _ZlibFamilyDecoder(ContentEncoding.GZIP, limits, piece),
            lambda level: _ZlibFamilyEncoder(ContentEncoding.GZIP, 1 if level is None else level),
            aliases=("x-gzip",),
            level_setting="gzip_level",
            serve_rank=2,
        ),
        Codec(
            ContentEncoding.DEFLATE,
            "deflate",
            lambda limits, piece: _ZlibFamilyDecoder(ContentEncoding.DEFLATE, limits, piece),
            lambda level: _ZlibFamilyEncoder(ContentEncoding.DEFLATE, 1 if level is None else level),
            level_setting="gzip_level",
        ),
        Codec(
            ContentEncoding.ZSTD,
            "zstd",
            lambda limits, piece: _ZstdDecoder(limits, piece),
            lambda level: _ZstdEncoder(3 if level is None else level),
            level_setting="zstd_level",
            serve_rank=1,
        ),
    ]
)
