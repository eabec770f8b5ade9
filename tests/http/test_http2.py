"""TLS and HTTP/2 on the listener of ``transfer serve`` (transfer.api.protocol.http2, transfer.api.protocol.tls), with
real clients at their strictest: curl ``--http2`` (ALPN over TLS) and ``--http2-prior-knowledge`` (h2c), httpx with
``http2=True``, the ``h2`` library as a raw client where a test must hold a stream open, the ``websockets`` client over
``wss://``. Certificates come from a test CA (trustme); nothing leaves loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
import trustme
import uvicorn
from websockets.asyncio.client import connect

from devtools.serving import free_port
from transfer.api.protocol.http2 import serve_config
from transfer.api.protocol.tls import ListenerTLS
from transfer.hosts import create_app
from transfer.settings import Settings

MiB = 1 << 20


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Certs:
    ca: trustme.CA
    ca_file: Path
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        return context


def issue(ca: trustme.CA, where: Path, name: str) -> tuple[Path, Path]:
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = where / f"{name}.pem", where / f"{name}.key"
    leaf.private_key_pem.write_to_path(str(key))
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    where = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    cert, key = issue(ca, where, "server")
    return Certs(ca, where / "ca.pem", cert, key)


@contextmanager
def serve(app: Any, settings: Settings, tls: ListenerTLS | None = None) -> Iterator[tuple[str, uvicorn.Server]]:
    """``app`` on the listener of ``transfer serve`` (HTTP/1.1 + HTTP/2, TLS when given), in a thread."""
    port = free_port()
    server = uvicorn.Server(serve_config(app, settings, host="127.0.0.1", port=port, tls=tls, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=60)
    # every stream's application task ended (one waiting forever to hand a closed stream's application its
    # http.disconnect kept the connection, and with it the server, from stopping)
    assert not thread.is_alive(), "the server did not stop when asked"


def service_settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, **extra)


@pytest.fixture
def tls_url(tmp_path: Path, certs: Certs) -> Iterator[str]:
    settings = service_settings(tmp_path, tls_cert=certs.cert, tls_key=certs.key)
    with serve(create_app(settings), settings, ListenerTLS(certs.cert, certs.key)) as (url, _):
        yield url


@pytest.fixture
def h2c_url(tmp_path: Path) -> Iterator[str]:
    settings = service_settings(tmp_path)
    with serve(create_app(settings), settings) as (url, _):
        yield url


def curl(*args: str, ca: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    command = ["curl", "-sS", "--max-time", "60", *(["--cacert", str(ca)] if ca else []), *args]
    return subprocess.run(command, capture_output=True, timeout=90, check=False)


def curl_status(*args: str, ca: Path | None = None) -> tuple[str, int, bytes]:
    """(HTTP version, status, body) of one curl request."""
    done = curl("-o", "-", "-w", "\n%{http_version} %{http_code}", *args, ca=ca)
    assert done.returncode == 0, done.stderr.decode()
    body, _, tail = done.stdout.rpartition(b"\n")
    version, code = tail.decode().split()
    return version, int(code), body


# --- TLS: ALPN, https everywhere, TLS 1.2 with HTTP/2's ciphers, certificate reload -------------------------------


def test_tls_serves_h2_and_http11_by_alpn_and_urls_say_https(tls_url: str, certs: Certs, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    done = curl(
        "--http2", "-D", "-", "-o", str(tmp_path / "d.json"), "--data-binary", f"@{src}",
        f"{tls_url}/v1/files?name=a.bin", ca=certs.ca_file,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    head = done.stdout.decode().lower()
    assert head.startswith("http/2 201")
    assert f"location: {tls_url}/v1/files/" in head or "location: /v1/files/" in head
    descriptor = json.loads((tmp_path / "d.json").read_bytes())
    assert descriptor["url"].startswith(f"{tls_url}/v1/files/"), descriptor["url"]  # the signed URL says https
    assert descriptor["checksum"] == sha(data)
    # the same URL over HTTP/1.1 and TLS: uvicorn's protocol, whose zero-copy send must not bypass the encryption
    version, status, body = curl_status("--http1.1", descriptor["url"], ca=certs.ca_file)
    assert (version, status) == ("1.1", 200) and body == data
    version, status, body = curl_status("--http2", "-r", "1000-1999", descriptor["url"], ca=certs.ca_file)
    assert (version, status) == ("2", 206) and body == data[1000:2000]


def test_tls12_gets_h2_with_an_ephemeral_aead_cipher(tls_url: str, certs: Certs) -> None:
    context = certs.client_context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2", "http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", int(tls_url.rsplit(":", 1)[1]))) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() == "TLSv1.2" and tls.selected_alpn_protocol() == "h2"
        cipher = tls.cipher()
        assert cipher is not None and cipher[0].startswith("ECDHE-") and ("GCM" in cipher[0] or "CHACHA" in cipher[0])
    old = certs.client_context()
    old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_2
    old.set_ciphers("AES128-SHA")  # RSA key exchange, CBC: not offered by the server
    with socket.create_connection(("127.0.0.1", int(tls_url.rsplit(":", 1)[1]))) as raw, pytest.raises(ssl.SSLError):
        old.wrap_socket(raw, server_hostname="127.0.0.1")


def test_tls_without_http2_offers_only_http11_by_alpn(tmp_path: Path, certs: Certs) -> None:
    settings = service_settings(tmp_path, http2=False)
    with serve(create_app(settings), settings, ListenerTLS(certs.cert, certs.key)) as (url, _):
        version, status, body = curl_status("--http2", f"{url}/healthz", ca=certs.ca_file)
        assert (version, status) == ("1.1", 200), body


def served_serial(url: str, certs: Certs) -> int:
    context = certs.client_context()
    with (
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    from cryptography import x509

    return x509.load_der_x509_certificate(der).serial_number


def test_certificate_reload_keeps_open_connections(tmp_path: Path, certs: Certs) -> None:
    cert, key = issue(certs.ca, tmp_path, "live")
    tls = ListenerTLS(cert, key)
    settings = service_settings(tmp_path)
    with serve(create_app(settings), settings, tls) as (url, _):
        first = served_serial(url, certs)
        with httpx.Client(http2=True, verify=certs.client_context()) as client:
            assert client.get(f"{url}/healthz").http_version == "HTTP/2"
            renewed_cert, renewed_key = issue(certs.ca, tmp_path, "renewed")
            cert.write_bytes(renewed_cert.read_bytes())
            key.write_bytes(renewed_key.read_bytes())
            assert tls.reload()
            second = served_serial(url, certs)
            assert second != first  # new handshakes present the renewed certificate
            # the connection opened before the reload goes on (one connection: httpx reuses it)
            response = client.get(f"{url}/healthz")
            assert response.status_code == 200 and response.http_version == "HTTP/2"
            # a broken pair is refused and the renewed certificate stays
            key.write_bytes(issue(certs.ca, tmp_path, "other")[1].read_bytes())
            assert not tls.reload()
            assert served_serial(url, certs) == second


def replace_atomically(path: Path, content: bytes) -> None:
    """What certbot and cert-manager do: write a new file beside it, rename it over the old one (a new inode)."""
    staged = path.with_name(f".{path.name}.new")
    staged.write_bytes(content)
    os.replace(staged, path)


def wait_for(what: str, done: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def test_certificate_files_replaced_on_disk_are_served_without_a_signal(
    tmp_path: Path, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = issue(certs.ca, tmp_path, "live")
    settings = service_settings(tmp_path)
    with serve(create_app(settings), settings, ListenerTLS(cert, key)) as (url, _):
        first = served_serial(url, certs)
        with httpx.Client(http2=True, verify=certs.client_context()) as client:
            assert client.get(f"{url}/healthz").http_version == "HTTP/2"
            # the certificate is renamed into place first, its key a moment later: the half-replaced pair in
            # between is refused, the old certificate stays until the key follows
            renewed_cert, renewed_key = issue(certs.ca, tmp_path, "renewed")
            with caplog.at_level(logging.ERROR, logger="transfer.ops"):
                replace_atomically(cert, renewed_cert.read_bytes())
                wait_for("the half-replaced pair refused", lambda: "not reloaded" in caplog.text)
            assert served_serial(url, certs) == first
            replace_atomically(key, renewed_key.read_bytes())
            wait_for("the renewed certificate served", lambda: served_serial(url, certs) != first)
            second = served_serial(url, certs)
            # the connection opened before goes on with its certificate
            response = client.get(f"{url}/healthz")
            assert response.status_code == 200 and response.http_version == "HTTP/2"
            # a key of another certificate is refused; the renewed one stays
            caplog.clear()
            with caplog.at_level(logging.ERROR, logger="transfer.ops"):
                replace_atomically(key, issue(certs.ca, tmp_path, "other")[1].read_bytes())
                wait_for("the mismatched key refused", lambda: "not reloaded" in caplog.text)
            assert served_serial(url, certs) == second


def test_settings_want_cert_and_key_together(tmp_path: Path, certs: Certs) -> None:
    with pytest.raises(ValueError, match="TRANSFER_TLS_CERT and TRANSFER_TLS_KEY"):
        Settings(data_dir=tmp_path, tls_cert=certs.cert)
    env = {**os.environ, "TRANSFER_DATA_DIR": str(tmp_path / "d"), "TRANSFER_NO_REEXEC": "1"}
    command = [sys.executable, "-m", "transfer", "serve", "--port", "0", "--tls-cert", str(certs.cert)]
    done = subprocess.run(
        [*command, "--tls-key", str(certs.ca_file)], capture_output=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 1 and b"transfer: invalid_settings: TLS certificate or key not usable" in done.stderr


# --- h2c by prior knowledge, next to unchanged HTTP/1.1 on the same port ---------------------------------------------


def test_h2c_prior_knowledge_and_http11_share_the_port(h2c_url: str, tmp_path: Path) -> None:
    data = os.urandom(2 * MiB + 5)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    version, status, body = curl_status(
        "--http2-prior-knowledge", "--data-binary", f"@{src}", f"{h2c_url}/v1/files?name=b.bin"
    )
    assert (version, status) == ("2", 201)
    descriptor = json.loads(body)
    assert descriptor["url"].startswith(f"{h2c_url}/") and descriptor["checksum"] == sha(data)
    url = descriptor["url"]
    version, status, got = curl_status("--http2-prior-knowledge", url)
    assert (version, status, got) == ("2", 200, data)
    done = curl("--http2-prior-knowledge", "-D", "-", "-o", "/dev/null", "-r", "-10", url)
    head = done.stdout.decode().lower()
    size = len(data)
    assert head.startswith("http/2 206") and f"content-range: bytes {size - 10}-{size - 1}/{size}" in head
    etag = next(line.split(":", 1)[1].strip() for line in head.splitlines() if line.startswith("etag:"))
    version, status, _ = curl_status("--http2-prior-knowledge", "-H", f"If-None-Match: {etag}", url)
    assert (version, status) == ("2", 304)
    version, status, got = curl_status("--http1.1", url)  # HTTP/1.1 (zero-copy) on the same port
    assert (version, status, got) == ("1.1", 200, data)
    # a method whose first bytes look like the preface is still HTTP/1.1
    version, status, _ = curl_status("--http1.1", "-X", "PRI", f"{h2c_url}/healthz")
    assert version == "1.1" and 400 <= status < 500


# --- every kind of route over HTTP/2 ------------------------------------------------------------------------------


def test_uploads_of_every_door_over_h2(tls_url: str, certs: Certs) -> None:
    data = os.urandom(MiB + 17)
    with httpx.Client(http2=True, verify=certs.client_context(), base_url=tls_url, timeout=60) as http:
        raw = http.post("/v1/files", params={"name": "raw.bin"}, content=iter([data[:1000], data[1000:]]))
        assert raw.http_version == "HTTP/2" and raw.status_code == 201 and raw.json()["checksum"] == sha(data)
        form = http.post("/v1/files", files={"file": ("f.jpg", data, "image/jpeg")}, data={"checksum": sha(data)})
        assert form.status_code == 201 and form.json()["name"] == "f.jpg"
        tus = {"tus-resumable": "1.0.0"}
        created = http.post("/tus/files", headers={**tus, "upload-length": str(len(data))})
        assert created.status_code == 201
        location = created.headers["location"]
        offset = 0
        for piece in (data[: 600 << 10], data[600 << 10 :]):
            patched = http.patch(
                location,
                content=piece,
                headers={**tus, "upload-offset": str(offset), "content-type": "application/offset+octet-stream"},
            )
            assert patched.status_code == 204, patched.text
            offset += len(piece)
        assert http.head(location, headers=tus).headers["upload-offset"] == str(len(data))
        session = http.post("/v1/sessions", json={"name": "s.bin", "size": len(data), "chunk_size": 1 << 20})
        assert session.status_code == 201, session.text
        sid = session.json()["streaming_session_id"]
        for n, start in enumerate(range(0, len(data), 1 << 20)):
            chunk = data[start : start + (1 << 20)]
            put = http.put(f"/v1/sessions/{sid}/chunks/{n}", content=chunk, headers={"chunk-checksum": sha(chunk)})
            assert put.status_code == 201, put.text
        done = http.post(f"/v1/sessions/{sid}/complete", json={"size": len(data)})
        assert done.status_code in (200, 201), done.text
        resolved = http.get(done.json()["url"])
        assert resolved.http_version == "HTTP/2" and resolved.content == data


def test_ietf_upload_sends_104_as_an_interim_headers_frame(tls_url: str, certs: Certs, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    src = tmp_path / "u.bin"
    src.write_bytes(data)
    done = curl(
        "--http2", "-si", "-X", "POST", f"{tls_url}/v1/uploads", "-H", "Upload-Draft-Interop-Version: 8",
        "-H", "Upload-Complete: ?1", "--data-binary", f"@{src}", ca=certs.ca_file,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    text = done.stdout.decode(errors="replace").lower()
    interim, _, final = text.partition("http/2 201")
    assert interim.startswith("http/2 104") and f"location: {tls_url}/v1/uploads/" in interim, text[:500]
    assert sha(data) in final


def test_tp_http2_mode_and_long_poll(tls_url: str, certs: Certs) -> None:
    """TP §9.2.3: POST /tp/v1 over HTTP/2, application/tp+json, TP-Contract-Ref / TP-Message-Id checked against the
    envelope; 200 + envelope, 4xx + TPError; GET /tp/v1/messages as the long-poll fallback."""
    data = os.urandom(2 * MiB)  # above the inline threshold: the reply carries a signed URL
    with httpx.Client(http2=True, verify=certs.client_context(), base_url=tls_url, timeout=60) as http:
        fid = http.post("/v1/files", params={"name": "m.bin"}, content=data).json()["metadata"]["file_id"]

        def mount(**headers: str) -> httpx.Response:
            envelope = {
                "tp_version": "1.0.0",
                "message_id": str(uuid.uuid4()),
                "message_type": "resource_mount",
                "sender": "fay:agent-a",
                "receiver": "fay:agent-b",
                "protocol_contract_ref": "contract-7",
                "payload": {"resource_id": fid, "ttl": 120},
            }
            sent = {"content-type": "application/tp+json", "tp-contract-ref": "contract-7"}
            sent["tp-message-id"] = envelope["message_id"]
            return http.post("/tp/v1", content=json.dumps(envelope), headers={**sent, **headers})

        ok = mount()
        assert ok.http_version == "HTTP/2" and ok.status_code == 200, ok.text
        assert ok.headers["content-type"].startswith("application/tp+json")
        reply = ok.json()
        assert reply["message_type"] == "resource_mount" and reply["payload"]["resource"]["checksum"] == sha(data)
        assert tls_url in json.dumps(reply)  # the descriptor's URL says https
        wrong_id = mount(**{"tp-message-id": "another"})
        assert wrong_id.status_code == 400 and "TP-Message-Id" in wrong_id.json()["message"]
        wrong_ref = mount(**{"tp-contract-ref": "contract-8"})
        assert wrong_ref.status_code == 400 and "TP-Contract-Ref" in wrong_ref.json()["message"]
        polled = http.get("/tp/v1/messages", params={"receiver": "fay:agent-a", "wait": 0})
        assert polled.http_version == "HTTP/2" and polled.status_code == 200 and "messages" in polled.json()


def tp_envelope(message_type: str, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    doc = {
        "tp_version": "1.0.0",
        "message_id": str(uuid.uuid4()),
        "message_type": message_type,
        "sender": "fay:agent-a",
        "receiver": "fay:agent-b",
        "protocol_contract_ref": "contract-7",
        "payload": payload,
    }
    doc.update(extra)
    return doc


def tp_headers(doc: dict[str, Any]) -> dict[str, str]:
    """The request headers of TP's HTTP/2 mode (§9.2.3) for ``doc``."""
    return {
        "content-type": "application/tp+json",
        "tp-contract-ref": doc.get("protocol_contract_ref", ""),
        "tp-message-id": doc["message_id"],
    }


