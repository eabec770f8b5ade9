"""Part-size planning for multipart uploads (S3's limits). Pure.

S3 (and MinIO, Swift's s3api with ``max_upload_part_num = 10000``): every part but the last is at least 5 MiB,
at most 5 GiB, and an upload has at most 10,000 parts, so objects are at most 5 TiB in practice. The planner keeps
the preferred part size when it fits and raises it, in whole MiB, until the (declared or maximum) size fits in
10,000 parts. An unknown size is planned for the largest object the service accepts.
"""

from __future__ import annotations

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


def part_count(size: int, part_size: int) -> int:
    """How many parts ``size`` bytes make (an empty object is one empty part)."""
    return max(1, -(-size // part_size))
