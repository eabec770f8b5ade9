"""The upload conformance suite, as ``storage_conformance.py`` is for backends: one driver per upload door, each
speaking its door's own wire (tus, IETF resumable uploads, chunked sessions, chunked deduplicating uploads, direct
plans), and the checks every door must pass whatever its wire, because every door goes through the one upload
lifecycle:

- create -> parts -> complete, then complete again: one file, charged once;
- abort: the upload ends, a completion after it is refused, its reservation is released;
- expire -> sweep: the upload ends, its reservation is released, its parts go;
- content the key stores already, declared at creation: the file in one request, no slot held;
- (on two replicas) a completion on one racing an abort on the other: exactly one outcome, nothing left reserved,
  and the usage repair finds nothing to fix.

A driver's calls return the HTTP responses; the checks read only the wire (the usage and admin routes), so they run
the same against one server in a thread and against replicas in other processes.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import xxhash

from transfer.core.uploads.chunking import CHUNKING

TUS = {"tus-resumable": "1.0.0"}


def sha_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Opened:
    """An upload a driver opened: where it is (its id or URL path) and what its creation answered."""

    handle: str
    response: httpx.Response


class Door(Protocol):
    """What the suite asks of every door."""

    name: str
    needs_s3: bool  # the door exists only where the backend takes parts directly

    def open(self, http: httpx.Client, data: bytes, *, known: bool = False) -> Opened:
        """Open an upload of ``data`` (``known``: declare its SHA-256 and size at creation)."""

    def send(self, http: httpx.Client, opened: Opened, data: bytes, *, last: bool = True) -> None:
        """Send the parts of ``data`` (``last`` False: all but the last, so the upload stays incomplete)."""

    def complete(self, http: httpx.Client, opened: Opened, data: bytes) -> httpx.Response:
        """Complete the upload (or, where the last part completes it, send it): the answer carries the file."""

    def abort(self, http: httpx.Client, opened: Opened) -> httpx.Response:
        """End the upload without a file."""


def file_id_of(response: httpx.Response) -> str:
    """The file a completion answered (its descriptor's metadata)."""
    doc = response.json()
    return str(doc.get("metadata", {}).get("file_id") or doc.get("file_id"))


def chunk_size_for(http: httpx.Client) -> int:
    """The smallest session chunk the server takes (S3 composes parts of 5 MiB at least)."""
    probe = http.post("/v1/sessions", json={"size": 1, "chunk_size": 1})
    assert probe.status_code == 400, probe.text
    return int(probe.json()["error"]["detail"]["minimum"])


class TusDoor:
    """tus 1.0: creation, PATCHes at offsets; the last PATCH completes (a HEAD after it answers the same file)."""

    name = "tus"
    needs_s3 = False

    def open(self, http: httpx.Client, data: bytes, *, known: bool = False) -> Opened:
        meta = f"filename {base64.b64encode(b'c.bin').decode()}"
        if known:
            meta += f",sha256 {base64.b64encode(sha_hex(data).encode()).decode()}"
        r = http.post("/tus/files", headers={**TUS, "upload-length": str(len(data)), "upload-metadata": meta})
        return Opened(urlsplit(r.headers.get("location", "")).path, r)

    def send(self, http: httpx.Client, opened: Opened, data: bytes, *, last: bool = True) -> None:
        end = len(data) if last else len(data) // 2
        headers = {**TUS, "upload-offset": "0", "content-type": "application/offset+octet-stream"}
        r = http.patch(opened.handle, content=data[:end], headers=headers)
        assert r.status_code == 204, r.text

    def complete(self, http: httpx.Client, opened: Opened, data: bytes) -> httpx.Response:
        return http.get(opened.handle, headers={"accept": "application/json"})

    def abort(self, http: httpx.Client, opened: Opened) -> httpx.Response:
        return http.delete(opened.handle, headers=TUS)


class IetfDoor:
    """Resumable Uploads for HTTP: creation with the first bytes, appends; ``Upload-Complete: ?1`` completes."""

    name = "ietf"
    needs_s3 = False

    def open(self, http: httpx.Client, data: bytes, *, known: bool = False) -> Opened:
        headers = {"upload-complete": "?0", "upload-length": str(len(data))}
        if known:
            digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
            headers["repr-digest"] = f"sha-256=:{digest}:"
        r = http.post("/v1/uploads", headers=headers, content=b"")
        return Opened(urlsplit(r.headers.get("location", "")).path, r)

    def send(self, http: httpx.Client, opened: Opened, data: bytes, *, last: bool = True) -> None:
        # all but the last byte (it goes with the completion), or half of them
        end = len(data) - 1 if last else len(data) // 2
        headers = {"upload-offset": "0", "upload-complete": "?0", "content-type": "application/partial-upload"}
        r = http.patch(opened.handle, content=data[:end], headers=headers)
        assert r.status_code == 204, r.text

    def complete(self, http: httpx.Client, opened: Opened, data: bytes) -> httpx.Response:
        head = http.head(opened.handle)
        offset = int(head.headers.get("upload-offset", len(data)))
        headers = {
            "upload-offset": str(offset),
            "upload-complete": "?1",
            "content-type": "application/partial-upload",
        }
        if head.headers.get("upload-complete") == "?1":  # completed already: its file, as the one engine's
            uid = opened.handle.rstrip("/").rsplit("/", 1)[-1]  # tus door answers it for the same upload
            return http.get(f"/tus/files/{uid}", headers={"accept": "application/json", **TUS})
        return http.patch(opened.handle, content=data[offset:], headers=headers)

    def abort(self, http: httpx.Client, opened: Opened) -> httpx.Response:
        return http.delete(opened.handle)


class SessionDoor:
    """Chunked sessions: chunks by index, then ``complete``."""

    name = "session"
    needs_s3 = False

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk

    def open(self, http: httpx.Client, data: bytes, *, known: bool = False) -> Opened:
        body: dict[str, Any] = {"name": "c.bin", "size": len(data), "chunk_size": self.chunk}
        if known:
            body["checksum"] = "sha256:" + sha_hex(data)
        r = http.post("/v1/sessions", json=body)
        return Opened(r.json().get("streaming_session_id", ""), r)

    def send(self, http: httpx.Client, opened: Opened, data: bytes, *, last: bool = True) -> None:
        pieces = [data[i : i + self.chunk] for i in range(0, len(data), self.chunk)]
        for index, piece in enumerate(pieces if last else pieces[:-1]):
            headers = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(piece)}
            r = http.put(f"/v1/sessions/{opened.handle}/chunks/{index}", content=piece, headers=headers)
            assert r.status_code == 201, r.text

    def complete(self, http: httpx.Client, opened: Opened, data: bytes) -> httpx.Response:
        return http.post(f"/v1/sessions/{opened.handle}/complete", json={})

    def abort(self, http: httpx.Client, opened: Opened) -> httpx.Response:
        return http.delete(f"/v1/sessions/{opened.handle}")


