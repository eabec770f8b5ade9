"""One error tree for the whole service: every failure has a stable code and an HTTP status.

Front doors (REST, CLI, client) never invent their own errors; they render these. A client that receives a JSON
error body rebuilds the same exception type from its ``code`` (see :func:`error_from_payload`).

    TransferError                      500 internal_error
    ├── InvalidRequest                 400 invalid_request
    │   ├── InvalidDescriptor          422 invalid_descriptor
    │   ├── InvalidEnvelope            400 invalid_envelope      (TP MessageEnvelope / aiflowy / JSON-RPC params)
    │   │   ├── TPContractRefMissing   400 tp_contract_ref_missing  (TP native HTTP/2 mode, §9.2.3: header absent)
    │   │   ├── TPContractRefMismatch  400 tp_contract_ref_mismatch (header ≠ the envelope's protocol_contract_ref)
    │   │   ├── TPMessageIdMissing     400 tp_message_id_missing    (§9.2.3: header absent)
    │   │   └── TPMessageIdMismatch    400 tp_message_id_mismatch   (header ≠ the envelope's message_id)
    │   ├── HopLimitExceeded           400 TP-TRA001             (trace_info.hop_count above 5)
    │   ├── TPVersionUnsupported       400 TP-TRA020
    │   ├── NoEnvelopeInPrompt         422 TP-TRA030             (no ```tp-envelope block in the text)
    │   ├── UnsupportedMessageType     501 unsupported_message_type
    │   ├── UnsupportedOperation       400 unsupported_operation (A2A: streaming, push, cancel, …; detail.reason)
    │   ├── InvalidDigestHeader        400 invalid_digest_header
    │   ├── ContentLengthMismatch      400 content_length_mismatch
    │   ├── MalformedBody              400 malformed_body
    │   ├── UnsupportedEncoding        415 unsupported_encoding
    │   ├── HostNotAllowed             400 host_not_allowed      (Host not in the allow-list: URLs are built from it)
    │   ├── InvalidHost                400 invalid_host          (HTTP/1.1: no Host or several, RFC 9112 §3.2)
    │   ├── InconsistentUploadLength   400 inconsistent_upload_length (IETF resumable upload: lengths disagree)
    │   ├── ChunkOutOfRange            400 chunk_out_of_range
    │   ├── LifetimeTooLong            400 expires_in_too_long   (a file lifetime above the key's or service's max)
    │   ├── ChunkLengthMismatch        400 chunk_length_mismatch
    │   ├── InvalidManifest            400 invalid_manifest      (chunked dedup: chunks not tiling the file, bad hash)
    │   │   └── ManifestSizeMismatch   400 manifest_size_mismatch (the chunks do not add up to the declared size)
    │   └── ChunkNotInManifest         400 chunk_not_in_manifest (a chunk sent that the upload's manifest lacks)
    ├── IntegrityError                 422 integrity_error
    │   ├── DigestMismatch             422 digest_mismatch       (RFC 9530 Content-Digest / Repr-Digest)
    │   ├── ChecksumMismatch           422 checksum_mismatch     (descriptor checksum, SHA-256 of original bytes)
    │   ├── ChunkChecksumMismatch      422 chunk_checksum_mismatch
    │   └── SizeMismatch               422 size_mismatch
    ├── TooLarge                       413 payload_too_large
    │   ├── HeadersTooLarge            431 headers_too_large
    │   ├── DecodedSizeLimit           413 decoded_size_limit    (decompression bomb guard)
    │   ├── QuotaExceeded              413 quota_exceeded        (the key's max_bytes; detail: quota, used, reserved)
    │   └── ManifestTooLarge           413 manifest_too_large    (more chunks or bytes than a manifest may name)
    ├── Unauthenticated                401 unauthenticated       (no, malformed or unknown API key)
    ├── AccessDenied                   403 access_denied
    │   ├── InsufficientScope          403 insufficient_scope
    │   ├── UploadForbidden            403 forbidden             (tus: PATCH on a final upload; paths outside root)
    │   ├── DestinationRefused         403 destination_refused   (server-side fetch to a private/loopback address)
    │   ├── EncryptedResourceRefused   403 TP-TRA031             (prompt embedding carries no encrypted resource)
    │   ├── CrossSiteRefused           403 cross_site_refused    (a browser request from another site, not allowed)
    │   ├── SignatureInvalid           403 signature_invalid
    │   └── UrlExpired                 403 url_expired
    ├── NotFound                       404 not_found
    │   ├── ToolUnavailable            404 TP-TRA021             (MCP tool for that message type)
    │   └── TaskNotFound               404 task_not_found        (A2A task: unknown, or another key's)
    ├── MethodNotAllowed               405 method_not_allowed
    ├── PreconditionFailed             412 precondition_failed
    │   └── TusVersionUnsupported      412 tus_version_unsupported
    ├── UnsupportedMediaType           415 unsupported_media_type
    ├── TusChecksumMismatch            460 tus_checksum_mismatch (tus checksum extension)
    ├── RangeNotSatisfiable            416 range_not_satisfiable
    ├── TooManySessions                429 too_many_sessions     (open sessions per API key)
    ├── TooManyPlans                   429 too_many_plans        (open direct upload plans per API key)
    ├── MailboxFull                    429 mailbox_full          (TP messages waiting for one receiver)
    ├── TooManyAuthorizations          429 too_many_authorizations (open upload authorisations per API key)
    ├── TooManyJobs                    429 too_many_jobs         (job streams waiting for their upload to start)
    ├── TooManySubscriptions           429 too_many_subscriptions (resource ids one WebSocket connection follows)
    ├── Conflict                       409 conflict
    │   ├── ChunkConflict              409 chunk_conflict        (other bytes already stored for that chunk)
    │   ├── VersionConflict            409 version_conflict      (a compare-and-set lost: the record changed)
    │   │   └── RecordBusy             503 record_busy           (a record kept changing past the retry policy;
    │   │                                                         Retry-After: nothing is wrong with the request)
    │   ├── SessionCompleted           409 session_completed
    │   ├── UploadOffsetMismatch       409 upload_offset_mismatch (IETF resumable upload: detail expected/provided)
    │   ├── SessionIncomplete          409 session_incomplete    (detail: missing chunk ranges)
    │   ├── PlanIncomplete             409 plan_incomplete       (direct upload: detail: missing parts, wrong sizes)
    │   ├── ChunksMissing              409 chunks_missing        (chunked dedup: detail: the chunk indexes to send)
    │   └── DirectUploadUnsupported    409 direct_upload_unsupported (the backend cannot take parts: fall back)
    ├── Gone                           410 gone
    │   ├── FileExpired                410 file_expired          (past the file's expires_at, service clock)
    │   ├── BundleExpired              410 bundle_expired        (past the bundle's expires_at, service clock)
    │   ├── SessionAborted             410 session_aborted
    │   └── SessionExpired             410 session_expired
    ├── ChunkNotReady                  503 chunk_not_ready       (live read waited long enough; retry)
    ├── ClientDisconnected             499 client_disconnected   (nobody is left to read it; logged only)
    ├── InsufficientStorage            507 insufficient_storage
    ├── StorageUnavailable             503 storage_unavailable
    ├── ShuttingDown                   503 shutting_down         (the grace after SIGTERM ran out; retry elsewhere)
    ├── TooManyConnections             503 too_many_connections  (the process's or the client address's connection
    │                                                             limit; detail.limit; Retry-After)
    ├── AssetsMissing                  503 assets_missing        (web page / docs libraries not installed)
    ├── McpUnavailable                 503 mcp_unavailable       (/mcp: the MCP SDK could not be imported)
    ├── HeartbeatTimeout               408 TP-TRA010             (WebSocket: two pongs missed)
    ├── RequestTimeout                 408 request_timeout       (header fields or body sent too slowly)
    ├── UpstreamTimeout                504 TP-TRA011             (server-side fetch timed out)
    ├── BridgeFailed                   502 TP-TRA002
    └── RemoteError                    502 remote_error          (client side: server answered something unusable;
                                                                  server side: a fetched URL answered an error)

Storage backends raise their own errors (``storage.errors``); :func:`from_storage_error` translates them with one
table so that ``storage/`` never imports ``transfer/``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

from storage import errors as storage_errors


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


class InvalidRequest(TransferError):
    code = "invalid_request"
    status = 400


class InvalidCursor(InvalidRequest):
    """A listing cursor this service did not hand out (or one from another listing)."""

    code = "invalid_cursor"


class InvalidDescriptor(InvalidRequest):
    code = "invalid_descriptor"
    status = 422


class InvalidDigestHeader(InvalidRequest):
    code = "invalid_digest_header"


class ContentLengthMismatch(InvalidRequest):
    code = "content_length_mismatch"


class InconsistentUploadLength(InvalidRequest):
    """draft-ietf-httpbis-resumable-upload §4.1.3: two indications of an upload's length disagree."""

    code = "inconsistent_upload_length"


