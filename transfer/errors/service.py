"""The service, its storage or a peer cannot answer now (5xx, timeouts), or answered something unusable."""

from __future__ import annotations

from typing import Any

from transfer.errors.base import TransferError


class ClientDisconnected(TransferError):
    code = "client_disconnected"
    status = 499


class InsufficientStorage(TransferError):
    code = "insufficient_storage"
    status = 507


class SigningKeysRequired(TransferError):
    """The storage is read with credentials of its own (a bucket) and TRANSFER_SIGNING_KEYS is not set: the service
    does not keep its URL signing key where those credentials reach (``transfer serve`` refuses to start)."""

    code = "signing_keys_required"
    status = 503


class StorageUnavailable(TransferError):
    code = "storage_unavailable"
    status = 503


class ShuttingDown(TransferError):
    """The server stopped this request at the end of its shutdown grace; nothing of it was kept."""

    code = "shutting_down"
    status = 503


class HookUnavailable(TransferError):
    """The pre-upload hook did not answer usably (down, slow, an error, nonsense) and the deployment fails closed
    (``TRANSFER_HOOK_ON_FAILURE=deny``): nothing was stored; the same request may succeed later."""

    code = "hook_unavailable"
    status = 503


class TooManyConnections(TransferError):
    """The server holds as many connections as it allows (``detail.limit``: ``process`` or ``client``, the client
    address's share); the connection is closed after this answer. Retry later (``Retry-After``)."""

    code = "too_many_connections"
    status = 503


class AssetsMissing(TransferError):
    """A browser library the web page or the API docs need was not installed (``make install``)."""

    code = "assets_missing"
    status = 503


class IssuerUnavailable(TransferError):
    """A trusted issuer's metadata, keys or introspection endpoint could not be reached (or answered nonsense): the
    token may be fine; nothing is wrong with the request. 503 with ``Retry-After``."""

    code = "issuer_unavailable"
    status = 503

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, **detail: Any) -> None:
        super().__init__(message, headers={"Retry-After": "5", **(headers or {})}, **detail)


class McpUnavailable(TransferError):
    """``/mcp`` could not load the MCP binding (the SDK missing or broken in this install); the rest of the API
    serves on. Nothing was started; the next call tries again."""

    code = "mcp_unavailable"
    status = 503


class HeartbeatTimeout(TransferError):
    code = "TP-TRA010"
    status = 408


class RequestTimeout(TransferError):
    code = "request_timeout"
    status = 408


class UpstreamTimeout(TransferError):
    code = "TP-TRA011"
    status = 504


class BridgeFailed(TransferError):
    code = "TP-TRA002"
    status = 502


class RemoteError(TransferError):
    code = "remote_error"
    status = 502
