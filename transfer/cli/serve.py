"""``transfer serve`` and ``transfer mcp``: run the service (HTTP, or MCP on stdio / streamable HTTP) from flags and
``TRANSFER_*`` settings."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import os
import secrets
import signal
import socket
import ssl
import sys
from pathlib import Path
from typing import Any

from transfer import __version__
from transfer.cli.console import CliError, _http_base, settings_refused
from transfer.errors import TransferError

# PERF-NOTES: uvloop hands Python a fresh ~256 KiB bytes per socket read; with glibc's default thresholds a 1 GiB
# upload page-faults ~217,000 times and throughput halves. These must be set before the interpreter starts.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4194304", "MALLOC_TRIM_THRESHOLD_": "268435456"}


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
    from transfer.core.ids import draw_ids_into
    from transfer.errors import SigningKeysRequired
    from transfer.hosts import create_app
    from transfer.service.backends import make_storage, require_signing_keys_kept_apart, storage_location
    from transfer.settings import Settings

    try:
        settings = Settings()
        configure_logging(settings.log_format, args.log_level)
        require_signing_keys_kept_apart(settings)
        storage = make_storage(settings)
        asyncio.run(storage.start())  # fail here, in one line, rather than in uvicorn's lifespan with a traceback
        require_replica_safe(storage, settings.single_replica)
        app = create_app(settings, storage)
        # this replica's uploads count in a usage shard of their own (a random one of each key's shards): the
        # versions of the records it writes stay the ones it knows while other replicas write theirs
        draw_ids_into(settings.usage_shards, secrets.randbelow(settings.usage_shards))
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
    where = storage_location(settings)
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


ALLOW_OPEN_HELP = (
    "serve without API keys on an address other than loopback, where every caller is admin "
    "(TRANSFER_ALLOW_OPEN_MODE; without keys the service otherwise refuses any but a loopback address)"
)
