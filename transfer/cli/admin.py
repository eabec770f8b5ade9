"""Admin commands: every key's files and usage (``transfer files``), the usage ledger's repair, the sweeps
(``transfer gc``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from transfer.cli.console import _api_key, _size
from transfer.client.client import AsyncTransferClient
from transfer.errors import TransferError


async def cmd_usage_repair(args: argparse.Namespace) -> int:
    """Admin: recount every key's usage from the file records, print what differs; ``--fix`` sets it right. Exit 1
    while a difference is left (not asked to fix, or a key kept changing: run it again)."""
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        result = await client.repair_usage(fix=args.fix)
    keys: dict[str, Any] = result["keys"]
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, entry in keys.items():
            rec, got = entry["recorded"], entry["counted"]
            line = (
                f"{name or '(no key)'}: recorded {_size(rec['bytes_used'])} bytes in {rec['files']} files, "
                f"counted {_size(got['bytes_used'])} bytes in {got['files']} files"
            )
            if entry["differs"]:
                state = "fixed" if entry["fixed"] else "busy, run again" if entry["busy"] else "differs"
                extra, more = rec["bytes_used"] - got["bytes_used"], rec["files"] - got["files"]
                line += f": {extra:+,} bytes, {more:+} files ({state})"
            print(line)
        if result["unreadable_records"]:
            print(f"{result['unreadable_records']} stored objects have no readable file record (see the server log)")
    left = [e for e in keys.values() if e["differs"] and not e["fixed"]]
    return 1 if left else 0


async def cmd_files_ls(args: argparse.Namespace) -> int:
    """Admin: every stored file with owner, size and expiry, page after page (``--limit`` in all)."""
    shown = 0
    cursor: str | None = None
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        while shown < args.limit:
            page = await client.admin_files(limit=min(1000, args.limit - shown), cursor=cursor, owner=args.owner)
            for f in page["files"]:
                if args.json:
                    print(json.dumps(f, ensure_ascii=False))
                else:
                    print(
                        f"{f['file_id']}  {f['size']:>14,}  {f['owner'] or '-':<16}  {f['created_at']}  "
                        f"{f['expires_at'] or 'never':<20}  {f['name']}"
                    )
            shown += len(page["files"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
    return 0


async def cmd_files_rm(args: argparse.Namespace) -> int:
    """Admin: delete files by id (their URLs stop working at once)."""
    failed = 0
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        for file_id in args.file_ids:
            try:
                await client.delete(file_id)
                print(f"removed {file_id}")
            except TransferError as exc:
                print(f"transfer: {exc.code}: {file_id}: {exc.message}", file=sys.stderr)
                failed += 1
    return 1 if failed else 0


async def cmd_files_usage(args: argparse.Namespace) -> int:
    """Admin: usage and quota of every configured key."""
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        keys = (await client.admin_usage())["keys"]
    if args.json:
        print(json.dumps(keys, indent=2))
        return 0
    for name, u in keys.items():
        print(
            f"{name or '(no key)':<20} {_size(u['bytes_used']):>16} bytes  {u['files']:>8} files  "
            f"{_size(u['bytes_reserved']):>14} reserved  quota {_size(u['quota_bytes'])}"
        )
    return 0


async def cmd_gc(args: argparse.Namespace) -> int:
    """Admin: run every sweep now and print what each removed."""
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        removed = await client.gc()
    if args.json:
        print(json.dumps(removed, indent=2))
    else:
        for name, count in removed.items():
            print(f"{name}: {'failed (see the server log)' if count < 0 else count}")
    return 1 if any(count < 0 for count in removed.values()) else 0
