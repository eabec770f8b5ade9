"""Configuration from flags and environment (``TRANSFER_*``), validated once at start-up."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from storage.registry import BACKENDS
from transfer.core.auth import TOKEN_PREFIX, parse_keys
from transfer.core.model.content import INLINE_THRESHOLD, DownloadMethod
from transfer.core.secretcheck import (
    BUCKET_SECRET_MIN,
    SIGNING_KEY_MIN,
    is_loopback,
    placeholder_problem,
    secret_problem,
)

MAX_URL_TTL = 7 * 24 * 3600  # the longest a signed URL may live (S3's presign limit too)
PLACEHOLDER = "placeholder_secret"  # the error type of a refused secret (`transfer serve` prints it as the code)


class Settings(BaseSettings):
    """Service settings. Every field can be set as ``TRANSFER_<NAME>`` in the environment."""

    # hide_input_in_errors: a refused secret is never repeated in the error (nor in the log that prints it)
    model_config = SettingsConfigDict(env_prefix="TRANSFER_", extra="ignore", hide_input_in_errors=True)

    storage: str = Field(
        default="local",
        description="storage backend: a name registered in storage.registry.BACKENDS (local: a data "
        "directory; s3; null: keeps nothing large, for benchmarks only)",
    )
    data_dir: Path = Field(default=Path("transfer-data"), description="local storage directory")
    local_sync: Literal["syncfs", "fsync", "off"] = Field(
        default="syncfs",
        description="how local storage makes small objects durable together: syncfs (two syncfs calls per group "
        "commit; flushes the whole filesystem, best on a volume of its own), fsync (each file and folder, all at "
        "once; better on a filesystem other busy writers share) or off (each object on its own)",
    )
    web_assets_dir: Path | None = Field(
        default=None,
        description="node_modules with the web page's and /docs' libraries (default: the one `make install` fills)",
    )
    s3_bucket: str | None = Field(default=None, description="bucket (storage=s3)")
    s3_endpoint_url: str | None = Field(default=None, description="default: AWS_ENDPOINT_URL, else AWS")
    s3_region: str | None = Field(default=None, description="default: AWS_REGION / AWS_DEFAULT_REGION")
    s3_addressing_style: Literal["auto", "path", "virtual"] = Field(default="auto", description="path for MinIO")
    s3_prefix: str = Field(default="", description="key prefix inside the bucket")
    s3_part_size: int = Field(default=8 << 20, ge=5 << 20, le=5 << 30, description="preferred multipart part size")
    # 10 parts of one upload in flight: boto3's upload_file runs 10 threads of 8 MiB parts (4 lost to it, 0.77x)
    s3_part_buffers: int = Field(default=10, ge=1, le=64, description="parts in flight per upload")
    # 64 MiB: eight 8 MiB parts in flight, boto3-parity throughput for one upload; 96 MiB kept peak RSS over 200 MB
    s3_buffer_budget: int = Field(
        default=64 << 20,
        ge=5 << 20,
        description="bytes of S3 part buffers for all uploads of the process together (concurrent uploads share "
        "them and wait for them: memory does not grow with the number of uploads)",
    )
    s3_max_concurrency: int = Field(default=16, ge=1, le=256, description="threads/connections for boto3")
    s3_atomic_if_absent: bool = Field(
        default=True,
        description="false: never rely on If-None-Match; true: rely on it if the start-up probes saw it work",
    )
    s3_atomic_if_match: bool = Field(
        default=True, description="false: never rely on If-Match; true: rely on it if the start-up probes saw it work"
    )
    single_replica: bool = Field(
        default=False,
        description="this process is the only one on its storage: required to serve from a backend without atomic "
        "compare-and-set (Swift's s3api), which would let replicas overwrite each other's records",
    )
    s3_max_attempts: int = Field(default=5, ge=1, le=20, description="attempts per S3 call (resets, 503, timeouts)")
    s3_connect_timeout: float = Field(default=5.0, gt=0, description="seconds to connect to the S3 endpoint")
    s3_read_timeout: float = Field(default=20.0, gt=0, description="seconds without a byte from S3 before a retry")
    s3_call_budget: float = Field(
        default=30.0,
        gt=0,
        description="seconds one S3 call may take with its retries: a gateway that never answers is a 503 "
        "storage_unavailable by then (must hold one attempt: s3_connect_timeout + s3_read_timeout)",
    )
    s3_abandoned_upload_age: float = Field(
        default=24 * 3600,
        gt=0,
        description="seconds after which an unfinished multipart upload is aborted as abandoned",
    )
    http_keep_alive: int = Field(default=75, gt=0, description="seconds an idle keep-alive connection stays open")
    http_header_timeout: float = Field(
        default=30.0, gt=0, description="seconds to send a request's header fields; then 408 and the connection closes"
    )
    http_body_grace: float = Field(
        default=30.0, ge=0, description="seconds a request body may take before http_body_min_rate applies"
    )
    http_body_min_rate: float = Field(
        default=8192,
        ge=0,
        description="bytes/s a request body must average (over time spent waiting for it, after the grace); "
        "slower: 408 and the connection closes. 0: no minimum",
    )
    # TLS and HTTP/2 (transfer.api.protocol.http2): one listener speaks HTTP/1.1 and HTTP/2 (ALPN h2 over TLS, prior
    # knowledge in cleartext)
    tls_cert: Path | None = Field(
        default=None, description="PEM certificate chain: the listener speaks TLS (reloaded on SIGHUP or file change)"
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert")
    http2: bool = Field(
        default=True, description="HTTP/2 on the listener (h2 by ALPN over TLS, h2c by prior knowledge)"
    )
    h2_max_streams: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="concurrent HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS)",
    )
    h2_stream_window: int = Field(
        default=1 << 20,
        ge=65535,
        le=16 << 20,
        description="bytes of a request body one HTTP/2 stream may have in flight before the application reads them "
        "(its flow-control window)",
    )
    h2_connection_window: int = Field(
        default=16 << 20,
        ge=65535,
        le=2**31 - 1,
        description="bytes of request bodies one HTTP/2 connection may have in flight, all streams together",
    )
    # connection-layer bounds (transfer.api.protocol; docs/SECURITY.md "Connection limits")
    http_send_timeout: float = Field(
        default=60.0,
        gt=0,
        description="seconds a response may wait for its reader to take more bytes (nginx's send_timeout): then "
        "an HTTP/1.1 connection is closed and an HTTP/2 stream reset (CANCEL), and the file it was sending closed",
    )
    http_max_connections: int = Field(
        default=1000,
        ge=1,
        description="client connections (HTTP/1.1, HTTP/2, WebSocket) this process holds at once; one more is "
        "answered 503 too_many_connections (HTTP/2: on its first stream, then GOAWAY) and closed",
    )
    http_max_connections_per_client: int = Field(
        default=32,
        ge=0,
        description="connections one client address may hold at once (0: no limit; the address of a proxy in "
        "trusted_proxies is not counted: its connections carry many clients)",
    )
    trusted_proxies: list[str] = Field(
        default_factory=lambda: ["127.0.0.0/8", "::1/128"],
        description="JSON list of the networks (CIDRs) of proxies in front of this service: connections from them "
        "are exempt from http_max_connections_per_client (only http_max_connections holds them)",
    )
    h2_send_buffer: int = Field(
        default=16 << 20,
        ge=1 << 20,
        description="bytes of responses one HTTP/2 connection may hold while its client's flow-control window is "
        "closed; further responses wait to start (and are reset after http_send_timeout)",
    )
    h2_reset_allowance: int = Field(
        default=100,
        ge=10,
        description="streams one HTTP/2 connection may reset (RST_STREAM from the client, or refused past "
        "h2_max_streams) beyond the responses it let complete; more: GOAWAY(ENHANCE_YOUR_CALM) and closed "
        "(rapid reset, CVE-2023-44487)",
    )
    h2_abuse_penalty: float = Field(
        default=10.0,
        ge=0,
        description="seconds a client address whose HTTP/2 connection was ended with GOAWAY(ENHANCE_YOUR_CALM) "
        "is refused new connections (closed at once; addresses in trusted_proxies never are; 0: no penalty)",
    )
    h2_max_control_frames_per_second: int = Field(
        default=200,
        ge=10,
        description="SETTINGS, PING, PRIORITY and empty DATA frames (each kind counted on its own) one HTTP/2 "
        "connection may send per second, with a burst of as many; more: GOAWAY(ENHANCE_YOUR_CALM) and closed",
    )
    host: str = Field(
        default="127.0.0.1",
        description="address to listen on (0.0.0.0: every interface; anything but loopback needs API keys)",
    )
    port: int = Field(default=8080, ge=0, le=65535, description="port to listen on (0: a free port)")
    allow_open_mode: bool = Field(
        default=False,
        description="serve without API keys on an address other than loopback (every caller is then admin: "
        "development only); without it, no TRANSFER_API_KEYS and a non-loopback TRANSFER_HOST refuse to start",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="a second port that serves only GET /metrics, without a key (for Prometheus: keep it off the "
        "public network); none: /metrics only on the main port, with an admin key when keys are configured",
    )
    metrics_host: str | None = Field(default=None, description="bind address of TRANSFER_METRICS_PORT (default: host)")
    public_url: str | None = Field(
        default=None,
        description="base URL put in descriptors; default: the request's Host, if TRANSFER_ALLOWED_HOSTS allows it",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="JSON list of Host names (no port) requests may name, besides loopback names, the bound address "
        'and the public URL host; others are 400 host_not_allowed. ["*"]: any (only behind a proxy that checks Host)',
    )
    signing_keys: dict[str, str] | None = Field(
        default=None,
        description='JSON {"key id": "secret"}, each secret at least 16 bytes (32 random bytes, e.g. `openssl rand '
        "-base64 32`); required on storage other than local (a key kept in a bucket is readable with the bucket's "
        "credentials); default on local storage: one generated once and kept in the data directory",
    )
    api_keys: dict[str, dict[str, Any]] | None = Field(
        default=None,
        description='JSON {"name": {"sha256": "<hex of the key>", "scopes": ["upload", "read", "admin"]}}; '
        "none: the service runs open (development only). `transfer keys new` makes one.",
    )
    key_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="seconds a replica reuses what it read of a run-time key record (`transfer keys`): a key revoked "
        "or rotated on one replica is refused on every other within this bound",
    )
    oauth_issuers: list[dict[str, Any]] | None = Field(
        default=None,
        description="JSON list of trusted OAuth 2.1 authorization servers whose access tokens are accepted beside API "
        'keys: [{"issuer": "https://id.example.com/realms/x", "scopes": {"upload": "files:write"}, ...}] (every '
        "field: docs/IDENTITY.md). Tokens must name this service's resource identifier in aud (RFC 8707)",
    )
    oauth_resource: str | None = Field(
        default=None,
        description="this service's resource identifier (RFC 8707, RFC 9728): the aud its access tokens carry and "
        "the resource of /.well-known/oauth-protected-resource; default: TRANSFER_PUBLIC_URL",
    )
    oauth_leeway: int = Field(default=30, ge=0, le=300, description="seconds of clock skew allowed on exp, nbf, iat")
    oauth_token_cache_seconds: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="seconds a verified token (or an introspection answer) is reused without checking it again, never "
        "past its exp: the bound on an opaque token's revocation at its issuer",
    )
    oauth_jwks_max_age: float = Field(
        default=3600.0,
        ge=60,
        description="seconds an issuer's signing keys (JWKS) are kept until fetched anew",
    )
    oauth_jwks_min_interval: float = Field(
        default=10.0,
        ge=0,
        description="least seconds between two fetches of one issuer's JWKS prompted by an unknown key id (a flood of "
        "forged key ids costs at most one fetch per interval)",
    )
    oauth_http_timeout: float = Field(
        default=5.0, gt=0, le=60, description="seconds for one call to an issuer (discovery, JWKS, introspection)"
    )
    signing_key_id: str | None = Field(default=None, description="key id that signs new URLs (default: the first)")
    url_ttl: int = Field(default=3600, gt=0, le=MAX_URL_TTL, description="seconds a signed URL lives")
    default_download_method: DownloadMethod = Field(
        default=DownloadMethod.GET,
        description="download_method of descriptors when the upload names none: GET, POST (a signed POST) or "
        "signed_url (an S3 presigned GET on S3, a signed GET on local storage)",
    )
    inline_threshold: int = Field(
        default=INLINE_THRESHOLD,
        ge=0,
        le=16 * INLINE_THRESHOLD,
        description="largest content returned inline (base64 in the descriptor's data); larger content is url mode",
    )
    max_upload_size: int = Field(default=64 << 30, gt=0, description="largest original (decoded) size accepted")
    max_decode_ratio: float = Field(
        default=10_000.0,
        gt=1,
        description="decoded/encoded size ratio past which a Content-Encoding body is refused as a decompression "
        "bomb (413 decoded_size_limit; checked after the first 16 MiB decoded)",
    )
    dedup: bool = Field(
        default=True,
        description="an upload declaring content (SHA-256 and size) its key already stores shares those bytes "
        "and completes without its body (never across keys)",
    )
    dedup_min_size: int = Field(
        default=8 << 20, ge=1, description="smallest file whose bytes are shared (smaller: always stored whole)"
    )
    dedup_groups: dict[str, list[str]] = Field(
        default_factory=dict,
        description='JSON {"group": ["key name", ...]}: the keys of one group share stored content as one key does '
        "(an upload by one completes without its body when another stored it); a key is in one group at most, and "
        "keys outside a group never learn what it stores",
    )
    max_ranges: int = Field(default=64, ge=1, description="ranges per request after coalescing; more: 200 whole")
    buffer_size: int = Field(default=1 << 20, ge=16 << 10, le=64 << 20, description="bytes per read/write call")
    gzip_level: int = Field(default=1, ge=0, le=3, description="python-isal level for gzip/deflate")
    zstd_level: int = Field(default=3, ge=1, le=19, description="zstd level for content stored or served as zstd")
    compress_on_the_fly: bool = Field(
        default=True,
        description="compress identity text and JSON objects for full-body downloads when Accept-Encoding allows "
        "(zstd or gzip, with their own ETag)",
    )
    serve_active_types_inline: bool = Field(
        default=False,
        description="serve HTML/SVG/XML inline instead of as attachments (only on a domain of its own)",
    )
    max_description_length: int = Field(
        default=1024, ge=0, description="longest description an upload may carry (longer: 400 invalid_request)"
    )
    session_chunk_size: int = Field(default=8 << 20, ge=64 << 10, description="default chunk size of sessions")
    session_max_chunk_size: int = Field(
        default=512 << 20, ge=64 << 10, description="largest chunk size a session may ask for"
    )
    session_ttl: int = Field(default=24 * 3600, gt=0, description="seconds an unfinished session lives")
    session_max_ttl: int = Field(
        default=7 * 24 * 3600, gt=0, description="the longest lifetime a session may ask for (seconds)"
    )
    session_retention: int = Field(default=24 * 3600, ge=0, description="seconds ended sessions stay visible")
    session_gc_interval: float = Field(default=60.0, gt=0, description="seconds between expiry sweeps")
    # IETF resumable uploads (/v1/uploads): the Upload-Limit members beside max-size (max_upload_size) and max-age
    resumable_min_size: int = Field(
        default=0,
        ge=0,
        description="smallest upload offered resumability at /v1/uploads (Upload-Limit min-size): a smaller one is "
        "taken whole in one request without an upload resource, or refused when it is not complete",
    )
    resumable_max_append_size: int | None = Field(
        default=None,
        gt=0,
        description="largest content of one creation or append request at /v1/uploads (Upload-Limit "
        "max-append-size; more: 413 append_too_large); none: bounded by max_upload_size only",
    )
    resumable_min_append_size: int | None = Field(
        default=None,
        gt=0,
        description="smallest content of a creation or append request at /v1/uploads that does not complete the "
        "upload (Upload-Limit min-append-size; less: 400 append_too_small)",
    )
    # file lifetimes (expires_in) and per-key byte quotas (a key's max_bytes, default_file_ttl, max_file_ttl)
    default_file_ttl: int | None = Field(
        default=None, gt=0, description="seconds a file lives when neither the upload nor its key says (none: kept)"
    )
    max_file_ttl: int | None = Field(
        default=None, gt=0, description="the longest lifetime an upload may ask for (more: 400 expires_in_too_long)"
    )
    quota_reservation_ttl: int = Field(
        default=6 * 3600,
        gt=0,
        description="seconds a plain upload's declared size stays reserved against its key's quota (a process that "
        "died mid-upload leaves it no longer); sessions and tus uploads keep theirs until they end or expire",
    )
    cors_allow_origins: list[str] = Field(
        default_factory=list, description='JSON list of origins allowed to call the API from a browser, e.g. ["*"]'
    )
    live_read_timeout: float = Field(default=30.0, ge=0, description="longest wait for a chunk not yet uploaded")
    usage_shards: int = Field(
        default=8,
        ge=1,
        le=256,
        description="usage records per API key: what one upload counts lives in the one its id falls in, so uploads "
        "of one key on several replicas rarely write the same record; its quota is allotted to them and stays exact "
        "(the same number on every replica; a key keeps the number its usage began with)",
    )
    max_open_sessions_per_key: int = Field(
        default=100, ge=1, description="chunked and tus sessions one API key may have open at once"
    )
    max_open_direct_plans_per_key: int = Field(
        default=100, ge=1, description="direct upload plans one API key may have open at once (429 too_many_plans)"
    )
    max_open_authorizations_per_key: int = Field(
        default=100,
        ge=1,
        description="upload authorisations (MCP authorize_upload) one API key may have open at once "
        "(429 too_many_authorizations)",
    )
    max_header_size: int = Field(default=64 << 10, ge=4 << 10, description="bytes of request header fields (431)")
    max_bundle_items: int = Field(default=1000, ge=1, le=100_000, description="items in one bundle")
    max_json_body: int = Field(
        default=16 << 20, ge=1 << 10, description="largest JSON request body (descriptors, bundles, JSON-RPC)"
    )
    # server-side fetches (imports, TP mount of a foreign url): SSRF-guarded
    fetch_allow_networks: list[str] = Field(
        default_factory=list,
        description='JSON list of CIDRs fetched from even though private/loopback, e.g. ["10.1.0.0/16"]',
    )
    fetch_timeout: float = Field(default=30.0, gt=0, description="seconds without progress before a fetch fails")
    fetch_max_redirects: int = Field(
        default=5, ge=0, le=20, description="redirects a server-side fetch follows, each checked again"
    )
    # progress jobs and the AIFlowy SSE stream
    job_retention: float = Field(default=600.0, gt=0, description="seconds a finished job stays readable")
    max_jobs: int = Field(default=10_000, ge=1, description="jobs kept (running jobs are never evicted)")
    job_wait_ttl: float = Field(
        default=60.0, gt=0, description="seconds a job stream opened before its upload waits for the upload to start"
    )
    max_waiting_jobs: int = Field(
        default=1000, ge=1, description="job streams waiting for their upload to start at once (more: 429)"
    )
    sse_heartbeat: float = Field(default=15.0, gt=0, description="seconds between SSE keep-alive comments")
    # TP bindings
    tp_identity: str = Field(default="transfer-service", description="this service's sender in TP envelopes")
    tp_max_envelope_size: int = Field(default=1 << 20, ge=1 << 10, description="largest TP envelope / WS frame")
    tp_ping_interval: float = Field(default=30.0, gt=0, description="WebSocket ping interval (TP: 30 s)")
    tp_pong_timeout: float = Field(default=10.0, gt=0, description="time allowed for each pong (TP: 10 s)")
    tp_max_subscriptions: int = Field(
        default=1000, ge=1, description="resource ids one WebSocket connection may follow (more: closed with 1008)"
    )
    tp_max_subscriptions_per_key: int = Field(
        default=10_000,
        ge=1,
        description="TP WebSocket subscriptions (topics: two per resource id followed, one per sender inbox) one API "
        "key may hold over all its connections (more: the connection is closed with 1008 too_many_subscriptions)",
    )
    tp_max_subscriptions_total: int = Field(
        default=100_000, ge=1, description="TP WebSocket subscriptions (topics) this process holds, all keys together"
    )
    tp_max_websockets_per_key: int = Field(
        default=100,
        ge=1,
        description="TP WebSocket connections one API key may hold at once (more: the handshake is refused, 503 "
        "too_many_connections)",
    )
    tp_max_websockets: int = Field(
        default=1000, ge=1, description="TP WebSocket connections this process holds at once, all keys together"
    )
    tp_mailbox_ttl: int = Field(default=24 * 3600, gt=0, description="seconds an undelivered TP message is kept")
    tp_mailbox_max_messages: int = Field(
        default=1000, ge=1, description="undelivered TP messages kept per receiver (more: 429 mailbox_full)"
    )
    # operations: logs, readiness, shutdown
    log_format: Literal["json", "text"] = Field(
        default="text", description="log lines: json (one object per line) or text"
    )
    readiness_probe_interval: float = Field(
        default=10.0, gt=0, description="seconds between storage write probes of /readyz (answers are cached between)"
    )
    readiness_probe_timeout: float = Field(default=5.0, gt=0, description="seconds a readiness storage probe may take")
    shutdown_drain: float = Field(
        default=5.0,
        ge=0,
        description="seconds after SIGTERM during which /readyz answers 503 while requests are still accepted "
        "(load balancers stop sending new ones)",
    )
    shutdown_grace: float = Field(
        default=25.0,
        ge=0,
        description="seconds from SIGTERM until requests still running are stopped (uploads abort, nothing is kept)",
    )
    # MCP
    mcp_root: Path | None = Field(
        default=None,
        description="directory the MCP file tools may read and write (stdio: the working directory; HTTP: none)",
    )
    mcp_max_inline_bytes: int = Field(
        default=4 << 20, ge=1 << 10, description="largest content carried inside one MCP message (bytes, chunks)"
    )

    # hooks and events (docs/HOOKS.md)
    hook_url: str | None = Field(
        default=None,
        description="pre-upload hook: an HTTP(S) URL asked, before any upload stores a byte, whether to allow it "
        "(its answer may also set the file's lifetime and metadata); none: every upload is allowed",
    )
    hook_timeout: float = Field(default=5.0, gt=0, le=60, description="seconds the pre-upload hook may take")
    hook_on_failure: Literal["deny", "allow"] = Field(
        default="deny",
        description="what a pre-upload hook that times out, fails or answers nonsense decides: deny (503 "
        "hook_unavailable, the upload is refused) or allow",
    )
    hook_secret: str | None = Field(
        default=None,
        description="whsec_ secret the pre-upload hook's requests are signed with (Standard Webhooks), so that the "
        "hook knows they come from this service",
    )
    hooks_allow_networks: list[str] = Field(
        default_factory=list,
        description="JSON list of CIDRs the pre-upload hook and webhook subscriptions may reach although private or "
        'loopback, e.g. ["10.1.0.0/16"] (every other such address is refused, as for server-side fetches)',
    )
    events: bool = Field(
        default=False,
        description="record file and upload events (file.published, file.deleted, file.expired, upload.aborted, "
        "quota.exceeded) in the outbox, deliver them to webhook subscriptions and stream them on /v1/events",
    )
    events_max_age: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="seconds an event is retried for a subscription that does not take it; then it is dead-lettered",
    )
    events_retry_base: float = Field(
        default=5.0, gt=0, description="seconds before the first retry of a failed delivery (doubling each time)"
    )
    events_retry_max: float = Field(default=600.0, gt=0, description="longest wait between two delivery attempts")
    events_timeout: float = Field(default=10.0, gt=0, le=120, description="seconds a webhook receiver may take")
    events_concurrency: int = Field(default=8, ge=1, le=256, description="deliveries in flight per process")
    events_lease: float = Field(
        default=60.0, gt=0, description="seconds a replica holds an event it is delivering (then another may)"
    )
    events_scan_interval: float = Field(
        default=2.0, gt=0, description="seconds between looks at the outbox for events due (any replica's)"
    )
    events_outbox_limit: int = Field(
        default=100_000,
        ge=1,
        description="events waiting in the outbox at most; above it new events are dropped and counted "
        "(transfer_events_dropped_total)",
    )
    events_feed_retention: float = Field(
        default=24 * 3600.0, gt=0, description="seconds /v1/events keeps an event for a stream that resumes"
    )
    max_event_subscriptions: int = Field(default=100, ge=1, le=10_000, description="webhook subscriptions at most")
    max_event_streams: int = Field(
        default=256, ge=1, description="/v1/events streams open at once per process (more: 429)"
    )

    @field_validator("signing_keys")
    @classmethod
    def _signing_keys_are_secret(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for kid, secret in (v or {}).items():
            problem = secret_problem(secret, min_length=SIGNING_KEY_MIN)
            if problem is not None:
                raise PydanticCustomError(PLACEHOLDER, "the signing key {kid} " + problem, {"kid": repr(kid)})
        return v

    @field_validator("api_keys")
    @classmethod
    def _api_keys_are_hashes(cls, v: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
        for name, spec in (v or {}).items():
            digest = str(spec.get("sha256", "")) if isinstance(spec, dict) else ""
            problem = placeholder_problem(digest)
            if problem is None and digest.startswith(TOKEN_PREFIX):
                problem = "is a key itself, not its SHA-256: configure only what `transfer keys new` prints to add"
            if problem is not None:
                raise PydanticCustomError(PLACEHOLDER, "the API key {name}: sha256 " + problem, {"name": repr(name)})
        parse_keys(v or {})  # malformed: refused here, named, rather than when the application is built
        return v

    @model_validator(mode="after")
    def _closed_unless_loopback(self) -> Settings:
        # every caller of an open service is admin: beyond this host only when asked for by name
        if not self.api_keys and not self.oauth_issuers and not self.allow_open_mode and not is_loopback(self.host):
            raise PydanticCustomError(
                "open_mode_refused",
                "no API keys (TRANSFER_API_KEYS) and TRANSFER_HOST={host} is not a loopback address: every caller "
                "who reaches the port would be admin. Configure keys (`transfer keys new`), bind to 127.0.0.1, or "
                "set TRANSFER_ALLOW_OPEN_MODE=true (--allow-open) to serve open on purpose",
                {"host": repr(self.host)},
            )
        return self

    @model_validator(mode="after")
    def _bucket_credentials_are_secret(self) -> Settings:
        # boto3 reads them from the environment (the deployment files set them there); other sources of its chain
        # (profiles, instance roles) are the platform's and not checked here
        if self.storage != "s3":
            return self
        key_id, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        if key_id is not None and (problem := placeholder_problem(key_id)) is not None:
            raise PydanticCustomError(PLACEHOLDER, "AWS_ACCESS_KEY_ID " + problem)
        if secret is not None and (problem := secret_problem(secret, min_length=BUCKET_SECRET_MIN)) is not None:
            raise PydanticCustomError(PLACEHOLDER, "AWS_SECRET_ACCESS_KEY " + problem)
        return self

    @model_validator(mode="after")
    def _metrics_port_of_its_own(self) -> Settings:
        if self.metrics_port is not None and self.metrics_port == self.port:
            raise ValueError("TRANSFER_METRICS_PORT must differ from TRANSFER_PORT (it serves /metrics without a key)")
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TRANSFER_TLS_CERT and TRANSFER_TLS_KEY go together: set both or neither")
        return self

    @model_validator(mode="after")
    def _append_limits_meet(self) -> Settings:
        low, high = self.resumable_min_append_size, self.resumable_max_append_size
        if low is not None and high is not None and low > high:
            raise ValueError("TRANSFER_RESUMABLE_MIN_APPEND_SIZE is above TRANSFER_RESUMABLE_MAX_APPEND_SIZE")
        return self

    @field_validator("storage")
    @classmethod
    def _registered_backend(cls, v: str) -> str:
        if v not in BACKENDS:
            raise ValueError(f"unknown storage backend {v!r}: one of {', '.join(BACKENDS)}")
        return v

    @model_validator(mode="after")
    def _s3_attempt_fits_the_budget(self) -> Settings:
        if self.s3_connect_timeout + self.s3_read_timeout > self.s3_call_budget:
            raise ValueError(
                "TRANSFER_S3_CALL_BUDGET must hold one attempt: at least TRANSFER_S3_CONNECT_TIMEOUT + "
                "TRANSFER_S3_READ_TIMEOUT seconds"
            )
        return self

    @model_validator(mode="after")
    def _dedup_groups_name_keys(self) -> Settings:
        seen: dict[str, str] = {}
        for group, members in self.dedup_groups.items():
            if not group:
                raise ValueError("TRANSFER_DEDUP_GROUPS: a group needs a name")
            for name in members:
                if name in seen:
                    raise ValueError(f"TRANSFER_DEDUP_GROUPS: key {name!r} is in {seen[name]!r} and {group!r}")
                if self.api_keys is not None and name not in self.api_keys:
                    raise ValueError(f"TRANSFER_DEDUP_GROUPS: {group!r} names {name!r}, not a key of TRANSFER_API_KEYS")
                seen[name] = group
        return self

    @field_validator("oauth_issuers")
    @classmethod
    def _issuers_are_wellformed(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        from transfer.core.oauth import parse_issuers

        parse_issuers(v or [])  # malformed: refused here, named, rather than on the first token
        return v

    @model_validator(mode="after")
    def _issuers_need_a_resource(self) -> Settings:
        from transfer.core.oauth import check_url

        if self.oauth_resource is not None:
            check_url(self.oauth_resource, "TRANSFER_OAUTH_RESOURCE")
        if self.oauth_issuers and not (self.oauth_resource or self.public_url):
            raise ValueError(
                "TRANSFER_OAUTH_ISSUERS needs this service's resource identifier, the audience its tokens carry: set "
                "TRANSFER_OAUTH_RESOURCE (or TRANSFER_PUBLIC_URL)"
            )
        return self

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        import ipaddress

        for net in v:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError as exc:
                raise ValueError(f"not a network (CIDR) of proxies: {net!r}") from exc
        return v

    @field_validator("public_url")
    @classmethod
    def _strip_slash(cls, v: str | None) -> str | None:
        return v.rstrip("/") if v else v
