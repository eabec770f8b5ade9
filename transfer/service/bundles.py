"""Content bundles (seed 000 §3.5): several content objects with roles, stored as a record that refers to stored
files by id and carries inline Text/JSON/Code content as is. Fetching a bundle describes its files afresh (new signed
URLs), so a bundle outlives the URLs it was first handed out with."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from storage.base import Storage
from transfer.core.auth import Grant
from transfer.core.content import (
    BundleItemRole,
    CodeContent,
    ContentBundle,
    ContentBundleItem,
    JSONContent,
    TextContent,
    parse_descriptor,
)
from transfer.core.ids import is_id, new_id
from transfer.errors import InvalidDescriptor, InvalidRequest, NotFound
from transfer.service.documents import read_document, write_document
from transfer.service.files import FileService


def bundle_key(bundle_id: str) -> str:
    """The storage key of bundle ``bundle_id``'s record."""
    return f"bundles/{bundle_id}.json"


def is_bundle_id(value: str) -> bool:
    """Whether ``value`` has the form of a bundle id (``b_…``)."""
    return is_id(value, "b_")


class BundleService:
    def __init__(self, storage: Storage, files: FileService, *, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.files = files
        self.clock = clock

    async def create(
        self,
        items: list[dict[str, Any]],
        caller: Grant,
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> str:
        """Validate and store a bundle owned by the caller's key. Each item: ``{"id"?, "role", "file_id"}`` for a
        stored file the caller may see, or ``{"id"?, "role", "content": <inline Text/JSON/Code object>}``.
        Returns the bundle id."""
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
        doc = {
            "id": bundle_id,
            "name": name,
            "description": description,
            "items": stored,
            "owner": caller.owner,
            "created_at": datetime.fromtimestamp(self.clock(), UTC).replace(microsecond=0).isoformat(),
        }
        await write_document(self.storage, bundle_key(bundle_id), doc, if_absent=True)
        return bundle_id

    async def describe(self, bundle_id: str, base_url: str, caller: Grant, *, ttl: int | None = None) -> ContentBundle:
        """The bundle as a ContentBundle: stored files described afresh, ``total_size`` computed. NotFound unless
        the caller may see it (its own; any for admin)."""
        if not is_bundle_id(bundle_id):
            raise NotFound(f"no bundle {bundle_id!r}")
        try:
            doc = await read_document(self.storage, bundle_key(bundle_id))
        except NotFound:
            raise NotFound(f"no bundle {bundle_id!r}") from None
        if not caller.sees(doc.get("owner")):
            raise NotFound(f"no bundle {bundle_id!r}")
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
