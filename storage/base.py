"""The storage protocol: a small async core that every backend implements, plus optional capabilities.

Core (every backend):
    ``create(key)``      -> an :class:`ObjectWriter`; bytes written to it are invisible until ``commit``;
                            ``abort`` (or leaving the ``async with`` block with an exception) discards them.
    ``open(key)``        -> an :class:`ObjectReader` pinned to one version of the object: its ``info`` and the
                            bytes of every ``read`` belong together even if the key is replaced meanwhile.
    ``stat(key)``        -> :class:`ObjectInfo`
    ``delete(key)``      idempotent
    ``list(prefix, start_after=, limit=, metadata=)``
                         published objects whose key starts with ``prefix``, in ascending byte order of key,
                         a page at a time; metadata only when asked for

Compare-and-set: every published object has a version token, ``ObjectInfo.etag`` (opaque; changed by every
publish of other bytes). ``create(key, if_match=etag)`` publishes only if the key's current version is still
``etag``, else its commit raises ObjectChanged and nothing changes; ``create(key, if_absent=True)`` publishes
only if the key has no object (ObjectExists). A record that several requests, processes or replicas update (an
upload's index of parts) is read with its etag and written back ``if_match``, retried on ObjectChanged.

Capabilities (tusd's composer idea): a backend declares at start-up which optional interfaces it implements, in
``capabilities``; the service checks the set, never the backend's class. Extension interfaces are one-method
protocols below (``SupportsPresign``); :func:`capable` gives the backend as one of them when, and only when, it
declares the capability. Every capability has a reader in the service; one nobody reads is removed.

The backend stores bytes and a flat ``dict[str, str]`` of metadata (ASCII, as S3 user metadata). It knows nothing
of descriptors, checksums or HTTP: the service decides what to write and when it is verified enough to commit.
"""

from __future__ import annotations

import enum
import re
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Protocol, Self, TypeVar, cast, runtime_checkable

from storage.errors import InvalidKey, StorageError

# Keys are chosen by the service, never taken from user paths; this pattern keeps them safe on every backend.
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}(/[A-Za-z0-9][A-Za-z0-9._-]{0,200}){0,8}$")


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe object key (no traversal, no empty or dot segments), else raise InvalidKey."""
    if not _KEY_RE.match(key) or any(part in (".", "..") for part in key.split("/")):
        raise InvalidKey(f"invalid object key: {key!r}")
    return key


class Capability(enum.Enum):
    """Optional abilities a backend may declare."""

    PRESIGN = "presign"  # the backend can mint its own time-limited GET URLs (SupportsPresign)
    COMPOSE = "compose"  # concatenate existing objects into a new one (SupportsCompose)
    ATOMIC_IF_ABSENT = "atomic_if_absent"  # create(if_absent=True) holds under concurrent writers too
    ABANDONED_UPLOADS = "abandoned_uploads"  # unfinished uploads outlive dead writers (SupportsAbandonedUploads)
    ATOMIC_IF_MATCH = "atomic_if_match"  # create(if_match=...) holds under concurrent writers of other processes too
    DIRECT_UPLOAD = "direct_upload"  # clients upload parts straight to the backend (SupportsDirectUpload)
    WRITE_AT_OFFSET = (
        "write_at_offset"  # staged objects written at offsets, published by rename (SupportsWriteAtOffset)
    )
    COPY_RANGE = "copy_range"  # a writer appends ranges of published objects server-side (CopiesRanges)


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a backend knows of one published object."""

    key: str
    size: int
    modified: datetime
    metadata: Mapping[str, str] = field(default_factory=dict)
    # the version token of this publish, what ``create(key, if_match=...)`` compares: changed by every publish of
    # other bytes (S3: the ETag, which for a single PUT is the MD5 of the bytes; local: new at every publish)
    etag: str = ""


class ObjectWriter(Protocol):
    """A new object being written. Nothing is visible under its key until :meth:`commit` returns."""

    @property
    def bytes_written(self) -> int: ...

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes. Raises StorageFull / BackendUnavailable; the writer must then be aborted."""

    async def commit(self, metadata: Mapping[str, str]) -> ObjectInfo:
        """Publish atomically under the key with ``metadata``; replaces an existing object of that key unless the
        writer was created ``if_absent`` (then ObjectExists) or ``if_match`` a version that is no longer the
        key's current one, or of a key that has no object any more (then ObjectChanged). Nothing changes when
        it raises."""

    async def abort(self) -> None:
        """Discard everything written; idempotent, safe after a failed write or commit."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Abort unless committed."""


