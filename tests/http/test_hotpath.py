"""The lean path (transfer.api.hotpath) answers exactly as the full FastAPI stack: each request below is sent once
through the lean path and once with it switched off, on the same live server with API keys, and the two answers
must agree (status, error JSON, the header fields that matter, the body). Each case also checks that the lean path
really served it, and the fallbacks check that requests it must not take go the full way."""

from __future__ import annotations

import base64
import hashlib
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash

from tests.conftest import LiveServer, running
from transfer.api.hotpath import HotPath
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

TOKENS = {name: new_token() for name in ("alice", "bob", "reader", "tight")}
SCOPES = {"alice": ["upload", "read"], "bob": ["upload", "read"], "reader": ["read"], "tight": ["upload", "read"]}
QUOTAS = {"tight": 6000}  # bytes the "tight" key may store
TUS = {"tus-resumable": "1.0.0"}
# header fields whose values must be the same on both paths (ids, dates and signatures differ by nature)
SAME_FIELDS = ("content-type", "content-length", "tus-resumable", "upload-offset", "accept-ranges", "content-range")


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    keys: dict[str, dict[str, Any]] = {
        name: {"sha256": token_hash(TOKENS[name]), "scopes": SCOPES[name]} for name in TOKENS
    }
    for name, limit in QUOTAS.items():
        keys[name]["max_bytes"] = limit
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys=keys,
        inline_threshold=1024,
        session_chunk_size=64 << 10,
        cors_allow_origins=["https://app.example"],
        max_upload_size=1 << 20,
    )
    with running(settings) as server:
        yield server


@pytest.fixture
def http(live: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=30) as client:
        yield client


class Paths:
    """Sends a request through the lean path (checking it took it) or through the full stack."""

    def __init__(self, live: LiveServer, http: httpx.Client) -> None:
        self.app: Any = live.app
        self.http = http
        self.hot: HotPath = self.app.hot_path
        self.matched = 0
        match = self.hot.match

        def counting(scope: Any) -> Any:
            found = match(scope)
            self.matched += found is not None
            return found

        self.hot.match = counting  # type: ignore[method-assign]

    def lean(self, send: Callable[[httpx.Client], httpx.Response]) -> httpx.Response:
        before = self.matched
        response = send(self.http)
        assert self.matched == before + 1, "the lean path did not serve this request"
        return response

    def full(self, send: Callable[[httpx.Client], httpx.Response]) -> httpx.Response:
        self.app.hot_path = None
        try:
            return send(self.http)
        finally:
            self.app.hot_path = self.hot

    def fallback(self, send: Callable[[httpx.Client], httpx.Response]) -> httpx.Response:
        before = self.matched
        response = send(self.http)
        assert self.matched == before, "the lean path served a request it must leave to the stack"
        return response


@pytest.fixture
def paths(live: LiveServer, http: httpx.Client) -> Paths:
    return Paths(live, http)


def assert_same(lean: httpx.Response, full: httpx.Response, *, body: bool = True) -> None:
    assert lean.status_code == full.status_code, (lean.text, full.text)
    for field in SAME_FIELDS:
        assert lean.headers.get(field) == full.headers.get(field), field
    assert ("location" in lean.headers) == ("location" in full.headers)
    assert lean.headers["x-request-id"] and full.headers["x-request-id"]
    if lean.headers.get("content-type") == "application/json" and lean.content:
        lean_json, full_json = lean.json(), full.json()
        if "error" in lean_json:
            assert lean_json == full_json
        else:
            assert lean_json.keys() == full_json.keys()
    elif body:
        assert lean.content == full.content