def test_tp_http2_mode_takes_exactly_what_9_2_3_says(tls_url: str, certs: Certs) -> None:
    """``application/tp+json`` only, both headers required and equal to the envelope's fields; each violation
    its own TPError code, nothing handled."""
    with httpx.Client(http2=True, verify=certs.client_context(), base_url=tls_url, timeout=60) as http:
        fid = http.post("/v1/files", params={"name": "k.bin"}, content=b"kept").json()["metadata"]["file_id"]

        def unmount(drop: str = "", doc: dict[str, Any] | None = None, **headers: str) -> httpx.Response:
            doc = doc or tp_envelope("resource_unmount", {"resource_id": fid})
            sent = {k: v for k, v in {**tp_headers(doc), **headers}.items() if k != drop}
            return http.post("/tp/v1", content=json.dumps(doc), headers=sent)

        no_ref = tp_envelope("resource_unmount", {"resource_id": fid})
        del no_ref["protocol_contract_ref"]
        cases: list[tuple[httpx.Response, int, str]] = [
            (unmount(**{"content-type": "application/json"}), 415, "unsupported_media_type"),
            (unmount(drop="content-type"), 415, "unsupported_media_type"),
            (unmount(drop="tp-contract-ref"), 400, "tp_contract_ref_missing"),
            (unmount(drop="tp-message-id"), 400, "tp_message_id_missing"),
            (unmount(**{"tp-contract-ref": "contract-8"}), 400, "tp_contract_ref_mismatch"),
            (unmount(**{"tp-message-id": "another"}), 400, "tp_message_id_mismatch"),
            (unmount(doc=no_ref, **{"tp-contract-ref": "contract-7"}), 400, "tp_contract_ref_mismatch"),
        ]
        for response, status, code in cases:
            assert response.http_version == "HTTP/2"
            assert (response.status_code, response.json()["code"]) == (status, code), response.text
        assert cases[0][0].json()["detail"]["supported"] == ["application/tp+json"]
        assert "related_message_id" in cases[4][0].json()  # a mismatch is told about the envelope it read
        assert http.get(f"/v1/files/{fid}").status_code == 200  # none of them was handled
        assert unmount().status_code == 200  # the exact form is
        assert http.get(f"/v1/files/{fid}").status_code == 404


