"""Web conventions real clients rely on: `curl -T` (PUT) uploads, CORS headers browser code can read, the 415's
Accept-Encoding, and content types recognised from the bytes (a clear signature beats a tool's default type)."""

from __future__ import annotations

import base64
import bz2
import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import tarfile
import wave
import zipfile
import zlib
from pathlib import Path
from typing import Any

import httpx
import numpy
import PIL.Image
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import LiveServer, running
from transfer.core.model.mime import is_media_type, is_textual
from transfer.core.model.naming import resolve_content_type, sniff_content_type
from transfer.service.files.ingest import SNIFF_BYTES
from transfer.settings import Settings


def curl(*args: str) -> tuple[int, dict[str, str], bytes]:
    """Run the real curl; (status, response header fields lower-cased, body)."""
    if shutil.which("curl") is None:
        pytest.fail("curl is needed (Debian: apt-get install curl)")
    done = subprocess.run(["curl", "-sS", "-D", "-", *args], capture_output=True, check=True, timeout=120)
    head, _, body = done.stdout.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):  # curl -T sends Expect: 100-continue for larger bodies
        head, _, body = body.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), fields, body


# --- PUT /v1/files/{name}: curl -T ---


def test_curl_upload_file_puts_a_file(live_server: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)  # above curl's 1 MiB Expect: 100-continue threshold
    source = tmp_path / "report 2026.bin"
    source.write_bytes(data)
    # a URL ending in / makes curl append the local file name (percent-encoded)
    status, fields, body = curl("-T", str(source), f"{live_server.url}/v1/files/")
    assert status == 201, body
    doc = json.loads(body)
    assert doc["name"] == "report 2026.bin" and doc["size"] == len(data)
    assert doc["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert fields["location"].startswith("/v1/files/f_") and fields["location"].split("/")[-1] in doc["url"]
    got = httpx.get(doc["url"], timeout=30)
    assert got.status_code == 200 and got.content == data


def test_curl_upload_to_the_collection_url_is_an_upload_too(live_server: LiveServer, tmp_path: Path) -> None:
    source = tmp_path / "notes.txt"
    source.write_bytes(b"some notes\n" * 100)
    # no trailing slash: curl names no file and PUTs to /v1/files itself
    status, fields, body = curl("-T", str(source), f"{live_server.url}/v1/files?name=notes.txt")
    assert status == 201, body
    assert json.loads(body)["name"] == "notes.txt" and fields["location"].startswith("/v1/files/f_")


def test_put_has_the_semantics_of_post(live_server: LiveServer, tmp_path: Path) -> None:
    text = b'{"rows": [1, 2, 3]}\n' * 5000
    source = tmp_path / "rows.json.gz"
    source.write_bytes(gzip.compress(text))
    sha = hashlib.sha256(text).hexdigest()
    # Content-Encoding decoded on the way in, the checksum verified, metadata from the query, an explicit name
    status, _, body = curl(
        "-T",
        str(source),
        "-H",
        "Content-Encoding: gzip",
        "-H",
        "Content-Type: application/json",
        f"{live_server.url}/v1/files/rows.json?checksum=sha256:{sha}&role=attachment&description=rows",
    )
    assert status == 201, body
    doc = json.loads(body)
    assert (doc["name"], doc["size"], doc["checksum"]) == ("rows.json", len(text), f"sha256:{sha}")
    assert (doc["content_type"], doc["role"], doc["description"]) == ("application/json", "attachment", "rows")
    # a wrong checksum is refused as on POST, and nothing is stored
    status, _, body = curl(
        "-T", str(source), "-H", "Content-Encoding: gzip", f"{live_server.url}/v1/files/x?checksum=sha256:{'0' * 64}"
    )
    assert status == 422 and json.loads(body)["error"]["code"] == "checksum_mismatch"
    assert live_server.leftovers() == []


def test_put_needs_the_upload_scope(tmp_path: Path) -> None:
    keys = {"reader": {"sha256": hashlib.sha256(b"r" * 32).hexdigest(), "scopes": ["read"]}}
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys)
    with running(settings) as live:
        anonymous = httpx.put(f"{live.url}/v1/files/a.txt", content=b"hello")
        assert anonymous.status_code == 401
        reader = httpx.put(
            f"{live.url}/v1/files/a.txt", content=b"hello", headers={"authorization": "Bearer " + "r" * 32}
        )
        assert reader.status_code == 403


