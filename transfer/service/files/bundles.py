"""Content bundles (seed 000 §3.5): several content objects with roles, stored as a record that refers to stored
files by id and carries inline Text/JSON/Code content as is. Fetching a bundle describes its files afresh (new signed
URLs), so a bundle outlives the URLs it was first handed out with.

A bundle's record is bytes its key stores, as a file is: its size (``bytes`` in the record, the record's exact
length as stored) is charged to the owner's usage before it is written (QuotaExceeded when it does not fit) and
refunded once when it goes, through the same removal claim as files (:meth:`UsageLedger.claim_removal`), however many
deletes and sweeps race on however many replicas. It counts in ``bytes_used``, not in ``files``. A bundle lives as a
file does (``expires_in``; the key's or the service's default; refused above the maximum): from its ``expires_at``
on it is gone for every reader (410 ``bundle_expired``), and the sweep removes it through its own expiry index
(``bundle-expiry/<yyyymmddhh>/<bundle id>``), which lists only the hours that have begun.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pydantic import ValidationError

from storage.base import Storage
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import is_id, new_id
from transfer.core.model.content import (
    BundleItemRole,
    CodeContent,
    ContentBundle,
    ContentBundleItem,
    JSONContent,
    TextContent,
    parse_descriptor,
)
from transfer.core.uploads.lifetimes import expires_at, expiry_bucket, expiry_key, is_expired
from transfer.errors import (
    BundleExpired,
    InvalidDescriptor,
    InvalidRequest,
    NotFound,
    StorageUnavailable,
    TransferError,
    storage_errors_translated,
)
from transfer.service.accounting.recordstore import record_size
from transfer.service.files.documents import read_document, write_document
from transfer.service.files.service import ORPHAN_GRACE, FileService

log = logging.getLogger("transfer.bundles")

BUNDLE_PREFIX = "bundles/"
BUNDLE_EXPIRY_PREFIX = "bundle-expiry/"


def bundle_key(bundle_id: str) -> str:
    """The storage key of bundle ``bundle_id``'s record."""
    return f"{BUNDLE_PREFIX}{bundle_id}.json"