def same_connection(*responses: httpx.Response) -> bool:
    """Whether the responses came as distinct HTTP/2 streams of one connection (httpcore's response extensions)."""
    streams = {id(r.extensions["network_stream"]) for r in responses}
    ids = {r.extensions["stream_id"] for r in responses}
    return all(r.http_version == "HTTP/2" for r in responses) and len(streams) == 1 and len(ids) == len(responses)


@pytest.mark.anyio
async def test_tp_asynchronous_handling_answers_202_over_h2_and_the_long_poll_delivers(
    tls_url: str, certs: Certs
) -> None:
    """§9.2.3 "202 Accepted (asynchronous handling; later by callback or the next poll)": a resource_notify relayed
    to its receiver answers 202 on its own stream while the receiver's long poll waits on another stream of the
    same connection, and the poll returns the message."""
    async with httpx.AsyncClient(http2=True, verify=certs.client_context(), base_url=tls_url, timeout=60) as http:
        await http.get("/healthz")  # one connection, open before the two streams
        poll = asyncio.create_task(http.get("/tp/v1/messages", params={"receiver": "fay:agent-b", "wait": 30}))
        doc = tp_envelope("resource_notify", {"event": "ready", "note": "over h2"})
        sent = await http.post("/tp/v1", content=json.dumps(doc), headers=tp_headers(doc))
        assert (sent.status_code, sent.json()) == (202, {"correlation_id": doc["message_id"]}), sent.text
        polled = await asyncio.wait_for(poll, 60)
        assert polled.status_code == 200 and same_connection(sent, polled)
        (message,) = polled.json()["messages"]
        assert message["message_id"] == doc["message_id"] and message["payload"] == doc["payload"]


