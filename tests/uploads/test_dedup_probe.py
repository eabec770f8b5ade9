"""Deduplication by default without making a new file wait: the probe of a file's first chunks and the index of a
file that went whole (``POST /v1/chunked/probe``, ``PUT /v1/files/{id}/chunks``), against a real server on
loopback (local storage and the S3 test server). A new file goes whole at once and its next version still sends
only what changed; a probe answers from the caller's own key only; a manifest that does not describe the stored
bytes indexes nothing; another key's file is 404."""

from __future__ import annotations

import asyncio
import dataclasses
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

from tests.conftest import Clock, LiveServer, running, wait_indexed
from tests.uploads.test_chunked_dedup import changed, error_code, key, keyed_settings
from transfer.client.client import AsyncTransferClient
from transfer.client.dedup import PROBE_BYTES, cut_file, cut_head
from transfer.core.uploads.chunking import Chunk
from transfer.errors import RemoteError
from transfer.service.uploads.chunkstore import MAX_PROBE

pytestmark = pytest.mark.anyio
MiB = 1 << 20


@pytest.fixture
def tenants(tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    with running(keyed_settings(tmp_path, session_gc_interval=3600), clock) as live:
        yield live


def plain_upload(http: httpx.Client, data: bytes, **params: Any) -> dict[str, Any]:
    response = http.post("/v1/files", params={"inline": "false", **params}, content=data)
    assert response.status_code == 201, response.text
    return dict(response.json())


def file_id(descriptor: dict[str, Any]) -> str:
    return str(descriptor["metadata"]["file_id"])


def test_the_head_cut_finds_the_whole_cuts_boundaries(tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(os.urandom(9 * MiB))
    whole = cut_file(src).chunks
    head = cut_head(src)
    assert head and list(head) == list(whole[: len(head)])  # the same chunks, hashed alike
    assert sum(c.length for c in head) <= PROBE_BYTES
    assert len(head) < len(whole)  # the prefix's own last piece, cut at 4 MiB and not at a boundary, is left out
    small = tmp_path / "small.bin"
    small.write_bytes(os.urandom(300_000))
    assert list(cut_head(small)) == list(cut_file(small).chunks)  # a file inside the head: every chunk, the last too


def test_a_probe_answers_from_the_callers_own_key_only(tenants: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    manifest = cut_file(src)
    shas = [c.sha256 for c in manifest.chunks]
    with httpx.Client(base_url=tenants.url, headers=key("bob"), timeout=60) as bob:
        assert bob.post("/v1/chunked/probe", json={"chunks": shas}).json() == {"held": []}
        stored = plain_upload(bob, data)
        indexed = bob.put(f"/v1/files/{file_id(stored)}/chunks", json=manifest.to_json())
        assert indexed.status_code == 200, indexed.text
        assert indexed.json() == {"chunks": len(shas), "indexed": len(set(shas))}
        other = "0" * 64
        answer = bob.post("/v1/chunked/probe", json={"chunks": [other, *shas[:3]]})
        assert answer.status_code == 200 and answer.json() == {"held": [1, 2, 3]}
        for who in ("carol", "alice"):  # alice is an admin: a probe still looks in her own key's chunks only
            theirs = bob.post("/v1/chunked/probe", json={"chunks": shas}, headers=key(who))
            assert theirs.status_code == 200 and theirs.json() == {"held": []}
        anonymous = httpx.post(f"{tenants.url}/v1/chunked/probe", json={"chunks": shas})
        assert anonymous.status_code == 401


def test_bad_probes_get_their_own_errors(tenants: LiveServer) -> None:
    with httpx.Client(base_url=tenants.url, headers=key("bob")) as bob:
        cases = [
            ({"chunks": ["not hex"]}, 400, "invalid_manifest"),
            ({"chunks": ["A" * 64]}, 400, "invalid_manifest"),  # hex is lowercase, as in manifests
            ({"chunks": "0" * 64}, 400, "invalid_manifest"),
            ({"hashes": []}, 400, "invalid_manifest"),
            (["0" * 64], 400, "invalid_manifest"),
            ({"chunks": ["0" * 64] * (MAX_PROBE + 1)}, 413, "manifest_too_large"),
        ]
        for doc, status, code in cases:
            response = bob.post("/v1/chunked/probe", json=doc)
            assert (response.status_code, error_code(response)) == (status, code), doc
        garbage = bob.post("/v1/chunked/probe", content=b"{not json", headers={"content-type": "application/json"})
        assert garbage.status_code == 400 and error_code(garbage) == "invalid_manifest"
        huge = bob.post("/v1/chunked/probe", content=b" " * (2 * MiB), headers={"content-type": "application/json"})
        assert huge.status_code == 413 and error_code(huge) == "manifest_too_large"


def test_an_index_must_describe_the_stored_bytes_and_only_the_owner_may_give_it(
    tenants: LiveServer, tmp_path: Path
) -> None:
    data = os.urandom(2 * MiB)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    manifest = cut_file(src)
    with httpx.Client(base_url=tenants.url, headers=key("bob"), timeout=60) as bob:
        fid = file_id(plain_upload(bob, data))
        url = f"/v1/files/{fid}/chunks"
        shas = [c.sha256 for c in manifest.chunks]

        other = bob.put(url, json=manifest.to_json(), headers=key("carol"))
        assert other.status_code == 404 and error_code(other) == "not_found"  # as for a file that does not exist
        assert bob.put("/v1/files/f_" + "0" * 32 + "/chunks", json=manifest.to_json()).status_code == 404

        shorter = cut_file(src).to_json()
        shorter["size"] -= 1
        shorter["chunks"][-1]["length"] -= 1
        answer = bob.put(url, json=shorter)
        assert answer.status_code == 400 and error_code(answer) == "manifest_size_mismatch"

        # another file's manifest of the same size: its whole SHA-256 is not this file's
        twin = tmp_path / "twin.bin"
        twin.write_bytes(os.urandom(len(data)))
        answer = bob.put(url, json=cut_file(twin).to_json())
        assert answer.status_code == 422 and error_code(answer) == "checksum_mismatch"

        # the file's own size and SHA-256, one chunk hash a lie: checked against the stored bytes, nothing indexed
        lying = list(manifest.chunks)
        lying[3] = Chunk(lying[3].offset, lying[3].length, hashlib.sha256(b"another chunk").hexdigest())
        answer = bob.put(url, json=dataclasses.replace(manifest, chunks=tuple(lying)).to_json())
        assert answer.status_code == 422 and error_code(answer) == "chunk_checksum_mismatch"
        assert bob.post("/v1/chunked/probe", json={"chunks": shas}).json() == {"held": []}
        assert bob.get(f"/v1/files/{fid}/chunks").status_code == 404  # no manifest kept either

        good = bob.put(url, json=manifest.to_json())
        assert good.status_code == 200 and good.json()["indexed"] == len(set(shas))
        again = bob.put(url, json=manifest.to_json())
        assert again.status_code == 200 and again.json() == {"chunks": len(shas), "indexed": 0}
        kept = bob.get(f"/v1/files/{fid}/chunks")
        assert kept.status_code == 200 and [c["sha256"] for c in kept.json()["chunks"]] == shas

        gz = bob.post("/v1/files", params={"inline": "false", "encoding": "gzip"}, content=data)
        assert gz.status_code == 201, gz.text
        answer = bob.put(f"/v1/files/{file_id(gz.json())}/chunks", json=manifest.to_json())
        assert answer.status_code == 400 and error_code(answer) == "invalid_manifest"


async def test_an_index_given_respond_async_is_answered_first_and_checked_after_with_the_same_rules(
    tenants: LiveServer, tmp_path: Path
) -> None:
    """``Prefer: respond-async``: 202 once the manifest fits the file (size, SHA-256, owner: the same errors as
    without it, at once), and the chunks checked against the stored bytes after the answer: a lie among them
    indexes nothing, the truth indexes them all."""
    data = os.urandom(3 * MiB)
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    manifest = cut_file(src)
    shas = [c.sha256 for c in manifest.chunks]
    later = {"prefer": "respond-async"}
    services = tenants.app.state.services
    with httpx.Client(base_url=tenants.url, headers=key("bob"), timeout=60) as bob:
        fid = file_id(plain_upload(bob, data))
        url = f"/v1/files/{fid}/chunks"
        other = bob.put(url, json=manifest.to_json(), headers={**key("carol"), **later})
        assert other.status_code == 404 and error_code(other) == "not_found"
        twin = tmp_path / "twin.bin"
        twin.write_bytes(os.urandom(len(data)))
        answer = bob.put(url, json=cut_file(twin).to_json(), headers=later)
        assert answer.status_code == 422 and error_code(answer) == "checksum_mismatch"  # before any answer

        lying = list(manifest.chunks)
        lying[2] = Chunk(lying[2].offset, lying[2].length, hashlib.sha256(b"another chunk").hexdigest())
        answer = bob.put(url, json=dataclasses.replace(manifest, chunks=tuple(lying)).to_json(), headers=later)
        assert answer.status_code == 202 and answer.headers["preference-applied"] == "respond-async"
        assert answer.json() == {"chunks": len(shas), "indexed": None}
        await tenants.call(services.chunks.store.indexing_done())
        assert bob.post("/v1/chunked/probe", json={"chunks": shas}).json() == {"held": []}
        assert bob.get(url).status_code == 404  # the lie indexed nothing, not even its manifest

        answer = bob.put(url, json=manifest.to_json(), headers={"prefer": "handling=lenient, respond-async; x=1"})
        assert answer.status_code == 202, answer.text
        await tenants.call(services.chunks.store.indexing_done())
        assert bob.post("/v1/chunked/probe", json={"chunks": shas}).json() == {"held": list(range(len(shas)))}
        kept = bob.get(url)
        assert kept.status_code == 200 and [c["sha256"] for c in kept.json()["chunks"]] == shas
        again = bob.put(url, json=manifest.to_json(), headers=later)  # indexed already: nothing left to do later
        assert again.status_code == 200 and again.json() == {"chunks": len(shas), "indexed": 0}
        # the API description says so too: a generated client expects the 202 and its header
        documented = bob.get("/openapi.json").json()["paths"]["/v1/files/{file_id}/chunks"]["put"]["responses"]
        assert {"200", "202"} <= set(documented)
        assert "Preference-Applied" in documented["202"]["headers"]


async def test_the_client_sends_a_new_file_whole_and_its_next_version_sends_what_changed(
    server: LiveServer, tmp_path: Path
) -> None:
    v1 = os.urandom(8 * MiB)
    v2 = changed(v1, places=3, width=500)
    (tmp_path / "v1.bin").write_bytes(v1)
    (tmp_path / "v2.bin").write_bytes(v2)
    async with AsyncTransferClient(server.url) as client:
        first = await client.upload_dedup(tmp_path / "v1.bin")
        assert first is not None and first.how == "whole" and first.index_error is None
        assert first.sent_bytes == len(v1) and first.descriptor.checksum == "sha256:" + hashlib.sha256(v1).hexdigest()
        assert first.indexed_later  # the service took the manifest and checks it after its answer
        await asyncio.to_thread(wait_indexed, server.url, first.descriptor.metadata["file_id"])
        second = await client.upload_dedup(tmp_path / "v2.bin")
        assert second is not None and second.how == "chunks"
        assert 0 < second.sent_bytes <= 3 * 2 * 256 * 1024  # about a chunk or two per change
        assert second.descriptor.checksum == "sha256:" + hashlib.sha256(v2).hexdigest()
        again = await client.upload_dedup(tmp_path / "v1.bin")  # 8 MiB: content the key stores (whole-file dedup)
        assert again is not None and again.how == "known" and again.sent_bytes == 0
        out = tmp_path / "out.bin"
        await client.resolver.to_path(second.descriptor, out)
    assert out.read_bytes() == v2


async def test_a_file_deleted_after_its_index_is_sent_again_whole_by_its_next_version(
    server: LiveServer, tmp_path: Path
) -> None:
    v1 = os.urandom(5 * MiB)
    (tmp_path / "v1.bin").write_bytes(v1)
    (tmp_path / "v2.bin").write_bytes(changed(v1, places=1, width=100))
    async with AsyncTransferClient(server.url) as client:
        first = await client.upload_dedup(tmp_path / "v1.bin")
        assert first is not None and first.how == "whole"
        deleted = await client.http.delete(f"{server.url}/v1/files/{first.descriptor.metadata['file_id']}")
        assert deleted.status_code == 204
        # the probe still finds the head indexed (entries go with the sweep), the assembly finds the bytes gone
        # and asks for every chunk: the upload completes, correct, all the same
        second = await client.upload_dedup(tmp_path / "v2.bin")
        assert second is not None
        assert second.descriptor.checksum == "sha256:" + hashlib.sha256((tmp_path / "v2.bin").read_bytes()).hexdigest()


class _Answers(http.server.BaseHTTPRequestHandler):
    """A service that offers chunked uploads and answers its probe and its opening with the junk in ``answers``."""

    offer: bytes = b""
    answers: dict[str, bytes] = {}
    seen: list[str] = []

    def log_message(self, *args: Any) -> None:  # quiet: pytest runs with warnings as errors, not with a log
        pass

    def _answer(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append(f"GET {self.path}")
        self._answer(self.offer)

    def do_POST(self) -> None:
        self.seen.append(f"POST {self.path}")
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._answer(self.answers.get(self.path, b"{}"), 201 if self.path == "/v1/chunked" else 200)


@pytest.fixture
def junk_service(live_server: LiveServer) -> Iterator[tuple[str, type[_Answers]]]:
    """A loopback service whose offer is the real one's and whose other answers each test chooses."""
    offer = httpx.get(f"{live_server.url}/v1/chunked")
    assert offer.status_code == 200, offer.text
    handler = type("Answers", (_Answers,), {"offer": offer.content, "answers": {}, "seen": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.mark.parametrize(
    "probe", [b"<html>oops</html>", b'{"held": [0, 999]}', b'{"held": "0"}', b'{"held": [0.5]}', b"[]", b"{}"]
)
async def test_a_probe_answer_that_is_not_chunk_positions_is_a_remote_error(
    junk_service: tuple[str, type[_Answers]], tmp_path: Path, probe: bytes
) -> None:
    url, handler = junk_service
    handler.answers["/v1/chunked/probe"] = probe
    (tmp_path / "f.bin").write_bytes(os.urandom(2 * MiB))
    async with AsyncTransferClient(url) as client:
        with pytest.raises(RemoteError) as caught:
            await client.upload_dedup(tmp_path / "f.bin")
    assert caught.value.code == "remote_error" and "'held'" in caught.value.message
    assert handler.seen == ["GET /v1/chunked", "POST /v1/chunked/probe"]  # no body was sent on a wrong answer


@pytest.mark.parametrize(
    "opened", [b'{"id": "u1", "missing": [7]}', b'{"id": "u1"}', b'{"missing": [0]}', b'{"id": 5, "missing": []}']
)
async def test_an_opening_that_names_no_upload_or_wrong_chunks_is_a_remote_error(
    junk_service: tuple[str, type[_Answers]], tmp_path: Path, opened: bytes
) -> None:
    url, handler = junk_service
    data = os.urandom(MiB)
    (tmp_path / "f.bin").write_bytes(data)
    handler.answers["/v1/chunked/probe"] = json.dumps({"held": list(range(len(cut_head(tmp_path / "f.bin"))))}).encode()
    handler.answers["/v1/chunked"] = opened
    async with AsyncTransferClient(url) as client:
        with pytest.raises(RemoteError):
            await client.upload_dedup(tmp_path / "f.bin")
    assert handler.seen == ["GET /v1/chunked", "POST /v1/chunked/probe", "POST /v1/chunked"]
