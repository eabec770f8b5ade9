"""Errors that arrive from elsewhere, as ours: a JSON error body a client received, a storage backend's error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from storage import errors as storage_errors
from transfer.errors.access import NotFound
from transfer.errors.base import TransferError
from transfer.errors.content import ChecksumMismatch, TooLarge
from transfer.errors.requests import InvalidRequest
from transfer.errors.service import InsufficientStorage, RemoteError, StorageUnavailable
from transfer.errors.state import Conflict, VersionConflict


def _all_subclasses(cls: type[TransferError]) -> list[type[TransferError]]:
    out: list[type[TransferError]] = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


def errors_by_code() -> dict[str, type[TransferError]]:
    """Every error class by its code."""
    return {cls.code: cls for cls in _all_subclasses(TransferError)}


def error_from_payload(status: int, payload: Any) -> TransferError:
    """Rebuild the most specific error from a JSON error body (what a client receives)."""
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        body = payload["error"]
        cls = errors_by_code().get(str(body.get("code")), None)
        message = str(body.get("message", "")) or f"HTTP {status}"
        detail = body.get("detail") if isinstance(body.get("detail"), dict) else {}
        if cls is not None:
            return cls(message, **detail)
    return RemoteError(f"server answered HTTP {status} without a recognisable error body", http_status=status)


# One table from storage errors to ours (the s3fs errors.py idea): order matters, most specific first.
_STORAGE_TABLE: tuple[tuple[type[storage_errors.StorageError], type[TransferError]], ...] = (
    (storage_errors.ObjectNotFound, NotFound),
    (storage_errors.ObjectExists, Conflict),
    (storage_errors.ObjectChanged, VersionConflict),  # before BackendUnavailable, its base
    (storage_errors.StorageFull, InsufficientStorage),
    (storage_errors.ObjectTooLarge, TooLarge),
    (storage_errors.InvalidKey, InvalidRequest),
    (storage_errors.ChecksumRejected, ChecksumMismatch),
    (storage_errors.Unsupported, StorageUnavailable),
    (storage_errors.BackendUnavailable, StorageUnavailable),
)


def from_storage_error(exc: storage_errors.StorageError) -> TransferError:
    """Translate a backend error into the service's error tree (raise it ``from exc``)."""
    for storage_cls, ours in _STORAGE_TABLE:
        if isinstance(exc, storage_cls):
            return ours(str(exc) or ours.code)
    return StorageUnavailable(f"storage backend failed: {exc}")


@contextmanager
def storage_errors_translated() -> Iterator[None]:
    """Within the block, a backend's StorageError leaves as the matching TransferError."""
    try:
        yield
    except storage_errors.StorageError as exc:
        raise from_storage_error(exc) from exc
