"""Small JSON documents and composed files in the storage backend: the helpers every service module shares."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from storage.base import Capability, Storage, SupportsCompose, capable
from storage.errors import ObjectChanged
from transfer.errors import storage_errors_translated
from transfer.service.records import FileRecord, object_key, owner_files_prefix

S3_MIN_PART = 5 << 20  # UploadPartCopy: every part but the last at least 5 MiB
READ_ATTEMPTS = 3


async def read_document(storage: Storage, key: str) -> Any:
    """A JSON document; retried when it is replaced while being read (raises NotFound when absent)."""
    with storage_errors_translated():
        for attempt in range(READ_ATTEMPTS):
            try:
                async with await storage.open(key) as reader:
                    return json.loads(b"".join([chunk async for chunk in reader.read()]))
            except ObjectChanged:
                if attempt == READ_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.05)
    raise AssertionError("unreachable")


async def write_document(storage: Storage, key: str, document: Any, *, if_absent: bool = False) -> None:
    """Publish a JSON document atomically (if absent: ObjectExists when the key is taken)."""
    with storage_errors_translated():
        async with storage.create(key, if_absent=if_absent) as writer:
            await writer.write(json.dumps(document, ensure_ascii=True).encode())
            await writer.commit({})


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
    S3, where every source but the last is at least 5 MiB), else a streamed copy. (The publisher enters it in its
    owner's file index.)"""
    with storage_errors_translated():
        composer = capable(storage, Capability.COMPOSE, SupportsCompose)
        if composer is not None and Capability.MULTIPART in storage.capabilities:
            sizes = [(await storage.stat(source)).size for source in sources[:-1]]
            if not all(size >= S3_MIN_PART for size in sizes):
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
