"""What an operator sees of the HTTP service: Prometheus metrics, one JSON log line per request with its request id,
readiness, and the in-flight requests a graceful shutdown waits for (see :mod:`transfer.api.protocol.shutdown`).

One pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``, which buffers streaming responses through a
memory stream) wraps the whole application, outside the trust boundary, so that every answer (refusals included)
is counted, logged and carries ``X-Request-ID``. Its cost per request is a few dictionary look-ups, two counters,
a histogram observation for transfers and one log call (see the README for the measured overhead).

Secrets never reach a log line: the line names the route template (``/v1/files/{file_id}/content``), never the
path or the query (signed URLs carry ``sig=``; S3 presigned URLs ``X-Amz-Signature=``); the caller is the key's
name, never the key; and every formatter this module installs passes its output through :func:`redact` as well,
so that a signature or key inside some other message (an exception, a library's debug line) is masked too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from storage.errors import StorageError
from transfer import metrics
from transfer.api.protocol.zerocopy import EXTENSION as ZERO_COPY
from transfer.core.auth import Grant
from transfer.errors import ShuttingDown
from transfer.settings import Settings

access_log = logging.getLogger("transfer.access")
log = logging.getLogger("transfer.ops")

REQUEST_ID_HEADER = b"x-request-id"
# A client's request id is kept when it is short and made of characters safe in a header, a log line and a URL
# (UUIDs, ULIDs, W3C trace ids, hex); anything else is replaced by one of ours, never echoed.
_REQUEST_ID_RE = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# a request id names a request in logs, it guards nothing: drawn from a generator seeded by the OS, not one
# getrandom(2) per request (a system call that hands the GIL to the storage threads and waits to get it back)
_REQUEST_IDS = random.Random(os.urandom(32))
PROBE_KEY = "readyz/probe"  # the reserved object readiness rewrites (nothing else lives under readyz/)

# Masks for anything secret that might still be written by some other logger: signed-URL and presigned-URL query
# parameters, Authorization header values, and our key format (tk_ + 43 base64url characters).
_SECRET_PARAM_RE = re.compile(
    r"(?i)\b(sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|awsaccesskeyid)=[^&\s\"'<>]+"
)
_AUTH_RE = re.compile(
    r"(?i)(authorization[\"']?\s*[:=,]\s*[\"']?)(?:bearer\s+|basic\s+|aws4-hmac-sha256\s+)?[^\"'\s,]+"
)
_TOKEN_RE = re.compile(r"\btk_[A-Za-z0-9_-]{16,}")


def redact(text: str) -> str:
    """``text`` with signatures, credentials and API keys replaced by ``[redacted]``."""
    if "=" in text:
        text = _SECRET_PARAM_RE.sub(lambda m: f"{m.group(1)}=[redacted]", text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH_RE.sub(lambda m: f"{m.group(1)}[redacted]", text)
    if "tk_" in text:
        text = _TOKEN_RE.sub("tk_[redacted]", text)
    return text


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)  # built once, not per line


class _PerSecond:
    """A time stamp's whole-second part, formatted once per second (a log line per request would otherwise format
    the same second again for each: ~3 µs of a ~25 µs line)."""

    __slots__ = ("_format", "_last")

    def __init__(self, format_second: Callable[[float], str]) -> None:
        self._format = format_second
        self._last: tuple[int, str] = (-1, "")

    def __call__(self, created: float) -> str:
        second = int(created)
        last = self._last  # one read and one write of a tuple: safe without the handler's lock
        if last[0] != second:
            last = self._last = (second, self._format(created))
        return last[1]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (RFC 3339 UTC), level, logger, message, the request's fields when the record
    is an access record, and the exception text; all of it redacted."""

    def __init__(self) -> None:
        super().__init__()
        self._second = _PerSecond(lambda created: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)))

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self._second(record.created) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "request", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return redact(_ENCODER.encode(entry))


class TextFormatter(logging.Formatter):
    """``time level logger message key=value …``, redacted."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self._second = _PerSecond(lambda created: time.strftime(self.default_time_format, self.converter(created)))

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802  # logging's
        """logging's own format (``2026-06-30 23:59:59,123``, local time), its second formatted once."""
        if datefmt is not None or self.default_msec_format is None:
            return super().formatTime(record, datefmt)
        return self.default_msec_format % (self._second(record.created), record.msecs)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "request", None)
        if isinstance(fields, dict):
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items() if k != "message")
        return redact(line)


