"""The ``transfer`` command: serve, upload, resolve, inspect.

Every failure prints one line, ``transfer: <code>: <message>``, on stderr and exits non-zero (2 for usage errors,
1 otherwise). Settings come from flags, then ``TRANSFER_*`` environment variables (see ``transfer.settings``).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import json
import os
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import httpx

from transfer import __version__
from transfer.client.chunks import state_dir
from transfer.client.client import DEFAULT_SERVER, AsyncTransferClient
from transfer.client.dedup import AUTO_DEDUP_THRESHOLD
from transfer.client.direct import AUTO_DIRECT_THRESHOLD
from transfer.client.resolver import Progress, ResolveOptions
from transfer.core.model.content import ContentBundle, FileContent, TransferMode, load_descriptor
from transfer.core.model.encodings import CODECS
from transfer.errors import DirectUploadUnsupported, TransferError

if TYPE_CHECKING:
    from pydantic import ValidationError

# PERF-NOTES: uvloop hands Python a fresh ~256 KiB bytes per socket read; with glibc's default thresholds a 1 GiB
# upload page-faults ~217,000 times and throughput halves. These must be set before the interpreter starts.
MAX_DESCRIPTOR_BYTES = 16 << 20  # a descriptor (bundles included) is metadata, never content

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4194304", "MALLOC_TRIM_THRESHOLD_": "268435456"}


class CliParser(argparse.ArgumentParser):
    """argparse, but a usage error is the one line every failure prints (exit code 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"transfer: invalid_usage: {message} (see: {self.prog} --help)\n")
        sys.exit(2)


class CliError(Exception):
    def __init__(self, code: str, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.code = code
        self.exit_code = exit_code


def _progress_bar(enabled: bool, label: str) -> tuple[Progress | None, Callable[[], None]]:
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar: Any = None

    def update(done: int, total: int | None) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=sys.stderr)
        bar.update(done - bar.n)

    def close() -> None:
        if bar is not None:
            bar.close()

    return update, close


