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
    │   │   └── JsonTooDeep            400 json_too_deep         (JSON nested past transfer.core.jsontext.MAX_DEPTH)
    │   ├── UnsupportedEncoding        415 unsupported_encoding
    │   ├── HostNotAllowed             400 host_not_allowed      (Host not in the allow-list: URLs are built from it)
    │   ├── InvalidHost                400 invalid_host          (HTTP/1.1: no Host or several, RFC 9112 §3.2)
    │   ├── InconsistentUploadLength   400 inconsistent_upload_length (IETF resumable upload: lengths disagree)
    │   ├── AppendTooSmall             400 append_too_small      (IETF resumable upload: below min-append-size)
    │   ├── UploadBelowMinSize         400 upload_below_min_size (IETF resumable upload: incomplete, below min-size)
    │   ├── ChunkOutOfRange            400 chunk_out_of_range
    │   ├── LifetimeTooLong            400 expires_in_too_long   (a file lifetime above the key's or service's max)
    │   ├── ChunkLengthMismatch        400 chunk_length_mismatch
    │   ├── InvalidManifest            400 invalid_manifest      (chunked dedup: chunks not tiling the file, bad hash)
    │   │   └── ManifestSizeMismatch   400 manifest_size_mismatch (the chunks do not add up to the declared size)
    │   ├── ChunkNotInManifest         400 chunk_not_in_manifest (a chunk sent that the upload's manifest lacks)
    │   └── KeyRecordsRefused          400 key_records_refused   (run-time keys on a service that runs open)
    ├── IntegrityError                 422 integrity_error
    │   ├── DigestMismatch             422 digest_mismatch       (RFC 9530 Content-Digest / Repr-Digest)
    │   ├── ChecksumMismatch           422 checksum_mismatch     (descriptor checksum, SHA-256 of original bytes)
    │   ├── ChunkChecksumMismatch      422 chunk_checksum_mismatch
    │   └── SizeMismatch               422 size_mismatch
    ├── TooLarge                       413 payload_too_large
    │   ├── HeadersTooLarge            431 headers_too_large
    │   ├── AppendTooLarge             413 append_too_large      (IETF resumable upload: above max-append-size)
    │   ├── DecodedSizeLimit           413 decoded_size_limit    (decompression bomb guard)
    │   ├── QuotaExceeded              413 quota_exceeded        (the key's max_bytes; detail: quota, used, reserved)
    │   └── ManifestTooLarge           413 manifest_too_large    (more chunks or bytes than a manifest may name)
    ├── Unauthenticated                401 unauthenticated       (no, malformed or unknown API key)
    │   ├── KeyExpired                 401 key_expired           (a key record past its expires_at)
    │   └── InvalidToken               401 invalid_token         (an OAuth access token refused; RFC 6750 §3.1)
    │       ├── TokenExpired           401 token_expired         (past exp, beyond the allowed clock skew)
    │       ├── TokenNotYetValid       401 token_not_yet_valid   (nbf or iat in the future)
    │       ├── TokenAudienceMismatch  401 token_audience_mismatch (aud does not name this service: RFC 8707)
    │       ├── TokenSignatureInvalid  401 token_signature_invalid (tampered, or not signed by that key)
    │       ├── TokenAlgorithmRefused  401 token_algorithm_refused (alg outside the allow-list: none, HS*, ...)
    │       ├── TokenKeyUnknown        401 token_key_unknown     (no key of the issuer's JWKS signed it)
    │       ├── TokenIssuerUnknown     401 token_issuer_unknown  (iss is not a trusted issuer)
    │       ├── TokenTypeRefused       401 token_type_refused    (typ is not at+jwt: RFC 9068 §4)
    │       ├── TokenMalformed         401 token_malformed       (not a JWT, or a required claim missing)
    │       └── TokenInactive          401 token_inactive        (introspection: active false; RFC 7662 §2.2)
    ├── AccessDenied                   403 access_denied
    │   ├── InsufficientScope          403 insufficient_scope
    │   ├── UploadForbidden            403 forbidden             (tus: PATCH on a final upload; paths outside root)
    │   ├── DestinationRefused         403 destination_refused   (server-side fetch to a private/loopback address)
    │   ├── UploadRefused              403 upload_refused        (the pre-upload hook said no; detail: reason)
    │   ├── EncryptedResourceRefused   403 TP-TRA031             (prompt embedding carries no encrypted resource)
    │   ├── CrossSiteRefused           403 cross_site_refused    (a browser request from another site, not allowed)
    │   ├── SignatureInvalid           403 signature_invalid
    │   └── UrlExpired                 403 url_expired
    ├── NotFound                       404 not_found
    │   ├── EventsDisabled             404 events_disabled       (/v1/events, subscriptions: TRANSFER_EVENTS is off)
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
    │   ├── KeyNameTaken               409 key_name_taken        (a key of that name exists: rotate it instead)
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
    │   ├── UploadCompleted            410 upload_completed      (IETF resumable upload, interop 8: append when done)
    │   ├── FileExpired                410 file_expired          (past the file's expires_at, service clock)
    │   ├── BundleExpired              410 bundle_expired        (past the bundle's expires_at, service clock)
    │   ├── SessionAborted             410 session_aborted
    │   └── SessionExpired             410 session_expired
    ├── ChunkNotReady                  503 chunk_not_ready       (live read waited long enough; retry)
    ├── ClientDisconnected             499 client_disconnected   (nobody is left to read it; logged only)
    ├── InsufficientStorage            507 insufficient_storage
    ├── StorageUnavailable             503 storage_unavailable
    ├── SigningKeysRequired            503 signing_keys_required (storage shared beyond this host, no configured key)
    ├── ShuttingDown                   503 shutting_down         (the grace after SIGTERM ran out; retry elsewhere)
    ├── TooManyConnections             503 too_many_connections  (the process's or the client address's connection
    │                                                             limit; detail.limit; Retry-After)
    ├── HookUnavailable                503 hook_unavailable      (the pre-upload hook failed or timed out; fail closed)
    ├── AssetsMissing                  503 assets_missing        (web page / docs libraries not installed)
    ├── McpUnavailable                 503 mcp_unavailable       (/mcp: the MCP SDK could not be imported)
    ├── IssuerUnavailable              503 issuer_unavailable    (a trusted issuer's metadata or keys unreachable)
    ├── HeartbeatTimeout               408 TP-TRA010             (WebSocket: two pongs missed)
    ├── RequestTimeout                 408 request_timeout       (header fields or body sent too slowly)
    ├── UpstreamTimeout                504 TP-TRA011             (server-side fetch timed out)
    ├── BridgeFailed                   502 TP-TRA002
    └── RemoteError                    502 remote_error          (client side: server answered something unusable;
                                                                  server side: a fetched URL answered an error)

Storage backends raise their own errors (``storage.errors``); :func:`from_storage_error` translates them with one
table so that ``storage/`` never imports ``transfer/``.

One module per family of the tree: ``base`` (TransferError), ``requests`` (InvalidRequest), ``content``
(IntegrityError, TooLarge), ``access`` (Unauthenticated, AccessDenied, NotFound), ``protocol`` (405, 412, 415, 416,
460), ``limits`` (429), ``state`` (Conflict, Gone), ``service`` (5xx and timeouts); ``translation`` rebuilds an
error from a JSON body and translates storage errors. Import every name from ``transfer.errors``.
"""

from transfer.errors.access import (
    AccessDenied,
    CrossSiteRefused,
    DestinationRefused,
    EncryptedResourceRefused,
    EventsDisabled,
    InsufficientScope,
    InvalidToken,
    KeyExpired,
    NotFound,
    SignatureInvalid,
    TaskNotFound,
    TokenAlgorithmRefused,
    TokenAudienceMismatch,
    TokenExpired,
    TokenInactive,
    TokenIssuerUnknown,
    TokenKeyUnknown,
    TokenMalformed,
    TokenNotYetValid,
    TokenSignatureInvalid,
    TokenTypeRefused,
    ToolUnavailable,
    Unauthenticated,
    UploadForbidden,
    UploadRefused,
    UrlExpired,
)
from transfer.errors.base import TransferError
from transfer.errors.content import (
    AppendTooLarge,
    ChecksumMismatch,
    ChunkChecksumMismatch,
    DecodedSizeLimit,
    DigestMismatch,
    HeadersTooLarge,
    IntegrityError,
    ManifestTooLarge,
    QuotaExceeded,
    SizeMismatch,
    TooLarge,
)
from transfer.errors.limits import (
    MailboxFull,
    TooManyAuthorizations,
    TooManyJobs,
    TooManyPlans,
    TooManySessions,
    TooManySubscriptions,
)
from transfer.errors.protocol import (
    MethodNotAllowed,
    PreconditionFailed,
    RangeNotSatisfiable,
    TusChecksumMismatch,
    TusVersionUnsupported,
    UnsupportedMediaType,
)
from transfer.errors.requests import (
    AppendTooSmall,
    ChunkLengthMismatch,
    ChunkNotInManifest,
    ChunkOutOfRange,
    ContentLengthMismatch,
    HopLimitExceeded,
    HostNotAllowed,
    InconsistentUploadLength,
    InvalidCursor,
    InvalidDescriptor,
    InvalidDigestHeader,
    InvalidEnvelope,
    InvalidHost,
    InvalidManifest,
    InvalidRequest,
    JsonTooDeep,
    KeyRecordsRefused,
    LifetimeTooLong,
    MalformedBody,
    ManifestSizeMismatch,
    NoEnvelopeInPrompt,
    TPContractRefMismatch,
    TPContractRefMissing,
    TPMessageIdMismatch,
    TPMessageIdMissing,
    TPVersionUnsupported,
    UnsupportedEncoding,
    UnsupportedMessageType,
    UnsupportedOperation,
    UploadBelowMinSize,
)
from transfer.errors.service import (
    AssetsMissing,
    BridgeFailed,
    ClientDisconnected,
    HeartbeatTimeout,
    HookUnavailable,
    InsufficientStorage,
    IssuerUnavailable,
    McpUnavailable,
    RemoteError,
    RequestTimeout,
    ShuttingDown,
    SigningKeysRequired,
    StorageUnavailable,
    TooManyConnections,
    UpstreamTimeout,
)
from transfer.errors.state import (
    BundleExpired,
    ChunkConflict,
    ChunkNotReady,
    ChunksMissing,
    Conflict,
    DirectUploadUnsupported,
    FileExpired,
    Gone,
    KeyNameTaken,
    PlanIncomplete,
    RecordBusy,
    SessionAborted,
    SessionCompleted,
    SessionExpired,
    SessionIncomplete,
    UploadCompleted,
    UploadOffsetMismatch,
    VersionConflict,
)
from transfer.errors.translation import (
    _all_subclasses,
    error_from_payload,
    errors_by_code,
    from_storage_error,
    storage_errors_translated,
)

__all__ = [
    "InvalidHost",
    "TooManyConnections",
    "UploadRefused",
    "EventsDisabled",
    "HookUnavailable",
    "KeyExpired",
    "InvalidToken",
    "TokenExpired",
    "TokenNotYetValid",
    "TokenAudienceMismatch",
    "TokenSignatureInvalid",
    "TokenAlgorithmRefused",
    "TokenKeyUnknown",
    "TokenIssuerUnknown",
    "TokenTypeRefused",
    "TokenMalformed",
    "TokenInactive",
    "KeyRecordsRefused",
    "IssuerUnavailable",
    "KeyNameTaken",
    "AccessDenied",
    "AppendTooLarge",
    "AppendTooSmall",
    "AssetsMissing",
    "BridgeFailed",
    "BundleExpired",
    "ChecksumMismatch",
    "ChunkChecksumMismatch",
    "ChunkConflict",
    "ChunkLengthMismatch",
    "ChunkNotInManifest",
    "ChunkNotReady",
    "ChunkOutOfRange",
    "ChunksMissing",
    "ClientDisconnected",
    "Conflict",
    "ContentLengthMismatch",
    "CrossSiteRefused",
    "DecodedSizeLimit",
    "DestinationRefused",
    "DigestMismatch",
    "DirectUploadUnsupported",
    "EncryptedResourceRefused",
    "FileExpired",
    "Gone",
    "HeadersTooLarge",
    "HeartbeatTimeout",
    "HopLimitExceeded",
    "HostNotAllowed",
    "InconsistentUploadLength",
    "InsufficientScope",
    "InsufficientStorage",
    "IntegrityError",
    "InvalidCursor",
    "InvalidDescriptor",
    "InvalidDigestHeader",
    "InvalidEnvelope",
    "InvalidManifest",
    "InvalidRequest",
    "JsonTooDeep",
    "LifetimeTooLong",
    "MailboxFull",
    "MalformedBody",
    "ManifestSizeMismatch",
    "ManifestTooLarge",
    "McpUnavailable",
    "MethodNotAllowed",
    "NoEnvelopeInPrompt",
    "NotFound",
    "PlanIncomplete",
    "PreconditionFailed",
    "QuotaExceeded",
    "RangeNotSatisfiable",
    "RecordBusy",
    "RemoteError",
    "RequestTimeout",
    "SessionAborted",
    "SessionCompleted",
    "SessionExpired",
    "SessionIncomplete",
    "ShuttingDown",
    "SignatureInvalid",
    "SigningKeysRequired",
    "SizeMismatch",
    "StorageUnavailable",
    "TPContractRefMismatch",
    "TPContractRefMissing",
    "TPMessageIdMismatch",
    "TPMessageIdMissing",
    "TPVersionUnsupported",
    "TaskNotFound",
    "TooLarge",
    "TooManyAuthorizations",
    "TooManyJobs",
    "TooManyPlans",
    "TooManySessions",
    "TooManySubscriptions",
    "ToolUnavailable",
    "TransferError",
    "TusChecksumMismatch",
    "TusVersionUnsupported",
    "Unauthenticated",
    "UnsupportedEncoding",
    "UnsupportedMediaType",
    "UnsupportedMessageType",
    "UnsupportedOperation",
    "UploadBelowMinSize",
    "UploadCompleted",
    "UploadForbidden",
    "UploadOffsetMismatch",
    "UpstreamTimeout",
    "UrlExpired",
    "VersionConflict",
    "_all_subclasses",
    "error_from_payload",
    "errors_by_code",
    "from_storage_error",
    "storage_errors_translated",
]
