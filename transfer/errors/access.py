"""Who may do what (401, 403), and what exists for the caller (404)."""

from __future__ import annotations

from typing import Any

from transfer.errors.base import TransferError


class Unauthenticated(TransferError):
    code = "unauthenticated"
    status = 401


class KeyExpired(Unauthenticated):
    """A run-time API key (a key record) past the expiry it was created with, or past the grace of a rotation."""

    code = "key_expired"


class InvalidToken(Unauthenticated):
    """An OAuth access token the service refuses (RFC 6750 §3.1 ``invalid_token``); the subclasses say why."""

    code = "invalid_token"


class TokenExpired(InvalidToken):
    code = "token_expired"


class TokenNotYetValid(InvalidToken):
    code = "token_not_yet_valid"


class TokenAudienceMismatch(InvalidToken):
    code = "token_audience_mismatch"


class TokenSignatureInvalid(InvalidToken):
    code = "token_signature_invalid"


class TokenAlgorithmRefused(InvalidToken):
    code = "token_algorithm_refused"


class TokenKeyUnknown(InvalidToken):
    code = "token_key_unknown"


class TokenIssuerUnknown(InvalidToken):
    code = "token_issuer_unknown"


class TokenTypeRefused(InvalidToken):
    code = "token_type_refused"


class TokenMalformed(InvalidToken):
    code = "token_malformed"


class TokenInactive(InvalidToken):
    code = "token_inactive"


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


class UploadRefused(AccessDenied):
    """The deployment's pre-upload hook refused the upload before a byte was stored; its reason is the message (and
    ``detail["reason"]``)."""

    code = "upload_refused"


class EncryptedResourceRefused(AccessDenied):
    code = "TP-TRA031"


class NotFound(TransferError):
    code = "not_found"
    status = 404


class EventsDisabled(NotFound):
    """Events are not recorded on this deployment (``TRANSFER_EVENTS`` is off): no stream, no subscriptions."""

    code = "events_disabled"


class ToolUnavailable(NotFound):
    code = "TP-TRA021"


class TaskNotFound(NotFound):
    code = "task_not_found"
