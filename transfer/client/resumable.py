"""Resumable Uploads for HTTP (draft-ietf-httpbis-resumable-upload, interop version 9) on the client side: one file
to any server that speaks the draft. Nothing here knows this service: the caller names the resource that creates
uploads and reads the final response itself (:meth:`AsyncTransferClient.upload_resumable` does for this service).

    OPTIONS target          the limits (Upload-Limit) before a byte is sent (§"Limits": a client can discover them)
    POST target             creation with the first bytes: Upload-Complete, Upload-Length, Expect: 100-continue, and
                            the content up to max-append-size (all of it when there is none); the 104's Location is
                            written to the state file before the body goes, so a killed process can resume
    HEAD location           after a cut, or on the next run: the offset the server holds (Upload-Offset)
    PATCH location          application/partial-upload from that offset, each append within the append limits
    DELETE location         when the upload cannot go on within the limits (max-size; the file changed)

The creation request is written with h11 on a connection of its own: httpx (httpcore) drops interim responses, and
the ``104`` is the one place the Location arrives before the body. The other requests go through the caller's
httpx client (its auth, timeouts, TLS settings and proxies). Every request carries
``Upload-Draft-Interop-Version: 9``; a 104 of another version is ignored (appendix "Draft Version Identification").

The whole file's SHA-256 is computed on a thread while the bytes go (a resumed upload reads the file whole again,
locally) and compared with a ``Repr-Digest`` the final response carries (``Want-Repr-Digest`` asks for it).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import h11
import httpx

from transfer.client.chunks import _read_range, _sha256_file, _state_key, write_atomically
from transfer.client.interim import ExchangeCut, exchange
from transfer.core.http.digests import format_digest_field
from transfer.core.http.resumable import (
    CURRENT_VERSION,
    INTEROP_HEADER,
    PARTIAL_UPLOAD,
    UploadLimits,
    boolean_item,
    integer_item,
    interop_version,
    parse_upload_limit,
    serialize_boolean,
)
from transfer.errors import (
    ChecksumMismatch,
    Gone,
    InvalidRequest,
    NotFound,
    RemoteError,
    TooLarge,
    TransferError,
    errors_by_code,
)

Progress = Callable[[int, int | None], None]
VERSION = {INTEROP_HEADER: str(CURRENT_VERSION)}


@dataclass(frozen=True, slots=True)
class ResumableOptions:
    retries: int = 5  # attempts after a cut or a 5xx, per request
    wait_for_interim: float = 1.0  # seconds the creation waits for 104 / 100 Continue before sending its body
    ssl_context: ssl.SSLContext | None = None  # for an https creation request (default: the system's CAs)


@dataclass(slots=True)
class ResumableResult:
    """The final response of the upload (from the resource that processed the representation), and what it took."""

    status: int
    headers: httpx.Headers
    body: bytes
    location: str | None  # the upload resource (None: the server offered no resumption)
    sha256: str  # hex SHA-256 of the file as read while uploading
    sent: int = 0  # content bytes this call sent
    resumed_from: int | None = None  # the offset this call resumed at (None: it created the upload)
    requests: list[str] = field(default_factory=list)  # methods of the requests that carried content, in order


class _Cut(Exception):
    """The connection ended (or answered 5xx) before a final response: resume if the Location is known."""


@dataclass(slots=True)
class _Upload:
    location: str | None
    offset: int
    limits: UploadLimits
    final: httpx.Response | None = None


def _state_file(remember: Path | None, path: Path, target: str) -> Path | None:
    return remember / f"ietf-{_state_key(path, target)}.json" if remember else None


def _remembered(state_file: Path | None) -> tuple[str, float | None] | None:
    if state_file is None or not state_file.exists():
        return None
    try:
        doc = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return None
    location, expires = doc.get("location"), doc.get("expires_at")
    if not isinstance(location, str) or not isinstance(expires, int | float | None):
        return None
    return location, expires


def _remember(state_file: Path | None, path: Path, location: str, limits: UploadLimits) -> None:
    if state_file is None:
        return
    expires = None if limits.max_age is None else time.time() + limits.max_age
    doc = {"location": location, "path": str(path), "expires_at": expires}
    write_atomically(state_file, json.dumps(doc).encode())


def _limits(headers: httpx.Headers | h11.Response | h11.InformationalResponse, known: UploadLimits) -> UploadLimits:
    value = _header(headers, "upload-limit")
    announced = parse_upload_limit(value)
    return known if announced is None else announced


def _header(message: httpx.Headers | h11.Response | h11.InformationalResponse, name: str) -> str | None:
    if isinstance(message, httpx.Headers):
        value = message.get(name)
        return None if value is None else str(value)
    for key, value in message.headers:
        if key.decode("latin-1").lower() == name:
            return value.decode("latin-1")
    return None


def error_of(response: httpx.Response) -> TransferError:
    """The error an error response stands for: this service's ``code`` when the problem document (RFC 9457) or
    JSON error body names one, else one chosen by status."""
    payload: Any = None
    try:
        payload = response.json()
    except ValueError:
        pass
    if isinstance(payload, dict):
        inner = payload.get("error")
        body: dict[str, Any] = inner if isinstance(inner, dict) else payload
        cls = errors_by_code().get(str(body.get("code")))
        message = str(body.get("detail") or body.get("message") or body.get("title") or f"HTTP {response.status_code}")
        if cls is not None:
            return cls(message)
    by_status: dict[int, type[TransferError]] = {400: InvalidRequest, 404: NotFound, 410: Gone, 413: TooLarge}
    cls = by_status.get(response.status_code, RemoteError)
    return cls(f"{response.request.method} {response.url} answered {response.status_code}: {response.text[:200]}")


async def upload_resumable(
    http: httpx.AsyncClient,
    target: str,
    path: Path,
    *,
    headers: dict[str, str] | None = None,
    options: ResumableOptions | None = None,
    progress: Progress | None = None,
    remember: Path | None = None,
) -> ResumableResult:
    """Upload the file at ``path`` to the resource ``target`` as a resumable upload, resuming the upload remembered
    for this file under ``remember`` (a directory) when there is one, and return the final response. ``headers``
    go with the creation request only (the representation's metadata: Content-Type, Content-Disposition...).

    Raises TooLarge (nothing sent) when the file is above the server's ``max-size``, SizeMismatch when the file
    changed under the upload, ChecksumMismatch when the server's ``Repr-Digest`` is not the file's, and the error
    a 4xx response stands for; a cut connection or a 5xx is resumed, ``options.retries`` times in a row."""
    options = options or ResumableOptions()
    size = path.stat().st_size
    state_file = _state_file(remember, path, target)
    hashing = asyncio.ensure_future(asyncio.to_thread(_sha256_file, path, size))
    try:
        result = await _upload(http, target, path, size, headers or {}, options, progress, state_file)
        result.sha256 = await hashing
    finally:
        if not hashing.done():
            hashing.cancel()  # the thread finishes its read; nobody waits for it
    digest = result.headers.get("repr-digest")
    if digest and "sha-256=" in digest and format_digest_field(result.sha256) not in digest:
        raise ChecksumMismatch(
            f"the server's Repr-Digest {digest[:100]!r} is not the SHA-256 of {path}",
            expected="sha256:" + result.sha256,
        )
    if state_file is not None:
        state_file.unlink(missing_ok=True)
    return result


async def _upload(
    http: httpx.AsyncClient,
    target: str,
    path: Path,
    size: int,
    headers: dict[str, str],
    options: ResumableOptions,
    progress: Progress | None,
    state_file: Path | None,
) -> ResumableResult:
    result = ResumableResult(status=0, headers=httpx.Headers(), body=b"", location=None, sha256="")
    upload: _Upload | None = None
    remembered = _remembered(state_file)
    if remembered is not None:
        kept, expires = remembered
        if expires is not None and time.time() >= expires:
            await _cancel(http, kept)  # past its max-age: the server may have dropped it already
        else:
            upload = await _retrieve(http, kept, size, UploadLimits(), options)
            if upload is None and state_file is not None:
                state_file.unlink(missing_ok=True)  # gone, or not this file's: start afresh
            elif upload is not None:
                result.resumed_from = upload.offset
    if upload is None:
        limits = await _discover(http, target)
        if limits.max_size is not None and size > limits.max_size:
            raise TooLarge(f"{path} has {size} bytes, above the server's max-size {limits.max_size}")

        def located(found: _Upload) -> None:
            assert found.location is not None
            _remember(state_file, path, found.location, found.limits)  # before the body: a killed run resumes

        upload = await _create_with_retries(
            http, target, path, size, headers, limits, options, progress, result, located
        )
        if upload.location is not None and upload.final is None:
            located(upload)
    failures = 0
    while upload.final is None:
        location = upload.location
        assert location is not None
        if upload.limits.max_size is not None and size > upload.limits.max_size:
            await _cancel(http, location)
            raise TooLarge(f"{path} has {size} bytes, above the server's max-size {upload.limits.max_size}")
        try:
            upload = await _append(http, upload, path, size, progress, result)
            failures = 0
        except _Cut as cut:
            failures += 1
            if failures > options.retries:
                raise RemoteError(f"the upload to {location} failed {failures} times in a row: {cut}") from cut
            await asyncio.sleep(min(0.2 * 2**failures, 5.0))
            retrieved = await _retrieve(http, location, size, upload.limits, options)
            if retrieved is None:
                raise Gone(f"the upload {location} is gone") from cut
            upload = retrieved
    final = upload.final
    result.status, result.headers, result.body, result.location = (
        final.status_code,
        final.headers,
        final.content,
        upload.location,
    )
    if final.status_code >= 400:
        raise error_of(final)
    return result


async def _discover(http: httpx.AsyncClient, target: str) -> UploadLimits:
    """The limits an OPTIONS request announces (none when it fails: the 104 and responses tell them later)."""
    try:
        response = await http.options(target, headers=VERSION)
    except httpx.TransportError:
        return UploadLimits()
    return _limits(response.headers, UploadLimits()) if response.status_code < 300 else UploadLimits()


async def _cancel(http: httpx.AsyncClient, location: str) -> None:
    """Cancel the upload (§"Upload Cancellation"); a failure is not the caller's problem: it expires anyway."""
    try:
        await http.delete(location, headers=VERSION)
    except httpx.TransportError:
        pass


async def _retrieve(
    http: httpx.AsyncClient, location: str, size: int, limits: UploadLimits, options: ResumableOptions
) -> _Upload | None:
    """The upload's state (§"Offset Retrieval"), retried after cuts and 5xx; None when it is gone, or is not an
    upload of this file (then it is cancelled)."""
    attempt = 0
    while True:
        try:
            response = await http.head(location, headers=VERSION)
            if response.status_code < 500:
                break
        except httpx.TransportError:
            pass
        attempt += 1
        if attempt > options.retries:
            raise RemoteError(f"the offset of {location} could not be retrieved in {attempt} attempts")
        await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
    if response.status_code in (404, 410):
        return None
    if response.status_code >= 300:
        raise error_of(response)
    offset = integer_item(response.headers.get("upload-offset"))
    length = integer_item(response.headers.get("upload-length"))
    if offset is None or offset > size or (length is not None and length != size):
        # §"Offset Retrieval": data the client cannot provide at that offset -- the upload has failed
        await _cancel(http, location)
        return None
    upload = _Upload(location, offset, _limits(response.headers, limits))
    if boolean_item(response.headers.get("upload-complete")) is True:
        # complete, its final response lost: a valid append to it has the server replay that response
        upload.final = await _replay(http, location, offset)
    return upload


async def _replay(http: httpx.AsyncClient, location: str, offset: int) -> httpx.Response:
    response = await http.patch(
        location,
        headers={
            **VERSION,
            "upload-offset": str(offset),
            "upload-complete": "?1",
            "content-type": PARTIAL_UPLOAD,
            "content-length": "0",
        },
    )
    if boolean_item(response.headers.get("upload-complete")) is not True:
        raise RemoteError(f"the upload {location} is complete, but its final response was lost and not replayed")
    return response


def _append_size(limits: UploadLimits, remaining: int) -> int:
    """Bytes for the next creation or append request: the rest when the limits allow (§"Incremental": fewer, longer
    requests), else ``max-append-size``, which is at least ``min-append-size`` (only the last may be smaller)."""
    if limits.max_append_size is not None:
        return min(remaining, max(1, limits.max_append_size))
    return remaining


async def _append(
    http: httpx.AsyncClient, upload: _Upload, path: Path, size: int, progress: Progress | None, result: ResumableResult
) -> _Upload:
    """One append from the upload's offset (§"Upload Append"); the upload as the response leaves it."""
    assert upload.location is not None
    offset = upload.offset
    length = _append_size(upload.limits, size - offset)
    completes = offset + length == size
    sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        async for piece in _read_range(path, offset, length):
            sent += len(piece)
            result.sent += len(piece)
            if progress:
                progress(offset + sent, size)
            yield piece

    result.requests.append("PATCH")
    try:
        response = await http.patch(
            upload.location,
            content=body(),
            headers={
                **VERSION,
                "upload-offset": str(offset),
                "upload-complete": serialize_boolean(completes),
                "upload-length": str(size),
                "content-type": PARTIAL_UPLOAD,
                "content-length": str(length),
            },
        )
    except httpx.TransportError as exc:
        raise _Cut(str(exc) or type(exc).__name__) from exc
    limits = _limits(response.headers, upload.limits)
    complete = boolean_item(response.headers.get("upload-complete"))
    if response.status_code >= 500 and complete is not True:
        raise _Cut(f"PATCH answered {response.status_code}")
    if complete is True or response.status_code >= 400 and response.status_code not in (409, 413):
        return replace(upload, limits=limits, final=response)
    if response.status_code == 409:  # §"Upload Append": the offset the server holds is in Upload-Offset
        held = integer_item(response.headers.get("upload-offset"))
        if held is None:  # another request to this upload won a race (a request of ours the server still ran)
            raise _Cut("409 without an offset: retrieve it")
        if held > size:
            return replace(upload, limits=limits, final=response)
        return replace(upload, offset=held, limits=limits)
    if response.status_code == 413:  # §"Limits": retry smaller, within the limits the response announces
        if limits.max_append_size is not None and limits.max_append_size < length:
            return replace(upload, limits=limits)
        floor = limits.min_append_size or 1
        if length // 2 < floor:  # nothing smaller is allowed: a deployment mismatch, not recoverable here
            return replace(upload, limits=limits, final=response)
        return replace(upload, limits=replace(limits, max_append_size=length // 2))
    held = integer_item(response.headers.get("upload-offset"))
    return replace(upload, offset=offset + sent if held is None else held, limits=limits)


async def _create_with_retries(
    http: httpx.AsyncClient,
    target: str,
    path: Path,
    size: int,
    headers: dict[str, str],
    limits: UploadLimits,
    options: ResumableOptions,
    progress: Progress | None,
    result: ResumableResult,
    located: Callable[[_Upload], None],
) -> _Upload:
    """The creation request, sent again (whole) when it is cut before the server told where the upload is; once it
    did (a 104), a cut is resumed from the offset the server holds."""
    attempt = 0
    while True:
        try:
            return await _create(http, target, path, size, headers, limits, options, progress, result, located)
        except _Located as cut:
            assert cut.upload.location is not None
            retrieved = await _retrieve(http, cut.upload.location, size, cut.upload.limits, options)
            if retrieved is None:
                raise Gone(f"the upload {cut.upload.location} is gone") from None
            return retrieved
        except _Cut as cut:
            attempt += 1
            if attempt > options.retries:
                raise RemoteError(f"creating the upload at {target} failed {attempt} times: {cut}") from cut
            await asyncio.sleep(min(0.2 * 2**attempt, 5.0))


class _Located(Exception):
    """Cut after the 104 named the upload resource: resume it."""

    def __init__(self, upload: _Upload) -> None:
        super().__init__(upload.location)
        self.upload = upload


async def _create(
    http: httpx.AsyncClient,
    target: str,
    path: Path,
    size: int,
    headers: dict[str, str],
    limits: UploadLimits,
    options: ResumableOptions,
    progress: Progress | None,
    result: ResumableResult,
    located: Callable[[_Upload], None],
) -> _Upload:
    """One creation request with the first bytes (§"Upload Creation"), on an HTTP/1.1 connection of its own;
    ``located`` is told the upload as soon as a 104 names it."""
    length = _append_size(limits, size)
    completes = length == size
    request = http.build_request(
        "POST",
        target,
        headers={
            **headers,
            **VERSION,
            "upload-complete": serialize_boolean(completes),
            "upload-length": str(size),
            "content-length": str(length),
            "want-repr-digest": "sha-256=10",
            "expect": "100-continue",
        },
    )
    if http.auth is not None:  # what httpx would add itself (a single-step auth flow: bearer, basic)
        request = await http.auth.async_auth_flow(request).__anext__()
    found = _Upload(None, 0, limits)

    def interim(event: h11.InformationalResponse) -> bool:
        # appendix "Draft Version Identification": a 104 of another interop version is ignored
        if event.status_code != 104 or interop_version(_header(event, INTEROP_HEADER)) != CURRENT_VERSION:
            return event.status_code == 100
        where = _header(event, "location")
        if where is not None and found.location is None:
            found.location = urljoin(str(request.url), where)
            found.limits = _limits(event, found.limits)
            located(found)
        return True

    done = 0

    def sent(n: int) -> None:
        nonlocal done
        done += n
        result.sent += n
        if progress:
            progress(done, size)

    result.requests.append("POST")
    try:
        response, body = await exchange(
            request,
            path,
            length,
            timeout=http.timeout,
            ssl_context=options.ssl_context,
            wait=options.wait_for_interim,
            interim=interim,
            sent=sent,
        )
    except ExchangeCut as exc:
        if found.location is not None:
            raise _Located(found) from None
        raise _Cut(str(exc)) from None
    limits = _limits(response, found.limits)
    location = _header(response, "location")
    if location is not None:
        location = urljoin(str(request.url), location)
    final = httpx.Response(response.status_code, headers=list(response.headers), content=body, request=request)
    complete = boolean_item(final.headers.get("upload-complete"))
    if complete is True or (final.status_code < 500 and (final.status_code >= 300 or complete is None)):
        # processed (or refused) by the resource, or a server that offered no resumption: that is the answer
        return _Upload(found.location or location, size, limits, final)
    if final.status_code >= 500:
        if found.location is None:
            raise _Cut(f"creation answered {final.status_code}")
        raise _Located(found)
    if found.location is not None and location is not None and location != found.location:
        # §"Upload Creation": interim and final Location must be identical; a client SHOULD verify
        await _cancel(http, found.location)
        raise RemoteError(f"the 104 named {found.location}, the final response {location}")
    where = found.location or location
    if where is None:
        raise RemoteError(f"the creation at {target} answered {final.status_code} without the upload's Location")
    offset = integer_item(final.headers.get("upload-offset"))
    return _Upload(where, length if offset is None else offset, limits)
