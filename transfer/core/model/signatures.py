"""Media types from content signatures ("magic bytes") and file-name extensions, for the formats agents exchange.

Pure. :func:`signature_type` names a format only from a *clear* signature: a magic number checked together with the
structure right after it (a version byte, a box type, a length that fits), so that a text which merely starts with
the same letters ("BMW …", "ID3 tags …", "PAR1 …") is never taken for a binary format. That is what lets such a
signature win over a type a tool sends by default (see :func:`transfer.core.model.naming.resolve_content_type`).

Media types are the IANA-registered ones where they exist:

    application/vnd.apache.parquet          Apache Parquet (IANA, 2024)
    application/vnd.apache.arrow.file       Arrow IPC file = Feather v2 (IANA, 2021)
    application/vnd.apache.arrow.stream     Arrow IPC stream (IANA, 2021; by extension only: its start is no
                                            clear signature)
    application/vnd.sqlite3                 SQLite 3 database (IANA, 2018)
    application/pdf, application/zip, application/gzip, application/zstd (RFC 8878), the OOXML and ODF types,
    application/epub+zip, image/*, audio/*, video/* (audio/mp4 RFC 4337, audio/ogg and video/ogg RFC 5334,
    video/3gpp RFC 3839, image/avif, image/heic / image/heif)

and, for formats that have no registered type, the unregistered names in common use:

    application/x-npy, application/x-npz    NumPy arrays (the names ML serving stacks such as SageMaker use)
    application/x-safetensors               Hugging Face safetensors (no registration; x- by RFC 6838 §3.4)
    application/x-gguf                      GGUF model files of llama.cpp (no registration; x- as above)

The seed's constants (transfer.core.model.mime) are used where the seed names a type (``audio/wav``,
``video/x-msvideo``, ``video/x-matroska``, ``image/bmp``), so a sniffed type matches what an agent of the Synapse type
system expects.
"""

from __future__ import annotations

import struct
from typing import Final

from transfer.core.model import mime

PARQUET: Final = "application/vnd.apache.parquet"
ARROW_FILE: Final = "application/vnd.apache.arrow.file"
ARROW_STREAM: Final = "application/vnd.apache.arrow.stream"
SQLITE: Final = "application/vnd.sqlite3"
NPY: Final = "application/x-npy"
NPZ: Final = "application/x-npz"
SAFETENSORS: Final = "application/x-safetensors"
GGUF: Final = "application/x-gguf"
ZSTD: Final = "application/zstd"
DOCX: Final = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX: Final = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX: Final = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
EPUB: Final = "application/epub+zip"
JAR: Final = "application/java-archive"

# safetensors: the JSON header may be at most 100 MB (the format's own limit)
_SAFETENSORS_MAX_HEADER: Final = 100_000_000

# ftyp major brands (ISO/IEC 14496-12 §4.3) that are not plain MP4 video
_FTYP_BRANDS: Final = {
    b"qt  ": mime.MIME_VIDEO_MOV,
    b"M4A ": "audio/mp4",
    b"M4B ": "audio/mp4",
    b"M4P ": "audio/mp4",
    b"avif": "image/avif",
    b"avis": "image/avif",
    b"heic": "image/heic",
    b"heix": "image/heic",
    b"heim": "image/heic",
    b"heis": "image/heic",
    b"mif1": "image/heif",
    b"msf1": "image/heif",
}

# leading directory of an OOXML package's main part (ECMA-376 Part 2, Open Packaging Conventions)
_OOXML_PARTS: Final = {"word/": DOCX, "xl/": XLSX, "ppt/": PPTX}

# what a ZIP container holds, told by the name's extension when the first entries do not say
ZIP_REFINEMENTS: Final = {
    ".docx": DOCX,
    ".xlsx": XLSX,
    ".pptx": PPTX,
    ".npz": NPZ,
    ".epub": EPUB,
    ".jar": JAR,
    ".odt": "application/vnd.oasis.opendocument.text",
    ".ods": "application/vnd.oasis.opendocument.spreadsheet",
    ".odp": "application/vnd.oasis.opendocument.presentation",
}

# extensions Python's mimetypes does not know (or knows only from the host's /etc/mime.types, which varies)
EXTENSIONS: Final = {
    ".parquet": PARQUET,
    ".arrow": ARROW_FILE,
    ".feather": ARROW_FILE,
    ".arrows": ARROW_STREAM,
    ".npy": NPY,
    ".safetensors": SAFETENSORS,
    ".gguf": GGUF,
    ".sqlite": SQLITE,
    ".sqlite3": SQLITE,
    ".zst": ZSTD,
    ".jsonl": "application/x-ndjson",
    ".ndjson": "application/x-ndjson",
    ".md": mime.MIME_TEXT_MARKDOWN,
    ".webp": mime.MIME_IMAGE_WEBP,
    ".avif": "image/avif",
    ".flac": mime.MIME_AUDIO_FLAC,
    ".mkv": mime.MIME_VIDEO_MKV,
    ".webm": mime.MIME_VIDEO_WEBM,
    **ZIP_REFINEMENTS,
}


