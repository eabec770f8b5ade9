"""The base of the error tree: a stable code, an HTTP status, details, the JSON body a client receives."""

from __future__ import annotations

from typing import Any, ClassVar


class TransferError(Exception):
    """Base of every error the service reports; carries a stable ``code`` and an HTTP ``status``."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.headers: dict[str, str] = headers or {}

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later unchanged (server-side, transient conditions)."""
        return self.status in (408, 429, 499, 502, 503, 504, 507)

    def to_payload(self) -> dict[str, Any]:
        """The JSON error body every front door sends: ``{"error": {"code", "message", "status", ...}}``."""
        body: dict[str, Any] = {"code": self.code, "message": self.message, "status": self.status}
        if self.detail:
            body["detail"] = self.detail
        return {"error": body}
