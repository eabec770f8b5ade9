"""IETF Resumable Uploads for HTTP (draft-ietf-httpbis-resumable-upload, interop version 9, and 8 still) at
/v1/uploads, on a real uvicorn server, driven by a raw HTTP/1.1 client over a socket so that the 104 interim response
is seen as sent; an upload created by one protocol (IETF or tus) is finished by the other; one begun on one replica
is resumed on another."""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import socket
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import LiveServer, running
from transfer.api.protocol.informational import interim_head
from transfer.core.auth import new_token, token_hash
from transfer.core.http.resumable import UploadLimits, boolean_item, integer_item, parse_upload_limit, wants_sha256
from transfer.settings import Settings

# One-shot requests with a timeout that an S3 completion fits in on a loaded machine (httpx's default is 5 s).
web = types.SimpleNamespace(
    **{m: functools.partial(getattr(httpx, m), timeout=60) for m in ("get", "post", "patch", "put", "head", "delete")}
)

TOKENS = {name: new_token() for name in ("alice", "bob")}
V8 = {"upload-draft-interop-version": "8"}
V9 = {"upload-draft-interop-version": "9"}
TUS = {"tus-resumable": "1.0.0"}
PARTIAL = {"content-type": "application/partial-upload"}


def key(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[name]}"}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def live(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LiveServer]:
    """Two keys, on local storage and again on the S3 test server (the engine keeps its records there)."""
    extra: dict[str, Any] = {}
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        extra = {"storage": "s3"}
    keys = {name: {"sha256": token_hash(token), "scopes": ["upload", "read"]} for name, token in TOKENS.items()}
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys=keys,
        inline_threshold=1024,
        **extra,
    )
    with running(settings) as server:
        yield server


@dataclass
class Message:
    status: int
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class RawClient:
    """One HTTP/1.1 connection written by hand: what the client sends and the interim + final responses it gets,
    byte for byte as the server wrote them (no HTTP library in between to swallow a 1xx)."""

    base: str
    sock: socket.socket = field(init=False)
    buffer: bytes = b""

    def __post_init__(self) -> None:
        parts = urlsplit(self.base)
        assert parts.hostname is not None and parts.port is not None
        self.host = f"{parts.hostname}:{parts.port}"  # the server's own Host (the trust boundary checks it)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=30)

    def send_head(self, method: str, path: str, headers: dict[str, str]) -> None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}", *(f"{k}: {v}" for k, v in headers.items())]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        piece = self.sock.recv(65536)
        if not piece:
            raise ConnectionError("server closed the connection")
        self.buffer += piece

    def read_message(self, *, head_only: bool = False) -> Message:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(status_line.split()[1])
        if status < 200 or head_only or status == 204:
            return Message(status, headers)
        size = int(headers.get("content-length", "0"))
        while len(self.buffer) < size:
            self._fill()
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return Message(status, headers, body)

    def close(self) -> None:
        self.sock.close()  # a full close, as a client that is killed or loses its network


def sha256_field(data: bytes) -> str:
    return f"sha-256=:{base64.b64encode(hashlib.sha256(data).digest()).decode()}:"


def offset_after_cut(live: LiveServer, location: str, who: str = "alice") -> int:
    """The offset once the server has noticed the cut connection and kept what arrived (HEAD until it moves; the
    bound is a deadline for a broken server, not a timing assertion)."""
    deadline = time.monotonic() + 30
    while True:
        head = web.head(location, headers=key(who))
        assert head.status_code == 204, head.text
        offset = int(head.headers["upload-offset"])
        if offset > 0 or time.monotonic() > deadline:
            return offset
        time.sleep(0.05)


@pytest.mark.parametrize("version", ["9", "8"])
def test_creation_sends_104_then_resume_after_a_cut_keeps_what_arrived(live: LiveServer, version: str) -> None:
    data = os.urandom(3 << 20)
    client = RawClient(live.url)
    client.send_head(
        "POST",
        "/v1/uploads",
        {
            **key("alice"),
            "upload-draft-interop-version": version,
            "upload-complete": "?1",
            "content-length": str(len(data)),
            "content-type": "application/octet-stream",
            "content-disposition": 'inline; filename="cut.bin"',
            "repr-digest": sha256_field(data),
        },
    )
    interim = client.read_message()  # sent before any body byte: the client learns where to resume at once
    assert interim.status == 104
    assert interim.headers["upload-draft-interop-version"] == version  # the client's own version, echoed
    location = interim.headers["location"]
    assert location.startswith(live.url + "/v1/uploads/t_")
    assert "max-size=" in interim.headers["upload-limit"]
    half = len(data) // 2
    client.send(data[:half])
    client.close()  # cut mid-body

    offset = offset_after_cut(live, location)
    assert 0 < offset <= half
    head = web.head(location, headers=key("alice"))
    assert boolean_item(head.headers["upload-complete"]) is False
    assert integer_item(head.headers["upload-length"]) == len(data)
    assert head.headers["cache-control"] == "no-store"

    rest = RawClient(live.url)
    rest.send_head(
        "PATCH",
        urlsplit(location).path,
        {
            **key("alice"),
            "upload-complete": "?1",
            "upload-draft-interop-version": version,
            "upload-offset": str(offset),
            "content-type": "application/partial-upload",
            "content-length": str(len(data) - offset),
        },
    )
    rest.send(data[offset:])
    final = rest.read_message()
    rest.close()
    assert final.status == 201, final.body
    assert boolean_item(final.headers["upload-complete"]) is True
    assert final.headers["repr-digest"] == sha256_field(data)
    descriptor = json.loads(final.body)
    assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert descriptor["name"] == "cut.bin"
    fetched = web.get(descriptor["url"])
    assert hashlib.sha256(fetched.content).digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize("version", [None, "7", "10", "9.0", "?1", "9, 8"])
