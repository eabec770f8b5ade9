"""Client side of chunked deduplication: send only the chunks the service lacks, fetch only the chunks a cache lacks.

Upload (:func:`upload_deduplicated`): the file is cut with FastCDC using the service's parameters (``GET
/v1/chunked``), each chunk hashed (SHA-256); the manifest goes to ``POST /v1/chunked``; the service answers which
chunks this key lacks; those are sent as runs of consecutive chunks (one PUT per run, ``connections`` in parallel);
``complete`` publishes once the service has verified the whole SHA-256. A completion that finds chunks missing (a
sweep removed one meanwhile) sends them and completes again. :func:`upload_probed` (the default of ``transfer upload``
and :meth:`AsyncTransferClient.upload_dedup`) asks first, of the file's first chunks only, whether the key holds
any: a new file then goes whole at once by an ordinary upload, and its manifest follows to be indexed.

Resolve with a cache (:class:`ChunkCache`, :func:`resolve_with_cache`): chunks of what was resolved are kept in a
directory, one file per SHA-256. For a descriptor whose manifest the service gives (``/v1/files/{id}/manifest``
with the descriptor's own signature), the chunks found in the cache are copied, only the ranges of the others are
fetched, and the whole file is SHA-256 verified against the descriptor as any resolve; only then is it renamed to
its destination and its new chunks kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import mmap
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
from pyfastcdc import FastCDC

from transfer.client.integrity import verify_bytes
from transfer.client.resolver import Progress, raise_for_error
from transfer.core.model.content import ContentEncoding, DownloadMethod, FileContent, TransferMode, load_descriptor
from transfer.core.uploads.chunking import CHUNKING, Chunk, Manifest, parse_manifest
from transfer.errors import ChecksumMismatch, ChunksMissing, InvalidDescriptor, RemoteError, TransferError

AUTO_DEDUP_THRESHOLD = 1 << 20  # `transfer upload` cuts files from this size on (smaller: one request is cheaper)
RUN_BYTES = 64 << 20  # bytes of missing chunks sent in one body (the service stores one body as one pack)
_T = TypeVar("_T")
READ_BYTES = 1 << 20  # bytes read from the file per piece of a body
FETCH_RUN_BYTES = 8 << 20  # bytes of consecutive missing chunks fetched in one ranged GET
PLACERS = 4  # threads placing cached chunks into a file being resolved
COMPLETE_ATTEMPTS = 3
WHOLE_FRACTION = 0.9  # the key lacks this share of the file's bytes or more: send it whole (PUT …/file)
CUT_HASH_BATCH = 8 << 20  # bytes of chunks hashed per task while the file is cut
PROBE_BYTES = 4 << 20  # the head of a file whose chunks are probed before the rest is cut (about 64 chunks)
UNHASHED = "-"  # cut_file's whole_sha256 when the caller knows it another way
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


def _chunker(chunking: dict[str, Any] | None) -> FastCDC:
    params = chunking or CHUNKING
    return FastCDC(
        avg_size=int(params["avg_size"]),
        min_size=int(params["min_size"]),
        max_size=int(params["max_size"]),
        normalized_chunking=int(params.get("normalized_chunking", 1)),  # type: ignore[arg-type]
        seed=int(params.get("seed", 0)),
    )


def cut_file(
    path: str | os.PathLike[str], chunking: dict[str, Any] | None = None, *, whole_sha256: str | None = None
) -> Manifest:
    """The manifest of the file at ``path``: FastCDC chunks with the service's parameters, each SHA-256 hashed, and
    the whole file's SHA-256 (``whole_sha256``: taken as given, not computed; the service checks a manifest
    against the bytes it stores). Runs in the calling thread (CPU and file reads: call it off the event loop); the
    chunk hashes and the whole-file hash run on two helper threads while the cutter finds the next boundaries
    (all three release the GIL), so on two free cores the cut costs about one SHA-256 pass of wall time."""
    cdc = _chunker(chunking)
    if os.path.getsize(path) == 0:
        return Manifest(size=0, sha256=hashlib.sha256().hexdigest(), chunks=())
    with open(path, "rb") as f, _mapped(f.fileno()) as mapped:
        view = memoryview(mapped)
        try:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix="cut") as pool:
                whole = pool.submit(lambda: whole_sha256 or hashlib.sha256(view).hexdigest())
                bounds: list[tuple[int, int]] = []
                batches: list[Future[list[str]]] = []
                first = 0  # the first chunk of the batch not yet handed to a hasher
                for piece in cdc.cut_buf(view):
                    bounds.append((piece.offset, piece.length))
                    del piece  # a view of the mapping: let it go
                    if piece_end(bounds[-1]) - bounds[first][0] >= CUT_HASH_BATCH:
                        batches.append(pool.submit(_hash_spans, view, bounds[first:]))
                        first = len(bounds)
                if first < len(bounds):
                    batches.append(pool.submit(_hash_spans, view, bounds[first:]))
                digests = [sha for batch in batches for sha in batch.result()]
                sha = whole.result()
        finally:
            view.release()
    chunks = tuple(Chunk(offset, length, d) for (offset, length), d in zip(bounds, digests, strict=True))
    return Manifest(size=piece_end(bounds[-1]), sha256=sha, chunks=chunks)


def cut_head(
    path: str | os.PathLike[str], chunking: dict[str, Any] | None = None, limit: int = PROBE_BYTES
) -> list[Chunk]:
    """The chunks of the first ``limit`` bytes of the file at ``path``, hashed, as a cut of the whole file finds
    them: the last chunk of a prefix that ends before the file does is left out (its end is the prefix's, not a
    boundary of the file)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(min(limit, size))
    view = memoryview(data)
    spans = [(piece.offset, piece.length) for piece in _chunker(chunking).cut_buf(view)]
    if len(data) < size and spans:
        spans.pop()
    return [Chunk(offset, length, sha) for (offset, length), sha in zip(spans, _hash_spans(view, spans), strict=True)]