def test_uploads_answer_the_same(paths: Paths) -> None:
    data = b"x" * 600
    for send in (
        lambda h: h.post("/v1/files", content=data, headers=key("alice")),
        lambda h: h.post("/v1/files?name=a.txt", content=data, headers=key("alice")),
        lambda h: h.post("/v1/files?inline=false", content=data, headers=key("alice")),
        lambda h: h.put("/v1/files?inline=1&name=e.txt", content=data, headers=key("alice")),
        lambda h: h.put("/v1/files/b.txt", content=data, headers=key("alice")),
        lambda h: h.put("/v1/files", content=data, headers={**key("alice"), "expires-in": "3600"}),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "expires-in": "soon"}),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "content-encoding": "br"}),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "content-digest": "sha-256=:AAAA:"}),
        lambda h: h.post("/v1/files", content=data),  # no key
        lambda h: h.post("/v1/files", content=data, headers={"authorization": "Bearer tk_wrong"}),
        lambda h: h.post("/v1/files", content=data, headers={"authorization": "Basic eDp5"}),
        lambda h: h.post("/v1/files", content=data, headers=key("reader")),  # no upload scope
    ):
        assert_same(paths.lean(send), paths.full(send))
    stored = paths.lean(lambda h: h.post("/v1/files?name=c.txt", content=data, headers=key("alice")))
    descriptor = stored.json()
    assert stored.status_code == 201 and descriptor["name"] == "c.txt"
    assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert base64.b64decode(descriptor["data"]) == data
    assert stored.headers["location"] == f"/v1/files/{descriptor['metadata']['file_id']}"


def raw_exchange(live: LiveServer, head: bytes, body: bytes) -> httpx.Response:
    """``head`` and ``body`` on a fresh connection, then the sending side closed (a client gone mid-body when the
    body is shorter than its Content-Length); the server's answer as read until it closes, or none (status 0)."""
    host, port = live.url.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    if not answer:
        return httpx.Response(0)
    top, _, content = answer.partition(b"\r\n\r\n")
    status_line, *fields = top.decode("latin-1").split("\r\n")
    headers = [tuple(f.split(": ", 1)) for f in fields]
    return httpx.Response(int(status_line.split(" ")[1]), headers=headers, content=content)


def test_bad_uploads_answer_the_same(live: LiveServer, paths: Paths) -> None:
    """Refusals the lean path itself meets (the service's, on requests it took): the same status and error JSON."""
    data = b"z" * 4096
    wrong_digest = "sha-256=:" + base64.b64encode(hashlib.sha256(b"other bytes").digest()).decode() + ":"
    for send in (
        lambda h: h.post("/v1/files", content=b"o" * ((1 << 20) + 1), headers=key("alice")),  # over the limit
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "content-digest": wrong_digest}),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "repr-digest": wrong_digest}),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "content-digest": "md5=:AAAA:"}),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "content-encoding": "gzip"}),  # not gzip
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "expires-in": "-5"}),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "expires-in": str(10**12)}),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "expect": "something-else"}),
        lambda h: h.post(
            "/v1/files", content=data, headers={**key("alice"), "content-disposition": "attachment; filename*=x''%ZZ"}
        ),
        lambda h: h.post("/v1/files", content=data, headers={**key("alice"), "content-type": "not a type"}),
        lambda h: h.post("/v1/files", content=data, headers={"authorization": "Bearer"}),
        lambda h: h.post("/v1/files", content=data, headers={"authorization": f"bearer {TOKENS['alice']}x"}),
    ):
        lean, full = paths.lean(send), paths.full(send)
        assert lean.status_code >= 400 or lean.status_code == 201, lean.text
        assert_same(lean, full)
    # a body cut short: the client closes after half of its Content-Length
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: {live.url.rsplit('/', 1)[1]}\r\nAuthorization: Bearer {TOKENS['alice']}\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode()
    lean = paths.lean(lambda h: raw_exchange(live, head, data[:2048]))
    full = paths.full(lambda h: raw_exchange(live, head, data[:2048]))
    assert lean.status_code == full.status_code
    if lean.status_code:
        assert_same(lean, full)
    assert live.leftovers() == []  # nothing half-written on either path


def test_signed_downloads_answer_the_same(paths: Paths) -> None:
    data = bytes(range(256)) * 16
    up = paths.http.post("/v1/files?name=d.bin", content=data, headers=key("alice")).json()
    url = up["url"]
    assert url.startswith("http")
    path = url.split("/", 3)[3]
    for send in (
        lambda h: h.get("/" + path),
        lambda h: h.head("/" + path),
        lambda h: h.get("/" + path, headers={"range": "bytes=10-99"}),
        lambda h: h.get("/" + path, headers={"range": "bytes=9999-"}),
        lambda h: h.get("/" + path.replace("sig=", "sig=0")),
        lambda h: h.get(f"/v1/files/{up['metadata']['file_id']}/content"),  # unsigned
    ):
        assert_same(paths.lean(send), paths.full(send))
    assert paths.lean(lambda h: h.get("/" + path)).content == data


