"""S3-compatible backend (AWS S3, MinIO, Cloudflare R2, Ceph RGW, Swift's s3api) on boto3.

Layout in the bucket, under an optional prefix::

    data/<key>         the bytes; multipart uploads for anything of at least one part, PutObject below that
    meta/<key>.json    the metadata, written before the bytes are published

Publishing: parts are uploaded while the bytes arrive (at most ``part_buffers`` parts in flight per upload, each of
the planned part size, and every part buffer of every upload taken from one process-wide ``buffer_budget``, so
concurrency cannot multiply them: see :mod:`storage.budget`), then the metadata object is written, then
CompleteMultipartUpload (or the PutObject of a small object) makes the bytes visible. Abort — on any failure,
cancellation or a failed verification upstream — aborts the multipart upload, so no orphaned upload remains. Reads
pass the range to GetObject with ``If-Match`` on the ETag seen when the reader was opened, so a reader never mixes
two versions.

Compare-and-set: ``ObjectInfo.etag`` is the data object's ETag; ``create(key, if_match=etag)`` publishes the bytes
with ``If-Match`` on PutObject / CompleteMultipartUpload (AWS S3 since 2024, MinIO, Ceph RGW), then the metadata, so
a lost race changes nothing. Engines differ, so :meth:`S3Storage.start` probes the one it talks to
(:class:`~storage.s3_engine.EngineProfile`, whose module tabulates what each engine was seen to do) and uses what
works: the ETag quoted as returned (AWS, Ceph 20.2) or unquoted (Ceph 16 compares byte for byte with the ETag it
stores without quotes); where CompleteMultipartUpload ignores conditions (Ceph 16) a large create-if-absent claims
its key with a conditional PutObject of its metadata first, where it honours them (Ceph 20.2, AWS) the completion
alone decides; where UploadPartCopy ignores its source's condition (Ceph 16) the sources are checked by HEAD after
the copies. Where the engine has no conditional PUT (Swift's s3api answers 501) the ETag is compared by a HEAD just
before the put, under a per-key lock of this process, so the compare-and-set holds within one process but not
between replicas (no ATOMIC_IF_MATCH then: the service refuses to run as one of several replicas on it).

boto3 calls run in a thread pool of ``max_concurrency`` threads (the event loop never blocks); transient errors
(503 SlowDown, resets, timeouts) are retried by botocore's ``standard`` retry mode; every other error is translated
by one table into ``storage.errors``.

Bounded in time, not only in count: a retry is attempted only if it could end within ``call_budget`` seconds of the
call's start (its backoff plus one whole attempt, ``connect_timeout + read_timeout``, must fit), so a call to a
gateway that never answers fails — ``BackendUnavailable``, the service's 503 ``storage_unavailable`` — within
``call_budget`` (30 s by default: one 20 s read timeout and no second attempt), where botocore alone would spend up
to ``max_attempts`` × (connect + read timeout) plus its backoff (5 × 65 s). A call that keeps receiving bytes (a long
CompleteMultipartUpload with AWS's whitespace keep-alive) is not cut: the budget only refuses retries. The service
retries nothing but lost compare-and-set races, so it does not multiply this.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Literal, TypeVar

import boto3
import botocore.exceptions
from botocore.config import Config

from storage.base import (
    Capability,
    ObjectInfo,
    ObjectReader,
    PartUrl,
    ReaderContext,
    StoredPart,
    WriterContext,
    validate_key,
)
from storage.budget import ByteBudget
from storage.errors import (
    BackendUnavailable,
    ChecksumRejected,
    ObjectChanged,
    ObjectExists,
    ObjectNotFound,
    ObjectTooLarge,
    StorageError,
    StorageFull,
    Unsupported,
)
from storage.keyed import KeyedLocks
from storage.parts import MIN_PART_SIZE, plan_part_size
from storage.rules import S3Rules
from storage.s3_engine import IF_MATCH_FORMS, EngineProbe, EngineProfile, in_form, quoted, unquoted
from storage.s3_engine import response_status as _status

T = TypeVar("T")
MAX_PRESIGN_SECONDS = 7 * 24 * 3600  # SigV4 presigned URLs live at most 7 days
# a writer's buffer up to this size is outside the part-buffer budget (see S3Writer._reserve): at most this much per
# upload in flight comes on top of the budget (records and other small objects are far smaller)
UNBUDGETED = 256 << 10

# S3 error codes -> our storage errors (the s3fs errors.py idea); anything else is BackendUnavailable.
_ERROR_TABLE: dict[str, type[StorageError]] = {
    "NoSuchKey": ObjectNotFound,
    "404": ObjectNotFound,
    "NotFound": ObjectNotFound,
    "NoSuchUpload": ObjectNotFound,
    "EntityTooLarge": ObjectTooLarge,
    "EntityTooSmall": BackendUnavailable,
    "QuotaExceeded": StorageFull,
    "XMinioStorageFull": StorageFull,
    "InsufficientStorage": StorageFull,
    "BadDigest": ChecksumRejected,  # Content-MD5 or x-amz-checksum-* does not match the bytes
    "InvalidDigest": ChecksumRejected,
    "XAmzContentSHA256Mismatch": ChecksumRejected,
    "NotImplemented": Unsupported,  # Swift's s3api on If-Match: a refusal, not an outage
    "501": Unsupported,
    "ConditionalRequestConflict": ObjectChanged,  # 409: a concurrent conditional write of the same key
    # 409 from Ceph 20.2: the object was replaced while a request on it ran (a GetObject pinned by If-Match among them)
    "ConcurrentModification": ObjectChanged,
}
_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"}


def translate_error(exc: Exception, what: str) -> StorageError:
    """One table from boto errors to storage errors."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _ACCESS_CODES:
            return BackendUnavailable(f"S3 refused {what}: access denied ({code}); check the credentials")
        if code == "NoSuchBucket":
            return BackendUnavailable(f"S3 bucket does not exist ({what})")
        if code in ("PreconditionFailed", "412") or status == 412:
            return ObjectChanged(f"object changed while {what}")
        cls = _ERROR_TABLE.get(code)
        if cls is not None:
            return cls(f"{what}: {code}")
        return BackendUnavailable(f"S3 error while {what}: {code or status} {error.get('Message', '')}".strip())
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return BackendUnavailable("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if isinstance(exc, botocore.exceptions.EndpointConnectionError | botocore.exceptions.ConnectionError):
        return BackendUnavailable(f"cannot reach the S3 endpoint while {what}: {exc}")
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return BackendUnavailable(f"S3 client error while {what}: {exc}")
    return BackendUnavailable(f"unexpected error while {what}: {exc}")


@dataclass(frozen=True, slots=True)
class S3Config:
    bucket: str
    endpoint_url: str | None = None  # None: AWS_ENDPOINT_URL, else AWS itself
    region: str | None = None
    access_key_id: str | None = None  # None: the standard AWS credential chain
    secret_access_key: str | None = None
    session_token: str | None = None
    addressing_style: str = "auto"  # "path" for MinIO and Swift
    prefix: str = ""
    part_size: int = 8 << 20
    part_buffers: int = 10  # parts in flight per upload: as many as boto3's upload_file sends
    # bytes of part buffers (filling and in flight) for every upload of the process together: 10 parts of 8 MiB in
    # flight and one filling, what one upload uses at full speed; more uploads share it (and wait for it)
    buffer_budget: int = 64 << 20  # 8 parts of 8 MiB: what boto3's upload_file keeps in flight, for all uploads
    max_concurrency: int = 16  # threads (and HTTP connections) for boto3 calls, shared by every transfer
    max_object_size: int = 64 << 30
    buffer_size: int = 1 << 20  # bytes per read call
    max_attempts: int = 5
    # AWS S3 and MinIO evaluate If-None-Match on PutObject atomically; Swift's s3api checks it before writing, so
    # two concurrent conditional writers may both succeed there.
    atomic_if_absent: bool = True
    # AWS S3 and MinIO honour If-Match on PutObject and CompleteMultipartUpload; Swift's s3api refuses conditional
    # PUTs (501 NotImplemented): there the ETag is compared by a HEAD before the put, which is not atomic.
    atomic_if_match: bool = True
    connect_timeout: float = 5.0
    read_timeout: float = 20.0  # seconds without a byte (urllib3's socket timeout), per attempt
    call_budget: float = 30.0  # seconds one call may take with its retries (see the module's docstring)
    # learn at start() what the engine really does (see :class:`EngineProfile`); the two ``atomic_*`` flags above
    # can then only take an ability away (an operator's "no"), never grant one the engine was seen not to have
    probe: bool = True
    abandoned_upload_age: float = 24 * 3600  # seconds after which an unfinished multipart upload is aborted


# what each engine (endpoint, region, credentials) was seen to do, once per process: an engine does not change its
# conditional requests while a process runs, and a process that opens many buckets (the tests) probes once
_PROBED: dict[tuple[str | None, str | None, str | None], EngineProfile] = {}


def copy_ranges(size: int, limit: int | None) -> list[tuple[int, int] | None]:
    """How one UploadPartCopy source of ``size`` bytes is copied: ``[None]`` (whole) when one copy may move it
    (``limit``: the largest, None: any), else the fewest near-equal ``(start, end)`` ranges within the limit (each
    at least half of it, so never below S3's part minimum for a limit of 10 MiB or more)."""
    if limit is None or size <= limit:
        return [None]
    count = -(-size // limit)
    bounds = [size * i // count for i in range(count + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(count)]


class S3Writer(WriterContext):
    """An upload in progress: nothing is visible until :meth:`commit`."""

    def __init__(
        self, storage: S3Storage, key: str, size_hint: int | None, if_absent: bool = False, if_match: str | None = None
    ) -> None:
        self._s = storage
        self._key = key
        self._if_absent = if_absent
        self._if_match = if_match
        self._part_size = plan_part_size(
            size_hint, max_size=storage.config.max_object_size, preferred=storage.config.part_size
        )
        # the smallest part next to a copied one (copy_range): S3's minimum, or more when the object would not fit
        # in 10,000 parts of it
        self._copy_floor = plan_part_size(size_hint, max_size=storage.config.max_object_size, preferred=MIN_PART_SIZE)
        self._size_hint = size_hint
        # the part being filled: its first _fill bytes. A budgeted part is allocated once at its full size and
        # filled in place, never grown by appending (a bytearray grown by += carries up to 1/8 more as slack, and
        # each growth may copy it), so what a part occupies is what it holds of the budget
        self._buf = bytearray()
        self._fill = 0
        self._held = 0  # bytes of the storage's buffer budget that _buf may fill
        self._upload_id: str | None = None
        self._next_part = 1
        self._etags: dict[int, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(storage.config.part_buffers)
        self._reserving = asyncio.Lock()  # one acquisition of the budget at a time (write and room_after)
        self._progress = asyncio.Event()  # set whenever what the writer holds or has taken changes
        self._failure: StorageError | None = None
        self._written = 0
        self._done = False
        self._meta_written = False
        self._copied: dict[str, str] = {}  # the sources of copy_range: key -> the ETag of the version copied

    @property
    def bytes_written(self) -> int:
        return self._written

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._done:
            raise BackendUnavailable("write after commit or abort")
        if self._failure is not None:
            raise self._failure
        view = memoryview(data).cast("B")
        while True:
            await self._reserve(len(view))
            room = self._part_size - self._fill
            if len(view) <= room:  # an object of at most one part is a single PutObject
                self._put(view)
                return
            # fill the part to its end and hand it over (the buffer itself, no copy); the rest starts the next one
            self._put(view[:room])
            view = view[room:]
            held, self._held = self._held, 0
            self._progress.set()
            await self._submit(self._take_part(), held)

    async def room_after(self, received: int) -> int:
        """Wait until this writer can take bytes past offset ``received`` of its input without waiting for the
        budget, and return how many: the caller reads no more than that before asking again, so an upload that
        waits for a part buffer holds about one read of its body, not a pipeline full (the budget bounds what
        uploads hold, whatever their number). ``received`` counts the bytes handed (or about to be handed) to
        :meth:`write`; when all of them are written and no buffer is held, this takes the next part's buffer."""
        while True:
            if self._done or self._failure is not None:
                return 1  # let the caller run into the error (or the end) through write
            if self._held:
                capacity = self._written + self._held - self._fill
            elif self._next_part == 1:
                capacity = self._written + UNBUDGETED - self._fill
            else:
                capacity = self._written
            if capacity > received:
                return capacity - received
            if self._size_hint is not None and self._written >= self._size_hint:
                return 1  # all the bytes announced are here: nothing to hold a buffer for
            if self._written >= received and self._held and self._fill >= self._held:
                # a part filled to its last byte waits for one more byte in write(): none will come until there is
                # room, so the part goes now
                held, self._held = self._held, 0
                self._progress.set()
                await self._submit(self._take_part(), held)
                continue
            if self._held == 0 and self._written >= received:
                await self._reserve(1 if self._next_part > 1 else UNBUDGETED + 1 - self._fill)
                continue
            self._progress.clear()
            await self._progress.wait()

    def _put(self, view: memoryview) -> None:
        end = self._fill + len(view)
        if end <= len(self._buf):
            self._buf[self._fill : end] = view
        else:  # small, outside the budget, grows as it comes; or a part larger than the whole budget
            del self._buf[self._fill :]
            self._buf += view
        self._fill = end
        self._written += len(view)
        self._progress.set()

    def _adopt(self, buf: bytearray) -> None:
        """Fill ``buf`` (held from the budget) from now on, with the bytes gathered so far at its start."""
        if self._fill:
            buf[: self._fill] = memoryview(self._buf)[: self._fill]
        self._buf = buf

    def _take_part(self) -> bytearray:
        """The filled bytes as the part's body (the buffer itself, cut to its fill); the next part starts empty."""
        part, self._buf = self._buf, bytearray()
        del part[self._fill :]
        self._fill = 0
        return part

    async def _reserve(self, incoming: int) -> None:
        """Hold the budget for the part being filled before filling it: all of it at once (a part, or what the size
        hint says is left), never byte by byte, so every holder can finish its part without asking for more.

        A buffer of at most :data:`UNBUDGETED` bytes takes nothing from the budget: the small objects a request
        writes while it holds part of the budget for its large one (its upload record, its usage record) must
        never wait for the budget, or uploads holding all of it would wait for each other for ever."""
        if self._held == 0 and self._next_part == 1 and self._fill + incoming <= UNBUDGETED:
            return
        if self._held and self._fill + incoming <= self._held:
            return
        async with self._reserving:
            await self._reserve_held(incoming)
        self._progress.set()

    async def _reserve_held(self, incoming: int) -> None:
        budget = self._s.buffers
        if self._held == 0:
            left = self._part_size if self._size_hint is None else self._fill + self._size_hint - self._written
            want = min(self._part_size, max(left, self._fill + incoming, 1))
            self._held = await budget.acquire(want)
            self._adopt(budget.buffer(self._held))
        elif self._fill + incoming > self._held and self._held < budget.clamp(self._part_size):
            # more bytes than the size hint said: the rest of a whole part, in a whole part's buffer (the short
            # one is dropped, not kept: its bytes are counted in the whole part now)
            self._held += await budget.acquire(self._part_size - self._held)
            self._adopt(budget.buffer(self._held))

    def _give_back(self) -> None:
        if self._held:
            self._s.buffers.release(self._held)
            self._held = 0

    def copy_lead(self, length: int) -> int | None:
        """A copied part and the written part before it are each at least the copy floor (5 MiB, S3's minimum for
        every part but the last; more for an object that would not fit 10,000 parts of it): the bytes gathered for
        the next part that fall short of it are the lead."""
        floor = self._copy_floor
        lead = floor - self._fill if 0 < self._fill < floor else 0
        return lead if length - lead >= floor else None

    async def copy_range(self, source: ObjectReader, start: int, end: int) -> None:
        """The part being filled is uploaded as it is, then ``[start, end)`` of ``source`` becomes the next part(s)
        by UploadPartCopy (one per 5 GiB), conditional on the version ``source`` has open, in the background like
        every part: a failure (the source deleted or replaced meanwhile: ObjectChanged) fails the commit. An engine
        may ignore the copy's condition (Ceph 16 does: it copies whatever is there), so there (as the probes saw) the
        commit also asks each source's version once the copies are done (a HEAD) and publishes only if it is still
        the one copied."""
        if self._done:
            raise BackendUnavailable("write after commit or abort")
        if self._failure is not None:
            raise self._failure
        if not isinstance(source, S3Reader) or source.storage is not self._s:
            raise ValueError("copy_range copies from an object of the same bucket")
        if self.copy_lead(end - start) != 0:
            raise ValueError(f"a copy of {end - start} bytes after {self._fill} gathered breaks S3's part minimum")
        held, self._held = self._held, 0
        if self._fill:
            await self._submit(self._take_part(), held)
        elif held:  # a buffer taken ahead (room_after) and not filled: back to the budget, for the next part
            buf, self._buf = self._buf, bytearray()
            self._s.buffers.give_back(buf, held)
        self._copied[source.info.key] = source.etag
        for piece in copy_ranges(end - start, self._s.rules.max_compose_source):
            first, last = (start, end) if piece is None else (start + piece[0], start + piece[1])
            number = await self._claim_part(0)
            self._track(self._copy_part(number, source, first, last))
        self._written += end - start
        self._progress.set()

    async def _claim_part(self, held: int) -> int:
        """The next part's number, once a slot is free (at most part_buffers parts in flight) and the multipart
        upload is started; the ``held`` bytes of the budget go back if it fails."""
        try:
            await self._slots.acquire()
        except BaseException:
            self._s.buffers.release(held)
            raise
        if self._failure is not None:
            self._slots.release()
            self._s.buffers.release(held)
            raise self._failure
        try:
            if self._upload_id is None:
                response = await self._s.call(
                    "starting a multipart upload",
                    self._s.client.create_multipart_upload,
                    Bucket=self._s.config.bucket,
                    Key=self._s.data_key(self._key),
                )
                self._upload_id = str(response["UploadId"])
        except BaseException:
            self._slots.release()
            self._s.buffers.release(held)
            raise
        number = self._next_part
        self._next_part += 1
        return number

    def _track(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, part: bytearray, held: int) -> None:
        """Upload ``part`` in the background; the ``held`` bytes of the budget go back when it is stored."""
        number = await self._claim_part(held)
        self._track(self._upload_part(number, part, held))

    async def _copy_part(self, number: int, source: S3Reader, start: int, end: int) -> None:
        s = self._s
        what = f"copying part {number} from {source.info.key}"
        try:
            response = await s.call(
                what,
                s.client.upload_part_copy,
                Bucket=s.config.bucket,
                Key=s.data_key(self._key),
                UploadId=self._upload_id,
                PartNumber=number,
                CopySource={"Bucket": s.config.bucket, "Key": s.data_key(source.info.key)},
                CopySourceRange=f"bytes={start}-{end - 1}",
                **{f"CopySource{name}": value for name, value in s.get_if_match(source.etag).items()},
            )
            self._etags[number] = str(response["CopyPartResult"]["ETag"])
        except ObjectNotFound as exc:
            self._failure = self._failure or ObjectChanged(f"{what}: the source is gone ({exc})")
        except StorageError as exc:
            if _status(exc) == 412:
                exc = ObjectChanged(f"{what}: the source was replaced ({exc})")
            self._failure = self._failure or exc
        finally:
            self._slots.release()

    async def _upload_part(self, number: int, body: bytearray, held: int) -> None:
        try:
            response = await self._s.call(
                f"uploading part {number}",
                self._s.client.upload_part,
                Bucket=self._s.config.bucket,
                Key=self._s.data_key(self._key),
                UploadId=self._upload_id,
                PartNumber=number,
                Body=body,
                ContentLength=len(body),
            )
            self._etags[number] = str(response["ETag"])
        except StorageError as exc:
            self._failure = self._failure or exc
        except BaseException:
            # cancelled: the thread may still be sending the body, so the buffer is not handed to anyone else
            self._slots.release()
            self._s.buffers.release(held)
            raise
        self._slots.release()
        self._s.buffers.give_back(body, held)  # the part is stored (or refused): its buffer serves the next part

    async def _drain(self) -> None:
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def commit(self, metadata: Mapping[str, str]) -> ObjectInfo:
        if self._done:
            raise BackendUnavailable("commit after commit or abort")
        s = self._s
        try:
            if self._upload_id is not None and self._fill:
                held, self._held = self._held, 0
                await self._submit(self._take_part(), held)
            await self._drain()
            if self._failure is not None:
                raise self._failure
            await self._sources_unchanged()
            record = {"metadata": dict(metadata), "size": self._written}
            conditional_put = self._if_absent or self._if_match is not None
            if not conditional_put:  # replace: metadata first, the bytes are the visibility point
                await s.put_meta(self._key, record)
                self._meta_written = True
            multipart = self._upload_id is not None
            conditional: dict[str, str] = {}
            # an engine that ignores conditions on CompleteMultipartUpload (Ceph 16) gets none there: a large
            # create-if-absent claims its key by a conditional PutObject of its metadata instead (an object whose
            # bytes are not there yet is not published), and a large if-match compares by HEAD under our lock.
            # Where the completion honours them (Ceph 20.2, AWS) it is the compare-and-set itself: one request.
            claim = self._if_absent and multipart and not s.complete_if_none_match
            if_match = s.if_match_value(self._if_match, complete=multipart) if self._if_match is not None else None
            if self._if_absent and not claim:
                conditional = {"IfNoneMatch": "*"}
            elif if_match is not None and s.atomic_if_match:
                conditional = {"IfMatch": if_match}
            compare_first = self._if_match is not None and "IfMatch" not in conditional
            guard = s.compare_locks.hold(self._key) if compare_first else contextlib.nullcontext()
            async with guard:
                if compare_first:
                    await self._compare()
                if claim:
                    try:
                        await s.put_meta(self._key, record, if_absent=True)
                    except ObjectChanged as exc:
                        raise ObjectExists(self._key) from exc
                    self._meta_written = True  # the claim: an abort gives it back
                etag = await self._publish_bytes(conditional)
                if conditional_put and not claim:  # the bytes won the race, now the metadata makes them visible
                    await s.put_meta(self._key, record)
        except BaseException:
            await self.abort()
            raise
        self._done = True
        self._buf, self._fill = bytearray(), 0
        self._give_back()
        # what was just published, from the PUT's own answer: no HEAD and metadata GET to learn it again
        return ObjectInfo(self._key, self._written, datetime.now(UTC), dict(metadata), etag=etag)

    async def _sources_unchanged(self) -> None:
        """Each source of copy_range still at the version that was copied, asked after the copies ended: a version
        there before and after a copy is the one it copied, whether or not the engine kept the copy's condition
        (keys are not re-published with other bytes under the same ETag in between: an S3 ETag follows the bytes).
        Nothing to ask where the engine keeps the copy's condition: a copy of another version was refused."""
        s = self._s
        if s.copy_if_match:
            return
        for key, etag in self._copied.items():
            try:
                head = await s.call(f"stat {key}", s.client.head_object, Bucket=s.config.bucket, Key=s.data_key(key))
            except ObjectNotFound as exc:
                raise ObjectChanged(f"{key}, copied into {self._key}, is gone") from exc
            if unquoted(str(head["ETag"])) != unquoted(etag):
                raise ObjectChanged(f"{key}, copied into {self._key}, was replaced while it was copied")

    async def _compare(self) -> None:
        """The HEAD compare of a server without conditional PUTs (see the module's docstring)."""
        s = self._s
        try:
            head = await s.call(
                f"stat {self._key}", s.client.head_object, Bucket=s.config.bucket, Key=s.data_key(self._key)
            )
        except ObjectNotFound as exc:
            raise ObjectChanged(f"{self._key} has no object any more") from exc
        if unquoted(str(head["ETag"])) != unquoted(self._if_match or ""):
            raise ObjectChanged(f"{self._key} is at version {head['ETag']}, not {self._if_match}")

    async def _publish_bytes(self, conditional: dict[str, str]) -> str:
        """PutObject (small) or CompleteMultipartUpload: the moment the bytes are published. Returns the ETag."""
        s = self._s
        try:
            if self._upload_id is None:  # small: one PutObject is the moment of publication
                del self._buf[self._fill :]
                response = await s.call(
                    "publishing",
                    s.client.put_object,
                    Bucket=s.config.bucket,
                    Key=s.data_key(self._key),
                    Body=self._buf,
                    **conditional,
                )
            else:
                parts = [{"PartNumber": n, "ETag": self._etags[n]} for n in sorted(self._etags)]
                response = await s.call(
                    "completing the multipart upload",
                    s.client.complete_multipart_upload,
                    Bucket=s.config.bucket,
                    Key=s.data_key(self._key),
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": parts},
                    **conditional,
                )
                self._upload_id = None
            if "ETag" in response:
                return str(response["ETag"])
        except ObjectNotFound as exc:
            if "IfMatch" in conditional:  # If-Match on a key with no object: 404 (it was deleted meanwhile)
                raise ObjectChanged(f"{self._key} has no object any more") from exc
            raise
        except BackendUnavailable as exc:
            if conditional:
                # 412 PreconditionFailed; 409 ConditionalRequestConflict (a concurrent conditional write)
                if _status(exc) in (409, 412):
                    if self._if_absent:
                        raise ObjectExists(self._key) from exc
                    raise ObjectChanged(f"{self._key} changed: {exc}") from exc
            raise
        # no ETag in the answer: Swift answers a PUT that a concurrent, later PUT of the same key superseded with
        # 202 (its bytes were replaced at once: last writer wins), which s3api passes on without one. What is
        # there now is the version to name (as after any publish, a later one may already be there).
        try:
            head = await s.call(
                f"stat {self._key}", s.client.head_object, Bucket=s.config.bucket, Key=s.data_key(self._key)
            )
        except StorageError:  # published, and gone or unreadable already: no version to name, still published
            return ""
        return str(head["ETag"])

    async def abort(self) -> None:
        if self._done and self._upload_id is None and not self._meta_written:
            return
        self._done = True
        self._buf, self._fill = bytearray(), 0
        self._give_back()
        self._progress.set()
        await self._drain()  # never leave a part upload running behind an abort
        s = self._s
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            try:
                await s.call(
                    "aborting a multipart upload",
                    s.client.abort_multipart_upload,
                    Bucket=s.config.bucket,
                    Key=s.data_key(self._key),
                    UploadId=upload_id,
                )
            except ObjectNotFound:
                pass
        if self._meta_written:
            self._meta_written = False
            await s.call("deleting metadata", s.client.delete_object, Bucket=s.config.bucket, Key=s.meta_key(self._key))


class S3Reader(ReaderContext):
    def __init__(self, storage: S3Storage, info: ObjectInfo, etag: str) -> None:
        self._s = storage
        self._info = info
        self._etag = etag

    @property
    def info(self) -> ObjectInfo:
        return self._info

    @property
    def storage(self) -> S3Storage:
        return self._s

    @property
    def etag(self) -> str:
        """The ETag of the version open: every read (and a copy_range from it) is of that version."""
        return self._etag

    async def read(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        stop = self._info.size if end is None else min(end, self._info.size)
        if start >= stop:
            return
        s = self._s
        response = await s.call(
            f"reading {self._info.key}",
            s.client.get_object,
            Bucket=s.config.bucket,
            Key=s.data_key(self._info.key),
            Range=f"bytes={start}-{stop - 1}",
            **s.get_if_match(self._etag),
        )
        body = response["Body"]
        try:
            remaining = stop - start
            while remaining > 0:
                chunk: bytes = await s.call(
                    f"reading {self._info.key}", body.read, min(s.config.buffer_size, remaining)
                )
                if not chunk:
                    raise BackendUnavailable(f"S3 response for {self._info.key} ended early")
                remaining -= len(chunk)
                yield chunk
        finally:
            await asyncio.get_running_loop().run_in_executor(s.executor, body.close)


def _checksum_calculation(endpoint_url: str | None) -> Literal["when_supported", "when_required"]:
    """botocore's ``request_checksum_calculation`` for an endpoint. Over plain HTTP SigV4 signs every request body's
    SHA-256 (``X-Amz-Content-SHA256``), which the engine checks: a CRC32 of each part beside it (botocore's default
    since 1.36) proves nothing more and costs ~0.27 s of CPU per GiB uploaded (AMD EPYC). Over HTTPS the body is
    sent unsigned and the CRC32 is its only per-part check, so it stays. An endpoint named only in botocore's own
    configuration files is not seen here and keeps the default: the same bytes, a little more CPU."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return "when_required" if endpoint.lower().startswith("http://") else "when_supported"


class S3Storage:
    """Objects in an S3 bucket. Capabilities: ranged reads, presigned URLs, multipart, compose."""

    def __init__(self, config: S3Config) -> None:
        if config.connect_timeout + config.read_timeout > config.call_budget:
            raise ValueError("one attempt (connect_timeout + read_timeout) must fit in call_budget")
        self.config = config
        self.compare_locks = KeyedLocks()  # if_match without a conditional PUT: compare and put one at a time
        self.buffers = ByteBudget(config.buffer_budget)  # every part buffer of every upload of this storage
        self.executor = ThreadPoolExecutor(max_workers=config.max_concurrency, thread_name_prefix="s3")
        session = boto3.session.Session(
            aws_access_key_id=config.access_key_id,
            aws_secret_access_key=config.secret_access_key,
            aws_session_token=config.session_token,
            region_name=config.region,
        )
        self.session = session
        self.client = session.client(
            "s3",
            endpoint_url=config.endpoint_url,
            config=Config(
                request_checksum_calculation=_checksum_calculation(config.endpoint_url),
                signature_version="s3v4",
                s3={"addressing_style": config.addressing_style},
                retries={"mode": "standard", "max_attempts": config.max_attempts},
                max_pool_connections=config.max_concurrency,
                connect_timeout=config.connect_timeout,
                read_timeout=config.read_timeout,
            ),
        )
        # Retries happen inside botocore (standard mode); each attempt after the first builds a new request whose
        # context carries the attempt number. Whoever runs this storage may count them (``on_retry(operation)``).
        self.on_retry: Callable[[str], None] | None = None
        self.engine: EngineProfile | None = None  # what start() saw the engine do
        self.client.meta.events.register("request-created.s3", self._request_created)
        self.client.meta.events.register("before-call.s3", self._call_started)
        # runs before the standard retry handler: a False here is the first non-None answer, so no retry
        self.client.meta.events.register_first("needs-retry.s3", self._retry_fits)

    def _call_started(self, context: dict[str, Any], **_: Any) -> None:
        context["transfer_call_started"] = time.monotonic()

    def _retry_fits(self, attempts: int, request_dict: dict[str, Any], **_: Any) -> bool | None:
        """False (no retry) when the next attempt could not end within the call's budget: the longest backoff
        standard mode may pick before attempt ``attempts + 1`` (2^(attempts-1) s, at most 20) plus one whole
        attempt. None leaves the decision to botocore's retry handler."""
        started = request_dict.get("context", {}).get("transfer_call_started")
        if started is None:
            return None
        c = self.config
        longest = time.monotonic() - started + min(20.0, 2.0 ** (attempts - 1)) + c.connect_timeout + c.read_timeout
        return False if longest > c.call_budget else None

    def _request_created(self, request: Any, operation_name: str = "", **_: Any) -> None:
        attempt = getattr(request, "context", {}).get("retries", {}).get("attempt", 1)
        if attempt > 1 and self.on_retry is not None:
            self.on_retry(operation_name)

    @property
    def rules(self) -> S3Rules:
        """S3's limits (parts, compose sources, presigned URL lifetimes), as this backend is configured."""
        return S3Rules(preferred_part_size=self.config.part_size, abandoned_upload_age=self.config.abandoned_upload_age)

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this backend offers on its engine: before start() (or without probing) what the configuration
        says; after start() only what the probes saw working."""
        caps = {Capability.COMPOSE, Capability.COPY_RANGE, Capability.ABANDONED_UPLOADS}
        if self.engine is None or self.engine.presign != "none":
            caps |= {Capability.PRESIGN, Capability.DIRECT_UPLOAD}
        if self.atomic_if_absent:
            caps.add(Capability.ATOMIC_IF_ABSENT)
        if self.atomic_if_match:
            caps.add(Capability.ATOMIC_IF_MATCH)
        return frozenset(caps)

    @property
    def atomic_if_absent(self) -> bool:
        return self.config.atomic_if_absent and (self.engine is None or self.engine.conditional_create)

    @property
    def atomic_if_match(self) -> bool:
        return self.config.atomic_if_match and (self.engine is None or self.engine.compare_and_set)

    @property
    def complete_if_none_match(self) -> bool:
        """CompleteMultipartUpload honours ``If-None-Match: *`` (Ceph 20.2, AWS; not Ceph 16): a large
        create-if-absent is decided by its completion alone, with no claim object first."""
        return self.engine is None or self.engine.complete_if_none_match

    @property
    def copy_if_match(self) -> bool:
        """UploadPartCopy honours ``x-amz-copy-source-if-match`` (Ceph 20.2, AWS; not Ceph 16): a copied range is of
        the version named, with no HEAD of the source after the copies."""
        return self.engine is None or self.engine.copy_if_match

    def if_match_value(self, etag: str, *, complete: bool = False) -> str | None:
        """``etag`` in the form the engine compares ``If-Match`` with on PutObject (with ``complete``: on
        CompleteMultipartUpload), or None where it does not compare there (Swift's PUTs, Ceph 16's completion)."""
        if self.engine is None:
            return quoted(etag)
        form = self.engine.complete_if_match if complete else self.engine.if_match
        return in_form(etag, form) if form in IF_MATCH_FORMS else None

    def get_if_match(self, etag: str) -> dict[str, str]:
        """The If-Match of a pinned GetObject: the form the engine accepts, none when it has no working one."""
        form = "quoted" if self.engine is None else self.engine.get_if_match
        if form == "quoted":
            return {"IfMatch": quoted(etag)}
        if form == "unquoted":
            return {"IfMatch": unquoted(etag)}
        return {}

    def data_key(self, key: str) -> str:
        return f"{self.config.prefix}data/{validate_key(key)}"

    def meta_key(self, key: str) -> str:
        return f"{self.config.prefix}meta/{validate_key(key)}.json"

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking boto3 call in the pool; translate its errors."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, partial(fn, *args, **kwargs))
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise translate_error(exc, what) from exc

    async def start(self) -> None:
        """Check that the bucket exists and the credentials may use it, then learn what the engine does."""
        where = self.config.endpoint_url or "AWS"
        try:
            await self.call(
                f"checking bucket {self.config.bucket!r}", self.client.head_bucket, Bucket=self.config.bucket
            )
        except ObjectNotFound as exc:  # HeadBucket answers a bare 404
            raise BackendUnavailable(f"S3 bucket {self.config.bucket!r} does not exist at {where}") from exc
        if self.config.probe and self.engine is None:
            seen = (self.config.endpoint_url, self.config.region, self.config.access_key_id)
            self.engine = _PROBED.get(seen) or await self.probe()
            _PROBED[seen] = self.engine

    async def probe(self) -> EngineProfile:
        """What the engine does (:class:`EngineProfile`), by the probes of :mod:`storage.s3_engine` on this bucket."""
        return await EngineProbe(self).run()

    async def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def create(
        self,
        key: str,
        *,
        size_hint: int | None = None,
        if_absent: bool = False,
        if_match: str | None = None,
        durable: bool = True,
    ) -> S3Writer:
        """``durable`` is moot: S3 acknowledges a write once it is stored."""
        validate_key(key)
        if if_absent and if_match is not None:
            raise ValueError("if_absent and if_match are exclusive")
        return S3Writer(self, key, size_hint, if_absent, if_match)

    async def compose(self, key: str, sources: list[str], metadata: Mapping[str, str]) -> ObjectInfo:
        """Concatenate ``sources`` server-side: one UploadPartCopy per source, or for a source larger than one
        copy moves (``max_compose_source``, 5 GiB) one per range of it (``CopySourceRange``, near-equal ranges:
        each at least half the limit, so at least 5 MiB), every part but the last at least 5 MiB (S3's part
        minimum); then the metadata, then CompleteMultipartUpload."""
        bucket = self.config.bucket
        sizes = []
        for source in sources:
            head = await self.call(f"stat {source}", self.client.head_object, Bucket=bucket, Key=self.data_key(source))
            sizes.append(int(head["ContentLength"]))
        pieces = [
            (source, piece)
            for source, size in zip(sources, sizes, strict=True)
            for piece in copy_ranges(size, self.rules.max_compose_source)
        ]
        response = await self.call(
            "starting a compose", self.client.create_multipart_upload, Bucket=bucket, Key=self.data_key(key)
        )
        upload_id = str(response["UploadId"])
        limit = asyncio.Semaphore(self.config.max_concurrency)

        async def copy(number: int, source: str, piece: tuple[int, int] | None) -> dict[str, Any]:
            ranged = {} if piece is None else {"CopySourceRange": f"bytes={piece[0]}-{piece[1] - 1}"}
            async with limit:
                result = await self.call(
                    f"copying {source}",
                    self.client.upload_part_copy,
                    Bucket=bucket,
                    Key=self.data_key(key),
                    UploadId=upload_id,
                    PartNumber=number,
                    CopySource={"Bucket": bucket, "Key": self.data_key(source)},
                    **ranged,
                )
            return {"PartNumber": number, "ETag": result["CopyPartResult"]["ETag"]}

        try:
            parts = await asyncio.gather(*(copy(i + 1, src, piece) for i, (src, piece) in enumerate(pieces)))
            await self.put_meta(key, {"metadata": dict(metadata), "size": sum(sizes)})
            await self.call(
                "completing a compose",
                self.client.complete_multipart_upload,
                Bucket=bucket,
                Key=self.data_key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": list(parts)},
            )
        except BaseException:
            try:
                await self.call(
                    "aborting a compose",
                    self.client.abort_multipart_upload,
                    Bucket=bucket,
                    Key=self.data_key(key),
                    UploadId=upload_id,
                )
            except StorageError:
                pass
            raise
        return await self.stat(key)

    async def abort_abandoned_uploads(self, older_than: float) -> int:
        """Abort multipart uploads under our prefix started more than ``older_than`` seconds ago: their writer died
        with its process (SIGKILL, a crash), so nothing will complete or abort them, and their parts cost storage.
        (AWS's lifecycle rule AbortIncompleteMultipartUpload does the same on the server side.)"""
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than)
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": f"{self.config.prefix}data/"}
        aborted = 0
        while True:
            page = await self.call("listing multipart uploads", self.client.list_multipart_uploads, **kwargs)
            for upload in page.get("Uploads", []):
                if upload["Initiated"] < cutoff:
                    try:
                        await self.call(
                            "aborting an abandoned upload",
                            self.client.abort_multipart_upload,
                            Bucket=self.config.bucket,
                            Key=upload["Key"],
                            UploadId=upload["UploadId"],
                        )
                        aborted += 1
                    except ObjectNotFound:
                        pass  # completed or aborted meanwhile
            if not page.get("IsTruncated"):
                return aborted
            kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

    async def put_meta(self, key: str, record: dict[str, Any], *, if_absent: bool = False) -> None:
        """The metadata object of ``key``; with ``if_absent`` only if it has none (else ObjectChanged)."""
        body = json.dumps(record, ensure_ascii=True).encode("ascii")
        try:
            await self._put_meta(key, body, if_absent)
        except BackendUnavailable as exc:
            if if_absent and _status(exc) == 409:  # ConditionalRequestConflict: a concurrent conditional write
                raise ObjectChanged(f"{key} is being created by another writer") from exc
            raise

    async def _put_meta(self, key: str, body: bytes, if_absent: bool) -> None:
        await self.call(
            "writing metadata",
            self.client.put_object,
            Bucket=self.config.bucket,
            Key=self.meta_key(key),
            Body=body,
            ContentType="application/json",
            **({"IfNoneMatch": "*"} if if_absent else {}),
        )

    async def _head_and_meta(self, key: str) -> tuple[ObjectInfo, str]:
        head = await self.call(
            f"stat {key}", self.client.head_object, Bucket=self.config.bucket, Key=self.data_key(key)
        )
        modified = head.get("LastModified") or datetime.now(UTC)
        info = ObjectInfo(
            key=key,
            size=int(head["ContentLength"]),
            modified=modified,
            metadata=await self._read_metadata(key),
            etag=str(head["ETag"]),
        )
        return info, info.etag

    async def _read_metadata(self, key: str) -> dict[str, str]:
        """The metadata published with ``key`` (one GET of its metadata object)."""
        try:
            meta = await self.call(
                f"reading metadata of {key}", self.client.get_object, Bucket=self.config.bucket, Key=self.meta_key(key)
            )
            raw = await self.call(f"reading metadata of {key}", meta["Body"].read)
            record = json.loads(raw)
            return {str(k): str(v) for k, v in record.get("metadata", {}).items()}
        except (ValueError, AttributeError) as exc:
            raise BackendUnavailable(f"unreadable metadata for {key}") from exc

    async def open(self, key: str) -> S3Reader:
        info, etag = await self._head_and_meta(key)
        return S3Reader(self, info, etag)

    async def stat(self, key: str) -> ObjectInfo:
        info, _ = await self._head_and_meta(key)
        return info

    async def delete(self, key: str) -> None:
        # bytes first: the object stops being visible before its metadata goes
        await self.call(f"deleting {key}", self.client.delete_object, Bucket=self.config.bucket, Key=self.data_key(key))
        await self.call(f"deleting {key}", self.client.delete_object, Bucket=self.config.bucket, Key=self.meta_key(key))

    async def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None, metadata: bool = False
    ) -> AsyncIterator[ObjectInfo]:
        """ListObjectsV2 pages (Prefix, StartAfter, MaxKeys): one LIST call per page of up to 1,000 keys; size and
        modification time come from the listing entries, and the metadata object is read only with ``metadata``."""
        root = f"{self.config.prefix}data/"
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": root + prefix}
        if start_after is not None:
            kwargs["StartAfter"] = root + start_after
        left = limit
        while left is None or left > 0:
            kwargs["MaxKeys"] = 1000 if left is None else min(left, 1000)
            page = await self.call("listing objects", self.client.list_objects_v2, **kwargs)
            for item in page.get("Contents", []):
                key = str(item["Key"])[len(root) :]
                info = ObjectInfo(
                    key=key, size=int(item["Size"]), modified=item["LastModified"], etag=str(item.get("ETag", ""))
                )
                if metadata:
                    try:
                        info = replace(info, metadata=await self._read_metadata(key))
                    except ObjectNotFound:
                        continue  # deleted meanwhile
                yield info
                if left is not None:
                    left -= 1
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs.pop("StartAfter", None)
            kwargs["ContinuationToken"] = token

    async def presign_put(
        self, key: str, *, expires_in: int, content_type: str | None = None, content_length: int | None = None
    ) -> str:
        """A presigned PUT URL for ``key`` (one PutObject, up to 5 GiB), valid for ``expires_in`` seconds (capped at
        7 days); the given Content-Type and Content-Length are part of the signature."""
        expires_in = min(expires_in, MAX_PRESIGN_SECONDS)
        # the metadata half first (empty): the object is then an ordinary one of this backend the moment the PUT
        # lands, and until it does, stat() finds no bytes and says ObjectNotFound; delete() removes both halves
        await self.put_meta(key, {"metadata": {}})
        params: dict[str, Any] = {"Bucket": self.config.bucket, "Key": self.data_key(key)}
        if content_type:
            params["ContentType"] = content_type
        if content_length is not None:
            params["ContentLength"] = content_length
        url: str = await self.call(
            "presigning a URL", self.client.generate_presigned_url, "put_object", Params=params, ExpiresIn=expires_in
        )
        return url

    async def presign_get(
        self,
        key: str,
        *,
        expires_in: int,
        content_type: str | None = None,
        content_encoding: str | None = None,
        content_disposition: str | None = None,
    ) -> str:
        """A presigned GET URL for ``key``, valid for ``expires_in`` seconds (capped at 7 days and at the lifetime of
        temporary credentials)."""
        expires_in = min(expires_in, MAX_PRESIGN_SECONDS)
        credentials = self.session.get_credentials()
        expiry = getattr(credentials, "_expiry_time", None)
        if isinstance(expiry, datetime):
            expires_in = max(1, min(expires_in, int((expiry - datetime.now(UTC)).total_seconds())))
        params: dict[str, Any] = {"Bucket": self.config.bucket, "Key": self.data_key(key)}
        if content_type:
            params["ResponseContentType"] = content_type
        if content_encoding:
            params["ResponseContentEncoding"] = content_encoding
        if content_disposition:
            params["ResponseContentDisposition"] = content_disposition
        url: str = await self.call(
            "presigning a URL", self.client.generate_presigned_url, "get_object", Params=params, ExpiresIn=expires_in
        )
        return url

    # -- direct uploads (SupportsDirectUpload): the client PUTs parts to presigned URLs, the service verifies --------
    #
    # The parts become ``data/<key>`` by CompleteMultipartUpload while ``meta/<key>.json`` is still absent, and an
    # object without its metadata is not published here (``open``/``stat`` raise ObjectNotFound, ``list`` skips it),
    # the same window a conditional writer's commit has. Multipart uploads live under ``data/``, where
    # abort_abandoned_uploads looks.
    #
    # What a direct door can lean on, by engine (``self.engine``, probed):
    # - ``part_checksums_verified`` (Ceph 20.2, AWS, Swift): a part is stored only with the bytes whose SHA-256 its
    #   URL signs. A wrong part is refused as it is sent (400 BadDigest to the client, which sends it again), not
    #   found at completion, and every part ListParts lists has the SHA-256 the client declared for it (Ceph 20.2 and
    #   AWS list it too, ``StoredPart.sha256_b64``: comparable with the plan's without trusting which URL was used).
    #   The whole file's SHA-256 is still no engine's to give (a multipart checksum is COMPOSITE, a hash of the part
    #   hashes), so the read-back stays for the descriptor's checksum; on such an engine a mismatch there means the
    #   declared whole-file checksum disagrees with the declared parts, never a part stored wrong.
    # - Not ``part_checksums_verified`` (Ceph 16): parts are stored unchecked; the read-back is the only check.
    # - ``put_checksum_verified`` is false on Ceph 16 and 20.2: a single presigned PUT is not checked by the engine,
    #   whatever checksum it signs, so what it stored must be read back. Neither Ceph compares the part checksums a
    #   CompleteMultipartUpload lists with the stored parts (20.2 assembles whatever it is given).

    async def begin_direct_upload(self, key: str) -> str:
        """CreateMultipartUpload for ``key`` asking for SHA-256 part checksums (S3 additional checksums; backends
        without them, like Swift's s3api 2.38, ignore the request and still verify each part's signed checksum)."""
        response = await self.call(
            "starting a direct upload",
            self.client.create_multipart_upload,
            Bucket=self.config.bucket,
            Key=self.data_key(key),
            ChecksumAlgorithm="SHA256",
        )
        return str(response["UploadId"])

    async def presign_part(
        self, key: str, upload_id: str, number: int, *, sha256_b64: str, size: int, expires_in: int
    ) -> PartUrl:
        """A presigned UploadPart URL whose signature covers ``x-amz-checksum-sha256`` (SigV4 signed header): the
        bucket refuses the part (BadDigest) unless its bytes have that SHA-256, and a request without the header
        does not match the signature. ``Content-Length`` is signed too (SignedHeaders): a part of any other length
        than ``size`` does not match the signature and is refused before it is stored. Every HTTP client sends the
        length of what it sends, so it is not among the headers to set (browsers may not set it)."""
        expires_in = max(1, min(expires_in, MAX_PRESIGN_SECONDS))
        params = {
            "Bucket": self.config.bucket,
            "Key": self.data_key(key),
            "UploadId": upload_id,
            "PartNumber": number,
            "ChecksumSHA256": sha256_b64,
            "ContentLength": size,
        }
        url: str = await self.call(
            "presigning a part", self.client.generate_presigned_url, "upload_part", Params=params, ExpiresIn=expires_in
        )
        return PartUrl(url=url, method="PUT", headers={"x-amz-checksum-sha256": sha256_b64}, expires_in=expires_in)

    async def list_direct_parts(self, key: str, upload_id: str) -> builtins.list[StoredPart]:
        """ListParts, every page."""
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Key": self.data_key(key), "UploadId": upload_id}
        parts: builtins.list[StoredPart] = []
        while True:
            page = await self.call("listing parts", self.client.list_parts, **kwargs)
            for item in page.get("Parts", []):
                parts.append(
                    StoredPart(
                        number=int(item["PartNumber"]),
                        size=int(item["Size"]),
                        etag=str(item["ETag"]),
                        sha256_b64=item.get("ChecksumSHA256"),
                    )
                )
            if not page.get("IsTruncated"):
                return sorted(parts, key=lambda p: p.number)
            kwargs["PartNumberMarker"] = page.get("NextPartNumberMarker", 0)

    async def assemble_direct_upload(self, key: str, upload_id: str, parts: builtins.list[StoredPart]) -> None:
        """CompleteMultipartUpload with the listed parts (and their checksums where the backend reported them)."""
        listed: builtins.list[dict[str, Any]] = []
        for part in parts:
            entry: dict[str, Any] = {"PartNumber": part.number, "ETag": part.etag}
            if part.sha256_b64:
                entry["ChecksumSHA256"] = part.sha256_b64
            listed.append(entry)
        await self.call(
            "assembling a direct upload",
            self.client.complete_multipart_upload,
            Bucket=self.config.bucket,
            Key=self.data_key(key),
            UploadId=upload_id,
            MultipartUpload={"Parts": listed},
        )

    async def read_assembled(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        if start >= end:
            return
        response = await self.call(
            f"reading back {key}",
            self.client.get_object,
            Bucket=self.config.bucket,
            Key=self.data_key(key),
            Range=f"bytes={start}-{end - 1}",
        )
        body = response["Body"]
        try:
            while chunk := await self.call(f"reading back {key}", body.read, self.config.buffer_size):
                yield chunk
        finally:
            await asyncio.get_running_loop().run_in_executor(self.executor, body.close)

    async def publish_assembled(self, key: str, metadata: Mapping[str, str]) -> ObjectInfo:
        """Writing the metadata publishes the assembled bytes."""
        head = await self.call(
            f"stat {key}", self.client.head_object, Bucket=self.config.bucket, Key=self.data_key(key)
        )
        await self.put_meta(key, {"metadata": dict(metadata), "size": int(head["ContentLength"])})
        return await self.stat(key)

    async def discard_direct_upload(self, key: str, upload_id: str | None) -> None:
        if upload_id is not None:
            try:
                await self.call(
                    "aborting a direct upload",
                    self.client.abort_multipart_upload,
                    Bucket=self.config.bucket,
                    Key=self.data_key(key),
                    UploadId=upload_id,
                )
            except ObjectNotFound:
                pass
        try:  # published (its metadata written): not this call's to delete, whoever aborts the upload
            await self._read_metadata(key)
            return
        except ObjectNotFound:
            pass
        await self.call(
            f"discarding {key}", self.client.delete_object, Bucket=self.config.bucket, Key=self.data_key(key)
        )