# --- CORS: what browser code may read ---

ORIGIN = "https://app.example"
# what script needs no exposure for: Fetch's safelisted response headers, and fields about the connection or for the
# browser itself (CORS, nosniff, CSP sandbox, caching)
NOT_FOR_SCRIPT = {
    "cache-control",
    "content-language",
    "content-type",
    "expires",
    "pragma",
    "date",
    "server",
    "vary",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "x-accel-buffering",
    "x-content-type-options",
    "content-security-policy",
}


def test_cors_exposes_every_header_browser_code_reads(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, cors_allow_origins=[ORIGIN]
    )
    tus = {"tus-resumable": "1.0.0", "origin": ORIGIN}
    seen: list[httpx.Response] = []
    with running(settings) as live, httpx.Client(base_url=live.url, headers={"origin": ORIGIN}, timeout=30) as http:
        http.event_hooks["response"] = [seen.append]
        preflight = http.options(
            "/tus/files",
            headers={
                "access-control-request-method": "PATCH",
                "access-control-request-headers": "upload-offset,tus-resumable",
            },
        )
        assert preflight.status_code == 200 and "PATCH" in preflight.headers["access-control-allow-methods"]
        http.options("/tus/files", headers=tus)  # the tus capability request: Tus-Version, -Extension, -Max-Size, ...
        created = http.post(
            "/tus/files", headers={**tus, "upload-length": "10", "upload-metadata": "filename YS50eHQ="}
        )
        assert created.status_code == 201
        patched = http.patch(
            created.headers["location"],
            content=b"0123456789",
            headers={**tus, "upload-offset": "0", "content-type": "application/offset+octet-stream"},
        )
        assert patched.status_code == 204
        assert http.head(created.headers["location"], headers=tus).status_code == 200
        deferred = http.post("/tus/files", headers={**tus, "upload-defer-length": "1"})
        assert http.head(deferred.headers["location"], headers=tus).status_code == 200
        partial = http.post("/tus/files", headers={**tus, "upload-length": "3", "upload-concat": "partial"})
        assert http.head(partial.headers["location"], headers=tus).status_code == 200
        doc = http.post("/v1/files", content=b"x" * 5000, params={"inline": "false"}).json()
        ranged = http.get(doc["url"], headers={"range": "bytes=0-9"})
        assert ranged.status_code == 206
        refused = http.put("/v1/files/a.bin", content=b"x", headers={"content-encoding": "br"})
        assert refused.status_code == 415
    exposed_sets = {
        r.headers.get("access-control-expose-headers", "")
        for r in seen
        if r.request.method != "OPTIONS" or "tus-version" in r.headers
    }
    assert len(exposed_sets) == 1
    exposed = {h.strip().lower() for h in exposed_sets.pop().split(",")}
    # the list, then every field any of these responses carried
    wanted = {"accept-ranges", "content-range", "content-length", "etag", "repr-digest", "location"}
    wanted |= {"upload-offset", "upload-length", "tus-resumable", "tus-version", "tus-extension", "tus-max-size"}
    assert wanted <= exposed
    sent = {name.lower() for r in seen for name in r.headers}
    readable = {n for n in sent if not n.startswith("access-control-")} - NOT_FOR_SCRIPT
    assert readable - exposed == set(), f"sent but hidden from browser code: {sorted(readable - exposed)}"
    assert {n for n in sent if n.startswith(("tus-", "upload-"))} <= exposed


# --- 415 unsupported_encoding names what would have been accepted (RFC 9110 §15.5.16) ---


def accepted_codings(response: httpx.Response) -> list[str]:
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_encoding", response.text
    return [c.strip() for c in response.headers["accept-encoding"].split(",")]


