"""Who may do what (401, 403), and what exists for the caller (404)."""

from __future__ import annotations

from typing import Any

from transfer.errors.base import TransferError


class Unauthenticated(TransferError):
    code = "unauthenticated"
    status = 401


class AccessDenied(TransferError):
    code = "access_denied"
    status = 403


class CrossSiteRefused(AccessDenied):
    code = "cross_site_refused"


class SignatureInvalid(AccessDenied):
    code = "signature_invalid"
    reason = "mismatch"  # a metrics label: malformed, unknown_key, mismatch, path_variant (not sent to clients)

    def __init__(self, message: str, *, reason: str = "mismatch", **detail: Any) -> None:
        super().__init__(message, **detail)
        self.reason = reason


class UrlExpired(AccessDenied):
    code = "url_expired"
    reason = "expired"


class InsufficientScope(AccessDenied):
    code = "insufficient_scope"


class UploadForbidden(AccessDenied):
    code = "forbidden"


class DestinationRefused(AccessDenied):
    code = "destination_refused"


class EncryptedResourceRefused(AccessDenied):
    code = "TP-TRA031"


class NotFound(TransferError):
    code = "not_found"
    status = 404


class ToolUnavailable(NotFound):
    code = "TP-TRA021"


class TaskNotFound(NotFound):
    code = "task_not_found"
