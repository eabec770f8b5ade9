"""The upload pipeline: a request body in, a verified, published object out.

    body pieces --(gathered to buffer_size)--> queue (2; 1 when paced) --> [worker thread: digest of the body as sent,
    decode Content-Encoding (bomb-guarded), SHA-256 + size of the original, sniff head, encode for storage,
    SHA-256 of the stored bytes] --> storage writer (the write of step N overlaps the work of step N+1)

Memory per upload is a few ``buffer_size`` batches whatever the file size and whatever its coding expands to: the
worker returns at most about ``buffer_size`` bytes of output per step, so a batch that decodes to gigabytes takes
many steps, each written before the next is taken. Declared lengths and sizes are cut-offs: the body is read no
further than the first byte past them, and the decoded-size limit is checked as the bytes come out.

Nothing is visible until the sizes and every digest the client declared have been checked; any failure (bad digest,
client gone, disk full, too large, corrupt coding) aborts the writer, so no temp file or partial object stays behind.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from storage.base import ObjectWriter, Storage, flushes_earlier_writes
from transfer.core.model.content import ContentEncoding, checksum_hex
from transfer.core.model.encodings import DecodeLimits, make_decoder, make_encoder
from transfer.core.uploads.state import FileIntent
from transfer.errors import (
    ChecksumMismatch,
    ContentLengthMismatch,
    DigestMismatch,
    QuotaExceeded,
    SizeMismatch,
    TooLarge,
)
from transfer.service import cpus
from transfer.service.files.publisher import SNIFF_BYTES, Candidate, Publisher
from transfer.service.files.records import FileRecord, object_key

__all__ = ["SNIFF_BYTES", "UploadRequest", "first_error", "ingest"]
# the batch size for a writer that paces the body by its memory (``room_after``: S3's budgeted part buffers), and
# the batches waiting between reading and writing (``QUEUED_BATCHES`` for any other writer). Such a writer copies
# each batch into a part buffer it already holds, so every byte in the pipeline is held twice: 32 uploads into S3
# held ~2 MB each in it with 256 KiB batches and a queue of two (~40 MB at the peak, by a survey of who holds body
# bytes), ~0.8 MB now. 64 KiB batches save no more memory (one socket read is the floor) and cost ~9 % more CPU
PACED_BATCH = 128 << 10
QUEUED_BATCHES = 2
PACED_QUEUED_BATCHES = 1
# A step over at most this many received bytes, with no coding to undo or apply, runs on the event loop: hashing
# 64 KiB takes ~30 µs, less than the thread hop it would otherwise cost (small objects are mostly hops).
INLINE_STEP = 64 << 10


@dataclass(slots=True)
class UploadRequest:
    """Everything a front door learned about an upload besides the body itself."""

    intent: FileIntent = FileIntent()  # what the file is to be (name, types, role, description, lifetime asked for)
    declared_length: int | None = None  # length of the body as sent (Content-Length; an import's encoded_size)
    body_encoding: ContentEncoding = ContentEncoding.NONE  # Content-Encoding of the body as sent
    body_sha256: bytes | None = None  # RFC 9530 Content-Digest / Repr-Digest: sha-256 of the body as sent
    checksum: str | None = None  # descriptor format: SHA-256 of the original bytes
    expected_size: int | None = None  # original size the client declares
    store_encoding: ContentEncoding = ContentEncoding.NONE
    owner: str | None = None  # the API key storing it: the file belongs to that key


class _Digests:
    """The CPU side of the pipeline; runs in a worker thread one step at a time.

    A batch of received bytes may decode to far more than its own size (1 MiB of gzip can hold 1 GiB of zeros), so
    a batch is not processed whole: :meth:`step` returns at most about ``budget`` bytes of output and keeps the
    decoder's place, and the caller writes them before asking for more."""

    def __init__(
        self,
        request: UploadRequest,
        limits: DecodeLimits,
        levels: Mapping[str, int],
        piece_size: int,
        room: int | None = None,
    ) -> None:
        self.body = hashlib.sha256() if request.body_sha256 is not None else None
        self.original = hashlib.sha256()
        self.stored = hashlib.sha256() if request.store_encoding is not ContentEncoding.NONE else None
        self.decoder = make_decoder(request.body_encoding, limits, piece_size=piece_size)
        self.encoder = make_encoder(request.store_encoding, levels=levels)
        self.expected_size = request.expected_size
        self.room = room  # original bytes the key's quota leaves for this upload (None: no quota)
        self.head = bytearray()
        self.size = 0
        self.budget = piece_size
        self._pieces: Iterator[bytes] = iter(())
        self._finishing = False
        self._identity = (
            request.body_encoding is ContentEncoding.NONE and request.store_encoding is ContentEncoding.NONE
        )
        self.cheap = False  # the current batch's steps are cheap enough for the event loop (see INLINE_STEP)

    def _original(self, piece: bytes) -> bytes:
        self.size += len(piece)
        if self.expected_size is not None and self.size > self.expected_size:
            # a declared size is a cut-off: stop at the first piece past it rather than read the rest
            raise SizeMismatch(
                f"the content is longer than the declared size of {self.expected_size} bytes",
                declared=self.expected_size,
            )
        if self.room is not None and self.size > self.room:
            raise _quota_exceeded(self.room)  # a stream of unknown length stops at the quota, publishing nothing
        self.original.update(piece)
        if len(self.head) < SNIFF_BYTES:
            self.head += piece[: SNIFF_BYTES - len(self.head)]
        if self.stored is None:
            return piece
        out = self.encoder.encode(piece)
        self.stored.update(out)
        return out

    def begin(self, batch: list[bytes]) -> None:
        """Take the next batch of bytes as received (call once :meth:`step` has reported it done). Lazy: the
        hashing and decoding happen in the steps, in the worker thread."""
        self._pieces = self._decoded(batch)
        self.cheap = self._identity and cpus.hash_on_loop(sum(map(len, batch)), INLINE_STEP)

    def _decoded(self, batch: list[bytes]) -> Iterator[bytes]:
        for piece in batch:
            if self.body is not None:
                self.body.update(piece)
            yield from self.decoder.feed(piece)

    def begin_finish(self) -> None:
        """The body has ended: the next steps return what the decoder and the encoder still hold."""
        self._pieces = self.decoder.finish()
        self._finishing = True
        self.cheap = self._identity  # nothing is held back without a coding

    def step(self) -> tuple[list[bytes], bool]:
        """Up to about ``budget`` bytes to store, and whether the current batch (or the finish) is done."""
        out: list[bytes] = []
        produced = 0
        for piece in self._pieces:
            if o := self._original(piece):
                out.append(o)
                produced += len(o)
            if produced >= self.budget:
                return out, False
        if self._finishing and self.stored is not None:
            if tail := self.encoder.finish():
                self.stored.update(tail)
                out.append(tail)
        return out, True