ENCODERS = {
    "gzip": gzip.compress,
    "deflate": zlib.compress,  # the zlib-wrapped stream (RFC 9110 §8.4.1.2)
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
    "identity": lambda data: data,
}


@pytest.mark.parametrize(
    ("headers", "params"),
    [
        ({"content-encoding": "br"}, {}),
        ({"content-encoding": "compress"}, {}),
        ({"content-encoding": "gzip, gzip"}, {}),  # stacked codings
        ({}, {"encoding": "base64"}),
        ({}, {"encoding": "lz4"}),
    ],
)
def test_upload_415_lists_every_coding_it_accepts_and_each_works(
    http: httpx.Client, headers: dict[str, str], params: dict[str, str]
) -> None:
    for method, url in (("POST", "/v1/files"), ("PUT", "/v1/files/a.txt")):
        listed = accepted_codings(http.request(method, url, content=b"abc", headers=headers, params=params))
        assert set(listed) == set(ENCODERS)
    text = b"the same words again and again " * 1000
    for coding in listed:  # what the 415 promised is what an upload really takes
        r = http.post("/v1/files", content=ENCODERS[coding](text), headers={"content-encoding": coding})
        assert r.status_code == 201, r.text
        assert r.json()["checksum"] == "sha256:" + hashlib.sha256(text).hexdigest()


def test_routes_that_store_bytes_as_sent_refuse_a_content_coding(http: httpx.Client, live_server: LiveServer) -> None:
    # before: a gzip body PATCHed to tus or PUT as a chunk was stored compressed and taken for the content
    body = gzip.compress(b"0123456789")
    tus = {"tus-resumable": "1.0.0"}
    created = http.post("/tus/files", headers={**tus, "upload-length": str(len(body))})
    patch_headers = {**tus, "upload-offset": "0", "content-type": "application/offset+octet-stream"}
    refused = http.patch(
        created.headers["location"], content=body, headers={**patch_headers, "content-encoding": "gzip"}
    )
    assert accepted_codings(refused) == ["identity"]
    assert http.head(created.headers["location"], headers=tus).headers["upload-offset"] == "0"
    fine = http.patch(
        created.headers["location"], content=body, headers={**patch_headers, "content-encoding": "identity"}
    )
    assert fine.status_code == 204

    session = http.post("/v1/sessions", json={"size": len(body)}).json()
    sid = session["streaming_session_id"]
    checksum = {"chunk-checksum": "sha256:" + hashlib.sha256(body).hexdigest()}
    chunk = http.put(f"/v1/sessions/{sid}/chunks/0", content=body, headers={**checksum, "content-encoding": "gzip"})
    assert accepted_codings(chunk) == ["identity"]
    assert http.put(f"/v1/sessions/{sid}/chunks/0", content=body, headers=checksum).status_code in (200, 201, 204)


# --- content types: the formats agents exchange, recognised from their bytes ---


def _zip(entries: list[tuple[str, bytes]], *, stored: bool = False) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return out.getvalue()


def _ooxml(main_part: str) -> bytes:
    # the layout every OOXML writer produces (ECMA-376 Part 2): content types, package relationships, the main part
    return _zip([("[Content_Types].xml", b"<Types/>"), ("_rels/.rels", b"<Relationships/>"), (main_part, b"<x/>")])


def _image(fmt: str) -> bytes:
    out = io.BytesIO()
    PIL.Image.new("RGB", (4, 4), (200, 30, 30)).save(out, format=fmt)
    return out.getvalue()


def _numpy(save: Any) -> bytes:
    out = io.BytesIO()
    save(out)
    return out.getvalue()


def _sqlite(tmp: Path) -> bytes:
    db = tmp / "t.sqlite"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("create table t (x integer)")
        conn.commit()
    return db.read_bytes()


def _wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x01" * 800)
    return out.getvalue()


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        info = tarfile.TarInfo("a.txt")
        info.size = 3
        archive.addfile(info, io.BytesIO(b"abc"))
    return out.getvalue()


