"""Integers in header fields and URLs, parsed one way everywhere. Pure: no I/O.

RFC 9110's numeric fields (``Content-Length`` §8.6, range positions §14.1.1, and the tus ``Upload-Length`` /
``Upload-Offset`` that copy them) are ``1*DIGIT``, and ABNF's DIGIT is ASCII ``0``-``9`` only (RFC 5234 B.1).
Python's own parsers are wider on both counts: ``str.isdigit`` and ``int`` accept other scripts' digits (``'²'``,
``'٣'``), ``int`` accepts a sign, ``_`` and spaces, and Python 3.11 raises ``ValueError`` above 4,300 digits. So no
field value reaches ``int`` unless it is a short run of ASCII digits.

    decimal(text, max_digits)    -> int, or None when text is not 1..max_digits ASCII digits (no sign, no OWS)
    parse_count(value, field)    -> int (OWS trimmed), or InvalidRequest 400 naming the field
    parse_bounded(value, field, low=, high=) -> parse_count within [low, high], or InvalidRequest 400
    JsonInt, JsonBool            -> strict pydantic types: a JSON number or boolean of exactly that type
    CANONICAL_DECIMAL            -> the pattern of a position or count in a URL: one spelling per number
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Strict

from transfer.errors import InvalidRequest

# A JSON integer or boolean exactly, for request bodies and tool arguments: pydantic's lax mode takes 1.0 and true
# as the integer 1, and 1 as true.
JsonInt = Annotated[int, Strict()]
JsonBool = Annotated[bool, Strict()]

# A chunk index or a count in a URL path or query: 0, or ASCII digits without a leading zero, sign, space, fraction
# or exponent. pydantic's lax int would read "1.0", "+1", "01" and " 1" as 1: four names for one chunk.
CANONICAL_DECIMAL: Final = r"^(?:0|[1-9][0-9]{0,17})$"

# 18 digits always fit in a signed 64-bit integer (< 9.2e18) and exceed any byte count we handle (EiB).
MAX_DIGITS: Final = 18
_DIGITS: Final = frozenset("0123456789")
_OWS: Final = " \t"


def decimal(text: str, max_digits: int = MAX_DIGITS) -> int | None:
    """The value of ``text`` when it is 1 to ``max_digits`` ASCII digits, else None."""
    if not 0 < len(text) <= max_digits or not _DIGITS.issuperset(text):
        return None
    return int(text)


def parse_count(value: str, field: str, *, max_digits: int = MAX_DIGITS) -> int:
    """A non-negative integer header field (``1*DIGIT``, surrounding OWS allowed: RFC 9110 §5.5); raises
    InvalidRequest (400) for anything else, including more than ``max_digits`` digits."""
    number = decimal(value.strip(_OWS), max_digits)
    if number is None:
        shown = value[:40] + ("…" if len(value) > 40 else "")
        raise InvalidRequest(
            f"{field} must be a non-negative integer of at most {max_digits} ASCII digits, not {shown!r}",
            field=field,
        )
    return number


def parse_bounded(value: str, field: str, *, low: int, high: int) -> int:
    """A :func:`parse_count` integer within ``[low, high]`` (a page size, a count in a URL); InvalidRequest (400)
    naming the field and the bounds otherwise."""
    number = parse_count(value, field, max_digits=len(str(high)) + 1)
    if not low <= number <= high:
        raise InvalidRequest(f"{field} must be from {low} to {high}, not {number}", field=field)
    return number