def _mapped(fd: int) -> mmap.mmap:
    """The file read-only in memory, its pages faulted in by the kernel at once where it can (MAP_POPULATE: one
    call instead of a fault per page as the cutter walks it)."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    if populate and hasattr(mmap, "MAP_SHARED"):
        return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def piece_end(bound: tuple[int, int]) -> int:
    return bound[0] + bound[1]


def _hash_spans(view: memoryview, spans: list[tuple[int, int]]) -> list[str]:
    return [hashlib.sha256(view[offset : offset + length]).hexdigest() for offset, length in spans]


def runs(indexes: list[int], chunks: tuple[Chunk, ...], limit: int) -> list[tuple[int, int]]:
    """Consecutive indexes grouped into ``(first, count)`` runs of at most ``limit`` bytes each (a chunk larger
    than the limit is a run of its own)."""
    out: list[tuple[int, int]] = []
    first, count, size = -1, 0, 0
    for i in sorted(indexes):
        length = chunks[i].length
        if count and i == first + count and size + length <= limit:
            count += 1
            size += length
            continue
        if count:
            out.append((first, count))
        first, count, size = i, 1, length
    if count:
        out.append((first, count))
    return out


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


class ChunkCache:
    """Chunks kept on disk, one file per SHA-256 (``<dir>/<2 hex>/<sha256>``), written atomically. With
    ``max_bytes``, :meth:`trim` evicts the least recently used chunks (a hit or a store marks a chunk used: its
    mtime) until the cache holds at most that many bytes."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError("a cache size is a number of bytes, 0 or more")
        self.directory = Path(directory)
        self.max_bytes = max_bytes

    def path(self, sha: str) -> Path:
        return self.directory / sha[:2] / sha

    def get(self, sha: str, length: int) -> bytes | None:
        """The chunk's bytes if cached and intact (a damaged file is removed); a hit marks it recently used."""
        try:
            data = self.path(sha).read_bytes()
        except OSError:
            return None
        if len(data) == length and hashlib.sha256(data).hexdigest() == sha:
            self._touch(sha)
            return data
        self.path(sha).unlink(missing_ok=True)
        return None

    def read(self, sha: str, length: int) -> bytes | None:
        """The chunk's bytes if cached at its length, not hashed (for a caller that verifies the whole file they
        go into, and then :meth:`get` only on a mismatch); a hit marks it recently used."""
        try:
            data = self.path(sha).read_bytes()
        except OSError:
            return None
        if len(data) != length:
            self.path(sha).unlink(missing_ok=True)
            return None
        self._touch(sha)
        return data

    def _touch(self, sha: str) -> None:
        try:
            os.utime(self.path(sha))
        except OSError:  # evicted meanwhile by another resolver sharing the directory: nothing to mark
            pass

    def holds(self, shas: list[str]) -> set[str]:
        """Which of ``shas`` have a file in the cache (not read or checked: :meth:`get` does that)."""
        return {sha for sha in set(shas) if self.path(sha).is_file()}

    def put(self, sha: str, data: bytes | memoryview) -> None:
        final = self.path(sha)
        if final.exists():
            self._touch(sha)
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{sha}.{secrets.token_hex(4)}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)

    def trim(self) -> int:
        """Evict the least recently used chunks until at most ``max_bytes`` are kept (nothing without a limit);
        returns how many were evicted. Reads the cache directory (a client's own disk, once per resolve)."""
        if self.max_bytes is None or not self.directory.is_dir():
            return 0
        kept: list[tuple[int, int, Path]] = []  # (mtime ns, size, path)
        total = 0
        for folder in os.scandir(self.directory):
            if not folder.is_dir(follow_symlinks=False) or len(folder.name) != 2:
                continue
            for entry in os.scandir(folder.path):
                if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                    continue  # a chunk being written (or not ours)
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                kept.append((info.st_mtime_ns, info.st_size, Path(entry.path)))
                total += info.st_size
        evicted = 0
        for _, size, path in sorted(kept, key=lambda k: (k[0], k[2].name)):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            evicted += 1
        return evicted

    def keep_file(self, path: str | os.PathLike[str], manifest: Manifest | None = None) -> int:
        """Keep the chunks of the file at ``path`` (cut with the service's parameters unless ``manifest`` says how
        it is cut); returns how many were new."""
        manifest = manifest or cut_file(path)
        added = 0
        with open(path, "rb") as f:
            for chunk in manifest.chunks:
                if self.path(chunk.sha256).exists():
                    continue
                data = os.pread(f.fileno(), chunk.length, chunk.offset)
                if hashlib.sha256(data).hexdigest() == chunk.sha256:
                    self.put(chunk.sha256, data)
                    added += 1
        return added