def _safetensors() -> bytes:
    # the format in full: u64 LE header length, JSON header (padded with spaces to 8 bytes), tensor bytes
    header = json.dumps({"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    header += " " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header.encode() + struct.pack("<2f", 1.0, 2.0)


def _gguf() -> bytes:
    # GGUF v3: magic, version, tensor count, metadata count, then key/value pairs (string key, type 8 = string)
    key, value = b"general.architecture", b"llama"
    kv = struct.pack("<Q", len(key)) + key + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + kv


def _parquet() -> bytes:
    # "PAR1", a column chunk's first page header (Thrift compact: type=DICTIONARY_PAGE, sizes, ...), data, then the
    # footer length and "PAR1" again: the bytes pyarrow writes
    page = b"\x15\x04\x15\x10\x15\x10\x4c\x15\x02\x15\x00\x00\x00" + bytes(16)
    footer = b"\x15\x04\x19\x1c\x35\x00\x18\x06schema\x15\x02\x00\x00"
    return b"PAR1" + page + footer + struct.pack("<I", len(footer)) + b"PAR1"


def _arrow_file() -> bytes:
    # Arrow IPC file: "ARROW1", 2 bytes padding, then the stream (continuation marker, metadata length, ...)
    return b"ARROW1\x00\x00" + b"\xff\xff\xff\xff" + struct.pack("<i", 16) + bytes(16) + b"ARROW1"


def _iso_media(brand: bytes) -> bytes:
    ftyp = struct.pack(">I", 24) + b"ftyp" + brand + b"\x00\x00\x02\x00" + brand + b"iso2"
    return ftyp + struct.pack(">I", 8) + b"free" + bytes(64)


def _ebml(doctype: bytes) -> bytes:
    body = b"\x42\x86\x81\x01\x42\xf7\x81\x01\x42\xf2\x81\x04\x42\xf3\x81\x08\x42\x82" + bytes([0x80 | len(doctype)])
    body += doctype
    return b"\x1a\x45\xdf\xa3" + bytes([0x80 | len(body)]) + body + bytes(32)


def _ogg(codec: bytes) -> bytes:
    return b"OggS\x00\x02" + bytes(8) + b"\x01\x00\x00\x00" + bytes(8) + b"\x01\x1e" + codec + bytes(40)


SAMPLES: dict[str, tuple[Any, str]] = {
    # name: (bytes, or a function of a temp dir that makes them; the media type expected)
    "parquet": (_parquet(), "application/vnd.apache.parquet"),
    "arrow-file (feather v2)": (_arrow_file(), "application/vnd.apache.arrow.file"),
    "npy": (_numpy(lambda f: numpy.save(f, numpy.arange(10))), "application/x-npy"),
    "npz": (_numpy(lambda f: numpy.savez(f, a=numpy.arange(3), b=numpy.ones(2))), "application/x-npz"),
    "npz compressed": (_numpy(lambda f: numpy.savez_compressed(f, a=numpy.arange(3))), "application/x-npz"),
    "safetensors": (_safetensors(), "application/x-safetensors"),
    "gguf": (_gguf(), "application/x-gguf"),
    "sqlite": (_sqlite, "application/vnd.sqlite3"),
    "pdf": (_image("PDF"), "application/pdf"),
    "docx": (_ooxml("word/document.xml"), "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
    "xlsx": (_ooxml("xl/workbook.xml"), "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"),
    "pptx": (
        _ooxml("ppt/presentation.xml"),
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ),
    "odt": (
        _zip([("mimetype", b"application/vnd.oasis.opendocument.text"), ("content.xml", b"<x/>")], stored=True),
        "application/vnd.oasis.opendocument.text",
    ),
    "epub": (
        _zip([("mimetype", b"application/epub+zip"), ("META-INF/container.xml", b"<x/>")], stored=True),
        "application/epub+zip",
    ),
    "zip": (_zip([("notes.txt", b"hello"), ("data.csv", b"a,b\n")]), "application/zip"),
    "png": (_image("PNG"), "image/png"),
    "jpeg": (_image("JPEG"), "image/jpeg"),
    "gif": (_image("GIF"), "image/gif"),
    "webp": (_image("WEBP"), "image/webp"),
    "bmp": (_image("BMP"), "image/bmp"),
    "tiff": (_image("TIFF"), "image/tiff"),
    "avif": (_iso_media(b"avif"), "image/avif"),
    "wav": (_wav(), "audio/wav"),
    "mp3 (ID3v2.4)": (b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + b"\xff\xfb\x90\x64" + bytes(64), "audio/mpeg"),
    "flac": (b"fLaC\x00\x00\x00\x22" + bytes(34), "audio/flac"),
    "ogg vorbis": (_ogg(b"\x01vorbis"), "audio/ogg"),
    "ogg opus": (_ogg(b"OpusHead"), "audio/ogg"),
    "ogg theora": (_ogg(b"\x80theora"), "video/ogg"),
    "m4a": (_iso_media(b"M4A "), "audio/mp4"),
    "mp4": (_iso_media(b"isom"), "video/mp4"),
    "mov": (_iso_media(b"qt  "), "video/quicktime"),
    "3gp": (_iso_media(b"3gp5"), "video/3gpp"),
    "webm": (_ebml(b"webm"), "video/webm"),
    "mkv": (_ebml(b"matroska"), "video/x-matroska"),
    "avi": (b"RIFF\x24\x00\x00\x00AVI LIST" + bytes(64), "video/x-msvideo"),
    "gzip": (gzip.compress(b"x" * 100), "application/gzip"),
    "bzip2": (bz2.compress(b"x" * 100), "application/x-bzip2"),
    "xz": (lzma.compress(b"x" * 100), "application/x-xz"),
    "zstd": (zstandard.ZstdCompressor().compress(b"x" * 100), "application/zstd"),
    "tar": (_tar(), "application/x-tar"),
    # text that merely starts with a signature's letters stays text
    "text: BMW": (b"BMW cars are fine\n", "text/plain"),
    "text: ID3": (b"ID3 tags are metadata\n", "text/plain"),
    "text: PAR1": (b"PAR1 of the report\n", "text/plain"),
    "text: GGUF": (b"GGUF models run locally\n", "text/plain"),
    "text: MZ": (b"MZ is a prefix\n", "text/plain"),
    "text: fLaC": (b"fLaC is a word\n", "text/plain"),
    "json": (b'{"a": [1, 2, 3]}', "application/json"),
    "html": (b"<!DOCTYPE html><html><body>x</body></html>", "text/html"),
    "binary without a signature": (random.Random(7).randbytes(4096), "application/octet-stream"),
}


@pytest.mark.parametrize("sample", list(SAMPLES))
def test_formats_agents_exchange_are_recognised_from_their_bytes(sample: str, tmp_path: Path) -> None:
    data, expected = SAMPLES[sample]
    data = data(tmp_path) if callable(data) else data
    assert sniff_content_type(data[:SNIFF_BYTES], None) == expected


@pytest.mark.parametrize(
    ("name", "entries", "expected"),
    [
        # the main part beyond the sniffed sample (a large first entry): the extension tells what the ZIP holds
        (
            "report.docx",
            [("docProps/thumbnail.jpeg", os.urandom(8000)), ("word/document.xml", b"<x/>")],
            "wordprocessingml",
        ),
        ("arrays.npz", [("meta.json", os.urandom(8000)), ("a.npy", b"")], "application/x-npz"),
        (
            "bundle.zip",
            [("docProps/thumbnail.jpeg", os.urandom(8000)), ("word/document.xml", b"<x/>")],
            "application/zip",
        ),
        (None, [("docProps/thumbnail.jpeg", os.urandom(8000)), ("word/document.xml", b"<x/>")], "application/zip"),
    ],
)
def test_a_zip_is_refined_by_its_name_only_when_its_head_does_not_say(
    name: str | None, entries: list[tuple[str, bytes]], expected: str
) -> None:
    data = _zip(entries, stored=True)
    assert expected in sniff_content_type(data[:SNIFF_BYTES], name)


PARQUET = _parquet()
RESOLVE_CASES = [
    # (head, name, declared (query/form field), hinted (Content-Type header / part type), expected)
    (PARQUET, None, None, "application/json", "application/vnd.apache.parquet"),  # HTTPie's default
    (PARQUET, None, None, "application/x-www-form-urlencoded", "application/vnd.apache.parquet"),  # curl --data
    (PARQUET, None, None, "text/plain;charset=UTF-8", "application/vnd.apache.parquet"),  # fetch with a string
    (PARQUET, None, None, "application/octet-stream", "application/vnd.apache.parquet"),
    (PARQUET, None, None, "text/csv", "application/vnd.apache.parquet"),  # text claimed for a binary signature
    (PARQUET, None, "application/json", "text/plain", "application/json"),  # the client's word wins
    (PARQUET, None, None, "application/x-custom", "application/x-custom"),  # a specific type stands
    (_zip([("a.xml", b"<x/>")]), None, None, "application/vnd.ms-excel", "application/vnd.ms-excel"),
    (random.Random(3).randbytes(4096), None, None, "application/json", "application/octet-stream"),
    (b'{"a": 1}', None, None, "application/json; charset=utf-8", "application/json; charset=utf-8"),
    (b'{"rows": [' + b"1, " * 3000, None, None, "application/json", "application/json"),  # longer than the sample
    (b"plain words\n", None, None, "text/plain; charset=utf-8", "text/plain; charset=utf-8"),
    (b"a,b\n1,2\n", "data.csv", None, "text/plain", "text/csv"),
    (b'{"a": 1}\n{"a": 2}\n', None, None, "application/x-ndjson", "application/x-ndjson"),
    (random.Random(5).randbytes(64), None, None, "image/jpeg", "image/jpeg"),  # a browser's type from the extension
    (b"", "empty.txt", None, None, "text/plain"),
]


@pytest.mark.parametrize(("head", "name", "declared", "hinted", "expected"), RESOLVE_CASES)
def test_a_clear_signature_wins_over_a_tool_default_never_over_the_clients_word(
    head: bytes, name: str | None, declared: str | None, hinted: str | None, expected: str
) -> None:
    assert resolve_content_type(head[:SNIFF_BYTES], name, declared=declared, hinted=hinted) == expected


def test_httpie_default_json_on_a_parquet_body_is_stored_and_served_as_parquet(http: httpx.Client) -> None:
    data = _parquet() + os.urandom(200_000)
    # HTTPie sends Content-Type: application/json for a body from stdin; before, this was stored as JSON and
    # served gzip-compressed as text
    r = http.post("/v1/files", content=data, headers={"content-type": "application/json"}, params={"inline": "false"})
    assert r.status_code == 201 and r.json()["content_type"] == "application/vnd.apache.parquet"
    got = httpx.get(r.json()["url"], headers={"accept-encoding": "gzip, zstd"})
    assert got.headers["content-type"].startswith("application/vnd.apache.parquet")
    assert "content-encoding" not in got.headers and got.content == data
    explicit = http.post(
        "/v1/files", content=data, headers={"content-type": "text/plain"}, params={"content_type": "application/x-mine"}
    )
    assert explicit.json()["content_type"] == "application/x-mine"


def test_a_content_type_form_field_wins_over_the_file_parts_type_in_any_order(http: httpx.Client) -> None:
    data = _parquet()
    boundary = "b0undary"
    file_part = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="t.parquet"\r\n'
            "Content-Type: image/png\r\n\r\n"
        ).encode()
        + data
        + b"\r\n"
    )
    field = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="content_type"\r\n\r\napplication/x-mine\r\n'.encode()
    )
    for body in (file_part + field, field + file_part):
        r = http.post(
            "/v1/files",
            content=body + f"--{boundary}--\r\n".encode(),
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
        assert r.status_code == 201, r.text
        assert r.json()["content_type"] == "application/x-mine"


def test_curl_upload_of_a_parquet_file_is_typed_from_its_bytes(live_server: LiveServer, tmp_path: Path) -> None:
    source = tmp_path / "table.bin"
    source.write_bytes(_parquet())
    status, _, body = curl("-T", str(source), f"{live_server.url}/v1/files/")
    assert status == 201 and json.loads(body)["content_type"] == "application/vnd.apache.parquet"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.one_of(st.none(), st.text(max_size=40)))
