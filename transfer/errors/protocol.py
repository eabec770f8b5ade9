"""HTTP semantics a request did not meet: method, preconditions, media type, ranges, tus's own checks."""

from __future__ import annotations

from transfer.errors.base import TransferError


class MethodNotAllowed(TransferError):
    code = "method_not_allowed"
    status = 405


class PreconditionFailed(TransferError):
    code = "precondition_failed"
    status = 412


class TusVersionUnsupported(PreconditionFailed):
    code = "tus_version_unsupported"


class UnsupportedMediaType(TransferError):
    code = "unsupported_media_type"
    status = 415


class TusChecksumMismatch(TransferError):
    code = "tus_checksum_mismatch"
    status = 460


class RangeNotSatisfiable(TransferError):
    code = "range_not_satisfiable"
    status = 416
