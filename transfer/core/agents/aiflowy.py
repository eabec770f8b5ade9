"""AIFlowy Chat Protocol 1.1 (seed 001): the envelope and its Server-Sent Events framing.

SSE event names are exactly ``message``, ``error`` and ``done`` (business meaning lives in ``domain``/``type``,
never in the event name); each ``data:`` line is one JSON envelope::

    {"protocol": "aiflowy-chat", "version": "1.1", "domain", "type", "conversation_id",
     "message_id"?, "index"?, "payload", "meta"?}

After an ``error`` event the stream ends. Keep-alives are SSE comment lines (``: keep-alive``), which clients ignore.

Event ids and reconnection (WHATWG HTML §9.2, server-sent events). An ``EventSource`` reconnects by itself whenever
the connection closes, sending the last ``id`` it saw as ``Last-Event-ID``; only a response that is not a 200
``text/event-stream`` makes it stop ("a client can be told to stop reconnecting using the HTTP 204 No Content
response code"). So an event's id is its ``index`` (``"7"``), except the stream's terminal event (``error`` or
``done``), whose id also says that it was the last (``"9-end"``; ``"end"`` when it has no index). A reconnect that
presents a terminal id is answered 204 without looking anything up: the answer holds on any replica, after the job
is forgotten, and reveals nothing about the job.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from transfer.core.numerals import parse_count
from transfer.errors import InvalidEnvelope, InvalidRequest

PROTOCOL = "aiflowy-chat"
VERSION = "1.1"
DOMAINS = frozenset({"llm", "tool", "system", "business", "workflow", "interaction", "debug"})
SSE_EVENTS = ("message", "error", "done")
TERMINAL_EVENTS = ("error", "done")  # either one ends the stream: nothing is ever sent after it
TERMINAL_ID = "end"
MEDIA_TYPE = "text/event-stream"
# a comment line with no blank line after it: ignored by every parser, and never dispatched as an empty event
# (some parsers dispatch a blank-line-terminated block that held only a comment once an id was seen)
KEEP_ALIVE = b": keep-alive\n"


def new_conversation_id() -> str:
    """A new random AIFlowy conversation id (``conv_…``)."""
    return "conv_" + secrets.token_hex(12)


def envelope(
    domain: str,
    type_: str,
    payload: dict[str, Any],
    *,
    conversation_id: str,
    message_id: str | None = None,
    index: int | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One AIFlowy Chat Protocol 1.1 envelope with these fields."""
    doc: dict[str, Any] = {
        "protocol": PROTOCOL,
        "version": VERSION,
        "domain": domain,
        "type": type_,
        "conversation_id": conversation_id,
    }
    if message_id is not None:
        doc["message_id"] = message_id
    if index is not None:
        doc["index"] = index
    doc["payload"] = payload
    if meta is not None:
        doc["meta"] = meta
    return validate(doc)


def validate(doc: Any) -> dict[str, Any]:
    """Check one envelope against §4 (required fields and their types); InvalidEnvelope otherwise."""
    if not isinstance(doc, dict):
        raise InvalidEnvelope("an aiflowy-chat envelope is a JSON object")
    if doc.get("protocol") != PROTOCOL:
        raise InvalidEnvelope(f"protocol must be {PROTOCOL!r}")
    if not isinstance(doc.get("version"), str) or doc["version"].split(".")[0] != VERSION.split(".")[0]:
        raise InvalidEnvelope(f"version must be {VERSION!r} (or another 1.x)")
    if doc.get("domain") not in DOMAINS:
        raise InvalidEnvelope(f"domain must be one of {', '.join(sorted(DOMAINS))}")
    for name in ("type", "conversation_id"):
        if not isinstance(doc.get(name), str) or not doc[name]:
            raise InvalidEnvelope(f"{name} must be a non-empty string")
    if "message_id" in doc and not isinstance(doc["message_id"], str):
        raise InvalidEnvelope("message_id must be a string")
    index = doc.get("index")
    if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0):
        raise InvalidEnvelope("index must be a non-negative integer")
    if not isinstance(doc.get("payload", {}), dict):
        raise InvalidEnvelope("payload must be an object")
    if "payload" not in doc and doc.get("type") != "done":
        raise InvalidEnvelope("payload is required")
    if "meta" in doc and not isinstance(doc["meta"], dict):
        raise InvalidEnvelope("meta must be an object")
    return doc


def event_id(event: str, index: int | None) -> str | None:
    """The SSE ``id`` of an event: its index, marked ``-end`` on a terminal event (see the module docstring)."""
    if event in TERMINAL_EVENTS:
        return TERMINAL_ID if index is None else f"{index}-{TERMINAL_ID}"
    return None if index is None else str(index)


def parse_last_event_id(value: str, field: str = "Last-Event-ID") -> tuple[int, bool]:
    """``(after, terminal)`` from an id this stream sent: resume after index ``after`` (-1: from the start);
    ``terminal`` when the client already saw the stream's last event. InvalidRequest for anything else."""
    value = value.strip(" \t")
    if value == "-1":  # before the first event: what a client may echo back
        return -1, False
    if value == TERMINAL_ID:
        return -1, True
    index, sep, suffix = value.partition("-")
    if sep and suffix != TERMINAL_ID:
        raise InvalidRequest(f"{field} must be an event id this stream sent", field=field)
    return parse_count(index, field), bool(sep)


def sse_frame(event: str, doc: dict[str, Any], index: int | None = None, retry_ms: int | None = None) -> bytes:
    """One SSE event: ``id`` (see :func:`event_id`), ``event`` and a single-line ``data`` holding the envelope
    (``retry`` when given)."""
    if event not in SSE_EVENTS:
        raise ValueError(f"SSE event name must be one of {SSE_EVENTS}")
    lines = [f"retry: {retry_ms}"] if retry_ms is not None else []
    sse_id = event_id(event, index)
    if sse_id is not None:
        lines.append(f"id: {sse_id}")
    lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode("utf-8")
