"""Chunked upload sessions (the seed's ``streaming`` mode): the index-addressed view of the one upload state
machine (:mod:`transfer.core.uploads.state`, whose transition table decides every state change) and the chunk
arithmetic. Pure.

States and transitions, as sessions see them (anything not listed is refused with the error named):

    OPEN       --put chunk-->  OPEN
    OPEN       --complete-->   COMPLETED      all chunks present, lengths right, SHA-256 verified
    OPEN       --abort------>  ABORTED
    OPEN       --clock ≥ expires_at-->  EXPIRED   (derived from the clock; garbage collection deletes it)
    COMPLETED  --put chunk-->  session_completed (409) unless the same bytes are already stored (a no-op)
    ABORTED    --anything-->   session_aborted (410)
    EXPIRED    --anything-->   session_expired (410)

Chunk ``i`` covers bytes ``[i * chunk_size, min((i + 1) * chunk_size, size))``. When the size is not declared at
creation, every chunk but the last must be exactly ``chunk_size``, the size is declared at completion, and the
chunk indices stop where ``max_size`` (the service's size limit) would end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Self

from transfer.core.model.naming import sanitize_filename
from transfer.core.uploads.state import (
    Part,
    UploadEvent,
    UploadRecord,
    UploadState,
    compact_ranges,
    parts_from_json,
    parts_to_json,
)
from transfer.errors import (
    ChunkLengthMismatch,
    ChunkOutOfRange,
    InvalidRequest,
    SessionAborted,
    SessionExpired,
    SessionIncomplete,
    TooLarge,
)

SessionState = UploadState  # a session's states are the upload engine's

__all__ = ["Session", "SessionState", "compact_ranges", "plan_chunk_size", "total_chunks"]


def total_chunks(size: int, chunk_size: int) -> int:
    """Chunks needed for ``size`` bytes (0 for an empty file)."""
    return -(-size // chunk_size)


def plan_chunk_size(requested: int | None, *, default: int, minimum: int, maximum: int) -> int:
    """The chunk size of a new session: the requested one within [minimum, maximum], else the default."""
    size = default if requested is None else requested
    if not minimum <= size <= maximum:
        raise InvalidRequest(
            f"chunk_size must be between {minimum} and {maximum} bytes", minimum=minimum, maximum=maximum
        )
    return size


@dataclass(frozen=True, slots=True, kw_only=True)
class Session(UploadRecord):
    """Everything persisted about a session (JSON in the storage backend): the shared fields of every upload, and
    its size, chunking and the index of its stored chunks."""

    size: int | None = None
    chunk_size: int
    checksum: str | None = None  # declared sha256:<hex> of the whole
    chunk_digests: list[str] = field(default_factory=list)  # xxh3-128 hex per chunk, once completed
    max_size: int | None = None  # the largest file it may make (the service's limit when it was opened)
    parts: dict[int, Part] = field(default_factory=dict)  # chunk index -> size and digests: the stored chunks
    staged: bool = False  # chunks are written at their offsets into one staged object, not stored one by one

    @property
    def name(self) -> str:
        """The name the file will have (as its descriptor shows it: sanitised, ``upload`` when none was given)."""
        return sanitize_filename(self.intent.name, default="upload")

    @property
    def content_type(self) -> str | None:
        """The media type the client declared for the file (None: sniffed at completion)."""
        return self.intent.content_type

    @property
    def total_chunks(self) -> int | None:
        """How many chunks the session has (None while its size is unknown)."""
        return None if self.size is None else total_chunks(self.size, self.chunk_size)

    @property
    def max_chunks(self) -> int | None:
        """How many chunks may be stored: all of them when the size is known, else as many as the size limit
        allows (so an unknown size cannot be a way around the limit)."""
        if self.size is not None:
            return total_chunks(self.size, self.chunk_size)
        return None if self.max_size is None else total_chunks(self.max_size, self.chunk_size)

    def require_open(self, now: float) -> None:
        """Refuse unless chunks may still be stored (the table's PUT_PART)."""
        self.after(UploadEvent.PUT_PART, now, noun="session")

    @property
    def stored(self) -> dict[int, int]:
        """index -> length of every stored chunk (from the record's index, never a listing)."""
        return {index: part.size for index, part in self.parts.items()}

    def require_readable(self, now: float) -> None:
        """Raise SessionAborted or SessionExpired unless the session can be read at ``now``."""
        state = self.state_at(now)
        if state is SessionState.ABORTED:
            raise SessionAborted(f"session {self.id} was aborted")
        if state is SessionState.EXPIRED:
            raise SessionExpired(f"session {self.id} expired")

    def check_index(self, index: int) -> None:
        """Raise ChunkOutOfRange unless ``index`` is a chunk index the session can have."""
        limit = self.max_chunks
        if index < 0 or (limit is not None and index >= limit):
            message = f"chunk {index} is outside 0..{(limit or 0) - 1}" if limit is not None else f"chunk {index} < 0"
            if self.size is None and limit is not None:
                message += f" (an unknown size still ends at the limit of {self.max_size} bytes)"
            raise ChunkOutOfRange(message, total_chunks=self.total_chunks)

    def expected_length(self, index: int) -> int | None:
        """The exact length of chunk ``index``; None when the size is unknown (then: at most chunk_size)."""
        self.check_index(index)
        if self.size is None:
            return None
        return min(self.chunk_size, self.size - index * self.chunk_size)

    def check_length(self, index: int, length: int) -> None:
        """Raise ChunkLengthMismatch unless chunk ``index`` may have ``length`` bytes."""
        expected = self.expected_length(index)
        if expected is None:
            if not 0 < length <= self.chunk_size:
                raise ChunkLengthMismatch(f"chunk {index} has {length} bytes; at most {self.chunk_size} allowed")
        elif length != expected:
            raise ChunkLengthMismatch(f"chunk {index} has {length} bytes; expected {expected}", expected=expected)

    def completion_plan(self, stored: dict[int, int], declared_size: int | None) -> tuple[int, int]:
        """Check that the stored chunks (index -> length) make the whole file; return (size, total_chunks)."""
        size = self.size if self.size is not None else declared_size
        if size is None:
            raise InvalidRequest("this session has no declared size: complete it with 'size'")
        if self.size is not None and declared_size is not None and declared_size != self.size:
            raise InvalidRequest(f"size {declared_size} differs from the session's {self.size}")
        if self.max_size is not None and size > self.max_size:
            raise TooLarge(f"size exceeds the limit of {self.max_size} bytes", limit=self.max_size)
        total = total_chunks(size, self.chunk_size)
        missing = [i for i in range(total) if i not in stored]
        extra = [i for i in stored if i >= total]
        if missing or extra:
            raise SessionIncomplete(
                f"{len(missing)} chunk(s) missing" + (f", {len(extra)} beyond the end" if extra else ""),
                missing=compact_ranges(missing),
                beyond_end=compact_ranges(extra),
            )
        for i in range(total):
            expected = min(self.chunk_size, size - i * self.chunk_size)
            if stored[i] != expected:
                raise ChunkLengthMismatch(f"chunk {i} has {stored[i]} bytes; expected {expected}", index=i)
        return size, total

    def to_json(self) -> dict[str, Any]:
        """The session's record as stored."""
        return {
            **self.base_json(),
            "size": self.size,
            "chunk_size": self.chunk_size,
            "checksum": self.checksum,
            "chunk_digests": self.chunk_digests,
            "max_size": self.max_size,
            "parts": parts_to_json(self.parts),
            "staged": self.staged,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        """The session a stored record holds (one written before intents were kept whole: from its flat fields)."""
        return cls(
            **cls.base_fields(doc),
            size=doc.get("size"),
            chunk_size=int(doc["chunk_size"]),
            checksum=doc.get("checksum"),
            chunk_digests=list(doc.get("chunk_digests") or []),
            max_size=doc.get("max_size"),
            parts=parts_from_json(doc.get("parts")),
            staged=bool(doc.get("staged")),
        )