async def _batches(
    body: AsyncIterator[bytes],
    size: int,
    max_raw: int,
    declared: int | None,
    room: Callable[[int], Awaitable[int]] | None = None,
) -> AsyncIterator[list[bytes]]:
    """Gather body pieces into batches of about ``size`` bytes (fewer thread hops, fewer write calls), as lists:
    the pieces are hashed and written one after another, never joined (a copy of every byte, ~8 % of an upload's
    CPU when the body arrives as 256 KiB socket reads); stop at
    the first piece past ``max_raw`` or past the ``declared`` length. ``room(total)``, awaited before each batch:
    how many bytes past the ``total`` read so far the writer can take without waiting for memory (it waits for
    some), so a batch is no larger than that and no body is read for a writer that waits."""
    pending: list[bytes] = []
    pending_len = 0
    total = 0
    target = size
    if room is not None:
        size = max(1, min(size, await room(0)))
    async for piece in body:
        if not piece:
            continue
        total += len(piece)
        if total > max_raw:
            raise TooLarge(f"upload exceeds the limit of {max_raw} bytes", limit=max_raw)
        if declared is not None and total > declared:
            raise ContentLengthMismatch(
                f"the body is longer than the {declared} bytes declared", received=total, declared=declared
            )
        pending.append(piece)
        pending_len += len(piece)
        if pending_len >= size:
            yield pending
            pending, pending_len = [], 0
            if room is not None:
                size = max(1, min(target, await room(total)))
    if pending:
        yield pending


