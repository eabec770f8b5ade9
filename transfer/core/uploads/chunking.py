"""Content-defined chunk manifests: what a client that cut a file into FastCDC chunks tells the service, checked here
without I/O.

    manifest = {"size": n, "checksum": "sha256:<hex of the whole file>",
                "chunks": [{"offset": 0, "length": l0, "sha256": "<hex>"}, {"offset": l0, ...}, ...]}

Rules (each broken rule has its own error): the chunks tile the file exactly, in order, from offset 0 (no gap, no
overlap: ``invalid_manifest``); their lengths add up to ``size`` (``manifest_size_mismatch``); each is 1 to
:data:`MAX_CHUNK` bytes; at most ``max_chunks`` of them (``manifest_too_large``: a manifest is parsed whole, so it
is bounded before the work it costs). A chunk is named by its SHA-256 only: whose it is, is the service's business
(chunks are kept per API key, never looked up across keys).

The chunker parameters every client uses are the service's (:data:`CHUNKING`, offered in ``GET /v1/chunked``):
two uploads share chunks only if they were cut the same way. The average was chosen by measurement (a 256 MiB file
with 1 % changed in 20 places: 64 KiB resends 1.9 % of the file, 256 KiB 4.3 %, 1 MiB 13 %; see the README).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transfer.core.model.content import checksum_hex
from transfer.errors import InvalidManifest, ManifestSizeMismatch, ManifestTooLarge, TransferError

ALGORITHM = "fastcdc-2020"
AVG_CHUNK = 64 << 10  # FastCDC's average parameter (the mean chunk comes out near avg + min, about 80 KiB)
MIN_CHUNK = 16 << 10
MAX_CHUNK_CUT = 256 << 10  # what the chunker cuts at most
MAX_CHUNK = 4 << 20  # what the service accepts as one chunk (any client's chunker, bounded buffers)
MAX_CHUNKS = 200_000  # chunks per manifest: 15 GiB at the average size; a manifest is parsed whole
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

CHUNKING: dict[str, Any] = {
    "algorithm": ALGORITHM,
    "avg_size": AVG_CHUNK,
    "min_size": MIN_CHUNK,
    "max_size": MAX_CHUNK_CUT,
    "normalized_chunking": 1,
    "seed": 0,
    "hash": "sha256",
}


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a file: ``length`` bytes at ``offset`` whose SHA-256 is ``sha256`` (hex)."""

    offset: int
    length: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        """The chunk as a manifest entry."""
        return {"offset": self.offset, "length": self.length, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Manifest:
    """A whole file as chunks: ``size`` bytes whose SHA-256 is ``sha256`` (hex), tiled by ``chunks``."""

    size: int
    sha256: str
    chunks: tuple[Chunk, ...]

    def distinct(self) -> dict[str, int]:
        """Each chunk hash once, with its length (a file may repeat a chunk)."""
        return {c.sha256: c.length for c in self.chunks}

    def to_json(self) -> dict[str, Any]:
        """The manifest as clients send it (``size``, ``checksum``, ``chunks`` with offsets)."""
        return {
            "size": self.size,
            "checksum": "sha256:" + self.sha256,
            "chunks": [c.to_json() for c in self.chunks],
        }

    def compact(self) -> dict[str, Any]:
        """The form records keep: lengths and hashes (offsets follow from the lengths)."""
        return {"size": self.size, "sha256": self.sha256, "chunks": [[c.length, c.sha256] for c in self.chunks]}

    @classmethod
    def from_compact(cls, doc: Mapping[str, Any]) -> Manifest:
        """A manifest from its compact form (``chunks``: ``[length, sha256]`` pairs, offsets implied)."""
        chunks: list[Chunk] = []
        at = 0
        for length, sha in doc["chunks"]:
            chunks.append(Chunk(at, int(length), str(sha)))
            at += int(length)
        return cls(size=int(doc["size"]), sha256=str(doc["sha256"]), chunks=tuple(chunks))


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidManifest(f"{what} must be an integer")
    return value


def parse_manifest(doc: Any, *, max_chunks: int = MAX_CHUNKS, max_size: int | None = None) -> Manifest:
    """The manifest ``doc`` (parsed JSON) describes, or the error of the first rule it breaks (module text)."""
    if not isinstance(doc, Mapping):
        raise InvalidManifest("a manifest is a JSON object with size, checksum and chunks")
    size = _int(doc.get("size"), "size")
    if size < 0:
        raise InvalidManifest("size must not be negative")
    if max_size is not None and size > max_size:
        raise ManifestTooLarge(f"{size} bytes exceed the upload limit of {max_size}", limit=max_size)
    try:
        sha = checksum_hex(str(doc.get("checksum", "")))
    except TransferError as exc:
        raise InvalidManifest("checksum must be sha256:<64 hex digits> of the whole file") from exc
    raw = doc.get("chunks")
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        raise InvalidManifest("chunks must be a list of {offset, length, sha256}")
    if len(raw) > max_chunks:
        raise ManifestTooLarge(f"{len(raw)} chunks; a manifest holds at most {max_chunks}", limit=max_chunks)
    chunks: list[Chunk] = []
    at = 0
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise InvalidManifest(f"chunk {i} must be an object {{offset, length, sha256}}", index=i)
        offset = _int(entry.get("offset"), f"chunk {i} offset")
        length = _int(entry.get("length"), f"chunk {i} length")
        digest = entry.get("sha256")
        if offset != at:
            raise InvalidManifest(f"chunk {i} starts at {offset}, the previous one ends at {at}", index=i)
        if not 1 <= length <= MAX_CHUNK:
            raise InvalidManifest(f"chunk {i} is {length} bytes; a chunk is 1 to {MAX_CHUNK}", index=i)
        if not isinstance(digest, str) or not SHA256_HEX.match(digest.lower()):
            raise InvalidManifest(f"chunk {i} sha256 must be 64 hex digits", index=i)
        chunks.append(Chunk(offset, length, digest.lower()))
        at += length
    if at != size:
        raise ManifestSizeMismatch(
            f"the chunks add up to {at} bytes, the manifest declares {size}", declared=size, chunks_total=at
        )
    return Manifest(size=size, sha256=sha, chunks=tuple(chunks))