def test_sniffing_any_bytes_gives_a_valid_media_type(head: bytes, name: str | None) -> None:
    assert is_media_type(sniff_content_type(head, name))


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=400).filter(lambda t: "\0" not in t))
def test_text_is_never_taken_for_a_binary_format(text: str) -> None:
    # every binary signature checks bytes a text cannot hold (NUL, bytes invalid in UTF-8) or a long exact string
    assert is_textual(sniff_content_type(text.encode(), None))


def test_a_chunked_session_without_a_declared_type_is_typed_from_its_first_bytes(http: httpx.Client) -> None:
    data = _parquet() + os.urandom(50_000)
    session = http.post("/v1/sessions", json={"size": len(data), "name": "t.bin"}).json()
    sid = session["streaming_session_id"]
    chunk = session["chunk_size"]
    for index, start in enumerate(range(0, len(data), chunk)):
        piece = data[start : start + chunk]
        headers = {"chunk-checksum": "sha256:" + hashlib.sha256(piece).hexdigest()}
        assert http.put(f"/v1/sessions/{sid}/chunks/{index}", content=piece, headers=headers).status_code < 300
    done = http.post(f"/v1/sessions/{sid}/complete")
    assert done.status_code == 200, done.text
    assert done.json()["content_type"] == "application/vnd.apache.parquet"  # before: application/octet-stream
    listed = http.get("/v1/files").json()["files"]
    assert [f["content_type"] for f in listed if f["name"] == "t.bin"] == ["application/vnd.apache.parquet"]


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"filename": "t.parquet", "filetype": "application/octet-stream"}, "application/vnd.apache.parquet"),  # Uppy
        ({"filename": "t.bin"}, "application/vnd.apache.parquet"),  # tus-js-client with a type the browser lacks
        ({"filename": "t.bin", "filetype": "application/x-mine"}, "application/x-mine"),
        ({"filetype": "application/octet-stream", "content_type": "application/x-own"}, "application/x-own"),
    ],
)
def test_tus_filetype_is_a_hint_and_content_type_the_clients_word(
    http: httpx.Client, metadata: dict[str, str], expected: str
) -> None:
    data = _parquet()
    tus = {"tus-resumable": "1.0.0"}
    encoded = ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in metadata.items())
    created = http.post("/tus/files", headers={**tus, "upload-length": str(len(data)), "upload-metadata": encoded})
    assert created.status_code == 201, created.text
    headers = {**tus, "upload-offset": "0", "content-type": "application/offset+octet-stream"}
    done = http.patch(created.headers["location"], content=data, headers=headers)
    assert done.status_code == 204
    file_id = done.headers["upload-file-id"]
    assert http.get(f"/v1/files/{file_id}").json()["content_type"] == expected


