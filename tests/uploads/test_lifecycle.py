"""File lifetimes and per-key byte quotas against a real server (local storage and the S3 test server), on an
injected service clock: files expire at once for every reader (descriptor, signed URL, listing), the sweep removes
them reading only what is due, quotas refuse before a byte is read, streams of unknown length stop at the quota
publishing nothing, and the usage count stays exact under concurrent uploads and across replicas."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash

from storage.errors import BackendUnavailable, StorageFull
from storage.local import LocalStorage
from tests.conftest import Clock, LiveServer, running, serving
from tests.uploads.test_api_upload import assert_error
from transfer.cli import main as cli_main
from transfer.core.auth import new_token, parse_keys, token_hash
from transfer.core.uploads.lifetimes import LifetimePolicy, expiry_bucket, parse_expires_in
from transfer.core.uploads.state import FileIntent
from transfer.errors import InsufficientStorage, InvalidRequest, LifetimeTooLong, QuotaExceeded
from transfer.hosts import create_app
from transfer.service.container import Services
from transfer.service.files.ingest import UploadRequest
from transfer.settings import Settings

KiB, MiB = 1 << 10, 1 << 20
DAY = 24 * 3600
QUOTA = 3 * MiB
TOKENS = {name: new_token() for name in ("alice", "bob", "admin")}
KEYS: dict[str, dict[str, Any]] = {
    "alice": {
        "sha256": token_hash(TOKENS["alice"]),
        "scopes": ["upload", "read"],
        "max_bytes": QUOTA,
        "default_file_ttl": DAY,
        "max_file_ttl": 7 * DAY,
    },
    "bob": {"sha256": token_hash(TOKENS["bob"]), "scopes": ["upload", "read"]},
    "admin": {"sha256": token_hash(TOKENS["admin"]), "scopes": ["admin"]},
}
TUS = {"tus-resumable": "1.0.0"}


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


def life_settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys=KEYS,
        inline_threshold=1024,
        session_chunk_size=64 << 10,
        max_file_ttl=30 * DAY,
        session_gc_interval=3600,  # the tests run the sweeps themselves (POST /v1/admin/gc)
        **extra,
    )


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def life(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    """A server with keys that have quotas and lifetimes, on local storage and again on the S3 test server."""
    extra: dict[str, Any] = {}
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        extra = {"storage": "s3"}
    with running(life_settings(tmp_path, **extra), clock) as live:
        yield live


@pytest.fixture
def local_life(tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    with running(life_settings(tmp_path), clock) as live:
        yield live


def stored_files(live: LiveServer) -> list[str]:
    """File ids stored, whatever the backend (the admin listing: expired ones included)."""
    with httpx.Client(base_url=live.url, headers=key("admin")) as http:
        r = http.get("/v1/admin/files")
        assert r.status_code == 200, r.text
        return [f["file_id"] for f in r.json()["files"]]


def usage(http: httpx.Client, who: str) -> dict[str, Any]:
    r = http.get("/v1/usage", headers=key(who))
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def gc(http: httpx.Client) -> dict[str, int]:
    r = http.post("/v1/admin/gc", headers=key("admin"))
    assert r.status_code == 200, r.text
    removed: dict[str, int] = r.json()["removed"]
    return removed


def rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(int(moment), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- lifetimes -------------------------------------------------------------------------------------------------


def test_file_expires_on_the_service_clock_and_the_sweep_removes_it(life: LiveServer, clock: Clock) -> None:
    data = os.urandom(200 * KiB)
    with httpx.Client(base_url=life.url, timeout=30) as http:
        r = http.post("/v1/files", params={"expires_in": 3600}, content=data, headers=key("alice"))
        assert r.status_code == 201, r.text
        d = r.json()
        file_id = d["metadata"]["file_id"]
        assert d["metadata"]["expires_at"] == rfc3339(clock() + 3600)
        assert d["url_expires_at"] <= d["metadata"]["expires_at"]
        assert usage(http, "alice")["bytes_used"] == len(data)
        fresh = http.get(f"/v1/files/{file_id}", params={"ttl": 7 * DAY}, headers=key("alice")).json()
        assert fresh["url_expires_at"] == d["metadata"]["expires_at"]  # no URL claims to outlive the file
        assert http.get(d["url"]).content == data

        clock.advance(3599)
        assert http.get(d["url"]).status_code == 200
        clock.advance(1)  # the expiry instant itself: gone for every reader at once, swept or not
        assert_error(http.get(d["url"]), 403, "url_expired")  # its URLs were minted to end with it
        assert http.head(d["url"]).status_code == 403
        assert_error(http.get(f"/v1/files/{file_id}", headers=key("alice")), 410, "file_expired")
        assert http.get("/v1/files", headers=key("alice")).json()["files"] == []
        assert_error(http.get(f"/v1/files/{file_id}", headers=key("bob")), 404, "not_found")  # owners first

        assert gc(http)["expired_files"] == 1
        assert file_id not in stored_files(life)
        assert_error(http.get(f"/v1/files/{file_id}", headers=key("alice")), 404, "not_found")
        after = usage(http, "alice")
        assert after["bytes_used"] == 0 and after["files"] == 0
        assert gc(http)["expired_files"] == 0  # the index entry went with the file


def test_files_that_expire_later_stay_and_the_sweeper_runs_on_its_own(tmp_path: Path, clock: Clock) -> None:
    settings = life_settings(tmp_path).model_copy(update={"session_gc_interval": 0.05, "max_file_ttl": None})
    with running(settings, clock) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        soon = http.post("/v1/files", params={"expires_in": 60}, content=b"s" * 2000, headers=key("bob")).json()
        later = http.post("/v1/files", params={"expires_in": 2 * 3600}, content=b"l" * 2000, headers=key("bob"))
        forever = http.post("/v1/files", content=b"f" * 2000, headers=key("bob")).json()
        assert "expires_at" not in forever["metadata"]  # bob has no default, the service no default nor maximum
        clock.advance(61)
        assert "metadata" in soon, soon
        soon_id = soon["metadata"]["file_id"]
        for _ in range(2000):  # the periodic sweeper (every 0.05 s) removes it; no sweep asked for here
            if soon_id not in stored_files(live):
                break
            time.sleep(0.01)
        assert soon_id not in stored_files(live)
        remaining = set(stored_files(live))
        assert {later.json()["metadata"]["file_id"], forever["metadata"]["file_id"]} == remaining


def test_lifetimes_are_asked_for_at_every_front_door_and_refused_above_the_maximum(
    local_life: LiveServer, clock: Clock
) -> None:
    too_long = 7 * DAY + 1  # alice's max_file_ttl
    with httpx.Client(base_url=local_life.url, headers=key("alice")) as http:
        r = http.post("/v1/files", params={"expires_in": too_long}, content=b"x" * 5000)
        body = assert_error(r, 400, "expires_in_too_long")
        assert body["detail"]["maximum"] == 7 * DAY
        assert_error(
            http.post("/v1/files", headers={"expires-in": str(too_long)}, content=b"x"), 400, "expires_in_too_long"
        )
        assert_error(http.post("/v1/files", params={"expires_in": "-5"}, content=b"x"), 400, "invalid_request")
        assert_error(http.post("/v1/files", params={"expires_in": "1e3"}, content=b"x"), 400, "invalid_request")
        r = http.post("/v1/files", params={"expires_in": 10}, headers={"expires-in": "20"}, content=b"x")
        assert_error(r, 400, "invalid_request")
        assert_error(http.post("/v1/sessions", json={"expires_in": too_long}), 400, "expires_in_too_long")
        meta = "expires_in " + base64.b64encode(str(too_long).encode()).decode()
        r = http.post("/tus/files", headers={**TUS, "upload-length": "10", "upload-metadata": meta})
        assert_error(r, 400, "expires_in_too_long")
        assert stored_files(local_life) == []

        # the header field, a session and a tus upload each carry the lifetime to the file they make
        d = http.post("/v1/files", headers={"expires-in": "120"}, content=b"h" * 2000).json()
        assert d["metadata"]["expires_at"] == rfc3339(clock() + 120)
        sid = http.post("/v1/sessions", json={"size": 3000, "expires_in": 300}).json()["streaming_session_id"]
        chunk = b"c" * 3000
        put = http.put(
            f"/v1/sessions/{sid}/chunks/0",
            content=chunk,
            headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(chunk)},
        )
        assert put.status_code == 201, put.text
        done = http.post(f"/v1/sessions/{sid}/complete", json={}).json()
        assert done["metadata"]["expires_at"] == rfc3339(clock() + 300)
        meta = "filename " + base64.b64encode(b"t.bin").decode() + ",expires_in " + base64.b64encode(b"400").decode()
        url = http.post("/tus/files", headers={**TUS, "upload-length": "2000", "upload-metadata": meta}).headers[
            "location"
        ]
        r = http.patch(
            url,
            content=b"t" * 2000,
            headers={**TUS, "upload-offset": "0", "content-type": "application/offset+octet-stream"},
        )
        assert r.status_code == 204, r.text
        file_id = r.headers["upload-file-id"] if "upload-file-id" in r.headers else None
        listing = {f["name"]: f for f in http.get("/v1/admin/files", headers=key("admin")).json()["files"]}
        assert listing["t.bin"]["expires_at"] == rfc3339(clock() + 400), (file_id, listing)
        assert http.get(url).content == b"t" * 2000  # tus: GET on the upload URL serves the file's bytes ...
        clock.advance(400)
        assert_error(http.get(url), 410, "file_expired")  # ... until the file expires


def test_defaults_apply_when_no_lifetime_is_asked(tmp_path: Path, clock: Clock) -> None:
    """The key's default, else the service's; a default is cut to the maximum, an explicit ask never is."""
    settings = life_settings(tmp_path).model_copy(update={"default_file_ttl": 40 * DAY, "max_file_ttl": 30 * DAY})
    with running(settings, clock) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        a = http.post("/v1/files", content=b"a" * 2000, headers=key("alice")).json()
        assert a["metadata"]["expires_at"] == rfc3339(clock() + DAY)  # alice's default_file_ttl
        b = http.post("/v1/files", content=b"b" * 2000, headers=key("bob")).json()
        assert b["metadata"]["expires_at"] == rfc3339(clock() + 30 * DAY)  # the service default, cut to its max
        r = http.post("/v1/files", params={"expires_in": 31 * DAY}, content=b"b", headers=key("bob"))
        assert_error(r, 400, "expires_in_too_long")


# --- quotas ----------------------------------------------------------------------------------------------------


def headers_only(live: LiveServer, head: str) -> bytes:
    """Send a request's header section and no body; the answer that comes anyway (read up to its header end)."""
    host, port = live.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall((head.format(host=host, key=TOKENS["alice"]) + "\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, "connection closed without an answer"
            answer += chunk
        while b"quota_exceeded" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    "head",
    [
        "POST /v1/files HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {key}\r\ncontent-length: 4194304\r\n",
        "POST /v1/files?size=4194304 HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {key}\r\n"
        "transfer-encoding: chunked\r\n",
        "PUT /v1/files/x.bin HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {key}\r\ncontent-length: 4194304\r\n",
    ],
    ids=["content-length", "declared-size", "put"],
)
def test_a_declared_size_over_the_quota_is_refused_before_the_body(local_life: LiveServer, head: str) -> None:
    answer = headers_only(local_life, head)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert b"quota_exceeded" in answer
    assert stored_files(local_life) == [] and local_life.leftovers() == []


def test_sessions_and_tus_uploads_reserve_their_size(life: LiveServer) -> None:
    with httpx.Client(base_url=life.url, headers=key("alice"), timeout=30) as http:
        assert_error(http.post("/v1/sessions", json={"size": QUOTA + 1}), 413, "quota_exceeded")
        r = http.post("/tus/files", headers={**TUS, "upload-length": str(QUOTA + 1)})
        assert_error(r, 413, "quota_exceeded")
        # two reservations that each fit but not together: the second is refused while the first is open
        first = http.post("/v1/sessions", json={"size": 2 * MiB})
        assert first.status_code == 201
        assert usage(http, "alice")["bytes_reserved"] == 2 * MiB
        assert_error(http.post("/tus/files", headers={**TUS, "upload-length": str(2 * MiB)}), 413, "quota_exceeded")
        r = http.post("/v1/files", content=os.urandom(2 * MiB))
        body = assert_error(r, 413, "quota_exceeded")
        assert body["detail"]["reserved"] == 2 * MiB and body["detail"]["quota"] == QUOTA
        # aborting the session gives its reservation back
        assert http.delete(f"/v1/sessions/{first.json()['streaming_session_id']}").status_code == 204
        assert usage(http, "alice")["bytes_reserved"] == 0
        url = http.post("/tus/files", headers={**TUS, "upload-length": str(2 * MiB)}).headers["location"]
        assert http.delete(url, headers=TUS).status_code == 204
        assert usage(http, "alice")["bytes_reserved"] == 0
        assert http.post("/v1/files", content=os.urandom(2 * MiB)).status_code == 201
        assert usage(http, "alice") | {"key": None} == {
            "key": None,
            "bytes_used": 2 * MiB,
            "files": 1,
            "bytes_reserved": 0,
            "quota_bytes": QUOTA,
            "bytes_available": QUOTA - 2 * MiB,
        }


def test_a_stream_of_unknown_length_stops_at_the_quota_and_publishes_nothing(life: LiveServer) -> None:
    sent = 0

    def chunks() -> Iterator[bytes]:  # no Content-Length, no declared size: caught while streaming
        nonlocal sent
        for _ in range(64):
            sent += 256 * KiB
            yield os.urandom(256 * KiB)

    with httpx.Client(base_url=life.url, headers=key("alice"), timeout=60) as http:
        assert http.post("/v1/files", content=os.urandom(MiB)).status_code == 201
        try:
            r = http.post("/v1/files", content=chunks())
            assert_error(r, 413, "quota_exceeded")
        except httpx.TransportError:
            pass  # the server may answer and close before the client has sent everything
        assert len(stored_files(life)) == 1
        assert usage(http, "alice")["bytes_used"] == MiB
        # gzip on the wire: the declared length says nothing of the original size, the decoded bytes are counted
        import gzip

        r = http.post("/v1/files", content=gzip.compress(bytes(3 * MiB)), headers={"content-encoding": "gzip"})
        assert_error(r, 413, "quota_exceeded")
        # tus with a deferred length: each PATCH is bounded by what the quota has left
        url = http.post("/tus/files", headers={**TUS, "upload-defer-length": "1"}).headers["location"]
        patch = {**TUS, "upload-offset": "0", "content-type": "application/offset+octet-stream"}
        assert_error(http.patch(url, content=os.urandom(2 * MiB + 1), headers=patch), 413, "quota_exceeded")
        # a chunked session of unknown size: no chunk may reach past the quota
        on_s3 = life.settings.storage == "s3"  # S3 sessions have chunks of at least 5 MiB (UploadPartCopy)
        chunk_size, index = (5 * MiB, 0) if on_s3 else (MiB, 2)
        sid = http.post("/v1/sessions", json={"chunk_size": chunk_size}).json()["streaming_session_id"]
        chunk = os.urandom(chunk_size)
        r = http.put(
            f"/v1/sessions/{sid}/chunks/{index}",
            content=chunk,
            headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(chunk)},
        )
        assert_error(r, 413, "quota_exceeded")
        assert len(stored_files(life)) == 1
        assert usage(http, "alice")["bytes_used"] == MiB
    if life.settings.storage == "local":
        assert life.leftovers() == []


