"""Streaming-mode content on the client side: chunked, resumable uploads, and reading streaming descriptors —
in parallel into a file, or in order as the chunks arrive (``follow``, for sessions still being uploaded).

Every chunk carries its xxh3-128 both ways (``Chunk-Checksum``); the whole file's SHA-256 is checked against the
descriptor. A chunk that fails (cut connection, 5xx, checksum) is fetched or sent again, a bounded number of times.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import xxhash

from transfer.client.integrity import verify_bytes
from transfer.core.model.content import FileContent, checksum_hex
from transfer.errors import (
    ChecksumMismatch,
    ChunkChecksumMismatch,
    ChunkNotReady,
    InvalidDescriptor,
    RemoteError,
    SizeMismatch,
    TransferError,
)

Progress = Callable[[int, int | None], None]
RETRYABLE = (httpx.TransportError, ChunkChecksumMismatch, RemoteError)


@dataclass(frozen=True, slots=True)
class ChunkOptions:
    connections: int = 4
    retries: int = 5
    wait: int = 30  # seconds a chunk read may wait for a chunk not uploaded yet (Prefer: wait)


def _chunk_url(descriptor: FileContent, index: int) -> str:
    if not descriptor.url or "?" not in descriptor.url:
        raise InvalidDescriptor("streaming descriptor has no signed chunk URL")
    base, _, query = descriptor.url.partition("?")
    return f"{base}/{index}?{query}"


def _error_from(response: httpx.Response) -> TransferError:
    from transfer.errors import error_from_payload

    try:
        payload = response.json()
    except ValueError:
        payload = None
    return error_from_payload(response.status_code, payload)


async def fetch_chunk(http: httpx.AsyncClient, descriptor: FileContent, index: int, options: ChunkOptions) -> bytes:
    """One chunk, verified against its xxh3-128; waits for chunks not yet uploaded; retries cut connections."""
    attempt = 0
    while True:
        try:
            response = await http.get(
                _chunk_url(descriptor, index), headers={"prefer": f"wait={options.wait}", "accept-encoding": "identity"}
            )
            if response.status_code >= 500 and not (response.status_code == 503 and "retry-after" in response.headers):
                raise RemoteError(f"server answered {response.status_code}")
            if response.status_code >= 400:
                raise _error_from(response)
            declared = response.headers.get("chunk-checksum", "")
            actual = "xxh3-128:" + xxhash.xxh3_128_hexdigest(response.content)
            if declared and declared.lower() != actual:
                raise ChunkChecksumMismatch(f"chunk {index}: {actual}, server declared {declared}")
            return response.content
        except ChunkNotReady:
            continue  # still being produced: ask again (the server already waited)
        except RETRYABLE as exc:
            attempt += 1
            if attempt > options.retries:
                raise RemoteError(f"chunk {index} failed after {options.retries} retries: {exc}") from exc
            await asyncio.sleep(min(0.1 * 2**attempt, 5.0))


def _layout(descriptor: FileContent) -> tuple[int, int, int]:
    if descriptor.size is None or descriptor.total_chunks is None or descriptor.chunk_size is None:
        raise InvalidDescriptor("streaming descriptor needs size, total_chunks and chunk_size")
    return descriptor.size, descriptor.total_chunks, descriptor.chunk_size


async def streaming_to_path(
    http: httpx.AsyncClient, descriptor: FileContent, dest: Path, options: ChunkOptions, progress: Progress | None
) -> Path:
    """Chunks in parallel into a temp file at their offsets, hashed in order as the prefix completes; renamed to
    ``dest`` only when the size and SHA-256 match the descriptor."""
    size, total, chunk_size = _layout(descriptor)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.parent / f".{dest.name}.{secrets.token_hex(6)}.part"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    sha = hashlib.sha256()
    done = [asyncio.Event() for _ in range(total)]
    slots = asyncio.Semaphore(options.connections)
    received = 0
    try:

        async def one(index: int) -> None:
            nonlocal received
            async with slots:
                data = await fetch_chunk(http, descriptor, index, options)
            expected = min(chunk_size, size - index * chunk_size)
            if len(data) != expected:
                raise SizeMismatch(f"chunk {index} has {len(data)} bytes, expected {expected}")
            await asyncio.to_thread(os.pwrite, fd, data, index * chunk_size)
            received += len(data)
            if progress:
                progress(received, size)
            done[index].set()

        async def hash_in_order() -> None:
            for index in range(total):
                await done[index].wait()
                start = index * chunk_size
                data = await asyncio.to_thread(os.pread, fd, min(chunk_size, size - start), start)
                await asyncio.to_thread(sha.update, data)

        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(hash_in_order())
                for index in range(total):
                    tg.create_task(one(index))
        except BaseExceptionGroup as group:
            raise _first(group) from None
        os.close(fd)
        fd = -1
        verify_bytes(descriptor, sha.hexdigest(), os.path.getsize(part))
        os.replace(part, dest)
    finally:
        if fd >= 0:
            os.close(fd)
        try:
            os.remove(part)
        except FileNotFoundError:
            pass
    return dest


async def follow(http: httpx.AsyncClient, descriptor: FileContent, options: ChunkOptions) -> AsyncIterator[bytes]:
    """The original bytes in order, each chunk as soon as it is stored (a few fetched ahead); the whole SHA-256 is
    checked after the last chunk (a mismatch raises then)."""
    size, total, _chunk_size = _layout(descriptor)
    sha = hashlib.sha256()
    received = 0
    ahead: dict[int, asyncio.Task[bytes]] = {}
    try:
        for index in range(total):
            for j in range(index, min(total, index + options.connections)):
                if j not in ahead:
                    ahead[j] = asyncio.create_task(fetch_chunk(http, descriptor, j, options))
            data = await ahead.pop(index)
            sha.update(data)
            received += len(data)
            yield data
    finally:
        for task in ahead.values():
            task.cancel()
    verify_bytes(descriptor, sha.hexdigest(), received)
    del size


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        if isinstance(exc, TransferError):
            return exc
    return group.exceptions[0]


# -- uploads ---------------------------------------------------------------------------------------------------------


MiB = 1 << 20
PLAN_ROUNDS = 2  # chunks each connection sends, in the plan
PLAN_MIN = 8 * MiB  # the service's default chunk size (and above S3's 5 MiB minimum part)
PLAN_MAX = 32 * MiB  # also bounds what completion hashes last: the final round of chunks arrives at once


def plan_chunk_size(size: int, connections: int) -> int | None:
    """The chunk size a new session asks for: each connection sends about ``PLAN_ROUNDS`` chunks, within
    [8 MiB, 32 MiB] in whole MiB. Every chunk costs a round trip and the server's record update on top of its
    bytes, on a link whose round trip is long that is a large share of a small chunk (8 MiB at 50 MB/s per
    connection: ~170 ms of bytes against ~60 ms of round trip and answer); few large chunks pay it few times,
    while a failed chunk still costs at most 32 MiB again. None: the server's default (an empty file)."""
    if size <= 0:
        return None
    share = -(-size // (max(1, connections) * PLAN_ROUNDS))
    return min(max(-(-share // MiB) * MiB, PLAN_MIN), PLAN_MAX)


def state_dir() -> Path:
    """Where resumable uploads remember their session (``$XDG_CACHE_HOME/transfer/sessions``)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "transfer" / "sessions"


def _state_key(path: Path, server: str) -> str:
    st = path.stat()
    ident = f"{server}\n{path.resolve()}\n{st.st_size}\n{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


async def upload_chunked(
    http: httpx.AsyncClient,
    server: str,
    path: Path,
    *,
    options: ChunkOptions,
    chunk_size: int | None = None,
    metadata: dict[str, Any] | None = None,
    progress: Progress | None = None,
    remember: Path | None = None,
    on_session: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Upload ``path`` as a chunked session — resuming the session remembered for this file under ``remember`` —
    and complete it. Returns the completed descriptor (JSON). ``on_session`` is told the session (its document
    when opened, its status when resumed) before any chunk is sent, so that readers can start following it."""
    size = path.stat().st_size
    state_file = remember / f"{_state_key(path, server)}.json" if remember else None
    sid: str | None = None
    if state_file is not None and state_file.exists():
        try:
            remembered = json.loads(state_file.read_text()).get("session")
        except (ValueError, AttributeError):  # unreadable (an older client's half-written file): start afresh
            remembered = None
        sid = remembered if isinstance(remembered, str) else None
    status: dict[str, Any] | None = None
    if sid:
        response = await http.get(f"{server}/v1/sessions/{sid}")
        if response.status_code == 200 and response.json().get("state") == "open":
            status = response.json()
    if status is None:
        # no checksum declared: reading the whole file first to hash it would cost a full pass before the first
        # byte leaves; the file is hashed in order while its chunks are sent and compared with the server's SHA-256
        # of the assembled chunks when the session completes (each chunk is verified on arrival by its xxh3-128)
        planned = chunk_size or plan_chunk_size(size, options.connections)
        body = {"size": size, "chunk_size": planned, **(metadata or {})}
        response = await http.post(f"{server}/v1/sessions", json={k: v for k, v in body.items() if v is not None})
        if response.status_code == 400 and chunk_size is None and planned is not None:
            body["chunk_size"] = None  # outside what this server allows: its own default
            response = await http.post(f"{server}/v1/sessions", json={k: v for k, v in body.items() if v is not None})
        if response.status_code != 201:
            raise _error_from(response)
        status = response.json()
        sid = status["streaming_session_id"]
        if state_file is not None:
            write_atomically(state_file, json.dumps({"session": sid, "path": str(path)}).encode())
        stored: set[int] = set()
    else:
        stored = {i for a, b in status["stored"] for i in range(a, b + 1)}
    assert sid is not None
    if on_session is not None:
        on_session(status)
    cs = int(status["chunk_size"])
    total = -(-size // cs)
    sent = sum(min(cs, size - i * cs) for i in stored)
    if progress:
        progress(sent, size)
    slots = asyncio.Semaphore(options.connections)
    # the whole file's SHA-256, in order, on a thread of its own while the chunks are sent (it reads the page
    # cache; hashlib releases the GIL): no pass over the file before the first byte leaves, and no chunk is kept
    # in memory waiting for the hash to reach it. A resumed session's stored chunks are hashed the same way.
    hashing = asyncio.ensure_future(asyncio.to_thread(_sha256_file, path, size))

    async def send(index: int) -> None:
        nonlocal sent
        async with slots:
            start, length = index * cs, min(cs, size - index * cs)
            # the chunk's xxh3-128 goes in a header before its body: one read of the chunk (page cache) for it,
            # then the body streams from the file a piece at a time (memory per chunk: one piece, whatever its size)
            header = {
                "chunk-checksum": "xxh3-128:" + await asyncio.to_thread(_xxh3_range, path, start, length),
                "content-length": str(length),
            }
            attempt = 0
            while True:
                try:
                    response = await http.put(
                        f"{server}/v1/sessions/{sid}/chunks/{index}",
                        content=_read_range(path, start, length),
                        headers=header,
                    )
                    if response.status_code >= 500:
                        raise RemoteError(f"server answered {response.status_code}")
                    if response.status_code >= 400:
                        raise _error_from(response)
                    break
                except (httpx.TransportError, RemoteError) as exc:
                    attempt += 1
                    if attempt > options.retries:
                        raise RemoteError(f"chunk {index} failed after {options.retries} retries: {exc}") from exc
                    await asyncio.sleep(min(0.1 * 2**attempt, 5.0))
        sent += length
        if progress:
            progress(sent, size)

    try:
        try:
            async with asyncio.TaskGroup() as tg:
                for index in range(total):
                    if index not in stored:
                        tg.create_task(send(index))
        except BaseExceptionGroup as group:
            raise _first(group) from None
        local = await hashing
    finally:
        if not hashing.done():
            hashing.cancel()  # the thread finishes its read; nobody waits for it
    response = await http.post(f"{server}/v1/sessions/{sid}/complete", json={})
    if response.status_code != 200:
        raise _error_from(response)
    descriptor: dict[str, Any] = response.json()
    remote = descriptor.get("checksum")
    if remote is None or checksum_hex(remote) != local:
        file_id = (descriptor.get("metadata") or {}).get("file_id")
        if file_id:  # what the server assembled is not this file (it changed while being sent): withdraw it
            await http.delete(f"{server}/v1/files/{file_id}")
        raise ChecksumMismatch(
            "the completed file's SHA-256 differs from the local file's (was the file changed while uploading?)",
            expected="sha256:" + local,
            actual=str(remote),
        )
    if state_file is not None:
        state_file.unlink(missing_ok=True)
    return descriptor


PIECE = 1 << 20  # bytes read from the file per call while sending or hashing


def _sha256_file(path: Path, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of ``path`` (blocking; reads into one reused buffer)."""
    sha = hashlib.sha256()
    buffer = bytearray(PIECE)
    view = memoryview(buffer)
    left = size
    with open(path, "rb", buffering=0) as f:
        while left > 0:
            n = f.readinto(view[: min(PIECE, left)])
            if not n:
                raise SizeMismatch(f"{path} is shorter than {size} bytes (changed while uploading?)")
            sha.update(view[:n])
            left -= n
    return sha.hexdigest()


def _xxh3_range(path: Path, start: int, length: int) -> str:
    """xxh3-128 (hex) of ``length`` bytes of ``path`` from ``start`` (blocking)."""
    x3 = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        pos, end = start, start + length
        while pos < end:
            piece = os.pread(f.fileno(), min(PIECE, end - pos), pos)
            if not piece:
                raise SizeMismatch(f"{path} ends before byte {end} (changed while uploading?)")
            x3.update(piece)
            pos += len(piece)
    return x3.hexdigest()


async def _read_range(path: Path, start: int, length: int) -> AsyncIterator[bytes]:
    """``length`` bytes of ``path`` from ``start``, a piece at a time, each read in a worker thread."""
    fd = await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pos, end = start, start + length
        while pos < end:
            piece = await asyncio.to_thread(os.pread, fd, min(PIECE, end - pos), pos)
            if not piece:
                raise SizeMismatch(f"{path} ends before byte {end} (changed while uploading?)")
            pos += len(piece)
            yield piece
    finally:
        os.close(fd)


def write_atomically(dest: Path, data: bytes) -> None:
    """``data`` as the file ``dest``, whole or not at all (a process killed while writing leaves the old file or
    none, never a truncated one)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{secrets.token_hex(6)}.part"
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, dest)
    finally:
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