def _read_descriptor(source: str) -> Any:
    try:
        stream = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115 - closed below
        try:
            raw = stream.read(MAX_DESCRIPTOR_BYTES + 1)
        finally:
            if source != "-":
                stream.close()
        if len(raw) > MAX_DESCRIPTOR_BYTES:
            raise CliError("invalid_descriptor", f"descriptor {source} is larger than {MAX_DESCRIPTOR_BYTES} bytes")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise CliError("invalid_request", f"cannot read descriptor {source}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CliError("invalid_descriptor", f"descriptor {source} is not UTF-8 text") from exc
    return load_descriptor(text)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port), bound here so that a taken port is one clear error
    line before anything starts, not a server that dies after its clients connected."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise CliError(
                "address_in_use", f"cannot listen on {host}:{port}: it is taken; choose another port (--port)"
            ) from None
        raise CliError("invalid_settings", f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


# the settings' own refusals that get a code of their own (the others are invalid_settings)
_REFUSALS = ("open_mode_refused", "placeholder_secret")


def settings_refused(exc: ValidationError) -> CliError:
    """The one line a refused configuration prints: each problem named by its variable, and the code of the refusal
    (``open_mode_refused``, ``placeholder_secret``) when every problem is one, else ``invalid_settings``. No value
    is repeated (a secret would be)."""
    errors = exc.errors()
    problems = "; ".join(
        (f"TRANSFER_{'_'.join(map(str, e['loc'])).upper()}: " if e["loc"] else "")
        + e["msg"].removeprefix("Value error, ")
        for e in errors
    )
    kinds = {e["type"] for e in errors}
    code = kinds.pop() if len(kinds) == 1 and kinds <= set(_REFUSALS) else "invalid_settings"
    return CliError(code, problems)


def _http_base(host: str, port: int, scheme: str = "http") -> str:
    """The URL of a server bound to ``host:port``: a wildcard address is reached through loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def cmd_serve(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    for flag, var in (*_SERVICE_FLAGS, *_OPS_FLAGS):
        value = getattr(args, flag, None)
        if value is not None:
            env[var] = str(value)
    if any(os.environ.get(k) != v for k, v in MALLOC_ENV.items()) and not os.environ.get("TRANSFER_NO_REEXEC"):
        env.update(MALLOC_ENV)
        env["TRANSFER_NO_REEXEC"] = "1"
        os.execve(sys.executable, [sys.executable, "-m", "transfer", *sys.argv[1:]], env)
    os.environ.update(env)

    import logging

    from pydantic import ValidationError

    from storage.base import UnsafeForReplicas, require_replica_safe
    from storage.errors import StorageError
    from transfer.api.middleware.metricsport import MetricsPort
    from transfer.api.middleware.observability import configure_logging
    from transfer.api.protocol.http2 import serve_config
    from transfer.api.protocol.shutdown import GracefulServer
    from transfer.api.protocol.tls import ListenerTLS
    from transfer.errors import SigningKeysRequired
    from transfer.hosts import create_app
    from transfer.service.backends import BACKENDS, make_storage, require_signing_keys_kept_apart
    from transfer.settings import Settings

    try:
        settings = Settings()
        configure_logging(settings.log_format, args.log_level)
        require_signing_keys_kept_apart(settings)
        storage = make_storage(settings)
        asyncio.run(storage.start())  # fail here, in one line, rather than in uvicorn's lifespan with a traceback
        require_replica_safe(storage, settings.single_replica)
        app = create_app(settings, storage)
        tls = ListenerTLS(settings.tls_cert, settings.tls_key) if settings.tls_cert and settings.tls_key else None
    except ssl.SSLError as exc:
        raise CliError("invalid_settings", f"TLS certificate or key not usable: {exc}") from exc
    except ValidationError as exc:
        raise settings_refused(exc) from exc
    except SigningKeysRequired as exc:
        raise CliError(exc.code, str(exc)) from exc
    except UnsafeForReplicas as exc:
        raise CliError("unsafe_for_replicas", str(exc)) from exc
    except StorageError as exc:
        raise CliError("storage_unavailable", str(exc).splitlines()[0]) from exc
    except (TransferError, ValueError, OSError) as exc:
        raise CliError("invalid_settings", str(exc).splitlines()[0]) from exc
    where = BACKENDS[settings.storage].where(settings)
    sock = _listen(settings.host, settings.port)
    port = sock.getsockname()[1]
    sockets, metrics_line = [sock], ""
    served: Any = app
    if settings.metrics_port is not None:  # the same server on a second socket that answers only GET /metrics
        metrics_host = settings.metrics_host or settings.host
        sockets.append(_listen(metrics_host, settings.metrics_port))
        served = MetricsPort(app, settings.metrics_port)
        metrics_line = f"; /metrics without a key on {_http_base(metrics_host, settings.metrics_port, 'http')}"
    scheme = "https" if tls is not None else "http"
    protocols = "HTTP/1.1"
    if settings.http2:
        protocols = "HTTP/2 (h2), HTTP/1.1" if tls is not None else "HTTP/1.1, HTTP/2 (h2c)"
    banner = (
        f"transfer {__version__}: serving {where} on {_http_base(settings.host, port, scheme)} ({protocols}; "
        f"OpenAPI docs at /docs{metrics_line.replace('http://', scheme + '://')})"
    )
    if settings.log_format == "json":  # every line of a JSON log is a JSON object
        logging.getLogger("transfer.ops").warning("%s", banner)
    else:
        print(banner, file=sys.stderr)
    # logging is configured above (one format for every logger); uvicorn must not install its own
    config = serve_config(
        served, settings, host=settings.host, port=port, tls=tls, log_level=args.log_level, log_config=None
    )
    if tls is not None:  # SIGHUP: a renewed certificate for new connections; open ones keep theirs
        signal.signal(signal.SIGHUP, lambda _sig, _frame: tls.reload())
    server = GracefulServer(
        config, app.state.observability, drain=settings.shutdown_drain, grace=settings.shutdown_grace
    )
    # the start-up heap (modules, the application, its routes and models: ~150,000 objects) lives as long as the
    # process: frozen, the collector no longer walks it on each old-generation pass (~100-180 ms each; under 4 KiB
    # uploads ×64 one every ~750 requests, ~0.2 ms of server CPU per request)
    gc.freeze()
    server.run(sockets=sockets)
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    """The MCP server: stdio (for an agent that starts it) or streamable HTTP (the service with /mcp).

    On stdio, the URLs in descriptors must reach something: unless a public URL is configured (another server of
    the same storage answers there), this process also serves the HTTP API, on ``--port`` / ``TRANSFER_PORT`` when
    given (a taken port is an error, before the MCP session starts) and on a free loopback port otherwise."""
    if args.transport == "streamable-http":
        return cmd_serve(args)
    # stdio: stdout belongs to the MCP protocol; everything else goes to stderr
    import logging

    from pydantic import ValidationError

    from transfer.hosts import run_mcp_stdio
    from transfer.settings import Settings

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for flag, var in _SERVICE_FLAGS:
        if getattr(args, flag, None) is not None:
            os.environ[var] = str(getattr(args, flag))
    try:
        settings = Settings()
    except ValidationError as exc:
        raise settings_refused(exc) from exc
    root = Path(args.root or settings.mcp_root or Path.cwd())
    sock = None
    base_url = settings.public_url
    if args.serve_http or not settings.public_url:
        sock = _listen(settings.host, settings.port if "port" in settings.model_fields_set else 0)
        base_url = settings.public_url or _http_base(settings.host, sock.getsockname()[1])
        print(f"transfer mcp: descriptors' URLs are served by this process at {base_url}", file=sys.stderr)

    return asyncio.run(run_mcp_stdio(settings, root=root, base_url=base_url, sock=sock))


async def cmd_storage_check(args: argparse.Namespace) -> int:
    """Probe an S3 endpoint the way the backend does at start-up and print what it saw."""
    from dataclasses import asdict

    from pydantic import ValidationError

    from storage.base import replica_hazards
    from storage.errors import StorageError
    from storage.s3 import S3Config, S3Storage
    from transfer.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        raise settings_refused(exc) from exc
    bucket = args.bucket or settings.s3_bucket
    if not bucket:
        raise CliError("invalid_request", "name a bucket to probe in: --bucket or TRANSFER_S3_BUCKET")
    endpoint = args.endpoint or settings.s3_endpoint_url
    storage = S3Storage(
        S3Config(
            bucket=bucket,
            endpoint_url=endpoint,
            region=args.region or settings.s3_region,
            addressing_style=args.addressing_style or settings.s3_addressing_style,
            prefix=settings.s3_prefix if args.prefix is None else args.prefix,
            max_attempts=2,
        )
    )
    try:
        await storage.start()
    except StorageError as exc:
        raise CliError("storage_unavailable", str(exc).splitlines()[0]) from exc
    finally:
        await storage.close()
    engine = storage.engine
    assert engine is not None
    hazards = replica_hazards(storage)
    if args.json:
        print(json.dumps({**asdict(engine), "replicas": not hazards, "hazards": hazards}))
        return 0
    rows = [("probe", "outcome", "what the backend does"), *engine.rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    print(f"S3 engine at {endpoint or 'AWS'}, bucket {bucket}")
    for probe, outcome, use in rows:
        print(f"  {probe:<{widths[0]}}  {outcome:<{widths[1]}}  {use}")
    verdict = "safe for several replicas" if not hazards else "ONE replica only: " + "; ".join(hazards)
    print(f"replicas: {verdict}")
    return 0


_OPS_FLAGS = (  # serve only
    ("metrics_port", "TRANSFER_METRICS_PORT"),
    ("log_format", "TRANSFER_LOG_FORMAT"),
    ("shutdown_grace", "TRANSFER_SHUTDOWN_GRACE"),
    ("shutdown_drain", "TRANSFER_SHUTDOWN_DRAIN"),
    ("single_replica", "TRANSFER_SINGLE_REPLICA"),
    ("tls_cert", "TRANSFER_TLS_CERT"),
    ("tls_key", "TRANSFER_TLS_KEY"),
    ("http2", "TRANSFER_HTTP2"),
)

_SERVICE_FLAGS = (
    ("host", "TRANSFER_HOST"),
    ("allow_open", "TRANSFER_ALLOW_OPEN_MODE"),
    ("port", "TRANSFER_PORT"),
    ("data_dir", "TRANSFER_DATA_DIR"),
    ("public_url", "TRANSFER_PUBLIC_URL"),
    ("storage", "TRANSFER_STORAGE"),
    ("s3_bucket", "TRANSFER_S3_BUCKET"),
    ("s3_endpoint_url", "TRANSFER_S3_ENDPOINT_URL"),
)


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


async def cmd_session_descriptor(args: argparse.Namespace) -> int:
    """Print a session's live streaming descriptor (JSON), for `transfer resolve --follow`."""
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        descriptor = await client.session_descriptor(args.session, ttl=args.ttl)
    print(json.dumps(descriptor.to_json(), ensure_ascii=False, indent=2))
    return 0


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


async def cmd_bench(args: argparse.Namespace) -> int:
    from transfer.bench import parse_size, render, run_bench

    try:
        sizes = [parse_size(x) for x in args.sizes.split(",") if x.strip()]
    except ValueError as exc:
        raise CliError("invalid_request", f"--sizes: {exc}") from exc
    own = Path(args.file) if args.file else None
    if own is not None and not own.is_file():
        raise CliError("invalid_request", f"{args.file}: no such file")
    report = await run_bench(
        args.server, sizes, own, args.connections, args.small, progress=not args.json, api_key=_api_key(args)
    )
    print(json.dumps(report, indent=2) if args.json else render(report))
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


def _service_options(p: argparse.ArgumentParser, server_default: str) -> None:
    """The options of every command that talks to a running service: where it is and the key to use."""
    p.add_argument("--server", default=server_default, help=f"service URL (TRANSFER_SERVER, default {DEFAULT_SERVER})")
    p.add_argument("--api-key", help="API key (default: TRANSFER_API_KEY)")
    _ca_cert_option(p)


def _ca_cert_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ca-cert",
        metavar="FILE",
        help="PEM file of the CA certificates to trust for https:// servers, instead of the default bundle (a private "
        "CA; as curl's --cacert). The environment's SSL_CERT_FILE does the same for every command",
    )


