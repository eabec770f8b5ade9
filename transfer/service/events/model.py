"""Events as the service records and sends them: their types, their ids, their payload, and an outbox entry's life.
Pure: no I/O.

Every event is one change of the service's state, and its id follows from that change alone
(:func:`event_id`: the kind of change and the file or upload it changed), so a change retried, repeated by a second
completion of the same upload or made on two replicas at once writes the same id: the outbox creates it if absent,
and a receiver that deduplicates by ``webhook-id`` sees it once.

    change      event type                     id from                   written
    published   file.published                 the file id               before the file is placed
    removed     file.deleted | file.expired    the file id               by the removal's one claimer, before delete
    aborted     upload.aborted                 the upload id             before the abort's compare-and-set
    quota       quota.exceeded                 the upload (or file) id   when the refusal is answered

An entry written before its change is *staged*: it says how to check that the change happened (:class:`Check`),
and is delivered once the process that made the change confirms it (in memory) or, after a crash, once a look at
the storage shows it happened; a staged entry whose change never happened is dropped after a grace period. So a
crash between the change and the delivery loses nothing, and a change that failed sends nothing.

The payload is Standard Webhooks' (``{"type", "timestamp", "data"}``); :mod:`.signing` signs it.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

OUTBOX = "events/outbox/"  # one record per event waiting for delivery
DEAD = "events/dead/"  # events some subscription never took, kept for an admin
SUBSCRIPTIONS = "events/subscriptions/"  # one record per webhook subscription
FEED = "events/feed/"  # per owner, the events its stream replays (``events/feed/<owner folder>/<cursor>``)


class EventType(enum.StrEnum):
    """What a subscription or a stream can ask for."""

    FILE_PUBLISHED = "file.published"
    FILE_DELETED = "file.deleted"
    FILE_EXPIRED = "file.expired"
    UPLOAD_ABORTED = "upload.aborted"
    QUOTA_EXCEEDED = "quota.exceeded"


EVENT_TYPES = frozenset(t.value for t in EventType)
_CHANGES = {
    EventType.FILE_PUBLISHED: "published",
    EventType.FILE_DELETED: "removed",  # a file is removed once, deleted or expired: one id for both
    EventType.FILE_EXPIRED: "removed",
    EventType.UPLOAD_ABORTED: "aborted",
    EventType.QUOTA_EXCEEDED: "quota",
}


def event_id(kind: EventType, subject: str) -> str:
    """The id of the event of change ``kind`` to ``subject`` (a file or upload id): the same whoever makes the change
    and however often (``evt_`` and 32 hex digits)."""
    digest = hashlib.sha256(f"{_CHANGES[kind]}:{subject}".encode()).hexdigest()
    return "evt_" + digest[:32]


def is_event_id(value: str) -> bool:
    """Whether ``value`` has the form :func:`event_id` gives."""
    rest = value.removeprefix("evt_")
    return len(value) == 36 and len(rest) == 32 and all(c in "0123456789abcdef" for c in rest)


def timestamp(when: float) -> str:
    """RFC 3339 UTC with milliseconds, as the payload's ``timestamp`` says when the change was made."""
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Check:
    """How a look at the storage tells whether a staged event's change happened: the file ``file`` exists with
    SHA-256 ``sha256`` (a publication), ``file`` is gone (``gone``: a removal), or the upload record at ``record``
    says ``state`` (an abort)."""

    file: str | None = None
    sha256: str | None = None
    gone: bool = False
    record: str | None = None
    state: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The check as its entry stores it."""
        doc = {"file": self.file, "sha256": self.sha256, "gone": self.gone, "record": self.record, "state": self.state}
        return {k: v for k, v in doc.items() if v not in (None, False)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Check:
        """The check an entry stores."""
        return cls(
            file=doc.get("file"),
            sha256=doc.get("sha256"),
            gone=bool(doc.get("gone")),
            record=doc.get("record"),
            state=doc.get("state"),
        )


@dataclass(frozen=True, slots=True)
class Event:
    """One change, as delivered: its id, type, the key it concerns (its owner), when it was made, and its data."""

    id: str
    type: EventType
    owner: str | None
    created: float
    data: Mapping[str, Any]

    def payload(self) -> dict[str, Any]:
        """The Standard Webhooks payload: ``{"type", "timestamp", "data"}``."""
        return {"type": self.type.value, "timestamp": timestamp(self.created), "data": dict(self.data)}

    def body(self) -> bytes:
        """The payload as the bytes that are signed and sent."""
        return json.dumps(self.payload(), ensure_ascii=True, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Target:
    """One subscription's delivery of an event: attempts so far, when the next is due, since when it is tried (the
    age past which it is dead-lettered counts from there) and the last failure."""

    attempts: int = 0
    due: float = 0.0
    since: float = 0.0
    error: str = ""

    def to_json(self) -> list[Any]:
        """The target as its entry stores it: ``[attempts, due, since, error]``."""
        return [self.attempts, self.due, self.since, self.error]

    @classmethod
    def from_json(cls, raw: Any) -> Target:
        """The target an entry stores."""
        attempts, due, since, error = raw
        return cls(int(attempts), float(due), float(since), str(error))


@dataclass(frozen=True, slots=True)
class Entry:
    """An event in the outbox: the event, how to check a staged one (None: its change is known to have happened),
    who holds it now (``lease``: holder and until when), the subscriptions still to take it (None: not yet
    decided) and whether its owner's stream has it (``fed``)."""

    event: Event
    check: Check | None = None
    lease: tuple[str, float] | None = None
    targets: Mapping[str, Target] | None = None
    fed: bool = False

    @property
    def staged(self) -> bool:
        """Whether its change is still to be confirmed."""
        return self.check is not None

    def confirmed(self) -> Entry:
        """The entry once its change is known to have happened."""
        return replace(self, check=None)

    def held_by_other(self, holder: str, now: float) -> bool:
        """Whether another process holds it now."""
        return self.lease is not None and self.lease[0] != holder and self.lease[1] > now

    def due(self, now: float) -> float:
        """When it next needs work: now if its targets are not decided or its stream does not have it yet, else the
        earliest due target (``inf``: nothing left)."""
        if self.targets is None or not self.fed:
            return now
        return min((t.due for t in self.targets.values()), default=float("inf"))

    def to_json(self) -> dict[str, Any]:
        """The entry as its outbox record stores it."""
        e = self.event
        doc: dict[str, Any] = {
            "v": 1,
            "id": e.id,
            "type": e.type.value,
            "owner": e.owner,
            "created": e.created,
            "data": dict(e.data),
            "fed": self.fed,
        }
        if self.check is not None:
            doc["check"] = self.check.to_json()
        if self.lease is not None:
            doc["lease"] = list(self.lease)
        if self.targets is not None:
            doc["targets"] = {sid: t.to_json() for sid, t in self.targets.items()}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Entry:
        """The entry an outbox record stores."""
        event = Event(
            id=str(doc["id"]),
            type=EventType(doc["type"]),
            owner=doc.get("owner"),
            created=float(doc["created"]),
            data=dict(doc.get("data") or {}),
        )
        lease = doc.get("lease")
        targets = doc.get("targets")
        return cls(
            event=event,
            check=Check.from_json(doc["check"]) if isinstance(doc.get("check"), dict) else None,
            lease=(str(lease[0]), float(lease[1])) if isinstance(lease, list) and len(lease) == 2 else None,
            targets=None if not isinstance(targets, dict) else {k: Target.from_json(v) for k, v in targets.items()},
            fed=bool(doc.get("fed")),
        )


