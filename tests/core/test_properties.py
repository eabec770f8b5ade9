"""Hypothesis properties of the pure core: descriptor validation, the session state machine and chunk arithmetic,
S3 part planning. (Ranges, signing, TP envelopes and A2A conversions have theirs next to their other tests.)"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from pydantic import ValidationError

from storage.errors import ObjectTooLarge
from storage.parts import MAX_PART_SIZE, MAX_PARTS, MIN_PART_SIZE, MiB, part_count, plan_part_size
from transfer.core.model.content import (
    INLINE_THRESHOLD,
    ContentEncoding,
    DownloadMethod,
    FileContent,
    FileRole,
    TransferMode,
    load_descriptor,
    parse_descriptor,
    url_descriptor_json,
)
from transfer.core.uploads.sessions import Session, SessionState, compact_ranges, plan_chunk_size, total_chunks
from transfer.core.uploads.state import UploadEvent
from transfer.errors import (
    ChunkLengthMismatch,
    ChunkOutOfRange,
    InvalidDescriptor,
    InvalidRequest,
    SessionAborted,
    SessionCompleted,
    SessionExpired,
    SessionIncomplete,
)

# -- descriptors -----------------------------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=60).filter(lambda s: s.strip() == s)
media = st.sampled_from(
    ["text/plain", "application/json", "image/png", "application/octet-stream", "text/csv; charset=utf-8"]
)


@given(
    content_type=media,
    encoding=st.sampled_from(list(ContentEncoding)),
    size=st.integers(min_value=0, max_value=1 << 45),
    encoded_size=st.none() | st.integers(min_value=0, max_value=1 << 45),
    sha=st.binary(min_size=32, max_size=32),
    expires=st.none() | st.datetimes(timezones=st.just(UTC)),
    name=names,
    role=st.none() | st.sampled_from(list(FileRole)),
    description=st.none() | st.text(max_size=40),
    query=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789=&_-", max_size=80),
    url_expires_at=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)),
    method=st.sampled_from(list(DownloadMethod)),
)
def test_the_url_descriptor_rendered_without_the_model_is_the_models_json(
    content_type: str,
    encoding: ContentEncoding,
    size: int,
    encoded_size: int | None,
    sha: bytes,
    expires: datetime | None,
    name: str,
    role: FileRole | None,
    description: str | None,
    query: str,
    url_expires_at: datetime,
    method: DownloadMethod,
) -> None:
    metadata: dict[str, str] = {"file_id": "f_" + sha.hex()[:32]}
    if expires is not None:
        metadata["expires_at"] = expires.isoformat()
    fields = dict(
        content_type=content_type,
        encoding=encoding,
        size=size,
        encoded_size=encoded_size,
        checksum="sha256:" + sha.hex(),
        metadata=metadata,
        name=name,
        role=role,
        description=description,
        url=f"http://127.0.0.1:8080/v1/files/{metadata['file_id']}/content?{query}",
        url_expires_at=url_expires_at,
        download_method=method,
    )
    fast = url_descriptor_json(**fields)  # type: ignore[arg-type]
    model = FileContent(type=TransferMode.URL, range_supported=True, **fields).to_json()  # type: ignore[arg-type]
    assert fast == model and list(fast) == list(model)  # the same keys and values, in the same order
    assert json.dumps(fast) == json.dumps(model)


@given(data=st.binary(max_size=3000), name=names, content_type=media)
def test_inline_descriptors_round_trip(data: bytes, name: str, content_type: str) -> None:
    doc = {
        "type": "inline",
        "content_type": content_type,
        "encoding": "base64",
        "data": base64.b64encode(data).decode(),
        "name": name,
        "size": len(data),
        "checksum": "sha256:" + hashlib.sha256(data).hexdigest().upper(),  # accepted, normalised
    }
    descriptor = parse_descriptor(doc)
    assert isinstance(descriptor, FileContent)
    out = descriptor.to_json()
    assert out["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    assert parse_descriptor(out).to_json() == out  # stable under a second round trip


@given(size=st.integers(0, 1 << 40), chunk=st.integers(1, 1 << 30), delta=st.sampled_from([-1, 1]))
def test_streaming_total_chunks_must_match(size: int, chunk: int, delta: int) -> None:
    total = math.ceil(size / chunk)
    base = {
        "type": "streaming",
        "content_type": "video/mp4",
        "name": "v.mp4",
        "size": size,
        "streaming_session_id": "s_1",
        "chunk_size": chunk,
    }
    if size == 0:
        total = 0
    assert parse_descriptor({**base, "total_chunks": total})
    wrong = total + delta
    assume(wrong >= 0 and not (size == 0 and wrong == 1))
    with pytest.raises(ValidationError):
        parse_descriptor({**base, "total_chunks": wrong})


@given(extra=st.integers(1, 1000))
def test_inline_above_threshold_is_refused(extra: int) -> None:
    data = base64.b64encode(b"\0" * (INLINE_THRESHOLD + extra)).decode()
    with pytest.raises(InvalidDescriptor, match="threshold"):
        load_descriptor({"type": "inline", "content_type": "a/b", "encoding": "base64", "data": data, "name": "x"})


@given(
    doc=st.dictionaries(
        st.sampled_from(["type", "content_type", "name", "url", "data", "size", "checksum", "encoding"]),
        st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=20), st.booleans()),
    )
)
def test_arbitrary_documents_are_valid_or_invalid_descriptor(doc: dict[str, object]) -> None:
    """Never anything but a descriptor or InvalidDescriptor, whatever the input."""
    try:
        load_descriptor(doc)
    except InvalidDescriptor:
        pass


# -- chunk arithmetic ----------------------------------------------------------------------------------------------


@given(st.sets(st.integers(0, 500)))
def test_compact_ranges_cover_exactly(indices: set[int]) -> None:
    ranges = compact_ranges(indices)
    covered = {i for a, b in ranges for i in range(a, b + 1)}
    assert covered == indices
    assert all(b + 1 < c for (_, b), (c, _) in zip(ranges, ranges[1:], strict=False))  # maximal, ordered


@given(requested=st.none() | st.integers(-10, 1 << 31), minimum=st.integers(1, 1 << 20))
def test_chunk_size_plan_stays_in_bounds(requested: int | None, minimum: int) -> None:
    maximum, default = minimum * 64, minimum * 8
    try:
        size = plan_chunk_size(requested, default=default, minimum=minimum, maximum=maximum)
    except InvalidRequest:
        assert requested is not None and not minimum <= requested <= maximum
    else:
        assert minimum <= size <= maximum and size == (default if requested is None else requested)


@given(size=st.none() | st.integers(0, MAX_PARTS * MAX_PART_SIZE), preferred=st.integers(MIN_PART_SIZE, 64 * MiB))
def test_part_plan_respects_s3_limits(size: int | None, preferred: int) -> None:
    max_size = 64 << 30
    part = plan_part_size(size, max_size=max_size, preferred=preferred)
    assert MIN_PART_SIZE <= part <= MAX_PART_SIZE
    assert part % MiB == 0 or part == MAX_PART_SIZE
    assert part_count(size if size is not None else max_size, part) <= MAX_PARTS
    assert part >= preferred or part == MAX_PART_SIZE


def test_part_plan_refuses_the_impossible() -> None:
    with pytest.raises(ObjectTooLarge):
        plan_part_size(MAX_PARTS * MAX_PART_SIZE + 1, max_size=1)


# -- the session state machine ---------------------------------------------------------------------------------


class SessionMachine(RuleBasedStateMachine):
    """Chunks arrive in any order with right or wrong lengths; completion, abort and expiry happen at any time.
    The model: a set of stored chunks and a state. The pure Session must agree with it at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.session: Session | None = None
        self.stored: dict[int, int] = {}
        self.now = 1000.0
        self.state = SessionState.OPEN

    @rule(size=st.integers(0, 5000), chunk=st.integers(1, 700), known=st.booleans())
    @precondition(lambda self: self.session is None)
    def create(self, size: int, chunk: int, known: bool) -> None:
        self.size = size
        self.session = Session(
            id="s_x",
            size=size if known else None,
            chunk_size=chunk,
            created_at=self.now,
            expires_at=self.now + 100,
        )

    @rule(index=st.integers(-2, 40), wrong=st.booleans())
    @precondition(lambda self: self.session is not None)
    def put(self, index: int, wrong: bool) -> None:
        s = self.session
        assert s is not None
        try:
            s.require_open(self.now)
        except (SessionCompleted, SessionAborted, SessionExpired):
            assert self.state is not SessionState.OPEN or self.now >= s.expires_at
            return
        total = total_chunks(self.size, s.chunk_size)
        right = min(s.chunk_size, self.size - index * s.chunk_size) if 0 <= index < total else 1
        length = right + 1 if wrong else right
        try:
            s.check_length(index, length)
        except ChunkOutOfRange:
            assert index < 0 or (s.size is not None and index >= total)
            return
        except ChunkLengthMismatch:
            assert wrong or s.size is None
            return
        if s.size is not None:
            assert 0 <= index < total and length == right  # accepted means exactly right
        if 0 <= index < total or s.size is None:
            self.stored[index] = length

    @rule()
    @precondition(lambda self: self.session is not None)
    def complete(self) -> None:
        s = self.session
        assert s is not None
        try:
            s.require_open(self.now)
        except (SessionCompleted, SessionAborted, SessionExpired):
            return
        total = total_chunks(self.size, s.chunk_size)
        whole = {i: min(s.chunk_size, self.size - i * s.chunk_size) for i in range(total)}
        try:
            size, count = s.completion_plan(self.stored, None if s.size is not None else self.size)
        except (SessionIncomplete, ChunkLengthMismatch):
            assert self.stored != whole
            return
        assert self.stored == whole and (size, count) == (self.size, total)
        self.session = s.after(UploadEvent.COMPLETE, self.now)
        self.state = SessionState.COMPLETED

    @rule()
    @precondition(lambda self: self.session is not None and self.state is SessionState.OPEN)
    def abort(self) -> None:
        assert self.session is not None
        try:
            self.session = self.session.after(UploadEvent.ABORT, self.now)
        except SessionExpired:  # the clock ended it first: the table refuses, as the service answers 410
            assert self.now >= self.session.expires_at
            return
        self.state = SessionState.ABORTED

    @rule(seconds=st.floats(0, 80))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def states_agree(self) -> None:
        if self.session is None:
            return
        expected = self.state
        if expected is SessionState.OPEN and self.now >= self.session.expires_at:
            expected = SessionState.EXPIRED
        assert self.session.state_at(self.now) is expected


TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
