"""The resource is not in a state the request can change (409), no longer exists (410), or is not ready yet."""

from __future__ import annotations

from typing import Any

from transfer.errors.base import TransferError


class Conflict(TransferError):
    code = "conflict"
    status = 409


class KeyNameTaken(Conflict):
    code = "key_name_taken"


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


class UploadCompleted(Gone):
    """An append to an upload that is already complete (draft-ietf-httpbis-resumable-upload interop 8, -11 §4.4.2:
    410 with the ``completed-upload`` problem type)."""

    code = "upload_completed"


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
