"""Small JSON documents and composed files in the storage backend: the helpers every service module shares."""

from __future__ import annotations

from typing import Any

from storage.base import Capability, Storage, SupportsCompose, capable
from storage.rules import rules_of
from transfer.errors import storage_errors_translated
from transfer.service.accounting.recordstore import read_record, write_record
from transfer.service.files.records import FileRecord, object_key, owner_files_prefix


async def read_document(storage: Storage, key: str) -> Any:
    """A JSON document (raises NotFound when absent); one replaced while being read is read again, within the
    record store's retry policy."""
    doc, _ = await read_record(storage, key)
    return doc


async def write_document(storage: Storage, key: str, document: Any, *, if_absent: bool = False) -> None:
    """Publish a JSON document atomically (if absent: Conflict when the key is taken)."""
    await write_record(storage, key, document, if_absent=if_absent)


async def index_file(storage: Storage, record: FileRecord) -> None:
    """Enter a just-published file in its owner's file index (files stored in open mode have none: only the
    all-files listing shows them). Written after the publish: a crash in between leaves a stored file missing from
    its key's listing (the admin listing still has it), never an index entry without a file that was stored."""
    if record.owner is None:
        return
    with storage_errors_translated():
        async with storage.create(owner_files_prefix(record.owner) + record.id, size_hint=0) as writer:
            await writer.commit({})


async def unindex_file(storage: Storage, record: FileRecord) -> None:
    """Remove a deleted file from its owner's file index (idempotent)."""
    if record.owner is None:
        return
    with storage_errors_translated():
        await storage.delete(owner_files_prefix(record.owner) + record.id)


async def publish_composed(storage: Storage, record: FileRecord, sources: list[str]) -> None:
    """Publish ``record`` as the concatenation of ``sources``: server-side compose where the backend can (and, on
    S3, where every source but the last is at least the backend's ``min_compose_part``), else a streamed copy. (The
    publisher enters it in its owner's file index.)"""
    with storage_errors_translated():
        composer = capable(storage, Capability.COMPOSE, SupportsCompose)
        minimum = rules_of(storage).min_compose_part
        if composer is not None and minimum:
            sizes = [(await storage.stat(source)).size for source in sources[:-1]]
            if not all(size >= minimum for size in sizes):
                composer = None
        if composer is not None and sources:
            await composer.compose(object_key(record.id), sources, record.to_metadata())
            return
        async with storage.create(object_key(record.id), size_hint=record.size) as writer:
            for source in sources:
                async with await storage.open(source) as reader:
                    async for piece in reader.read():
                        await writer.write(piece)
            await writer.commit(record.to_metadata())
