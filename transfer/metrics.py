"""The service's Prometheus metrics (``prometheus-client``), and the small API the rest of the service records with.

Metrics are per process, in the library's default registry (which also carries its ``process_*`` and
``python_*`` collectors). ``transfer serve`` runs one uvicorn process (there is no ``--workers``): run one process
per replica (container, pod) and let Prometheus scrape each; the dashboard sums over instances. The library's
multiprocess mode is therefore not used.

Labels are bounded sets: route templates (never raw paths), status codes, storage operation names, error class
names, sweep names, signed-URL rejection reasons. Nothing a client chooses freely becomes a label value.
"""

from __future__ import annotations

import time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

# an upload or download lasts from milliseconds (4 KiB) to hours (64 GiB on a slow link)
TRANSFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600)

registry: CollectorRegistry = REGISTRY

requests = Counter(
    "transfer_http_requests",
    "HTTP requests answered, by method, route template and status",
    ["method", "route", "status"],
)
received_bytes = Counter("transfer_http_received_bytes", "request body bytes received, by route template", ["route"])
sent_bytes = Counter("transfer_http_sent_bytes", "response body bytes sent, by route template", ["route"])
upload_duration = Histogram(
    "transfer_upload_duration_seconds",
    "time from request start to response end of uploads (file, session chunk, tus), by kind and outcome",
    ["kind", "outcome"],
    buckets=TRANSFER_BUCKETS,
)
download_duration = Histogram(
    "transfer_download_duration_seconds",
    "time from request start to the last byte sent of downloads (signed URL, session chunk), by kind and outcome",
    ["kind", "outcome"],
    buckets=TRANSFER_BUCKETS,
)
uploads_in_progress = Gauge(
    "transfer_uploads_in_progress", "requests carrying upload bytes now, by kind (file, session, tus)", ["kind"]
)
downloads_in_progress = Gauge("transfer_downloads_in_progress", "content downloads being sent now", ["kind"])
requests_in_progress = Gauge("transfer_http_requests_in_progress", "HTTP requests being served now")
storage_operations = Counter(
    "transfer_storage_operations", "storage backend operations started, by operation", ["operation"]
)
storage_errors = Counter(
    "transfer_storage_errors",
    "storage backend operations that failed, by operation and error kind",
    ["operation", "kind"],
)
s3_retries = Counter(
    "transfer_s3_retries", "S3 requests retried by botocore (after a reset, 5xx, timeout)", ["operation"]
)
sweeps = Counter("transfer_sweeps", "background sweeps run, by sweep and outcome (ok, failed)", ["sweep", "outcome"])
swept_objects = Counter("transfer_swept_objects", "objects (sessions, uploads, files) removed by sweeps", ["sweep"])
sweep_last_success = Gauge(
    "transfer_sweep_last_success_timestamp_seconds",
    "Unix time of the last sweep that finished without error",
    ["sweep"],
)
record_races = Counter(
    "transfer_record_races",
    "compare-and-set updates of a record through the record store lost to another writer (outcome lost: every "
    "lost race, a stale cached version included; busy: those after which the retry policy ran out and the request "
    "was answered 503 record_busy), by record kind (the key's first path segment)",
    ["kind", "outcome"],
)
signed_url_rejections = Counter("transfer_signed_url_rejections", "signed download URLs refused, by reason", ["reason"])
ready = Gauge("transfer_ready", "1 while /readyz answers 200 (last evaluation), else 0")
draining = Gauge("transfer_draining", "1 from SIGTERM until the process exits")
# the connection layer (transfer.api.protocol; docs/SECURITY.md "Connection limits")
connections_open = Gauge(
    "transfer_connections_open", "client connections held now (HTTP/1.1, HTTP/2, WebSocket; counted at accept)"
)
connections_refused = Counter(
    "transfer_connections_refused",
    "connections refused at accept, by the limit reached (process: http_max_connections; client: "
    "http_max_connections_per_client)",
    ["limit"],
)
h2_abuse = Counter(
    "transfer_h2_abuse",
    "HTTP/2 connections ended with GOAWAY(ENHANCE_YOUR_CALM), by the bound broken (header_block, header_list, "
    "reset, settings, ping, priority, empty_data)",
    ["kind"],
)
h2_refused_streams = Counter(
    "transfer_h2_refused_streams", "HTTP/2 streams refused (REFUSED_STREAM) past the concurrent-stream limit"
)
send_timeouts = Counter(
    "transfer_send_timeouts",
    "responses ended because their reader took no bytes for http_send_timeout, by protocol (http1, h2, h2_connection)",
    ["protocol"],
)


def sweep_ran(sweep: str, removed: int, *, ok: bool = True) -> None:
    """Record one run of a background sweep: how many objects it removed, and whether it finished cleanly. Every
    sweep calls this once per run (the readiness check reads :func:`last_sweep`)."""
    if removed:
        swept_objects.labels(sweep).inc(removed)
    sweeps.labels(sweep, "ok" if ok else "failed").inc()
    if ok:
        sweep_last_success.labels(sweep).set(time.time())
    _last_sweep[sweep] = time.monotonic()


def last_sweep(sweep: str) -> float | None:
    """``time.monotonic()`` of the sweep's last run (ok or failed) in this process, None before the first."""
    return _last_sweep.get(sweep)


_last_sweep: dict[str, float] = {}


def signed_url_rejected(reason: str) -> None:
    """A signed URL was refused: ``reason`` is one of the bounded set of :class:`transfer.errors.SignatureInvalid`
    reasons, or ``expired``."""
    signed_url_rejections.labels(reason).inc()


def record_race(key: str, *, busy: bool) -> None:
    """A compare-and-set write of record ``key`` lost its race (``busy``: and the retry policy ran out). The label
    is the key's first segment (``usage``, ``uploads``, ...): record keys are the service's own, a bounded set."""
    kind = key.split("/", 1)[0] if "/" in key else "other"
    record_races.labels(kind, "busy" if busy else "lost").inc()


def s3_retried(operation: str) -> None:
    s3_retries.labels(operation).inc()


# hooks and events (transfer.service.events): labels are the service's own event types, hook outcomes and delivery
# outcomes, a bounded set
hook_calls = Counter(
    "transfer_hook_calls", "pre-upload hook calls, by outcome (allow, deny, error, timeout)", ["outcome"]
)
hook_duration = Histogram(
    "transfer_hook_duration_seconds",
    "time the pre-upload hook took to answer",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
events_recorded = Counter("transfer_events_recorded", "events written to the outbox, by type", ["type"])
events_dropped = Counter(
    "transfer_events_dropped",
    "events not recorded because the outbox held events_outbox_limit already, by type",
    ["type"],
)
event_deliveries = Counter(
    "transfer_event_deliveries",
    "webhook delivery attempts, by outcome (delivered, failed, dead: retried past events_max_age)",
    ["outcome"],
)
events_waiting = Gauge("transfer_events_waiting", "events in the outbox at the last look (every replica's)")