def test_no_104_to_a_version_not_spoken_here(live: LiveServer, version: str | None) -> None:
    """Appendix "Draft Version Identification": no 104 when the version is missing or mismatching; the upload
    works all the same, its Location in the final response (the "careful" strategy)."""
    client = RawClient(live.url)
    announced = {} if version is None else {"upload-draft-interop-version": version}
    client.send_head(
        "POST", "/v1/uploads", {**key("alice"), **announced, "upload-complete": "?0", "content-length": "3"}
    )
    client.send(b"abc")
    first = client.read_message()
    client.close()
    assert first.status == 201  # the final response came first: no interim response for an unknown version
    assert boolean_item(first.headers["upload-complete"]) is False
    assert first.headers["upload-offset"] == "3"
    done = web.patch(
        first.headers["location"],
        headers={**key("alice"), **V9, **PARTIAL, "upload-offset": "3", "upload-complete": "?1"},
        content=b"def",
    )
    assert done.status_code == 201 and done.json()["checksum"] == "sha256:" + hashlib.sha256(b"abcdef").hexdigest()


def test_a_lost_final_response_is_replayed_at_9_and_gone_at_8(live: LiveServer) -> None:
    """After completion the client may append again (its final response was lost): interop 9 replays the final
    response for a valid append (the offset, no content), refuses content; interop 8 (-11) answers 410 with the
    completed-upload problem type, and content as an inconsistent length."""
    data = os.urandom(5000)
    done = web.post(live.url + "/v1/uploads", headers={**key("alice"), **V9, "upload-complete": "?1"}, content=data)
    assert done.status_code == 201
    location, descriptor = done.headers["location"], done.json()
    head = web.head(location, headers={**key("alice"), **V9})
    assert boolean_item(head.headers["upload-complete"]) is True and head.headers["upload-offset"] == "5000"
    last = {**key("alice"), **PARTIAL, "upload-complete": "?1"}
    replayed = web.patch(location, headers={**last, **V9, "upload-offset": "5000"}, content=b"")
    assert replayed.status_code == 201

    def unsigned(d: dict[str, Any]) -> dict[str, Any]:  # the URL is signed anew for each answer
        return {k: v for k, v in d.items() if k not in ("url", "url_expires_at")}

    assert unsigned(replayed.json()) == unsigned(descriptor)
    assert web.get(replayed.json()["url"]).content == data  # and the new signature reads the same bytes
    assert boolean_item(replayed.headers["upload-complete"]) is True
    more = web.patch(location, headers={**last, **V9, "upload-offset": "5000"}, content=b"x")
    assert more.status_code == 400 and more.json()["type"].endswith("#inconsistent-upload-length")
    wrong = web.patch(location, headers={**last, **V9, "upload-offset": "10"}, content=b"")
    assert wrong.status_code == 409 and wrong.headers["upload-offset"] == "5000"
    gone = web.patch(location, headers={**last, **V8, "upload-offset": "5000"}, content=b"")
    assert gone.status_code == 410 and gone.headers["content-type"] == "application/problem+json"
    assert gone.json()["type"] == "https://iana.org/assignments/http-problem-types#completed-upload"
    assert gone.headers["location"] == "/v1/files/" + descriptor["metadata"]["file_id"]
    assert boolean_item(gone.headers["upload-complete"]) is False
    more8 = web.patch(location, headers={**last, **V8, "upload-offset": "5000"}, content=b"x")
    assert more8.status_code == 400 and more8.json()["type"].endswith("#inconsistent-upload-length")
    files = web.get(live.url + "/v1/files", headers=key("alice")).json()["files"]
    assert [f["checksum"] for f in files] == [descriptor["checksum"]]  # nothing was published twice