def extension_type(name: str | None) -> str | None:
    """The media type of a file name's extension from the table above, if it has one there."""
    if not name or "." not in name:
        return None
    return EXTENSIONS.get("." + name.rsplit(".", 1)[1].lower())


def signature_type(head: bytes, name: str | None = None) -> str | None:
    """The media type a clear signature at the start of ``head`` names, else None. ``name`` only refines a ZIP
    container whose first entries do not tell what it holds (``report.docx`` written without its parts first)."""
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):  # a local file header / an empty archive
        return _zip_type(head, name)
    for check in _CHECKS:
        found = check(head)
        if found is not None:
            return found
    return None


def _fixed(head: bytes) -> str | None:
    """Signatures that are a fixed byte string long or specific enough on their own."""
    for magic, media_type in _MAGIC:
        if head.startswith(magic):
            return media_type
    return None


_MAGIC: Final = (
    (b"SQLite format 3\x00", SQLITE),
    (b"ARROW1\x00\x00", ARROW_FILE),  # Arrow IPC file format: magic, then padding to 8 bytes
    (b"\x89PNG\r\n\x1a\n", mime.MIME_IMAGE_PNG),
    (b"%PDF-", mime.MIME_PDF),
    (b"GIF87a", mime.MIME_IMAGE_GIF),
    (b"GIF89a", mime.MIME_IMAGE_GIF),
    (b"\xff\xd8\xff", mime.MIME_IMAGE_JPEG),  # SOI then the first marker: never valid UTF-8, never text
    (b"\x28\xb5\x2f\xfd", ZSTD),  # RFC 8878 §3.1.1 frame magic (not UTF-8 either)
    (b"\xfd7zXZ\x00", "application/x-xz"),
    (b"7z\xbc\xaf\x27\x1c", "application/x-7z-compressed"),
)


def _parquet(head: bytes) -> str | None:
    # "PAR1", then Thrift compact protocol: a page header or, with no row groups, the footer; both begin with
    # field 1 of type i32, the byte 0x15 (Parquet format spec, "File format")
    return PARQUET if head[:4] == b"PAR1" and head[4:5] == b"\x15" else None


def _npy(head: bytes) -> str | None:
    # NEP 1: \x93NUMPY, major version 1-3, minor 0, then the header length
    return (
        NPY if head[:6] == b"\x93NUMPY" and head[6:7] in (b"\x01", b"\x02", b"\x03") and head[7:8] == b"\x00" else None
    )


def _gguf(head: bytes) -> str | None:
    # "GGUF", then a little-endian uint32 version (1-3 so far)
    if head[:4] != b"GGUF" or len(head) < 8:
        return None
    return GGUF if 1 <= struct.unpack_from("<I", head, 4)[0] <= 16 else None


def _safetensors(head: bytes) -> str | None:
    # a little-endian uint64 header length N (bounded), then N bytes of JSON that begin with "{"
    if len(head) < 10:
        return None
    (length,) = struct.unpack_from("<Q", head)
    if not 2 <= length <= _SAFETENSORS_MAX_HEADER or head[8:9] != b"{":
        return None
    rest = head[9 : 9 + min(length - 1, 64)].lstrip(b" \t\r\n")
    return SAFETENSORS if rest[:1] in (b'"', b"}") else None


def _gzip(head: bytes) -> str | None:
    # RFC 1952 §2.3.1: ID1 ID2, CM = 8 (deflate), reserved FLG bits zero
    return mime.MIME_GZIP if head[:3] == b"\x1f\x8b\x08" and len(head) > 3 and head[3] & 0xE0 == 0 else None


def _bzip2(head: bytes) -> str | None:
    return "application/x-bzip2" if head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] == b"1AY&SY" else None


def _riff(head: bytes) -> str | None:
    if head[:4] != b"RIFF":
        return None
    return {b"WEBP": mime.MIME_IMAGE_WEBP, b"WAVE": mime.MIME_AUDIO_WAV, b"AVI ": mime.MIME_VIDEO_AVI}.get(head[8:12])


