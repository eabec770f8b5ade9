"""Resumable Uploads for HTTP (draft-ietf-httpbis-resumable-upload, interop version 9; 8 still spoken): the header
fields, limits and problem types, without I/O. The server's front door (:mod:`transfer.api.resumable`) and the
client (:mod:`transfer.client.resumable`) both read the protocol from here.

Which text: the working group's editor's copy at the interop-version bump to 9 (httpwg/http-extensions PR #3476,
July 2026, the revision published as -12) with the changes merged after it that a server or client can observe:
the integrity section removed (#3471; digests are plain RFC 9530 now), ``Upload-Limit`` on every limit violation
(#3466), offset and length that must agree on completion (#3463), ``Upload-Complete``/``Upload-Length`` no longer
required on offset retrieval (#3493). The interop version moves only on breaking changes (appendix "Draft Version
Identification"); :data:`CURRENT_VERSION` is the one to compare with the draft's "The current interop version is N".

Header fields are Structured Fields (RFC 9651), parsed and serialised with ``http-sf`` (Mark Nottingham's library,
the reference implementation's author; typed, tested against the RFC test suite). The draft's rule for a field that
does not parse or has the wrong type is "ignore the entire field" (§4.1.1-4.1.4): the parsers here answer ``None``
then, and the caller decides what a missing field means for its request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import http_sf

from transfer.core.numerals import MAX_DIGITS
from transfer.errors import AppendTooLarge, AppendTooSmall

CURRENT_VERSION: Final = 9  # draft appendix "Draft Version Identification" (-12 on, PR #3476)
SUPPORTED_VERSIONS: Final = frozenset({8, 9})  # 8: draft -09 to -11, still pinned by older clients
INTEROP_VERSION: Final = CURRENT_VERSION  # the name earlier code imported
INTEROP_HEADER: Final = "upload-draft-interop-version"
PARTIAL_UPLOAD: Final = "application/partial-upload"  # draft §"Media Type application/partial-upload"
PROBLEM_JSON: Final = "application/problem+json"  # RFC 9457 §3

PROBLEM_BASE: Final = "https://iana.org/assignments/http-problem-types#"
MISMATCHING_OFFSET: Final = PROBLEM_BASE + "mismatching-upload-offset"  # draft §"Mismatching Offset"
INCONSISTENT_LENGTH: Final = PROBLEM_BASE + "inconsistent-upload-length"  # draft §"Inconsistent Length"
COMPLETED_UPLOAD: Final = PROBLEM_BASE + "completed-upload"  # interop 8 (-11 §7.2) only: removed in -12

_MAX_INTEGER: Final = 10**MAX_DIGITS - 1  # the service's bound for any count (RFC 9651 allows 15 digits)


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
    """The ``Upload-Draft-Interop-Version`` a message carries (an Integer), if it carries one that parses."""
    return integer_item(value)


def spoken_version(value: str | None) -> int | None:
    """The interop version to answer a request in: the one it announces when this implementation speaks it, else
    ``None`` (then no ``104`` may be sent: appendix "Draft Version Identification")."""
    version = interop_version(value)
    return version if version in SUPPORTED_VERSIONS else None


def serialize_boolean(value: bool) -> str:
    """``value`` as a structured-field boolean (RFC 9651 §3.3.6)."""
    return http_sf.ser(value)


@dataclass(frozen=True, slots=True)
class UploadLimits:
    """The ``Upload-Limit`` dictionary (draft §4.1.4): every member the draft defines, ``None`` when not set.

    ``max_size``/``min_size`` bound the representation; ``max_append_size``/``min_append_size`` the content of one
    creation or append request (``min_append_size`` does not apply to a request without content or to one that
    completes the upload); ``max_age`` is the upload resource's remaining lifetime in seconds."""

    max_size: int | None = None
    min_size: int | None = None
    max_append_size: int | None = None
    min_append_size: int | None = None
    max_age: int | None = None

    def header(self) -> str:
        """The ``Upload-Limit`` field value (a structured-field dictionary); ``min-size=0`` when nothing is limited
        (§4.1.4: never an empty value)."""
        members: dict[str, Any] = {key: max(0, value) for key, value in self.members().items()}
        return http_sf.ser(members or {"min-size": 0})

    def members(self) -> dict[str, int]:
        """The limits that are set, by their field names."""
        named = {
            "max-size": self.max_size,
            "min-size": self.min_size,
            "max-append-size": self.max_append_size,
            "min-append-size": self.min_append_size,
            "max-age": self.max_age,
        }
        return {k: v for k, v in named.items() if v is not None}


_LIMIT_FIELDS: Final = {
    "max-size": "max_size",
    "min-size": "min_size",
    "max-append-size": "max_append_size",
    "min-append-size": "min_append_size",
    "max-age": "max_age",
}


def parse_upload_limit(value: str | None) -> UploadLimits | None:
    """An ``Upload-Limit`` field as a receiver reads it (§4.1.4): unknown members are ignored; a known member that is
    not a non-negative Integer makes the whole field ignored (``None``), as does a value that is not a Dictionary."""
    if value is None:
        return None
    try:
        members = http_sf.parse(value.encode("latin-1"), tltype="dictionary")
    except (http_sf.StructuredFieldError, UnicodeEncodeError, ValueError, TypeError):
        return None
    if not isinstance(members, dict):
        return None
    found: dict[str, int] = {}
    for key, member in members.items():
        field = _LIMIT_FIELDS.get(key)
        if field is None:
            continue  # a member this draft does not define: ignored
        bare = member[0] if isinstance(member, tuple) else member
        if isinstance(bare, bool) or not isinstance(bare, int) or not 0 <= bare <= _MAX_INTEGER:
            return None
        found[field] = bare
    return UploadLimits(**found)


def check_append_size(limits: UploadLimits, content: int | None, *, completes: bool, creation: bool = False) -> None:
    """Refuse a creation or append request carrying ``content`` bytes (``None``: not known before the body ends)
    that breaks the append limits (§4.1.4): AppendTooLarge above ``max-append-size`` (every request), AppendTooSmall
    below ``min-append-size`` unless the request completes the upload or is a creation without content."""
    if content is None:
        return
    if limits.max_append_size is not None and content > limits.max_append_size:
        raise AppendTooLarge(
            f"the request content ({content} bytes) is above max-append-size {limits.max_append_size}",
            limit=limits.max_append_size,
        )
    exempt = completes or (creation and content == 0)
    if limits.min_append_size is not None and content < limits.min_append_size and not exempt:
        raise AppendTooSmall(
            f"the request content ({content} bytes) is below min-append-size {limits.min_append_size}; only the "
            "request that completes the upload may be smaller",
            limit=limits.min_append_size,
        )


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
