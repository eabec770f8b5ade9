"""``transfer upload`` and ``transfer bundle``: put files in (one stream, chunked, direct, deduplicated or
resumable) and print their descriptors."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from transfer.cli.console import CliError, _api_key, _progress_bar
from transfer.client.chunks import state_dir
from transfer.client.client import AsyncTransferClient
from transfer.client.dedup import AUTO_DEDUP_THRESHOLD
from transfer.client.direct import AUTO_DIRECT_THRESHOLD
from transfer.client.resolver import ResolveOptions
from transfer.core.model.content import FileContent
from transfer.errors import DirectUploadUnsupported


async def cmd_upload(args: argparse.Namespace) -> int:
    options = ResolveOptions(buffer_size=1 << 20, connections=args.connections)
    results: list[dict[str, Any]] = []
    remember = Path(args.state_dir) if args.state_dir else state_dir()
    async with AsyncTransferClient(args.server, options=options, api_key=_api_key(args)) as client:
        for file in args.files:
            path = Path(file)
            if not path.is_file():
                raise CliError("invalid_request", f"{file}: no such file")
            show = args.progress or (args.progress is None and sys.stderr.isatty() and path.stat().st_size > 8 << 20)
            progress, close = _progress_bar(show, path.name)
            # what every way of uploading says about the file
            about: dict[str, Any] = {
                "name": args.name if len(args.files) == 1 else None,
                "content_type": args.content_type,
                "role": args.role,
                "description": args.description,
                "progress": progress,
                "expires_in": args.expires_in,
            }

            async def send_whole(path: Path = path, about: dict[str, Any] = about) -> FileContent:
                """The file whole, the way the options ask: direct to the bucket, a chunked session, or one body."""
                if args.resumable:
                    return await _upload_resumable(client, path, about, remember)
                direct = args.direct
                if direct is None:  # automatic: large files, unless another way was asked for
                    direct = not args.chunked and path.stat().st_size >= AUTO_DIRECT_THRESHOLD
                if direct:
                    try:
                        return await client.upload_direct(path, remember=remember, **about)
                    except DirectUploadUnsupported:
                        if args.direct:
                            print("the server cannot take direct uploads; sending through it", file=sys.stderr)
                if args.chunked:

                    def announce(session: dict[str, Any], server: str = args.server) -> None:
                        _announce_session(session, server)

                    return await client.upload_chunked(
                        path, chunk_size=args.chunk_size, remember=remember, on_session=announce, **about
                    )
                return await client.upload(
                    path,
                    encoding=args.encoding,
                    download_method=args.download_method,
                    ttl=args.ttl,
                    inline=False if args.url else None,
                    **about,
                )

            try:
                # by default (unless another way or an encoding was asked for): the first chunks are probed; a new
                # file goes whole at once and its chunks are indexed after, a known one sends only what the key
                # lacks (README, "Chunked deduplicating uploads")
                descriptor = None
                dedup = args.dedup
                if dedup is None:
                    dedup = not args.chunked and not args.direct and not args.resumable and args.encoding == "none"
                elif dedup and args.encoding != "none":
                    raise CliError("invalid_request", "--dedup sends the file's own bytes: it takes no --encoding")
                if dedup and path.stat().st_size >= AUTO_DEDUP_THRESHOLD:
                    deduplicated = await client.upload_dedup(
                        path, download_method=args.download_method, ttl=args.ttl, send_whole=send_whole, **about
                    )
                    if deduplicated is not None:
                        if deduplicated.how == "known":
                            print(
                                f"{path.name}: this key stores this content already; published without sending "
                                f"it (the manifest only, {deduplicated.manifest_bytes} bytes)",
                                file=sys.stderr,
                            )
                        elif deduplicated.how == "chunks":
                            print(
                                f"{path.name}: sent {deduplicated.sent_bytes} of {path.stat().st_size} bytes "
                                f"({deduplicated.sent_chunks} of {deduplicated.chunks} chunks; "
                                "the service had the rest)",
                                file=sys.stderr,
                            )
                        elif deduplicated.index_error:
                            print(
                                f"{path.name}: new to this key, sent whole; its chunks were not indexed "
                                f"({deduplicated.index_error}): its next version goes whole too",
                                file=sys.stderr,
                            )
                        else:
                            print(
                                f"{path.name}: new to this key, sent whole ({deduplicated.sent_bytes} bytes); its "
                                f"{deduplicated.chunks} chunks {'are being' if deduplicated.indexed_later else 'are'} "
                                "indexed: its next version sends what changed",
                                file=sys.stderr,
                            )
                        descriptor = deduplicated.descriptor
                    elif args.dedup:
                        print("the server offers no chunked uploads; sending the whole file", file=sys.stderr)
                if descriptor is None:
                    descriptor = await send_whole()
            finally:
                close()
            results.append(descriptor.to_json())
    out = results[0] if len(results) == 1 else results
    print(json.dumps(out, ensure_ascii=False, indent=2))
    return 0


async def _upload_resumable(
    client: AsyncTransferClient, path: Path, about: dict[str, Any], remember: Path
) -> FileContent:
    """``--resumable``: the IETF resumable upload protocol; a rerun resumes the upload remembered for the file and
    says how many bytes it sent (only what the service lacked)."""
    if about.get("role") or about.get("description"):
        raise CliError(
            "invalid_request", "--resumable carries the file's name, type and lifetime, not --role or --description"
        )
    descriptor = await client.upload_resumable(
        path,
        name=about.get("name"),
        content_type=about.get("content_type"),
        progress=about.get("progress"),
        remember=remember,
        expires_in=about.get("expires_in"),
    )
    done = client.last_resumable
    if done is not None and done.resumed_from is not None:
        print(
            f"{path.name}: resumed {done.location} at byte {done.resumed_from}; sent {done.sent} of "
            f"{path.stat().st_size} bytes",
            file=sys.stderr,
        )
    return descriptor


def _announce_session(session: dict[str, Any], server: str) -> None:
    """Tell the person (stderr; stdout carries the final descriptor) which session the upload uses and how a
    reader follows it live."""
    sid = session["streaming_session_id"]
    total = session.get("total_chunks")
    print(
        f"session {sid}: {session.get('name')}, {total} chunks of {session.get('chunk_size')} bytes; "
        f"a reader can follow it now: transfer session descriptor {sid} --server {server} "
        "| transfer resolve - --follow -o OUTPUT",
        file=sys.stderr,
        flush=True,
    )


async def cmd_bundle(args: argparse.Namespace) -> int:
    """Upload files and gather them, with inline text, into a ContentBundle (printed as JSON)."""
    items: list[dict[str, Any]] = []
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        for spec in args.items:
            role, sep, what = spec.partition(":")
            if not sep or not what:
                raise CliError("invalid_request", f"item {spec!r}: use ROLE:PATH or ROLE:text=STRING")
            if what.startswith("text="):
                items.append(
                    {
                        "role": role,
                        "content": {
                            "type": "inline",
                            "content_type": "text/plain",
                            "charset": "utf-8",
                            "data": what[5:],
                        },
                    }
                )
                continue
            path = Path(what)
            if not path.is_file():
                raise CliError("invalid_request", f"{what}: no such file")
            descriptor = await client.upload(path, inline=False)
            items.append({"role": role, "file_id": (descriptor.metadata or {})["file_id"]})
        bundle = await client.create_bundle(items, name=args.name, description=args.description)
    print(json.dumps(bundle.to_json(), ensure_ascii=False, indent=2))
    return 0
