"""Preconditions in RFC 9110 §13.2.2 order, and If-Range (strong, exact)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from transfer.core.http.conditional import Outcome, evaluate_preconditions, http_date, if_range_allows_range

ETAG = '"abc"'
MODIFIED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
BEFORE = http_date(MODIFIED - timedelta(seconds=1))
AT = http_date(MODIFIED)
AFTER = http_date(MODIFIED + timedelta(seconds=1))


@pytest.mark.parametrize(
    ("method", "headers", "outcome"),
    [
        ("GET", {}, Outcome.PROCEED),
        ("GET", {"if-match": ETAG}, Outcome.PROCEED),
        ("GET", {"if-match": '"x", "abc"'}, Outcome.PROCEED),
        ("GET", {"if-match": "*"}, Outcome.PROCEED),
        ("GET", {"if-match": '"x"'}, Outcome.PRECONDITION_FAILED),
        ("GET", {"if-match": 'W/"abc"'}, Outcome.PRECONDITION_FAILED),  # If-Match compares strongly
        ("GET", {"if-unmodified-since": BEFORE}, Outcome.PRECONDITION_FAILED),
        ("GET", {"if-unmodified-since": AT}, Outcome.PROCEED),
        ("GET", {"if-unmodified-since": "garbage"}, Outcome.PROCEED),  # invalid date: ignored
        ("GET", {"if-match": ETAG, "if-unmodified-since": BEFORE}, Outcome.PROCEED),  # If-Match wins
        ("GET", {"if-none-match": ETAG}, Outcome.NOT_MODIFIED),
        ("HEAD", {"if-none-match": 'W/"abc"'}, Outcome.NOT_MODIFIED),  # weak comparison
        ("GET", {"if-none-match": "*"}, Outcome.NOT_MODIFIED),
        ("GET", {"if-none-match": '"other"'}, Outcome.PROCEED),
        ("POST", {"if-none-match": ETAG}, Outcome.PRECONDITION_FAILED),
        ("GET", {"if-modified-since": AT}, Outcome.NOT_MODIFIED),
        ("GET", {"if-modified-since": BEFORE}, Outcome.PROCEED),
        ("POST", {"if-modified-since": AT}, Outcome.PROCEED),  # only GET/HEAD
        ("GET", {"if-none-match": '"other"', "if-modified-since": AT}, Outcome.PROCEED),  # INM wins
        ("GET", {"if-match": '"x"', "if-none-match": ETAG}, Outcome.PRECONDITION_FAILED),  # step 1 first
        ("GET", {"if-match": '"a,b", "abc"'}, Outcome.PROCEED),  # comma inside a tag
    ],
)
def test_preconditions(method: str, headers: dict[str, str], outcome: Outcome) -> None:
    assert evaluate_preconditions(method, headers, ETAG, MODIFIED) is outcome


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        (None, True),
        (ETAG, True),
        ('"other"', False),
        ('W/"abc"', False),  # weak tags never match If-Range
        (AT, True),
        (AFTER, False),  # dates must match exactly
        (BEFORE, False),
        ("not a date", False),
    ],
)
def test_if_range(value: str | None, allowed: bool) -> None:
    headers = {} if value is None else {"if-range": value}
    assert if_range_allows_range(headers, ETAG, MODIFIED) is allowed