@pytest.mark.anyio
async def test_sse_progress_over_h2_arrives_while_the_upload_streams_on_the_same_connection(
    tls_url: str, certs: Certs
) -> None:
    """The job's AIFlowy SSE stream and the upload it reports on share one HTTP/2 connection: the upload's body
    waits until a progress event for its first part has arrived, so it can only finish if events are delivered
    on one stream while the other is still sending."""
    from httpx_sse import aconnect_sse

    data = os.urandom(4 * MiB)
    job = "h2-upload-0001"
    midway = asyncio.Event()
    events: list[tuple[str, dict[str, Any]]] = []
    async with httpx.AsyncClient(http2=True, verify=certs.client_context(), base_url=tls_url, timeout=60) as http:
        await http.get("/healthz")
        opened: asyncio.Future[httpx.Response] = asyncio.get_running_loop().create_future()

        async def follow() -> None:
            async with aconnect_sse(http, "GET", f"/v1/jobs/{job}/events") as source:
                opened.set_result(source.response)
                async for sse in source.aiter_sse():
                    doc = json.loads(sse.data)
                    events.append((sse.event, doc))
                    if doc["type"] == "progress" and 0 < doc["payload"]["bytes"] < len(data):
                        midway.set()

        async def body() -> Any:
            yield data[:MiB]
            await asyncio.wait_for(midway.wait(), 60)  # the SSE stream delivers while this one is open
            for start in range(MiB, len(data), MiB):
                yield data[start : start + MiB]

        reader = asyncio.create_task(follow())
        sse_response = await asyncio.wait_for(opened, 60)  # the job exists once its stream has answered
        uploaded = await http.post(
            "/v1/files", params={"name": "p.bin", "job_id": job, "size": len(data)}, content=body()
        )
        assert uploaded.status_code == 201 and uploaded.json()["checksum"] == sha(data), uploaded.text
        await asyncio.wait_for(reader, 60)
    assert same_connection(sse_response, uploaded)
    assert events[-1][0] == "done" and "error" not in [name for name, _ in events]
    result = next(doc for _, doc in events if doc["type"] == "tool_result")
    assert result["payload"]["result"]["descriptor"]["checksum"] == sha(data)