class MalformedBody(InvalidRequest):
    code = "malformed_body"


class UnsupportedEncoding(InvalidRequest):
    """A content coding the request may not use. RFC 9110 §15.5.16: a 415 caused by a content coding lists in
    ``Accept-Encoding`` the codings that would have been accepted; ``accepted`` names them (``identity``, an
    unencoded body, by default: every route takes one)."""

    code = "unsupported_encoding"
    status = 415

    def __init__(
        self,
        message: str,
        *,
        accepted: Sequence[str] = ("identity",),
        headers: dict[str, str] | None = None,
        **detail: Any,
    ) -> None:
        super().__init__(message, headers={"accept-encoding": ", ".join(accepted), **(headers or {})}, **detail)


class HostNotAllowed(InvalidRequest):
    code = "host_not_allowed"


class InvalidHost(InvalidRequest):
    """An HTTP/1.1 request without a ``Host`` header field or with more than one (RFC 9112 §3.2: 400)."""

    code = "invalid_host"


class ChunkOutOfRange(InvalidRequest):
    code = "chunk_out_of_range"


class ChunkLengthMismatch(InvalidRequest):
    code = "chunk_length_mismatch"


class InvalidManifest(InvalidRequest):
    """A chunk manifest that does not describe a file: chunks out of order, of a bad length or hash."""

    code = "invalid_manifest"


