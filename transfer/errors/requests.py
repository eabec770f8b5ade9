"""The request is not one the service can act on (400 and its kin: 415, 422, 501): malformed, inconsistent, or
beyond what the protocol allows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transfer.errors.base import TransferError


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


class AppendTooSmall(InvalidRequest):
    """draft-ietf-httpbis-resumable-upload §4.1.4: a creation or append request that does not complete the upload
    carries less than ``min-append-size``."""

    code = "append_too_small"


class UploadBelowMinSize(InvalidRequest):
    """draft-ietf-httpbis-resumable-upload §4.1.4: an upload smaller than ``min-size`` (or of unknown length) is not
    offered resumability; one that is not sent whole in one request cannot be taken."""

    code = "upload_below_min_size"


class MalformedBody(InvalidRequest):
    code = "malformed_body"


class JsonTooDeep(MalformedBody):
    """JSON nested deeper than the service parses (``transfer.core.jsontext.MAX_DEPTH`` levels): refused before
    anything is built from it, where Python's own parser would run out of stack."""

    code = "json_too_deep"


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


class KeyRecordsRefused(InvalidRequest):
    code = "key_records_refused"


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
