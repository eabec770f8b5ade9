"""A file whose key lacks (almost) all of its chunks is sent whole (``PUT /v1/chunked/{id}/file``): every chunk and
the whole SHA-256 checked on the way, the bytes written once as the file, its chunks indexed as ranges of that file
(no second copy, no second charge), so the next version still sends only what changed; a body that is not the
manifest's file publishes nothing; a deleted file's chunks are asked for again. Real server on loopback (local
storage and the S3 test server)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Clock, LiveServer, running
from tests.uploads.test_chunked_dedup import changed, error_code, key, keyed_settings, upload
from transfer.client.dedup import WHOLE_FRACTION, cut_file

pytestmark = pytest.mark.anyio
MiB = 1 << 20


@pytest.fixture
def tenants(tmp_path: Path, clock: Clock) -> Iterator[LiveServer]:
    with running(keyed_settings(tmp_path), clock) as live:
        yield live


async def test_a_new_file_goes_whole_once_and_its_next_version_sends_only_what_changed(
    server: LiveServer, tmp_path: Path
) -> None:
    v1 = os.urandom(5 * MiB)
    (tmp_path / "v1.bin").write_bytes(v1)
    first = await upload(server, tmp_path / "v1.bin")
    assert first.sent_bytes == len(v1) and first.sent_chunks == first.chunks
    assert first.descriptor.checksum == "sha256:" + hashlib.sha256(v1).hexdigest()
    usage = await server.app.state.services.files.lifecycle.usage.usage(None)
    assert usage.used == len(v1)  # the chunks are ranges of the file: no pack, no second charge

    again = await upload(server, tmp_path / "v1.bin")  # every chunk found in the first file's object
    assert again.sent_bytes == 0
    v2 = changed(v1, places=2, width=700)
    (tmp_path / "v2.bin").write_bytes(v2)
    second = await upload(server, tmp_path / "v2.bin")
    assert 0 < second.sent_bytes <= 2 * 2 * 256 * 1024
    async with httpx.AsyncClient(timeout=60) as http:
        for outcome, data in ((first, v1), (again, v1), (second, v2)):
            got = await http.get(outcome.descriptor.url)
            assert got.status_code == 200 and got.content == data
            chunks = await http.get(f"{server.url}/v1/files/{outcome.descriptor.metadata['file_id']}/chunks")
            assert chunks.status_code == 200 and chunks.json()["size"] == len(data)


async def test_a_file_mostly_known_is_not_sent_whole(server: LiveServer, tmp_path: Path) -> None:
    v1 = os.urandom(4 * MiB)
    (tmp_path / "v1.bin").write_bytes(v1)
    await upload(server, tmp_path / "v1.bin")
    v2 = v1 + os.urandom(int(len(v1) * (1 - WHOLE_FRACTION)))  # the new tail is a small share of it
    (tmp_path / "v2.bin").write_bytes(v2)
    second = await upload(server, tmp_path / "v2.bin")
    assert second.sent_bytes < len(v2) // 4


def test_a_whole_body_that_is_not_the_manifests_file_publishes_nothing(server: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    (tmp_path / "f.bin").write_bytes(data)
    manifest = cut_file(tmp_path / "f.bin")
    with httpx.Client(base_url=server.url, timeout=60) as http:
        made = http.post("/v1/chunked", json=manifest.to_json())
        assert made.status_code == 201 and made.json()["file_url"] == f"/v1/chunked/{made.json()['id']}/file"
        url = made.json()["file_url"]
        wrong = bytearray(data)
        wrong[manifest.chunks[5].offset + 3] ^= 1  # a chunk in the middle
        bad = http.put(url, content=bytes(wrong))
        assert bad.status_code == 422 and error_code(bad) == "chunk_checksum_mismatch"
        assert bad.json()["error"]["detail"]["offset"] == manifest.chunks[5].offset
        short = http.put(url, content=data[:-1])
        assert short.status_code == 400 and error_code(short) == "content_length_mismatch"
        assert http.get("/v1/files").json()["files"] == []
        # every chunk right, the whole checksum a lie: nothing published either
        lie = http.post("/v1/chunked", json={**manifest.to_json(), "checksum": "sha256:" + "0" * 64})
        lying = http.put(lie.json()["file_url"], content=data)
        assert lying.status_code == 422 and error_code(lying) == "checksum_mismatch"
        assert http.get("/v1/files").json()["files"] == []
        # the upload stayed open: the right body publishes it, and sending it again answers the same file
        good = http.put(url, content=data)
        assert good.status_code == 201, good.text
        assert http.get(good.json()["url"]).content == data
        assert http.put(url, content=data).json()["metadata"]["file_id"] == good.json()["metadata"]["file_id"]


async def test_the_chunks_of_a_deleted_file_are_sent_again(server: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    (tmp_path / "f.bin").write_bytes(data)
    first = await upload(server, tmp_path / "f.bin")
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        assert (await http.delete(f"/v1/files/{first.descriptor.metadata['file_id']}")).status_code == 204
        again = await upload(server, tmp_path / "f.bin")  # the index still names them: completion finds them gone
        assert again.sent_bytes == len(data)
        got = await http.get(again.descriptor.url)
    assert got.content == data


def test_another_keys_upload_cannot_be_sent_whole(tenants: LiveServer, tmp_path: Path) -> None:
    data = os.urandom(2 * MiB)
    (tmp_path / "f.bin").write_bytes(data)
    doc: dict[str, Any] = cut_file(tmp_path / "f.bin").to_json()
    with httpx.Client(base_url=tenants.url, timeout=60) as http:
        made = http.post("/v1/chunked", json=doc, headers=key("alice"))
        assert made.status_code == 201
        theirs = http.put(made.json()["file_url"], content=data, headers=key("bob"))
        assert theirs.status_code == 404
        assert http.get("/v1/files", headers=key("alice")).json()["files"] == []
