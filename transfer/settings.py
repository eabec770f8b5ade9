"""Configuration from flags and environment (``TRANSFER_*``), validated once at start-up."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

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
        description="storage backend: a name registered in transfer.service.backends.BACKENDS (local: a data "
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
        if not self.api_keys and not self.allow_open_mode and not is_loopback(self.host):
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
        from transfer.service.backends import BACKENDS  # the registry imports these settings

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

    @field_validator("public_url")
    @classmethod
    def _strip_slash(cls, v: str | None) -> str | None:
        return v.rstrip("/") if v else v
