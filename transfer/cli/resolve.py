"""``transfer resolve`` and ``transfer inspect``: download, decode and verify a descriptor; explain one."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from transfer.cli.bench import parse_size
from transfer.cli.console import CliError, _progress_bar, _read_descriptor
from transfer.client.client import DEFAULT_SERVER, AsyncTransferClient
from transfer.client.resolver import ResolveOptions
from transfer.core.model.content import ContentBundle, FileContent, TransferMode


async def cmd_resolve(args: argparse.Namespace) -> int:
    if args.cache_size is not None and not args.cache:
        raise CliError("invalid_request", "--cache-size needs --cache DIR")
    descriptor = _read_descriptor(args.descriptor)
    if args.output == "-" and not args.follow:
        return await _resolve_to_stdout(descriptor, args)
    if isinstance(descriptor, ContentBundle):
        directory = Path(args.output or descriptor.id)
        async with AsyncTransferClient(DEFAULT_SERVER, options=ResolveOptions(connections=args.connections)) as c:
            placed = await c.resolver.bundle_to_dir(descriptor, directory)
        for path in placed:
            print(f"{path}: verified", file=sys.stderr)
        return 0
    dest = Path(args.output) if args.output else Path(getattr(descriptor, "name", None) or "content.bin").name
    dest = Path(dest)
    if dest.exists() and not args.force and not args.follow:
        raise CliError("invalid_request", f"{dest} exists; pass --force to replace it")
    options = ResolveOptions(connections=args.connections)
    if args.follow:
        return await _follow(descriptor, args, options)
    if args.cache and isinstance(descriptor, FileContent):
        async with AsyncTransferClient(DEFAULT_SERVER, options=options) as client:
            done = await client.resolve_cached(descriptor, dest, args.cache, cache_size=args.cache_size)
        print(
            f"{dest}: verified {descriptor.checksum or '(no checksum declared)'} "
            f"({done.fetched_bytes} bytes fetched, {done.cached_bytes} from the cache)",
            file=sys.stderr,
        )
        return 0
    show = args.progress or (args.progress is None and sys.stderr.isatty())
    progress, close = _progress_bar(show and descriptor.type is TransferMode.URL, str(dest.name))
    async with AsyncTransferClient(DEFAULT_SERVER, options=options) as client:
        try:
            await client.resolve(descriptor, dest, progress)
        finally:
            close()
    print(f"{dest}: verified {descriptor.checksum or '(no checksum declared)'}", file=sys.stderr)
    return 0


async def _resolve_to_stdout(descriptor: Any, args: argparse.Namespace) -> int:
    """``-o -``: the content on stdout as it arrives; size and SHA-256 are checked at the end, and a mismatch is
    an error line and exit code 1 (as with ``curl | sha256sum``, a reader acts on the bytes only after a zero
    exit)."""
    if isinstance(descriptor, ContentBundle):
        raise CliError("invalid_request", "a bundle resolves into a directory, not to stdout: give -o DIRECTORY")
    out = sys.stdout.buffer
    async with AsyncTransferClient(DEFAULT_SERVER, options=ResolveOptions(connections=args.connections)) as client:
        if isinstance(descriptor, FileContent) and descriptor.type is not TransferMode.INLINE:
            async for piece in client.resolver.stream(descriptor):
                out.write(piece)
        else:
            out.write(await client.resolver.to_bytes(descriptor))
    out.flush()
    return 0


async def _follow(descriptor: Any, args: argparse.Namespace, options: ResolveOptions) -> int:
    """Write a streaming descriptor's bytes as its chunks arrive: to stdout with ``-o -``; to a file otherwise, which
    appears under its name only once the whole was verified."""
    if not isinstance(descriptor, FileContent) or descriptor.type is not TransferMode.STREAMING:
        raise CliError("invalid_descriptor", "--follow needs a streaming descriptor")
    async with AsyncTransferClient(DEFAULT_SERVER, options=options) as client:
        if args.output == "-":
            async for piece in client.resolver.follow(descriptor):
                sys.stdout.buffer.write(piece)
                sys.stdout.buffer.flush()
            return 0
        dest = Path(args.output) if args.output else Path(Path(descriptor.name).name)
        tmp = dest.with_name(f".{dest.name}.following")
        try:
            with open(tmp, "wb") as out:
                async for piece in client.resolver.follow(descriptor):
                    out.write(piece)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
    print(f"{dest}: verified {descriptor.checksum or '(no checksum declared)'}", file=sys.stderr)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    descriptor = _read_descriptor(args.descriptor)
    lines = [f"valid {type(descriptor).__name__}"]
    if isinstance(descriptor, ContentBundle):
        lines.append(f"bundle {descriptor.id!r}: {len(descriptor.items)} items, total_size {descriptor.total_size}")
        for item in descriptor.items:
            c = item.content
            lines.append(f"  - {item.id} ({item.role.value}): {type(c).__name__} {c.type.value} {c.content_type}")
    else:
        lines.append(f"mode: {descriptor.type.value}; content_type: {descriptor.content_type}")
        lines.append(f"size: {descriptor.size if descriptor.size is not None else 'unknown'} bytes")
        if descriptor.encoding:
            lines.append(f"encoding: {descriptor.encoding.value}; encoded_size: {descriptor.encoded_size}")
        lines.append(f"checksum: {descriptor.checksum or 'none (content cannot be verified)'}")
        if isinstance(descriptor, FileContent):
            lines.append(f"name: {descriptor.name}")
            if descriptor.url:
                lines.append(f"url: {descriptor.url}")
                lines.append(f"download_method: {(descriptor.download_method or 'GET')}")
                lines.append(f"range_supported: {bool(descriptor.range_supported)}")
            if descriptor.url_expires_at:
                left = (descriptor.url_expires_at - datetime.now(UTC)).total_seconds()
                state = f"expires in {int(left)} s" if left > 0 else f"EXPIRED {int(-left)} s ago"
                lines.append(f"url_expires_at: {descriptor.url_expires_at.isoformat()} ({state})")
            if descriptor.streaming_session_id:
                lines.append(
                    f"streaming: session {descriptor.streaming_session_id}, "
                    f"{descriptor.total_chunks} chunks of {descriptor.chunk_size} bytes"
                )
    print("\n".join(lines))
    return 0


def _cache_size(text: str) -> int:
    """``--cache-size``: bytes, or with a K/M/G suffix (powers of 1024)."""
    try:
        size = parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or e.g. 512M, 2G)") from None
    if size < 0:
        raise argparse.ArgumentTypeError("a cache size is 0 or more")
    return size
