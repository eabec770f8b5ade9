"""The limits a storage engine imposes, declared by its backend: those of a backend without any (local files), and
S3's (shared by MinIO, Ceph RGW and Swift's s3api)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from storage.parts import MIN_PART_SIZE, plan_part_size


@dataclass(frozen=True, slots=True)
class StoreRules:
    """The limits a backend's engine imposes, declared by the backend (its ``rules`` attribute, read through
    :func:`rules_of`) so that the service applies them without knowing which engine it runs on (tusd's composer
    is the model: the store owns its quirks). The defaults are a backend without any: local files.

    ``min_compose_part``: every source of a server-side ``compose`` but the last must have at least this many
    bytes (S3's UploadPartCopy: 5 MiB), so pieces meant to be composed are planned at least this large.
    ``min_part_size``, ``max_part_size``, ``max_parts``, ``preferred_part_size``: the parts of a direct
    (client-sent) upload. ``abandoned_upload_age``: seconds after which an unfinished upload of a writer that died
    is aborted (None: the backend leaves none behind). ``max_compose_source``: the largest source a server-side
    ``compose`` moves in one piece (S3's UploadPartCopy: 5 GiB; None: no limit); a larger one it moves in ranges."""

    min_compose_part: int = 0
    max_compose_source: int | None = None
    min_part_size: int = 5 << 20
    max_part_size: int = 5 << 30
    max_parts: int = 10_000
    preferred_part_size: int = 8 << 20
    abandoned_upload_age: float | None = None

    def part_size(self, size: int | None, *, max_size: int) -> int:
        """The part size for a direct upload of ``size`` bytes (None: unknown, at most ``max_size``)."""
        return plan_part_size(
            size,
            max_size=max_size,
            preferred=self.preferred_part_size,
            min_part=self.min_part_size,
            max_part=self.max_part_size,
            max_parts=self.max_parts,
        )

    def presigned_expires_in(self, url: str, requested: int) -> int:
        """How many seconds a URL this backend presigned for ``requested`` seconds really lives (it may cap it)."""
        return requested


DEFAULT_RULES = StoreRules()


def rules_of(storage: object) -> StoreRules:
    """The rules ``storage`` declares, else those of a backend without any."""
    rules = getattr(storage, "rules", None)
    return rules if isinstance(rules, StoreRules) else DEFAULT_RULES


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
