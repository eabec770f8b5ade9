"""Trust boundaries, against a real server: URLs are only built from allowed Host names, browsers on other sites
cannot use an open service, IPv6 forms of private IPv4 addresses are refused as fetch destinations, signed URLs
cover the path as sent, and stored content is served inert (attachment for scriptable types, CSP sandbox)."""

from __future__ import annotations

import ipaddress
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.conftest import LiveServer, running
from tests.uploads.test_api_upload import assert_error
from transfer.api.middleware.trust import BrowserPolicy, HostPolicy, split_host
from transfer.cli import build_parser
from transfer.service.jobs.fetch import DestinationPolicy, embedded_ipv4
from transfer.settings import Settings

KEY = {"t": "0123456789abcdef0123"}


# --- Host ---------------------------------------------------------------------------------------------------------


def test_a_forged_host_is_refused_before_any_url_is_built(live_server: LiveServer) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        for host in ("evil.example", "evil.example:80", "127.0.0.1.evil.example", "[::1", "a:b:c", "x" * 400):
            r = http.post("/v1/files", content=b"hello", headers={"host": host, "content-type": "text/plain"})
            assert_error(r, 400, "host_not_allowed")
            job = http.get(f"/v1/jobs/j_{uuid.uuid4().hex[:16]}/events", headers={"host": host})
            assert_error(job, 400, "host_not_allowed")  # the SSE result would carry URLs built from it
        assert live_server.objects() == []
        for host in ("127.0.0.1", "localhost:1234", "LOCALHOST.", "[::1]:80", "app.localhost", "127.9.9.9"):
            ok = http.post("/v1/files", content=b"hello", headers={"host": host}, params={"inline": "false"})
            assert ok.status_code == 201, (host, ok.text)
            assert urlsplit(ok.json()["url"]).netloc == host  # the descriptor points where the request came


def test_allowed_hosts_and_public_url(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d", signing_keys=KEY, allowed_hosts=["files.example", "[2001:db8::1]:80"])
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        r = http.post("/v1/files", content=b"x", params={"inline": "false"}, headers={"host": "files.example:8443"})
        assert r.status_code == 201 and r.json()["url"].startswith("http://files.example:8443/v1/files/")
        assert_error(http.get("/healthz", headers={"host": "other.example"}), 400, "host_not_allowed")
        assert http.get("/healthz", headers={"host": "[2001:db8:0::1]:8080"}).status_code == 200
    public = Settings(data_dir=tmp_path / "p", signing_keys=KEY, public_url="https://transfer.example/")
    with running(public) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        r = http.post("/v1/files", content=b"x", params={"inline": "false"}, headers={"host": "transfer.example"})
        assert r.status_code == 201 and r.json()["url"].startswith("https://transfer.example/v1/files/")
        assert_error(http.get("/healthz", headers={"host": "evil.example"}), 400, "host_not_allowed")


def test_loopback_is_the_default_bind() -> None:
    assert Settings().host == "127.0.0.1"
    assert build_parser().parse_args(["serve"]).host is None  # so TRANSFER_HOST / the default applies


@given(st.text(max_size=80) | st.text(st.characters(codec="latin-1"), max_size=80))
def test_host_parser_never_raises(value: str) -> None:
    parsed = split_host(value)
    if parsed is not None:
        assert parsed[0] and (parsed[1] is None or 0 <= parsed[1] <= 65535)
        HostPolicy.build("127.0.0.1", None, []).allows(parsed[0])
    BrowserPolicy.build([], None).is_foreign(value, value, parsed)


# --- browsers on other sites ----------------------------------------------------------------------------------------


CROSS_SITE = [
    {"origin": "http://evil.example"},
    {"origin": "null"},
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site", "origin": "http://sub.127.0.0.1.nip.io"},
]


@pytest.mark.parametrize("browser", CROSS_SITE)
def test_an_open_service_refuses_cross_site_browser_requests(live_server: LiveServer, browser: dict[str, str]) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        # what a page on another site can make a browser send without a CORS preflight
        r = http.post("/v1/files", content=b"<script>", headers={**browser, "content-type": "text/plain"})
        assert_error(r, 403, "cross_site_refused")
        form = http.post("/v1/sessions", content=b'{"size": 1}', headers={**browser, "content-type": "text/plain"})
        assert_error(form, 403, "cross_site_refused")
        tus = http.post("/tus/files", headers={**browser, "tus-resumable": "1.0.0", "upload-length": "1"})
        assert_error(tus, 403, "cross_site_refused")
        assert_error(http.get("/v1/files", headers=browser), 403, "cross_site_refused")
    assert live_server.objects() == []


def test_same_origin_and_non_browser_requests_pass(live_server: LiveServer) -> None:
    with httpx.Client(base_url=live_server.url, timeout=60) as http:
        port = urlsplit(live_server.url).port
        for headers in (
            {},
            {"origin": live_server.url, "sec-fetch-site": "same-origin"},
            {"origin": f"http://localhost:{port}", "host": f"localhost:{port}"},
            {"sec-fetch-site": "none"},
        ):
            r = http.post("/v1/files", content=b"ok", headers=headers)
            assert r.status_code == 201, (headers, r.text)


def test_signed_reads_stay_cross_site_readable_and_cors_origins_are_allowed(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "d", signing_keys=KEY, cors_allow_origins=["https://app.example"])
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=60) as http:
        allowed = http.post("/v1/files", content=b"hi there", headers={"origin": "https://app.example"})
        assert allowed.status_code == 201 and allowed.headers["access-control-allow-origin"] == "https://app.example"
        d = http.post("/v1/files", content=b"hi there", params={"inline": "false"}).json()
        foreign = {"origin": "http://evil.example", "sec-fetch-site": "cross-site"}
        for method in ("GET", "HEAD"):
            r = http.request(method, d["url"], headers=foreign)  # a bearer capability: whoever holds it may read
            assert r.status_code == 200, r.text
        assert_error(http.post(d["url"], headers=foreign), 403, "cross_site_refused")
        session = http.post("/v1/sessions", json={"size": 3}).json()
        status = http.get(session["descriptor"]["url"], headers=foreign)
        assert status.status_code == 200, status.text


