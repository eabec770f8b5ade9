"""What a key holds: ``transfer ls``, ``transfer usage``, and a chunked session's ``status`` and live
``descriptor``."""

from __future__ import annotations

import argparse
import json
import sys

from transfer.cli.console import _api_key, _size
from transfer.client.client import AsyncTransferClient


async def cmd_session_descriptor(args: argparse.Namespace) -> int:
    """Print a session's live streaming descriptor (JSON), for `transfer resolve --follow`."""
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        descriptor = await client.session_descriptor(args.session, ttl=args.ttl)
    print(json.dumps(descriptor.to_json(), ensure_ascii=False, indent=2))
    return 0


async def cmd_status(args: argparse.Namespace) -> int:
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        status = await client.session_status(args.session)
    print(json.dumps(status, indent=2))
    return 0


async def cmd_ls(args: argparse.Namespace) -> int:
    """Stored files as JSON lines (one descriptor a line); without --all, one page and then, on stderr, the cursor
    of the next one."""
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        if args.all:
            async for item in client.iter_files(args.limit, args.cursor):
                print(json.dumps(item))
            return 0
        page = await client.list_files(args.limit, args.cursor)
    for item in page["files"]:
        print(json.dumps(item))
    if page.get("next_cursor"):
        print(f"more: transfer ls --cursor {page['next_cursor']}", file=sys.stderr)
    return 0


async def cmd_usage(args: argparse.Namespace) -> int:
    """This key's usage and quota (any key with the upload scope)."""
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        usage = await client.usage()
    if args.json:
        print(json.dumps(usage, indent=2))
    else:
        print(
            f"{usage['key'] or '(no key)'}: {_size(usage['bytes_used'])} bytes in {usage['files']} files, "
            f"{_size(usage['bytes_reserved'])} reserved, quota {_size(usage['quota_bytes'])}, "
            f"available {_size(usage['bytes_available'])}"
        )
    return 0