def test_content_codings_are_refused_before_anything_is_created(live: LiveServer) -> None:
    """§"Content Codings": offsets count the representation as sent; this door stores bytes as they come, so only
    identity: 415 with Accept-Encoding (RFC 9110 §15.5.16), and no upload resource left behind."""
    client = RawClient(live.url)
    client.send_head(
        "POST",
        "/v1/uploads",
        {**key("alice"), **V9, "upload-complete": "?1", "content-encoding": "gzip", "content-length": "4"},
    )
    client.send(b"\x1f\x8b\x08\x00")
    first = client.read_message()
    client.close()
    assert first.status == 415  # not 104: nothing was created to resume
    assert first.headers["accept-encoding"] == "identity"
    assert json.loads(first.body)["code"] == "unsupported_encoding"
    if live.settings.storage == "local":
        assert not [k for k in live.objects() if k.startswith("tus/")]


def test_created_by_ietf_finished_by_tus(live: LiveServer) -> None:
    data = os.urandom(1 << 20)
    created = web.post(
        live.url + "/v1/uploads",
        headers={**key("alice"), "upload-complete": "?0", "upload-length": str(len(data))},
        content=data[:1000],
    )
    assert created.status_code == 201, created.text
    uid = created.headers["location"].rsplit("/", 1)[1]
    head = web.head(f"{live.url}/tus/files/{uid}", headers={**key("alice"), **TUS})
    assert head.headers["upload-offset"] == "1000" and head.headers["upload-length"] == str(len(data))
    patched = web.patch(
        f"{live.url}/tus/files/{uid}",
        headers={**key("alice"), **TUS, "upload-offset": "1000", "content-type": "application/offset+octet-stream"},
        content=data[1000:],
    )
    assert patched.status_code == 204, patched.text
    offset = web.head(created.headers["location"], headers=key("alice"))
    assert boolean_item(offset.headers["upload-complete"]) is True
    assert offset.headers["repr-digest"] == sha256_field(data)
    assert web.get(f"{live.url}/tus/files/{uid}", headers=key("alice")).content == data


def test_created_by_tus_finished_by_ietf(live: LiveServer) -> None:
    data = os.urandom(300_000)
    created = web.post(
        live.url + "/tus/files", headers={**key("alice"), **TUS, "upload-defer-length": "1"}, content=b""
    )
    uid = created.headers["location"].rsplit("/", 1)[1]
    first = web.patch(
        f"{live.url}/v1/uploads/{uid}",
        headers={
            **key("alice"),
            "upload-offset": "0",
            "upload-complete": "?0",
            "content-type": "application/partial-upload",
        },
        content=data[:100_000],
    )
    assert first.status_code == 204 and first.headers["upload-offset"] == "100000"
    # Upload-Complete: ?1 on a chunked body (no Content-Length): the length is what arrived
    last = web.patch(
        f"{live.url}/v1/uploads/{uid}",
        headers={
            **key("alice"),
            "upload-offset": "100000",
            "upload-complete": "?1",
            "content-type": "application/partial-upload",
        },
        content=iter([data[100_000:200_000], data[200_000:]]),
    )
    assert last.status_code == 201, last.text
    assert last.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    tus_head = web.head(f"{live.url}/tus/files/{uid}", headers={**key("alice"), **TUS})
    assert tus_head.headers["upload-offset"] == tus_head.headers["upload-length"] == str(len(data))


def test_mismatching_offset_is_a_problem_with_both_offsets(live: LiveServer) -> None:
    created = web.post(
        live.url + "/v1/uploads", headers={**key("alice"), "upload-complete": "?0"}, content=b"0123456789"
    )
    response = web.patch(
        created.headers["location"],
        headers={
            **key("alice"),
            "upload-offset": "4",
            "upload-complete": "?0",
            "content-type": "application/partial-upload",
        },
        content=b"x",
    )
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["upload-offset"] == "10"
    assert boolean_item(response.headers["upload-complete"]) is False
    problem = response.json()
    assert problem["type"] == "https://iana.org/assignments/http-problem-types#mismatching-upload-offset"
    assert (problem["expected-offset"], problem["provided-offset"]) == (10, 4)
    assert problem["code"] == "upload_offset_mismatch"


def test_inconsistent_length_and_wrong_media_type(live: LiveServer) -> None:
    response = web.post(
        live.url + "/v1/uploads",
        headers={**key("alice"), "upload-complete": "?1", "upload-length": "99"},
        content=b"short",
    )
    assert response.status_code == 400
    assert response.json()["type"].endswith("#inconsistent-upload-length")
    created = web.post(live.url + "/v1/uploads", headers={**key("alice"), "upload-complete": "?0"}, content=b"")
    wrong = web.patch(
        created.headers["location"],
        headers={**key("alice"), "upload-offset": "0", "upload-complete": "?1", "content-type": "text/plain"},
        content=b"x",
    )
    assert wrong.status_code == 415
    assert wrong.headers["content-type"] == "application/problem+json"
    # Upload-Complete that is not a Boolean is ignored (draft §4.1.2): this is then no resumable upload request
    bad = web.post(live.url + "/v1/uploads", headers={**key("alice"), "upload-complete": "1"}, content=b"")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"


