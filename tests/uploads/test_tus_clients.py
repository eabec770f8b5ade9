"""tus as tus clients expect it: the creation URL with and without its trailing slash and no redirect (tus-js-client,
the strict client, driven in Node), GET on an upload URL serving the uploaded bytes with ranges as tusd does (the
descriptor by ``Accept: application/json`` or at ``/descriptor``, for the owner only), and finishing that frees the
upload's segments at once, on local storage and on the S3 test server."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.conftest import LiveServer, running, s3_client
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

MiB = 1 << 20
V = {"tus-resumable": "1.0.0"}
PATCH = {**V, "content-type": "application/offset+octet-stream"}
WEB = Path(__file__).resolve().parents[2] / "transfer" / "web"
NODE_MODULES = WEB / "node_modules"


def tus_upload(http: httpx.Client, data: bytes, creation: str = "/tus/files/", **headers: str) -> httpx.Response:
    created = http.post(creation, headers={**V, **headers, "upload-length": str(len(data))})
    assert created.status_code == 201, created.text
    done = http.patch(created.headers["location"], content=data, headers={**PATCH, **headers, "upload-offset": "0"})
    assert done.status_code == 204 and "upload-file-id" in done.headers, done.text
    return created


def test_creation_url_with_and_without_trailing_slash_is_never_redirected(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, follow_redirects=False) as http:
        for creation in ("/tus/files/", "/tus/files"):
            r = http.post(creation, headers={**V, "upload-length": "3"})
            assert r.status_code == 201, (creation, r.status_code, r.headers)
            assert r.headers["location"].startswith(f"{server.url}/tus/files/t_")
            options = http.options(creation)
            assert options.status_code == 204 and options.headers["tus-version"] == "1.0.0"


def test_get_on_an_upload_url_serves_its_bytes_with_ranges(server: LiveServer) -> None:
    data = os.urandom(MiB + 5)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        url = tus_upload(http, data, **{"upload-metadata": "filename ZGF0YS5iaW4="}).headers["location"]
        whole = http.get(url)
        assert whole.status_code == 200 and whole.content == data
        assert whole.headers["accept-ranges"] == "bytes" and "accept" in whole.headers["vary"]
        assert whole.headers["x-content-type-options"] == "nosniff"
        part = http.get(url, headers={"range": "bytes=100-199"})
        assert part.status_code == 206 and part.content == data[100:200]
        assert part.headers["content-range"] == f"bytes 100-199/{len(data)}"
        suffix = http.get(url, headers={"range": "bytes=-10"})
        assert suffix.status_code == 206 and suffix.content == data[-10:]
        many = http.get(url, headers={"range": "bytes=0-0,10-10"})
        assert many.status_code == 206 and many.headers["content-type"].startswith("multipart/byteranges")
        beyond = http.get(url, headers={"range": f"bytes={len(data) + 10}-"})
        assert beyond.status_code == 416 and beyond.headers["content-range"] == f"bytes */{len(data)}"
        assert http.get(url, headers={"if-none-match": whole.headers["etag"]}).status_code == 304
        # the descriptor: asked for by name, or at the sibling URL whatever Accept says
        for d in (http.get(url, headers={"accept": "application/json"}).json(), http.get(url + "/descriptor").json()):
            assert d["name"] == "data.bin" and d["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
            assert http.get(d["url"]).content == data
        browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        assert http.get(url, headers={"accept": browser}).content == data
        assert http.get(url, headers={"accept": "application/json;q=0, */*"}).content == data
        unfinished = http.post("/tus/files/", headers={**V, "upload-length": "10"}).headers["location"]
        assert http.get(unfinished).status_code == 404


TOKENS = {name: new_token() for name in ("alice", "bob", "admin")}


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


@pytest.fixture
def tenants(tmp_path: Path) -> Iterator[LiveServer]:
    scopes = {"alice": ["upload", "read"], "bob": ["upload", "read"], "admin": ["admin"]}
    keys = {name: {"sha256": token_hash(TOKENS[name]), "scopes": scopes[name]} for name in TOKENS}
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys)
    with running(settings) as live:
        yield live


def test_upload_bytes_and_descriptor_belong_to_the_uploads_key(tenants: LiveServer) -> None:
    data = os.urandom(4096)
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        url = tus_upload(http, data, **key("alice")).headers["location"]
        assert http.get(url, headers=key("alice")).content == data
        assert http.get(url, headers=key("admin")).content == data
        assert http.get(url).status_code == 401
        for stranger in (http.get(url, headers=key("bob")), http.get(url + "/descriptor", headers=key("bob"))):
            assert stranger.status_code == 404 and stranger.json()["error"]["code"] == "not_found"
        json_for_bob = http.get(url, headers={**key("bob"), "accept": "application/json"})
        assert json_for_bob.status_code == 404


def stored_keys(server: LiveServer) -> list[str]:
    """Every object key the service stored, on local storage or in the S3 test bucket."""
    if server.settings.storage != "s3":
        return server.objects()
    endpoint = SimpleNamespace(  # the s3_env fixture put the test bucket's coordinates in the environment
        url=os.environ["TRANSFER_S3_ENDPOINT_URL"],
        access_key=os.environ["AWS_ACCESS_KEY_ID"],
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        region=os.environ["AWS_REGION"],
    )
    pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=os.environ["TRANSFER_S3_BUCKET"])
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def test_finishing_an_upload_frees_its_segments(server: LiveServer) -> None:
    data = os.urandom(6 * MiB + 1)  # two PATCHes, two segments: on S3 the first is a composable 5 MiB+
    with httpx.Client(base_url=server.url, timeout=120) as http:
        url = http.post("/tus/files/", headers={**V, "upload-length": str(len(data))}).headers["location"]
        uid = url.rsplit("/", 1)[1]
        cut = 5 * MiB + 3
        assert http.patch(url, content=data[:cut], headers={**PATCH, "upload-offset": "0"}).status_code == 204
        assert any(f"tus/{uid}/seg/" in k for k in stored_keys(server))  # in flight: the bytes live as segments
        done = http.patch(url, content=data[cut:], headers={**PATCH, "upload-offset": str(cut)})
        assert done.status_code == 204 and done.headers["upload-offset"] == str(len(data))
        assert [k for k in stored_keys(server) if f"tus/{uid}/seg/" in k] == []
        # the finished upload still answers as finished: offset = length, no PATCH can start it again
        head = http.head(url, headers=V)
        assert head.status_code == 200 and head.headers["upload-offset"] == str(len(data))
        again = http.patch(url, content=b"x", headers={**PATCH, "upload-offset": "0"})
        assert again.status_code == 409
        assert hashlib.sha256(http.get(url).content).hexdigest() == hashlib.sha256(data).hexdigest()


# --- tus-js-client, the strict client: it does not follow a 307 on creation ---

NODE_UPLOADER = """
const fs = require("fs");
const tus = require("tus-js-client");
const [endpoint, path, resumeUrl, stopAt] = process.argv.slice(2);
const size = fs.statSync(path).size;
const upload = new tus.Upload(fs.createReadStream(path), {
  endpoint,
  uploadUrl: resumeUrl || null,
  uploadSize: size,
  chunkSize: 1 << 20,
  retryDelays: [],
  metadata: { filename: "from-node.bin", filetype: "application/octet-stream" },
  onUploadUrlAvailable() { console.log("URL " + upload.url); },
  onProgress(sent) {
    if (Number(stopAt) && sent >= Number(stopAt)) { process.exit(3); }  // the process dies mid-upload
  },
  onError(err) { console.error("ERROR " + err); process.exit(1); },
  onSuccess() { console.log("DONE " + upload.url); process.exit(0); },
});
upload.start();
"""


@pytest.mark.slow
def test_tus_js_client_uploads_interrupts_and_resumes(server: LiveServer, tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None or not (NODE_MODULES / "tus-js-client").is_dir():
        pytest.fail("tus-js-client is not installed: run `make install` (npm ci in transfer/web)")
    data = os.urandom(12 * MiB + 123)
    src = tmp_path / "from-node.bin"
    src.write_bytes(data)
    script = tmp_path / "upload.js"
    script.write_text(NODE_UPLOADER)
    env = {**os.environ, "NODE_PATH": str(NODE_MODULES)}
    endpoint = f"{server.url}/tus/files/"  # with the slash, as the README writes it

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([node, str(script), endpoint, str(src), *args], capture_output=True, text=True, env=env)

    first = run("", str(5 * MiB))
    assert first.returncode == 3, first.stdout + first.stderr
    url = first.stdout.split("URL ", 1)[1].split()[0]
    offset = int(httpx.head(url, headers=V).headers["upload-offset"])
    assert 0 < offset < len(data)  # the first process died part way
    second = run(url, "0")
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"DONE {url}" in second.stdout  # the same upload, resumed
    served = httpx.get(url, timeout=120)
    assert hashlib.sha256(served.content).hexdigest() == hashlib.sha256(data).hexdigest()
    d = httpx.get(url + "/descriptor").json()
    assert d["name"] == "from-node.bin" and d["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()


def test_an_upload_left_complete_but_unpublished_by_a_stop_is_published_when_asked(server: LiveServer) -> None:
    """The state a server stopped between storing the last PATCH and publishing leaves behind: every byte stored
    as segments, no file. Written here through the storage backend itself, as that PATCH would have."""
    import asyncio

    from transfer.service.backends import make_storage

    data = os.urandom(300_000)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        url = http.post("/tus/files/", headers={**V, "upload-length": str(len(data))}).headers["location"]
        uid = url.rsplit("/", 1)[1]

        async def store_segment() -> None:
            storage = make_storage(server.settings)
            await storage.start()
            try:
                async with storage.create(f"tus/{uid}/seg/{0:016d}", if_absent=True) as writer:
                    await writer.write(data)
                    await writer.commit({})
            finally:
                await storage.close()

        asyncio.run(store_segment())
        assert http.get(f"/v1/files/f_{uid[2:]}").status_code == 404  # nobody published it
        head = http.head(url, headers=V)  # what a resuming client sends first
        assert head.status_code == 200 and head.headers["upload-offset"] == str(len(data))
        assert http.get(url).content == data
        assert [k for k in stored_keys(server) if f"tus/{uid}/seg/" in k] == []
