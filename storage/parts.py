"""Part-size planning for multipart uploads (S3's limits). Pure.

S3 (and MinIO, Swift's s3api with ``max_upload_part_num = 10000``): every part but the last is at least 5 MiB,
at most 5 GiB, and an upload has at most 10,000 parts, so objects are at most 5 TiB in practice. The planner keeps
the preferred part size when it fits and raises it, in whole MiB, until the (declared or maximum) size fits in
10,000 parts. An unknown size is planned for the largest object the service accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from storage.base import StoreRules
from storage.errors import ObjectTooLarge

MIN_PART_SIZE = 5 << 20
MAX_PART_SIZE = 5 << 30
MAX_PARTS = 10_000
MiB = 1 << 20


def plan_part_size(
    size: int | None,
    *,
    max_size: int,
    preferred: int = 8 << 20,
    min_part: int = MIN_PART_SIZE,
    max_part: int = MAX_PART_SIZE,
    max_parts: int = MAX_PARTS,
) -> int:
    """The part size for an object of ``size`` bytes (None: unknown, at most ``max_size``), within an engine's
    limits (S3's by default)."""
    if preferred < min_part:
        raise ValueError(f"part size must be at least {min_part} bytes")
    total = max_size if size is None else size
    if total > max_parts * max_part:
        raise ObjectTooLarge(f"{total} bytes exceed {max_parts} parts of {max_part} bytes")
    needed = -(-total // max_parts)  # ceil
    part = max(preferred, needed)
    part = -(-part // MiB) * MiB  # whole MiB
    return min(part, max_part)


@dataclass(frozen=True, slots=True)
class S3Rules(StoreRules):
    """S3's limits (and MinIO's, Ceph RGW's, Swift s3api's): 5 MiB minimum for every part but the last, of a
    multipart upload and of the sources of an UploadPartCopy; presigned URLs carry their real lifetime in
    ``X-Amz-Expires`` (SigV4 caps it at 7 days and at the credentials' own expiry)."""

    min_compose_part: int = MIN_PART_SIZE
    max_compose_source: int | None = 5 << 30  # the largest part one UploadPartCopy takes (AWS)

    def presigned_expires_in(self, url: str, requested: int) -> int:
        """The ``X-Amz-Expires`` of the URL (``requested`` when it names none)."""
        return int(parse_qs(urlsplit(url).query).get("X-Amz-Expires", [str(requested)])[0])


def part_count(size: int, part_size: int) -> int:
    """How many parts ``size`` bytes make (an empty object is one empty part)."""
    return max(1, -(-size // part_size))
