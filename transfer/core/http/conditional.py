"""Conditional requests (RFC 9110 §13), evaluated in the order of §13.2.2, in one place. Pure: no I/O.

    1. If-Match            present: no strong match            -> 412
    2. If-Unmodified-Since (only without If-Match): modified    -> 412
    3. If-None-Match       present: a weak match                -> 304 for GET/HEAD, else 412
    4. If-Modified-Since   (only GET/HEAD, without If-None-Match): not modified -> 304
    5. If-Range            (only GET with Range): no strong match -> ignore Range, serve 200 (§13.1.5)

Unlike aiohttp, If-Range with an entity tag is compared strongly and exactly, and an HTTP-date only matches when
it equals Last-Modified exactly (our objects are immutable, so their Last-Modified is a strong validator).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime


class Outcome(enum.Enum):
    """What the conditional request headers decide (RFC 9110 §13.2.2): go on, 304 Not Modified, or 412 Precondition
    Failed."""

    PROCEED = 200
    NOT_MODIFIED = 304
    PRECONDITION_FAILED = 412


def http_date(value: datetime) -> str:
    """IMF-fixdate (RFC 9110 §5.6.7), e.g. ``Sun, 06 Nov 1994 08:49:37 GMT``."""
    return format_datetime(value.astimezone(UTC).replace(microsecond=0), usegmt=True)


# The longest HTTP-date form is rfc850-date with a full weekday: 38 characters (RFC 9110 §5.6.7); some slack for OWS
_MAX_DATE_LENGTH = 64


def parse_http_date(value: str) -> datetime | None:
    """An HTTP-date, or None when the value is not one (a recipient then ignores the field, RFC 9110 §13.1.3)."""
    value = value.strip()
    if len(value) > _MAX_DATE_LENGTH or not value.isascii():
        return None
    try:
        parsed = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # huge numerals overflow datetime's C ints
        return None
    if parsed is None:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def _split_tags(value: str) -> list[str] | None:
    """Entity tags of an If-Match / If-None-Match list; None for ``*``."""
    if value.strip() == "*":
        return None
    tags: list[str] = []
    buf = ""
    in_quotes = False
    for ch in value:  # commas may appear inside an opaque-tag
        if ch == '"':
            in_quotes = not in_quotes
        if ch == "," and not in_quotes:
            if buf.strip():
                tags.append(buf.strip())
            buf = ""
        else:
            buf += ch
    if buf.strip():
        tags.append(buf.strip())
    return tags


def _strong_match(tag: str, etag: str) -> bool:
    return not tag.startswith("W/") and tag == etag


def _weak_match(tag: str, etag: str) -> bool:
    return tag.removeprefix("W/") == etag.removeprefix("W/")


def _seconds(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(microsecond=0)


def evaluate_preconditions(method: str, headers: Mapping[str, str], etag: str, last_modified: datetime) -> Outcome:
    """Steps 1-4 of RFC 9110 §13.2.2 for a representation that exists. ``headers`` keys are lower-case."""
    get_or_head = method in ("GET", "HEAD")
    if_match = headers.get("if-match")
    if if_match is not None:
        tags = _split_tags(if_match)
        if tags is not None and not any(_strong_match(t, etag) for t in tags):
            return Outcome.PRECONDITION_FAILED  # §13.1.1
    else:
        since = headers.get("if-unmodified-since")
        date = parse_http_date(since) if since is not None else None
        if date is not None and _seconds(last_modified) > date:
            return Outcome.PRECONDITION_FAILED  # §13.1.4
    if_none_match = headers.get("if-none-match")
    if if_none_match is not None:
        tags = _split_tags(if_none_match)
        if tags is None or any(_weak_match(t, etag) for t in tags):  # §13.1.2
            return Outcome.NOT_MODIFIED if get_or_head else Outcome.PRECONDITION_FAILED
    elif get_or_head:
        since = headers.get("if-modified-since")
        date = parse_http_date(since) if since is not None else None
        if date is not None and _seconds(last_modified) <= date:
            return Outcome.NOT_MODIFIED  # §13.1.3
    return Outcome.PROCEED


def if_range_allows_range(headers: Mapping[str, str], etag: str, last_modified: datetime) -> bool:
    """Step 5: True when the Range header may be honoured (no If-Range, or If-Range matches) (§13.1.5)."""
    value = headers.get("if-range")
    if value is None:
        return True
    value = value.strip()
    if value.startswith('"') or value.startswith("W/"):
        return _strong_match(value, etag)
    date = parse_http_date(value)
    return date is not None and date == _seconds(last_modified)