def stored_bytes(doc: dict[str, Any], listed_size: int) -> int:
    """What a bundle's record is charged: its ``bytes`` (its length as written); a record written before bundles
    were charged has none, and counts as its listed size (``transfer usage repair --fix`` brings those in)."""
    value = doc.get("bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) else listed_size


def _with_own_size(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``bytes`` set to the length of the record that holds it (a fixed point: its digits count)."""
    size = 0
    while True:
        sized = {**doc, "bytes": size}
        actual = record_size(sized)
        if actual == size:
            return sized
        size = actual


def is_bundle_id(value: str) -> bool:
    """Whether ``value`` has the form of a bundle id (``b_…``)."""
    return is_id(value, "b_")


class BundleService:
    """ContentBundles stored as records that refer to files by id: create, read and remove them, each owned by the key
    that made it; a bundle's record is charged to that key as bytes it stores (not as a file)."""

    def __init__(self, storage: Storage, files: FileService, *, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.files = files
        self.lifecycle = files.lifecycle
        self.clock = clock

    async def create(
        self,
        items: list[dict[str, Any]],
        caller: Grant,
        *,
        name: str | None = None,
        description: str | None = None,
        expires_in: int | None = None,
    ) -> str:
        """Validate and store a bundle owned by the caller's key. Each item: ``{"id"?, "role", "file_id"}`` for a
        stored file the caller may see, or ``{"id"?, "role", "content": <inline Text/JSON/Code object>}``.
        ``expires_in``: seconds it lives (the file rules: LifetimeTooLong above the maximum). Its record's bytes
        are charged to the key first (QuotaExceeded when they do not fit). Returns the bundle id."""
        lifetime = await self.lifecycle.lifetime(caller.owner, expires_in)
        if not items:
            raise InvalidRequest("a bundle needs at least one item")
        limit = self.files.settings.max_bundle_items
        if len(items) > limit:
            raise InvalidRequest(f"a bundle holds at most {limit} items", limit=limit)
        stored: list[dict[str, Any]] = []
        for n, item in enumerate(items):
            try:
                role = BundleItemRole(item.get("role", ""))
            except ValueError:
                raise InvalidRequest(f"item {n}: role must be one of main, reference, attachment, thumbnail") from None
            entry: dict[str, Any] = {"id": str(item.get("id") or f"item-{n + 1:03d}"), "role": role.value}
            if "file_id" in item:
                await self.files.record(str(item["file_id"]), caller)  # NotFound if missing or not the caller's
                entry["file_id"] = str(item["file_id"])
            elif "content" in item:
                content = _inline_content(item["content"], n)
                entry["content"] = content.to_json()
            else:
                raise InvalidRequest(f"item {n}: give 'file_id' (a stored file) or 'content' (inline text/JSON/code)")
            stored.append(entry)
        if len({e["id"] for e in stored}) != len(stored):
            raise InvalidRequest("bundle item ids must be unique")
        bundle_id = new_id("b_")
        now = self.clock()
        expiry = expires_at(now, lifetime)
        doc = _with_own_size(
            {
                "id": bundle_id,
                "name": name,
                "description": description,
                "items": stored,
                "owner": caller.owner,
                "created_at": datetime.fromtimestamp(now, UTC).replace(microsecond=0).isoformat(),
                "expires_at": None if expiry is None else expiry.isoformat(),
            }
        )
        usage = self.lifecycle.usage
        # a fresh id: nothing else can charge it, so no once-only entry is needed (``until``)
        await usage.charge(caller.owner, bundle_id, doc["bytes"], files=0)
        index = None if expiry is None else expiry_key(expiry, bundle_id, BUNDLE_EXPIRY_PREFIX)
        try:
            if index is not None:  # before the record: a sweep must find every bundle that expires
                with storage_errors_translated():
                    async with self.storage.create(index, size_hint=0) as writer:
                        await writer.commit({})
            await write_document(self.storage, bundle_key(bundle_id), doc, if_absent=True)
        except BaseException:
            await usage.refund(caller.owner, doc["bytes"], files=0, rid=bundle_id)
            if index is not None:
                await self.lifecycle.drop_index_entry(index)
            raise
        return bundle_id

    async def _stored(self, bundle_id: str, caller: Grant) -> dict[str, Any]:
        """The bundle's record, if the caller may see it (NotFound otherwise, as for an unknown id)."""
        if not is_bundle_id(bundle_id):
            raise NotFound(f"no bundle {bundle_id!r}")
        try:
            doc: dict[str, Any] = await read_document(self.storage, bundle_key(bundle_id))
        except NotFound:
            raise NotFound(f"no bundle {bundle_id!r}") from None
        if not caller.sees(doc.get("owner")):
            raise NotFound(f"no bundle {bundle_id!r}")
        return doc

    @staticmethod
    def _expiry(doc: dict[str, Any]) -> datetime | None:
        value = doc.get("expires_at")
        return datetime.fromisoformat(value) if isinstance(value, str) else None

    async def delete(self, bundle_id: str, caller: Grant) -> None:
        """Delete a bundle (expired or not; its files stay); its bytes leave its key's usage. NotFound when
        missing, and for every delete but the one that removed it when several race."""
        if not await self._remove(await self._stored(bundle_id, caller)):
            raise NotFound(f"no bundle {bundle_id!r}")

    async def _remove(self, doc: dict[str, Any]) -> bool:
        """The one way a bundle goes (delete, sweep): :meth:`Lifecycle.remove_charged`, as a file's (claimed in
        the owner's usage record; only the claimer that still finds the record removes it and refunds it, once)."""
        bundle_id, owner = str(doc["id"]), doc.get("owner")
        key = bundle_key(bundle_id)
        nbytes = stored_bytes(doc, 0)
        refund_of = partial(stored_bytes, doc)  # a record from before bundles were charged: its stored size
        if not await self.lifecycle.remove_charged(key, owner, bundle_id, nbytes, files=0, refund_of=refund_of):
            return False
        expiry = self._expiry(doc)
        if expiry is not None:
            await self.lifecycle.drop_index_entry(expiry_key(expiry, bundle_id, BUNDLE_EXPIRY_PREFIX))
        return True

    async def charged(self) -> AsyncIterator[tuple[str | None, str, int]]:
        """``(owner, bundle id, bytes charged)`` of every stored bundle, for ``transfer usage repair``: one listing
        of ``bundles/`` and a read of each record (an admin count, never a request path). A record that cannot be
        read counts as its listed size for no owner's key, with a log line."""
        with storage_errors_translated():
            listed = [info async for info in self.storage.list(BUNDLE_PREFIX)]
        for info in listed:
            bundle_id = info.key[len(BUNDLE_PREFIX) :].removesuffix(".json")
            if not is_bundle_id(bundle_id):
                continue
            try:
                doc = await self._stored(bundle_id, TRUSTED)
            except NotFound:
                continue  # deleted since the listing
            except (StorageUnavailable, ValueError) as exc:
                log.warning("usage repair skips bundle %s: its record cannot be read: %s", bundle_id, exc)
                continue
            yield doc.get("owner"), bundle_id, stored_bytes(doc, info.size)

    async def sweep_expired_bundles(self) -> int:
        """Delete every bundle whose expiry has passed (service clock); returns how many this sweep removed. Reads
        the bundles' expiry index only up to the current hour: its cost follows the bundles due, not those stored."""
        removed = 0
        now = self.clock()
        orphan_before = expiry_bucket(now - ORPHAN_GRACE)  # an entry whose record is being written, or never was
        async for key, bucket, bundle_id in self.lifecycle.due(BUNDLE_EXPIRY_PREFIX):
            try:
                doc = await self._stored(bundle_id, TRUSTED)
            except NotFound:
                if bucket < orphan_before:
                    await self.lifecycle.drop_index_entry(key)
                continue
            except StorageUnavailable:
                log.warning("bundle sweep skips %s: its record cannot be read", bundle_id)
                continue
            expiry = self._expiry(doc)
            if expiry is None or expiry_key(expiry, bundle_id, BUNDLE_EXPIRY_PREFIX) != key:
                await self.lifecycle.drop_index_entry(key)
                continue
            if not is_expired(expiry, now):
                continue  # later in the current hour
            try:
                if await self._remove(doc):
                    removed += 1
            except TransferError as exc:
                log.warning("bundle sweep could not remove %s; retrying at the next interval: %s", bundle_id, exc)
        return removed

    async def describe(self, bundle_id: str, base_url: str, caller: Grant, *, ttl: int | None = None) -> ContentBundle:
        """The bundle as a ContentBundle: stored files described afresh, ``total_size`` computed. NotFound unless
        the caller may see it (its own; any for admin); BundleExpired from its expiry on, swept or not."""
        doc = await self._stored(bundle_id, caller)
        if is_expired(self._expiry(doc), self.clock()):
            raise BundleExpired(f"bundle {bundle_id} has expired", expires_at=doc["expires_at"])
        items = []
        for entry in doc["items"]:
            if "file_id" in entry:
                record = await self.files.record(entry["file_id"], caller)
                content: Any = await self.files.describe(record, base_url, ttl=ttl)
            else:
                content = _inline_content(entry["content"], 0)
            items.append(ContentBundleItem(id=entry["id"], role=BundleItemRole(entry["role"]), content=content))
        total = sum(item.content.size or 0 for item in items)
        return ContentBundle(
            id=doc["id"],
            name=doc.get("name"),
            description=doc.get("description"),
            items=items,
            total_size=total,
            created_at=datetime.fromisoformat(doc["created_at"]),
        )


def _inline_content(value: Any, n: int) -> TextContent | JSONContent | CodeContent:
    if not isinstance(value, dict):
        raise InvalidRequest(f"item {n}: 'content' must be a Text, JSON or Code content object")
    try:
        content = parse_descriptor(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidDescriptor(f"item {n}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from exc
    if not isinstance(content, TextContent | JSONContent | CodeContent):
        raise InvalidRequest(f"item {n}: files go in by 'file_id'; 'content' is for inline text, JSON or code")
    if content.type.value != "inline":
        raise InvalidRequest(f"item {n}: inline content must have type 'inline'")
    return content