def _puremagic_unfiltered(head: bytes) -> tuple[str | None, float]:
    """What transfer.core.model.naming._puremagic answered before its signature index: puremagic on every head."""
    from transfer.core.model import naming

    return naming._puremagic_scan(head) if head else (None, 0.0)


def _with_a_signature(data: st.DataObject) -> bytes:
    from puremagic import main as tables

    row = data.draw(st.sampled_from([*tables.magic_header_array, *tables.magic_footer_array]))
    filler = data.draw(st.binary(max_size=300))
    if row.offset >= 0:
        return bytes(data.draw(st.binary(min_size=row.offset, max_size=row.offset))) + row.byte_match + filler
    return filler + row.byte_match + b"\0" * max(0, -row.offset - len(row.byte_match))


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_the_signature_index_never_changes_what_puremagic_finds(data: st.DataObject) -> None:
    """The index only skips puremagic where it would find nothing: same answer for random bytes, text, and heads
    that carry one of its signatures (header or footer) somewhere."""
    from transfer.core.model import naming

    if data.draw(st.booleans()):
        head = _with_a_signature(data)
    else:
        head = data.draw(st.one_of(st.binary(min_size=1, max_size=4096), st.text(min_size=1).map(str.encode)))
    assert naming._puremagic(head) == _puremagic_unfiltered(head)
