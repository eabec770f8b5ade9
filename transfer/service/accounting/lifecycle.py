"""What happens around a file's publication and deletion, whichever engine stored it (plain upload, chunked
session, tus): its lifetime, its place in the expiry index, and its bytes in its key's usage record.

Every publish path runs ``admit`` before it reads a byte (the lifetime is checked, a declared size reserved) and
publishes through the one publisher (``transfer.service.files.publisher``), which writes the expiry index entry and
charges the usage; every removal of charged bytes (a file, a TP message) goes through ``remove_charged``: claimed
in the payer's usage record, removed, and refunded in the write that ends the claim (once, whoever races). The rules
themselves are pure (``transfer.core.uploads.lifetimes``); the counter is ``transfer.service.accounting.usage``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime

from storage.errors import ObjectNotFound
from transfer.core.auth import parse_keys
from transfer.core.uploads.lifetimes import (
    EXPIRY_PREFIX,
    LifetimePolicy,
    expires_at,
    expiry_bucket,
    expiry_key,
    parse_expiry_key,
)
from transfer.errors import TransferError, storage_errors_translated
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.accounting.usage import LimitsOf, UsageLedger, limits_from
from transfer.settings import Settings

log = logging.getLogger("transfer.lifecycle")


class Lifecycle:
    """Lifetimes, the expiry index and byte quotas of one service (shared by its upload engines)."""

    def __init__(
        self,
        records: RecordStore,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        limits: LimitsOf | None = None,
    ) -> None:
        self.storage = records.storage
        self.settings = settings
        self.clock = clock
        self.keys = parse_keys(settings.api_keys or {})  # the keys of the settings (usage reports list them)
        # every owner's limits through one interface (Identities.limits: environment keys, key records, tokens)
        self.limits: LimitsOf = limits or limits_from(self.keys)
        self.usage = UsageLedger(records, self.limits, clock=clock, shards=settings.usage_shards)

    async def policy(self, owner: str | None) -> LifetimePolicy:
        """The lifetime rules that apply to the files of ``owner``."""
        key = await self.limits(owner)
        return LifetimePolicy(
            key_default=None if key is None else key.default_file_ttl,
            key_max=None if key is None else key.max_file_ttl,
            service_default=self.settings.default_file_ttl,
            service_max=self.settings.max_file_ttl,
        )

    async def lifetime(self, owner: str | None, requested: int | None) -> int | None:
        """Seconds a new file of ``owner`` lives from its publication (None: until deleted); LifetimeTooLong when
        ``requested`` is above the key's or the service's maximum."""
        return (await self.policy(owner)).lifetime(requested)

    def expiry(self, published: datetime, lifetime: int | None) -> datetime | None:
        """When a file published at ``published`` with ``lifetime`` seconds expires (None: never)."""
        return expires_at(published.timestamp(), lifetime)

    async def admit(self, owner: str | None, rid: str, declared: int | None, until: float) -> int | None:
        """Before a byte of upload ``rid`` is read: reserve its ``declared`` size (QuotaExceeded when it does not
        fit). Returns the most bytes it may bring (None: no quota): its declared size, or for an upload of unknown
        length what the key has left now (the charge at publication checks again, exactly)."""
        if await self.usage.quota_of(owner) is None:
            return None
        if declared is not None:
            await self.usage.reserve(owner, rid, declared, until)
            return declared
        return await self.usage.available_to(owner, rid)

    async def room_for(self, owner: str | None, rid: str, *, at_least: int | None = None) -> int | None:
        """What upload ``rid`` (of unknown length) may still bring in all, its own reservation included (with
        ``at_least``: at least that much when there is, read from as few records as tells)."""
        return await self.usage.available_to(owner, rid, at_least=at_least)

    async def grow(self, owner: str | None, rid: str, nbytes: int, until: float) -> None:
        """Upload ``rid`` of unknown length is about to hold ``nbytes`` in all: its reservation grows to them first
        (QuotaExceeded when they do not fit beside the key's other reservations), so that what it stores is
        counted while it stays open, and the key's other uploads see it."""
        await self.usage.reserve_at_least(owner, rid, nbytes, until)

    async def reserve(self, owner: str | None, rid: str, nbytes: int, until: float) -> None:
        """Set upload ``rid``'s reservation to ``nbytes`` (lower it to what a PATCH of unknown length stored)."""
        if await self.usage.quota_of(owner) is not None:
            await self.usage.reserve(owner, rid, nbytes, until)

    async def release(self, owner: str | None, rid: str) -> None:
        """Upload ``rid`` ended without a file: its reservation goes."""
        await self.usage.release(owner, rid)

    async def release_after_failure(self, owner: str | None, rid: str) -> None:
        """:meth:`release` on the way out of a failure: a backend that fails here too must not replace the error
        the client is told (the reservation then lapses at its time)."""
        try:
            await self.usage.release(owner, rid)
        except TransferError as exc:
            log.warning("reservation %s of %r stays until it lapses: %s", rid, owner, exc)

    async def remove_charged(
        self,
        key: str,
        owner: str | None,
        ledger_id: str,
        nbytes: int,
        *,
        files: int = 1,
        before_delete: Callable[[], Awaitable[None]] | None = None,
        refund_of: Callable[[int], int] | None = None,
    ) -> bool:
        """The one way charged bytes stored at ``key`` go (a file: delete, expiry sweep; a TP message: poll,
        sweep): True for the one caller that removed them, False for every other, whatever the number of callers
        and replicas racing. The removal is claimed under ``ledger_id`` in ``owner``'s usage record by
        compare-and-set (:meth:`UsageLedger.claim_removal`); the claimer checks the object is still there (a
        removal that ended before the claim leaves nothing), runs ``before_delete``, deletes it, and the write
        that ends the claim refunds ``nbytes`` (or ``refund_of`` the object's stored size) and ``files``: a double
        delete refunds once. A crash after the object went leaves the usage too high, never too low
        (``transfer usage repair`` recounts it)."""
        if not await self.usage.claim_removal(owner, ledger_id, nbytes, files=files):
            return False  # another delete, poll or sweep is removing it right now
        try:
            with storage_errors_translated():
                try:
                    info = await self.storage.stat(key)
                except ObjectNotFound:
                    gone = True
                else:
                    gone = False
                    if refund_of is not None:
                        nbytes = refund_of(info.size)
                    if before_delete is not None:
                        await before_delete()
                    await self.storage.delete(key)
        except BaseException:
            await self._unclaim(owner, ledger_id)
            raise
        if gone:
            await self._unclaim(owner, ledger_id)  # removed by someone else before our claim
            return False
        await self.usage.removed(owner, ledger_id, nbytes, files=files)
        return True

    async def _unclaim(self, owner: str | None, ledger_id: str) -> None:
        """Give back a removal claim without a refund. Best effort (on the way out of a failure, or after finding
        the object gone): the claim lapses at the end of its lease otherwise."""
        try:
            await self.usage.unclaim(owner, ledger_id)
        except TransferError as exc:
            log.warning("the removal claim of %s stays until its lease ends: %s", ledger_id, exc)

    async def deleted(self, file_id: str, expires_at: datetime | None) -> None:
        """File ``file_id`` was removed (:meth:`remove_charged`, refunded there): its expiry index entry goes."""
        if expires_at is not None:
            await self.drop_index_entry(expiry_key(expires_at, file_id))

    async def drop_index_entry(self, key: str) -> None:
        """Remove one expiry index entry (gone already: nothing to do)."""
        with storage_errors_translated():
            try:
                await self.storage.delete(key)
            except ObjectNotFound:
                pass

    async def due(self, prefix: str = EXPIRY_PREFIX) -> AsyncIterator[tuple[str, str, str]]:
        """``(index key, hour, id)`` of every entry of the expiry index under ``prefix`` (files' by default) in an
        hour that has begun, oldest first. The listing is in key order, so it stops at the first later hour: the
        entries of what expires later are not read."""
        now_bucket = expiry_bucket(self.clock())
        with storage_errors_translated():
            async for info in self.storage.list(prefix):
                parsed = parse_expiry_key(info.key, prefix)
                if parsed is None:
                    continue
                bucket, file_id = parsed
                if bucket > now_bucket:
                    return
                yield info.key, bucket, file_id
