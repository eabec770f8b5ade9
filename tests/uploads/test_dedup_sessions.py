"""Whole-file deduplication on the sessions door: a session opened with the SHA-256 and size of content its key (or
its sharing group) already stores is born completed, a file of its own sharing those bytes, with no chunk sent; its
chunks still read, verified, through its streaming descriptor. Another key declaring the same content is answered
as for any content (an open session: send the chunks). Real servers on loopback, local and S3."""

from __future__ import annotations

import hashlib
import os

import httpx
import xxhash

from tests.uploads.test_dedup import MIN, Stored, checksum, download, file_id, key, stored, upload, used

__all__ = ["stored"]  # the fixture, from test_dedup (local and S3)


def open_session(stored: Stored, who: str, data: bytes, **fields: object) -> httpx.Response:
    body = {"size": len(data), "checksum": checksum(data), "name": "session.bin", **fields}
    return httpx.post(f"{stored.url}/v1/sessions", json=body, headers=key(who), timeout=60)


def test_a_session_declaring_stored_content_is_born_completed(stored: Stored) -> None:
    data = os.urandom(MIN * 3 + 17)
    first = upload(stored.url, "alice", data)
    assert first.status_code == 201, first.text
    # several chunks on local storage; S3 composes chunks of 5 MiB at least: one chunk there
    opened = open_session(stored, "alice", data, **({"chunk_size": MIN} if stored.bucket is None else {}))
    assert opened.status_code == 201, opened.text
    doc = opened.json()
    assert doc["state"] == "completed" and doc["file_id"] != file_id(first.json())
    sid = doc["streaming_session_id"]
    status = httpx.get(f"{stored.url}/v1/sessions/{sid}", headers=key("alice")).json()
    assert status["state"] == "completed" and status["file_id"] == doc["file_id"] and status["missing"] == []
    done = httpx.post(f"{stored.url}/v1/sessions/{sid}/complete", headers=key("alice"))
    assert done.status_code == 200, done.text  # completing it answers its file, as a direct plan's does
    assert file_id(done.json()) == doc["file_id"] and done.json()["name"] == "session.bin"
    assert download(stored.url, "alice", doc["file_id"]) == data
    assert len(stored.under("content/")) == 1 and stored.under("sessions/") == [f"sessions/{sid}/session.json"]
    assert used(stored.url, "alice") == 2 * len(data)  # each file counts its size
    # its chunks read through its streaming descriptor, each with its xxh3 (computed as it is read)
    base, query = doc["descriptor"]["url"].split("?")
    size = doc["chunk_size"]
    for index in range(doc["total_chunks"]):
        chunk = httpx.get(f"{base}/{index}?{query}", timeout=60)
        assert chunk.status_code == 200, chunk.text
        assert chunk.content == data[index * size : (index + 1) * size]
        assert chunk.headers["chunk-checksum"] == "xxh3-128:" + xxhash.xxh3_128_hexdigest(chunk.content)


def test_a_session_of_content_another_key_stores_is_an_ordinary_session(stored: Stored) -> None:
    data = os.urandom(MIN + 5)
    assert upload(stored.url, "alice", data).status_code == 201
    bob = open_session(stored, "bob", data)
    unknown = open_session(stored, "carol", os.urandom(MIN + 5))  # content nobody stores
    assert bob.status_code == unknown.status_code == 201
    assert bob.json()["state"] == "open" and "file_id" not in bob.json()
    assert sorted(bob.json()) == sorted(unknown.json())  # the same answer, field for field
    sid = bob.json()["streaming_session_id"]
    early = httpx.post(f"{stored.url}/v1/sessions/{sid}/complete", headers=key("bob"))
    assert early.status_code == 409  # nothing was published for him: his chunks are due
    put = httpx.put(
        f"{stored.url}/v1/sessions/{sid}/chunks/0",
        content=data,
        headers={**key("bob"), "chunk-checksum": "sha256:" + hashlib.sha256(data).hexdigest()},
    )
    assert put.status_code == 201, put.text
    done = httpx.post(f"{stored.url}/v1/sessions/{sid}/complete", headers=key("bob"))
    assert done.status_code == 200, done.text
    assert download(stored.url, "bob", file_id(done.json())) == data
    assert len(stored.under("content/")) == 2  # bob's file has bytes of its own, in his own scope
