"""Progress as an AIFlowy Chat 1.1 SSE stream (uploads, sessions, imports) read by httpx-sse and by our client
helper; server-side imports and their SSRF guard (loopback, metadata addresses, redirects)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash
from httpx_sse import aconnect_sse

from tests.conftest import LiveServer, running
from transfer.client import AsyncTransferClient
from transfer.client.events import JobEvent
from transfer.core.agents import aiflowy
from transfer.errors import ChecksumMismatch
from transfer.settings import Settings

pytestmark = pytest.mark.anyio


def make_settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, inline_threshold=1024, **extra
    )


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    with running(make_settings(tmp_path, sse_heartbeat=0.2)) as server:
        yield server


async def read_stream(http: httpx.AsyncClient, url: str, **kw: Any) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    async with aconnect_sse(http, "GET", url, **kw) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        assert source.response.headers["cache-control"].startswith("no-cache")
        async for sse in source.aiter_sse():
            out.append((sse.event, sse.id, aiflowy.validate(json.loads(sse.data))))
    return out


async def test_upload_progress_stream_opened_before_the_upload(live: LiveServer) -> None:
    data = os.urandom(6 << 20)
    async with httpx.AsyncClient(timeout=30) as http:
        url = f"{live.url}/v1/jobs/my-upload-0001/events"
        reader = asyncio.create_task(read_stream(http, url, params={"conversation_id": "conv_42"}))
        await asyncio.sleep(0.2)

        async def slow_body() -> Any:
            for i in range(0, len(data), 1 << 20):
                yield data[i : i + (1 << 20)]
                await asyncio.sleep(0.05)

        response = await http.post(
            f"{live.url}/v1/files",
            params={"name": "big.bin", "job_id": "my-upload-0001", "size": len(data)},
            content=slow_body(),
        )
        assert response.status_code == 201
        events = await asyncio.wait_for(reader, 20)
    names = [e[0] for e in events]
    assert set(names) <= {"message", "error", "done"} and names[-1] == "done" and "error" not in names
    docs = [e[2] for e in events]
    assert [d["index"] for d in docs] == sorted({d["index"] for d in docs})
    assert [e[1] for e in events] == [aiflowy.event_id(e[0], d["index"]) for e, d in zip(events, docs, strict=True)]
    assert events[-1][1] == f"{docs[-1]['index']}-end"  # the terminal event says so: a reconnect gets 204
    assert {d["conversation_id"] for d in docs} == {"conv_42"} and {d["message_id"] for d in docs} == {"my-upload-0001"}
    assert (docs[0]["domain"], docs[0]["type"], docs[0]["payload"]["state"]) == ("workflow", "status", "start")
    progress = [d["payload"] for d in docs if d["type"] == "progress"]
    assert len(progress) >= 2 and progress[-1]["bytes"] == len(data) and progress[-1]["percent"] == 100.0
    assert all(a["bytes"] <= b["bytes"] for a, b in zip(progress, progress[1:], strict=False))
    result = next(d for d in docs if d["type"] == "tool_result")
    assert result["domain"] == "tool" and result["payload"]["status"] == "success"
    assert result["payload"]["result"]["descriptor"]["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert docs[-2]["payload"] == {"node_id": "my-upload-0001", "state": "end", "reason": "completed"}
    done = docs[-1]
    assert (done["domain"], done["type"]) == ("system", "done")
    assert done["meta"]["bytes"] == len(data) and done["meta"]["latency_ms"] >= 0 and done["meta"]["throughput_bps"] > 0

    # resuming after event 2 gives exactly the rest
    async with httpx.AsyncClient(timeout=30) as http:
        rest = await read_stream(http, f"{live.url}/v1/jobs/my-upload-0001/events", headers={"last-event-id": "2"})
        assert [e[2]["index"] for e in rest] == [d["index"] for d in docs if d["index"] > 2]
        state = (await http.get(f"{live.url}/v1/jobs/my-upload-0001")).json()
        assert state["state"] == "completed" and state["result"]["file_id"].startswith("f_")
        reused = await http.post(f"{live.url}/v1/files", params={"job_id": "my-upload-0001"}, content=b"x")
        assert reused.status_code == 409


async def test_failed_upload_ends_the_stream_with_an_error_event(live: LiveServer) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        reader = asyncio.create_task(read_stream(http, f"{live.url}/v1/jobs/bad-upload-01/events"))
        await asyncio.sleep(0.2)
        response = await http.post(
            f"{live.url}/v1/files",
            params={"job_id": "bad-upload-01", "checksum": "sha256:" + "0" * 64},
            content=os.urandom(100_000),
        )
        assert response.status_code == 422
        events = await asyncio.wait_for(reader, 10)
    assert events[-1][0] == "error" and "done" not in [e[0] for e in events]
    error = events[-1][2]
    assert (error["domain"], error["type"]) == ("system", "error")
    assert error["payload"]["code"] == "checksum_mismatch" and error["payload"]["retryable"] is False
    assert os.listdir(live.data_dir / "tmp") == []


async def test_heartbeats_and_unknown_jobs(live: LiveServer) -> None:
    async with httpx.AsyncClient(timeout=10) as http:
        async with http.stream("GET", f"{live.url}/v1/jobs/waiting-job-1/events") as response:
            seen = b""
            async for piece in response.aiter_bytes():
                seen += piece
                if seen.count(b": keep-alive") >= 2:
                    break
        assert seen.startswith(b": keep-alive\n") and b"\n\n" not in seen
        missing = await http.get(f"{live.url}/v1/jobs/j_{'0' * 32}/events")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        bad = await http.get(f"{live.url}/v1/jobs/waiting-job-1/events", headers={"last-event-id": "x"})
        assert bad.status_code == 400
        for job_id in ("short", "has space in it"):
            assert (await http.get(f"{live.url}/v1/jobs/{job_id}/events")).status_code == 400


async def test_session_progress_with_the_client_helper(live: LiveServer) -> None:
    payload = os.urandom(400_000)
    async with AsyncTransferClient(live.url) as client:
        created = (
            await client.http.post(
                f"{live.url}/v1/sessions", json={"name": "s.bin", "size": len(payload), "chunk_size": 100_000}
            )
        ).json()
        sid = created["streaming_session_id"]
        assert created["urls"]["events"].endswith(f"/v1/jobs/{sid}/events")

        async def collect() -> list[JobEvent]:
            return [event async for event in client.follow_job(sid)]

        follower = asyncio.create_task(collect())
        await asyncio.sleep(0.3)
        for index in (1, 0, 3, 2):
            part = payload[index * 100_000 : (index + 1) * 100_000]
            headers = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(part)}
            response = await client.http.put(
                f"{live.url}/v1/sessions/{sid}/chunks/{index}", content=part, headers=headers
            )
            assert response.status_code == 201
        await client.http.post(f"{live.url}/v1/sessions/{sid}/complete", json={})
        events = await asyncio.wait_for(follower, 20)
    kinds = [(e.event, e.domain, e.type) for e in events]
    assert kinds[0] == ("message", "workflow", "status") and kinds[-1] == ("done", "system", "done")
    chunk_counts = [e.payload["chunks_stored"] for e in events if e.type == "progress"]
    assert chunk_counts == sorted(chunk_counts) and chunk_counts[-1] == 4
    result = next(e for e in events if e.type == "tool_result")
    assert result.payload["result"]["descriptor"]["checksum"] == "sha256:" + hashlib.sha256(payload).hexdigest()


async def test_imports_refuse_private_addresses_by_default(live: LiveServer) -> None:
    async with AsyncTransferClient(live.url) as client:
        stored = await client.upload(os.urandom(10_000), name="a.bin")
        # unsigned: the service's own signed URLs are read in-process, not fetched (test_a2a_sdk, test_mcp)
        stored = stored.model_copy(update={"url": (stored.url or "").split("?")[0]})
        job_id = await client.import_descriptor(stored)
        with pytest.raises(Exception) as refused:
            [e async for e in client.follow_job(job_id)]
        assert getattr(refused.value, "code", None) == "destination_refused"
        metadata_url = stored.model_copy(update={"url": "http://169.254.169.254/latest/meta-data/iam"})
        job_id = await client.import_descriptor(metadata_url)
        state = await _finished(client, job_id)
        assert state["error"]["code"] == "destination_refused"
        for scheme in ("file:///etc/passwd", "ftp://example.com/x"):
            bad = await client.http.post(
                f"{live.url}/v1/imports", json={"descriptor": {**stored.to_json(), "url": scheme}}
            )
            assert bad.status_code == 422  # not an http(s) URL: an invalid descriptor
        streaming = {
            **stored.to_json(),
            "type": "streaming",
            "streaming_session_id": "s_1",
            "total_chunks": 1,
            "chunk_size": 10_000,
        }
        response = await client.http.post(f"{live.url}/v1/imports", json={"descriptor": streaming})
        assert response.status_code == 422 and "streaming" in response.json()["error"]["message"]


async def _finished(client: AsyncTransferClient, job_id: str) -> dict[str, Any]:
    for _ in range(200):
        state: dict[str, Any] = (await client.http.get(f"{client.server}/v1/jobs/{job_id}")).json()
        if state["state"] in ("completed", "failed"):
            return state
        await asyncio.sleep(0.05)
    raise AssertionError("job did not finish")


async def test_allowed_import_verifies_and_stores(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, fetch_allow_networks=["127.0.0.0/8"])
    data = os.urandom(3 << 20)
    with running(settings) as live:
        async with AsyncTransferClient(live.url) as client:
            stored = await client.upload(data, name="orig.bin", encoding="gzip")
            job_id = await client.import_descriptor(stored, job_id="import-job-1")
            events = [e async for e in client.follow_job(job_id)]
            result = next(e for e in events if e.type == "tool_result").payload["result"]
            copy = result["descriptor"]
            assert copy["checksum"] == stored.checksum and copy["encoding"] == "gzip"
            assert result["file_id"] != stored.metadata["file_id"]  # type: ignore[index]
            assert (await client.http.get(copy["url"], headers={"accept-encoding": "identity"})).status_code == 200
            path = await client.resolve(copy, tmp_path / "copy.bin")
            assert Path(path).read_bytes() == data

            lying = stored.model_copy(update={"checksum": "sha256:" + "1" * 64})
            job_id = await client.import_descriptor(lying)
            with pytest.raises(ChecksumMismatch):
                [e async for e in client.follow_job(job_id)]
            before = len((await client.http.get(f"{live.url}/v1/files")).json()["files"])
            assert before == 2  # the original and the good copy; nothing from the lying descriptor


class _Redirect(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(302)
        self.send_header("location", self.target)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


async def test_redirect_to_a_refused_address_is_refused(tmp_path: Path) -> None:
    """127.0.0.2 is allowed and redirects to 127.0.0.1, which is not: every hop is checked."""
    settings = make_settings(tmp_path, fetch_allow_networks=["127.0.0.2/32"])
    with running(settings) as live:
        async with AsyncTransferClient(live.url) as client:
            stored = await client.upload(os.urandom(5000), name="a.bin")
            _Redirect.target = (stored.url or "").split("?")[0]  # unsigned: not one of the service's own URLs
            redirector = http.server.ThreadingHTTPServer(("127.0.0.2", 0), _Redirect)
            thread = threading.Thread(target=redirector.serve_forever, daemon=True)
            thread.start()
            try:
                port = redirector.server_address[1]
                hop = stored.model_copy(update={"url": f"http://127.0.0.2:{port}/file"})
                state = await _finished(client, await client.import_descriptor(hop))
            finally:
                redirector.shutdown()
                redirector.server_close()
    assert state["error"]["code"] == "destination_refused" and "127.0.0.1" in state["error"]["message"]


async def test_a_job_that_never_starts_ends_with_an_error(tmp_path: Path) -> None:
    with running(make_settings(tmp_path, sse_heartbeat=0.1, job_wait_ttl=0.3)) as live:
        async with httpx.AsyncClient(timeout=10) as http:
            events = await read_stream(http, f"{live.url}/v1/jobs/never-started-1/events")
    assert [e[0] for e in events] == ["error"]
    assert events[0][2]["payload"]["code"] == "not_found"


async def test_a_job_keeps_no_bytes_of_its_file(live: LiveServer) -> None:
    """A small upload answers inline, but its job (kept ten minutes, replayed to every reader, journalled for the
    other replicas) carries a signed URL, not the bytes: once the file is deleted, nothing of it is left there."""
    secret = b"a small secret, inline in the upload's answer"
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
        answer = (
            await http.post("/v1/files", params={"name": "s.txt", "job_id": "small-job-01"}, content=secret)
        ).json()
        assert answer["type"] == "inline" and base64.b64decode(answer["data"]) == secret
        state = (await http.get("/v1/jobs/small-job-01")).json()
        kept = state["result"]["descriptor"]
        assert kept["type"] == "url" and "data" not in kept
        assert (await http.get(kept["url"])).content == secret
        assert (await http.delete(f"/v1/files/{answer['metadata']['file_id']}")).status_code == 204
        assert (await http.get(kept["url"])).status_code == 404
        replay = await read_stream(http, f"{live.url}/v1/jobs/small-job-01/events")
        encoded = base64.b64encode(secret)
        for _, _, doc in replay:
            text = json.dumps(doc).encode()
            assert encoded not in text and secret not in text
        assert encoded not in json.dumps((await http.get("/v1/jobs/small-job-01")).json()).encode()
