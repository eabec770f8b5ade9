"""Resumable Uploads for HTTP (draft-ietf-httpbis-resumable-upload, interop version 8): the header fields and
problem types, without I/O.

Header fields are Structured Fields (RFC 9651), parsed and serialised with ``http-sf`` (Mark Nottingham's library,
the reference implementation's author; typed, tested against the RFC test suite). The draft's rule for a field that
does not parse or has the wrong type is "ignore the entire field" (§4.1.1-4.1.3): :func:`boolean_item` and
:func:`integer_item` answer ``None`` then, and the front door decides what a missing field means for its request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import http_sf

from transfer.core.numerals import MAX_DIGITS

INTEROP_VERSION = 8  # draft §"Draft Version Identification": bumped on every breaking change
INTEROP_HEADER = "upload-draft-interop-version"
PARTIAL_UPLOAD = "application/partial-upload"  # draft §8: the media type of an append
PROBLEM_JSON = "application/problem+json"  # RFC 9457 §3

PROBLEM_BASE = "https://iana.org/assignments/http-problem-types#"
MISMATCHING_OFFSET = PROBLEM_BASE + "mismatching-upload-offset"  # draft §9.1
INCONSISTENT_LENGTH = PROBLEM_BASE + "inconsistent-upload-length"  # draft §9.2

_MAX_INTEGER = 10**MAX_DIGITS - 1  # the service's bound for any count (RFC 9651 allows 15 digits)


def _item(value: str | None) -> Any:
    if value is None:
        return None
    try:
        parsed = http_sf.parse(value.encode("latin-1"), tltype="item")
    except (http_sf.StructuredFieldError, UnicodeEncodeError, ValueError, TypeError):
        return None
    return parsed[0] if isinstance(parsed, tuple) else None  # (bare item, parameters)


def boolean_item(value: str | None) -> bool | None:
    """An Item Structured Header Field holding a Boolean (``Upload-Complete``, draft §4.1.2); ``None`` when the
    field is absent or is anything else (the draft: other values cause the entire field to be ignored)."""
    bare = _item(value)
    return bare if isinstance(bare, bool) else None


def integer_item(value: str | None) -> int | None:
    """An Item Structured Header Field holding a non-negative Integer (``Upload-Offset``, ``Upload-Length``,
    draft §4.1.1 and §4.1.3); ``None`` when absent, negative, not an Integer, or beyond the service's bound."""
    bare = _item(value)
    if isinstance(bare, bool) or not isinstance(bare, int) or not 0 <= bare <= _MAX_INTEGER:
        return None
    return bare


def interop_version(value: str | None) -> int | None:
    """The client's ``Upload-Draft-Interop-Version`` (an Integer), if it sent one that parses."""
    return integer_item(value)


def serialize_boolean(value: bool) -> str:
    """``value`` as a structured-field boolean (RFC 8941 §3.3.6)."""
    return http_sf.ser(value)


@dataclass(frozen=True, slots=True)
class UploadLimits:
    """The ``Upload-Limit`` dictionary (draft §4.1.4). ``max_age`` is the remaining lifetime in seconds."""

    max_size: int
    max_age: int | None = None

    def header(self) -> str:
        """The ``Upload-Limit`` field value (a structured-field dictionary)."""
        members: dict[str, Any] = {"max-size": self.max_size}
        if self.max_age is not None:
            members["max-age"] = max(0, self.max_age)
        return http_sf.ser(members)


def problem(type_uri: str, title: str, status: int, **members: Any) -> dict[str, Any]:
    """An RFC 9457 problem details object (§3.1 members, then extension members as given)."""
    return {"type": type_uri, "title": title, "status": status, **members}


def wants_sha256(value: str | None) -> bool:
    """Whether ``Want-Repr-Digest`` (RFC 9530 §4) asks for sha-256, i.e. names it with a non-zero preference.
    A field that does not parse, or is absent, asks for nothing in particular."""
    if value is None:
        return False
    try:
        members = http_sf.parse(value.encode("latin-1"), tltype="dictionary")
    except (http_sf.StructuredFieldError, UnicodeEncodeError, ValueError, TypeError):
        return False
    if not isinstance(members, dict):
        return False
    member = members.get("sha-256")
    if member is None:
        return False
    weight = member[0] if isinstance(member, tuple) else member
    return isinstance(weight, int) and not isinstance(weight, bool) and weight > 0
