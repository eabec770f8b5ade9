"""Python clients: :class:`AsyncTransferClient` (asyncio) and :class:`TransferClient` (blocking, same methods).

``upload`` streams a path, bytes, a binary file object or an async byte iterator — never reading a file whole —
hashing it on the way; the descriptor the server returns is checked against that hash (a mismatch deletes the
upload and raises ChecksumMismatch). ``resolve`` hands descriptors to :class:`Resolver`.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote

import anyio.from_thread
import httpx

from transfer.client.chunks import ChunkOptions, upload_chunked
from transfer.client.dedup import (
    CachedResolve,
    ChunkCache,
    DedupOutcome,
    offer,
    resolve_with_cache,
    upload_probed,
)
from transfer.client.direct import DirectOptions, PartFilter, upload_direct
from transfer.client.events import JobEvent, follow_job
from transfer.client.resolver import Descriptor, Progress, ResolveOptions, Resolver, raise_for_error
from transfer.client.resumable import ResumableOptions, ResumableResult, upload_resumable
from transfer.core.model.content import ContentBundle, FileContent, checksum_hex, load_descriptor
from transfer.errors import ChecksumMismatch, InvalidDescriptor, SizeMismatch

UploadSource = str | os.PathLike[str] | bytes | IO[bytes] | AsyncIterable[bytes]
T = TypeVar("T")

DEFAULT_SERVER = "http://127.0.0.1:8080"


class AsyncTransferClient:
    """Talks to one transfer service. Use as an async context manager, or call :meth:`aclose`."""

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        *,
        timeout: float = 60.0,
        options: ResolveOptions | None = None,
        http: httpx.AsyncClient | None = None,
        api_key: str | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self.options = options or ResolveOptions()
        self.last_resumable: ResumableResult | None = None  # what the last upload_resumable sent, for reports
        self.http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=self.options.connections + 4),
            follow_redirects=True,
            auth=_ServerBearer(self.server, api_key) if api_key else None,
        )
        self.resolver = Resolver(self.http, self.options)

    async def __aenter__(self) -> AsyncTransferClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def upload(
        self,
        source: UploadSource,
        *,
        name: str | None = None,
        content_type: str | None = None,
        role: str | None = None,
        description: str | None = None,
        encoding: str = "none",
        download_method: str | None = None,
        ttl: int | None = None,
        inline: bool | None = None,
        progress: Progress | None = None,
        job_id: str | None = None,
        expires_in: int | None = None,
    ) -> FileContent:
        """Upload ``source`` and return its descriptor (inline when small, else url mode). With ``job_id``, others
        can follow the upload's progress at ``/v1/jobs/{job_id}/events`` (:meth:`follow_job`); ``expires_in``:
        seconds the file lives (the descriptor's ``metadata.expires_at`` says when it goes)."""
        size: int | None = None
        if isinstance(source, str | os.PathLike):
            path = Path(source)
            size = path.stat().st_size
            name = name or path.name
            body: AsyncIterator[bytes] = _file_chunks(path, self.options.buffer_size)
        elif isinstance(source, bytes):
            size = len(source)
            body = _bytes_chunks(source, self.options.buffer_size)
        elif isinstance(source, AsyncIterable):
            body = _aiter(source)
        else:
            body = _fileobj_chunks(source, self.options.buffer_size)

        sha = hashlib.sha256()
        sent = 0

        async def hashed() -> AsyncIterator[bytes]:
            nonlocal sent
            async for chunk in body:
                sha.update(chunk)
                sent += len(chunk)
                if progress:
                    progress(sent, size)
                yield chunk

        params = {
            k: v
            for k, v in {
                "name": name,
                "content_type": content_type,
                "role": role,
                "description": description,
                "encoding": encoding,
                "download_method": download_method,
                "ttl": ttl,
                "inline": None if inline is None else str(inline).lower(),
                "size": size,
                "job_id": job_id,
                "expires_in": expires_in,
            }.items()
            if v is not None
        }
        headers = {"content-type": "application/octet-stream"}
        if size is not None:
            headers["content-length"] = str(size)
        if name:
            headers["content-disposition"] = f"attachment; filename*=UTF-8''{quote(name)}"
        response = await self.http.post(f"{self.server}/v1/files", params=params, headers=headers, content=hashed())
        await raise_for_error(response)
        descriptor = load_descriptor(response.content)
        if not isinstance(descriptor, FileContent):
            raise InvalidDescriptor("server did not answer with a FileContent descriptor")
        local = sha.hexdigest()
        if descriptor.checksum is None or checksum_hex(descriptor.checksum) != local or descriptor.size != sent:
            file_id = (descriptor.metadata or {}).get("file_id")
            if file_id:
                await self.http.delete(f"{self.server}/v1/files/{file_id}")
            if descriptor.size != sent:
                raise SizeMismatch(f"sent {sent} bytes, server stored {descriptor.size}")
            raise ChecksumMismatch("server's checksum differs from the bytes sent", actual=descriptor.checksum)
        return descriptor

    async def upload_dedup(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        content_type: str | None = None,
        role: str | None = None,
        description: str | None = None,
        download_method: str | None = None,
        ttl: int | None = None,
        progress: Progress | None = None,
        expires_in: int | None = None,
        send_whole: Callable[[], Awaitable[FileContent]] | None = None,
    ) -> DedupOutcome | None:
        """Upload the file at ``path`` in content-defined chunks, sending only those the service lacks for this key
        (a new version of a file sends about what changed): its descriptor and what was sent; None when the server
        offers no chunked uploads (then upload another way). A file whose first chunks the key lacks is new: it
        goes whole at once, by ``send_whole`` (default: :meth:`upload`), and its chunks are indexed afterwards.
        See :mod:`transfer.client.dedup`."""
        doc = await offer(self.http, self.server)
        if doc is None:
            return None

        async def whole() -> FileContent:
            return await self.upload(
                path,
                name=name,
                content_type=content_type,
                role=role,
                description=description,
                download_method=download_method,
                ttl=ttl,
                inline=False,
                progress=progress,
                expires_in=expires_in,
            )

        return await upload_probed(
            self.http,
            self.server,
            path,
            doc,
            send_whole or whole,
            connections=self.options.connections,
            name=name,
            content_type=content_type,
            role=role,
            description=description,
            expires_in=expires_in,
            progress=progress,
            download_method=download_method,
            ttl=ttl,
        )

    async def resolve_cached(
        self,
        descriptor: FileContent | dict[str, Any] | str,
        dest: str | os.PathLike[str],
        cache: str | os.PathLike[str],
        *,
        cache_size: int | None = None,
    ) -> CachedResolve:
        """Resolve into ``dest`` keeping chunks in the directory ``cache``: of a file whose manifest the service
        gives, only the chunks the cache lacks are fetched (ranges); the whole file is SHA-256 verified as always.
        ``cache_size``: bytes the cache keeps at most afterwards (the least recently used chunks go)."""

        async def plain(d: FileContent, target: Path) -> None:
            await self.resolver.to_path(d, target)

        return await resolve_with_cache(
            self.http,
            descriptor,
            dest,
            ChunkCache(cache, cache_size),
            connections=self.options.connections,
            fallback=plain,
        )

    async def upload_chunked(
        self,
        path: str | os.PathLike[str],
        *,
        chunk_size: int | None = None,
        name: str | None = None,
        content_type: str | None = None,
        role: str | None = None,
        description: str | None = None,
        progress: Progress | None = None,
        remember: Path | None = None,
        on_session: Callable[[dict[str, Any]], None] | None = None,
        expires_in: int | None = None,
    ) -> FileContent:
        """Upload a file as a chunked session, ``connections`` chunks in parallel; with ``remember`` (a directory),
        a rerun after a crash resumes the same session and sends only the missing chunks."""
        source = Path(path)
        metadata = _about(source, name, content_type, role, description, expires_in)
        doc = await upload_chunked(
            self.http,
            self.server,
            source,
            options=ChunkOptions(connections=self.options.connections, retries=self.options.retries),
            chunk_size=chunk_size,
            metadata=metadata,
            progress=progress,
            remember=remember,
            on_session=on_session,
        )
        descriptor = load_descriptor(doc)
        assert isinstance(descriptor, FileContent)
        return descriptor

    async def upload_direct(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        content_type: str | None = None,
        role: str | None = None,
        description: str | None = None,
        progress: Progress | None = None,
        remember: Path | None = None,
        part_filter: PartFilter | None = None,
        on_part_stored: Callable[[int], None] | None = None,
        expires_in: int | None = None,
    ) -> FileContent:
        """Upload a file straight to the service's bucket (presigned part URLs, ``connections`` parts in parallel);
        the service verifies the whole SHA-256 and publishes. With ``remember`` (a directory), a rerun resumes the
        same plan and sends only the parts the bucket lacks. Raises DirectUploadUnsupported, having sent nothing,
        when the service's backend cannot take parts directly: use :meth:`upload` then."""
        source = Path(path)
        metadata = _about(source, name, content_type, role, description, expires_in)
        doc = await upload_direct(
            self.http,
            self.server,
            source,
            options=DirectOptions(connections=self.options.connections, retries=self.options.retries),
            metadata=metadata,
            progress=progress,
            remember=remember,
            part_filter=part_filter,
            on_part_stored=on_part_stored,
        )
        descriptor = load_descriptor(doc)
        assert isinstance(descriptor, FileContent)
        return descriptor

    async def upload_resumable(
        self,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        content_type: str | None = None,
        progress: Progress | None = None,
        remember: Path | None = None,
        expires_in: int | None = None,
        options: ResumableOptions | None = None,
    ) -> FileContent:
        """Upload a file with the IETF resumable upload protocol (:mod:`transfer.client.resumable`, interop
        version 9) to ``/v1/uploads``: created with its first bytes, resumed after a cut from the offset the service
        holds; with ``remember`` (a directory), a rerun after a crash resumes the same upload and sends only what the
        service lacks. The descriptor's SHA-256 is checked against the file's (a mismatch deletes the file)."""
        source = Path(path)
        headers = {
            "content-type": content_type or "application/octet-stream",
            "content-disposition": f"inline; filename*=UTF-8''{quote(name or source.name)}",
        }
        if expires_in is not None:
            headers["expires-in"] = str(expires_in)
        result = await upload_resumable(
            self.http,
            f"{self.server}/v1/uploads",
            source,
            headers=headers,
            options=options,
            progress=progress,
            remember=remember,
        )
        self.last_resumable = result
        descriptor = load_descriptor(result.body)
        if not isinstance(descriptor, FileContent):
            raise InvalidDescriptor("the service did not answer the completed upload with a FileContent descriptor")
        size = source.stat().st_size
        if descriptor.checksum is None or checksum_hex(descriptor.checksum) != result.sha256 or descriptor.size != size:
            file_id = (descriptor.metadata or {}).get("file_id")
            if file_id:  # what the service published is not this file (changed while it was sent): withdraw it
                await self.http.delete(f"{self.server}/v1/files/{file_id}")
            raise ChecksumMismatch(
                "the published file's SHA-256 differs from the local file's (was it changed while uploading?)",
                expected="sha256:" + result.sha256,
                actual=str(descriptor.checksum),
            )
        return descriptor

    async def session_descriptor(self, session_id: str, ttl: int | None = None) -> FileContent:
        """The live streaming descriptor of a session (its size must be known): readers follow it while chunks
        arrive, or resolve it once complete."""
        params = {"ttl": str(ttl)} if ttl is not None else None
        response = await self.http.get(f"{self.server}/v1/sessions/{quote(session_id)}/descriptor", params=params)
        await raise_for_error(response)
        descriptor = load_descriptor(response.json())
        assert isinstance(descriptor, FileContent)
        return descriptor

    async def session_status(self, session_id: str) -> dict[str, Any]:
        """Stored and missing chunks, bytes received, state and expiry of a session."""
        response = await self.http.get(f"{self.server}/v1/sessions/{quote(session_id)}")
        await raise_for_error(response)
        status: dict[str, Any] = response.json()
        return status

    def follow_job(self, job_id: str, **kwargs: Any) -> AsyncIterator[JobEvent]:
        """The AIFlowy progress events of an upload (its ``job_id``), a session (its id) or an import."""
        return follow_job(self.http, f"{self.server}/v1/jobs/{quote(job_id)}/events", **kwargs)

    async def import_descriptor(self, descriptor: FileContent | dict[str, Any], job_id: str | None = None) -> str:
        """Ask the service to fetch a descriptor's content itself and store it; returns the job id to follow."""
        doc = descriptor.to_json() if isinstance(descriptor, FileContent) else descriptor
        body: dict[str, Any] = {"descriptor": doc}
        if job_id is not None:
            body["job_id"] = job_id
        response = await self.http.post(f"{self.server}/v1/imports", json=body)
        await raise_for_error(response)
        return str(response.json()["job_id"])

    async def describe(self, file_id: str, **params: Any) -> FileContent:
        """A fresh descriptor (new signed URL) for a stored file."""
        response = await self.http.get(f"{self.server}/v1/files/{quote(file_id)}", params=params)
        await raise_for_error(response)
        descriptor = load_descriptor(response.content)
        assert isinstance(descriptor, FileContent)
        return descriptor

    async def list_files(self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """One page of stored files (the key's own; all for admin) in file-id order: ``{"files": [descriptor
        JSON...], "next_cursor": str | None}``; pass ``next_cursor`` back for the next page (None: the end)."""
        params: dict[str, Any] = {}
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        response = await self.http.get(f"{self.server}/v1/files", params=params)
        await raise_for_error(response)
        page: dict[str, Any] = response.json()
        return page

    async def iter_files(self, limit: int | None = None, cursor: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Every stored file the key may see, page after page from ``cursor`` (each once, in file-id order)."""
        while True:
            page = await self.list_files(limit, cursor)
            for item in page["files"]:
                yield item
            cursor = page.get("next_cursor")
            if cursor is None:
                return

    async def delete(self, file_id: str) -> None:
        response = await self.http.delete(f"{self.server}/v1/files/{quote(file_id)}")
        await raise_for_error(response)

    async def usage(self) -> dict[str, Any]:
        """This key's stored bytes, files, bytes reserved by unfinished uploads, quota and what is left."""
        return await self._get_json("/v1/usage")

    async def admin_files(
        self, *, limit: int = 1000, cursor: str | None = None, owner: str | None = None
    ) -> dict[str, Any]:
        """Admin: one page of stored files of every key (``files``, ``next_cursor``: None on the last page)."""
        params = {k: v for k, v in {"limit": limit, "cursor": cursor, "owner": owner}.items() if v is not None}
        return await self._get_json("/v1/admin/files", params)

    async def admin_usage(self) -> dict[str, Any]:
        """Admin: usage of every configured key."""
        return await self._get_json("/v1/admin/usage")

    async def repair_usage(self, *, fix: bool = False) -> dict[str, Any]:
        """Admin: every key's usage recounted from the file records (``keys``: recorded, counted, differs, fixed,
        busy); with ``fix``, differing ledgers are set to the count."""
        response = await self.http.post(f"{self.server}/v1/admin/usage/repair", params={"fix": str(fix).lower()})
        await raise_for_error(response)
        doc: dict[str, Any] = response.json()
        return doc

    async def gc(self) -> dict[str, int]:
        """Admin: run every sweep now; how many objects each removed (-1: that sweep failed, see the log)."""
        response = await self.http.post(f"{self.server}/v1/admin/gc")
        await raise_for_error(response)
        removed: dict[str, int] = response.json()["removed"]
        return removed

    async def _get_json(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        response = await self.http.get(f"{self.server}{path}", params=params)
        await raise_for_error(response)
        doc: dict[str, Any] = response.json()
        return doc

    async def resolve(
        self,
        descriptor: Descriptor | str | dict[str, Any],
        dest: str | os.PathLike[str] | None = None,
        progress: Progress | None = None,
    ) -> bytes | Path:
        """Resolve into ``dest`` (returns the path) or, without ``dest``, into memory (returns the bytes)."""
        if not isinstance(descriptor, FileContent | ContentBundle) and isinstance(descriptor, str | dict):
            descriptor = load_descriptor(descriptor)
        if isinstance(descriptor, ContentBundle):
            if dest is None:
                raise InvalidDescriptor("a bundle resolves into a directory: give dest")
            await self.resolver.bundle_to_dir(descriptor, dest)
            return Path(dest)
        if dest is None:
            return await self.resolver.to_bytes(descriptor)
        return await self.resolver.to_path(descriptor, dest, progress)

    async def create_bundle(
        self, items: list[dict[str, Any]], *, name: str | None = None, description: str | None = None
    ) -> ContentBundle:
        """A ContentBundle of stored files (``{"role", "file_id"}``) and inline content (``{"role", "content"}``)."""
        response = await self.http.post(
            f"{self.server}/v1/bundles", json={"items": items, "name": name, "description": description}
        )
        await raise_for_error(response)
        bundle = load_descriptor(response.content)
        assert isinstance(bundle, ContentBundle)
        return bundle

    def stream(self, descriptor: FileContent) -> AsyncIterator[bytes]:
        """The original bytes as an async stream, verified when it ends."""
        return self.resolver.stream(descriptor)


class TransferClient:
    """Blocking twin of :class:`AsyncTransferClient` (runs it on a private event loop thread)."""

    def __init__(self, server: str = DEFAULT_SERVER, **kwargs: Any) -> None:
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._client = self._portal.call(_make_client, server, kwargs)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            return await fn(*args, **kwargs)

        return self._portal.call(run)

    def upload(self, source: str | os.PathLike[str] | bytes | IO[bytes], **kwargs: Any) -> FileContent:
        result: FileContent = self._call(self._client.upload, source, **kwargs)
        return result

    def upload_dedup(self, path: str | os.PathLike[str], **kwargs: Any) -> DedupOutcome | None:
        """:meth:`AsyncTransferClient.upload_dedup`: only the chunks the service lacks; None without its offer."""
        result: DedupOutcome | None = self._call(self._client.upload_dedup, path, **kwargs)
        return result

    def upload_resumable(self, path: str | os.PathLike[str], **kwargs: Any) -> FileContent:
        """:meth:`AsyncTransferClient.upload_resumable`: the IETF resumable upload protocol."""
        result: FileContent = self._call(self._client.upload_resumable, path, **kwargs)
        return result

    def describe(self, file_id: str, **params: Any) -> FileContent:
        result: FileContent = self._call(self._client.describe, file_id, **params)
        return result

    def delete(self, file_id: str) -> None:
        self._call(self._client.delete, file_id)

    def list_files(self, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._call(self._client.list_files, limit, cursor)
        return result

    def resolve(
        self, descriptor: Descriptor | str | dict[str, Any], dest: str | os.PathLike[str] | None = None
    ) -> bytes | Path:
        result: bytes | Path = self._call(self._client.resolve, descriptor, dest)
        return result

    def usage(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call(self._client.usage)
        return result

    def close(self) -> None:
        try:
            self._call(self._client.aclose)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> TransferClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ServerBearer(httpx.Auth):
    """The API key goes to the service's own URLs only — never to signed URLs elsewhere (S3, other hosts)."""

    def __init__(self, server: str, api_key: str) -> None:
        self._prefix = server + "/"
        self._value = f"Bearer {api_key}"

    def auth_flow(self, request: httpx.Request) -> Any:
        if str(request.url).startswith(self._prefix):
            request.headers["authorization"] = self._value
        yield request


async def _make_client(server: str, kwargs: dict[str, Any]) -> AsyncTransferClient:
    return AsyncTransferClient(server, **kwargs)


async def _file_chunks(path: Path, size: int) -> AsyncIterator[bytes]:
    f = await asyncio.to_thread(open, path, "rb")
    try:
        while chunk := await asyncio.to_thread(f.read, size):
            yield chunk
    finally:
        f.close()


async def _bytes_chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), size):
        yield bytes(view[start : start + size])


async def _fileobj_chunks(f: IO[bytes], size: int) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(f.read, size):
        yield chunk


async def _aiter(source: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for chunk in source:
        yield bytes(chunk)


def _about(
    source: Path,
    name: str | None,
    content_type: str | None,
    role: str | None,
    description: str | None,
    expires_in: int | None,
) -> dict[str, Any]:
    """What a chunked session or a direct plan is told about the file (only what was given; the name defaults to
    the file's)."""
    given = {
        "name": name or source.name,
        "content_type": content_type,
        "role": role,
        "description": description,
        "expires_in": expires_in,
    }
    return {k: v for k, v in given.items() if v is not None}