def test_tus_patch_and_head_answer_the_same(paths: Paths) -> None:
    def create(owner: str) -> str:
        r = paths.http.post("/tus/files", headers={**TUS, **key(owner), "upload-length": "8"})
        assert r.status_code == 201
        return str(r.headers["location"]).rsplit("/", 1)[1]

    patch = {**TUS, "content-type": "application/offset+octet-stream"}
    first, second = create("alice"), create("alice")
    for uid, offset in ((first, "0"), (second, "0")):
        send = lambda h, uid=uid, offset=offset: h.patch(  # noqa: E731
            f"/tus/files/{uid}", content=b"abcd", headers={**patch, **key("alice"), "upload-offset": offset}
        )
        (paths.lean if uid == first else paths.full)(send)
    for send in (
        lambda h: h.head(f"/tus/files/{first}", headers={**TUS, **key("alice")}),
        lambda h: h.head(f"/tus/files/{first}", headers={**TUS, **key("bob")}),  # not its owner: 404
        lambda h: h.head("/tus/files/nothing-here", headers={**TUS, **key("alice")}),
        lambda h: h.patch(  # wrong offset: 409
            f"/tus/files/{first}", content=b"ef", headers={**patch, **key("alice"), "upload-offset": "1"}
        ),
        lambda h: h.patch(f"/tus/files/{first}", content=b"ef", headers={**patch, **key("bob"), "upload-offset": "4"}),
        lambda h: h.patch(f"/tus/files/{first}", content=b"ef", headers={**TUS, **key("alice"), "upload-offset": "4"}),
    ):
        assert_same(paths.lean(send), paths.full(send))
    last = {**patch, **key("alice"), "upload-offset": "4"}
    done = paths.lean(lambda h: h.patch(f"/tus/files/{first}", content=b"efgh", headers=last))
    assert done.status_code == 204 and done.headers["upload-offset"] == "8" and done.headers["upload-file-id"]
    assert done.headers["tus-resumable"] == "1.0.0"


def test_chunk_puts_answer_the_same(paths: Paths) -> None:
    chunk = b"c" * (64 << 10)
    r = paths.http.post("/v1/sessions", json={"size": 3 * len(chunk), "chunk_size": len(chunk)}, headers=key("alice"))
    assert r.status_code == 201, r.text
    sid = r.json()["streaming_session_id"]
    checksum = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(chunk)}
    alice = {**key("alice"), **checksum}
    lean = paths.lean(lambda h: h.put(f"/v1/sessions/{sid}/chunks/0", content=chunk, headers=alice))
    full = paths.full(lambda h: h.put(f"/v1/sessions/{sid}/chunks/1", content=chunk, headers=alice))
    assert lean.status_code == full.status_code == 201
    assert lean.json() | {"index": 0} == full.json() | {"index": 0}
    for send in (
        lambda h: h.put(f"/v1/sessions/{sid}/chunks/0", content=chunk, headers={**key("alice"), **checksum}),  # again
        lambda h: h.put(f"/v1/sessions/{sid}/chunks/2", content=chunk, headers=key("alice")),  # no checksum
        lambda h: h.put(f"/v1/sessions/{sid}/chunks/2", content=chunk, headers={**key("bob"), **checksum}),  # 404
        lambda h: h.put(f"/v1/sessions/{sid}/chunks/9", content=chunk, headers={**key("alice"), **checksum}),
        lambda h: h.put(f"/v1/sessions/{sid}/chunks/2", content=b"short", headers={**key("alice"), **checksum}),
    ):
        assert_same(paths.lean(send), paths.full(send))


