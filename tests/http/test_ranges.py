"""Range parsing (RFC 9110 §14) as a table of edge cases plus a property against a byte-level reference model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transfer.core.http.ranges import (
    ByteRange,
    IgnoreRange,
    Satisfiable,
    Unsatisfiable,
    parse_range_header,
    plan_multipart,
)


def ranges(value: str, length: int, max_ranges: int = 64) -> list[tuple[int, int]] | str:
    out = parse_range_header(value, length, max_ranges=max_ranges)
    if isinstance(out, Satisfiable):
        return [(r.start, r.end) for r in out.ranges]
    return "ignore" if isinstance(out, IgnoreRange) else "416"


@pytest.mark.parametrize(
    ("header", "length", "expected"),
    [
        ("bytes=0-499", 10000, [(0, 499)]),
        ("bytes=500-999", 10000, [(500, 999)]),
        ("bytes=-500", 10000, [(9500, 9999)]),
        ("bytes=9500-", 10000, [(9500, 9999)]),
        ("bytes=0-0,-1", 10000, [(0, 0), (9999, 9999)]),
        ("bytes=0-", 10, [(0, 9)]),
        ("bytes=5-100", 10, [(5, 9)]),  # last-pos beyond the end is clipped
        ("bytes=-20", 10, [(0, 9)]),  # suffix longer than the representation: all of it (starlette 416s)
        ("BYTES=0-1", 10, [(0, 1)]),  # unit is case-insensitive
        ("bytes = 0-1", 10, [(0, 1)]),
        ("bytes=0-1, 3-4", 10, [(0, 1), (3, 4)]),
        ("bytes=0-1,,3-4,", 10, [(0, 1), (3, 4)]),  # empty list elements are ignored
        ("bytes=3-4,0-1", 10, [(0, 1), (3, 4)]),  # sorted
        ("bytes=0-5,3-8", 10, [(0, 8)]),  # overlapping: coalesced
        ("bytes=0-4,5-9", 10, [(0, 9)]),  # adjacent: coalesced
        ("bytes=10-", 10, "416"),
        ("bytes=10-20", 10, "416"),
        ("bytes=-0", 10, "416"),
        ("bytes=0-", 0, "416"),
        ("bytes=-5", 0, "ignore"),  # a suffix of an empty representation: serve it (empty) whole
        ("bytes=10-20,0-0", 10, [(0, 0)]),  # one satisfiable range is enough
        ("items=0-5", 10, "ignore"),  # unknown unit: ignored, not 400 (starlette 400s)
        ("bytes=5-1", 10, "ignore"),  # invalid range-spec: the whole header is ignored
        ("bytes=a-b", 10, "ignore"),
        ("bytes=-", 10, "ignore"),
        ("bytes=", 10, "ignore"),
        ("bytes", 10, "ignore"),
        ("bytes=1-2-3", 10, "ignore"),
        ("bytes=+1-2", 10, "ignore"),
        ("bytes=0-1;x", 10, "ignore"),
        ("bytes=99999999999999999999999-", 10, "416"),
    ],
)
def test_range_table(header: str, length: int, expected: object) -> None:
    assert ranges(header, length) == expected


def test_too_many_ranges_are_ignored_after_coalescing() -> None:
    many = ",".join(f"{i * 2}-{i * 2}" for i in range(10))
    assert ranges(f"bytes={many}", 100, max_ranges=9) == "ignore"
    assert len(ranges(f"bytes={many}", 100, max_ranges=10)) == 10
    overlapping = ",".join("0-5" for _ in range(1000))
    assert ranges(f"bytes={overlapping}", 100, max_ranges=1) == [(0, 5)]


def test_unsatisfiable_content_range() -> None:
    out = parse_range_header("bytes=50-", 10)
    assert isinstance(out, Unsatisfiable) and out.content_range == "bytes */10"


spec = st.one_of(
    st.tuples(st.integers(0, 300), st.none()),
    st.tuples(st.integers(0, 300), st.integers(0, 300)),
    st.tuples(st.none(), st.integers(0, 300)),
)


def _text(first: int | None, last: int | None) -> str:
    return f"{'' if first is None else first}-{'' if last is None else last}"


@given(st.lists(spec, min_size=1, max_size=8), st.integers(0, 200))
def test_selected_bytes_match_reference_model(specs: list[tuple[int | None, int | None]], length: int) -> None:
    """Whatever the parser returns covers exactly the byte positions RFC 9110 §14.1 selects."""
    header = "bytes=" + ",".join(_text(f, lt) for f, lt in specs)
    out = parse_range_header(header, length, max_ranges=1000)
    if any(f is not None and lt is not None and lt < f for f, lt in specs):
        assert isinstance(out, IgnoreRange)
        return
    selected: set[int] = set()
    for first, last in specs:
        if first is None:
            assert last is not None
            selected.update(range(max(0, length - last), length))
        elif first < length:
            selected.update(range(first, min(last if last is not None else length - 1, length - 1) + 1))
    if not selected:
        assert isinstance(out, Unsatisfiable | IgnoreRange)
        if isinstance(out, IgnoreRange):
            assert length == 0
        return
    assert isinstance(out, Satisfiable)
    covered = [i for r in out.ranges for i in range(r.start, r.end + 1)]
    assert sorted(covered) == sorted(selected)  # exact cover, no duplicates
    for a, b in zip(out.ranges, out.ranges[1:], strict=False):
        assert a.end + 1 < b.start  # sorted, disjoint, not adjacent


def test_multipart_framing_is_exact() -> None:
    plan = plan_multipart((ByteRange(0, 1), ByteRange(5, 7)), 10, "text/plain", "BOUNDARY")
    data = b"0123456789"
    body = b"".join(p.head + data[p.range.start : p.range.end + 1] for p in plan.parts) + plan.tail
    assert len(body) == plan.content_length
    assert body == (
        b"\r\n--BOUNDARY\r\nContent-Type: text/plain\r\nContent-Range: bytes 0-1/10\r\n\r\n01"
        b"\r\n--BOUNDARY\r\nContent-Type: text/plain\r\nContent-Range: bytes 5-7/10\r\n\r\n567"
        b"\r\n--BOUNDARY--\r\n"
    )
    assert plan.content_type == "multipart/byteranges; boundary=BOUNDARY"
