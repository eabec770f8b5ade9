"""The pre-upload hook, a real HTTP server written as an operator would (tests/events/hookserver.py): it refuses by
name, size and owner on every door before a byte is stored (the storage is unchanged), what it allows carries its
lifetime and metadata into the descriptor and the file.published event, it is told the owner, door, name, size,
checksum and client address, its requests are signed, and a hook that is down, slow or talks nonsense fails closed
(or open, if configured so), counted in the metrics. Its URL is held to the SSRF guard."""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from tests.conftest import running
from tests.events.conftest import event_settings, subscribe
from tests.events.hookserver import LIMIT, HookServer
from tests.events.receiver import Receiver
from tests.upload_conformance import _fixed_chunks, chunk_size_for
from transfer import metrics
from transfer.core.auth import token_hash
from transfer.service.events.signing import new_secret

TUS = {"tus-resumable": "1.0.0"}
ALICE, MALLORY = "tk_alice_0123456789abcdef0123456789", "tk_mallory_0123456789abcdef01234567"
KEYS = {
    "alice": {"sha256": token_hash(ALICE), "scopes": ["upload", "read"]},
    "mallory": {"sha256": token_hash(MALLORY), "scopes": ["upload", "read"]},
}

Attempt = Callable[[httpx.Client, str, bytes], httpx.Response]


