"""Uploading with deduplication: the manifest first, then only the chunks the service lacks for this key, in runs
of consecutive chunks; a file the key mostly lacks goes whole."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from transfer.client.dedup.cutting import UNHASHED, _all, cut_file, cut_head, runs
from transfer.client.resolver import Progress, raise_for_error
from transfer.core.model.content import FileContent, load_descriptor
from transfer.core.uploads.chunking import Chunk, Manifest
from transfer.errors import ChecksumMismatch, ChunksMissing, InvalidDescriptor, RemoteError, TransferError

AUTO_DEDUP_THRESHOLD = 1 << 20  # `transfer upload` cuts files from this size on (smaller: one request is cheaper)


RUN_BYTES = 64 << 20  # bytes of missing chunks sent in one body (the service stores one body as one pack)


READ_BYTES = 1 << 20  # bytes read from the file per piece of a body


COMPLETE_ATTEMPTS = 3


WHOLE_FRACTION = 0.9  # the key lacks this share of the file's bytes or more: send it whole (PUT …/file)


NEW_FRACTION = 0.1  # the key holds less than this share of the probed head: the file is new, it goes whole at once


@dataclass(frozen=True, slots=True)
class DedupOutcome:
    """What one deduplicated upload did."""

    descriptor: FileContent
    chunks: int  # in the manifest
    sent_chunks: int
    sent_bytes: int  # chunk bytes sent (the manifest not counted)
    manifest_bytes: int
    # "chunks": the manifest first, then what the key lacked; "whole": a new file (its probed head unknown to the
    # key), sent whole at once and its chunks indexed afterwards; "known": content the key stores already,
    # published when its manifest came (nothing sent but the manifest)
    how: str = "chunks"
    index_error: str | None = None  # "whole": why its chunks were not indexed (the file is published all the same)
    indexed_later: bool = False  # "whole": the service took the manifest and checks and indexes the chunks after


async def offer(http: httpx.AsyncClient, server: str) -> dict[str, Any] | None:
    """The service's chunked-upload offer, or None when it has none (an older server, or not this key's)."""
    try:
        response = await http.get(f"{server}/v1/chunked")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        doc = response.json()
    except ValueError:  # not JSON: not an offer this client understands
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("chunking"), dict) else None


def _positions(response: httpx.Response, field: str, count: int) -> tuple[dict[str, Any], list[int]]:
    """A 2xx JSON answer, parsed once, and the chunk positions it lists in ``field``, each in ``range(count)``;
    :class:`RemoteError` (never a KeyError or a wrong chunk sent) when the answer is not that."""
    try:
        doc = response.json()
        listed = doc[field]
        if not isinstance(listed, list) or not all(type(i) is int and 0 <= i < count for i in listed):
            raise ValueError(field)
    except (ValueError, KeyError, TypeError):
        raise RemoteError(
            f"the service's answer to {response.request.method} {response.request.url.path} has no valid"
            f" {field!r} list of chunk positions below {count}",
            http_status=response.status_code,
        ) from None
    return doc, listed


async def probe_head(http: httpx.AsyncClient, server: str, url: str, head: list[Chunk]) -> int:
    """Bytes of ``head`` (a file's first chunks) that the caller's key holds, by the service's probe."""
    if not head:
        return 0
    response = await http.post(server + url, json={"chunks": [c.sha256 for c in head]})
    await raise_for_error(response)
    _, held = _positions(response, "held", len(head))
    return sum(head[i].length for i in set(held))


async def upload_probed(
    http: httpx.AsyncClient,
    server: str,
    path: str | os.PathLike[str],
    offered: dict[str, Any],
    send_whole: Callable[[], Awaitable[FileContent]],
    **options: Any,
) -> DedupOutcome:
    """Upload the file at ``path`` as the service's offer ``offered`` allows, without waiting for a cut when the
    file is new: its first :data:`PROBE_BYTES` are cut and probed; a head the key (almost) lacks means a new file,
    sent whole at once by ``send_whole`` (the caller's plain or direct upload) while the rest is cut beside it, and
    its chunks indexed afterwards (``index_url``), so that its next version sends only what changed. Otherwise
    (or with an offer that has no probe), :func:`upload_deduplicated` with the manifest. ``options``: those of
    :func:`upload_deduplicated`."""
    path = Path(path)
    chunking = offered.get("chunking")
    probe_url, index_url = offered.get("probe_url"), offered.get("index_url")
    if not isinstance(probe_url, str) or not isinstance(index_url, str):
        return await upload_deduplicated(http, server, path, chunking=chunking, **options)
    head = await asyncio.to_thread(cut_head, path, chunking)
    probed = sum(c.length for c in head)
    if probed and await probe_head(http, server, probe_url, head) >= NEW_FRACTION * probed:
        manifest = await asyncio.to_thread(cut_file, path, chunking)
        return await upload_deduplicated(http, server, path, chunking=chunking, manifest=manifest, **options)
    # cut beside the body (threads that release the GIL); the whole-file hash is not computed twice: it is the one
    # the upload verified (and the service checks every chunk against what it stored)
    cutting = asyncio.create_task(asyncio.to_thread(cut_file, path, chunking, whole_sha256=UNHASHED))
    try:
        descriptor = await send_whole()
        cut = await cutting
    finally:
        if not cutting.done():
            await asyncio.wait([cutting])
    size = descriptor.size or 0
    file_id = (descriptor.metadata or {}).get("file_id")
    if not file_id or not descriptor.checksum:
        return DedupOutcome(descriptor, 0, 0, size, 0, how="whole", index_error="the service named no file id")
    manifest = dataclasses.replace(cut, sha256=descriptor.checksum.split(":", 1)[-1])
    body = httpx.Request("PUT", "/", json=manifest.to_json()).read()
    error: str | None = None
    later = False
    try:
        # the upload is done once the manifest is taken: checking every chunk against the stored bytes (a read
        # of the whole file) is the service's to finish after its answer (RFC 7240 respond-async, 202)
        response = await http.put(
            server + index_url.replace("{id}", str(file_id)),
            content=body,
            headers={"content-type": "application/json", "prefer": "respond-async"},
        )
        await raise_for_error(response)
        later = response.status_code == 202
    except (TransferError, httpx.HTTPError) as exc:
        error = str(exc) or type(exc).__name__
    chunks = len(manifest.chunks)
    return DedupOutcome(descriptor, chunks, chunks, size, len(body), "whole", error, indexed_later=later)


async def upload_deduplicated(
    http: httpx.AsyncClient,
    server: str,
    path: str | os.PathLike[str],
    *,
    chunking: dict[str, Any] | None = None,
    manifest: Manifest | None = None,
    connections: int = 4,
    name: str | None = None,
    content_type: str | None = None,
    role: str | None = None,
    description: str | None = None,
    expires_in: int | None = None,
    progress: Progress | None = None,
    download_method: str | None = None,
    ttl: int | None = None,
) -> DedupOutcome:
    """Upload the file at ``path`` sending only the chunks the service lacks for this key (module text)."""
    path = Path(path)
    if manifest is None:
        manifest = await asyncio.to_thread(cut_file, path, chunking)
    doc: dict[str, Any] = manifest.to_json()
    about = {"name": name or path.name, "content_type": content_type, "role": role, "description": description}
    doc.update({k: v for k, v in about.items() if v is not None})
    if expires_in is not None:
        doc["expires_in"] = expires_in
    body = httpx.Request("POST", "/", json=doc).read()
    response = await http.post(f"{server}/v1/chunked", content=body, headers={"content-type": "application/json"})
    await raise_for_error(response)
    made, listed = _positions(response, "missing", len(manifest.chunks))
    missing = list(dict.fromkeys(listed))  # each sent once
    if not isinstance(made.get("id"), str) or not made["id"]:
        raise RemoteError("the service opened a chunked upload without naming it", http_status=response.status_code)
    uid = made["id"]
    missing_bytes = sum(manifest.chunks[i].length for i in missing)
    params = {k: v for k, v in {"download_method": download_method, "ttl": ttl}.items() if v is not None}
    if made.get("file_url") and manifest.size and missing_bytes >= WHOLE_FRACTION * manifest.size:
        # the key lacks (almost) all of it: the whole file in one body, written once by the service, is cheaper
        # than the chunks into packs and an assembly that copies them into the file
        whole = await _send_whole(http, server, str(made["file_url"]), path, manifest, params, progress)
        return _outcome(whole.content, manifest, len(manifest.chunks), manifest.size, len(body))
    sent_chunks = sent_bytes = 0
    gate = asyncio.Semaphore(max(1, connections))
    fd = os.open(path, os.O_RDONLY)

    limit = RUN_BYTES  # the service's max_run_bytes (64 MiB) too
    todo = sum(manifest.chunks[i].length for i in missing) or None

    def spans(indexes: list[int]) -> list[tuple[int, int]]:
        """File ranges of the chunks ``indexes`` in order, neighbours merged."""
        out: list[tuple[int, int]] = []
        for i in indexes:
            c = manifest.chunks[i]
            if out and out[-1][1] == c.offset:
                out[-1] = (out[-1][0], c.offset + c.length)
            else:
                out.append((c.offset, c.offset + c.length))
        return out

    async def stream(indexes: list[int]) -> AsyncIterator[bytes]:
        """The bytes of the chunks ``indexes``, back to back, read from the file as they are sent."""
        nonlocal sent_bytes
        for start, end in spans(indexes):
            at = start
            while at < end:
                data = await asyncio.to_thread(os.pread, fd, min(READ_BYTES, end - at), at)
                if not data:
                    raise ChecksumMismatch(f"{path} changed while it was being uploaded")
                at += len(data)
                sent_bytes += len(data)
                if progress:
                    progress(sent_bytes, todo)
                yield data

    async def put(url: str, params: dict[str, int], indexes: list[int]) -> None:
        nonlocal sent_chunks
        size = sum(manifest.chunks[i].length for i in indexes)
        async with gate:
            response = await http.put(
                url,
                params=params,
                content=stream(indexes),
                headers={"content-type": "application/octet-stream", "content-length": str(size)},
            )
            await raise_for_error(response)
            sent_chunks += len(indexes)

    def packs(indexes: list[int]) -> list[tuple[int, int]]:
        """Positions in ``indexes`` grouped into bodies of at most ``limit`` bytes: (start, count)."""
        out: list[tuple[int, int]] = []
        size = 0
        for k, i in enumerate(indexes):
            length = manifest.chunks[i].length
            if out and size + length <= limit:
                out[-1] = (out[-1][0], out[-1][1] + 1)
                size += length
            else:
                out.append((k, 1))
                size = length
        return out

    first_round: list[Callable[[], Awaitable[None]]] = [
        partial(put, f"{server}/v1/chunked/{uid}/missing", {"start": k, "count": n}, missing[k : k + n])
        for k, n in packs(missing)
    ]

    try:
        for attempt in range(COMPLETE_ATTEMPTS):
            if attempt == 0:  # the creation's missing list: one body per pack, the chunks in any order
                await _all(first_round)
            else:  # what a completion found missing: runs of consecutive chunks
                await _all(
                    [
                        partial(
                            put,
                            f"{server}/v1/chunked/{uid}/chunks/{first}",
                            {"count": count},
                            list(range(first, first + count)),
                        )
                        for first, count in runs(missing, manifest.chunks, limit)
                    ]
                )
            done = await http.post(f"{server}/v1/chunked/{uid}/complete", params=params)
            try:
                await raise_for_error(done)
            except ChunksMissing as exc:
                again = exc.detail.get("missing")
                if attempt + 1 == COMPLETE_ATTEMPTS or not isinstance(again, list) or not again:
                    raise
                missing = [int(i) for i in again]
                continue
            break
    finally:
        os.close(fd)
    known = made.get("state") == "completed"  # published at its creation: the key stores this content already
    return _outcome(done.content, manifest, sent_chunks, sent_bytes, len(body), how="known" if known else "chunks")


def _outcome(
    answer: bytes, manifest: Manifest, sent_chunks: int, sent_bytes: int, manifest_bytes: int, how: str = "chunks"
) -> DedupOutcome:
    descriptor = load_descriptor(answer)
    if not isinstance(descriptor, FileContent):
        raise InvalidDescriptor("server did not answer with a FileContent descriptor")
    if descriptor.checksum != "sha256:" + manifest.sha256 or descriptor.size != manifest.size:
        raise ChecksumMismatch("the server's checksum differs from the file's", actual=descriptor.checksum)
    return DedupOutcome(descriptor, len(manifest.chunks), sent_chunks, sent_bytes, manifest_bytes, how=how)


async def _send_whole(
    http: httpx.AsyncClient,
    server: str,
    url: str,
    path: Path,
    manifest: Manifest,
    params: dict[str, Any],
    progress: Progress | None,
) -> httpx.Response:
    """PUT the whole file to the upload's ``file_url`` (only a service that has the route names it): the service
    checks every chunk and the whole SHA-256 on the way, writes it once and publishes."""
    fd = os.open(path, os.O_RDONLY)
    try:

        async def stream() -> AsyncIterator[bytes]:
            at = 0
            while at < manifest.size:
                data = await asyncio.to_thread(os.pread, fd, min(READ_BYTES, manifest.size - at), at)
                if not data:
                    raise ChecksumMismatch(f"{path} changed while it was being uploaded")
                at += len(data)
                if progress:
                    progress(at, manifest.size)
                yield data

        response = await http.put(
            server + url if url.startswith("/") else url,
            params=params,
            content=stream(),
            headers={"content-type": "application/octet-stream", "content-length": str(manifest.size)},
        )
    finally:
        os.close(fd)
    await raise_for_error(response)
    return response
