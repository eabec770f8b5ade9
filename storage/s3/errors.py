"""One table from boto3's errors (S3 error codes, transport failures) to ``storage.errors``."""

from __future__ import annotations

import botocore.exceptions

from storage.errors import (
    BackendUnavailable,
    ChecksumRejected,
    ObjectChanged,
    ObjectNotFound,
    ObjectTooLarge,
    StorageError,
    StorageFull,
    Unsupported,
)

# S3 error codes -> our storage errors (the s3fs errors.py idea); anything else is BackendUnavailable.
_ERROR_TABLE: dict[str, type[StorageError]] = {
    "NoSuchKey": ObjectNotFound,
    "404": ObjectNotFound,
    "NotFound": ObjectNotFound,
    "NoSuchUpload": ObjectNotFound,
    "EntityTooLarge": ObjectTooLarge,
    "EntityTooSmall": BackendUnavailable,
    "QuotaExceeded": StorageFull,
    "XMinioStorageFull": StorageFull,
    "InsufficientStorage": StorageFull,
    "BadDigest": ChecksumRejected,  # Content-MD5 or x-amz-checksum-* does not match the bytes
    "InvalidDigest": ChecksumRejected,
    "XAmzContentSHA256Mismatch": ChecksumRejected,
    "NotImplemented": Unsupported,  # Swift's s3api on If-Match: a refusal, not an outage
    "501": Unsupported,
    "ConditionalRequestConflict": ObjectChanged,  # 409: a concurrent conditional write of the same key
    # 409 from Ceph 20.2: the object was replaced while a request on it ran (a GetObject pinned by If-Match among them)
    "ConcurrentModification": ObjectChanged,
}


_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "Forbidden"}


def translate_error(exc: Exception, what: str) -> StorageError:
    """One table from boto errors to storage errors."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _ACCESS_CODES:
            return BackendUnavailable(f"S3 refused {what}: access denied ({code}); check the credentials")
        if code == "NoSuchBucket":
            return BackendUnavailable(f"S3 bucket does not exist ({what})")
        if code in ("PreconditionFailed", "412") or status == 412:
            return ObjectChanged(f"object changed while {what}")
        cls = _ERROR_TABLE.get(code)
        if cls is not None:
            return cls(f"{what}: {code}")
        return BackendUnavailable(f"S3 error while {what}: {code or status} {error.get('Message', '')}".strip())
    if isinstance(exc, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError):
        return BackendUnavailable("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if isinstance(exc, botocore.exceptions.EndpointConnectionError | botocore.exceptions.ConnectionError):
        return BackendUnavailable(f"cannot reach the S3 endpoint while {what}: {exc}")
    if isinstance(exc, botocore.exceptions.BotoCoreError):
        return BackendUnavailable(f"S3 client error while {what}: {exc}")
    return BackendUnavailable(f"unexpected error while {what}: {exc}")