def _trust_ca(path: str) -> None:
    """Make ``path`` the CA bundle of every TLS connection this process opens (httpx, and ``ssl`` contexts made with
    the defaults, both read SSL_CERT_FILE), after checking that it holds certificates."""
    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise CliError(
            "invalid_usage", f"--ca-cert {path}: not a readable PEM file of CA certificates: {exc}", 2
        ) from exc
    os.environ["SSL_CERT_FILE"] = str(Path(path).resolve())


def _untrusted_certificate(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind a transport error, if that is what it was."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def _api_key(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_key", None) or os.environ.get("TRANSFER_API_KEY") or None


def _size(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


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


def cmd_keys_new(args: argparse.Namespace) -> int:
    """Print a new API key and the settings entry that admits it (only its SHA-256 is stored)."""
    from transfer.core.auth import Scope, new_token, token_hash

    try:
        scopes = sorted({Scope(s.strip()).value for s in args.scopes.split(",") if s.strip()})
    except ValueError as exc:
        raise CliError("invalid_request", "scopes are upload, read and admin") from exc
    token = new_token()
    entry = {args.name: {"sha256": token_hash(token), "scopes": scopes}}
    print(f"key (give it to the client; it is not stored anywhere): {token}")
    print(f"add to TRANSFER_API_KEYS: {json.dumps(entry)}")
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
    from transfer.bench import parse_size

    try:
        size = parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or e.g. 512M, 2G)") from None
    if size < 0:
        raise argparse.ArgumentTypeError("a cache size is 0 or more")
    return size


ALLOW_OPEN_HELP = (
    "serve without API keys on an address other than loopback, where every caller is admin "
    "(TRANSFER_ALLOW_OPEN_MODE; without keys the service otherwise refuses any but a loopback address)"
)


def build_parser() -> argparse.ArgumentParser:
    from transfer.service.backends import BACKENDS  # the registry of storage backends (light: no backend)

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


if __name__ == "__main__":
    sys.exit(main())
