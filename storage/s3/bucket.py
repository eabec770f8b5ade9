"""What reads and writes of one bucket share: the engine's profile and the conditional forms it takes, and the
metadata object beside each data object."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from storage.base import ObjectInfo
from storage.budget import ByteBudget
from storage.errors import BackendUnavailable, ObjectChanged
from storage.keyed import KeyedLocks
from storage.rules import S3Rules
from storage.s3.client import S3Client
from storage.s3.config import S3Config
from storage.s3.engine import IF_MATCH_FORMS, EngineProfile, in_form, quoted, unquoted
from storage.s3.engine import response_status as _status


class S3Bucket(S3Client):
    """An S3 client on one bucket, with what :meth:`S3Storage.start` learnt of its engine."""

    def __init__(self, config: S3Config) -> None:
        super().__init__(config)
        self.compare_locks = KeyedLocks()  # if_match without a conditional PUT: compare and put one at a time
        self.buffers = ByteBudget(config.buffer_budget)  # every part buffer of every upload of this storage
        self.engine: EngineProfile | None = None  # what start() saw the engine do

    @property
    def rules(self) -> S3Rules:
        """S3's limits (parts, compose sources, presigned URL lifetimes), as this backend is configured."""
        return S3Rules(preferred_part_size=self.config.part_size, abandoned_upload_age=self.config.abandoned_upload_age)

    @property
    def atomic_if_absent(self) -> bool:
        return self.config.atomic_if_absent and (self.engine is None or self.engine.conditional_create)

    @property
    def atomic_if_match(self) -> bool:
        return self.config.atomic_if_match and (self.engine is None or self.engine.compare_and_set)

    @property
    def complete_if_none_match(self) -> bool:
        """CompleteMultipartUpload honours ``If-None-Match: *`` (Ceph 20.2, AWS; not Ceph 16): a large
        create-if-absent is decided by its completion alone, with no claim object first."""
        return self.engine is None or self.engine.complete_if_none_match

    @property
    def copy_if_match(self) -> bool:
        """UploadPartCopy honours ``x-amz-copy-source-if-match`` (Ceph 20.2, AWS; not Ceph 16): a copied range is of
        the version named, with no HEAD of the source after the copies."""
        return self.engine is None or self.engine.copy_if_match

    def if_match_value(self, etag: str, *, complete: bool = False) -> str | None:
        """``etag`` in the form the engine compares ``If-Match`` with on PutObject (with ``complete``: on
        CompleteMultipartUpload), or None where it does not compare there (Swift's PUTs, Ceph 16's completion)."""
        if self.engine is None:
            return quoted(etag)
        form = self.engine.complete_if_match if complete else self.engine.if_match
        return in_form(etag, form) if form in IF_MATCH_FORMS else None

    def get_if_match(self, etag: str) -> dict[str, str]:
        """The If-Match of a pinned GetObject: the form the engine accepts, none when it has no working one."""
        form = "quoted" if self.engine is None else self.engine.get_if_match
        if form == "quoted":
            return {"IfMatch": quoted(etag)}
        if form == "unquoted":
            return {"IfMatch": unquoted(etag)}
        return {}

    async def put_meta(self, key: str, record: dict[str, Any], *, if_absent: bool = False) -> None:
        """The metadata object of ``key``; with ``if_absent`` only if it has none (else ObjectChanged)."""
        body = json.dumps(record, ensure_ascii=True).encode("ascii")
        try:
            await self._put_meta(key, body, if_absent)
        except BackendUnavailable as exc:
            if if_absent and _status(exc) == 409:  # ConditionalRequestConflict: a concurrent conditional write
                raise ObjectChanged(f"{key} is being created by another writer") from exc
            raise

    async def _put_meta(self, key: str, body: bytes, if_absent: bool) -> None:
        await self.call(
            "writing metadata",
            self.client.put_object,
            Bucket=self.config.bucket,
            Key=self.meta_key(key),
            Body=body,
            ContentType="application/json",
            **({"IfNoneMatch": "*"} if if_absent else {}),
        )

    async def _head_and_meta(self, key: str) -> tuple[ObjectInfo, str]:
        head = await self.call(
            f"stat {key}", self.client.head_object, Bucket=self.config.bucket, Key=self.data_key(key)
        )
        modified = head.get("LastModified") or datetime.now(UTC)
        info = ObjectInfo(
            key=key,
            size=int(head["ContentLength"]),
            modified=modified,
            metadata=await self._read_metadata(key),
            etag=str(head["ETag"]),
        )
        return info, info.etag

    async def _read_metadata(self, key: str) -> dict[str, str]:
        """The metadata published with ``key`` (one GET of its metadata object)."""
        try:
            meta = await self.call(
                f"reading metadata of {key}", self.client.get_object, Bucket=self.config.bucket, Key=self.meta_key(key)
            )
            raw = await self.call(f"reading metadata of {key}", meta["Body"].read)
            record = json.loads(raw)
            return {str(k): str(v) for k, v in record.get("metadata", {}).items()}
        except (ValueError, AttributeError) as exc:
            raise BackendUnavailable(f"unreadable metadata for {key}") from exc
