"""Signed-URL downloads against a real server, checked with curl and httpx: RFC 9110 ranges, conditionals, HEAD,
signatures, expiry, download methods and content negotiation."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard

from tests.conftest import Clock, LiveServer, running
from tests.uploads.test_api_upload import assert_error
from transfer.settings import Settings

MiB = 1 << 20
DATA = os.urandom(3 * MiB + 333)
CURL = shutil.which("curl")


@pytest.fixture
def stored(http: httpx.Client) -> dict[str, Any]:
    d: dict[str, Any] = http.post("/v1/files", params={"name": "data.bin"}, content=DATA).json()
    return d


def curl(*args: str) -> tuple[dict[str, str], int, bytes]:
    """Run curl; return (headers, status, body)."""
    assert CURL, "curl is required for these tests"
    out = subprocess.run([CURL, "-sS", "-D", "-", *args], capture_output=True, check=True, timeout=60).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return headers, status, body


def test_full_get_and_head_with_curl(stored: dict[str, Any]) -> None:
    headers, status, body = curl(stored["url"])
    assert status == 200 and body == DATA
    assert headers["content-length"] == str(len(DATA))
    assert headers["accept-ranges"] == "bytes"
    assert headers["etag"] == f'"{hashlib.sha256(DATA).hexdigest()}"'
    assert headers["x-content-type-options"] == "nosniff"
    assert re.match(r"sha-256=:[A-Za-z0-9+/]+=*:$", headers["repr-digest"])
    assert "last-modified" in headers and headers["content-type"] == "application/octet-stream"
    head_headers, head_status, head_body = curl("-I", "-o", "/dev/null", stored["url"])
    assert head_status == 200 and head_body == b""
    assert head_headers["content-length"] == str(len(DATA)) and head_headers["etag"] == headers["etag"]


@pytest.mark.parametrize(
    ("spec", "start", "end"),
    [
        ("0-99", 0, 99),
        ("100-", 100, len(DATA) - 1),
        ("-500", len(DATA) - 500, len(DATA) - 1),
        ("-99999999", 0, len(DATA) - 1),
        ("1000-999999999", 1000, len(DATA) - 1),
    ],
)
def test_single_ranges_with_curl(stored: dict[str, Any], spec: str, start: int, end: int) -> None:
    headers, status, body = curl("-r", spec, stored["url"])
    assert status == 206
    assert headers["content-range"] == f"bytes {start}-{end}/{len(DATA)}"
    assert body == DATA[start : end + 1] and headers["content-length"] == str(end - start + 1)


def test_multiple_ranges_are_multipart_byteranges(stored: dict[str, Any]) -> None:
    headers, status, body = curl("-r", "0-9,20-29,25-39,-5", stored["url"])
    assert status == 206
    m = re.match(r"multipart/byteranges; boundary=(\S+)$", headers["content-type"])
    assert m, headers["content-type"]
    boundary = m.group(1).encode()
    assert int(headers["content-length"]) == len(body)
    parts = body.split(b"\r\n--" + boundary)
    assert parts[0] == b"" and parts[-1] == b"--\r\n"
    got = []
    for part in parts[1:-1]:
        head, _, payload = part.partition(b"\r\n\r\n")
        cr = re.search(rb"Content-Range: bytes (\d+)-(\d+)/(\d+)", head)
        assert cr and int(cr.group(3)) == len(DATA)
        a, b = int(cr.group(1)), int(cr.group(2))
        assert payload == DATA[a : b + 1]
        got.append((a, b))
    assert got == [(0, 9), (20, 39), (len(DATA) - 5, len(DATA) - 1)]  # 20-29 and 25-39 coalesced


def test_unsatisfiable_and_ignored_ranges(http: httpx.Client, stored: dict[str, Any]) -> None:
    r = http.get(stored["url"], headers={"range": f"bytes={len(DATA)}-"})
    assert_error(r, 416, "range_not_satisfiable")
    assert r.headers["content-range"] == f"bytes */{len(DATA)}"
    for ignored in ("items=0-1", "bytes=5-1", "bytes=x-y"):
        r = http.get(stored["url"], headers={"range": ignored})
        assert r.status_code == 200 and len(r.content) == len(DATA)
    r = http.head(stored["url"], headers={"range": "bytes=0-1"})  # HEAD ignores Range
    assert r.status_code == 200 and r.headers["content-length"] == str(len(DATA))


def test_too_many_ranges_get_the_whole_object(http: httpx.Client, stored: dict[str, Any]) -> None:
    many = ",".join(f"{i * 10}-{i * 10 + 1}" for i in range(100))
    r = http.get(stored["url"], headers={"range": f"bytes={many}"})
    assert r.status_code == 200 and len(r.content) == len(DATA)


def test_conditional_requests(http: httpx.Client, stored: dict[str, Any]) -> None:
    first = http.get(stored["url"], headers={"range": "bytes=0-0"})
    etag, modified = first.headers["etag"], first.headers["last-modified"]
    r = http.get(stored["url"], headers={"if-none-match": etag})
    assert r.status_code == 304 and r.content == b"" and r.headers["etag"] == etag
    assert http.get(stored["url"], headers={"if-none-match": f'"x", W/{etag}'}).status_code == 304
    assert http.get(stored["url"], headers={"if-modified-since": modified}).status_code == 304
    assert_error(http.get(stored["url"], headers={"if-match": '"nope"'}), 412, "precondition_failed")
    assert http.get(stored["url"], headers={"if-match": etag, "range": "bytes=0-1"}).status_code == 206
    # If-Range: a matching strong tag keeps the range, anything else gets the whole object
    assert http.get(stored["url"], headers={"if-range": etag, "range": "bytes=0-1"}).status_code == 206
    assert http.get(stored["url"], headers={"if-range": modified, "range": "bytes=0-1"}).status_code == 206
    whole = http.get(stored["url"], headers={"if-range": '"stale"', "range": "bytes=0-1"})
    assert whole.status_code == 200 and len(whole.content) == len(DATA)


def test_tampered_expired_and_unsigned_urls(http: httpx.Client, stored: dict[str, Any], clock: Clock) -> None:
    url = stored["url"]
    sig = url.rsplit("sig=", 1)[1]
    tampered = url.replace("sig=" + sig, "sig=" + ("A" if sig[0] != "A" else "B") + sig[1:])
    assert_error(http.get(tampered), 403, "signature_invalid")
    assert_error(http.get(url.split("?")[0]), 403, "signature_invalid")
    other = http.post("/v1/files", content=os.urandom(MiB + 1)).json()
    other_path = other["url"].split("?")[0]
    assert_error(http.get(other_path + "?" + url.split("?")[1]), 403, "signature_invalid")  # another object
    assert_error(http.post(url), 403, "signature_invalid")  # another method
    clock.advance(3601)
    body = assert_error(http.get(url), 403, "url_expired")
    assert "expired" in body["message"]
    assert_error(http.get(tampered), 403, "signature_invalid")  # tampering is reported as such, expired or not


def test_post_download_method(http: httpx.Client) -> None:
    data = os.urandom(MiB + 10)
    d = http.post("/v1/files", params={"download_method": "POST"}, content=data).json()
    assert d["download_method"] == "POST"
    r = http.post(d["url"])
    assert r.status_code == 200 and r.content == data
    assert http.post(d["url"], headers={"range": "bytes=0-1"}).status_code == 200  # Range is for GET only
    assert_error(http.get(d["url"]), 403, "signature_invalid")


def test_signed_url_method_falls_back_to_signed_get(http: httpx.Client) -> None:
    data = os.urandom(MiB + 10)
    d = http.post("/v1/files", params={"download_method": "signed_url"}, content=data).json()
    assert d["download_method"] == "signed_url"
    assert http.get(d["url"]).content == data


def test_on_the_fly_compression_for_identity_text(http: httpx.Client) -> None:
    text = b"the same words again and again\n" * 100_000
    d = http.post("/v1/files", params={"name": "notes.txt"}, content=text).json()
    plain = http.get(d["url"], headers={"accept-encoding": "identity"})
    assert plain.headers.get("content-encoding") is None and plain.content == text
    assert plain.headers["vary"] == "accept-encoding"
    for coding in ("gzip", "zstd"):
        with http.stream("GET", d["url"], headers={"accept-encoding": coding}) as r:
            raw = b"".join(r.iter_raw())
            assert r.headers["content-encoding"] == coding and "content-length" not in r.headers
            assert r.headers["etag"] != plain.headers["etag"] and r.headers["vary"] == "accept-encoding"
        decoded = (
            gzip.decompress(raw) if coding == "gzip" else zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        )
        assert decoded == text and len(raw) < len(text) // 10
    ranged = http.get(d["url"], headers={"accept-encoding": "gzip", "range": "bytes=0-9"})
    assert ranged.status_code == 206 and ranged.headers.get("content-encoding") is None and ranged.content == text[:10]


def test_active_types_are_attachments(http: httpx.Client) -> None:
    d = http.post(
        "/v1/files",
        params={"inline": "false", "name": "x.html"},
        content=b"<html><script>1</script>",
        headers={"content-type": "text/html"},
    ).json()
    r = http.get(d["url"])
    assert r.headers["content-disposition"].startswith("attachment;")
    assert r.headers["x-content-type-options"] == "nosniff"


def test_active_types_inline_only_when_configured(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, serve_active_types_inline=True
    )
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=60) as client:
        d = client.post(
            "/v1/files",
            params={"inline": "false", "name": "x.svg"},
            content=b"<svg/>",
            headers={"content-type": "image/svg+xml"},
        ).json()
        r = client.get(d["url"])
        assert r.headers["content-disposition"].startswith("inline;")
        assert r.headers["x-content-type-options"] == "nosniff"


def test_empty_file(http: httpx.Client) -> None:
    d = http.post("/v1/files", params={"inline": "false"}, content=b"").json()
    assert d["type"] == "url" and d["size"] == 0
    r = http.get(d["url"])
    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "0"
    assert_error(http.get(d["url"], headers={"range": "bytes=0-"}), 416, "range_not_satisfiable")


def test_disconnect_mid_download_releases_the_reader(stored: dict[str, Any], live_server: LiveServer) -> None:
    with httpx.Client() as client, client.stream("GET", stored["url"]) as r:
        next(r.iter_raw(1024))  # read a little, then hang up
    # the server keeps serving
    with httpx.Client() as client:
        assert client.get(stored["url"], headers={"range": "bytes=0-3"}).content == DATA[:4]


def test_curl_resumes_a_download(tmp_path: Path, stored: dict[str, Any]) -> None:
    out = tmp_path / "partial.bin"
    out.write_bytes(DATA[:MiB])
    assert CURL
    subprocess.run([CURL, "-sS", "-C", "-", "-o", str(out), stored["url"]], check=True, timeout=60)
    assert out.read_bytes() == DATA