def test_delete_gives_the_bytes_back_and_keys_without_quota_are_counted(life: LiveServer) -> None:
    with httpx.Client(base_url=life.url, timeout=30) as http:
        ids = []
        for _ in range(3):
            r = http.post("/v1/files", content=os.urandom(MiB), headers=key("alice"))
            assert r.status_code == 201, r.text
            ids.append(r.json()["metadata"]["file_id"])
        assert_error(http.post("/v1/files", content=b"x" * 2000, headers=key("alice")), 413, "quota_exceeded")
        assert http.delete(f"/v1/files/{ids[0]}", headers=key("admin")).status_code == 204
        assert usage(http, "alice")["bytes_used"] == 2 * MiB
        assert http.post("/v1/files", content=b"x" * 2000, headers=key("alice")).status_code == 201
        big = http.post("/v1/files", content=os.urandom(4 * MiB), headers=key("bob"))
        assert big.status_code == 201  # bob has no quota, and is counted all the same
        assert usage(http, "bob") | {"key": None} == {
            "key": None,
            "bytes_used": 4 * MiB,
            "files": 1,
            "bytes_reserved": 0,
            "quota_bytes": None,
            "bytes_available": None,
        }
        everyone = http.get("/v1/admin/usage", headers=key("admin")).json()["keys"]
        assert everyone["alice"]["bytes_used"] == 2 * MiB + 2000 and everyone["bob"]["files"] == 1


