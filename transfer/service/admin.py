"""Operations for whoever runs the service: run the sweeps now, list stored files with their owners and expiry,
usage of every key. Admin front doors (``transfer/api/admin.py``, the CLI) call these; nothing here checks scopes.
"""

from __future__ import annotations

import logging
from typing import Any

from transfer.core.model.content import format_timestamp
from transfer.errors import StorageUnavailable, storage_errors_translated
from transfer.service.container import Services
from transfer.service.files.records import FileRecord, is_file_id

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
    """Usage of every configured key and run-time key name, and of files stored in open mode (``""``)."""
    lifecycle = services.files.lifecycle
    names = set(lifecycle.keys) | {str(entry["name"]) for entry in await services.identities.keys.list()}
    out = {name: (await lifecycle.usage.usage(name)).to_json() for name in sorted(names)}
    out[""] = (await lifecycle.usage.usage(None)).to_json()
    return out


REPAIR_ATTEMPTS = 3  # counts of a key whose ledger or files kept changing before a repair gives up on it


async def _count_files(services: Services) -> tuple[dict[str | None, dict[str, int]], int]:
    """Every stored file's record, read from one listing of ``files/`` with metadata: per owner, each file's
    bytes (descriptor ``size``, what a charge counts); and how many objects had no readable record (left out,
    with a log line). The other bytes a key is charged for are counted beside its files, by id: its bundles'
    records (:meth:`BundleService.charged`), the TP messages it sent that wait in a mailbox
    (:meth:`TPService.charged`) and the packs of chunks it keeps for its next versions, each whole
    (:meth:`ChunkService.charged`). A file sharing another's bytes counts its full size like any file (the
    README's quota rule): shared content records and blobs are the operator's saving, not counted."""
    counted: dict[str | None, dict[str, int]] = {}
    unreadable = 0
    with storage_errors_translated():
        async for info in services.files.storage.list("files/", metadata=True):
            if not is_file_id(info.key[len("files/") :]):
                continue
            try:
                record = FileRecord.from_metadata(info.metadata)
            except StorageUnavailable:
                log.warning("usage repair skips %s: it has no readable file record", info.key)
                unreadable += 1
                continue
            counted.setdefault(record.owner, {})[record.id] = record.size
    async for owner, bundle_id, nbytes in services.bundles.charged():
        counted.setdefault(owner, {})[bundle_id] = nbytes
    async for payer, message_id, nbytes in services.tp.charged():
        counted.setdefault(payer, {})[message_id] = nbytes
    async for holder, pack_id, nbytes in services.chunks.store.charged():  # chunk packs count whole, beside the files
        counted.setdefault(holder, {})[pack_id] = nbytes
    return counted, unreadable


def _expected(files: dict[str, int], claims: dict[str, int]) -> tuple[int, int]:
    """What a key's ledger should say (bytes, files): its stored files and other charged objects (bundles, waiting
    TP messages), and
    those whose removal is claimed but not yet refunded (still listed or already gone: counted once either way, as
    the claim will refund them). Only files count in ``files``."""
    merged = {**files, **claims}
    return sum(merged.values()), sum(1 for stored_id in merged if is_file_id(stored_id))


def _usage_doc(used: int, files: int) -> dict[str, int]:
    return {"bytes_used": used, "files": files}


async def repair_usage(services: Services, *, fix: bool) -> dict[str, Any]:
    """Recount every key's usage from the file records (``transfer usage repair``): per key, what its ledger
    records, what its stored files add up to, and whether the two differ; with ``fix``, a differing ledger is set
    to the count. A fix is written only when two counts agree and the ledger record did not change from before the
    first to the write (compare-and-set): an upload, delete or sweep meanwhile leaves that key unfixed in this
    run (``busy``; run it again). Reservations and removal claims are left as they are. Lists every stored file
    twice with a fix, once without: an admin command, never on a request path."""
    ledger = services.files.lifecycle.usage
    owners: set[str | None] = {None, *services.files.lifecycle.keys}
    snapshots = {owner: await ledger.recorded(owner) for owner in owners}
    counted, unreadable = await _count_files(services)
    for owner in counted.keys() - owners:  # a key no longer configured still has files
        snapshots[owner] = await ledger.recorded(owner)
    report: dict[str, Any] = {}
    for owner in sorted(snapshots, key=lambda o: o or ""):
        used, files, claims, _etag = snapshots[owner]
        want_used, want_files = _expected(counted.get(owner, {}), claims)
        report[owner or ""] = {
            "recorded": _usage_doc(used, files),
            "counted": _usage_doc(want_used, want_files),
            "differs": (used, files) != (want_used, want_files),
            "fixed": False,
            "busy": False,
        }
    if fix:
        await _fix(services, report, snapshots, counted)
    differs = [name for name, entry in report.items() if entry["differs"]]
    return {
        "keys": report,
        "differing": len(differs),
        "fixed": sum(1 for entry in report.values() if entry["fixed"]),
        "unreadable_records": unreadable,
    }


async def _fix(
    services: Services,
    report: dict[str, Any],
    snapshots: dict[str | None, tuple[int, int, dict[str, int], str | None]],
    counted: dict[str | None, dict[str, int]],
) -> None:
    """Set each differing key's ledger to its count: ledger read, files counted twice, the write only if both
    counts agree and the ledger is still the version read (a charge before the read whose file was published
    after the first count shows as a difference between the counts)."""
    ledger = services.files.lifecycle.usage
    pending = {owner for owner in snapshots if report[owner or ""]["differs"]}
    for attempt in range(REPAIR_ATTEMPTS):
        if not pending:
            return
        if attempt:  # what changed: read and count again, in that order
            snapshots = {owner: await ledger.recorded(owner) for owner in pending}
            counted, _ = await _count_files(services)
        again, _ = await _count_files(services)
        for owner in sorted(pending, key=lambda o: o or ""):
            used, files, claims, etag = snapshots[owner]
            first = _expected(counted.get(owner, {}), claims)
            second = _expected(again.get(owner, {}), claims)
            entry = report[owner or ""]
            entry["recorded"], entry["counted"] = _usage_doc(used, files), _usage_doc(*second)
            if (used, files) == second:
                entry["differs"] = False  # it came right meanwhile
                pending.discard(owner)
            elif first == second and await ledger.correct(owner, *second, etag):
                entry["fixed"] = True
                pending.discard(owner)
    for owner in pending:
        report[owner or ""]["busy"] = True