async def ingest(
    storage: Storage,
    body: AsyncIterator[bytes],
    request: UploadRequest,
    *,
    file_id: str,
    max_size: int,
    max_decode_ratio: float,
    buffer_size: int,
    levels: Mapping[str, int],
    publisher: Publisher,
    room: int | None = None,
    source: str = "upload",
    with_body: Callable[[UploadRequest], UploadRequest] | None = None,
    screen: Callable[[UploadRequest, int], Awaitable[UploadRequest]] | None = None,
) -> tuple[FileRecord, bytes | None]:
    """Stream ``body`` into storage as file ``file_id`` and hand it, verified, to ``publisher`` (which publishes
    it by committing the writer). ``room``: the most original bytes the owner's quota allows (QuotaExceeded
    beyond, before reading when a size is declared); the request's intent is settled already. Returns the record,
    and the original bytes when the whole file fits in the sniffed head (``SNIFF_BYTES``), which the pipeline
    holds anyway: an inline descriptor of a small file needs no read back. ``request`` is only read;
    ``with_body(request)``: the request completed by what came with the body (a form's fields), once it ended;
    ``screen(request, size)``: then the deployment's pre-upload hook, asked before anything is published (a form's
    file name comes with its body)."""
    publisher.check_intent(request.intent)
    # reject before reading a byte (RFC 9110 §15.5.14); the body as sent is held to the limit in any coding
    if request.declared_length is not None and request.declared_length > max_size:
        raise TooLarge(
            f"Content-Length {request.declared_length} exceeds the limit of {max_size} bytes", limit=max_size
        )
    if request.expected_size is not None and request.expected_size > max_size:
        raise TooLarge(f"declared size exceeds the limit of {max_size} bytes", limit=max_size)

    if room is not None:
        plain = request.body_encoding is ContentEncoding.NONE  # then the body as sent is the original
        for declared in (request.expected_size, request.declared_length if plain else None):
            if declared is not None and declared > room:
                raise _quota_exceeded(room)
    digests = _Digests(request, DecodeLimits(max_size, max_decode_ratio), levels, buffer_size, room=room)
    Queue = asyncio.Queue[list[bytes] | None]
    received = 0

    async def produce(queue: Queue, pace: Callable[[int], Awaitable[int]] | None) -> None:
        nonlocal received
        size = buffer_size if pace is None else min(buffer_size, PACED_BATCH)
        async for batch in _batches(body, size, max_size, request.declared_length, pace):
            received += sum(map(len, batch))
            await queue.put(batch)
        await queue.put(None)

    async def consume(queue: Queue, writer: ObjectWriter) -> None:
        pending_write: asyncio.Task[None] | None = None

        # a writer that takes several pieces in one call (local storage: one writev) is given them so
        many = getattr(writer, "write_many", None)

        async def write_all(pieces: list[bytes]) -> None:
            if many is not None and len(pieces) > 1:
                await many(pieces)
                return
            for piece in pieces:
                await writer.write(piece)

        async def drain() -> None:
            # one step decodes while the previous step's output is written: at most two steps' output in memory
            nonlocal pending_write
            done = False
            while not done:
                pieces, done = digests.step() if digests.cheap else await asyncio.to_thread(digests.step)
                if pending_write is not None:
                    await pending_write
                    pending_write = None
                if pieces:
                    pending_write = asyncio.create_task(write_all(pieces))

        try:
            while (batch := await queue.get()) is not None:
                digests.begin(batch)
                await drain()
            digests.begin_finish()
            await drain()
            if pending_write is not None:
                await pending_write
        finally:
            # never abandon a write in flight: its worker thread would outlive the abort of the writer
            if pending_write is not None and not pending_write.done():
                await asyncio.wait([pending_write])
            if pending_write is not None and pending_write.done() and not pending_write.cancelled():
                pending_write.exception()  # retrieved: the first error is already on its way up

    async with storage.create(object_key(file_id), size_hint=request.expected_size) as writer:
        # a writer whose memory is budgeted (S3's part buffers) paces the reading of the body; the bytes it is given
        # are the body's own only without a coding to undo or apply
        identity = request.body_encoding is ContentEncoding.NONE and request.store_encoding is ContentEncoding.NONE
        pace = getattr(writer, "room_after", None) if identity else None
        queue: Queue = asyncio.Queue(maxsize=QUEUED_BATCHES if pace is None else PACED_QUEUED_BATCHES)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(produce(queue, pace))
                tg.create_task(consume(queue, writer))
        except BaseExceptionGroup as group:
            raise first_error(group) from None

        if with_body is not None:
            request = with_body(request)
        if screen is not None:  # refused: the writer is aborted below, nothing was published
            request = await screen(request, digests.size)
        _verify(request, digests, received)
        head = bytes(digests.head)
        original_hex = digests.original.hexdigest()
        candidate = request_candidate(
            request,
            file_id,
            size=digests.size,
            sha256=original_hex,
            head=head,
            source=source,
            file_id=file_id,
            encoded_size=writer.bytes_written,
            encoded_sha256=digests.stored.hexdigest() if digests.stored is not None else original_hex,
            # a small object's group commit flushes the charge written just before it: one wait on the disk
            flushed_by_place=flushes_earlier_writes(writer),
        )
        record = await publisher.publish(candidate, lambda record: writer.commit(record.to_metadata()))
    return record, head if digests.size <= len(head) else None