def test_what_the_lean_path_leaves_to_the_stack(paths: Paths) -> None:
    data = b"y" * 100
    alice = key("alice")
    for send, status in (
        (lambda h: h.post("/v1/files?name=a&role=attachment", content=data, headers=alice), 201),  # query options
        (lambda h: h.post("/v1/files?size=x", content=data, headers=alice), 400),  # the framework's validation
        (lambda h: h.post("/v1/files?inline=maybe", content=data, headers=alice), 400),
        (lambda h: h.put("/v1/files/" + "n" * 1025, content=data, headers=alice), 400),  # name over its limit
        (lambda h: h.post("/v1/files?name=a&name=b", content=data, headers=alice), 201),
        (lambda h: h.post("/v1/files", content=data, headers={**alice, "host": "evil.example"}), 400),
        (lambda h: h.post("/v1/files", content=data, headers={**alice, "origin": "https://evil.example"}), 403),
        (lambda h: h.post("/v1/files", content=data, headers={**alice, "x-big": "z" * 70_000}), 431),
        (lambda h: h.patch("/tus/files/x", content=data, headers=alice), 412),  # no Tus-Resumable
        (lambda h: h.put("/v1/sessions/s/chunks/-1", content=data, headers=alice), 400),  # not a decimal index
    ):
        response = paths.fallback(send)
        assert response.status_code == status, (status, response.text)
    # a browser's request from an allowed site: CORS is the stack's, and its answer carries the CORS fields
    site = {**alice, "origin": "https://app.example"}
    allowed = paths.fallback(lambda h: h.post("/v1/files", content=data, headers=site))
    assert allowed.status_code == 201 and allowed.headers["access-control-allow-origin"] == "https://app.example"


def test_the_signature_index_answers_each_head_for_itself() -> None:
    """An upload asks the signature index about its head twice and the second answer is the one kept: a different
    head must never get it (a PNG after a text head, and back)."""
    from transfer.core.model.naming import _MAGIC, resolve_content_type

    text, png = b"plain words " * 40, b"\x89PNG\r\n\x1a\n" + bytes(64)
    assert _MAGIC.may_match(text) is False and _MAGIC.may_match(text) is False
    assert _MAGIC.may_match(png) is True
    assert resolve_content_type(png, None, declared=None, hinted=None) == "image/png"
    assert _MAGIC.may_match(bytes(text)) is False
    assert resolve_content_type(text, None, declared=None, hinted=None) == "text/plain"


# --- byte for byte: the raw answers of the two paths ---

REQUEST_ID = "same-request-id-01"  # a client's X-Request-ID is kept: both answers then carry the same one
# what differs between two answers by nature: the Date field, a new file's id (and the signature, expiry and
# timestamps derived from it); everything else must be the same bytes
_VARYING = [
    (re.compile(rb"\r\ndate: [^\r]*"), rb""),
    (re.compile(rb"f_[0-9a-f]{32}"), rb"f_ID"),
    (re.compile(rb"sig=[A-Za-z0-9_-]+"), rb"sig=SIG"),
    (re.compile(rb"exp=[0-9]+"), rb"exp=EXP"),
    (re.compile(rb"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?Z"), rb"TIME"),
]


def raw_answer(live: LiveServer, request: bytes, *, cut: int | None = None) -> bytes:
    """The server's whole answer to ``request`` (sent with ``Connection: close``), read until it closes; ``cut``:
    only that many bytes are sent, then the sending side is closed (a client gone mid-body)."""
    host, port = live.url.rsplit("/", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request if cut is None else request[:cut])
        if cut is not None:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def upload_request(
    live: LiveServer, body: bytes, headers: dict[str, str], *, target: str = "/v1/files", method: str = "POST"
) -> bytes:
    host = live.url.rsplit("/", 1)[1]
    fields = {"host": host, "x-request-id": REQUEST_ID, "connection": "close", **headers}
    fields.setdefault("content-length", str(len(body)))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode("latin-1") + body


def comparable(answer: bytes) -> bytes:
    for pattern, replacement in _VARYING:
        answer = pattern.sub(replacement, answer)
    return answer


def digest_of(data: bytes) -> str:
    return "sha-256=:" + base64.b64encode(hashlib.sha256(data).digest()).decode() + ":"