def _ftyp(head: bytes) -> str | None:
    # ISO base media file (MP4, MOV, 3GP, HEIF, AVIF): a first box of type "ftyp" and a sane size
    if head[4:8] != b"ftyp" or len(head) < 12:
        return None
    (size,) = struct.unpack_from(">I", head)
    if not 16 <= size <= 4096 or size % 4:
        return None
    brand = head[8:12]
    if brand in _FTYP_BRANDS:
        return _FTYP_BRANDS[brand]
    if brand.startswith(b"3gp"):
        return "video/3gpp"
    if brand.startswith(b"3g2"):
        return "video/3gpp2"
    return mime.MIME_VIDEO_MP4


def _ebml(head: bytes) -> str | None:
    # Matroska / WebM: the EBML header element, whose DocType names the flavour (RFC 9559 §5.1, RFC 8794)
    if head[:4] != b"\x1a\x45\xdf\xa3":
        return None
    top = head[:64]
    if b"\x42\x82" in top:
        doctype = top[top.index(b"\x42\x82") + 2 :]
        if doctype[1:5] == b"webm":
            return mime.MIME_VIDEO_WEBM
        if doctype[1:9] == b"matroska":
            return mime.MIME_VIDEO_MKV
    return None


def _audio(head: bytes) -> str | None:
    if head[:3] == b"ID3" and head[3:4] in (b"\x02", b"\x03", b"\x04") and head[4:5] == b"\x00":
        return mime.MIME_AUDIO_MP3  # an ID3v2 tag: major version 2-4, revision 0
    if head[:4] == b"fLaC" and len(head) > 4 and head[4] & 0x7F == 0:
        return mime.MIME_AUDIO_FLAC  # the first metadata block is STREAMINFO
    if head[:5] == b"OggS\x00":
        # RFC 5334: video/ogg when the first stream is video (Theora), audio/ogg for Vorbis, Opus, FLAC, Speex
        return "video/ogg" if b"\x80theora" in head[:64] else mime.MIME_AUDIO_OGG
    return None


def _bitmap(head: bytes) -> str | None:
    # BMP: "BM", reserved fields zero, and a known DIB header size (12, 40, 52, 56, 64, 108 or 124)
    if head[:2] != b"BM" or len(head) < 18 or head[6:10] != b"\x00\x00\x00\x00":
        return None
    return mime.MIME_IMAGE_BMP if struct.unpack_from("<I", head, 14)[0] in (12, 40, 52, 56, 64, 108, 124) else None


def _tiff(head: bytes) -> str | None:
    return mime.MIME_IMAGE_TIFF if head[:4] in (b"II*\x00", b"MM\x00*") else None


def _tar(head: bytes) -> str | None:
    return "application/x-tar" if head[257:262] == b"ustar" and head[262:263] in (b"\x00", b" ") else None


_CHECKS: Final = (
    _fixed,
    _parquet,
    _npy,
    _gguf,
    _safetensors,
    _gzip,
    _bzip2,
    _riff,
    _ftyp,
    _ebml,
    _audio,
    _bitmap,
    _tiff,
    _tar,
)


def _zip_entries(head: bytes) -> list[tuple[str, bytes]]:
    """(name, first bytes of its data) of the local file headers that start within ``head`` (APPNOTE §4.3.7)."""
    entries = []
    at = 0
    while len(head) - at >= 30 and head[at : at + 4] == b"PK\x03\x04":
        method, csize = struct.unpack_from("<H", head, at + 8)[0], struct.unpack_from("<I", head, at + 18)[0]
        name_len, extra_len = struct.unpack_from("<HH", head, at + 26)
        name = head[at + 30 : at + 30 + name_len].decode("utf-8", "replace")
        start = at + 30 + name_len + extra_len
        entries.append((name, head[start : start + min(csize, 80)] if method == 0 else b""))
        flags = struct.unpack_from("<H", head, at + 6)[0]
        if flags & 0x08 and csize == 0:  # sizes in a data descriptor after the data: the next header is not here
            break
        at = start + csize
    return entries


def _zip_type(head: bytes, name: str | None) -> str:
    entries = _zip_entries(head)
    if entries:
        first_name, first_data = entries[0]
        if first_name == "mimetype" and first_data.startswith((b"application/", b"text/")):
            # ODF (OASIS ODF 1.2 Part 3 §3.3) and EPUB (OCF §4.3): an uncompressed first entry holds the type
            declared = first_data.split(b"\n")[0].strip().decode("ascii", "replace")
            if mime.is_media_type(declared):
                return declared
        names = [entry for entry, _ in entries]
        for prefix, media_type in _OOXML_PARTS.items():
            if any(n.startswith(prefix) for n in names):
                return media_type
        if all(n.endswith(".npy") for n in names):
            return NPZ  # numpy.savez: one .npy entry per array
    refined = ZIP_REFINEMENTS.get("." + name.rsplit(".", 1)[1].lower()) if name and "." in name else None
    return refined or mime.MIME_ZIP
