"""Resolving a descriptor into bytes: download (parallel ranges, resumed after a cut), decode, verify.

    inline            base64 / text / JSON / code data -> bytes; size and checksum verified when declared
    url               the raw (stored) bytes land in a temp file next to the destination:
                        - parallel: ``connections`` ranged GETs write at their offsets; an in-order hasher
                          follows the contiguous prefix, so hashing overlaps the download
                        - single stream otherwise (or when the server ignores Range), resumed with a Range request
                          (``If-Range`` on the ETag) after a cut connection
                      then decoded (gzip / deflate / zstd, bomb-guarded) and SHA-256 verified; only a verified file
                      is renamed to the destination. On any failure nothing is left at the destination.

``Accept-Encoding: identity`` is sent so that the bytes received are exactly the stored ones.
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

import httpx
import pybase64

from transfer.client.chunks import ChunkOptions, follow, streaming_to_path, write_atomically
from transfer.client.fetch import Fetcher, FetchPlan, RangeIgnored, hash_range, lean_path_possible, pwrite_all
from transfer.client.integrity import verify_bytes
from transfer.core.model.content import (
    CodeContent,
    ContentBundle,
    ContentEncoding,
    DownloadMethod,
    FileContent,
    JSONContent,
    TextContent,
    TransferMode,
)
from transfer.core.model.encodings import DecodeLimits, make_decoder
from transfer.core.model.naming import sanitize_filename
from transfer.errors import (
    InvalidDescriptor,
    RemoteError,
    SizeMismatch,
    TooLarge,
    TransferError,
    error_from_payload,
)

Progress = Callable[[int, int | None], None]
Descriptor = FileContent | TextContent | JSONContent | CodeContent | ContentBundle


@dataclass(frozen=True, slots=True)
class ResolveOptions:
    connections: int = 4  # parallel ranged requests for large url-mode content
    parallel_min_size: int = 16 << 20  # below this, one stream
    buffer_size: int = 1 << 20
    retries: int = 5  # per segment, after a cut connection or a 5xx
    max_decoded_size: int = 64 << 30
    max_decode_ratio: float = 10_000.0


_SEGMENT = 4 << 20  # bytes per ranged request when several connections share a file
# bytes received, written and hashed at a time: small enough to stay in the CPU cache between the three (1 MiB pieces
# cost ~60 % more CPU per GiB here than 256 KiB ones)
_PIECE = 256 << 10


class _RangeIgnored(Exception):
    """The server answered 200 to a ranged request."""


def inline_bytes(descriptor: FileContent | TextContent | JSONContent | CodeContent) -> bytes:
    """The bytes an inline content object carries (before verification)."""
    if isinstance(descriptor, FileContent):
        assert descriptor.data is not None
        try:
            raw = pybase64.b64decode(descriptor.data.encode("ascii"), altchars=None, validate=False)
        except ValueError as exc:
            raise InvalidDescriptor("inline data is not valid base64") from exc
        if descriptor.encoding not in (None, ContentEncoding.NONE, ContentEncoding.BASE64):
            # inline content is small: never more than 16 MiB, nor more than it declares
            limit = 16 << 20 if descriptor.size is None else min(16 << 20, descriptor.size)
            decoder = make_decoder(descriptor.encoding, DecodeLimits(limit))
            raw = b"".join([*decoder.feed(raw), *decoder.finish()])
        return raw
    if isinstance(descriptor, TextContent):
        try:
            return descriptor.data.encode(descriptor.charset)
        except LookupError as exc:
            raise InvalidDescriptor(f"unknown charset {descriptor.charset!r}") from exc
    if isinstance(descriptor, CodeContent):
        return descriptor.data.encode("utf-8")
    return json.dumps(descriptor.data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def raise_for_error(response: httpx.Response) -> None:
    """Turn an error response into the matching TransferError."""
    if response.status_code < 400:
        return
    body = await response.aread()
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    raise error_from_payload(response.status_code, payload)


class Resolver:
    """Downloads and verifies url-mode content; decodes inline content. One instance may resolve many."""

    def __init__(self, http: httpx.AsyncClient, options: ResolveOptions | None = None) -> None:
        self.http = http
        self.options = options or ResolveOptions()

    async def to_path(
        self, descriptor: Descriptor, dest: str | os.PathLike[str], progress: Progress | None = None
    ) -> Path:
        """Resolve into ``dest`` (written only once verified). Returns the path."""
        if isinstance(descriptor, ContentBundle):
            raise InvalidDescriptor("a bundle resolves into a directory: use bundle_to_dir")
        dest_path = Path(dest)
        if descriptor.type is TransferMode.INLINE or not isinstance(descriptor, FileContent):
            data = inline_bytes(descriptor)
            verify_bytes(descriptor, hashlib.sha256(data).hexdigest(), len(data))
            await asyncio.to_thread(write_atomically, dest_path, data)
            if progress:
                progress(len(data), len(data))
            return dest_path
        if descriptor.type is TransferMode.STREAMING:
            return await streaming_to_path(self.http, descriptor, dest_path, self._chunk_options(), progress)
        if descriptor.type is not TransferMode.URL:
            raise InvalidDescriptor(f"{descriptor.type.value} mode cannot be resolved")
        return await self._url_to_path(descriptor, dest_path, progress)

    def _chunk_options(self) -> ChunkOptions:
        return ChunkOptions(connections=self.options.connections, retries=self.options.retries)

    def follow(self, descriptor: FileContent) -> AsyncIterator[bytes]:
        """Bytes of a streaming descriptor in order as its chunks are stored (for sessions still uploading)."""
        return follow(self.http, descriptor, self._chunk_options())

    async def bundle_to_dir(self, bundle: ContentBundle, directory: str | os.PathLike[str]) -> list[Path]:
        """Every item of ``bundle`` into ``directory`` (files under their names, inline text/JSON/code as
        ``<item id>.txt|.json|.code``), each verified; on any failure, nothing of this call is left behind."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        staging = target / f".bundle-{secrets.token_hex(6)}"
        staging.mkdir()
        names: list[str] = []
        try:
            for item in bundle.items:
                content = item.content
                if isinstance(content, FileContent):
                    name = sanitize_filename(content.name, default=item.id)
                else:
                    ext = {"TextContent": ".txt", "JSONContent": ".json", "CodeContent": ".code"}[
                        type(content).__name__
                    ]
                    name = sanitize_filename(item.id, default="item") + ext
                if name in names or (target / name).exists():
                    name = f"{sanitize_filename(item.id, default='item')}-{name}"
                names.append(name)
                await self.to_path(content, staging / name)
            placed = []
            for name in names:
                os.replace(staging / name, target / name)
                placed.append(target / name)
            return placed
        finally:
            for leftover in staging.iterdir():
                leftover.unlink()
            staging.rmdir()

    async def to_bytes(self, descriptor: Descriptor, max_size: int = 256 << 20) -> bytes:
        """Resolve into memory (for small content; refuses more than ``max_size`` bytes)."""
        if isinstance(descriptor, FileContent) and descriptor.type in (TransferMode.URL, TransferMode.STREAMING):
            if descriptor.size is not None and descriptor.size > max_size:
                raise InvalidDescriptor(f"content of {descriptor.size} bytes is larger than max_size; use to_path")
            chunks: list[bytes] = []
            held = 0
            async for chunk in self.stream(descriptor):  # no size declared: the cut-off is max_size itself
                held += len(chunk)
                if held > max_size:
                    raise TooLarge(f"content is larger than max_size ({max_size} bytes); use to_path", limit=max_size)
                chunks.append(chunk)
            return b"".join(chunks)
        if isinstance(descriptor, ContentBundle):
            raise InvalidDescriptor("a bundle is not one byte string")
        data = inline_bytes(descriptor)
        verify_bytes(descriptor, hashlib.sha256(data).hexdigest(), len(data))
        return data

    async def stream(self, descriptor: FileContent) -> AsyncIterator[bytes]:
        """Yield the original bytes as they arrive (single stream, resumed after cuts). The size and checksum are
        verified when the stream ends: a mismatch raises then, so a consumer must not act on the bytes before the
        iteration finishes."""
        if descriptor.type is TransferMode.INLINE:
            yield await self.to_bytes(descriptor)
            return
        if descriptor.type is TransferMode.STREAMING:
            async for piece in follow(self.http, descriptor, self._chunk_options()):
                yield piece
            return
        if descriptor.url is None:
            raise InvalidDescriptor("url mode requires 'url'")
        decoder = make_decoder(descriptor.encoding or ContentEncoding.NONE, self._limits(descriptor))
        sha = hashlib.sha256()
        size = 0
        try:
            async for raw in self._ranged_stream(descriptor, 0, None, _raw_length(descriptor)):
                for piece in decoder.feed(raw):
                    sha.update(piece)
                    size += len(piece)
                    yield piece
        except _RangeIgnored:
            raise RemoteError("connection was cut and the server cannot resume (it ignored Range)") from None
        for piece in decoder.finish():
            sha.update(piece)
            size += len(piece)
            yield piece
        verify_bytes(descriptor, sha.hexdigest(), size)

    def _limits(self, descriptor: FileContent) -> DecodeLimits:
        limit = self.options.max_decoded_size
        if descriptor.size is not None:
            limit = min(limit, descriptor.size)  # never more than declared: a lying server cannot flood the disk
        return DecodeLimits(limit, self.options.max_decode_ratio)

    def _request_args(self, descriptor: FileContent) -> tuple[str, dict[str, str]]:
        method = "POST" if descriptor.download_method is DownloadMethod.POST else "GET"
        return method, {"accept-encoding": "identity"}

    async def _ranged_stream(
        self, descriptor: FileContent, start: int, end: int | None, total: int | None = None
    ) -> AsyncIterator[bytes]:
        """Raw bytes ``[start, end)`` (``end`` None: to the end), resuming with Range after a cut connection."""
        assert descriptor.url is not None
        method, base_headers = self._request_args(descriptor)
        pos = start
        etag: str | None = None
        attempt = 0
        while end is None or pos < end:
            headers = dict(base_headers)
            ranged = method == "GET" and (pos > start or start > 0 or end is not None)
            if ranged:
                headers["range"] = f"bytes={pos}-" + ("" if end is None else str(end - 1))
                if etag:
                    headers["if-range"] = etag
            try:
                async with self.http.stream(method, descriptor.url, headers=headers) as response:
                    if response.status_code >= 500 and attempt < self.options.retries:
                        raise httpx.RemoteProtocolError(f"server answered {response.status_code}")
                    await raise_for_error(response)
                    etag = response.headers.get("etag", etag)
                    if ranged:
                        if response.status_code != 206:
                            raise _RangeIgnored()
                        content_range = response.headers.get("content-range", "")
                        if not content_range.startswith(f"bytes {pos}-"):
                            raise RemoteError(f"asked for bytes from {pos}, got Content-Range {content_range!r}")
                        complete = content_range.rpartition("/")[2]
                        if total is not None and complete.isdigit() and int(complete) != total:
                            raise SizeMismatch(f"server holds {complete} bytes, descriptor declares {total}")
                    elif response.status_code != 200:
                        raise RemoteError(f"unexpected HTTP {response.status_code}")
                    elif total is not None and response.headers.get("content-length", str(total)) != str(total):
                        raise SizeMismatch(
                            f"server sends {response.headers['content-length']} bytes, descriptor declares {total}"
                        )
                    async for chunk in response.aiter_raw(self.options.buffer_size):
                        if end is not None and pos + len(chunk) > end:
                            raise RemoteError("server sent more bytes than requested")
                        pos += len(chunk)
                        attempt = 0  # progress was made: a later cut starts a fresh retry budget
                        yield chunk
                if end is None:
                    return
                if pos < end:
                    raise httpx.RemoteProtocolError("response ended early")
            except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
                attempt += 1
                if attempt > self.options.retries:
                    raise RemoteError(f"download failed after {self.options.retries} retries: {exc}") from exc
                await asyncio.sleep(min(0.1 * 2**attempt, 5.0))

    async def _url_to_path(self, descriptor: FileContent, dest: Path, progress: Progress | None) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        raw_len = _raw_length(descriptor)
        token = secrets.token_hex(6)
        part = dest.parent / f".{dest.name}.{token}.part"
        decoded = dest.parent / f".{dest.name}.{token}.decoded"
        encoding = descriptor.encoding or ContentEncoding.NONE
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                raw_sha = await self._download(descriptor, fd, raw_len, progress)
            finally:
                os.close(fd)
            if encoding in (ContentEncoding.NONE, ContentEncoding.BASE64):
                size = os.path.getsize(part)
                verify_bytes(descriptor, raw_sha, size)
                os.replace(part, dest)
            else:
                sha, size = await asyncio.to_thread(
                    _decode_file, part, decoded, encoding, self._limits(descriptor), self.options.buffer_size
                )
                verify_bytes(descriptor, sha, size)
                os.replace(decoded, dest)
        finally:
            for leftover in (part, decoded):
                try:
                    os.remove(leftover)
                except FileNotFoundError:
                    pass
        return dest

    async def _download(self, descriptor: FileContent, fd: int, raw_len: int | None, progress: Progress | None) -> str:
        """Fill ``fd`` with the raw bytes; return their SHA-256 (hex)."""
        opts = self.options
        parallel = (
            raw_len is not None
            and descriptor.range_supported
            and descriptor.download_method is not DownloadMethod.POST
            and opts.connections > 1
            and raw_len >= opts.parallel_min_size
        )
        assert descriptor.url is not None
        if lean_path_possible(self.http, descriptor.url):
            if parallel:
                try:
                    return await self._fetch(descriptor, fd, raw_len, progress, opts.connections)
                except RangeIgnored:
                    os.ftruncate(fd, 0)
            try:
                return await self._fetch(descriptor, fd, raw_len, progress, 1)
            except RangeIgnored:
                raise RemoteError("connection was cut and the server cannot resume (it ignored Range)") from None
        if parallel:
            assert raw_len is not None
            try:
                return await self._download_parallel(descriptor, fd, raw_len, progress)
            except _RangeIgnored:
                os.ftruncate(fd, 0)
        return await self._download_single(descriptor, fd, raw_len, progress)

    async def _fetch(
        self, descriptor: FileContent, fd: int, raw_len: int | None, progress: Progress | None, connections: int
    ) -> str:
        """The raw bytes through :class:`Fetcher` (plain http): threads that ``recv_into`` pooled buffers and hash in
        order as the bytes arrive; progress is reported from here, on the event loop."""
        assert descriptor.url is not None
        opts = self.options
        method, _ = self._request_args(descriptor)
        piece = _PIECE
        segment = raw_len or piece
        if connections > 1 and raw_len:
            # small segments claimed in file order keep every connection near the hash frontier, so the pool of
            # pieces held ahead of it stays small and little is read back from the file
            segment = max(piece, min(_SEGMENT, -(-raw_len // connections)))
        timeout = self.http.timeout
        plan = FetchPlan(
            method=method,
            url=descriptor.url,
            total=raw_len,
            connections=connections,
            segment=segment,
            piece=piece,
            window=connections * (2 * -(-segment // piece) + 1),
            retries=opts.retries,
            connect_timeout=timeout.connect,
            read_timeout=timeout.read,
        )
        http = self.http
        url = descriptor.url

        def wire_request(extra: dict[str, str]) -> tuple[bytes, list[tuple[bytes, bytes]]]:
            request = http.build_request(method, url, headers=extra)
            if http.auth is not None:  # what httpx would add (e.g. the client's bearer key for its own server)
                request = next(http.auth.sync_auth_flow(request))
            return request.url.raw_path, [(k.lower(), v) for k, v in request.headers.raw]

        fetcher = Fetcher(plan, fd, wire_request)
        job = asyncio.get_running_loop().run_in_executor(None, fetcher.run)
        try:
            while not job.done():
                await asyncio.wait({job}, timeout=0.25)
                if progress:
                    progress(fetcher.assembler.received, raw_len)
        except BaseException:
            fetcher.abort()
            await asyncio.wait({job})  # no thread may write after the caller closes the file
            raise
        sha = job.result()
        received = fetcher.assembler.received
        if raw_len is not None and received != raw_len:
            raise SizeMismatch(f"received {received} bytes, descriptor declares {raw_len}")
        return sha

    async def _download_single(
        self, descriptor: FileContent, fd: int, raw_len: int | None, progress: Progress | None
    ) -> str:
        sha = hashlib.sha256()
        pos = 0
        pending = bytearray()

        def flush(data: bytes, at: int) -> None:
            sha.update(data)
            pwrite_all(fd, data, at)

        try:
            async for chunk in self._ranged_stream(descriptor, 0, None, raw_len):
                pending += chunk
                if len(pending) >= self.options.buffer_size:
                    data = bytes(pending)
                    pending.clear()
                    await asyncio.to_thread(flush, data, pos)
                    pos += len(data)
                    if progress:
                        progress(pos, raw_len)
                if raw_len is not None and pos + len(pending) > raw_len:
                    raise SizeMismatch(f"server sent more than the {raw_len} bytes the descriptor declares")
        except _RangeIgnored:
            raise RemoteError("connection was cut and the server cannot resume (it ignored Range)") from None
        if pending:
            await asyncio.to_thread(flush, bytes(pending), pos)
            pos += len(pending)
        if progress:
            progress(pos, raw_len)
        if raw_len is not None and pos != raw_len:
            raise SizeMismatch(f"received {pos} bytes, descriptor declares {raw_len}")
        return sha.hexdigest()

    async def _download_parallel(
        self, descriptor: FileContent, fd: int, raw_len: int, progress: Progress | None
    ) -> str:
        opts = self.options
        n = max(1, min(opts.connections, raw_len // (opts.parallel_min_size // 4) or 1))
        step = -(-raw_len // n)
        bounds = [(i * step, min(raw_len, (i + 1) * step)) for i in range(n)]
        done = [asyncio.Event() for _ in bounds]
        done_bytes = 0
        sha = hashlib.sha256()

        async def fetch(index: int, start: int, end: int) -> None:
            nonlocal done_bytes
            pos = start
            pending = bytearray()
            async for chunk in self._ranged_stream(descriptor, start, end, raw_len):
                pending += chunk
                if len(pending) >= opts.buffer_size:
                    data = bytes(pending)
                    pending.clear()
                    await asyncio.to_thread(pwrite_all, fd, data, pos)
                    pos += len(data)
                    done_bytes += len(data)
                    if progress:
                        progress(done_bytes, raw_len)
            if pending:
                await asyncio.to_thread(pwrite_all, fd, bytes(pending), pos)
                pos += len(pending)
                done_bytes += len(pending)
            if pos != end:
                raise SizeMismatch(f"range {start}-{end - 1}: received {pos - start} bytes")
            done[index].set()

        async def hash_in_order() -> None:
            for (start, end), event in zip(bounds, done, strict=True):
                await event.wait()
                await asyncio.to_thread(hash_range, fd, sha, start, end, opts.buffer_size)

        try:
            async with asyncio.TaskGroup() as tg:
                for i, (start, end) in enumerate(bounds):
                    tg.create_task(fetch(i, start, end))
                tg.create_task(hash_in_order())
        except BaseExceptionGroup as group:
            raise _first(group) from None
        if progress:
            progress(raw_len, raw_len)
        return sha.hexdigest()


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        if isinstance(exc, _RangeIgnored | TransferError):
            return exc
    return group.exceptions[0]


def _raw_length(descriptor: FileContent) -> int | None:
    if descriptor.encoding not in (None, ContentEncoding.NONE, ContentEncoding.BASE64):
        return descriptor.encoded_size
    return descriptor.size


def _decode_file(
    src: Path, dst: Path, encoding: ContentEncoding, limits: DecodeLimits, buffer_size: int
) -> tuple[str, int]:
    decoder = make_decoder(encoding, limits, piece_size=buffer_size)
    sha = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while chunk := fin.read(buffer_size):
            for piece in decoder.feed(chunk):
                sha.update(piece)
                size += len(piece)
                fout.write(piece)
        for piece in decoder.finish():
            sha.update(piece)
            size += len(piece)
            fout.write(piece)
    return sha.hexdigest(), size