@runtime_checkable
class CopiesRanges(Protocol):
    """Capability COPY_RANGE, of a backend's writers: append a range of a published object without its bytes passing
    through this process (local: ``copy_file_range``, which shares the extents where the filesystem can reflink;
    S3: ``UploadPartCopy`` with ``CopySourceRange``). The caller still reads what it must verify; what it saves is
    the write. A writer may take a copy only where its engine's rules allow (S3: every part but the last at least
    5 MiB), so the caller asks :meth:`copy_lead` first, and writes the lead before it copies the rest."""

    def copy_lead(self, length: int) -> int | None:
        """For a range of ``length`` bytes about to be appended: how many of its first bytes must go through
        ``write`` before the rest may be copied (0: all of it may), or None when the range is not worth copying
        or the engine's rules do not allow it here (write all of it)."""

    async def copy_range(self, source: ObjectReader, start: int, end: int) -> None:
        """Append bytes ``[start, end)`` of the version ``source`` has open (the same bytes its ``read`` gives: a
        replaced or deleted object is not copied in its stead: local storage copies from the open descriptor, S3
        fails the commit with ObjectChanged when the source changed or went). Only where :meth:`copy_lead` said
        so (ValueError otherwise). Raises as ``write`` does; the writer must then be aborted."""


class ObjectReader(Protocol):
    """One version of a published object, open for reading."""

    @property
    def info(self) -> ObjectInfo: ...

    def read(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Yield the bytes ``[start, end)`` in pieces of at most the backend's buffer size."""

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class WriterContext:
    """``async with`` for writers: leaving the block without a commit aborts."""

    _done: bool

    async def abort(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._done:
            await self.abort()


def flushes_earlier_writes(writer: object) -> bool:
    """Whether ``writer``'s commit, once it has returned, has also made durable every write its storage finished
    before the commit began (a flush of the whole filesystem: local storage's ``syncfs`` group commit of a small
    object). A record written just before without a flush of its own is then as durable as the object, with no
    second wait on the disk. False for a writer that does not say so (the safe answer)."""
    return bool(getattr(writer, "flushes_earlier_writes", False))


class ReaderContext:
    """``async with`` for readers: leaving the block closes."""

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class Storage(Protocol):
    """The core every backend implements."""

    @property
    def capabilities(self) -> frozenset[Capability]: ...

    async def start(self) -> None:
        """Check the backend is usable (directories, bucket, credentials); raise a StorageError otherwise."""

    async def close(self) -> None: ...

    def create(
        self,
        key: str,
        *,
        size_hint: int | None = None,
        if_absent: bool = False,
        if_match: str | None = None,
        durable: bool = True,
    ) -> ObjectWriter:
        """A writer for a new object. With ``if_absent``, commit publishes only if no object has the key (else
        ObjectExists, and nothing changes): the compare-and-set that concurrent writers and replicas rely on.
        With ``if_match``, commit publishes only if the key's current version (``ObjectInfo.etag``) is that one
        (else ObjectChanged, and nothing changes). The two are exclusive (ValueError).
        ``durable=False`` lets a backend skip flushing to stable storage (the publish stays atomic): for
        intermediate objects whose content is verified again before it matters (chunks of a session)."""

    async def open(self, key: str) -> ObjectReader:
        """Raise ObjectNotFound when the key has no published object."""

    async def stat(self, key: str) -> ObjectInfo: ...

    async def delete(self, key: str) -> None: ...

    def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None, metadata: bool = False
    ) -> AsyncIterator[ObjectInfo]:
        """Published objects whose key starts with ``prefix`` (a plain string prefix, as in S3: ``files/a`` also
        matches ``files/ab``), in ascending byte order of key, only keys greater than ``start_after``, at most
        ``limit`` of them. The cost is of the page, not of everything stored: a backend reads only what lies under
        ``prefix`` after ``start_after``. Without ``metadata`` the infos carry an empty metadata mapping and no
        per-key metadata is read. An object deleted while the listing runs may or may not appear."""
        ...


@runtime_checkable
class SupportsCompose(Protocol):
    """Capability COMPOSE: a new object made of existing ones, concatenated in order, without the bytes passing
    through the caller (local: copy_file_range; S3: UploadPartCopy + CompleteMultipartUpload). Sources stay."""

    async def compose(self, key: str, sources: list[str], metadata: Mapping[str, str]) -> ObjectInfo: ...


class RegionWriter(Protocol):
    """Bytes ``[offset, offset + length)`` of a staged object (:class:`SupportsWriteAtOffset`), written in order from
    ``offset``. From entering its ``async with`` until leaving it, the writer holds its region: another writer of
    an overlapping region of the same staged object, in this process or any other sharing the backend, waits to
    enter. Leaving releases the region; it neither flushes nor undoes what was written."""

    @property
    def bytes_written(self) -> int: ...

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """The next bytes of the region (ValueError past its end; StorageFull / BackendUnavailable)."""

    async def flush(self) -> None:
        """Return once every byte written so far is on stable storage."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


@runtime_checkable
class SupportsWriteAtOffset(Protocol):
    """Capability WRITE_AT_OFFSET: a staged object — invisible to ``open``, ``stat`` and ``list`` — whose parts are
    written straight at their offsets, in any order and from several processes at once, and which is published
    whole under a key by a rename, so no byte is copied to assemble it (local: one preallocated file). Staged
    names are keys too, in their own namespace: a staged object never collides with a published one."""

    async def create_staged(self, staged: str, size: int | None) -> None:
        """Create ``staged``, empty (idempotent); with ``size``, space for that many bytes is reserved now."""
        ...

    def write_region(self, staged: str, offset: int, length: int) -> RegionWriter:
        """A writer of ``[offset, offset + length)`` of ``staged``; entering it raises ObjectNotFound once
        ``staged`` is published or discarded (or was never created)."""
        ...

    def read_staged(self, staged: str, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes ``[start, end)`` of ``staged`` as they are now (a hole reads as zeros; ObjectNotFound if it does
        not exist; BackendUnavailable if it ends before ``end``)."""
        ...

    async def publish_staged(self, staged: str, key: str, size: int, metadata: Mapping[str, str]) -> ObjectInfo:
        """Cut ``staged`` to ``size`` bytes, flush it and make it the object ``key`` (replacing one) with
        ``metadata``, atomically; ``staged`` no longer exists afterwards (ObjectNotFound if it did not exist)."""
        ...

    async def discard_staged(self, staged: str) -> None:
        """Remove ``staged`` and what was written to it; idempotent."""
        ...


@runtime_checkable
class SupportsAbandonedUploads(Protocol):
    """A backend whose unfinished uploads outlive a writer that died (S3 multipart uploads after a SIGKILL)."""

    async def abort_abandoned_uploads(self, older_than: float) -> int:
        """Abort unfinished uploads started more than ``older_than`` seconds ago; returns how many."""
        ...


@runtime_checkable
class SupportsPresignPut(Protocol):
    """With capability PRESIGN: a URL the backend itself accepts one PUT of ``key`` at, for ``expires_in`` seconds,
    so that bytes go straight to the backend. The object appears under ``key`` as sent (no metadata of ours)."""

    async def presign_put(
        self, key: str, *, expires_in: int, content_type: str | None = None, content_length: int | None = None
    ) -> str:
        """A PUT URL valid for ``expires_in`` seconds (the backend may cap it); ``content_type`` and
        ``content_length``, when given, are signed: the request must send exactly those header fields."""
        ...


@runtime_checkable
class SupportsPresign(Protocol):
    """Capability PRESIGN: a URL the backend itself serves, valid for ``expires_in`` seconds."""

    async def presign_get(
        self,
        key: str,
        *,
        expires_in: int,
        content_type: str | None = None,
        content_encoding: str | None = None,
        content_disposition: str | None = None,
    ) -> str:
        """A GET URL valid for ``expires_in`` seconds (the backend may cap it) whose responses carry the given
        Content-Type, Content-Encoding and Content-Disposition."""


REPLICA_CAPABILITIES = {
    Capability.ATOMIC_IF_MATCH: "compare-and-set (If-Match) is not atomic on it, so two replicas could overwrite "
    "each other's upload records",
    Capability.ATOMIC_IF_ABSENT: "create-if-absent (If-None-Match) is not atomic on it, so two replicas could both "
    "take one new id or part",
}


def replica_hazards(storage: Storage) -> list[str]:
    """Why several processes must not share ``storage`` (empty when they may): the capabilities that records
    updated by replicas rely on, missing on this backend (as declared after ``start``: probed on S3)."""
    return [why for capability, why in REPLICA_CAPABILITIES.items() if capability not in storage.capabilities]


class UnsafeForReplicas(StorageError):
    """The backend cannot be shared by several replicas and the operator did not say this one runs alone."""

    def __init__(self, hazards: list[str]) -> None:
        super().__init__(
            "the storage backend cannot be shared by replicas: "
            + "; ".join(hazards)
            + ". Run one process on it and say so with TRANSFER_SINGLE_REPLICA=true (transfer serve --single-replica)"
        )


def require_replica_safe(storage: Storage, single_replica: bool) -> None:
    """Raise :class:`UnsafeForReplicas` unless ``storage`` is safe for replicas or the process runs alone."""
    hazards = replica_hazards(storage)
    if hazards and not single_replica:
        raise UnsafeForReplicas(hazards)


Interface = TypeVar("Interface")


def capable(storage: Storage, capability: Capability, interface: Callable[..., Interface]) -> Interface | None:
    """``storage`` as ``interface`` when it declares ``capability``, else None. The declaration decides (a backend
    may implement a method yet declare it unusable, as S3 without an atomic check); ``interface`` (a runtime
    protocol) only types the result."""
    if capability in storage.capabilities and isinstance(storage, interface):  # type: ignore[arg-type]
        return cast(Interface, storage)
    return None


@dataclass(frozen=True, slots=True)
class StoredPart:
    """One part of a direct upload as the backend holds it."""

    number: int  # 1-based
    size: int
    etag: str
    sha256_b64: str | None = None  # the backend's own SHA-256 of the part (S3 additional checksums), when it keeps one


@dataclass(frozen=True, slots=True)
class PartUrl:
    """Where and how a client sends one part: ``method`` to ``url`` with exactly ``headers``, until ``expires_in``
    seconds after it was minted."""

    url: str
    method: str
    headers: Mapping[str, str]
    expires_in: int


@runtime_checkable
class SupportsDirectUpload(Protocol):
    """Capability DIRECT_UPLOAD: the client sends the bytes of a new object to the backend itself, in parts, with
    URLs the backend verifies (S3: presigned UploadPart with a signed ``x-amz-checksum-sha256``). The service never
    sees the bytes; it assembles the parts, reads the assembled bytes back to verify them, and only then publishes
    them under the key (until then the key has no object: ``open``, ``stat`` and ``list`` do not see it)."""

    async def begin_direct_upload(self, key: str) -> str:
        """Start an upload of ``key``; returns its upload id."""
        ...

    async def presign_part(
        self, key: str, upload_id: str, number: int, *, sha256_b64: str, size: int, expires_in: int
    ) -> PartUrl:
        """A URL for part ``number`` that the backend accepts only with ``size`` bytes whose SHA-256 is
        ``sha256_b64`` (base64 of the digest)."""
        ...

    async def list_direct_parts(self, key: str, upload_id: str) -> list[StoredPart]:
        """The parts stored so far, by number (ObjectNotFound if the upload is gone)."""
        ...

    async def assemble_direct_upload(self, key: str, upload_id: str, parts: list[StoredPart]) -> None:
        """Join ``parts`` into the bytes of ``key``, still unpublished; the upload id is used up."""
        ...

    def read_assembled(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        """The assembled, unpublished bytes ``[start, end)`` of ``key``, in order."""
        ...

    async def publish_assembled(self, key: str, metadata: Mapping[str, str]) -> ObjectInfo:
        """Make the assembled bytes of ``key`` a published object with ``metadata``."""
        ...

    async def discard_direct_upload(self, key: str, upload_id: str | None) -> None:
        """Abort the upload (if ``upload_id``) and delete assembled, unpublished bytes of ``key`` (a published
        object stays: a completion published it); idempotent."""
        ...
