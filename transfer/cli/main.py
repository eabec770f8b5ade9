"""The command line: its parser (every command and option, in one place) and the entry point."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

import httpx

from transfer import __version__
from transfer.cli.admin import cmd_files_ls, cmd_files_rm, cmd_files_usage, cmd_gc, cmd_usage_repair
from transfer.cli.bench import cmd_bench
from transfer.cli.console import (
    CliError,
    CliParser,
    _ca_cert_option,
    _service_options,
    _trust_ca,
    _untrusted_certificate,
)
from transfer.cli.events import add_event_commands
from transfer.cli.keyrecords import add_key_commands
from transfer.cli.keys import cmd_keys_new
from transfer.cli.listing import cmd_ls, cmd_session_descriptor, cmd_status, cmd_usage
from transfer.cli.resolve import _cache_size, cmd_inspect, cmd_resolve
from transfer.cli.serve import ALLOW_OPEN_HELP, cmd_mcp, cmd_serve
from transfer.cli.storage import cmd_storage_check
from transfer.cli.upload import cmd_bundle, cmd_upload
from transfer.client.client import DEFAULT_SERVER
from transfer.core.model.encodings import CODECS
from transfer.errors import TransferError


def build_parser() -> argparse.ArgumentParser:
    from storage.registry import BACKENDS  # the registry of storage backends (light: no backend)

    parser = CliParser(prog="transfer", description="Large-content transfer service for AI agents")
    parser.add_argument("--version", action="version", version=f"transfer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the service (local storage by default)")
    p.add_argument("--host", help="bind address (TRANSFER_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (TRANSFER_PORT, default 8080)")
    p.add_argument("--allow-open", action="store_const", const="true", help=ALLOW_OPEN_HELP)
    p.add_argument(
        "--metrics-port",
        type=int,
        help="a second port that serves only GET /metrics, without a key (TRANSFER_METRICS_PORT; default: none)",
    )
    p.add_argument("--data-dir", help="local storage directory (TRANSFER_DATA_DIR, default ./transfer-data)")
    p.add_argument("--public-url", help="base URL for descriptors (TRANSFER_PUBLIC_URL)")
    p.add_argument("--storage", choices=list(BACKENDS), help="backend (TRANSFER_STORAGE, default local)")
    p.add_argument("--s3-bucket", help="bucket for --storage s3 (TRANSFER_S3_BUCKET)")
    p.add_argument("--s3-endpoint-url", help="S3 endpoint (TRANSFER_S3_ENDPOINT_URL; default AWS_ENDPOINT_URL)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--log-format", choices=["json", "text"], help="log lines (TRANSFER_LOG_FORMAT, default text)")
    p.add_argument(
        "--shutdown-grace",
        type=float,
        help="seconds from SIGTERM until requests still running are stopped (TRANSFER_SHUTDOWN_GRACE, default 25)",
    )
    p.add_argument(
        "--shutdown-drain",
        type=float,
        help="seconds after SIGTERM with /readyz at 503 before the port closes (TRANSFER_SHUTDOWN_DRAIN, default 5)",
    )
    p.add_argument(
        "--single-replica",
        action="store_const",
        const="true",
        help="this is the only process on its storage (TRANSFER_SINGLE_REPLICA): needed on an engine without "
        "atomic compare-and-set, e.g. Swift's s3api",
    )
    p.add_argument(
        "--tls-cert", help="PEM certificate chain: serve HTTPS (TRANSFER_TLS_CERT; reloaded on SIGHUP or file change)"
    )
    p.add_argument("--tls-key", help="PEM private key of --tls-cert (TRANSFER_TLS_KEY)")
    p.add_argument(
        "--http2",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="HTTP/2 next to HTTP/1.1: h2 by ALPN over TLS, h2c by prior knowledge (TRANSFER_HTTP2, default on)",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("storage", help="the storage engine")
    storage_sub = p.add_subparsers(dest="storage_command", required=True)
    s = storage_sub.add_parser(
        "check", help="probe an S3 endpoint: which conditional requests, checksums and presigned URLs it honours"
    )
    s.add_argument("--endpoint", help="S3 endpoint URL (default TRANSFER_S3_ENDPOINT_URL, AWS_ENDPOINT_URL, AWS)")
    s.add_argument("--bucket", help="an existing bucket to probe in (default TRANSFER_S3_BUCKET)")
    s.add_argument("--region", help="default TRANSFER_S3_REGION / AWS_REGION")
    s.add_argument("--prefix", help="key prefix (default TRANSFER_S3_PREFIX); probes go under <prefix>probe/")
    s.add_argument(
        "--addressing-style", choices=["auto", "path", "virtual"], help="default TRANSFER_S3_ADDRESSING_STYLE"
    )
    s.add_argument("--json", action="store_true", help="the outcomes as one JSON object")
    s.set_defaults(func=cmd_storage_check)

    p = sub.add_parser("mcp", help="MCP server: tools to upload, open sessions, resolve, describe, bundle, TP")
    p.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    p.add_argument("--root", help="directory the file tools may use (stdio default: the working directory)")
    p.add_argument(
        "--serve-http",
        action="store_true",
        help="stdio: serve the HTTP API in this process even with a public URL set (without one it always does, "
        "on --port or a free port, so that the URLs in descriptors resolve)",
    )
    p.add_argument("--data-dir", help="local storage directory (TRANSFER_DATA_DIR)")
    p.add_argument("--public-url", help="base URL for descriptors (TRANSFER_PUBLIC_URL)")
    for flag in ("--host", "--port", "--storage", "--s3-bucket", "--s3-endpoint-url"):
        p.add_argument(flag, type=int if flag == "--port" else str, help="as for serve")
    p.add_argument("--allow-open", action="store_const", const="true", help=ALLOW_OPEN_HELP)
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_mcp)

    server_default = os.environ.get("TRANSFER_SERVER", DEFAULT_SERVER)
    p = sub.add_parser("upload", help="upload files; prints their descriptors as JSON")
    p.add_argument("files", nargs="+", metavar="FILE")
    _service_options(p, server_default)
    p.add_argument("--name", help="file name to record (single file only)")
    p.add_argument("--content-type", help="media type (default: sniffed)")
    p.add_argument("--role", choices=["reference", "result", "attachment"])
    p.add_argument("--description")
    p.add_argument("--encoding", default="none", choices=CODECS.storage_names())
    p.add_argument("--download-method", choices=["GET", "POST", "signed_url"])
    p.add_argument("--ttl", type=int, help="seconds the signed URL lives")
    p.add_argument("--url", action="store_true", help="always url mode, even for small files")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--chunked", action="store_true", help="a resumable chunked session, chunks in parallel")
    p.add_argument("--chunk-size", type=int, help="bytes per chunk (--chunked; default: the server's)")
    p.add_argument("--connections", type=int, default=4, help="parallel chunks (--chunked; default 4)")
    p.add_argument(
        "--direct",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="parts straight to the service's bucket (S3), resumable; default: for files of at least 64 MiB when the "
        "server offers it, else through the server",
    )
    p.add_argument(
        "--dedup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="content-defined chunks: send only those the service lacks for this key (a new version sends about "
        "what changed), for files of at least 1 MiB when the server offers it; a file whose first 4 MiB the key "
        "lacks goes whole at once and its chunks are indexed after it; default: on, unless --chunked, --direct "
        "or --encoding is given",
    )
    p.add_argument(
        "--resumable",
        action="store_true",
        help="the IETF resumable upload protocol (draft-ietf-httpbis-resumable-upload, interop version 9) at "
        "/v1/uploads: created with the first bytes, resumed after a cut; rerun the same command after a kill",
    )
    p.add_argument(
        "--state-dir",
        help="where --chunked/--direct/--resumable remember uploads to resume (default ~/.cache/transfer)",
    )
    p.add_argument("--expires-in", type=int, metavar="SECONDS", help="seconds the stored file lives")
    p.set_defaults(func=cmd_upload)

    p = sub.add_parser("usage", help="this key's stored bytes, files and quota; `usage repair`: recount (admin)")
    _service_options(p, server_default)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_usage)
    usage = p.add_subparsers(dest="usage_command")
    u = usage.add_parser("repair", help="admin: recount every key's usage from the file records; --fix sets it right")
    _service_options(u, server_default)
    u.add_argument("--fix", action="store_true", help="set a ledger that differs to the count")
    u.add_argument("--json", action="store_true")
    u.set_defaults(func=cmd_usage_repair)

    p = sub.add_parser("files", help="admin: stored files of every key")
    files = p.add_subparsers(dest="files_command", required=True)
    f = files.add_parser("ls", help="list stored files: id, size, owner, created, expires, name")
    _service_options(f, server_default)
    f.add_argument("--owner", help="only this key's files")
    f.add_argument("--limit", type=int, default=10_000, help="at most this many (default 10000)")
    f.add_argument("--json", action="store_true", help="one JSON object a line")
    f.set_defaults(func=cmd_files_ls)
    f = files.add_parser("rm", help="delete files; their URLs stop working at once")
    f.add_argument("file_ids", nargs="+", metavar="FILE_ID")
    _service_options(f, server_default)
    f.set_defaults(func=cmd_files_rm)
    f = files.add_parser("usage", help="usage and quota of every key")
    _service_options(f, server_default)
    f.add_argument("--json", action="store_true")
    f.set_defaults(func=cmd_files_usage)

    p = sub.add_parser("gc", help="admin: run the sweeps now (expired files, sessions, uploads); print what went")
    _service_options(p, server_default)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("bundle", help="upload files and make a ContentBundle of them (JSON to stdout)")
    p.add_argument(
        "items", nargs="+", metavar="ROLE:PATH|ROLE:text=STRING", help="roles: main, reference, attachment, thumbnail"
    )
    _service_options(p, server_default)
    p.add_argument("--name")
    p.add_argument("--description")
    p.set_defaults(func=cmd_bundle)

    p = sub.add_parser("bench", help="measure a deployment: upload, chunked upload, resolve, small objects")
    _service_options(p, server_default)
    p.add_argument("--sizes", default="16M,256M", help="generated file sizes, e.g. 16M,1G (default 16M,256M)")
    p.add_argument("--file", help="also measure this file of yours")
    p.add_argument("--connections", type=int, default=4, help="parallel chunks and ranges (default 4)")
    p.add_argument("--small", type=int, default=200, help="how many 4 KiB uploads (0: skip; default 200)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("status", help="a chunked session's state: stored and missing chunks")
    p.add_argument("session", metavar="SESSION")
    _service_options(p, server_default)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("ls", help="list stored files (JSON lines, in file-id order), a page at a time")
    p.add_argument("--limit", type=int, help="files per page, 1 to 1000 (default: the server's, 100)")
    p.add_argument("--cursor", help="continue after the page that printed this cursor")
    p.add_argument("--all", action="store_true", help="every page, one after the other")
    _service_options(p, server_default)
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("session", help="chunked upload sessions")
    sessions = p.add_subparsers(dest="session_command", required=True)
    s = sessions.add_parser("descriptor", help="print a session's live streaming descriptor (for resolve --follow)")
    s.add_argument("session", metavar="SESSION")
    s.add_argument("--ttl", type=int, help="seconds its signed URL lives (default: the server's)")
    _service_options(s, server_default)
    s.set_defaults(func=cmd_session_descriptor)
    s = sessions.add_parser("status", help="a session's state: stored and missing chunks")
    s.add_argument("session", metavar="SESSION")
    _service_options(s, server_default)
    s.set_defaults(func=cmd_status)

    p = sub.add_parser("resolve", help="download, decode and verify a descriptor")
    p.add_argument("descriptor", help="descriptor JSON file, or - for stdin")
    p.add_argument(
        "-o", "--output", help="destination path, - for stdout (default: the descriptor's name; a bundle: a directory)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing destination")
    p.add_argument("--connections", type=int, default=4, help="parallel ranged requests (default 4)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--follow", action="store_true", help="streaming descriptor: write chunks as they are uploaded")
    p.add_argument(
        "--cache",
        metavar="DIR",
        help="keep the chunks of what is resolved here; fetch only the chunks it lacks when the service gives the "
        "file's chunk manifest",
    )
    p.add_argument(
        "--cache-size",
        type=_cache_size,
        metavar="SIZE",
        help="with --cache: keep at most this much (e.g. 2G, 512M), evicting the least recently used chunks",
    )
    _ca_cert_option(p)
    p.set_defaults(func=cmd_resolve)

    p = sub.add_parser("keys", help="API keys")
    keys = p.add_subparsers(dest="keys_command", required=True)
    k = keys.add_parser("new", help="make a key; prints it and the TRANSFER_API_KEYS entry")
    k.add_argument("name")
    k.add_argument("--scopes", default="upload,read", help="comma-separated: upload, read, admin")
    k.set_defaults(func=cmd_keys_new)
    add_key_commands(keys, server_default)  # create, list, revoke, rotate: run-time keys (transfer.cli.keyrecords)

    add_event_commands(sub, lambda p: _service_options(p, server_default))  # subscriptions, events

    p = sub.add_parser("inspect", help="validate a descriptor and explain it")
    p.add_argument("descriptor", help="descriptor JSON file, or - for stdin")
    p.set_defaults(func=cmd_inspect)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "ca_cert", None):
            _trust_ca(args.ca_cert)
        result = args.func(args)
        if asyncio.iscoroutine(result):
            coro: Coroutine[Any, Any, int] = result
            return asyncio.run(coro)
        return int(result)
    except TransferError as exc:
        print(f"transfer: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except CliError as exc:
        print(f"transfer: {exc.code}: {exc}", file=sys.stderr)
        return exc.exit_code
    except httpx.TransportError as exc:
        untrusted = _untrusted_certificate(exc)
        if untrusted is not None:
            print(
                f"transfer: untrusted_certificate: {untrusted.verify_message or untrusted}: the server's certificate "
                "is not signed by a CA this client trusts; pass --ca-cert FILE (the CA's PEM) or set SSL_CERT_FILE",
                file=sys.stderr,
            )
            return 1
        print(f"transfer: unreachable: cannot reach the service: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("transfer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`| head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:
        print(f"transfer: io_error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