def test_concurrent_uploads_cannot_overshoot_the_quota(local_life: LiveServer) -> None:
    """Eight uploads of 1 MiB at once against a quota of 3 MiB: exactly three are stored, the rest refused."""

    def upload(i: int) -> int:
        with httpx.Client(base_url=local_life.url, headers=key("alice"), timeout=60) as http:
            return http.post("/v1/files", content=os.urandom(MiB)).status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = sorted(pool.map(upload, range(8)))
    assert codes == [201, 201, 201] + [413] * 5
    with httpx.Client(base_url=local_life.url, timeout=60) as http:
        assert usage(http, "alice")["bytes_used"] == 3 * MiB
    assert len(stored_files(local_life)) == 3


def test_two_replicas_keep_one_exact_count(tmp_path: Path, clock: Clock) -> None:
    """Two server processes' worth of services on one storage: uploads through both, at once, are all counted,
    and the quota holds across them (compare-and-set on the usage record)."""
    settings = life_settings(tmp_path)
    with (
        serving(create_app(settings, clock=clock), settings) as one,
        serving(create_app(settings, clock=clock), settings) as two,
    ):

        def upload(i: int) -> int:
            url = (one, two)[i % 2].url
            with httpx.Client(base_url=url, headers=key("alice"), timeout=60) as http:
                return http.post("/v1/files", content=os.urandom(512 * KiB)).status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            codes = sorted(pool.map(upload, range(10)))
        assert codes == [201] * 6 + [413] * 4
        with httpx.Client(base_url=two.url, timeout=60) as http:
            assert usage(http, "alice")["bytes_used"] == 6 * 512 * KiB
            assert usage(http, "alice")["files"] == 6