def backoff(attempts: int, *, base: float, cap: float) -> float:
    """Seconds before attempt ``attempts + 1`` of a delivery that failed ``attempts`` times: ``base`` doubled per
    failure, at most ``cap``."""
    return float(min(cap, base * 2 ** max(0, attempts - 1)))


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event some subscriptions never took within ``events_max_age``: the event, and per subscription the attempts
    made and the last failure."""

    event: Event
    failed: Mapping[str, Target] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The dead letter as its record stores it."""
        return {
            "id": self.event.id,
            "type": self.event.type.value,
            "owner": self.event.owner,
            "created": self.event.created,
            "data": dict(self.event.data),
            "failed": {sid: t.to_json() for sid, t in self.failed.items()},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DeadLetter:
        """The dead letter a record stores."""
        entry = Entry.from_json(doc)
        failed = doc.get("failed") or {}
        return cls(entry.event, {k: Target.from_json(v) for k, v in failed.items()})

    def summary(self) -> dict[str, Any]:
        """What an admin is shown."""
        return {
            **self.event.payload(),
            "id": self.event.id,
            "owner": self.event.owner,
            "failed": {
                sid: {"attempts": t.attempts, "since": timestamp(t.since), "last_error": t.error}
                for sid, t in self.failed.items()
            },
        }
