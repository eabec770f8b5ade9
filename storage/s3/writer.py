"""Writing an object: parts uploaded while the bytes arrive, within the process-wide part-buffer budget, or
copied server-side from another object; published by CompleteMultipartUpload (PutObject when small), after its
metadata."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Mapping
from datetime import UTC, datetime
from typing import Any

from storage.base import ObjectInfo, ObjectReader, WriterContext
from storage.errors import BackendUnavailable, ObjectChanged, ObjectExists, ObjectNotFound, StorageError
from storage.parts import MIN_PART_SIZE, plan_part_size
from storage.s3.bucket import S3Bucket
from storage.s3.engine import response_status as _status
from storage.s3.engine import unquoted
from storage.s3.reader import S3Reader

# a writer's buffer up to this size is outside the part-buffer budget (see S3Writer._reserve): at most this much per
# upload in flight comes on top of the budget (records and other small objects are far smaller)
UNBUDGETED = 256 << 10


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
        self, storage: S3Bucket, key: str, size_hint: int | None, if_absent: bool = False, if_match: str | None = None
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
