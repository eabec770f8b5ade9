"""Telepathy Protocol (TP) chapter 9, transport bindings: the MessageEnvelope, its five bindings, cross-protocol
tracing and prompt embedding. Pure functions: no sockets, no storage.

Rules kept here (seed 002):
- one envelope is a UTF-8 JSON object with ``tp_version``, ``message_id``, ``message_type`` and ``payload``
  (``sender``, ``receiver``, ``protocol_contract_ref``, ``signature``, ``trace_info`` when present keep their shape);
- ``trace_info = {original_protocol, original_message_id, hop_count}``; every hop increments ``hop_count``, which
  must stay <= 5 (TP-TRA001);
- a bridge never alters the envelope's bytes: :func:`with_trace_info` rewrites the ``trace_info`` member and nothing
  else, byte for byte (so a signature over the other members still verifies);
- prompt embedding wraps the envelope in a ```` ```tp-envelope ```` fence; security level ``basic``; a resource
  that ``requires_encryption`` is refused (TP-TRA031); no fence in a text is TP-TRA030.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from transfer.errors import (
    EncryptedResourceRefused,
    HopLimitExceeded,
    InvalidEnvelope,
    NoEnvelopeInPrompt,
    TooLarge,
    TPVersionUnsupported,
    TransferError,
)

TP_VERSION = "1.0.0"
MAX_HOPS = 5
MEDIA_TYPE = "application/tp+json"
WEBSOCKET_SUBPROTOCOL = "tp.v1"


class Binding(StrEnum):
    """The five transport bindings (§9.1); the values are what ``trace_info.original_protocol`` carries."""

    NATIVE_TP = "native_tp"
    A2A_JSONRPC = "a2a_jsonrpc"
    MCP_TOOL_CALL = "mcp_tool_call"
    REST_API = "rest_api"
    PROMPT_EMBEDDING = "prompt_embedding"


# message_type -> (A2A JSON-RPC method §9.3.2, REST path §9.5.1; "{id}" where the path carries an id)
MESSAGE_TYPES: dict[str, tuple[str, str]] = {
    "identity_proof": ("tp.identity.proof", "identity/proof"),
    "profile_exchange": ("tp.profile.exchange", "profile/exchange"),
    "negotiate_request": ("tp.negotiate.request", "negotiate/request"),
    "negotiate_response": ("tp.negotiate.response", "negotiate/response"),
    "context_create": ("tp.context.create", "context/create"),
    "context_update": ("tp.context.update", "context/{id}/update"),
    "context_sync": ("tp.context.sync", "context/{id}/sync"),
    "context_revoke": ("tp.context.revoke", "context/{id}/revoke"),
    "resource_mount": ("tp.resource.mount", "resource/mount"),
    "resource_unmount": ("tp.resource.unmount", "resource/unmount"),
    "resource_notify": ("tp.resource.notify", "resource/notify"),
    "goal_propose": ("tp.goal.propose", "goal/propose"),
    "goal_negotiate": ("tp.goal.negotiate", "goal/{id}/negotiate"),
    "goal_accept": ("tp.goal.accept", "goal/{id}/accept"),
    "goal_reject": ("tp.goal.reject", "goal/{id}/reject"),
    "goal_result": ("tp.goal.result", "goal/{id}/result"),
    "consultation_request": ("tp.consultation.request", "consultation/request"),
    "consultation_response": ("tp.consultation.response", "consultation/{id}/response"),
    "error": ("tp.error", ""),
}
METHOD_TO_TYPE = {method: mtype for mtype, (method, _) in MESSAGE_TYPES.items()}

# what this service handles; the other types are valid TP but not ours (answered unsupported_message_type)
RESOURCE_TYPES = ("resource_mount", "resource_unmount", "resource_notify")


@dataclass(frozen=True, slots=True)
class TraceInfo:
    """A TP envelope's ``trace_info``: where a message came from and how many hops it has made."""

    original_protocol: str
    original_message_id: str
    hop_count: int

    def to_json(self) -> dict[str, Any]:
        """The ``trace_info`` object of an envelope."""
        return {
            "original_protocol": self.original_protocol,
            "original_message_id": self.original_message_id,
            "hop_count": self.hop_count,
        }


