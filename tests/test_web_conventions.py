"""Web conventions real clients rely on: `curl -T` (PUT) uploads, CORS headers browser code can read, the 415's
Accept-Encoding, and content types recognised from the bytes (a clear signature beats a tool's default type)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import httpx
import pytest
import zstandard

from tests.conftest import LiveServer, running
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