def _fixed_chunks(data: bytes, size: int) -> list[dict[str, Any]]:
    return [
        {"offset": i, "length": len(data[i : i + size]), "sha256": sha_hex(data[i : i + size])}
        for i in range(0, len(data), size)
    ]


class ChunkedDoor:
    """Chunked deduplicating uploads: a manifest, the chunks the key lacks, then ``complete``."""

    name = "chunked"
    needs_s3 = False
    chunk = int(CHUNKING["avg_size"])

    def open(self, http: httpx.Client, data: bytes, *, known: bool = False) -> Opened:
        manifest = {"size": len(data), "checksum": "sha256:" + sha_hex(data), "chunks": _fixed_chunks(data, self.chunk)}
        r = http.post("/v1/chunked", json={**manifest, "name": "c.bin"})
        return Opened(r.json().get("id", ""), r)

    def send(self, http: httpx.Client, opened: Opened, data: bytes, *, last: bool = True) -> None:
        chunks = _fixed_chunks(data, self.chunk)
        count = len(chunks) if last else len(chunks) - 1  # one body: the run of chunks, one pack
        end = chunks[count - 1]["offset"] + chunks[count - 1]["length"]
        r = http.put(f"/v1/chunked/{opened.handle}/chunks/0", params={"count": count}, content=data[:end])
        assert r.status_code in (200, 201, 204), r.text

    def complete(self, http: httpx.Client, opened: Opened, data: bytes) -> httpx.Response:
        return http.post(f"/v1/chunked/{opened.handle}/complete")

    def abort(self, http: httpx.Client, opened: Opened) -> httpx.Response:
        return http.delete(f"/v1/chunked/{opened.handle}")


class DirectDoor:
    """Direct-to-bucket plans: presigned part URLs, the parts PUT to the bucket, then ``complete``."""

    name = "direct"
    needs_s3 = True

    def open(self, http: httpx.Client, data: bytes, *, known: bool = False) -> Opened:
        r = http.post("/v1/direct", json={"size": len(data), "checksum": sha_hex(data), "name": "c.bin"})
        return Opened(r.json().get("id", ""), r)

    def send(self, http: httpx.Client, opened: Opened, data: bytes, *, last: bool = True) -> None:
        ps, count = opened.response.json()["part_size"], opened.response.json()["part_count"]
        for number in range(1, count + 1 if last else count):
            piece = data[(number - 1) * ps : number * ps]
            r = http.post(
                f"/v1/direct/{opened.handle}/parts", json={"parts": [{"number": number, "sha256": sha_hex(piece)}]}
            )
            assert r.status_code == 200, r.text
            target = r.json()["parts"][0]
            put = httpx.put(target["url"], content=piece, headers=dict(target["headers"]), timeout=60)
            assert put.status_code == 200, put.text

    def complete(self, http: httpx.Client, opened: Opened, data: bytes) -> httpx.Response:
        return http.post(f"/v1/direct/{opened.handle}/complete", json={})

    def abort(self, http: httpx.Client, opened: Opened) -> httpx.Response:
        return http.delete(f"/v1/direct/{opened.handle}")


def doors(chunk: int, *, s3: bool) -> list[Door]:
    """Every door the server in front of ``http`` has (the direct door where the backend takes parts)."""
    every: list[Door] = [TusDoor(), IetfDoor(), SessionDoor(chunk), ChunkedDoor(), DirectDoor()]
    return [door for door in every if s3 or not door.needs_s3]


def usage(http: httpx.Client) -> dict[str, Any]:
    """The calling key's usage (bytes used, files, bytes reserved)."""
    r = http.get("/v1/usage")
    assert r.status_code == 200, r.text
    return dict(r.json())


def succeeded(response: httpx.Response) -> bool:
    """Whether a completion answered a file."""
    return response.status_code in (200, 201) and bool(file_id_of(response))
