"""One usage shard: the names of a key's usage records, which shard a thing counts in, and a shard's record as the
ledger's changes see it (:mod:`transfer.service.accounting.usage` holds the ledger and the layout's description)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from transfer.core.ids import lane_of
from transfer.errors import QuotaExceeded

USAGE_PREFIX = "usage/"
SHARDS = 8  # usage records per key (the default; a setting)
MOVE_MEMORY = 3600.0  # seconds a shard remembers a move it was given (a late retry of it finds it given)


def usage_key(owner: str | None) -> str:
    """The one-record layout's record of ``owner`` (a key name; None: files stored in open mode), and the stem of
    its shards' keys. Hashed: names are free text."""
    if owner is None:
        return USAGE_PREFIX + "open"
    return USAGE_PREFIX + "k" + hashlib.sha256(owner.encode("utf-8")).hexdigest()[:40]


def shard_key(owner: str | None, shard: int) -> str:
    """The record of shard ``shard`` of ``owner``'s usage (the first shard is the one-record layout's record, so
    that layout's counts, reservations and changes carry on there, and one shard is that layout)."""
    return usage_key(owner) if shard == 0 else f"{usage_key(owner)}.s{shard:02d}"


def shard_of(thing: str, shards: int) -> int:
    """The shard an upload, file, bundle or message id counts in: its lane (:func:`transfer.core.ids.lane_of`, by
    its random part), so an upload, the file it publishes and that file's removal meet in one shard."""
    return lane_of(thing, shards)


def share_of(quota: int, shard: int, shards: int) -> int:
    """The allotment shard ``shard`` of ``shards`` holds of ``quota`` before any move: an even share, the remainder in
    the first shard."""
    return quota // shards + (quota % shards if shard == 0 else 0)


@dataclass(frozen=True, slots=True)
class StateChange:
    """One publication or removal in a key's record: what it adds to ``used`` and ``files`` (signed: a removal
    takes away), until when its entry is kept, and whether it is in the count already (a publication, kept so that
    a repeat is refused) or still to be applied by the one caller that claimed it (a removal)."""

    nbytes: int
    files: int
    until: float
    applied: bool

    def to_json(self) -> list[Any]:
        """The entry as the record stores it: ``[bytes, files, until, applied]``."""
        return [self.nbytes, self.files, self.until, self.applied]


def _entries(raw: Any) -> list[tuple[str, list[Any]]]:
    return [(k, v) for k, v in raw.items() if isinstance(v, list)] if isinstance(raw, dict) else []


def changes_of(raw: Mapping[str, Any], now: float) -> dict[str, StateChange]:
    """The live state changes of a stored record, of either shape (an entry past its ``until`` is dropped: its
    upload can no longer complete, or its claimer died)."""
    changes: dict[str, StateChange] = {}
    for rid, entry in _entries(raw.get("charged")):  # the older shape: publications, applied
        changes[rid] = StateChange(int(entry[0]), 1, float(entry[1]), True)
    for thing, entry in _entries(raw.get("removals")):  # the older shape: removal claims, not applied
        changes[thing] = StateChange(-int(entry[0]), -1, float(entry[1]), False)
    for thing, entry in _entries(raw.get("changes")):
        changes[thing] = StateChange(int(entry[0]), int(entry[1]), float(entry[2]), bool(entry[3]))
    return {thing: change for thing, change in changes.items() if change.until > now}