@pytest.mark.anyio
async def test_tp_websocket_over_wss(tls_url: str, certs: Certs) -> None:
    ws_url = tls_url.replace("https://", "wss://") + "/tp/v1"
    envelope = {
        "tp_version": "1.0.0",
        "message_id": str(uuid.uuid4()),
        "message_type": "resource_unmount",
        "sender": "fay:agent-a",
        "receiver": "fay:agent-b",
        "payload": {"resource_id": "f_missing"},
    }
    async with connect(ws_url, subprotocols=["tp.v1"], ssl=certs.client_context()) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "tp.v1"
        await ws.send(json.dumps(envelope))
        answer = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert answer["message_type"] == "error" or answer.get("related_message_id") == envelope["message_id"]


@pytest.mark.anyio
async def test_mcp_and_a2a_over_h2(tls_url: str, certs: Certs) -> None:
    async with httpx.AsyncClient(http2=True, verify=certs.client_context(), base_url=tls_url, timeout=60) as http:
        init = await http.post(
            "/mcp",
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"},
                },
            },
            headers={"accept": "application/json, text/event-stream"},
        )
        assert init.http_version == "HTTP/2" and init.status_code == 200, init.text
        assert "serverInfo" in init.text
        card = await http.get("/.well-known/agent-card.json")
        assert card.status_code == 200 and f"{tls_url}/a2a" in card.text  # the card names the https endpoint
        rpc = await http.post("/a2a", json={"jsonrpc": "2.0", "id": 7, "method": "tp.resource.unmount", "params": {}})
        assert rpc.http_version == "HTTP/2" and rpc.status_code == 200 and rpc.json()["id"] == 7


