"""S3-compatible backend (AWS S3, MinIO, Cloudflare R2, Ceph RGW, Swift's s3api) on boto3.

Layout in the bucket, under an optional prefix::

    data/<key>         the bytes; multipart uploads for anything of at least one part, PutObject below that
    meta/<key>.json    the metadata, written before the bytes are published

Publishing: parts are uploaded while the bytes arrive (at most ``part_buffers`` parts in flight per upload, each of
the planned part size, and every part buffer of every upload taken from one process-wide ``buffer_budget``, so
concurrency cannot multiply them: see :mod:`storage.budget`), then the metadata object is written, then
CompleteMultipartUpload (or the PutObject of a small object) makes the bytes visible. Abort — on any failure,
cancellation or a failed verification upstream — aborts the multipart upload, so no orphaned upload remains. Reads
pass the range to GetObject with ``If-Match`` on the ETag seen when the reader was opened, so a reader never mixes
two versions.

Compare-and-set: ``ObjectInfo.etag`` is the data object's ETag; ``create(key, if_match=etag)`` publishes the bytes
with ``If-Match`` on PutObject / CompleteMultipartUpload (AWS S3 since 2024, MinIO, Ceph RGW), then the metadata, so
a lost race changes nothing. Engines differ, so :meth:`S3Storage.start` probes the one it talks to
(:class:`~storage.s3.engine.EngineProfile`, whose module tabulates what each engine was seen to do) and uses what
works: the ETag quoted as returned (AWS, Ceph 20.2) or unquoted (Ceph 16 compares byte for byte with the ETag it
stores without quotes); where CompleteMultipartUpload ignores conditions (Ceph 16) a large create-if-absent claims
its key with a conditional PutObject of its metadata first, where it honours them (Ceph 20.2, AWS) the completion
alone decides; where UploadPartCopy ignores its source's condition (Ceph 16) the sources are checked by HEAD after
the copies. Where the engine has no conditional PUT (Swift's s3api answers 501) the ETag is compared by a HEAD just
before the put, under a per-key lock of this process, so the compare-and-set holds within one process but not
between replicas (no ATOMIC_IF_MATCH then: the service refuses to run as one of several replicas on it).

boto3 calls run in a thread pool of ``max_concurrency`` threads (the event loop never blocks); transient errors
(503 SlowDown, resets, timeouts) are retried by botocore's ``standard`` retry mode; every other error is translated
by one table into ``storage.errors``.

Bounded in time, not only in count: a retry is attempted only if it could end within ``call_budget`` seconds of the
call's start (its backoff plus one whole attempt, ``connect_timeout + read_timeout``, must fit), so a call to a
gateway that never answers fails — ``BackendUnavailable``, the service's 503 ``storage_unavailable`` — within
``call_budget`` (30 s by default: one 20 s read timeout and no second attempt), where botocore alone would spend up
to ``max_attempts`` × (connect + read timeout) plus its backoff (5 × 65 s). A call that keeps receiving bytes (a long
CompleteMultipartUpload with AWS's whitespace keep-alive) is not cut: the budget only refuses retries. The service
retries nothing but lost compare-and-set races, so it does not multiply this.

The modules, bottom up: ``config`` (S3Config), ``errors`` (the error table), ``client`` (boto3 calls in a pool,
within a time budget), ``engine`` (the probes and what they saw), ``bucket`` (the engine's conditional forms, the
metadata objects), ``reader`` and ``writer`` (one object's bytes), ``store`` (S3Storage: the storage protocol and
its capabilities).
"""

from storage.s3.client import S3Client
from storage.s3.config import S3Config
from storage.s3.errors import translate_error
from storage.s3.reader import S3Reader
from storage.s3.store import S3Storage
from storage.s3.writer import S3Writer, copy_ranges

__all__ = ["S3Client", "S3Config", "S3Reader", "S3Storage", "S3Writer", "copy_ranges", "translate_error"]