# --- admin -----------------------------------------------------------------------------------------------------


def test_admin_endpoints_need_the_admin_scope(local_life: LiveServer) -> None:
    with httpx.Client(base_url=local_life.url, timeout=60) as http:
        for method, path in (("GET", "/v1/admin/files"), ("GET", "/v1/admin/usage"), ("POST", "/v1/admin/gc")):
            assert_error(http.request(method, path, headers=key("alice")), 403, "insufficient_scope")
            assert_error(http.request(method, path), 401, "unauthenticated")
        assert_error(http.get("/v1/usage"), 401, "unauthenticated")


def test_cli_files_usage_and_gc(local_life: LiveServer, clock: Clock, capsys: pytest.CaptureFixture[str]) -> None:
    with httpx.Client(base_url=local_life.url, timeout=60) as http:
        ids = [
            http.post(
                "/v1/files",
                params={"name": f"n{i}.bin", "expires_in": 60 * (i + 1)},
                content=b"z" * 3000,
                headers=key("alice"),
            ).json()["metadata"]["file_id"]
            for i in range(3)
        ]
        http.post("/v1/files", content=b"b" * 5000, headers=key("bob"))
    admin = ["--server", local_life.url, "--api-key", TOKENS["admin"]]

    assert cli_main(["files", "ls", "--json", *admin]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["file_id"] for r in rows if r["owner"] == "alice") == sorted(ids)
    assert cli_main(["files", "ls", "--owner", "bob", *admin]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and "bob" in out[0] and " 5,000 " in out[0]

    assert cli_main(["usage", "--server", local_life.url, "--api-key", TOKENS["alice"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_used"] == 9000

    assert cli_main(["files", "rm", ids[0], *admin]) == 0
    assert capsys.readouterr().out.strip() == f"removed {ids[0]}"
    assert cli_main(["files", "rm", ids[0], *admin]) == 1
    assert "not_found" in capsys.readouterr().err

    clock.advance(120)  # the second file's hour has come; the third expires at 180 s
    assert cli_main(["gc", *admin]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "expired_files: 1" in lines
    assert cli_main(["files", "usage", "--json", *admin]) == 0
    keys = json.loads(capsys.readouterr().out)
    assert keys["alice"]["bytes_used"] == 3000 and keys["alice"]["files"] == 1 and keys["bob"]["bytes_used"] == 5000

    assert cli_main(["gc", "--server", local_life.url, "--api-key", TOKENS["alice"]]) == 1
    assert "insufficient_scope" in capsys.readouterr().err


# --- the sweep reads only what is due ---------------------------------------------------------------------------


class CountingStorage(LocalStorage):
    """Local storage that counts the expiry index entries its listings hand out (what a sweep reads)."""

    index_entries_listed = 0

    async def list(self, prefix: str = "", **options: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        async for info in super().list(prefix, **options):
            if info.key.startswith("expiry/"):
                CountingStorage.index_entries_listed += 1
            yield info


@pytest.mark.anyio
async def test_the_sweep_reads_only_the_index_entries_that_are_due(tmp_path: Path, clock: Clock) -> None:
    settings = life_settings(tmp_path)
    files = Services.build(settings, CountingStorage(settings.data_dir), clock=clock).files
    await files.start()

    async def upload(expires_in: int) -> None:
        async def body() -> AsyncIterator[bytes]:
            yield b"q" * 100

        await files.upload(
            body(), UploadRequest(owner="bob", expected_size=100, intent=FileIntent(lifetime=expires_in))
        )

    for _ in range(40):
        await upload(10 * DAY)
    for _ in range(3):
        await upload(60)
    clock.advance(2 * 3600)
    CountingStorage.index_entries_listed = 0
    assert await files.sweep_expired_files() == 3
    # the 3 due, and at most the first entry of a later hour (where the listing stops): not the 40 later ones
    assert CountingStorage.index_entries_listed <= 4
    assert await files.sweep_expired_files() == 0
    await files.close()


# --- the rules, without a server -------------------------------------------------------------------------------


def test_lifetime_policy() -> None:
    open_ended = LifetimePolicy()
    assert open_ended.lifetime(None) is None and open_ended.lifetime(10**6) == 10**6
    p = LifetimePolicy(key_default=100, key_max=1000, service_default=50, service_max=500)
    assert p.maximum == 500 and p.lifetime(None) == 100 and p.lifetime(500) == 500
    with pytest.raises(LifetimeTooLong):
        p.lifetime(501)
    assert LifetimePolicy(service_default=900, service_max=600).lifetime(None) == 600  # a default is cut
    assert LifetimePolicy(service_max=600).lifetime(None) == 600  # a maximum binds files nobody gave a lifetime


def test_expires_in_parsing() -> None:
    assert parse_expires_in(None) is None and parse_expires_in("") is None and parse_expires_in(" 60 ") == 60
    for bad in ("0", "-1", "1.5", "٣", "1e3", "60s", True):
        with pytest.raises(InvalidRequest):
            parse_expires_in(bad)  # type: ignore[arg-type]
    with pytest.raises(LifetimeTooLong):
        parse_expires_in("9" * 18)


def test_expiry_buckets_sort_in_time_order() -> None:
    moments = [0, 3599, 3600, 86400 * 365 * 30, 86400 * 365 * 60]
    buckets = [expiry_bucket(m) for m in moments]
    assert buckets == sorted(buckets) and buckets[0] == buckets[1] != buckets[2]


def test_key_limits_are_validated() -> None:
    digest = "0" * 64
    parsed = parse_keys({"k": {"sha256": digest, "scopes": ["upload"], "max_bytes": 5, "max_file_ttl": 9}})
    assert parsed["k"].max_bytes == 5 and parsed["k"].max_file_ttl == 9 and parsed["k"].default_file_ttl is None
    for bad in (
        {"max_bytes": 0},
        {"max_bytes": "5"},
        {"max_file_ttl": True},
        {"default_file_ttl": 10, "max_file_ttl": 5},
    ):
        with pytest.raises(ValueError):
            parse_keys({"k": {"sha256": digest, "scopes": ["upload"], **bad}})


def test_quota_error_is_not_retryable() -> None:
    exc = QuotaExceeded("x")
    assert exc.status == 413 and exc.code == "quota_exceeded" and not exc.retryable


@pytest.mark.anyio
async def test_an_index_entry_without_its_file_is_kept_while_a_publication_may_be_in_flight(
    tmp_path: Path, clock: Clock
) -> None:
    """The entry is written just before its file is published: a sweep in between must not drop it (the file would
    then never be swept). Only once its hour is well past is an entry without a file dropped."""
    settings = life_settings(tmp_path)
    files = Services.build(settings, LocalStorage(settings.data_dir), clock=clock).files
    await files.start()
    key_name = f"expiry/{expiry_bucket(clock() + 60)}/f_{'0' * 32}"
    async with files.storage.create(key_name, size_hint=0) as writer:
        await writer.commit({})
    clock.advance(120)
    assert await files.sweep_expired_files() == 0
    assert [i.key async for i in files.storage.list("expiry/")] == [key_name]
    clock.advance(3 * 3600)
    assert await files.sweep_expired_files() == 0
    assert [i.key async for i in files.storage.list("expiry/")] == []
    await files.close()


class FailingPublishStorage(LocalStorage):
    """Local storage whose disk fills when a file is published, and whose usage record cannot be written after
    the charge (a fault injected: a full disk at that exact moment cannot be produced on demand)."""

    charged = False

    def create(self, key: str, **options: Any) -> Any:
        if key.startswith("usage/") and FailingPublishStorage.charged:
            raise BackendUnavailable("usage record unreachable")
        writer = super().create(key, **options)
        if key.startswith("usage/"):
            FailingPublishStorage.charged = True
        if key.startswith("files/"):

            async def commit(metadata: Any) -> Any:
                raise StorageFull("no space left on the device")

            writer.commit = commit
        return writer


@pytest.mark.anyio
async def test_a_failed_refund_does_not_hide_why_the_publish_failed(tmp_path: Path, clock: Clock) -> None:
    settings = life_settings(tmp_path)
    files = Services.build(settings, FailingPublishStorage(settings.data_dir), clock=clock).files
    await files.start()

    async def body() -> AsyncIterator[bytes]:
        yield b"p" * 100

    with pytest.raises(InsufficientStorage):  # the disk filled: 507, not the refund's 503
        await files.upload(body(), UploadRequest(owner="bob", expected_size=100))  # no quota: one charge
    await files.close()


# --- publish paths added on main: direct-to-S3 plans and MCP upload authorisations --------------------------------


@pytest.mark.anyio
async def test_mcp_authorized_uploads_are_charged_and_expire(life: LiveServer, clock: Clock) -> None:
    """An upload authorisation (MCP authorize_upload) is a publish path like any: over the key's quota it is
    refused with quota_exceeded and nothing is published (through the service: at the PUT; straight to the bucket:
    at confirm), within it the bytes are charged, and the file lives for the expires_in asked for."""
    from mcp import Client

    from tests.agents.test_mcp import _bearer, structured, tool_error

    size = 1 * MiB
    async with Client(_bearer(f"{life.url}/mcp", TOKENS["alice"])) as client:
        too_long = tool_error(await client.call_tool("authorize_upload", {"expires_in": 8 * DAY, "size": 10}))
        assert too_long["code"] == "expires_in_too_long"  # above alice's max_file_ttl: refused before any PUT

        asked = await client.call_tool("authorize_upload", {"name": "over.bin", "size": QUOTA + 1})
        with httpx.Client(timeout=60) as http:
            if asked.is_error:  # straight to the bucket: the size is reserved now, so it is refused before any PUT
                assert tool_error(asked)["code"] == "quota_exceeded"
            else:  # through the service: the PUT is refused before a byte is stored
                over = structured(asked)
                put = http.put(over["upload"]["url"], headers=over["upload"]["headers"], content=os.urandom(QUOTA + 1))
                assert put.status_code == 413 and put.json()["error"]["code"] == "quota_exceeded", put.text

            data = os.urandom(size)
            ask = {"name": "ok.bin", "expires_in": 3600, "size": size}
            plan = structured(await client.call_tool("authorize_upload", ask))
            put = http.put(plan["upload"]["url"], headers=plan["upload"]["headers"], content=data)
            assert put.status_code in (200, 201), put.text
        confirmed = structured(await client.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
        assert confirmed["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
        assert confirmed["metadata"]["expires_at"] == rfc3339(clock() + 3600)
        file_id = confirmed["metadata"]["file_id"]

    with httpx.Client(base_url=life.url, timeout=30) as http:
        counted = usage(http, "alice")
        assert counted["bytes_used"] == size and counted["files"] == 1 and counted["bytes_reserved"] == 0
        clock.advance(3601)
        gone = http.get(f"/v1/files/{file_id}", headers=key("alice"))
        assert gone.status_code == 410 and gone.json()["error"]["code"] == "file_expired"
        assert gc(http)["expired_files"] == 1
        assert usage(http, "alice")["bytes_used"] == 0 and file_id not in stored_files(life)


@pytest.mark.s3
def test_direct_plans_reserve_their_size_are_charged_and_expire(tmp_path: Path, s3_env: dict[str, str]) -> None:
    """A direct-to-S3 plan reserves its size when it is made (over the quota: 413 quota_exceeded, no multipart
    upload started), its file is charged when it is published and lives for the expires_in asked for; an aborted
    plan gives its reservation back."""
    clock = Clock()
    data = os.urandom(1 * MiB)
    with (
        running(life_settings(tmp_path, storage="s3"), clock) as live,
        httpx.Client(base_url=live.url, timeout=60, headers=key("alice")) as http,
    ):
        over = http.post("/v1/direct", json={"size": QUOTA + 1})
        assert over.status_code == 413 and over.json()["error"]["code"] == "quota_exceeded", over.text
        too_long = http.post("/v1/direct", json={"size": 1, "expires_in": 8 * DAY})
        assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "expires_in_too_long"

        dropped = http.post("/v1/direct", json={"size": len(data)}).json()
        assert usage(http, "alice")["bytes_reserved"] == len(data)
        assert http.delete(f"/v1/direct/{dropped['id']}").status_code in (200, 204)
        assert usage(http, "alice")["bytes_reserved"] == 0

        sha = hashlib.sha256(data).hexdigest()
        plan = http.post("/v1/direct", json={"size": len(data), "checksum": sha, "expires_in": 3600}).json()
        assert usage(http, "alice")["bytes_reserved"] == len(data)
        target = http.post(f"/v1/direct/{plan['id']}/parts", json={"parts": [{"number": 1, "sha256": sha}]}).json()
        part = target["parts"][0]
        assert httpx.put(part["url"], content=data, headers=part["headers"]).status_code == 200
        done = http.post(f"/v1/direct/{plan['id']}/complete", json={})
        assert done.status_code == 200, done.text
        assert done.json()["metadata"]["expires_at"] == rfc3339(clock() + 3600)
        counted = usage(http, "alice")
        assert counted["bytes_used"] == len(data) and counted["files"] == 1 and counted["bytes_reserved"] == 0

        clock.advance(3601)
        assert http.get(f"/v1/files/{done.json()['metadata']['file_id']}").status_code == 410
        assert gc(http)["expired_files"] == 1
        assert usage(http, "alice")["bytes_used"] == 0


@pytest.mark.anyio
async def test_gc_runs_the_maintenance_list_once(tmp_path: Path, clock: Clock) -> None:
    """POST /v1/admin/gc and `transfer gc` run Services.maintenance()'s own sweeps (expired files among them), so
    a sweep added there is never missing from gc; a failing sweep counts -1 and does not stop the others."""
    from transfer.service.container import Services

    services = Services.build(life_settings(tmp_path), clock=clock)
    await services.start()
    try:
        names = [sweep.name for sweep in services.maintenance()]
        assert "expired_files" in names
        assert list(await services.sweep_now()) == names

        async def broken() -> int:
            raise InsufficientStorage("disk full")

        services.files.sweep_expired_files = broken  # type: ignore[method-assign]
        removed = await services.sweep_now()
        assert removed["expired_files"] == -1 and all(removed[n] >= 0 for n in names if n != "expired_files")
    finally:
        await services.close()


def test_admin_file_listing_pages_from_its_cursor(local_life: LiveServer) -> None:
    """GET /v1/admin/files pages through every key's files from the cursor on (the storage listing starts there),
    an owner filter included: every file once, in id order, and no cursor after the last page."""
    with httpx.Client(base_url=local_life.url, timeout=30) as http:
        mine = {
            who: [http.post("/v1/files", content=os.urandom(2 * KiB), headers=key(who)).json() for _ in range(3)]
            for who in ("alice", "bob")
        }
        ids = {who: sorted(d["metadata"]["file_id"] for d in docs) for who, docs in mine.items()}

        def pages(**params: Any) -> list[str]:
            seen: list[str] = []
            cursor: str | None = None
            while True:
                query = {**params, "limit": 2, **({"cursor": cursor} if cursor else {})}
                r = http.get("/v1/admin/files", params=query, headers=key("admin"))
                assert r.status_code == 200, r.text
                seen += [f["file_id"] for f in r.json()["files"]]
                cursor = r.json()["next_cursor"]
                if cursor is None:
                    return seen

        assert pages() == sorted(ids["alice"] + ids["bob"])
        assert pages(owner="bob") == ids["bob"]
