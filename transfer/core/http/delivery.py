"""What to answer to a GET/HEAD/POST on a stored representation: status, header fields and which bytes, decided
without I/O from the request's header fields (RFC 9110 §13, §14, §12.5.3). The front door only streams the plan.

    select representation   stored bytes, or (identity + compressible + Accept-Encoding + no Range) compressed
                            on the fly with a distinct strong ETag and ``Vary: Accept-Encoding``
    preconditions           conditional.evaluate_preconditions -> 304 plan / PreconditionFailed
    ranges (GET only)       If-Range, then ranges.parse_range_header -> 206 single / 206 multipart /
                            RangeNotSatisfiable (416 + ``Content-Range: bytes */len``) / whole 200
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from transfer.core.http.conditional import Outcome, evaluate_preconditions, http_date, if_range_allows_range
from transfer.core.http.digests import format_digest_field, strong_etag
from transfer.core.http.ranges import (
    ByteRange,
    IgnoreRange,
    MultipartPlan,
    Satisfiable,
    Unsatisfiable,
    parse_range_header,
    plan_multipart,
)
from transfer.core.model.encodings import choose_response_coding
from transfer.core.model.mime import is_active_type
from transfer.core.model.naming import content_disposition
from transfer.errors import PreconditionFailed, RangeNotSatisfiable

# On every content response, whatever the type: the browser must not guess another type (WHATWG Fetch
# §X-Content-Type-Options), and a document rendered from stored bytes runs in a unique opaque origin with no script,
# no forms, no plugins and no subresources (CSP Level 3 sandbox and default-src), so that even a type we did not
# foresee cannot act as this service's origin.
CONTENT_SAFETY_HEADERS: tuple[tuple[str, str], ...] = (
    ("x-content-type-options", "nosniff"),
    ("content-security-policy", "sandbox; default-src 'none'"),
)


@dataclass(frozen=True, slots=True)
class Representation:
    """A stored object as HTTP sees it."""

    length: int  # bytes stored (after any content coding)
    content_type: str
    sha256_hex: str  # of the stored bytes: the strong ETag and Repr-Digest
    last_modified: datetime
    filename: str
    content_encoding: str | None = None  # HTTP coding of the stored bytes
    compressible: bool = False  # identity and a type worth compressing on the fly


@dataclass(frozen=True, slots=True)
class NoBody:
    """A response without a body (HEAD, 304, 412, 416)."""


@dataclass(frozen=True, slots=True)
class RangeBody:
    """A 206 response of one byte range."""

    range: ByteRange


@dataclass(frozen=True, slots=True)
class MultipartBody:
    """A 206 ``multipart/byteranges`` response of several ranges."""

    plan: MultipartPlan


@dataclass(frozen=True, slots=True)
class CompressedBody:
    """The whole representation, compressed on the fly with one codec."""

    coding: str  # a served codec's HTTP token (encodings.CODECS), applied to the whole stored representation


Body = NoBody | RangeBody | MultipartBody | CompressedBody


@dataclass(frozen=True, slots=True)
class DeliveryPlan:
    """What to answer a GET or HEAD of a stored file: status, headers and which body, decided without any I/O."""

    status: int
    headers: list[tuple[str, str]]
    body: Body


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    """The operator's settings the delivery planner follows (range limits, caching, on-the-fly compression, inline
    types)."""

    max_ranges: int = 64
    cache_max_age: int = 0
    compress_on_the_fly: bool = True
    compress_min_length: int = 1024
    active_inline: bool = False  # serve HTML/SVG/XML inline (only for a domain that serves nothing else)


def plan_delivery(
    rep: Representation,
    method: str,
    headers: Mapping[str, str],
    policy: DeliveryPolicy,
    boundary: str,
) -> DeliveryPlan:
    """Decide the response to ``method`` (GET, HEAD or POST) with request ``headers`` (lower-case keys).
    Raises PreconditionFailed or RangeNotSatisfiable (the latter with its ``Content-Range`` header)."""
    coding = None
    if (
        rep.compressible
        and policy.compress_on_the_fly
        and rep.length >= policy.compress_min_length
        and "range" not in headers
    ):
        coding = choose_response_coding(headers.get("accept-encoding"))
    etag = strong_etag(rep.sha256_hex, f"-{coding}" if coding else "")

    validators: list[tuple[str, str]] = [
        ("etag", etag),
        ("last-modified", http_date(rep.last_modified)),
        ("cache-control", f"private, max-age={max(0, policy.cache_max_age)}"),
    ]
    if rep.compressible and policy.compress_on_the_fly:
        validators.append(("vary", "accept-encoding"))

    outcome = evaluate_preconditions(method, headers, etag, rep.last_modified)
    if outcome is Outcome.NOT_MODIFIED:
        return DeliveryPlan(304, validators, NoBody())
    if outcome is Outcome.PRECONDITION_FAILED:
        raise PreconditionFailed("a precondition in the request does not hold for this object", etag=etag)

    active = is_active_type(rep.content_type) and not policy.active_inline
    disposition = "attachment" if active else "inline"
    common = [
        *validators,
        ("accept-ranges", "bytes"),
        ("content-disposition", content_disposition(disposition, rep.filename)),
        *CONTENT_SAFETY_HEADERS,
    ]
    body_plan: Body = NoBody()

    if coding is not None:
        common += [("content-type", rep.content_type), ("content-encoding", coding)]
        return DeliveryPlan(200, common, NoBody() if method == "HEAD" else CompressedBody(coding))

    if rep.content_encoding:
        common.append(("content-encoding", rep.content_encoding))
    common.append(("repr-digest", format_digest_field(rep.sha256_hex)))

    range_value = headers.get("range")
    # Range is defined for GET only; other methods ignore it (RFC 9110 §14.2)
    if method == "GET" and range_value is not None and if_range_allows_range(headers, etag, rep.last_modified):
        outcome_r = parse_range_header(range_value, rep.length, max_ranges=policy.max_ranges)
        if isinstance(outcome_r, Unsatisfiable):
            raise RangeNotSatisfiable(
                f"no requested range lies within the {rep.length} bytes of this object",
                headers={"content-range": outcome_r.content_range},
                length=rep.length,
            )
        if isinstance(outcome_r, Satisfiable):
            if len(outcome_r.ranges) == 1:
                r = outcome_r.ranges[0]
                common += [
                    ("content-type", rep.content_type),
                    ("content-range", r.content_range(rep.length)),
                    ("content-length", str(r.length)),
                ]
                return DeliveryPlan(206, common, RangeBody(r))
            mp = plan_multipart(outcome_r.ranges, rep.length, rep.content_type, boundary)
            common += [("content-type", mp.content_type), ("content-length", str(mp.content_length))]
            return DeliveryPlan(206, common, MultipartBody(mp))
        assert isinstance(outcome_r, IgnoreRange)

    common += [("content-type", rep.content_type), ("content-length", str(rep.length))]
    if method != "HEAD" and rep.length > 0:
        body_plan = RangeBody(ByteRange(0, rep.length - 1))
    return DeliveryPlan(200, common, body_plan)
