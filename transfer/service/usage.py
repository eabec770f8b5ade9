"""Bytes stored per API key, counted in one small record per key that every replica updates with the storage
backend's compare-and-set (``create(key, if_match=<etag>)``; ``if_absent`` for the first write).

Record ``usage/<key hash>``: ``{"used": bytes, "files": n, "reservations": {"<upload id>": [bytes, until]}}``.

    reserve(owner, rid, n)   an unfinished upload declares its size: refused (QuotaExceeded) unless it fits
    charge(owner, rid, n)    a file is about to be published: its reservation goes, its bytes count; refused
                             unless they fit (the exact check: a stream of unknown length is caught here at last)
    refund(owner, n)         a file was deleted (or its publish failed after the charge)
    release(owner, rid)      an upload ended without a file (aborted, expired, terminated)

A charge comes before the publish and a refund after the delete, so the count is never below what is stored: a
process that dies between the two leaves it too high (the safe side), never too low. A reservation lives until
its ``until`` (the upload's own expiry): one left by a dead process stops counting then.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from storage.base import Storage
from storage.errors import ObjectChanged, ObjectExists, ObjectNotFound, StorageError
from transfer.core.auth import ApiKey
from transfer.core.lifecycle import Usage
from transfer.errors import StorageUnavailable, from_storage_error, storage_errors_translated

USAGE_PREFIX = "usage/"
ATTEMPTS = 50  # compare-and-set rounds before giving up (each loses only to another writer's success)

T = TypeVar("T")


def usage_key(owner: str | None) -> str:
    """The record of ``owner`` (a key name; None: files stored in open mode). Hashed: names are free text."""
    if owner is None:
        return USAGE_PREFIX + "open"
    return USAGE_PREFIX + "k" + hashlib.sha256(owner.encode("utf-8")).hexdigest()[:40]


class _Doc:
    """The mutable form of one usage record during a compare-and-set round."""

    def __init__(self, raw: Mapping[str, Any], now: float) -> None:
        self.used = int(raw.get("used", 0))
        self.files = int(raw.get("files", 0))
        reservations = raw.get("reservations", {})
        self.reservations: dict[str, tuple[int, float]] = {
            rid: (int(entry[0]), float(entry[1]))
            for rid, entry in (reservations.items() if isinstance(reservations, dict) else ())
            if float(entry[1]) > now  # a reservation past its time (its upload ended or its process died) is dropped
        }

    def usage(self, quota: int | None, excluding: str | None = None) -> Usage:
        reserved = sum(n for rid, (n, _) in self.reservations.items() if rid != excluding)
        return Usage(used=self.used, files=self.files, reserved=reserved, quota=quota)

    def to_json(self) -> dict[str, Any]:
        return {
            "used": self.used,
            "files": self.files,
            "reservations": {rid: [n, until] for rid, (n, until) in self.reservations.items()},
        }


class UsageLedger:
    """Per-key byte counts and quotas over one storage backend, exact across replicas (compare-and-set)."""

    def __init__(self, storage: Storage, keys: Mapping[str, ApiKey], *, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.keys = keys
        self.clock = clock
        self._locks: dict[str | None, asyncio.Lock] = {}

    def quota_of(self, owner: str | None) -> int | None:
        key = self.keys.get(owner) if owner is not None else None
        return None if key is None else key.max_bytes

    async def _read(self, key: str) -> tuple[dict[str, Any], str | None]:
        """The record and its version token (None: no record yet)."""
        with storage_errors_translated():
            try:
                reader = await self.storage.open(key)
            except ObjectNotFound:
                return {}, None
            async with reader:
                etag = reader.info.etag
                raw = b"".join([piece async for piece in reader.read()])
        doc = json.loads(raw)
        return (doc if isinstance(doc, dict) else {}), etag

    async def _update(self, owner: str | None, change: Callable[[_Doc], T]) -> T:
        """Apply ``change`` to the owner's record atomically: read, change, write only if nobody wrote meanwhile,
        else again. ``change`` may raise (QuotaExceeded): then nothing is written."""
        key = usage_key(owner)
        async with self._locks.setdefault(owner, asyncio.Lock()):  # fewer lost rounds among this process' uploads
            for attempt in range(ATTEMPTS):
                raw, etag = await self._read(key)
                doc = _Doc(raw, self.clock())
                result = change(doc)
                body = json.dumps(doc.to_json(), ensure_ascii=True, separators=(",", ":")).encode()
                try:
                    async with self.storage.create(
                        key, size_hint=len(body), if_absent=etag is None, if_match=etag
                    ) as writer:
                        await writer.write(body)
                        await writer.commit({})
                    return result
                except (ObjectChanged, ObjectExists):
                    pass  # another replica wrote first: read its version and apply the change again
                except StorageError as exc:
                    raise from_storage_error(exc) from exc
                await asyncio.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))
        raise StorageUnavailable(f"the usage record of {owner!r} changed {ATTEMPTS} times while it was being updated")

    async def usage(self, owner: str | None) -> Usage:
        raw, _ = await self._read(usage_key(owner))
        return _Doc(raw, self.clock()).usage(self.quota_of(owner))

    async def reserve(self, owner: str | None, rid: str, nbytes: int, until: float) -> Usage:
        """Reserve ``nbytes`` for upload ``rid`` until ``until`` (QuotaExceeded if they do not fit); returns the
        usage with the reservation. Without a quota nothing is written: there is nothing to protect."""
        quota = self.quota_of(owner)
        if quota is None:
            return await self.usage(owner)

        def change(doc: _Doc) -> Usage:
            doc.usage(quota, excluding=rid).require_room(nbytes)
            doc.reservations[rid] = (nbytes, until)
            return doc.usage(quota)

        return await self._update(owner, change)

    async def available_to(self, owner: str | None, rid: str) -> int | None:
        """Bytes upload ``rid`` may still bring (its own reservation counted as its room); None: no quota."""
        quota = self.quota_of(owner)
        if quota is None:
            return None
        raw, _ = await self._read(usage_key(owner))
        return _Doc(raw, self.clock()).usage(quota, excluding=rid).available

    async def release(self, owner: str | None, rid: str) -> None:
        """Forget upload ``rid``'s reservation (it ended without a file)."""
        if self.quota_of(owner) is None:
            return

        def change(doc: _Doc) -> None:
            doc.reservations.pop(rid, None)

        await self._update(owner, change)

    async def charge(self, owner: str | None, rid: str, nbytes: int) -> None:
        """Count a file of ``nbytes`` about to be published by upload ``rid`` (its reservation goes); QuotaExceeded
        if it does not fit, and then nothing changes."""
        quota = self.quota_of(owner)

        def change(doc: _Doc) -> None:
            doc.usage(quota, excluding=rid).require_room(nbytes)
            doc.reservations.pop(rid, None)
            doc.used += nbytes
            doc.files += 1

        await self._update(owner, change)

    async def refund(self, owner: str | None, nbytes: int, files: int = 1) -> None:
        """Uncount a deleted file (or one whose publish failed after its charge)."""

        def change(doc: _Doc) -> None:
            doc.used = max(0, doc.used - nbytes)
            doc.files = max(0, doc.files - files)

        await self._update(owner, change)