def _tus(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    meta = "filename " + base64.b64encode(name.encode()).decode()
    return http.post("/tus/files", headers={**TUS, "upload-length": str(len(data)), "upload-metadata": meta})


def _ietf(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    headers = {
        "upload-complete": "?0",
        "upload-length": str(len(data)),
        "content-disposition": f'attachment; filename="{name}"',
    }
    return http.post("/v1/uploads", headers=headers, content=data[:1000])


def _session(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return http.post("/v1/sessions", json={"name": name, "size": len(data), "chunk_size": chunk_size_for(http)})


def _chunked(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    manifest = {
        "name": name,
        "size": len(data),
        "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
        "chunks": _fixed_chunks(data, 64 << 10),
    }
    return http.post("/v1/chunked", json=manifest)


def _raw(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return http.post("/v1/files", params={"name": name}, content=data)


def _put(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return http.put(f"/v1/files/{name}", content=data)


def _multipart(http: httpx.Client, name: str, data: bytes) -> httpx.Response:
    return http.post("/v1/files", files={"file": (name, data, "application/octet-stream")})


HTTP_DOORS: dict[str, Attempt] = {
    "tus": _tus,
    "ietf": _ietf,
    "session": _session,
    "chunked": _chunked,
    "raw": _raw,
    "put": _put,
    "multipart": _multipart,
}


def mcp_attempts(url: str, name: str, data: bytes) -> list[dict[str, Any]]:
    """The MCP doors' answers (upload_content, authorize_upload) to an upload of ``data`` as ``name``."""
    out: list[dict[str, Any]] = []

    async def run() -> None:
        async with Client(f"{url}/mcp") as client:
            inline = await client.call_tool(
                "upload_content", {"data": base64.b64encode(data).decode(), "data_encoding": "base64", "name": name}
            )
            plan = await client.call_tool("authorize_upload", {"name": name, "size": len(data)})
            for result in (inline, plan):
                out.append({"error": result.is_error, "text": result.content[0].text if result.content else ""})

    anyio.run(run)
    return out


@pytest.fixture
def hook() -> Iterator[HookServer]:
    server = HookServer().start()
    yield server
    server.stop()


def hooked_settings(tmp_path: Path, hook: HookServer, **overrides: Any) -> Any:
    return event_settings(tmp_path, hook_url=hook.url, hook_timeout=1.0, **overrides)


def test_the_hook_refuses_by_name_and_size_on_every_door_before_a_byte_is_stored(
    tmp_path: Path, hook: HookServer
) -> None:
    with running(hooked_settings(tmp_path, hook)) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        chunk_size_for(http)  # its probe (a refused session) writes nothing either
        before = live.objects()
        small, big = os.urandom(5000), os.urandom(LIMIT + 1)
        for door, attempt in HTTP_DOORS.items():
            for name, data, reason in (("tool.exe", small, "no executables"), ("big.bin", big, "above")):
                answer = attempt(http, name, data)
                assert answer.status_code == 403, (door, answer.text)
                assert "upload_refused" in answer.text and reason in answer.text, (door, answer.text)
        for name, data, reason in (("tool.exe", small, "no executables"), ("big.bin", big, "above")):
            for answer in mcp_attempts(live.url, name, data):
                assert answer["error"] and "upload_refused" in answer["text"] and reason in answer["text"], answer
        assert live.objects() == before  # not a byte, not a record, not a reservation
        doors = {r["data"]["door"] for r in hook.requests}
        assert doors == {"tus", "session", "chunked", "upload", "mcp", "authorization"}


def test_the_hook_refuses_by_owner_and_tells_who_asked(tmp_path: Path, hook: HookServer) -> None:
    with (
        running(hooked_settings(tmp_path, hook, api_keys=KEYS)) as live,
        ExitStack() as stack,
    ):
        alice, mallory = (
            stack.enter_context(
                httpx.Client(base_url=live.url, timeout=30, headers={"authorization": f"Bearer {token}"})
            )
            for token in (ALICE, MALLORY)
        )
        chunk_size_for(mallory)
        before = live.objects()
        data = os.urandom(3000)
        for door, attempt in HTTP_DOORS.items():
            answer = attempt(mallory, "fine.bin", data)
            assert answer.status_code == 403 and "mallory may not upload" in answer.text, (door, answer.text)
        assert live.objects() == before
        answer = _raw(alice, "fine.bin", data)
        assert answer.status_code == 201, answer.text
        asked = hook.requests[-1]["data"]
        assert asked == {
            "upload_id": answer.json()["metadata"]["file_id"],
            "owner": "alice",
            "door": "upload",
            "name": "fine.bin",
            "size": len(data),
            "content_type": None,
            "checksum": None,
            "lifetime": None,
            "role": None,
            "client": "127.0.0.1",
        }


def test_what_the_hook_allows_carries_its_metadata_and_lifetime(
    tmp_path: Path, hook: HookServer, receiver: Receiver
) -> None:
    with running(hooked_settings(tmp_path, hook)) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        subscribe(http, receiver)
        data = os.urandom(4000)
        digest = hashlib.sha256(data).hexdigest()
        plain = http.post("/v1/files", params={"name": "ok.bin"}, content=data, headers={"x-checksum": digest})
        assert plain.status_code == 201, plain.text
        opened = _tus(http, "ok2.bin", data)
        assert opened.status_code == 201, opened.text
        patched = http.patch(
            opened.headers["location"],
            content=data,
            headers={**TUS, "upload-offset": "0", "content-type": "application/offset+octet-stream"},
        )
        assert patched.status_code == 204, patched.text
        tus_file = http.get(opened.headers["location"], headers={**TUS, "accept": "application/json"})
        for descriptor, door in ((plain.json(), "upload"), (tus_file.json(), "tus")):
            metadata = descriptor["metadata"]
            assert metadata["project"] == "apollo" and metadata["door"] == door
            expires = time.mktime(time.strptime(metadata["expires_at"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
            assert abs(expires - (time.time() + 86400)) < 120
            again = http.get(f"/v1/files/{metadata['file_id']}").json()
            assert again["metadata"]["project"] == "apollo"  # kept in the file's record
        receiver.wait(lambda r: len(r.of("file.published")) == 2)
        assert {d.payload["data"]["file"]["metadata"]["door"] for d in receiver.of("file.published")} == {
            "upload",
            "tus",
        }


def _calls(outcome: str) -> float:
    return sum(
        s.value
        for m in metrics.hook_calls.collect()
        for s in m.samples
        if s.name.endswith("_total") and s.labels["outcome"] == outcome
    )


def test_a_hook_down_slow_or_talking_nonsense_fails_closed_and_is_counted(tmp_path: Path, hook: HookServer) -> None:
    with running(hooked_settings(tmp_path, hook)) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        before = live.objects()
        hook.delay = 2.0  # past hook_timeout
        timeouts = _calls("timeout")
        slow = _raw(http, "a.bin", b"x")
        assert (slow.status_code, slow.json()["error"]["code"]) == (503, "hook_unavailable")
        assert slow.headers["retry-after"] == "5"
        assert _calls("timeout") == timeouts + 1
        hook.delay, hook.garbage = 0.0, True
        errors = _calls("error")
        assert _session(http, "a.bin", b"x" * 10).json()["error"]["code"] == "hook_unavailable"
        assert _calls("error") == errors + 1
        hook.stop()  # down: connections refused
        assert _tus(http, "a.bin", b"x").status_code == 503
        assert live.objects() == before


def test_a_hook_that_fails_open_lets_uploads_through(tmp_path: Path, hook: HookServer) -> None:
    hook.stop()
    settings = hooked_settings(tmp_path, hook, hook_on_failure="allow")
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        assert _raw(http, "a.bin", b"x").status_code == 201


def test_the_hook_url_is_held_to_the_ssrf_guard(tmp_path: Path, hook: HookServer) -> None:
    settings = hooked_settings(tmp_path, hook, hooks_allow_networks=[])  # loopback is not allowed
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        answer = _raw(http, "a.bin", b"x")
        assert answer.json()["error"]["code"] == "hook_unavailable"
        assert hook.requests == []  # never connected to


def test_the_hooks_requests_are_signed(tmp_path: Path) -> None:
    secret = new_secret()
    hook = HookServer(secret=secret).start()
    try:
        with running(event_settings(tmp_path, hook_url=hook.url, hook_secret=secret)) as live:
            with httpx.Client(base_url=live.url, timeout=30) as http:
                assert _raw(http, "a.bin", b"x").status_code == 201
            assert hook.unverified == 0 and len(hook.requests) == 1
    finally:
        hook.stop()
