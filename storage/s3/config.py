"""How an S3 backend is configured: bucket, endpoint, credentials, part sizes and budgets, retries and timeouts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class S3Config:
    bucket: str
    endpoint_url: str | None = None  # None: AWS_ENDPOINT_URL, else AWS itself
    region: str | None = None
    access_key_id: str | None = None  # None: the standard AWS credential chain
    secret_access_key: str | None = None
    session_token: str | None = None
    addressing_style: str = "auto"  # "path" for MinIO and Swift
    prefix: str = ""
    part_size: int = 8 << 20
    part_buffers: int = 10  # parts in flight per upload: as many as boto3's upload_file sends
    # bytes of part buffers (filling and in flight) for every upload of the process together: 10 parts of 8 MiB in
    # flight and one filling, what one upload uses at full speed; more uploads share it (and wait for it)
    buffer_budget: int = 64 << 20  # 8 parts of 8 MiB: what boto3's upload_file keeps in flight, for all uploads
    max_concurrency: int = 16  # threads (and HTTP connections) for boto3 calls, shared by every transfer
    max_object_size: int = 64 << 30
    buffer_size: int = 1 << 20  # bytes per read call
    max_attempts: int = 5
    # AWS S3 and MinIO evaluate If-None-Match on PutObject atomically; Swift's s3api checks it before writing, so
    # two concurrent conditional writers may both succeed there.
    atomic_if_absent: bool = True
    # AWS S3 and MinIO honour If-Match on PutObject and CompleteMultipartUpload; Swift's s3api refuses conditional
    # PUTs (501 NotImplemented): there the ETag is compared by a HEAD before the put, which is not atomic.
    atomic_if_match: bool = True
    connect_timeout: float = 5.0
    read_timeout: float = 20.0  # seconds without a byte (urllib3's socket timeout), per attempt
    call_budget: float = 30.0  # seconds one call may take with its retries (see the module's docstring)
    # learn at start() what the engine really does (see :class:`EngineProfile`); the two ``atomic_*`` flags above
    # can then only take an ability away (an operator's "no"), never grant one the engine was seen not to have
    probe: bool = True
    abandoned_upload_age: float = 24 * 3600  # seconds after which an unfinished multipart upload is aborted