@pytest.mark.anyio
async def test_cross_site_websocket_handshakes_are_refused(live_server: LiveServer) -> None:
    ws_url = live_server.url.replace("http://", "ws://") + "/tp/v1"
    with pytest.raises(InvalidStatus) as refused:
        async with connect(ws_url, subprotocols=["tp.v1"], origin="http://evil.example"):  # type: ignore[arg-type]
            pass
    assert refused.value.response.status_code == 403
    async with connect(ws_url, subprotocols=["tp.v1"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "tp.v1"


# --- SSRF: IPv6 forms of IPv4 addresses --------------------------------------------------------------------------

EMBEDDED = [
    ("64:ff9b::a9fe:a9fe", "169.254.169.254"),  # NAT64 well-known prefix (RFC 6052)
    ("64:ff9b:1::a9fe:a9fe", "169.254.169.254"),  # NAT64 local-use prefix (RFC 8215)
    ("::a9fe:a9fe", "169.254.169.254"),  # IPv4-compatible
    ("::ffff:a9fe:a9fe", "169.254.169.254"),  # IPv4-mapped
    ("2002:a9fe:a9fe::1", "169.254.169.254"),  # 6to4
    ("2001:0:4136:e378:8000:63bf:56ff:fff4", "169.0.0.11"),  # Teredo: the client address, inverted
    ("64:ff9b::7f00:1", "127.0.0.1"),
    ("64:ff9b::a00:1", "10.0.0.1"),
    ("2002:c0a8:0101::", "192.168.1.1"),
]


@pytest.mark.parametrize(("v6", "v4"), EMBEDDED)
def test_ipv6_forms_are_judged_by_their_embedded_ipv4(v6: str, v4: str) -> None:
    ip = ipaddress.IPv6Address(v6)
    assert embedded_ipv4(ip) == ipaddress.IPv4Address(v4)
    if not ipaddress.IPv4Address(v4).is_global:
        assert not DestinationPolicy().allows(ip)
    assert DestinationPolicy().allows(ipaddress.IPv6Address("64:ff9b::808:808"))  # a public IPv4 via NAT64
    assert DestinationPolicy().allows(ipaddress.IPv6Address("2606:4700:4700::1111"))  # plain global IPv6


def test_nat64_metadata_address_is_refused_by_the_import_endpoint(http: httpx.Client) -> None:
    descriptor = {
        "type": "url",
        "content_type": "text/plain",
        "size": 5,
        "checksum": "sha256:" + "0" * 64,
        "name": "meta.txt",
        "url": "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",
    }
    job = http.post("/v1/imports", json={"descriptor": descriptor})
    assert job.status_code == 202, job.text
    for _ in range(200):
        status = http.get(job.json()["status_url"]).json()
        if status.get("state") in ("failed", "completed"):
            break
        time.sleep(0.05)
    assert status["state"] == "failed", status
    assert status["error"]["code"] == "destination_refused"


# --- signed URLs cover the path as sent ---------------------------------------------------------------------------


def _variants(path: str) -> list[str]:
    fid = path.split("/")[3]
    return [
        path.replace("/v1/files/", "/v1/files/%66_", 1).replace("%66_f_", "%66_", 1),  # %66 is 'f'
        path.replace("/v1/files", "/v1%2Ffiles", 1),
        path.replace(fid, fid[:5] + "%" + format(ord(fid[5]), "02X") + fid[6:], 1),
        path.replace("/content", "/%63ontent", 1),
    ]


def test_percent_encoded_variants_of_a_signed_path_are_refused(http: httpx.Client, live_server: LiveServer) -> None:
    d = http.post("/v1/files", content=b"secret", params={"inline": "false"}).json()
    url = httpx.URL(d["url"])
    assert http.get(url).status_code == 200
    raw_path = url.raw_path.decode().split("?")[0]
    query = url.query.decode()
    for variant in _variants(raw_path):
        assert variant != raw_path
        with httpx.Client(base_url=live_server.url, timeout=60) as raw:
            r = raw.get(httpx.URL(live_server.url + variant + "?" + query))
        assert r.status_code in (403, 404), (variant, r.status_code, r.text)
        assert r.content != b"secret"
        if r.status_code == 403:
            assert r.json()["error"]["code"] == "signature_invalid"
    session = http.post("/v1/sessions", json={"size": 3}).json()
    chunks = httpx.URL(session["descriptor"]["url"])
    cpath = chunks.raw_path.decode().split("?")[0]
    cquery = chunks.query.decode()
    assert http.get(f"{live_server.url}{cpath}?{cquery}").status_code == 200
    r = http.get(httpx.URL(f"{live_server.url}{cpath.replace('/chunks', '/%63hunks')}?{cquery}"))
    assert_error(r, 403, "signature_invalid")
    r = http.get(httpx.URL(f"{live_server.url}{cpath}/%30?{cquery}"))
    assert_error(r, 403, "signature_invalid")


# --- safe serving -------------------------------------------------------------------------------------------------

ACTIVE = [
    "text/html",
    "image/svg+xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/xslt+xml",
    "text/xsl",
    "text/x-component",
    "application/pdf",
    "text/javascript",
    "application/x-javascript",
    "application/mathml+xml; charset=utf-8",
]


@pytest.mark.parametrize("content_type", ACTIVE)
def test_scriptable_types_are_attachments(http: httpx.Client, content_type: str) -> None:
    d = http.post("/v1/files", content=b"<x/>" * 300, params={"content_type": content_type, "inline": "false"}).json()
    for method in ("GET", "HEAD"):
        r = http.request(method, d["url"])
        assert r.status_code == 200
        assert r.headers["content-disposition"].startswith("attachment"), content_type
        _assert_inert(r)


def test_every_content_response_is_sandboxed(http: httpx.Client) -> None:
    d = http.post("/v1/files", content=b"plain text " * 300, params={"inline": "false"}).json()
    full = http.get(d["url"])
    assert full.headers["content-disposition"].startswith("inline")
    _assert_inert(full)
    _assert_inert(http.get(d["url"], headers={"range": "bytes=0-3"}))
    _assert_inert(http.get(d["url"], headers={"range": "bytes=0-3,10-12"}))
    _assert_inert(http.get(d["url"], headers={"accept-encoding": "gzip"}))
    session = http.post("/v1/sessions", json={"size": 3}).json()
    sid = session["streaming_session_id"]
    checksum = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(b"abc")}
    assert http.put(f"/v1/sessions/{sid}/chunks/0", content=b"abc", headers=checksum).status_code == 201
    path, _, query = session["descriptor"]["url"].partition("?")
    _assert_inert(http.get(f"{path}/0?{query}"))


def _assert_inert(r: httpx.Response) -> None:
    assert r.headers["x-content-type-options"] == "nosniff"
    csp = r.headers["content-security-policy"]
    assert "sandbox" in csp and "default-src 'none'" in csp
