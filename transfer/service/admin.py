"""Operations for whoever runs the service: run the sweeps now, list stored files with their owners and expiry,
usage of every key. Admin front doors (``transfer/api/admin.py``, the CLI) call these; nothing here checks scopes.
"""

from __future__ import annotations

import logging
from typing import Any

from storage.base import SupportsAbandonedUploads
from transfer.core.content import format_timestamp
from transfer.errors import StorageUnavailable, TransferError, storage_errors_translated
from transfer.service.container import Services
from transfer.service.records import FileRecord, is_file_id

log = logging.getLogger("transfer.sweeps")


async def run_sweeps(services: Services) -> dict[str, int]:
    """Every sweep once, each on its own (one failing does not stop the others); what each removed. What the
    periodic sweeper runs and what ``transfer gc`` asks for."""
    s = services.settings
    removed: dict[str, int] = {}

    async def abandoned() -> int:
        storage = services.files.storage
        if not isinstance(storage, SupportsAbandonedUploads):
            return 0
        with storage_errors_translated():
            count = await storage.abort_abandoned_uploads(s.s3_abandoned_upload_age)
        if count:
            log.warning("aborted %d abandoned multipart upload(s) (their writers had died)", count)
        return count

    async def sessions() -> int:
        counts = await services.sessions.collect_garbage()
        return counts["expired"] + counts["forgotten"]

    sweeps = {
        "expired_files": services.files.sweep_expired_files,
        "sessions": sessions,
        "tus_uploads": services.tus.collect_garbage,
        "abandoned_multipart_uploads": abandoned,
    }
    for name, sweep in sweeps.items():
        try:
            removed[name] = await sweep()
        except TransferError:
            log.exception("sweep %s failed; it runs again at the next interval", name)
            removed[name] = -1
    return removed


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
    included (the sweep has not reached them yet); and the cursor of the next page (None: no more). Unreadable
    records are skipped with a log line."""
    storage = services.files.storage
    out: list[FileRecord] = []
    last: str | None = None
    with storage_errors_translated():
        async for info in storage.list("files/"):
            file_id = info.key[len("files/") :]
            if not is_file_id(file_id) or (after is not None and file_id <= after):
                continue
            if len(out) >= limit:
                return out, last
            try:
                record = FileRecord.from_metadata(info.metadata)
            except StorageUnavailable:
                log.warning("admin listing skips %s: it has no readable file record", info.key)
                continue
            if owner is not None and record.owner != owner:
                continue
            out.append(record)
            last = file_id
    return out, None


async def usage_of_keys(services: Services) -> dict[str, dict[str, int | None]]:
    """Usage of every configured key, and of files stored in open mode (``""``)."""
    lifecycle = services.files.lifecycle
    out = {name: (await lifecycle.usage.usage(name)).to_json() for name in sorted(lifecycle.keys)}
    out[""] = (await lifecycle.usage.usage(None)).to_json()
    return out
