"""The storage protocol: a small async core that every backend implements, plus optional capabilities.

Core (every backend):
    ``create(key)``      -> an :class:`ObjectWriter`; bytes written to it are invisible until ``commit``;
                            ``abort`` (or leaving the ``async with`` block with an exception) discards them.
    ``open(key)``        -> an :class:`ObjectReader` pinned to one version of the object: its ``info`` and the
                            bytes of every ``read`` belong together even if the key is replaced meanwhile.
    ``stat(key)``        -> :class:`ObjectInfo`
    ``delete(key)``      idempotent
    ``list(prefix)``     published objects only

Compare-and-set: every published object has a version token, ``ObjectInfo.etag`` (opaque; changed by every
publish of other bytes). ``create(key, if_match=etag)`` publishes only if the key's current version is still ``etag``, else its
commit raises ObjectChanged and nothing changes; ``create(key, if_absent=True)`` publishes only if the key has no
object (ObjectExists). A record that several requests, processes or replicas update (an upload's index of parts)
is read with its etag and written back ``if_match``, retried on ObjectChanged.

Capabilities (tusd's composer idea): a backend declares at start-up which optional interfaces it implements, in
``capabilities``; the service checks the set, never the backend's class. Extension interfaces are one-method
protocols below (``SupportsPresign``).

The backend stores bytes and a flat ``dict[str, str]`` of metadata (ASCII, as S3 user metadata). It knows nothing
of descriptors, checksums or HTTP: the service decides what to write and when it is verified enough to commit.
"""

from __future__ import annotations

import enum
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from storage.errors import InvalidKey

# Keys are chosen by the service, never taken from user paths; this pattern keeps them safe on every backend.
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}(/[A-Za-z0-9][A-Za-z0-9._-]{0,200}){0,8}$")


def validate_key(key: str) -> str:
    """Return ``key`` if it is a safe object key (no traversal, no empty or dot segments), else raise InvalidKey."""
    if not _KEY_RE.match(key) or any(part in (".", "..") for part in key.split("/")):
        raise InvalidKey(f"invalid object key: {key!r}")
    return key


class Capability(enum.Enum):
    """Optional abilities a backend may declare."""

    RANGED_READ = "ranged_read"  # read(start, end) costs O(end - start), not O(start)
    PRESIGN = "presign"  # the backend can mint its own time-limited GET URLs (SupportsPresign)
    MULTIPART = "multipart"  # parts uploaded independently and combined server-side
    COMPOSE = "compose"  # concatenate existing objects into a new one
    ATOMIC_IF_ABSENT = "atomic_if_absent"  # create(if_absent=True) holds under concurrent writers too
    ATOMIC_IF_MATCH = "atomic_if_match"  # create(if_match=...) holds under concurrent writers of other processes too


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

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]: ...


@runtime_checkable
class SupportsCompose(Protocol):
    """Capability COMPOSE: a new object made of existing ones, concatenated in order, without the bytes passing
    through the caller (local: copy_file_range; S3: UploadPartCopy + CompleteMultipartUpload). Sources stay."""

    async def compose(self, key: str, sources: list[str], metadata: Mapping[str, str]) -> ObjectInfo: ...


@runtime_checkable
class SupportsAbandonedUploads(Protocol):
    """A backend whose unfinished uploads outlive a writer that died (S3 multipart uploads after a SIGKILL)."""

    async def abort_abandoned_uploads(self, older_than: float) -> int:
        """Abort unfinished uploads started more than ``older_than`` seconds ago; returns how many."""
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