# --- flow control and shutdown, on a minimal ASGI app (the protocol, not the service) --------------------------------

release = threading.Event()


async def probe_app(scope: Any, receive: Any, send: Any) -> None:
    """/stall reads no body until released; /echo reads its body and answers its length; /slow answers once
    released."""
    if scope["type"] != "http":
        return
    if scope["path"] in ("/stall", "/slow"):
        while not release.is_set():
            await asyncio.sleep(0.01)
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        received += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": str(received).encode()})


class RawH2:
    """An HTTP/2 client on a plain socket (the h2 library), stream by stream."""

    def __init__(self, url: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()
        self.responses: dict[int, list[Any]] = {}
        self.ended: set[int] = set()
        self.reset: dict[int, int] = {}
        self.goaway = False

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def request(self, path: str, end: bool) -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", "POST"), (":path", path), (":scheme", "http"), (":authority", "127.0.0.1")]
        self.conn.send_headers(sid, headers, end_stream=end)
        self.flush()
        return sid

    def send_what_fits(self, sid: int, data: bytes) -> int:
        """Send as much of ``data`` as the windows allow now; returns how much."""
        sent = 0
        while sent < len(data):
            room = min(self.conn.local_flow_control_window(sid), 16384, len(data) - sent)  # frames as curl sends
            if room <= 0:
                break
            self.conn.send_data(sid, data[sent : sent + room])
            sent += room
        self.flush()
        return sent

    def pump(self, until: Any, deadline: float = 30) -> None:
        end = time.monotonic() + deadline
        while not until():
            assert time.monotonic() < end, "no progress"
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                self.goaway = True
                return
            for event in self.conn.receive_data(chunk):
                if isinstance(event, h2.events.ResponseReceived | h2.events.DataReceived):
                    self.responses.setdefault(event.stream_id, []).append(event)
                    if isinstance(event, h2.events.DataReceived):
                        self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    self.ended.add(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    self.reset[event.stream_id] = event.error_code
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.goaway = True
            self.flush()

    def body(self, sid: int) -> bytes:
        return b"".join(e.data for e in self.responses.get(sid, []) if isinstance(e, h2.events.DataReceived))


def test_a_stalled_upload_stream_does_not_hold_the_others(tmp_path: Path) -> None:
    release.clear()
    window = 1 << 20
    settings = service_settings(tmp_path, h2_stream_window=window, h2_connection_window=4 * window)
    with serve(probe_app, settings) as (url, _):
        client = RawH2(url)
        client.pump(lambda: client.conn.outbound_flow_control_window == 4 * window)  # the server's SETTINGS and
        assert client.conn.remote_settings.initial_window_size == window  # WINDOW_UPDATE came first
        stalled = client.request("/stall", end=False)
        # fill the stalled stream's window completely (64 frames): its application reads nothing
        assert client.send_what_fits(stalled, b"s" * (2 * window)) == window
        other = client.request("/echo", end=False)
        data = b"e" * (6 * window)  # more than the connection's window: needs the server to keep giving it back
        sent = 0
        while sent < len(data):
            sent += client.send_what_fits(other, data[sent:])
            if sent < len(data):
                client.pump(lambda: client.conn.local_flow_control_window(other) > 0)
        client.conn.end_stream(other)
        client.flush()
        client.pump(lambda: other in client.ended)
        assert client.body(other) == str(len(data)).encode()
        assert stalled not in client.ended
        release.set()
        client.conn.end_stream(stalled)
        client.flush()
        client.pump(lambda: stalled in client.ended)
        assert client.body(stalled) == str(window).encode()
        client.sock.close()


def test_shutdown_lets_streams_finish_then_goaway(tmp_path: Path) -> None:
    release.clear()
    settings = service_settings(tmp_path)
    with serve(probe_app, settings) as (url, server):
        client = RawH2(url)
        slow = client.request("/slow", end=True)
        client.pump(lambda: client.conn.remote_settings.max_concurrent_streams == settings.h2_max_streams)
        server.should_exit = True  # uvicorn's shutdown: the listener closes, connections are asked to finish
        time.sleep(0.5)  # let the shutdown reach the connection (not a timing assertion: the order is what counts)
        late = client.request("/echo", end=True)
        client.pump(lambda: late in client.reset)
        assert client.reset[late] == 7  # REFUSED_STREAM: safe for the client to retry elsewhere
        assert slow not in client.ended
        release.set()
        client.pump(lambda: client.goaway)
        assert slow in client.ended and client.body(slow) == b"0"
        client.sock.close()


def test_a_connection_serves_more_than_a_thousand_streams(tmp_path: Path) -> None:
    release.set()
    with serve(probe_app, service_settings(tmp_path)) as (url, _):
        client = RawH2(url)
        for _ in range(11):  # 1,100 requests, 100 at a time (the stream limit)
            streams = [client.request("/echo", end=True) for _ in range(100)]
            client.pump(lambda streams=streams: all(s in client.ended for s in streams))  # type: ignore[misc]
        assert not client.goaway and len(client.ended) == 1100  # Hypercorn's default: GOAWAY after 1,000
        client.sock.close()


@pytest.mark.parametrize("first_bytes", [b"", b"PRI * HT"])
def test_a_silent_cleartext_connection_gets_408(tmp_path: Path, first_bytes: bytes) -> None:
    """Before the first bytes decide the protocol the head timeout already runs: nothing, or a preface that stops
    half way, gets HTTP/1.1's 408 and the connection closes."""
    settings = service_settings(tmp_path, http_header_timeout=0.5)
    with serve(create_app(settings), settings) as (url, _):
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as sock:
            sock.sendall(first_bytes)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in answer