@dataclass(frozen=True, slots=True)
class CachedResolve:
    path: Path
    fetched_bytes: int  # bytes fetched from the service
    cached_bytes: int  # bytes taken from the cache


def manifest_url(descriptor: FileContent) -> str | None:
    """Where this service gives the manifest of a url-mode descriptor's file: its content URL with ``/manifest``
    for ``/content``, under the same signature; None for any other URL."""
    if descriptor.url is None:
        return None
    parts = urlsplit(descriptor.url)
    if not parts.path.endswith("/content"):
        return None
    return urlunsplit(parts._replace(path=parts.path[: -len("/content")] + "/manifest"))


async def fetch_manifest(http: httpx.AsyncClient, descriptor: FileContent) -> Manifest | None:
    url = manifest_url(descriptor)
    if url is None:
        return None
    try:
        response = await http.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        manifest = parse_manifest(response.json())
    except (ValueError, TransferError):
        return None
    if descriptor.checksum != "sha256:" + manifest.sha256 or descriptor.size != manifest.size:
        return None
    return manifest


async def resolve_with_cache(
    http: httpx.AsyncClient,
    descriptor: FileContent | dict[str, Any] | str,
    dest: str | os.PathLike[str],
    cache: ChunkCache,
    *,
    connections: int = 4,
    fallback: Callable[[FileContent, Path], Any] | None = None,
) -> CachedResolve:
    """Resolve ``descriptor`` into ``dest`` using and filling ``cache`` (module text). A descriptor without a
    manifest (another service, an encoded file, inline content) is resolved by ``fallback`` (the ordinary
    resolver), and its chunks are kept afterwards."""
    if not isinstance(descriptor, FileContent):
        loaded = load_descriptor(descriptor)
        if not isinstance(loaded, FileContent):
            raise InvalidDescriptor("only a FileContent resolves through a chunk cache")
        descriptor = loaded
    dest = Path(dest)
    plain = descriptor.type is TransferMode.URL and descriptor.encoding in (None, ContentEncoding.NONE)
    manifest = await fetch_manifest(http, descriptor) if plain else None
    if manifest is None:
        if fallback is None:
            raise InvalidDescriptor("the service gives no chunk manifest for this descriptor")
        await fallback(descriptor, dest)
        await asyncio.to_thread(cache.keep_file, dest)
        await asyncio.to_thread(cache.trim)
        return CachedResolve(dest, descriptor.size or 0, 0)
    assert descriptor.url is not None
    method = "POST" if descriptor.download_method is DownloadMethod.POST else "GET"
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.parent / f".{dest.name}.{secrets.token_hex(6)}.part"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    cached_bytes = fetched_bytes = 0
    threads: list[asyncio.Future[Any]] = []  # every thread job on ``fd``: all ended before it closes

    async def on_thread(fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on a thread, which runs on to its end whatever happens to the caller (see ``threads``)."""
        job = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        threads.append(job)
        return await asyncio.shield(job)

    try:
        os.ftruncate(fd, manifest.size)
        # the chunks the cache holds are placed on a few threads while the others are fetched: a thread hop per
        # chunk, one after the other, cost more than the bytes (3,300 chunks of a 256 MiB file: 1.2 s of waiting)
        held = await asyncio.to_thread(cache.holds, [c.sha256 for c in manifest.chunks])
        lacking = [i for i, chunk in enumerate(manifest.chunks) if chunk.sha256 not in held]
        gate = asyncio.Semaphore(max(1, connections))

        async def fetch(first: int, count: int) -> None:
            nonlocal fetched_bytes
            chunks = manifest.chunks[first : first + count]
            start, end = chunks[0].offset, chunks[-1].offset + chunks[-1].length
            async with gate:
                response = await http.request(
                    method,
                    descriptor.url or "",
                    headers={"range": f"bytes={start}-{end - 1}", "accept-encoding": "identity"},
                )
            await raise_for_error(response)
            body = response.content
            if response.status_code != 206 or len(body) != end - start:
                raise RemoteError(f"the service did not answer the range {start}-{end - 1} of the file")
            await on_thread(_place_fetched, cache, fd, chunks, body, start)
            fetched_bytes += len(body)

        async def fetch_all(indexes: list[int]) -> None:
            ranges = runs(indexes, manifest.chunks, FETCH_RUN_BYTES)
            await _all([partial(fetch, first, count) for first, count in ranges])

        cached = [c for c in manifest.chunks if c.sha256 in held]
        placers = [  # a few threads: opening and reading thousands of small files
            asyncio.ensure_future(on_thread(_place_cached, cache, fd, cached[k::PLACERS])) for k in range(PLACERS)
        ]
        try:
            await fetch_all(lacking)
        finally:
            await asyncio.wait(placers)
            for placer in placers:
                if not placer.cancelled():
                    placer.exception()  # retrieved: raised below, or behind the fetch's own error
        outcomes = [placer.result() for placer in placers]
        placed = [chunk for done, _ in outcomes for chunk in done]
        gone = [sha for _, lost in outcomes for sha in lost]

        async def refetch(lost: set[str]) -> None:
            await fetch_all([i for i, chunk in enumerate(manifest.chunks) if chunk.sha256 in lost])

        if gone:  # evicted by another resolver sharing the cache meanwhile: fetched after all
            await refetch(set(gone))
        sha = await on_thread(_hash_fd, fd)
        if descriptor.checksum != "sha256:" + sha and placed:  # a cached chunk was damaged on disk: which one?
            damaged = set(await on_thread(_damaged_placed, cache, fd, placed))
            if damaged:
                await refetch(damaged)
                placed = [c for c in placed if c.sha256 not in damaged]
                sha = await on_thread(_hash_fd, fd)
        cached_bytes = sum(c.length for c in placed)
        verify_bytes(descriptor, sha, manifest.size)
        os.replace(part, dest)
    finally:
        if threads:  # a fetch cancelled beside a failed one, or this resolve cancelled: its thread writes on
            await asyncio.wait(threads)
            for job in threads:
                if not job.cancelled():
                    job.exception()  # retrieved: raised already, or behind the error that ended the resolve
        os.close(fd)
        part.unlink(missing_ok=True)
    await asyncio.to_thread(cache.trim)
    return CachedResolve(dest, fetched_bytes, cached_bytes)


async def _all(jobs: list[Callable[[], Awaitable[None]]]) -> None:
    """Run ``jobs`` together; the first failure is raised as itself (the others are cancelled)."""
    try:
        async with asyncio.TaskGroup() as tg:
            for job in jobs:
                tg.create_task(job())  # type: ignore[arg-type]
    except BaseExceptionGroup as group:
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _place_cached(cache: ChunkCache, fd: int, chunks: list[Chunk]) -> tuple[list[Chunk], list[str]]:
    """Write each of ``chunks`` from the cache at its offset of ``fd`` (blocking), unhashed: the whole file's
    SHA-256 checks them all, and :func:`_damaged_placed` finds the culprit on a mismatch. Returns the chunks placed
    and the hashes of those the cache no longer holds."""
    placed: list[Chunk] = []
    gone: list[str] = []
    for chunk in chunks:
        data = cache.read(chunk.sha256, chunk.length)
        if data is None:
            gone.append(chunk.sha256)
            continue
        _pwrite_all(fd, data, chunk.offset)
        placed.append(chunk)
    return placed, gone


def _damaged_placed(cache: ChunkCache, fd: int, placed: list[Chunk]) -> list[str]:
    """After a whole-file mismatch: the placed chunks whose bytes are not their name, removed from the cache."""
    damaged = set()
    for chunk in placed:
        if chunk.sha256 not in damaged:
            if hashlib.sha256(os.pread(fd, chunk.length, chunk.offset)).hexdigest() != chunk.sha256:
                damaged.add(chunk.sha256)
                cache.path(chunk.sha256).unlink(missing_ok=True)
    return sorted(damaged)


def _place_fetched(cache: ChunkCache, fd: int, chunks: tuple[Chunk, ...], body: bytes, start: int) -> None:
    """Check each chunk of a fetched range against its name, write it at its offset and keep it (blocking)."""
    view = memoryview(body)
    for chunk in chunks:
        piece = view[chunk.offset - start : chunk.offset - start + chunk.length]
        if hashlib.sha256(piece).hexdigest() != chunk.sha256:
            raise ChecksumMismatch(f"the chunk at offset {chunk.offset} is not the manifest's")
        _pwrite_all(fd, piece, chunk.offset)
        cache.put(chunk.sha256, piece)


def _hash_fd(fd: int) -> str:
    sha = hashlib.sha256()
    at = 0
    while piece := os.pread(fd, 1 << 20, at):
        sha.update(piece)
        at += len(piece)
    return sha.hexdigest()
