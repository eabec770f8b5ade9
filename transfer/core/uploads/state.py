"""The one upload state machine behind every resumable upload (tus and IETF uploads, chunked sessions, direct-upload
plans, upload authorisations, chunked deduplicating uploads), written as an executable transition table, as h11
writes HTTP/1.1's, and the record every kind of upload shares. Pure: no I/O.

    state      event            next state
    OPEN       PUT_PART         OPEN        a part is stored and enters the record's index
    OPEN       DECLARE_LENGTH   OPEN        tus creation-defer-length; a session's size at completion
    OPEN       COMPLETE         COMPLETED   every byte present and verified; the file is published
    OPEN       ABORT            ABORTED     tus termination, session abort, plan abort
    OPEN       EXPIRE           EXPIRED     (the clock decided: an open upload past its expiry is EXPIRED already)
    COMPLETED  COMPLETE         COMPLETED   a second completion (a HEAD and the last PATCH, two replicas): one outcome
    EXPIRED    EXPIRE           EXPIRED     the sweep records what the clock decided

An OPEN record past its ``expires_at`` is EXPIRED whether or not the sweep has recorded it yet
(:meth:`UploadRecord.state_at`); events are judged on that derived state. So a completion racing an abort on two
replicas has one outcome: whichever compare-and-set comes first moves the record, and the other is refused by the
table (410 ``session_aborted`` for the completion, whose file then goes again; 409 ``session_completed`` for the
abort).

Any other (state, event) pair raises the refusal of the current state (SessionCompleted 409, SessionAborted 410,
SessionExpired 410), carrying the state and the event.

The record of an upload indexes its parts: address -> :class:`Part` (size and digests), where the address is the
byte offset (tus) or the chunk index (sessions). Every per-request path reads this index; none lists storage.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Self

from transfer.core.model.content import FileRole
from transfer.errors import SessionAborted, SessionCompleted, SessionExpired, TransferError


class UploadState(enum.StrEnum):
    """The states of every resumable upload in the transition table."""

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
    (S.EXPIRED, E.EXPIRE): S.EXPIRED,
}

_REFUSALS: Mapping[UploadState, tuple[type[TransferError], str]] = {
    S.OPEN: (SessionCompleted, "is still open"),  # unreachable while every event is legal from OPEN
    S.COMPLETED: (SessionCompleted, "is already completed"),
    S.ABORTED: (SessionAborted, "was aborted"),
    S.EXPIRED: (SessionExpired, "expired"),
}
ENDED = frozenset({S.COMPLETED, S.ABORTED, S.EXPIRED})


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
class FileIntent:
    """What the file an upload makes is to be: its name, media type (the client's own word, or a hint that came with
    the body, perhaps a tool's default), role, description and lifetime in seconds from its publication (as asked by
    the client until the engine settles it against the key's and the service's policy; then as granted). One type
    from the front door that parses it, through the upload's record, to the publisher that applies it."""

    name: str | None = None
    content_type: str | None = None
    hinted_type: str | None = None
    role: FileRole | None = None
    description: str | None = None
    lifetime: int | None = None
    metadata: Mapping[str, str] | None = None  # what the deployment's pre-upload hook gave the file

    def to_json(self) -> dict[str, Any]:
        """The intent as a record stores it (fields that are not set are left out)."""
        doc: dict[str, Any] = {
            "name": self.name,
            "content_type": self.content_type,
            "hinted_type": self.hinted_type,
            "role": None if self.role is None else self.role.value,
            "description": self.description,
            "lifetime": self.lifetime,
            "metadata": None if not self.metadata else dict(self.metadata),
        }
        return {k: v for k, v in doc.items() if v is not None}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> FileIntent:
        """The intent a record stores (None: nothing was asked)."""
        doc = doc or {}
        role = doc.get("role")
        lifetime = doc.get("lifetime")
        metadata = doc.get("metadata")
        return cls(
            name=_text(doc.get("name")),
            content_type=_text(doc.get("content_type")),
            hinted_type=_text(doc.get("hinted_type")),
            role=FileRole(role) if role else None,
            description=_text(doc.get("description")),
            lifetime=int(lifetime) if isinstance(lifetime, int | float) else None,
            metadata={str(k): str(v) for k, v in metadata.items()} if isinstance(metadata, dict) else None,
        )


NO_INTENT = FileIntent()  # nothing asked for: the defaults apply


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadRecord:
    """What every upload's record holds, whatever its kind: who owns it, its life (state, expiry) and the file it
    makes (its intent; its id once published). A kind's record adds its own
    fields (the index of its parts, its size, ...) by subclassing; only the upload engine writes it."""

    id: str
    owner: str | None = None  # the API key that opened it (None: open mode); other keys get 404
    created_at: float = 0.0
    expires_at: float = 0.0  # after this, an open upload is expired
    state: UploadState = UploadState.OPEN  # as recorded; moved by the transition table alone
    file_id: str | None = None  # the published file, once completed
    intent: FileIntent = FileIntent()

    def state_at(self, now: float) -> UploadState:
        """The upload's state at ``now`` (derived from the clock: see the module text)."""
        return state_at(self.state, self.expires_at, now)

    def after(self, event: UploadEvent, now: float, *, noun: str = "upload", **changes: Any) -> Self:
        """This record after ``event`` at ``now`` (the table's refusal when it may not happen then), with
        ``changes``."""
        detail = {"file_id": self.file_id} if self.file_id else {}
        state = transition(self.state_at(now), event, upload_id=f"{noun} {self.id}", **detail)
        return replace(self, state=state, **changes)

    def base_json(self) -> dict[str, Any]:
        """The shared fields as every kind's record stores them."""
        doc: dict[str, Any] = {
            "id": self.id,
            "owner": self.owner,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "state": self.state.value,
            "file_id": self.file_id,
            "intent": self.intent.to_json(),
        }
        return doc

    @staticmethod
    def base_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
        """The shared fields of a stored record, as keyword arguments (a record written before states were recorded:
        its state from its flags, ``file_id`` and ``terminated``; before intents were kept whole: its intent from
        ``legacy_intent``)."""
        state = doc.get("state")
        if not state:
            finished, ended = doc.get("file_id") is not None, bool(doc.get("terminated"))
            state = UploadState.COMPLETED if finished else UploadState.ABORTED if ended else UploadState.OPEN
        return {
            "id": str(doc["id"]),
            "owner": doc.get("owner"),
            "created_at": float(doc.get("created_at") or 0.0),
            "expires_at": float(doc.get("expires_at") or 0.0),
            "state": UploadState(state),
            "file_id": doc.get("file_id"),
            "intent": FileIntent.from_json(doc["intent"]) if "intent" in doc else legacy_intent(doc),
        }


def legacy_intent(doc: Mapping[str, Any]) -> FileIntent:
    """The intent of a record written before intents were kept whole: its flat fields (``file_ttl`` or
    ``lifetime`` for the lifetime)."""
    lifetime = doc.get("file_ttl", doc.get("lifetime"))
    return FileIntent.from_json(
        {
            "name": doc.get("name"),
            "content_type": doc.get("content_type"),
            "role": doc.get("role"),
            "description": doc.get("description"),
            "lifetime": lifetime,
        }
    )


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
