"""The content does not match what was declared (422), or is larger than allowed (413, 431)."""

from __future__ import annotations

from transfer.errors.base import TransferError


class IntegrityError(TransferError):
    code = "integrity_error"
    status = 422


class DigestMismatch(IntegrityError):
    code = "digest_mismatch"


class ChecksumMismatch(IntegrityError):
    code = "checksum_mismatch"


class ChunkChecksumMismatch(IntegrityError):
    code = "chunk_checksum_mismatch"


class SizeMismatch(IntegrityError):
    code = "size_mismatch"


class TooLarge(TransferError):
    code = "payload_too_large"
    status = 413


class AppendTooLarge(TooLarge):
    """draft-ietf-httpbis-resumable-upload §4.1.4: one creation or append request carries more than
    ``max-append-size``."""

    code = "append_too_large"


class HeadersTooLarge(TooLarge):
    code = "headers_too_large"
    status = 431


class DecodedSizeLimit(TooLarge):
    code = "decoded_size_limit"


class QuotaExceeded(TooLarge):
    """The upload would take the key past its byte quota (``max_bytes``). RFC 9110 §15.5.14 (413): the server
    refuses content larger than it is willing to accept — here, from this key. Not 507 (RFC 4918 §11.5), which
    says the server itself is out of space and which clients retry: this one they must not retry unchanged."""

    code = "quota_exceeded"


class ManifestTooLarge(TooLarge):
    code = "manifest_too_large"