@dataclass(frozen=True, slots=True)
class Envelope:
    """A parsed MessageEnvelope that keeps the exact bytes it was parsed from (``raw``)."""

    raw: bytes
    doc: dict[str, Any]

    @property
    def message_id(self) -> str:
        """The envelope's ``message_id``."""
        return str(self.doc["message_id"])

    @property
    def message_type(self) -> str:
        """The envelope's ``message_type``."""
        return str(self.doc["message_type"])

    @property
    def payload(self) -> dict[str, Any]:
        """The envelope's ``payload`` object."""
        payload: dict[str, Any] = self.doc["payload"]
        return payload

    @property
    def sender(self) -> Any:
        """The envelope's ``sender``, as sent."""
        return self.doc.get("sender")

    @property
    def receiver(self) -> Any:
        """The envelope's ``receiver``, as sent."""
        return self.doc.get("receiver")

    @property
    def contract_ref(self) -> str | None:
        """The envelope's ``protocol_contract_ref``, if any."""
        ref = self.doc.get("protocol_contract_ref")
        return None if ref is None else str(ref)

    @property
    def trace(self) -> TraceInfo | None:
        """The envelope's ``trace_info``, if any."""
        t = self.doc.get("trace_info")
        if t is None:
            return None
        return TraceInfo(str(t["original_protocol"]), str(t["original_message_id"]), int(t["hop_count"]))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise InvalidEnvelope(f"member {key!r} appears twice")  # two parsers could read two different envelopes
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise InvalidEnvelope(f"{name} is not JSON")


