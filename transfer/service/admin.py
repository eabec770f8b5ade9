"""Operations for whoever runs the service: run the sweeps now, list stored files with their owners and expiry,
usage of every key. Admin front doors (``transfer/api/admin.py``, the CLI) call these; nothing here checks scopes.
"""

from __future__ import annotations

import logging
from typing import Any

from transfer.core.content import format_timestamp
from transfer.errors import StorageUnavailable, storage_errors_translated
from transfer.service.container import Services
from transfer.service.records import FileRecord, is_file_id

log = logging.getLogger("transfer.sweeps")


async def run_sweeps(services: Services) -> dict[str, int]:
    """Every sweep once, now (:meth:`Services.sweep_now`); what each removed (-1: it failed, see the log)."""
    return await services.sweep_now()


def record_summary(record: FileRecord) -> dict[str, Any]:
    """What an operator sees of a file: no URL, the owner and the expiry."""
    return {
        "file_id": record.id,
        "name": record.name,
        "content_type": record.content_type,
        "size": record.size,
        "encoding": record.encoding.value,
        "encoded_size": record.encoded_size,
        "checksum": "sha256:" + record.sha256,
        "owner": record.owner,
        "created_at": format_timestamp(record.created_at),
        "expires_at": None if record.expires_at is None else format_timestamp(record.expires_at),
    }


async def list_files(
    services: Services, *, limit: int, after: str | None = None, owner: str | None = None
) -> tuple[list[FileRecord], str | None]:
    """Up to ``limit`` stored files in id order after ``after`` (a file id), of ``owner`` if given, expired ones
    included (the sweep has not reached them yet); and the cursor of the next page (None: no more). Reads the
    storage listing a page at a time from the cursor on (records from the listing's metadata, no read per file),
    so a page costs what it shows, not what is stored before it. Unreadable records are skipped with a log
    line."""
    storage = services.files.storage
    out: list[FileRecord] = []
    start = None if after is None else "files/" + after
    while True:
        with storage_errors_translated():
            infos = [info async for info in storage.list("files/", start_after=start, limit=limit + 1, metadata=True)]
        for info in infos:
            file_id = info.key[len("files/") :]
            start = info.key
            if not is_file_id(file_id):
                continue
            try:
                record = FileRecord.from_metadata(info.metadata)
            except StorageUnavailable:
                log.warning("admin listing skips %s: it has no readable file record", info.key)
                continue
            if owner is not None and record.owner != owner:
                continue
            if len(out) >= limit:
                return out, out[-1].id  # one more than the page exists: the next page starts after the last shown
            out.append(record)
        if len(infos) <= limit:
            return out, None  # the listing ended


async def usage_of_keys(services: Services) -> dict[str, dict[str, int | None]]:
    """Usage of every configured key, and of files stored in open mode (``""``)."""
    lifecycle = services.files.lifecycle
    out = {name: (await lifecycle.usage.usage(name)).to_json() for name in sorted(lifecycle.keys)}
    out[""] = (await lifecycle.usage.usage(None)).to_json()
    return out