def configure_logging(fmt: Literal["json", "text"], level: str = "info") -> None:
    """Send every logger (ours, uvicorn's, libraries') to stderr in ``fmt``, one line per record."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # ``level`` is for the service and its server; libraries (botocore, mcp, …) say only warnings unless debugging
    root.setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)
    for name in ("transfer", "uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
        logging.getLogger(name).setLevel(level.upper())
    access_log.setLevel(logging.INFO)  # one line per request, whatever the root level
    # what no formatter here prints, and each record would otherwise look up (the logging HOWTO's "Optimization")
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # no caller lookup (a stack walk per record)


UPLOAD_KINDS = ("file", "session", "tus")
DOWNLOAD_KINDS = ("file", "session")


def _kind(method: str, path: str) -> tuple[str | None, str | None]:
    """(upload kind, download kind) of a request, from its method and path: cheap string tests, bounded values."""
    if method in ("POST", "PUT", "PATCH"):
        if path.startswith("/v1/files"):
            return (None, "file") if path.endswith("/content") else ("file", None)
        if path.startswith("/v1/sessions/") and "/chunks/" in path:
            return "session", None
        if path.startswith("/tus/") and method == "PATCH":
            return "tus", None
        return None, None
    if method in ("GET", "HEAD"):
        if path.startswith("/v1/files/") and path.endswith("/content"):
            return None, "file"
        if path.startswith("/v1/sessions/") and "/chunks/" in path:
            return None, "session"
    return None, None


@dataclass(eq=False)
class InFlight:
    """One request being served: the task waiting in its ``receive`` (if any), and whether shutdown stopped it."""

    upload: str | None  # its kind (file, session, tus), if it carries upload bytes
    download: str | None
    waiter: asyncio.Task[Any] | None = None
    stopped: bool = False

    def stop(self) -> None:
        """Make the request see its client leave: a pending ``receive`` returns ``http.disconnect`` now, a later
        one at once. Uploads then abort exactly as for a client that went away (nothing published)."""
        self.stopped = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.cancel("shutdown grace ended")


@dataclass
class Observability:
    """Per application: the readiness state and the requests in flight. Metrics themselves are per process
    (:mod:`transfer.metrics`)."""

    settings: Settings
    probe: Callable[[], Awaitable[None]] | None = None
    started: float = field(default_factory=time.monotonic)
    draining_since: float | None = None
    in_flight: set[InFlight] = field(default_factory=set)
    sweeps: dict[str, float] = field(default_factory=dict)  # sweep name -> its interval (seconds)
    _probe_at: float = -1e18
    _probe_error: str | None = None
    _probe_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    # --- draining and shutdown ---

    @property
    def draining(self) -> bool:
        return self.draining_since is not None

    def start_draining(self) -> None:
        """SIGTERM: readiness answers 503 from now on; responses ask their clients to close the connection."""
        if self.draining_since is None:
            self.draining_since = time.monotonic()
            metrics.draining.set(1)
            metrics.ready.set(0)
            log.warning("draining: /readyz answers 503; uploads in flight may finish")

    def stop_in_flight(self) -> int:
        """The shutdown grace ran out: stop every request still running (uploads abort cleanly); how many."""
        for handle in list(self.in_flight):
            handle.stop()
        return len(self.in_flight)

    def uploads_in_flight(self, kind: str | None = None) -> int:
        return sum(1 for h in self.in_flight if h.upload is not None and (kind is None or h.upload == kind))

    def downloads_in_flight(self, kind: str) -> int:
        return sum(1 for h in self.in_flight if h.download == kind)

    def export_gauges(self) -> None:
        """The in-progress gauges are read from the in-flight set when scraped, not kept up to date per request."""
        metrics.requests_in_progress.set_function(lambda: len(self.in_flight))
        for kind in UPLOAD_KINDS:
            metrics.uploads_in_progress.labels(kind).set_function(partial(self.uploads_in_flight, kind))
        for kind in DOWNLOAD_KINDS:
            metrics.downloads_in_progress.labels(kind).set_function(partial(self.downloads_in_flight, kind))

    # --- readiness ---

    def expect_sweep(self, name: str, interval: float) -> None:
        """Readiness fails when sweep ``name`` has not run for three of its intervals (it is stuck)."""
        self.sweeps[name] = interval

    async def readiness(self) -> tuple[bool, dict[str, str]]:
        """Whether this replica should get traffic, with the state of each check."""
        checks: dict[str, str] = {}
        ok = True
        if self.draining:
            checks["shutdown"] = "draining"
            ok = False
        error = await self._storage_probe()
        checks["storage"] = "ok" if error is None else error
        ok = ok and error is None
        now = time.monotonic()
        for name, interval in self.sweeps.items():
            last = max(metrics.last_sweep(name) or self.started, self.started)
            limit = 3 * interval + 1
            if now - last > limit:
                checks[f"sweep:{name}"] = f"no run for {now - last:.0f} s (expected every {interval:g} s)"
                ok = False
            else:
                checks[f"sweep:{name}"] = "ok"
        metrics.ready.set(1 if ok else 0)
        return ok, checks

    async def _storage_probe(self) -> str | None:
        """Write the probe object (storage reachable and writable), at most once per ``readiness_probe_interval``;
        concurrent callers share one probe. None when it succeeded, else a one-line reason."""
        if self.probe is None:
            return None
        interval = self.settings.readiness_probe_interval
        if time.monotonic() - self._probe_at < interval:
            return self._probe_error
        async with self._probe_lock:
            if time.monotonic() - self._probe_at < interval:  # another caller probed while we waited
                return self._probe_error
            try:
                async with asyncio.timeout(self.settings.readiness_probe_timeout):
                    await self.probe()
                self._probe_error = None
            except TimeoutError:
                self._probe_error = f"storage did not answer within {self.settings.readiness_probe_timeout:g} s"
            except (StorageError, OSError) as exc:
                self._probe_error = f"storage not writable: {type(exc).__name__}"
            except Exception as exc:  # a translated error or a backend's own: not ready, and say which
                self._probe_error = f"storage probe failed: {type(exc).__name__}"
            self._probe_at = time.monotonic()
            return self._probe_error


def storage_probe(storage: Any) -> Callable[[], Awaitable[None]]:
    """A write of a few bytes to the reserved probe key, not flushed to disk (it proves the backend takes writes)."""

    async def probe() -> None:
        async with storage.create(PROBE_KEY, size_hint=2, durable=False) as writer:
            await writer.write(b"ok")
            await writer.commit({})

    return probe


# --- the middleware ---


@dataclass(frozen=True, slots=True)
class _Series:
    requests: Any
    received: Any
    sent: Any


_SERIES: dict[tuple[str, str, int], _Series] = {}


def _series(method: str, route: str, status: int) -> _Series:
    """The label children of one (method, route, status), looked up once (``labels()`` costs microseconds)."""
    key = (method, route, status)
    found = _SERIES.get(key)
    if found is None:
        if len(_SERIES) > 10_000:  # bounded whatever happens: methods are free text
            _SERIES.clear()
        found = _SERIES[key] = _Series(
            metrics.requests.labels(method, route, str(status)),
            metrics.received_bytes.labels(route),
            metrics.sent_bytes.labels(route),
        )
    return found


_DURATIONS: dict[tuple[str | None, str | None, bool], Any] = {}


def _duration(upload_kind: str | None, download_kind: str | None, ok: bool) -> Any:
    """The duration histogram child of an upload or a download kind and its outcome, looked up once (the kinds
    are a fixed few)."""
    key = (upload_kind, download_kind, ok)
    found = _DURATIONS.get(key)
    if found is None:
        outcome = "ok" if ok else "error"
        if upload_kind is not None:
            found = metrics.upload_duration.labels(upload_kind, outcome)
        else:
            found = metrics.download_duration.labels(download_kind, outcome)
        _DURATIONS[key] = found
    return found


class ObservabilityMiddleware:
    """Request id, metrics, the access log line and the in-flight set, for every HTTP request (pure ASGI)."""

    def __init__(self, app: ASGIApp, obs: Observability) -> None:
        self.app = app
        self.obs = obs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        method: str = scope["method"]
        upload_kind, download_kind = _kind(method, scope["path"])
        request_id = None
        for name, value in scope["headers"]:
            if name == REQUEST_ID_HEADER:
                if _REQUEST_ID_RE.fullmatch(value):
                    request_id = value
                break
        if request_id is None:
            request_id = b"%024x" % _REQUEST_IDS.getrandbits(96)
        obs = self.obs
        handle = InFlight(upload_kind, download_kind)
        obs.in_flight.add(handle)
        received = sent = 0
        status = 0
        replaced = False  # shutdown stopped the request: our 503 went out instead of the application's answer

        async def counted_receive() -> Message:
            nonlocal received
            if handle.stopped:
                return {"type": "http.disconnect"}
            task = handle.waiter = asyncio.current_task()
            try:
                message = await receive()
            except asyncio.CancelledError:
                if not handle.stopped or task is None:
                    raise
                task.uncancel()  # our own cancellation (InFlight.stop): the client is gone for the application
                return {"type": "http.disconnect"}
            finally:
                handle.waiter = None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def counted_send(message: Message) -> None:
            nonlocal sent, status, replaced
            if replaced:
                return
            kind = message["type"]
            if kind == "http.response.start":
                if handle.stopped and message["status"] >= 400:
                    # the application's error for a client it was told had left: say why instead (a success that
                    # raced the stop, e.g. an upload already published, goes out as it is)
                    replaced = True
                    error = ShuttingDown("the server is shutting down and its grace period ended; retry")
                    body = json.dumps(error.to_payload(), separators=(",", ":")).encode("ascii")
                    status = error.status
                    sent += len(body)
                    headers = [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode("ascii")),
                        (b"connection", b"close"),
                        (b"retry-after", b"1"),
                        (REQUEST_ID_HEADER, request_id),
                    ]
                    await send({"type": "http.response.start", "status": status, "headers": headers})
                    await send({"type": "http.response.body", "body": body, "more_body": False})
                    return
                status = message["status"]
                headers = list(message.get("headers", ()))
                headers.append((REQUEST_ID_HEADER, request_id))
                if obs.draining_since is not None:
                    headers.append((b"connection", b"close"))  # reconnect elsewhere (uvicorn honours it)
                message = {**message, "headers": headers}
            elif kind == "http.response.body":
                sent += len(message.get("body", b""))
            elif kind == ZERO_COPY:  # the bytes go out by sendfile: the message says how many
                sent += int(message.get("count") or 0)
            await send(message)

        failed = False
        try:
            await self.app(scope, counted_receive, counted_send)
        except BaseException:
            failed = True
            raise
        finally:
            obs.in_flight.discard(handle)
            if status == 0:
                status = 500 if failed else 499  # no answer: an error, or a client gone before one was sent
            route_obj = scope.get("route")
            route = getattr(route_obj, "path", None) or ("unmatched" if status == 404 else "other")
            duration = time.perf_counter() - start
            series = _series(method, route, status)
            series.requests.inc()
            if received:
                series.received.inc(received)
            if sent:
                series.sent.inc(sent)
            if route_obj is not None and (upload_kind is not None or download_kind is not None):
                _duration(upload_kind, download_kind, status < 400).observe(duration)
            if access_log.isEnabledFor(logging.INFO):
                grant = scope.get("state", {}).get("grant")
                key = grant.key.name if isinstance(grant, Grant) and grant.key is not None else None
                access_log.info(
                    "%s %s %d",
                    method,
                    route,
                    status,
                    extra={
                        "request": {
                            "request_id": request_id.decode("ascii"),
                            "method": method,
                            "route": route,
                            "status": status,
                            "key": key,
                            "bytes_in": received,
                            "bytes_out": sent,
                            "duration_ms": round(duration * 1000, 3),
                        }
                    },
                )


def install(app: FastAPI, settings: Settings, storage: Any) -> Observability:
    """Wrap ``app`` in the observability middleware (call last in ``rest_app``: the middleware must be outermost)
    and return its state; the application includes :func:`transfer.api.health.observability_router` of that state
    for ``/metrics`` and ``/readyz``."""
    obs = Observability(settings, probe=storage_probe(storage))
    obs.export_gauges()
    app.state.observability = obs
    app.add_middleware(ObservabilityMiddleware, obs=obs)
    return obs