def loads_strict(raw: bytes | str) -> Any:
    """JSON with no duplicate members and no NaN/Infinity; raises InvalidEnvelope."""
    try:
        return json.loads(raw, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except InvalidEnvelope:
        raise
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise InvalidEnvelope(f"not valid UTF-8 JSON: {exc}") from None


def _identity_ok(value: Any) -> bool:
    return value is None or (isinstance(value, str) and len(value) <= 1024) or isinstance(value, dict)


def validate_envelope(doc: Any, raw: bytes | None = None) -> Envelope:
    """Check the envelope's shape; ``raw`` (the bytes it came from) is kept for byte-exact forwarding."""
    if not isinstance(doc, dict):
        raise InvalidEnvelope("a TP MessageEnvelope is a JSON object")
    for name in ("tp_version", "message_id", "message_type"):
        value = doc.get(name)
        if not isinstance(value, str) or not value:
            raise InvalidEnvelope(f"{name} must be a non-empty string")
        if len(value) > 256:
            raise InvalidEnvelope(f"{name} is longer than 256 characters")
    if doc["tp_version"].split(".")[0] != TP_VERSION.split(".")[0]:
        raise TPVersionUnsupported(
            f"tp_version {doc['tp_version']!r} is not supported; this service speaks {TP_VERSION}",
            supported=[TP_VERSION],
        )
    if not isinstance(doc.get("payload"), dict):
        raise InvalidEnvelope("payload must be a JSON object")
    for name in ("sender", "receiver"):
        if not _identity_ok(doc.get(name)):
            raise InvalidEnvelope(f"{name} must be a string or an object")
    ref = doc.get("protocol_contract_ref")
    if ref is not None and not isinstance(ref, str):
        raise InvalidEnvelope("protocol_contract_ref must be a string")
    trace = doc.get("trace_info")
    if trace is not None:
        if not isinstance(trace, dict):
            raise InvalidEnvelope("trace_info must be an object")
        hops = trace.get("hop_count")
        if not isinstance(hops, int) or isinstance(hops, bool) or hops < 0:
            raise InvalidEnvelope("trace_info.hop_count must be a non-negative integer")
        if trace.get("original_protocol") not in set(Binding):
            raise InvalidEnvelope(f"trace_info.original_protocol must be one of {', '.join(Binding)}")
        if not isinstance(trace.get("original_message_id"), str) or not trace["original_message_id"]:
            raise InvalidEnvelope("trace_info.original_message_id must be a non-empty string")
        if hops > MAX_HOPS:
            raise HopLimitExceeded(f"hop_count {hops} is above {MAX_HOPS}", hop_count=hops)
    if raw is None:
        raw = dumps(doc)
    return Envelope(raw, doc)


def parse_envelope(raw: bytes, max_size: int) -> Envelope:
    """Bytes as received -> a validated Envelope (too large: TooLarge; not an envelope: InvalidEnvelope)."""
    if len(raw) > max_size:
        raise TooLarge(f"envelope is larger than {max_size} bytes", limit=max_size)
    return validate_envelope(loads_strict(raw), raw)


def dumps(doc: Any) -> bytes:
    """``doc`` as compact UTF-8 JSON (the bytes a bridge forwards unchanged)."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# -- byte-exact rewriting of trace_info (§9.8) -----------------------------------------------------------------

_WS = " \t\n\r"


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def member_spans(text: str) -> dict[str, tuple[int, int]]:
    """For a JSON object text: each top-level member name -> (start, end) of its *value* text."""
    decoder = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if i >= len(text) or text[i] != "{":
        raise InvalidEnvelope("a TP MessageEnvelope is a JSON object")
    spans: dict[str, tuple[int, int]] = {}
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        return spans
    while True:
        if i >= len(text) or text[i] != '"':
            raise InvalidEnvelope("malformed JSON object")
        key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != ":":
            raise InvalidEnvelope("malformed JSON object")
        start = _skip_ws(text, i + 1)
        try:
            _, end = decoder.raw_decode(text, start)
        except ValueError as exc:
            raise InvalidEnvelope(f"malformed JSON: {exc}") from None
        spans[key] = (start, end)
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "}":
            return spans
        raise InvalidEnvelope("malformed JSON object")


def element_spans(text: str) -> list[tuple[int, int]]:
    """For a JSON array text: (start, end) of each element's text."""
    decoder = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if i >= len(text) or text[i] != "[":
        raise InvalidEnvelope("not a JSON array")
    spans: list[tuple[int, int]] = []
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "]":
        return spans
    while True:
        try:
            _, end = decoder.raw_decode(text, i)
        except ValueError as exc:
            raise InvalidEnvelope(f"malformed JSON: {exc}") from None
        spans.append((i, end))
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "]":
            return spans
        raise InvalidEnvelope("malformed JSON array")


def with_trace_info(raw: bytes, trace: TraceInfo) -> bytes:
    """The same envelope bytes with only the value of ``trace_info`` replaced (or the member appended)."""
    text = raw.decode("utf-8")
    spans = member_spans(text)
    value = json.dumps(trace.to_json(), separators=(",", ":"))
    if "trace_info" in spans:
        start, end = spans["trace_info"]
        return (text[:start] + value + text[end:]).encode("utf-8")
    close = text.rstrip(_WS)
    assert close.endswith("}")
    body = close[:-1]
    separator = "," if spans else ""
    return (body + separator + '"trace_info":' + value + "}" + text[len(close) :]).encode("utf-8")


def next_hop(envelope: Envelope, binding: Binding) -> TraceInfo:
    """The trace_info for forwarding ``envelope`` one more hop (first hop: started on ``binding``)."""
    trace = envelope.trace
    if trace is None:
        trace = TraceInfo(binding.value, envelope.message_id, 0)
    hops = trace.hop_count + 1
    if hops > MAX_HOPS:
        raise HopLimitExceeded(f"forwarding would make hop_count {hops}, above {MAX_HOPS}", hop_count=hops)
    return TraceInfo(trace.original_protocol, trace.original_message_id, hops)


def forward(envelope: Envelope, binding: Binding) -> bytes:
    """The bytes a bridge passes on: identical but for an incremented trace_info."""
    return with_trace_info(envelope.raw, next_hop(envelope, binding))


# -- building messages ---------------------------------------------------------------------------------------------


def new_message_id() -> str:
    """A new random message id (a UUID)."""
    return str(uuid.uuid4())


def now_rfc3339(seconds: float) -> str:
    """``seconds`` (Unix time) as an RFC 3339 UTC timestamp, to the second."""
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def make_envelope(
    message_type: str,
    payload: dict[str, Any],
    *,
    sender: Any,
    receiver: Any = None,
    contract_ref: str | None = None,
    binding: Binding,
    timestamp: float,
    in_reply_to: str | None = None,
) -> Envelope:
    """A new message from this service (its own trace starts here, hop_count 0)."""
    message_id = new_message_id()
    doc: dict[str, Any] = {
        "tp_version": TP_VERSION,
        "message_id": message_id,
        "message_type": message_type,
        "timestamp": now_rfc3339(timestamp),
        "sender": sender,
    }
    if receiver is not None:
        doc["receiver"] = receiver
    if contract_ref is not None:
        doc["protocol_contract_ref"] = contract_ref
    if in_reply_to is not None:
        doc["in_reply_to"] = in_reply_to
    doc["payload"] = payload
    doc["trace_info"] = TraceInfo(binding.value, message_id, 0).to_json()
    return Envelope(dumps(doc), doc)


def tp_error(exc: TransferError, related_message_id: str | None = None) -> dict[str, Any]:
    """The TPError body of the HTTP bindings: our code (TP-TRA0xx for transport failures), message, status."""
    body: dict[str, Any] = {
        "code": exc.code,
        "message": exc.message,
        "status": exc.status,
        "retryable": exc.retryable,
    }
    if related_message_id:
        body["related_message_id"] = related_message_id
    if exc.detail:
        body["detail"] = exc.detail
    return body


# -- prompt embedding (§9.6) ---------------------------------------------------------------------------------------

SECURITY_LEVEL = "basic"
_FENCE = re.compile(r"^[ \t]*```tp-envelope[ \t]*\r?\n(.*?)^[ \t]*```[ \t]*$", re.S | re.M)

PRIMER = (
    "Telepathy Protocol (TP) in brief: agents exchange JSON MessageEnvelopes (tp_version, message_id, "
    "message_type, sender, receiver, payload, trace_info). A message embedded in a prompt sits in a fenced block "
    "marked tp-envelope. To answer, reply with exactly one such block holding your TP message. This channel has "
    "security level basic: no encryption, signatures may not survive, no private data."
)


def requires_encryption(value: Any) -> bool:
    """Whether any object inside ``value`` says ``requires_encryption: true``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("requires_encryption") is True:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def embed_in_prompt(envelope: Envelope, speaker: str, *, primer: bool = True) -> str:
    """The envelope as a prompt (§9.6.2): preamble, the fenced block with the exact bytes, the reply request."""
    if requires_encryption(envelope.payload):
        raise EncryptedResourceRefused("prompt embedding may not carry a resource that requires encryption")
    lines = []
    if primer:
        lines += [PRIMER, ""]
    lines += [
        f"I ({speaker}) would like to work with you under the Telepathy Protocol (security level: {SECURITY_LEVEL}).",
        "Please process the following TP message:",
        "",
        "```tp-envelope",
        envelope.raw.decode("utf-8"),
        "```",
        "",
        "If you support TP, reply with one TP message in the same format. Otherwise, explain in natural language "
        "why you cannot process it.",
    ]
    return "\n".join(lines) + "\n"


def extract_from_prompt(text: str, max_size: int) -> list[Envelope]:
    """Every ```` ```tp-envelope ```` block of ``text``, parsed; none: TP-TRA030. A block asking for an encrypted
    resource: TP-TRA031 (this binding's security level is basic)."""
    blocks = [m.group(1).rstrip("\r\n") for m in _FENCE.finditer(text)]
    if not blocks:
        raise NoEnvelopeInPrompt("no ```tp-envelope fenced block found in the text")
    out = []
    for block in blocks:
        envelope = parse_envelope(block.encode("utf-8"), max_size)
        if requires_encryption(envelope.payload):
            raise EncryptedResourceRefused(
                "prompt embedding may not carry a resource that requires encryption",
                related_message_id=envelope.message_id,
            )
        out.append(envelope)
    return out