def test_repr_digest_mismatch_publishes_nothing(live: LiveServer) -> None:
    response = web.post(
        live.url + "/v1/uploads",
        headers={**key("alice"), "upload-complete": "?1", "repr-digest": sha256_field(b"something else")},
        content=b"the real bytes",
    )
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "checksum_mismatch"
    assert boolean_item(response.headers["upload-complete"]) is True  # processing failed: do not resume
    assert web.get(live.url + "/v1/files", headers=key("alice")).json()["files"] == []


def test_want_repr_digest_and_cancel_and_owner(live: LiveServer) -> None:
    data = b"hello resumable"
    done = web.post(
        live.url + "/v1/uploads",
        headers={**key("alice"), "upload-complete": "?1", "want-repr-digest": "sha-256=10"},
        content=data,
    )
    assert done.status_code == 201 and done.headers["repr-digest"] == sha256_field(data)
    created = web.post(live.url + "/v1/uploads", headers={**key("alice"), "upload-complete": "?0"}, content=b"ab")
    location = created.headers["location"]
    for method in ("HEAD", "DELETE", "PATCH"):  # another key learns nothing, changes nothing
        other = httpx.request(
            method,
            location,
            headers={
                **key("bob"),
                "upload-offset": "2",
                "upload-complete": "?1",
                "content-type": "application/partial-upload",
            },
        )
        assert other.status_code == 404, (method, other.text)
    assert web.head(location).status_code == 401
    assert web.delete(location, headers=key("alice")).status_code == 204
    gone = web.head(location, headers=key("alice"))
    assert gone.status_code == 410


def test_options_advertises_limits_beside_tus(live: LiveServer) -> None:
    response = httpx.options(live.url + "/v1/uploads")
    assert response.status_code == 204
    limits = parse_upload_limit(response.headers["upload-limit"])
    assert limits == UploadLimits(max_size=live.settings.max_upload_size, min_size=0, max_age=live.settings.session_ttl)
    assert response.headers["accept-patch"] == "application/partial-upload"
    tus = httpx.options(live.url + "/tus/files")
    assert tus.headers["tus-version"] == "1.0.0"


def test_forged_host_is_refused_before_the_route(live: LiveServer) -> None:
    client = RawClient(live.url)
    client.host = "evil.example"
    client.send_head("POST", "/v1/uploads", {**key("alice"), **V9, "upload-complete": "?1", "content-length": "0"})
    first = client.read_message()
    client.close()
    assert first.status == 400  # no 104 with a Location built from a forged Host


def test_structured_fields_and_interim_bytes() -> None:
    assert boolean_item("?1") is True and boolean_item("?0") is False
    assert boolean_item("1") is None and boolean_item("?1, ?0") is None and boolean_item(None) is None
    assert integer_item("42") == 42 and integer_item("-1") is None and integer_item("4.2") is None
    assert integer_item("?1") is None and integer_item("1" * 16) is None
    assert wants_sha256("sha-256=3, sha-512=0") and not wants_sha256("sha-256=0") and not wants_sha256("x")
    assert interim_head(104, [(b"location", b"/v1/uploads/t_1")]) == (
        b"HTTP/1.1 104 Upload Resumption Supported\r\nlocation: /v1/uploads/t_1\r\n\r\n"
    )
    for status, headers in ((101, []), (200, []), (104, [(b"x", b"a\r\nb")]), (104, [(b"a:b", b"c")])):
        with pytest.raises(ValueError):
            interim_head(status, headers)


@pytest.mark.parametrize("complete", ["?1;a=b", "?1;a", '?1;x=1.5;y="s"'])
def test_upload_complete_is_a_structured_field_boolean_with_parameters(live: LiveServer, complete: str) -> None:
    """``Upload-Complete`` is an RFC 9651 Item: a Boolean with parameters is that Boolean (the reported refusal of
    ``?1;a=b`` did not reproduce here: the field has gone through http-sf since the first version; kept as a
    regression test), in creation and in append."""
    assert boolean_item(complete) is True
    data = os.urandom(3000)
    created = web.post(
        live.url + "/v1/uploads", headers={**key("alice"), "upload-complete": "?0;a=b"}, content=data[:1000]
    )
    assert created.status_code == 201, created.text
    appended = web.patch(
        created.headers["location"],
        headers={
            **key("alice"),
            "upload-complete": complete,
            "upload-offset": "1000",
            "content-type": "application/partial-upload",
        },
        content=data[1000:],
    )
    assert appended.status_code in (200, 201), appended.text
    assert appended.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
