"""The one upload state machine behind tus uploads (offset-addressed parts), chunked sessions (index-addressed
parts), direct-upload plans (parts in the bucket) and upload authorisations (one PUT), written as an executable
transition table, as h11 writes HTTP/1.1's. Every record's state is moved by :func:`transition` alone. Pure: no I/O.

    state      event            next state
    OPEN       PUT_PART         OPEN        a part is stored and enters the record's index
    OPEN       DECLARE_LENGTH   OPEN        tus creation-defer-length; a session's size at completion
    OPEN       COMPLETE         COMPLETED   every byte present and verified; the file is published
    OPEN       ABORT            ABORTED     tus termination, session abort
    OPEN       EXPIRE           EXPIRED     the clock passed expires_at (the expiry sweep records it)
    COMPLETED  COMPLETE         COMPLETED   a second completion (a HEAD and the last PATCH, two replicas): one outcome

Any other (state, event) pair raises the refusal of the current state (SessionCompleted 409, SessionAborted 410,
SessionExpired 410), carrying the state and the event. An OPEN record whose ``expires_at`` has passed is EXPIRED
whether or not the sweep has recorded it yet (:func:`state_at`).

The record of an upload indexes its parts: address -> :class:`Part` (size and digests), where the address is the
byte offset (tus) or the chunk index (sessions). Every per-request path reads this index; none lists storage.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from transfer.errors import SessionAborted, SessionCompleted, SessionExpired, TransferError


class UploadState(enum.StrEnum):
    """The states of every resumable upload (tus, IETF, sessions, direct plans, authorisations) in the transition
    table."""

    OPEN = "open"
    COMPLETED = "completed"
    ABORTED = "aborted"
    EXPIRED = "expired"


class UploadEvent(enum.StrEnum):
    """What can happen to a resumable upload; the transition table says in which state each is allowed."""

    PUT_PART = "put_part"
    DECLARE_LENGTH = "declare_length"
    COMPLETE = "complete"
    ABORT = "abort"
    EXPIRE = "expire"


S, E = UploadState, UploadEvent
TRANSITIONS: Mapping[tuple[UploadState, UploadEvent], UploadState] = {
    (S.OPEN, E.PUT_PART): S.OPEN,
    (S.OPEN, E.DECLARE_LENGTH): S.OPEN,
    (S.OPEN, E.COMPLETE): S.COMPLETED,
    (S.OPEN, E.ABORT): S.ABORTED,
    (S.OPEN, E.EXPIRE): S.EXPIRED,
    (S.COMPLETED, E.COMPLETE): S.COMPLETED,
}

_REFUSALS: Mapping[UploadState, tuple[type[TransferError], str]] = {
    S.OPEN: (SessionCompleted, "is still open"),  # unreachable while every event is legal from OPEN
    S.COMPLETED: (SessionCompleted, "is already completed"),
    S.ABORTED: (SessionAborted, "was aborted"),
    S.EXPIRED: (SessionExpired, "expired"),
}


def transition(state: UploadState, event: UploadEvent, *, upload_id: str = "upload", **detail: Any) -> UploadState:
    """The state after ``event`` in ``state``; the current state's refusal for a pair the table does not list."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        cls, why = _REFUSALS[state]
        raise cls(
            f"{upload_id} {why}: cannot {event.value.replace('_', ' ')}",
            state=state.value,
            event=event.value,
            **detail,
        ) from None


def state_at(state: UploadState, expires_at: float, now: float) -> UploadState:
    """The state a record is in at ``now``: an open one past its expiry is expired, recorded or not."""
    if state is UploadState.OPEN and now >= expires_at:
        return UploadState.EXPIRED
    return state


@dataclass(frozen=True, slots=True)
class Part:
    """One stored part: its length and the digests of its bytes ("" when unknown: a part adopted after a crash
    stored it but before its record said so)."""

    size: int
    xxh3: str = ""  # xxh3-128, hex
    sha256: str = ""  # hex, when the client sent one (a chunk's Chunk-Checksum: sha256)

    def to_json(self) -> dict[str, Any]:
        """The part as it is stored in its record (digests left out when unknown)."""
        out: dict[str, Any] = {"size": self.size}
        if self.xxh3:
            out["xxh3"] = self.xxh3
        if self.sha256:
            out["sha256"] = self.sha256
        return out


Parts = Mapping[int, Part]


def parts_to_json(parts: Parts) -> dict[str, Any]:
    """An index of parts as stored in a record (addresses as strings, in order)."""
    return {str(address): part.to_json() for address, part in sorted(parts.items())}


def parts_from_json(doc: Mapping[str, Any] | None) -> dict[int, Part]:
    """An index of parts as read from a record (None: no parts)."""
    return {int(address): Part(**value) for address, value in (doc or {}).items()}


def with_part(parts: Parts, address: int, part: Part) -> dict[int, Part]:
    """The index with ``part`` at ``address`` (a new mapping: records are immutable values)."""
    return {**parts, address: part}


def received(parts: Parts) -> int:
    """Bytes stored, over all parts."""
    return sum(part.size for part in parts.values())


def next_offset(parts: Parts) -> int:
    """Where the next offset-addressed part starts: the end of the contiguous run from 0 (tus parts are
    contiguous by construction: each is created at the offset the previous one ended at)."""
    offset = 0
    while offset in parts:
        size = parts[offset].size
        if size <= 0:
            break
        offset += size
    return offset


def compact_ranges(indices: Iterable[int]) -> list[list[int]]:
    """``[0, 1, 2, 5, 7, 8]`` -> ``[[0, 2], [5, 5], [7, 8]]`` (inclusive ranges)."""
    out: list[list[int]] = []
    for i in sorted(set(indices)):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out
