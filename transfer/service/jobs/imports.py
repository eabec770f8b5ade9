"""Server-side resolve ("import"): the service fetches a descriptor's content itself and stores it as a new file.

Used by ``POST /v1/imports``, TP ``resource_mount`` of a foreign url-mode resource and the MCP tools. The fetch is
SSRF-guarded (:mod:`transfer.service.jobs.fetch`), capped at ``max_upload_size``, and goes through the same ingest
pipeline as an upload: the descriptor's ``checksum``, ``size`` and ``encoded_size`` are verified (and the sizes are
cut-offs: nothing is read past them) before anything is published.
Progress is reported to the job (``GET /v1/jobs/{id}/events``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pybase64

from transfer.core.auth import Grant
from transfer.core.model.content import (
    CodeContent,
    ContentBundle,
    ContentEncoding,
    DownloadMethod,
    FileContent,
    JSONContent,
    TextContent,
    TransferMode,
    load_descriptor,
)
from transfer.core.numerals import decimal
from transfer.core.uploads.state import FileIntent
from transfer.errors import (
    InvalidDescriptor,
    RemoteError,
    TooLarge,
    TransferError,
    UpstreamTimeout,
    error_from_payload,
)
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.records import FileRecord
from transfer.service.files.service import FileService
from transfer.service.jobs.fetch import DestinationPolicy, GuardedTransport
from transfer.service.jobs.progress import Job, ProgressHub, counted

log = logging.getLogger("transfer.imports")


class ImportService:
    """Server-side imports: fetch a URL (SSRF-guarded), stream it into a new file through the same ingest as an
    upload, and report its progress as a job."""

    def __init__(self, files: FileService, hub: ProgressHub, *, transport: httpx.AsyncBaseTransport | None = None):
        self.files = files
        self.hub = hub
        s = files.settings
        self.policy = DestinationPolicy.from_cidrs(s.fetch_allow_networks)
        self._transport = transport
        # set by the host (transfer.api.ownurls): what reads the service's own signed URLs in-process, around the
        # guarded transport
        self.wrap_transport: Callable[[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def http_client(self) -> httpx.AsyncClient:
        """An httpx client whose every connection (and redirect) is checked against the destination policy; the
        service's own signed URLs are read in-process when the host allows it (:attr:`wrap_transport`)."""
        s = self.files.settings
        transport: httpx.AsyncBaseTransport = self._transport or GuardedTransport(self.policy)
        if self.wrap_transport is not None:
            transport = self.wrap_transport(transport)
        return httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(s.fetch_timeout, connect=min(10.0, s.fetch_timeout)),
            follow_redirects=True,
            max_redirects=s.fetch_max_redirects,
            headers={"accept-encoding": "identity", "user-agent": "transfer-import"},
        )

    @staticmethod
    def parse(document: Any, inline_threshold: int) -> FileContent:
        """The FileContent ``document`` describes (InvalidDescriptor for a bundle, inline text/JSON/code, or a malformed
        descriptor)."""
        descriptor = load_descriptor(document, inline_threshold=inline_threshold)
        if isinstance(descriptor, ContentBundle):
            raise InvalidDescriptor("import one FileContent at a time (bundle items one by one)")
        if isinstance(descriptor, TextContent | JSONContent | CodeContent):
            raise InvalidDescriptor("only FileContent is imported; text, JSON and code travel inline")
        if descriptor.type is TransferMode.STREAMING:
            raise InvalidDescriptor(
                "streaming descriptors are followed by clients (transfer resolve --follow); import the url-mode "
                "descriptor of the completed file"
            )
        return descriptor

    async def start(self, descriptor: FileContent, base_url: str, caller: Grant, *, job_id: str | None = None) -> Job:
        """Begin importing in the background for the caller's key (the job and the file are its own); the job
        reports progress and the new descriptor. Returns once the job is recorded, so that the id it returns can
        be followed from any replica at once."""
        job = self.hub.open(job_id or self.hub.new_id("j"), "import", owner=caller.owner)
        job.start(descriptor.name, descriptor.size)
        task = asyncio.create_task(self._run(job, descriptor, base_url, caller))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await job.recorded()
        return job

    async def _run(self, job: Job, descriptor: FileContent, base_url: str, caller: Grant) -> None:
        try:
            record = await self.fetch_and_store(descriptor, caller, job)
            # url mode always: the job (kept, replayed, journalled) holds no bytes of a file that may be deleted
            result = await self.files.describe(record, base_url, inline=False)
            job.succeed({"file_id": record.id, "descriptor": result.to_json()})
        except TransferError as exc:
            job.fail(exc)
        except Exception:  # a bug must not leave the job running forever
            log.exception("import %s failed", job.id)
            job.fail(TransferError("internal error; see the server log"))

    async def fetch_and_store(self, descriptor: FileContent, caller: Grant, job: Job | None = None) -> FileRecord:
        """Fetch (or decode, for inline) and store as the caller's file; the descriptor's checksum and size are
        verified."""
        request = UploadRequest(
            owner=caller.owner,
            intent=FileIntent(
                name=descriptor.name,
                content_type=descriptor.content_type,
                role=descriptor.role,
                description=descriptor.description,
            ),
            checksum=descriptor.checksum,
            expected_size=descriptor.size,
        )
        if descriptor.type is TransferMode.INLINE:
            assert descriptor.data is not None
            data = pybase64.b64decode(descriptor.data, validate=False)
            return await self.files.upload(_one(data, job), request, source="import")
        encoding = descriptor.encoding or ContentEncoding.NONE
        if encoding is ContentEncoding.BASE64:
            raise InvalidDescriptor("base64 encoding is for inline data only")
        request.body_encoding = request.store_encoding = encoding
        if encoding is not ContentEncoding.NONE:
            request.declared_length = descriptor.encoded_size  # a cut-off too: no reading past it
        assert descriptor.url is not None
        method = "POST" if descriptor.download_method is DownloadMethod.POST else "GET"
        max_size = self.files.settings.max_upload_size
        try:
            async with self.http_client() as http, http.stream(method, descriptor.url) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise _upstream_error(response)
                length = response.headers.get("content-length")
                if length and (decimal(length.strip()) or 0) > max_size:
                    raise TooLarge(f"the resource is {length} bytes; the limit is {max_size}", limit=max_size)
                if response.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
                    got = response.headers["content-encoding"]
                    if encoding is ContentEncoding.NONE or got.lower() != encoding.value:
                        raise RemoteError(f"the server sent Content-Encoding {got!r}, the descriptor says {encoding}")
                body = response.aiter_raw()
                if job is not None:
                    body = counted(body, job)
                return await self.files.upload(body, request, source="import")
        except httpx.InvalidURL as exc:  # a redirect, or a URL built without the descriptor's validation
            raise InvalidDescriptor(f"the resource's URL cannot be fetched: {exc}") from None
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"fetching {descriptor.name!r} timed out ({type(exc).__name__})") from None
        except httpx.TooManyRedirects:
            raise RemoteError(f"more than {self.files.settings.fetch_max_redirects} redirects") from None
        except httpx.HTTPError as exc:
            raise RemoteError(f"fetching {descriptor.name!r} failed: {exc}") from None

    async def close(self) -> None:
        """Cancel the imports still running and wait until they have stopped."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _one(data: bytes, job: Job | None) -> AsyncIterator[bytes]:
    if job is not None:
        job.advance(len(data))
    yield data


def _upstream_error(response: httpx.Response) -> TransferError:
    try:
        inner = error_from_payload(response.status_code, response.json())
    except ValueError:
        inner = None
    message = f"the resource's server answered HTTP {response.status_code}"
    if inner is not None and inner.code != "remote_error":
        message += f" ({inner.code}: {inner.message})"
    return RemoteError(message, upstream_status=response.status_code)
