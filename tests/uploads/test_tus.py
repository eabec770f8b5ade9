"""The tus 1.0.0 server with a real tus client (tuspy) and at the protocol level with httpx, on local storage and
on the S3 test server: core, creation (+ with-upload, defer-length), checksum, termination, expiration,
concatenation, an interrupted upload resumed by a new client process, CORS."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
from tusclient import client as tus_client

from tests.conftest import Clock, LiveServer, running
from tests.uploads.test_api_upload import assert_error
from transfer.settings import Settings

MiB = 1 << 20
V = {"tus-resumable": "1.0.0"}
JSON = {"accept": "application/json"}  # the descriptor, not the bytes


def meta(**values: str) -> str:
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in values.items())


def descriptor_of(server: LiveServer, upload_url: str) -> dict[str, Any]:
    r = httpx.get(upload_url, headers={"accept": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text
    d: dict[str, Any] = r.json()
    return d


def test_tuspy_upload_with_checksums(server: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB + 17)
    src = tmp_path / "photo.jpg"
    src.write_bytes(data)
    with open(src, "rb") as stream:  # given a path, tuspy never closes the file it opens
        uploader = tus_client.TusClient(f"{server.url}/tus/files").uploader(
            file_stream=stream,
            chunk_size=MiB,
            metadata={"filename": "photo.jpg", "filetype": "image/jpeg"},
            upload_checksum=True,
        )
        uploader.upload()
    d = descriptor_of(server, uploader.url)
    assert d["name"] == "photo.jpg" and d["content_type"] == "image/jpeg"
    assert d["size"] == len(data) and d["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert httpx.get(d["url"], timeout=60).content == data


RESUMER = textwrap.dedent(
    """
    import sys
    from tusclient import client
    from tusclient.storage import filestorage
    url, path, db, stop = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    storage = filestorage.FileStorage(db)
    uploader = client.TusClient(url).uploader(path, chunk_size=1 << 20, store_url=True, url_storage=storage,
                                              metadata={"filename": "resumed.bin"})
    if stop:
        uploader.upload(stop_at=stop)
    else:
        uploader.upload()
    print(uploader.url)
    storage.close()
    """
)


def test_interrupted_upload_is_resumed_by_a_new_client_process(server: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(5 * MiB)
    src = tmp_path / "resumed.bin"
    src.write_bytes(data)
    db = str(tmp_path / "tus-urls.json")
    script = tmp_path / "resume.py"
    script.write_text(RESUMER)
    first = subprocess.run(
        [sys.executable, str(script), f"{server.url}/tus/files", str(src), db, str(2 * MiB)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert first.returncode == 0, first.stderr
    url = first.stdout.strip()
    head = httpx.head(url, headers=V, timeout=60)  # an S3 completion on a loaded machine outlasts 5 s
    assert head.headers["upload-offset"] == str(2 * MiB)  # the first process stopped part way
    second = subprocess.run(
        [sys.executable, str(script), f"{server.url}/tus/files", str(src), db, "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == url  # same upload, resumed
    d = descriptor_of(server, url)
    assert d["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest() and d["name"] == "resumed.bin"


def test_protocol_core(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        opts = http.options("/tus/files")
        assert opts.status_code == 204 and opts.headers["tus-version"] == "1.0.0"
        assert set(opts.headers["tus-extension"].split(",")) >= {
            "creation",
            "creation-with-upload",
            "creation-defer-length",
            "checksum",
            "termination",
            "expiration",
            "concatenation",
        }
        assert "sha1" in opts.headers["tus-checksum-algorithm"] and int(opts.headers["tus-max-size"]) > 0
        no_version = http.post("/tus/files", headers={"upload-length": "10"})
        assert no_version.status_code == 412 and no_version.headers["tus-version"] == "1.0.0"
        r = http.post("/tus/files", headers={**V, "upload-length": "10", "upload-metadata": meta(filename="a.txt")})
        assert r.status_code == 201 and r.headers["tus-resumable"] == "1.0.0" and "upload-expires" in r.headers
        url = r.headers["location"]
        head = http.head(url, headers=V)
        assert head.headers["upload-offset"] == "0" and head.headers["upload-length"] == "10"
        assert head.headers["cache-control"] == "no-store" and "filename" in head.headers["upload-metadata"]
        patch = {**V, "content-type": "application/offset+octet-stream"}
        assert_error(
            http.patch(url, content=b"abc", headers={**V, "upload-offset": "0"}), 415, "unsupported_media_type"
        )
        assert_error(http.patch(url, content=b"abc", headers={**patch, "upload-offset": "5"}), 409, "conflict")
        r = http.patch(url, content=b"hello", headers={**patch, "upload-offset": "0"})
        assert r.status_code == 204 and r.headers["upload-offset"] == "5"
        sha1 = base64.b64encode(hashlib.sha1(b"wrong").digest()).decode()
        bad = http.patch(
            url, content=b"world", headers={**patch, "upload-offset": "5", "upload-checksum": f"sha1 {sha1}"}
        )
        assert bad.status_code == 460
        assert http.head(url, headers=V).headers["upload-offset"] == "5"  # the bad body was discarded
        assert_error(
            http.patch(url, content=b"world", headers={**patch, "upload-offset": "5", "upload-checksum": "crc99 AAAA"}),
            400,
            "invalid_request",
        )
        assert_error(
            http.patch(url, content=b"world!!", headers={**patch, "upload-offset": "5"}), 413, "payload_too_large"
        )
        good = base64.b64encode(hashlib.sha1(b"world").digest()).decode()
        done = http.patch(
            url, content=b"world", headers={**patch, "upload-offset": "5", "upload-checksum": f"sha1 {good}"}
        )
        assert done.status_code == 204 and done.headers["upload-offset"] == "10" and "upload-file-id" in done.headers
        d = http.get(url, headers=JSON).json()
        assert d["name"] == "a.txt" and http.get(d["url"]).content == b"helloworld"


def test_creation_with_upload_defer_length_and_override(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        r = http.post(
            "/tus/files",
            content=b"first-",
            headers={**V, "upload-defer-length": "1", "content-type": "application/offset+octet-stream"},
        )
        assert r.status_code == 201 and r.headers["upload-offset"] == "6"
        url = r.headers["location"]
        assert http.head(url, headers=V).headers["upload-defer-length"] == "1"
        r = http.post(
            url,
            content=b"second",
            headers={
                **V,
                "x-http-method-override": "PATCH",
                "upload-offset": "6",
                "upload-length": "12",
                "content-type": "application/offset+octet-stream",
            },
        )
        assert r.status_code == 204 and r.headers["upload-offset"] == "12"
        d = http.get(url, headers=JSON).json()
        assert http.get(d["url"]).content == b"first-second"
        assert_error(http.post("/tus/files", headers=V), 400, "invalid_request")  # neither length nor defer
        big = str(server.settings.max_upload_size + 1)
        assert_error(http.post("/tus/files", headers={**V, "upload-length": big}), 413, "payload_too_large")


def test_termination_and_expiration(server: LiveServer, clock: Clock) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        url = http.post("/tus/files", headers={**V, "upload-length": "100"}).headers["location"]
        assert http.delete(url, headers=V).status_code == 204
        assert http.head(url, headers=V).status_code == 410
        url2 = http.post("/tus/files", headers={**V, "upload-length": "100"}).headers["location"]
        clock.advance(server.settings.session_ttl + 1)
        assert http.head(url2, headers=V).status_code == 410
        patch = {**V, "content-type": "application/offset+octet-stream", "upload-offset": "0"}
        assert_error(http.patch(url2, content=b"x", headers=patch), 410, "gone")
        assert http.head(server.url + "/tus/files/t_" + "0" * 32, headers=V).status_code == 404


def test_concatenation(server: LiveServer) -> None:
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), b"tail bytes"]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        urls = []
        for piece in parts:  # in parallel, as a client would; here one after another
            r = http.post("/tus/files", headers={**V, "upload-length": str(len(piece)), "upload-concat": "partial"})
            assert r.status_code == 201
            urls.append(r.headers["location"])
            r = http.patch(
                urls[-1],
                content=piece,
                headers={**V, "upload-offset": "0", "content-type": "application/offset+octet-stream"},
            )
            assert r.status_code == 204 and "upload-file-id" not in r.headers  # partials are not files
        assert http.head(urls[0], headers=V).headers["upload-concat"] == "partial"
        final = http.post(
            "/tus/files",
            headers={**V, "upload-concat": "final;" + " ".join(urls), "upload-metadata": meta(filename="joined.bin")},
        )
        assert final.status_code == 201, final.text
        head = http.head(final.headers["location"], headers=V)
        assert head.headers["upload-length"] == str(sum(map(len, parts))) and head.headers["upload-concat"].startswith(
            "final;"
        )
        d = http.get(final.headers["location"], headers=JSON).json()
        assert d["name"] == "joined.bin" and http.get(d["url"]).content == b"".join(parts)
        patch = {**V, "content-type": "application/offset+octet-stream", "upload-offset": "0"}
        assert_error(http.patch(final.headers["location"], content=b"x", headers=patch), 403, "forbidden")
        unfinished = http.post("/tus/files", headers={**V, "upload-length": "10", "upload-concat": "partial"})
        assert_error(
            http.post("/tus/files", headers={**V, "upload-concat": "final;" + unfinished.headers["location"]}),
            400,
            "invalid_request",
        )


def test_cors_for_browser_tus_clients(tmp_path: Path, clock: Clock) -> None:
    settings = Settings(
        data_dir=tmp_path / "d", signing_keys={"t": "0123456789abcdef0123"}, cors_allow_origins=["https://app.example"]
    )
    with running(settings, clock) as live:
        url = live.url
        pre = httpx.options(
            f"{url}/tus/files",
            headers={
                "origin": "https://app.example",
                "access-control-request-method": "POST",
                "access-control-request-headers": "tus-resumable,upload-length",
            },
        )
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
        r = httpx.post(f"{url}/tus/files", headers={**V, "upload-length": "1", "origin": "https://app.example"})
        assert "location" in r.headers["access-control-expose-headers"]
        assert "upload-offset" in r.headers["access-control-expose-headers"]