def request_candidate(
    request: UploadRequest,
    upload_id: str,
    *,
    size: int,
    sha256: str,
    head: bytes,
    source: str,
    **extra: Any,
) -> Candidate:
    """What an upload of ``request`` hands the publisher: its bytes' ``size``, ``sha256`` and first bytes, and the
    request's own intent and stored encoding; ``extra``: other candidate fields."""
    return Candidate(
        owner=request.owner,
        upload_id=upload_id,
        size=size,
        sha256=sha256,
        head=head,
        source=source,
        intent=request.intent,
        encoding=request.store_encoding,
        **extra,
    )


def _quota_exceeded(room: int) -> QuotaExceeded:
    return QuotaExceeded(f"the upload goes beyond the {room} bytes this key's quota has room for", room=room)


def first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error that started a task group's failure (the others are usually its consequences)."""
    first = group.exceptions[0]
    return first_error(first) if isinstance(first, BaseExceptionGroup) else first


def _verify(request: UploadRequest, digests: _Digests, received: int) -> None:
    if request.declared_length is not None and received != request.declared_length:
        raise ContentLengthMismatch(
            f"received {received} bytes but {request.declared_length} were declared",
            received=received,
            declared=request.declared_length,
        )
    if digests.body is not None and digests.body.digest() != request.body_sha256:
        raise DigestMismatch("sha-256 of the received body does not match the request's digest field")
    if request.expected_size is not None and digests.size != request.expected_size:
        raise SizeMismatch(
            f"received {digests.size} bytes but the declared size is {request.expected_size}",
            received=digests.size,
            declared=request.expected_size,
        )
    if request.checksum is not None and checksum_hex(request.checksum) != digests.original.hexdigest():
        raise ChecksumMismatch(
            "SHA-256 of the uploaded content does not match the declared checksum",
            expected=request.checksum,
            actual="sha256:" + digests.original.hexdigest(),
        )