class ShardDoc:
    """One usage shard as the ledger's changes see it (each change works on its own copy: they are pure)."""

    def __init__(self, raw: Mapping[str, Any], now: float, share: int | None = None, quota: int | None = None) -> None:
        self.used = int(raw.get("used", 0))
        self.files = int(raw.get("files", 0))
        reservations = raw.get("reservations", {})
        self.reservations: dict[str, tuple[int, float]] = {
            rid: (int(entry[0]), float(entry[1]))
            for rid, entry in (reservations.items() if isinstance(reservations, dict) else ())
            if float(entry[1]) > now  # a reservation past its time (its upload ended or its process died) is dropped
        }
        self.changes = changes_of(raw, now)
        # the allotment: an absent shard (or one stored before allotments) holds its share of the quota
        self.cap: int | None = int(raw["cap"]) if "cap" in raw else share
        self.q: int | None = int(raw["q"]) if "q" in raw else quota
        shards = raw.get("shards")  # the first shard's: how many shards the key has
        self.shards: int | None = int(shards) if isinstance(shards, int) else None
        out = raw.get("out", {})
        self.out: dict[str, tuple[int, int, float]] = {
            xid: (int(e[0]), int(e[1]), float(e[2])) for xid, e in (out.items() if isinstance(out, dict) else ())
        }
        inn = raw.get("in", {})
        self.inn: dict[str, float] = {
            xid: float(at)
            for xid, at in (inn.items() if isinstance(inn, dict) else ())
            if float(at) > now - MOVE_MEMORY
        }

    def copy(self) -> ShardDoc:
        """A copy a change may alter (the record it was read from stays as it was)."""
        doc = ShardDoc({}, 0.0)
        doc.used, doc.files = self.used, self.files
        doc.reservations, doc.changes = dict(self.reservations), dict(self.changes)
        doc.cap, doc.q, doc.out, doc.inn, doc.shards = self.cap, self.q, dict(self.out), dict(self.inn), self.shards
        return doc

    def same(self, other: ShardDoc) -> bool:
        """Whether ``other`` holds the same state (then a change left nothing to write)."""
        mine = (
            self.used,
            self.files,
            self.reservations,
            self.changes,
            self.cap,
            self.q,
            self.out,
            self.inn,
            self.shards,
        )
        theirs = (
            other.used,
            other.files,
            other.reservations,
            other.changes,
            other.cap,
            other.q,
            other.out,
            other.inn,
            other.shards,
        )
        return mine == theirs

    def reserved(self, excluding: str | None = None) -> int:
        """Bytes this shard's live reservations hold (upload ``excluding``'s left out)."""
        return sum(n for rid, (n, _) in self.reservations.items() if rid != excluding)

    def room(self, excluding: str | None = None) -> int | None:
        """What this shard may still take (None: no allotment, no quota)."""
        if self.cap is None:
            return None
        return self.cap - self.used - self.reserved(excluding)

    def fits(self, nbytes: int, excluding: str | None = None) -> bool:
        """Whether ``nbytes`` more fit in this shard's own allotment (always, without a quota)."""
        room = self.room(excluding)
        return room is None or nbytes <= room

    def begin(self, thing: str, change: StateChange) -> bool:
        """Enter ``change`` under ``thing`` (applied now if it says so): False, and nothing changes, when a change
        of that id is on record already (applied, or claimed by another caller)."""
        if thing in self.changes:
            return False
        self.changes[thing] = change
        if change.applied:
            self.add(change.nbytes, change.files)
        return True

    def add(self, nbytes: int, files: int) -> None:
        """Count ``nbytes`` and ``files`` more (negative: fewer). A shard's count may go below nothing (a removal
        counted in another shard than its charge, under the one-record layout's ids): the key's total is what
        counts."""
        self.used += nbytes
        self.files += files

    def to_json(self) -> dict[str, Any]:
        """The shard's record as stored."""
        doc: dict[str, Any] = {
            "used": self.used,
            "files": self.files,
            "reservations": {rid: [n, until] for rid, (n, until) in self.reservations.items()},
        }
        if self.changes:
            doc["changes"] = {thing: change.to_json() for thing, change in self.changes.items()}
        if self.cap is not None:
            doc["cap"], doc["q"] = self.cap, self.q
        if self.out:
            doc["out"] = {xid: [t, n, at] for xid, (t, n, at) in self.out.items()}
        if self.inn:
            doc["in"] = dict(self.inn)
        if self.shards is not None:
            doc["shards"] = self.shards
        return doc


def quota_exceeded(quota: int, used: int, reserved: int, nbytes: int) -> QuotaExceeded:
    """The 413 of ``nbytes`` more that do not fit in ``quota`` beside what is used and reserved."""
    return QuotaExceeded(
        f"{nbytes} more bytes would exceed this key's quota of {quota} bytes "
        f"({used} used, {reserved} reserved by unfinished uploads)",
        quota=quota,
        used=used,
        reserved=reserved,
        requested=nbytes,
    )


class NoRoom(Exception):
    """A shard's own allotment lacks room for a change (it may gather allotment from the others)."""

    def __init__(self, need: int) -> None:
        super().__init__(f"{need} bytes")
        self.need = need
