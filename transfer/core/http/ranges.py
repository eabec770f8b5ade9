"""HTTP range requests (RFC 9110 §14): parse a ``Range`` header against a representation length, and frame the
``multipart/byteranges`` body of a multi-range response. Pure: no I/O.

Outcomes of :func:`parse_range_header`, in the order the RFC asks for them:

    header syntactically invalid, or an unknown unit        -> IgnoreRange   (serve 200 with the whole body, §14.2)
    more ranges than the cap after coalescing               -> IgnoreRange   (§14.2 allows ignoring such requests)
    no range-spec satisfiable                               -> Unsatisfiable (416 with ``bytes */<length>``, §15.5.17)
    otherwise                                               -> Satisfiable   (ranges sorted, overlapping and
                                                                              adjacent ones coalesced, §15.3.7.2)

Differences from starlette's parser, on purpose: a suffix longer than the representation selects all of it
(§14.1.3); an unknown unit or a malformed header is ignored, not a 400; the multipart body uses CRLF and the
``Content-Type`` header carries ``multipart/byteranges``; the number of ranges is capped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from transfer.core.numerals import MAX_DIGITS, decimal

# DIGIT is ASCII only (RFC 5234 B.1); \d would also match other scripts' digits, which int() then accepts
_RANGE_SPEC_RE = re.compile(r"^([0-9]*)-([0-9]*)$")
_OWS = " \t"
# Positions of more than MAX_DIGITS significant digits are valid syntax (RFC 9110 §14.1.1 asks recipients to expect
# large numerals) but lie beyond any representation: they count as this, without ever converting the digits.
_BEYOND_ANY_LENGTH = 10**MAX_DIGITS


def _position(digits: str) -> int:
    significant = digits.lstrip("0") or "0"
    value = decimal(significant)
    return _BEYOND_ANY_LENGTH if value is None else value


def _magnitude(digits: str) -> tuple[int, str]:
    """A sort key that orders decimal numerals of any length exactly, without converting them."""
    significant = digits.lstrip("0")
    return len(significant), significant


@dataclass(frozen=True, slots=True)
class ByteRange:
    """Bytes ``start`` through ``end`` inclusive, as in ``Content-Range``."""

    start: int
    end: int

    @property
    def length(self) -> int:
        """How many bytes the range holds."""
        return self.end - self.start + 1

    def content_range(self, complete_length: int) -> str:
        """The ``Content-Range`` field value for this range (RFC 9110 §14.4)."""
        return f"bytes {self.start}-{self.end}/{complete_length}"


@dataclass(frozen=True, slots=True)
class IgnoreRange:
    """A Range header the server ignores (RFC 9110 §14.2: answer 200 with the whole body), with the reason."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unsatisfiable:
    """A Range header none of whose ranges overlaps the representation: 416."""

    complete_length: int

    @property
    def content_range(self) -> str:
        """The ``Content-Range`` of a 416 answer (RFC 9110 §14.4)."""
        return f"bytes */{self.complete_length}"


@dataclass(frozen=True, slots=True)
class Satisfiable:
    """The ranges to serve, normalised (in order, coalesced, bounded in number)."""

    ranges: tuple[ByteRange, ...]


RangeOutcome = IgnoreRange | Unsatisfiable | Satisfiable


def parse_range_header(value: str, length: int, *, max_ranges: int = 64) -> RangeOutcome:
    """Evaluate ``Range: <value>`` against a representation of ``length`` bytes (RFC 9110 §14.1-§14.2)."""
    unit, sep, rest = value.partition("=")
    if not sep:
        return IgnoreRange("no '=' in Range")
    if unit.strip(_OWS).lower() != "bytes":  # range units are case-insensitive (§14.1)
        return IgnoreRange(f"unsupported range unit {unit.strip(_OWS)[:60]!r}")
    specs: list[tuple[int | None, int | None]] = []
    for element in rest.split(","):
        element = element.strip(_OWS)
        if not element:  # empty list elements are allowed and ignored (§5.6.1)
            continue
        m = _RANGE_SPEC_RE.match(element)
        if not m or (not m.group(1) and not m.group(2)):
            return IgnoreRange(f"malformed range-spec {element[:60]!r}")
        first_text, last_text = m.group(1), m.group(2)
        if first_text and last_text and _magnitude(last_text) < _magnitude(first_text):
            return IgnoreRange(f"range-spec {element[:60]!r} has last-pos < first-pos")  # invalid (§14.1.1)
        first = _position(first_text) if first_text else None
        last = _position(last_text) if last_text else None
        specs.append((first, last))
    if not specs:
        return IgnoreRange("no range-spec")

    selected: list[ByteRange] = []
    suffix_on_empty = False
    for first, last in specs:
        if first is None:
            assert last is not None
            # suffix-range: the last `last` bytes, all of them if the representation is shorter (§14.1.3)
            if last == 0:
                continue
            if length == 0:
                suffix_on_empty = True
                continue
            selected.append(ByteRange(max(0, length - last), length - 1))
        else:
            if first >= length:  # satisfiable only if first-pos < length (§14.1.1)
                continue
            end = length - 1 if last is None or last >= length else last
            selected.append(ByteRange(first, end))
    if not selected:
        if suffix_on_empty:
            return IgnoreRange("suffix range of an empty representation: serve it whole")
        return Unsatisfiable(length)

    merged = coalesce(selected)
    if len(merged) > max_ranges:
        return IgnoreRange(f"{len(merged)} ranges exceed the limit of {max_ranges}")
    return Satisfiable(tuple(merged))


def coalesce(ranges: list[ByteRange]) -> list[ByteRange]:
    """Sort and merge overlapping or adjacent ranges (RFC 9110 §15.3.7.2 allows any order after coalescing)."""
    out: list[ByteRange] = []
    for r in sorted(ranges, key=lambda r: r.start):
        if out and r.start <= out[-1].end + 1:
            if r.end > out[-1].end:
                out[-1] = ByteRange(out[-1].start, r.end)
        else:
            out.append(r)
    return out


@dataclass(frozen=True, slots=True)
class MultipartPart:
    """One part of a ``multipart/byteranges`` body: its header bytes, then the bytes of ``range``."""

    head: bytes
    range: ByteRange


@dataclass(frozen=True, slots=True)
class MultipartPlan:
    """A ``multipart/byteranges`` body laid out in advance: each part's head and range, the closing tail, and the
    exact Content-Length."""

    boundary: str
    parts: tuple[MultipartPart, ...]
    tail: bytes
    content_length: int

    @property
    def content_type(self) -> str:
        """The response's ``multipart/byteranges`` Content-Type with its boundary."""
        return f"multipart/byteranges; boundary={self.boundary}"


def plan_multipart(
    ranges: tuple[ByteRange, ...], complete_length: int, content_type: str, boundary: str
) -> MultipartPlan:
    """Frame a multi-range body (RFC 9110 §14.6, RFC 2046 §5.1.1: CRLF line breaks) with its exact length."""
    parts = []
    total = 0
    for r in ranges:
        head = (
            f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n"
            f"Content-Range: {r.content_range(complete_length)}\r\n\r\n"
        ).encode("latin-1")
        parts.append(MultipartPart(head, r))
        total += len(head) + r.length
    tail = f"\r\n--{boundary}--\r\n".encode("latin-1")
    return MultipartPlan(boundary, tuple(parts), tail, total + len(tail))