class ManifestSizeMismatch(InvalidManifest):
    code = "manifest_size_mismatch"


class ChunkNotInManifest(InvalidRequest):
    code = "chunk_not_in_manifest"


class LifetimeTooLong(InvalidRequest):
    """An upload asked for a lifetime (``expires_in``) above the maximum of its key or of the service: refused,
    not shortened, so a client never holds a descriptor that lives less than it asked for without knowing it."""

    code = "expires_in_too_long"


class InvalidEnvelope(InvalidRequest):
    code = "invalid_envelope"


class TPContractRefMissing(InvalidEnvelope):
    code = "tp_contract_ref_missing"


class TPContractRefMismatch(InvalidEnvelope):
    code = "tp_contract_ref_mismatch"


class TPMessageIdMissing(InvalidEnvelope):
    code = "tp_message_id_missing"


class TPMessageIdMismatch(InvalidEnvelope):
    code = "tp_message_id_mismatch"


class HopLimitExceeded(InvalidRequest):
    code = "TP-TRA001"


class TPVersionUnsupported(InvalidRequest):
    code = "TP-TRA020"


class NoEnvelopeInPrompt(InvalidRequest):
    code = "TP-TRA030"
    status = 422


class UnsupportedMessageType(InvalidRequest):
    code = "unsupported_message_type"
    status = 501


class UnsupportedOperation(InvalidRequest):
    """A protocol operation this service does not offer; ``detail["reason"]`` names it in the protocol's terms."""

    code = "unsupported_operation"


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


class TooManySessions(TransferError):
    code = "too_many_sessions"
    status = 429


class TooManyPlans(TransferError):
    code = "too_many_plans"
    status = 429


class TooManyAuthorizations(TransferError):
    code = "too_many_authorizations"
    status = 429


class MailboxFull(TransferError):
    code = "mailbox_full"
    status = 429


class TooManyJobs(TransferError):
    code = "too_many_jobs"
    status = 429


class TooManySubscriptions(TransferError):
    """One WebSocket connection asked to follow more resource ids than ``tp_max_subscriptions``: it is closed."""

    code = "too_many_subscriptions"
    status = 429


class Conflict(TransferError):
    code = "conflict"
    status = 409


class ChunkConflict(Conflict):
    code = "chunk_conflict"


class VersionConflict(Conflict):
    """A compare-and-set (``if_match``) found another version than the one it was based on: read and retry."""

    code = "version_conflict"


class RecordBusy(VersionConflict):
    """A record every replica updates (a key's usage, an upload's record) kept changing under this request for
    longer than the record store's retry policy allows: nothing of the request's change was written and the request
    itself is fine, so it is a 503 with ``Retry-After`` (send it again), not a conflict the client caused. A
    :class:`VersionConflict` still, for the code that treats a lost race as one."""

    code = "record_busy"
    status = 503

    def __init__(self, message: str, *, headers: dict[str, str] | None = None, **detail: Any) -> None:
        super().__init__(message, headers={"Retry-After": "1", **(headers or {})}, **detail)


class SessionCompleted(Conflict):
    code = "session_completed"


class UploadOffsetMismatch(Conflict):
    """draft-ietf-httpbis-resumable-upload §5.3.2: an append's ``Upload-Offset`` is not the upload's offset;
    ``detail`` carries ``expected_offset`` and ``provided_offset``."""

    code = "upload_offset_mismatch"


class SessionIncomplete(Conflict):
    code = "session_incomplete"


class PlanIncomplete(Conflict):
    code = "plan_incomplete"


class ChunksMissing(Conflict):
    """A chunked upload completed before every chunk it lacks was stored (detail ``missing``: their indexes)."""

    code = "chunks_missing"


class DirectUploadUnsupported(Conflict):
    """The storage backend cannot take bytes from clients directly (local storage): upload through the service.
    409, not 501: the request is fine and the server works, this deployment's storage is what conflicts with it
    (and a 5xx would read as a server fault to monitors and to the schema fuzzing that allows none)."""

    code = "direct_upload_unsupported"


class Gone(TransferError):
    code = "gone"
    status = 410


class FileExpired(Gone):
    code = "file_expired"


class BundleExpired(Gone):
    code = "bundle_expired"


class SessionAborted(Gone):
    code = "session_aborted"


class SessionExpired(Gone):
    code = "session_expired"


class ChunkNotReady(TransferError):
    code = "chunk_not_ready"
    status = 503


class ClientDisconnected(TransferError):
    code = "client_disconnected"
    status = 499


class InsufficientStorage(TransferError):
    code = "insufficient_storage"
    status = 507


class StorageUnavailable(TransferError):
    code = "storage_unavailable"
    status = 503


class ShuttingDown(TransferError):
    """The server stopped this request at the end of its shutdown grace; nothing of it was kept."""

    code = "shutting_down"
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
