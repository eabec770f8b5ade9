"""Hostile input at every parser: oversized or non-ASCII numerals in header fields, media types with control
characters from every front door, an Upload-Length below the offset, UTF-8 multipart file names, URLs that do not
parse. Each answer is a 4xx with its code (or, where RFC 9110 says so, the field is ignored), never a 500; nothing
bad is stored. Pure parsers are fuzzed with hypothesis: any text in, a value or a 4xx error out."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import LiveServer
from tests.uploads.test_api_upload import assert_error
from transfer.api.sessions import parse_prefer_wait
from transfer.client.dedup import cut_file
from transfer.core.http.conditional import evaluate_preconditions, if_range_allows_range, parse_http_date
from transfer.core.http.ranges import IgnoreRange, Satisfiable, Unsatisfiable, parse_range_header
from transfer.core.jsontext import MAX_DEPTH, parse_json
from transfer.core.model.content import ContentEncoding
from transfer.core.model.mime import is_media_type, validate_media_type
from transfer.core.model.naming import sanitize_filename
from transfer.core.numerals import MAX_DIGITS, decimal, parse_count
from transfer.core.uploads.state import FileIntent
from transfer.errors import InvalidRequest, JsonTooDeep, TransferError
from transfer.service.files.records import FileRecord, new_file_id, object_key
from transfer.service.uploads.tus import parse_metadata

HUGE = "9" * 5000  # above Python 3.11's 4,300-digit int() limit
SUPERSCRIPT_TWO = b"\xb2"  # '²' once decoded as latin-1: str.isdigit() is True for it, int() refuses it
V = {"tus-resumable": "1.0.0"}
DATA = os.urandom(4096)


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def stored(http: httpx.Client) -> dict[str, Any]:
    d: dict[str, Any] = http.post("/v1/files", params={"name": "d.bin", "inline": "false"}, content=DATA).json()
    return d


# --- integer-valued header fields --------------------------------------------------------------------------------


def test_range_with_huge_numerals_is_answered_by_the_rfc(http: httpx.Client, stored: dict[str, Any]) -> None:
    url = stored["url"]
    whole = http.get(url, headers={"range": f"bytes=0-{HUGE}"})  # last-pos past the end: up to the end (§14.1.2)
    assert whole.status_code == 206 and whole.content == DATA
    assert whole.headers["content-range"] == f"bytes 0-{len(DATA) - 1}/{len(DATA)}"
    suffix = http.get(url, headers={"range": f"bytes=-{HUGE}"})  # a suffix longer than the file: all of it
    assert suffix.status_code == 206 and suffix.content == DATA
    beyond = http.get(url, headers={"range": f"bytes={HUGE}-"})
    assert_error(beyond, 416, "range_not_satisfiable")
    assert beyond.headers["content-range"] == f"bytes */{len(DATA)}"
    backwards = http.get(url, headers={"range": f"bytes={HUGE}-{HUGE[:-1]}"})  # last < first: invalid, ignored
    assert backwards.status_code == 200 and backwards.content == DATA


def test_range_with_non_ascii_digits_is_ignored(http: httpx.Client, stored: dict[str, Any]) -> None:
    r = http.get(stored["url"], headers={"range": b"bytes=0-" + SUPERSCRIPT_TWO})
    assert r.status_code == 200 and r.content == DATA  # not a valid range-spec: the field is ignored (§14.2)


def test_conditional_dates_with_huge_numerals_are_ignored(http: httpx.Client, stored: dict[str, Any]) -> None:
    for field in ("if-modified-since", "if-unmodified-since", "if-range"):
        for value in (
            "Sun, 06 Nov 99999999999999999999 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 +99999999999999999999",
            f"Sun, 06 Nov 1994 {HUGE}:49:37 GMT",
        ):
            r = http.get(stored["url"], headers={field: value, "range": "bytes=0-9"})
            assert r.status_code in (200, 206), (field, value, r.text)


@pytest.mark.parametrize("value", [HUGE.encode(), SUPERSCRIPT_TWO, b"-1", b"1e3", b"0x10", b"1 2", b"1_000"])
def test_tus_upload_length_and_offset_are_bounded(live_server: LiveServer, value: bytes) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        assert_error(http.post("/tus/files", headers={**V, "upload-length": value}), 400, "invalid_request")
        created = http.post("/tus/files", headers={**V, "upload-length": "10"})
        assert created.status_code == 201
        patch = http.patch(
            created.headers["location"],
            content=b"0123456789",
            headers={**V, "upload-offset": value, "content-type": "application/offset+octet-stream"},
        )
        assert_error(patch, 400, "invalid_request")
        checksum = http.patch(
            created.headers["location"],
            content=b"0123456789",
            headers={
                **V,
                "upload-offset": "0",
                "upload-checksum": b"sha1 " + SUPERSCRIPT_TWO,
                "content-type": "application/offset+octet-stream",
            },
        )
        assert_error(checksum, 400, "invalid_request")
    assert live_server.leftovers() == []


@pytest.mark.parametrize("value", [HUGE.encode(), SUPERSCRIPT_TWO, b"--1", b"+3"])
def test_last_event_id_is_bounded(http: httpx.Client, value: bytes) -> None:
    r = http.get(f"/v1/jobs/j_{uuid.uuid4().hex[:16]}/events", headers={"last-event-id": value})
    assert_error(r, 400, "invalid_request")
    q = http.get(f"/v1/jobs/j_{uuid.uuid4().hex[:16]}/events", params={"last_event_id": HUGE})
    assert_error(q, 400, "invalid_request")


def test_content_length_is_bounded_on_upload(http: httpx.Client, live_server: LiveServer) -> None:
    # httptools refuses a malformed Content-Length itself; the route's own parser is the same bounded one
    with pytest.raises(InvalidRequest):
        parse_count(HUGE, "Content-Length")
    assert live_server.objects() == []


def test_prefer_wait_with_non_ascii_digits_is_ignored_on_a_chunk_read(live_server: LiveServer) -> None:
    data = os.urandom(1000)
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        doc = http.post("/v1/sessions", json={"size": len(data)}).json()
        sid = doc["streaming_session_id"]
        put = http.put(
            f"/v1/sessions/{sid}/chunks/0",
            content=data,
            headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)},
        )
        assert put.status_code == 201, put.text
        path, _, query = doc["descriptor"]["url"].partition("?")  # the signed chunks URL
        for prefer in (b"wait=" + SUPERSCRIPT_TWO, b"wait=" + HUGE.encode(), b"wait=\xff\xfe", b"wait"):
            r = http.get(f"{path}/0?{query}", headers={"prefer": prefer})
            assert r.status_code == 200 and r.content == data, r.text


# --- media types and names from every front door ------------------------------------------------------------------

BAD_TYPES = ["text/plain\r\nx-evil: 1", "text/html\n", "text/plain; charset=\x00", "a" * 300 + "/b", "text/\u00e9"]


@pytest.mark.parametrize("bad", BAD_TYPES)
def test_tus_filetype_with_control_characters_is_refused_at_creation(live_server: LiveServer, bad: str) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        r = http.post(
            "/tus/files",
            headers={**V, "upload-length": "5", "upload-metadata": f"filename {b64('a.txt')},filetype {b64(bad)}"},
        )
        assert_error(r, 400, "invalid_request")
        listing = http.get("/v1/files")
        assert listing.status_code == 200 and listing.json() == {"files": [], "next_cursor": None}
    assert live_server.objects() == []


@pytest.mark.parametrize("bad", BAD_TYPES)
def test_multipart_and_query_content_types_are_validated(live_server: LiveServer, bad: str) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        form = http.post("/v1/files", files={"file": ("a.txt", b"hello")}, data={"content_type": bad})
        assert_error(form, 400, "invalid_request")
        query = http.post("/v1/files", params={"content_type": bad}, content=b"hello")
        assert query.status_code in (400,), query.text
        session = http.post("/v1/sessions", json={"size": 5, "content_type": bad})
        assert_error(session, 400, "invalid_request")
        assert http.get("/v1/files").json() == {"files": [], "next_cursor": None}
    assert live_server.objects() == []


@pytest.mark.anyio
async def test_tp_and_mcp_session_content_types_are_validated(live_server: LiveServer) -> None:
    sessions = live_server.app.state.services.sessions
    for bad in BAD_TYPES:  # the operation TP resource_mount {upload} and the MCP open_session tool both call
        with pytest.raises(InvalidRequest):
            await sessions.create(
                size=5,
                chunk_size=None,
                checksum=None,
                ttl=None,
                owner=None,
                intent=FileIntent(name="a", content_type=bad),
            )
    with pytest.raises(InvalidRequest):  # TP hands the envelope's checksum string over as it came
        await sessions.create(size=5, chunk_size=None, checksum="zz", ttl=None, owner=None, intent=FileIntent(name="a"))
    envelope = {
        "tp_version": "1.0.0",
        "message_id": str(uuid.uuid4()),
        "message_type": "resource_mount",
        "sender": "fay:a",
        "receiver": "fay:b",
        "protocol_contract_ref": "c",
        "payload": {"upload": {"name": "a.txt", "size": 5, "content_type": "text/plain\r\nx-evil: 1"}},
    }
    async with httpx.AsyncClient(base_url=live_server.url) as http:
        r = await http.post("/tp/v1/resource/mount", json=envelope, headers={"content-type": "application/tp+json"})
        assert r.status_code == 400, r.text


@pytest.mark.anyio
async def test_listing_skips_a_bad_record_and_says_so(
    live_server: LiveServer, http: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    good = http.post("/v1/files", params={"name": "good.txt"}, content=b"good").json()
    storage = live_server.app.state.services.files.storage
    fid = new_file_id()
    bad = FileRecord(
        id=fid,
        name="bad.txt",
        content_type="text/plain\r\nx-evil: 1",
        size=3,
        sha256=hashlib.sha256(b"bad").hexdigest(),
        encoding=ContentEncoding.NONE,
        encoded_size=3,
        encoded_sha256=hashlib.sha256(b"bad").hexdigest(),
        created_at=datetime.now(UTC).replace(microsecond=0),
    )
    async with storage.create(object_key(fid)) as writer:  # as an older version could have stored it
        await writer.write(b"bad")
        await writer.commit(bad.to_metadata())
    async with storage.create(object_key(new_file_id())) as writer:  # no record at all
        await writer.write(b"x")
        await writer.commit({})
    async with httpx.AsyncClient(base_url=live_server.url) as client:
        listing = await client.get("/v1/files")
    assert listing.status_code == 200, listing.text
    assert [f["metadata"]["file_id"] for f in listing.json()["files"]] == [good["metadata"]["file_id"]]
    assert "listing skips" in caplog.text


def test_tus_upload_length_below_the_offset_is_400(live_server: LiveServer) -> None:
    octets = {**V, "content-type": "application/offset+octet-stream"}
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        url = http.post("/tus/files", headers={**V, "upload-defer-length": "1"}).headers["location"]
        assert http.patch(url, content=b"0123456789", headers={**octets, "upload-offset": "0"}).status_code == 204
        short = http.patch(url, content=b"ab", headers={**octets, "upload-offset": "10", "upload-length": "5"})
        body = assert_error(short, 400, "invalid_request")
        assert body["detail"]["offset"] == 10
        assert http.head(url, headers=V).headers["upload-defer-length"] == "1"  # nothing was recorded
        done = http.patch(url, content=b"ab", headers={**octets, "upload-offset": "10", "upload-length": "12"})
        assert done.status_code == 204 and done.headers["upload-offset"] == "12" and "upload-file-id" in done.headers


def test_multipart_file_names_are_utf8(http: httpx.Client) -> None:
    name = "résumé 履歴書.txt"
    boundary = "xYzZY"
    body = (
        f"--{boundary}\r\n".encode()
        + b'Content-Disposition: form-data; name="file"; filename="'
        + name.encode("utf-8")
        + b'"\r\nContent-Type: text/plain\r\n\r\nhello\r\n'
        + f"--{boundary}--\r\n".encode()
    )
    r = http.post("/v1/files", content=body, headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == name
    legacy = body.replace(name.encode("utf-8"), "café.txt".encode("latin-1"))  # not UTF-8: read as latin-1
    r2 = http.post("/v1/files", content=legacy, headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    assert r2.status_code == 201 and r2.json()["name"] == "café.txt"


@pytest.mark.parametrize("url", ["http://0177.0.0.1/x", "http://999.1.1.1/", "http://[::1/", "http://a:99999999999/"])
def test_unparseable_urls_are_invalid_descriptors(http: httpx.Client, url: str) -> None:
    descriptor = {
        "type": "url",
        "content_type": "text/plain",
        "size": 5,
        "checksum": "sha256:" + hashlib.sha256(b"hello").hexdigest(),
        "name": "a.txt",
        "url": url,
    }
    r = http.post("/v1/imports", json={"descriptor": descriptor})
    assert r.status_code in (400, 422), r.text
    assert r.json()["error"]["code"] in ("invalid_descriptor", "invalid_request")


# --- the pure parsers, fuzzed -------------------------------------------------------------------------------------

any_text = st.text(st.characters(codec="latin-1"), max_size=64) | st.text(max_size=64)
digits = st.text("0123456789", min_size=1, max_size=60)


@given(any_text)
def test_decimal_accepts_exactly_short_ascii_digit_runs(text: str) -> None:
    value = decimal(text)
    if value is None:
        assert not (0 < len(text) <= MAX_DIGITS and all(c in "0123456789" for c in text))
    else:
        assert str(value) == text.lstrip("0") or (value == 0 and set(text) == {"0"})


@given(any_text | digits)
def test_parse_count_is_a_value_or_a_400(text: str) -> None:
    try:
        assert parse_count(text, "X-Test") >= 0
    except InvalidRequest as exc:
        assert exc.status == 400


@given(st.one_of(any_text, st.builds(lambda a, b: f"bytes={a}-{b}", digits | st.just(""), digits | st.just(""))))
def test_range_parser_never_raises(value: str) -> None:
    for length in (0, 1, 4096):
        outcome = parse_range_header(value, length)
        assert isinstance(outcome, IgnoreRange | Unsatisfiable | Satisfiable)
        if isinstance(outcome, Satisfiable):
            assert all(0 <= r.start <= r.end < length for r in outcome.ranges)


@given(
    st.dictionaries(
        st.sampled_from(["if-match", "if-none-match", "if-modified-since", "if-unmodified-since", "if-range", "range"]),
        any_text | st.just(f"Sun, 06 Nov {HUGE} 08:49:37 GMT"),
    )
)
def test_preconditions_never_raise(headers: dict[str, str]) -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    for method in ("GET", "HEAD", "POST"):
        evaluate_preconditions(method, headers, '"abc"', when)
    if_range_allows_range(headers, '"abc"', when)
    for value in headers.values():
        parse_http_date(value)


@given(any_text)
def test_media_type_validator_accepts_no_control_character(value: str) -> None:
    if is_media_type(value):
        assert validate_media_type(value) == value
        assert value.isascii() and all(" " <= c <= "~" for c in value) and len(value) <= 255
    else:
        with pytest.raises(ValueError):
            validate_media_type(value)


@given(st.text(max_size=2000))
def test_file_names_are_bounded_and_inert(name: str) -> None:
    clean = sanitize_filename(name)
    assert 0 < len(clean) <= 255
    assert "/" not in clean and "\\" not in clean
    assert not any(c in clean for c in "\r\n\x00\u2028\u2029\x85")


@given(any_text)
def test_prefer_wait_and_tus_metadata_are_a_value_or_a_400(text: str) -> None:
    assert 0 <= parse_prefer_wait(text, 30.0, 300.0) <= 300.0
    try:
        parse_metadata(text)
    except TransferError as exc:
        assert exc.status == 400


# --- lifetimes and JSON types ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [10**30, 10**11, 0, -5])
def test_expires_in_is_bounded_before_anything_is_reserved(http: httpx.Client, seconds: int) -> None:
    """One validator for every door: beyond 100 years (the year 5195, or an OverflowError at completion) or not
    positive is a 400 at creation, so no session is left holding a reservation."""
    r = http.post("/v1/sessions", json={"size": 5, "expires_in": seconds})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] in ("expires_in_too_long", "invalid_request")
    far = http.post("/v1/files", params={"expires_in": str(seconds)}, content=b"x")
    assert far.status_code == 400, far.text


@pytest.mark.parametrize(
    "body",
    [
        {"size": 5, "expires_in": True},
        {"size": 5, "expires_in": 60.0},
        {"size": 5.0},
        {"size": True},
        {"size": 5, "chunk_size": "5"},
        {"size": 5, "ttl": 1.0},
    ],
)
def test_json_numbers_are_json_integers(http: httpx.Client, body: dict[str, Any]) -> None:
    assert_error(http.post("/v1/sessions", json=body), 400, "invalid_request")


@pytest.mark.parametrize("index", ["1.0", "+1", "1e0", "0x1", "١"])
def test_a_chunk_index_is_ascii_digits(http: httpx.Client, index: str) -> None:
    sid = http.post("/v1/sessions", json={"size": 10}).json()["streaming_session_id"]
    data = b"hello"
    headers = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)}
    assert_error(http.put(f"/v1/sessions/{sid}/chunks/{index}", content=data, headers=headers), 400, "invalid_request")
    assert http.get(f"/v1/sessions/{sid}").json()["stored"] == []


def test_direct_part_numbers_and_sizes_are_json_integers() -> None:
    from pydantic import ValidationError

    from transfer.api.direct import PartsRequest, PlanCreate

    sha = "0" * 64
    assert PartsRequest.model_validate({"parts": [{"number": 1, "sha256": sha}]}).parts[0].number == 1
    for number in (True, 1.0, "1"):
        with pytest.raises(ValidationError):
            PartsRequest.model_validate({"parts": [{"number": number, "sha256": sha}]})
    for size in (True, 5.0):
        with pytest.raises(ValidationError):
            PlanCreate.model_validate({"size": size})


# --- JSON nesting, multipart boundaries, chunk positions ---------------------------------------------------------


def nested(depth: int, kind: str = "array") -> bytes:
    """JSON ``depth`` levels deep: arrays, or objects {"a": …}."""
    if kind == "array":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def test_json_nesting_is_bounded_at_a_stated_depth() -> None:
    for kind in ("array", "object"):
        assert parse_json(nested(MAX_DEPTH, kind)) is not None
        with pytest.raises(JsonTooDeep):
            parse_json(nested(MAX_DEPTH + 2, kind))
    with pytest.raises(JsonTooDeep):
        parse_json(nested(100_000))
    for not_json in (b"[NaN]", b"[Infinity]", b'"\\ud800"', b"[1] x", b"\xff", b""):
        with pytest.raises(ValueError):
            parse_json(not_json)


def json_operations(live_server: LiveServer) -> list[tuple[str, str]]:
    """Every REST operation (``/v1/…``) of the OpenAPI description that takes a JSON body, its path parameters
    filled (the protocol doors answer in their protocol's own errors: below)."""
    schema = httpx.get(f"{live_server.url}/openapi.json").json()
    found = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if path.startswith("/v1/") and "application/json" in operation.get("requestBody", {}).get("content", {}):
                found.append((method.upper(), re.sub(r"\{[^}]+\}", "f_" + "0" * 26, path)))
    return found


CUSTOM_JSON_DOORS = [  # parsed by the door itself, not described as a JSON body in the OpenAPI description
    ("POST", "/v1/chunked"),
    ("POST", "/v1/chunked/probe"),
    ("PUT", "/v1/files/f_00000000000000000000000000/chunks"),
]


def test_deeply_nested_json_is_400_json_too_deep_on_every_rest_door(live_server: LiveServer) -> None:
    operations = json_operations(live_server)
    assert ("POST", "/v1/sessions") in operations and ("POST", "/v1/bundles") in operations  # the walk finds them
    deep = nested(5000)
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        for method, path in [*operations, *CUSTOM_JSON_DOORS]:
            r = http.request(method, path, content=deep, headers={"content-type": "application/json"})
            assert_error(r, 400, "json_too_deep")
            assert "nested" in r.json()["error"]["message"], (method, path)
        # a manifest nested less deeply than the bound is parsed, and refused for what it is
        shallow = http.post("/v1/chunked", content=nested(MAX_DEPTH), headers={"content-type": "application/json"})
        assert_error(shallow, 400, "invalid_manifest")
    assert live_server.objects() == []


def test_json_bodies_of_the_protocol_doors_answer_their_own_parse_errors(live_server: LiveServer) -> None:
    deep = nested(5000)
    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        tp = http.post("/tp/v1/resource/mount", content=deep, headers={"content-type": "application/json"})
        assert tp.status_code == 400 and tp.json()["code"] == "invalid_envelope"
        a2a = http.post("/a2a", content=deep, headers={"content-type": "application/json"})
        assert a2a.status_code == 200 and a2a.json()["error"]["code"] == -32700  # JSON-RPC 2.0 §5.1 parse error
        mcp = http.post(
            "/mcp",
            content=deep,
            headers={"content-type": "application/json", "accept": "application/json, text/event-stream"},
        )
        assert mcp.status_code == 400 and mcp.json()["error"]["code"] == -32700  # JSON-RPC parse error


@pytest.mark.parametrize("head", [nested(3000), b"[" * 1500, b'{"a":[' * 1000])
def test_an_upload_that_looks_like_deep_json_is_stored(http: httpx.Client, head: bytes) -> None:
    r = http.post("/v1/files", params={"name": "deep", "inline": "false"}, content=head)
    assert r.status_code == 201, r.text
    assert http.get(r.json()["url"]).content == head  # sniffed, not parsed to the bottom


@pytest.mark.parametrize(
    ("boundary", "why"),
    [
        ("x" * 71, "71 characters"),
        ("x" * 10_000, "10000 characters"),
        ('"ab "', "may hold only"),  # a trailing space (quoted so that it survives the header parser)
        ("a*b", "may hold only"),
    ],
)
def test_a_multipart_boundary_rfc_2046_does_not_allow_is_400(live_server: LiveServer, boundary: str, why: str) -> None:
    def form(boundary: str) -> bytes:
        head = 'Content-Disposition: form-data; name="file"; filename="a"'
        return f"--{boundary}\r\n{head}\r\n\r\nhi\r\n--{boundary}--\r\n".encode()

    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        bad = form(boundary.strip('"'))
        r = http.post("/v1/files", content=bad, headers={"content-type": f"multipart/form-data; boundary={boundary}"})
        assert why in assert_error(r, 400, "malformed_body")["message"]
        assert live_server.objects() == [] and live_server.leftovers() == []  # nothing stored, nothing half-written
        longest = "'()+_,-./:=? " + "x" * 57  # every character RFC 2046 allows, 70 of them
        ok = http.post(
            "/v1/files?inline=false",
            content=form(longest),
            headers={"content-type": f'multipart/form-data; boundary="{longest}"'},
        )
        assert ok.status_code == 201 and http.get(ok.json()["url"]).content == b"hi", ok.text


@pytest.mark.parametrize("index", ["1.0", "+1", "01", "%201", "1%20", "1e0", "-1", "0x1", "١", "9" * 19])
def test_a_chunked_upload_takes_only_canonical_chunk_positions(http: httpx.Client, tmp_path: Path, index: str) -> None:
    data = os.urandom(300 << 10)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    manifest = cut_file(src)
    assert len(manifest.chunks) >= 2
    uid = http.post("/v1/chunked", json=manifest.to_json()).json()["id"]
    second = data[manifest.chunks[1].offset : manifest.chunks[1].offset + manifest.chunks[1].length]
    assert_error(http.put(f"/v1/chunked/{uid}/chunks/{index}", content=second), 400, "invalid_request")
    assert_error(http.put(f"/v1/chunked/{uid}/chunks/1?count={index}", content=second), 400, "invalid_request")
    assert_error(http.put(f"/v1/chunked/{uid}/missing?start={index}", content=second), 400, "invalid_request")
    early = http.post(f"/v1/chunked/{uid}/complete")  # nothing was stored under another spelling of 1
    assert early.status_code == 409 and early.json()["error"]["detail"]["missing"] == list(range(len(manifest.chunks)))
    assert http.put(f"/v1/chunked/{uid}/chunks/1", params={"count": "1"}, content=second).status_code == 200