BODY = bytes(range(256)) * 16  # 4 KiB: url mode (over the inline threshold), a sniffable binary
BYTE_CASES: dict[str, tuple[int, str, str, dict[str, str], bytes]] = {  # status, method, target, fields, body
    "stored": (201, "POST", "/v1/files", key("alice"), BODY),
    "stored by PUT with a name": (201, "PUT", "/v1/files/a.bin", key("alice"), BODY),
    "stored with a digest": (
        201,
        "POST",
        "/v1/files?name=b.bin",
        {**key("alice"), "content-digest": digest_of(BODY)},
        BODY,
    ),
    "stored inline": (201, "POST", "/v1/files?inline=true", key("alice"), b"short text"),
    "no key": (401, "POST", "/v1/files", {}, BODY),
    "bad key": (401, "POST", "/v1/files", {"authorization": "Bearer tk_not_a_key_of_this_server"}, BODY),
    "wrong scope": (403, "POST", "/v1/files", key("reader"), BODY),
    # declared over the limit: refused before the body is read (the rest of it is never sent)
    "oversized": (413, "POST", "/v1/files", {**key("alice"), "content-length": str((1 << 20) + 1)}, b"o" * 100),
    "bad checksum": (422, "POST", "/v1/files", {**key("alice"), "content-digest": digest_of(b"other bytes")}, BODY),
    "quota": (413, "POST", "/v1/files", key("tight"), BODY * 2),
    "bad content coding": (400, "POST", "/v1/files", {**key("alice"), "content-encoding": "gzip"}, BODY),
}


@pytest.mark.parametrize("case", list(BYTE_CASES))
def test_answers_are_the_same_bytes(live: LiveServer, paths: Paths, case: str) -> None:
    """Each request, once through the lean path and once through the full stack: the same status line, the same
    header fields in the same order with the same values, the same body (up to what differs by nature)."""
    status, method, target, headers, body = BYTE_CASES[case]
    request = upload_request(live, body, headers, target=target, method=method)
    cut = len(request) if "content-length" in headers else None  # a body shorter than declared: then no more
    lean = paths.lean(lambda h: httpx.Response(200, content=raw_answer(live, request, cut=cut)))
    full = paths.full(lambda h: httpx.Response(200, content=raw_answer(live, request, cut=cut)))
    assert lean.content.startswith(f"HTTP/1.1 {status} ".encode()), lean.content
    assert comparable(lean.content) == comparable(full.content)
    assert f"x-request-id: {REQUEST_ID}".encode() in lean.content


def test_a_truncated_body_answers_the_same_bytes(live: LiveServer, paths: Paths) -> None:
    """A client that closes after half of its declared body: the same answer (or the same silence) on both paths,
    and nothing half-written left by either."""
    request = upload_request(live, BODY, key("alice"))
    cut = len(request) - len(BODY) // 2
    lean = paths.lean(lambda h: httpx.Response(200, content=raw_answer(live, request, cut=cut)))
    full = paths.full(lambda h: httpx.Response(200, content=raw_answer(live, request, cut=cut)))
    assert comparable(lean.content) == comparable(full.content)
    assert live.leftovers() == []


def test_signed_downloads_answer_the_same_bytes(live: LiveServer, paths: Paths) -> None:
    stored = paths.http.post("/v1/files?name=d.bin", content=BODY, headers=key("alice")).json()
    target = "/" + stored["url"].split("/", 3)[3]
    host = live.url.rsplit("/", 1)[1]
    for method, fields, status in (
        ("GET", "", 200),
        ("HEAD", "", 200),
        ("GET", "range: bytes=10-99\r\n", 206),
        ("GET", "range: bytes=9999-\r\n", 416),
        ("GET", "if-none-match: *\r\n", 304),
    ):
        for url, expected in ((target, status), (target.replace("sig=", "sig=0"), 403)):
            request = f"{method} {url} HTTP/1.1\r\nhost: {host}\r\nx-request-id: {REQUEST_ID}\r\n{fields}"
            request += "connection: close\r\n\r\n"
            lean = paths.lean(lambda h, r=request: httpx.Response(200, content=raw_answer(live, r.encode())))
            full = paths.full(lambda h, r=request: httpx.Response(200, content=raw_answer(live, r.encode())))
            assert lean.content.startswith(f"HTTP/1.1 {expected} ".encode()), (method, fields, lean.content[:200])
            assert comparable(lean.content) == comparable(full.content)
