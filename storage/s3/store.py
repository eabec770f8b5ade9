"""The S3 backend as the service sees it: the storage protocol (create, open, stat, delete, list), compose,
presigned URLs, direct (client-sent) multipart uploads, and the sweep of abandoned uploads."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from storage.base import Capability, ObjectInfo, PartUrl, StoredPart, validate_key
from storage.errors import BackendUnavailable, ObjectNotFound, StorageError
from storage.s3.bucket import S3Bucket
from storage.s3.engine import EngineProbe, EngineProfile
from storage.s3.reader import S3Reader
from storage.s3.writer import S3Writer, copy_ranges

MAX_PRESIGN_SECONDS = 7 * 24 * 3600  # SigV4 presigned URLs live at most 7 days


# what each engine (endpoint, region, credentials) was seen to do, once per process: an engine does not change its
# conditional requests while a process runs, and a process that opens many buckets (the tests) probes once
_PROBED: dict[tuple[str | None, str | None, str | None], EngineProfile] = {}


class S3Storage(S3Bucket):
    """Objects in an S3 bucket. Capabilities: ranged reads, presigned URLs, multipart, compose."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this backend offers on its engine: before start() (or without probing) what the configuration
        says; after start() only what the probes saw working."""
        caps = {Capability.COMPOSE, Capability.COPY_RANGE, Capability.ABANDONED_UPLOADS}
        if self.engine is None or self.engine.presign != "none":
            caps |= {Capability.PRESIGN, Capability.DIRECT_UPLOAD}
        if self.atomic_if_absent:
            caps.add(Capability.ATOMIC_IF_ABSENT)
        if self.atomic_if_match:
            caps.add(Capability.ATOMIC_IF_MATCH)
        return frozenset(caps)

    async def start(self) -> None:
        """Check that the bucket exists and the credentials may use it, then learn what the engine does."""
        where = self.config.endpoint_url or "AWS"
        try:
            await self.call(
                f"checking bucket {self.config.bucket!r}", self.client.head_bucket, Bucket=self.config.bucket
            )
        except ObjectNotFound as exc:  # HeadBucket answers a bare 404
            raise BackendUnavailable(f"S3 bucket {self.config.bucket!r} does not exist at {where}") from exc
        if self.config.probe and self.engine is None:
            seen = (self.config.endpoint_url, self.config.region, self.config.access_key_id)
            self.engine = _PROBED.get(seen) or await self.probe()
            _PROBED[seen] = self.engine

    async def probe(self) -> EngineProfile:
        """What the engine does (:class:`EngineProfile`), by the probes of :mod:`storage.s3.engine` on this bucket."""
        return await EngineProbe(self).run()

    async def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)

    def create(
        self,
        key: str,
        *,
        size_hint: int | None = None,
        if_absent: bool = False,
        if_match: str | None = None,
        durable: bool = True,
    ) -> S3Writer:
        """``durable`` is moot: S3 acknowledges a write once it is stored."""
        validate_key(key)
        if if_absent and if_match is not None:
            raise ValueError("if_absent and if_match are exclusive")
        return S3Writer(self, key, size_hint, if_absent, if_match)

    async def compose(self, key: str, sources: list[str], metadata: Mapping[str, str]) -> ObjectInfo:
        """Concatenate ``sources`` server-side: one UploadPartCopy per source, or for a source larger than one
        copy moves (``max_compose_source``, 5 GiB) one per range of it (``CopySourceRange``, near-equal ranges:
        each at least half the limit, so at least 5 MiB), every part but the last at least 5 MiB (S3's part
        minimum); then the metadata, then CompleteMultipartUpload."""
        bucket = self.config.bucket
        sizes = []
        for source in sources:
            head = await self.call(f"stat {source}", self.client.head_object, Bucket=bucket, Key=self.data_key(source))
            sizes.append(int(head["ContentLength"]))
        pieces = [
            (source, piece)
            for source, size in zip(sources, sizes, strict=True)
            for piece in copy_ranges(size, self.rules.max_compose_source)
        ]
        response = await self.call(
            "starting a compose", self.client.create_multipart_upload, Bucket=bucket, Key=self.data_key(key)
        )
        upload_id = str(response["UploadId"])
        limit = asyncio.Semaphore(self.config.max_concurrency)

        async def copy(number: int, source: str, piece: tuple[int, int] | None) -> dict[str, Any]:
            ranged = {} if piece is None else {"CopySourceRange": f"bytes={piece[0]}-{piece[1] - 1}"}
            async with limit:
                result = await self.call(
                    f"copying {source}",
                    self.client.upload_part_copy,
                    Bucket=bucket,
                    Key=self.data_key(key),
                    UploadId=upload_id,
                    PartNumber=number,
                    CopySource={"Bucket": bucket, "Key": self.data_key(source)},
                    **ranged,
                )
            return {"PartNumber": number, "ETag": result["CopyPartResult"]["ETag"]}

        try:
            parts = await asyncio.gather(*(copy(i + 1, src, piece) for i, (src, piece) in enumerate(pieces)))
            await self.put_meta(key, {"metadata": dict(metadata), "size": sum(sizes)})
            await self.call(
                "completing a compose",
                self.client.complete_multipart_upload,
                Bucket=bucket,
                Key=self.data_key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": list(parts)},
            )
        except BaseException:
            try:
                await self.call(
                    "aborting a compose",
                    self.client.abort_multipart_upload,
                    Bucket=bucket,
                    Key=self.data_key(key),
                    UploadId=upload_id,
                )
            except StorageError:
                pass
            raise
        return await self.stat(key)

    async def abort_abandoned_uploads(self, older_than: float) -> int:
        """Abort multipart uploads under our prefix started more than ``older_than`` seconds ago: their writer died
        with its process (SIGKILL, a crash), so nothing will complete or abort them, and their parts cost storage.
        (AWS's lifecycle rule AbortIncompleteMultipartUpload does the same on the server side.)"""
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than)
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": f"{self.config.prefix}data/"}
        aborted = 0
        while True:
            page = await self.call("listing multipart uploads", self.client.list_multipart_uploads, **kwargs)
            for upload in page.get("Uploads", []):
                if upload["Initiated"] < cutoff:
                    try:
                        await self.call(
                            "aborting an abandoned upload",
                            self.client.abort_multipart_upload,
                            Bucket=self.config.bucket,
                            Key=upload["Key"],
                            UploadId=upload["UploadId"],
                        )
                        aborted += 1
                    except ObjectNotFound:
                        pass  # completed or aborted meanwhile
            if not page.get("IsTruncated"):
                return aborted
            kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")

    async def open(self, key: str) -> S3Reader:
        info, etag = await self._head_and_meta(key)
        return S3Reader(self, info, etag)

    async def stat(self, key: str) -> ObjectInfo:
        info, _ = await self._head_and_meta(key)
        return info

    async def delete(self, key: str) -> None:
        # bytes first: the object stops being visible before its metadata goes
        await self.call(f"deleting {key}", self.client.delete_object, Bucket=self.config.bucket, Key=self.data_key(key))
        await self.call(f"deleting {key}", self.client.delete_object, Bucket=self.config.bucket, Key=self.meta_key(key))

    async def list(
        self, prefix: str = "", *, start_after: str | None = None, limit: int | None = None, metadata: bool = False
    ) -> AsyncIterator[ObjectInfo]:
        """ListObjectsV2 pages (Prefix, StartAfter, MaxKeys): one LIST call per page of up to 1,000 keys; size and
        modification time come from the listing entries, and the metadata object is read only with ``metadata``."""
        root = f"{self.config.prefix}data/"
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": root + prefix}
        if start_after is not None:
            kwargs["StartAfter"] = root + start_after
        left = limit
        while left is None or left > 0:
            kwargs["MaxKeys"] = 1000 if left is None else min(left, 1000)
            page = await self.call("listing objects", self.client.list_objects_v2, **kwargs)
            for item in page.get("Contents", []):
                key = str(item["Key"])[len(root) :]
                info = ObjectInfo(
                    key=key, size=int(item["Size"]), modified=item["LastModified"], etag=str(item.get("ETag", ""))
                )
                if metadata:
                    try:
                        info = replace(info, metadata=await self._read_metadata(key))
                    except ObjectNotFound:
                        continue  # deleted meanwhile
                yield info
                if left is not None:
                    left -= 1
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs.pop("StartAfter", None)
            kwargs["ContinuationToken"] = token

    async def presign_put(
        self, key: str, *, expires_in: int, content_type: str | None = None, content_length: int | None = None
    ) -> str:
        """A presigned PUT URL for ``key`` (one PutObject, up to 5 GiB), valid for ``expires_in`` seconds (capped at
        7 days); the given Content-Type and Content-Length are part of the signature."""
        expires_in = min(expires_in, MAX_PRESIGN_SECONDS)
        # the metadata half first (empty): the object is then an ordinary one of this backend the moment the PUT
        # lands, and until it does, stat() finds no bytes and says ObjectNotFound; delete() removes both halves
        await self.put_meta(key, {"metadata": {}})
        params: dict[str, Any] = {"Bucket": self.config.bucket, "Key": self.data_key(key)}
        if content_type:
            params["ContentType"] = content_type
        if content_length is not None:
            params["ContentLength"] = content_length
        url: str = await self.call(
            "presigning a URL", self.client.generate_presigned_url, "put_object", Params=params, ExpiresIn=expires_in
        )
        return url

    async def presign_get(
        self,
        key: str,
        *,
        expires_in: int,
        content_type: str | None = None,
        content_encoding: str | None = None,
        content_disposition: str | None = None,
    ) -> str:
        """A presigned GET URL for ``key``, valid for ``expires_in`` seconds (capped at 7 days and at the lifetime of
        temporary credentials)."""
        expires_in = min(expires_in, MAX_PRESIGN_SECONDS)
        credentials = self.session.get_credentials()
        expiry = getattr(credentials, "_expiry_time", None)
        if isinstance(expiry, datetime):
            expires_in = max(1, min(expires_in, int((expiry - datetime.now(UTC)).total_seconds())))
        params: dict[str, Any] = {"Bucket": self.config.bucket, "Key": self.data_key(key)}
        if content_type:
            params["ResponseContentType"] = content_type
        if content_encoding:
            params["ResponseContentEncoding"] = content_encoding
        if content_disposition:
            params["ResponseContentDisposition"] = content_disposition
        url: str = await self.call(
            "presigning a URL", self.client.generate_presigned_url, "get_object", Params=params, ExpiresIn=expires_in
        )
        return url

    async def begin_direct_upload(self, key: str) -> str:
        """CreateMultipartUpload for ``key`` asking for SHA-256 part checksums (S3 additional checksums; backends
        without them, like Swift's s3api 2.38, ignore the request and still verify each part's signed checksum)."""
        response = await self.call(
            "starting a direct upload",
            self.client.create_multipart_upload,
            Bucket=self.config.bucket,
            Key=self.data_key(key),
            ChecksumAlgorithm="SHA256",
        )
        return str(response["UploadId"])

    async def presign_part(
        self, key: str, upload_id: str, number: int, *, sha256_b64: str, size: int, expires_in: int
    ) -> PartUrl:
        """A presigned UploadPart URL whose signature covers ``x-amz-checksum-sha256`` (SigV4 signed header): the
        bucket refuses the part (BadDigest) unless its bytes have that SHA-256, and a request without the header
        does not match the signature. ``Content-Length`` is signed too (SignedHeaders): a part of any other length
        than ``size`` does not match the signature and is refused before it is stored. Every HTTP client sends the
        length of what it sends, so it is not among the headers to set (browsers may not set it)."""
        expires_in = max(1, min(expires_in, MAX_PRESIGN_SECONDS))
        params = {
            "Bucket": self.config.bucket,
            "Key": self.data_key(key),
            "UploadId": upload_id,
            "PartNumber": number,
            "ChecksumSHA256": sha256_b64,
            "ContentLength": size,
        }
        url: str = await self.call(
            "presigning a part", self.client.generate_presigned_url, "upload_part", Params=params, ExpiresIn=expires_in
        )
        return PartUrl(url=url, method="PUT", headers={"x-amz-checksum-sha256": sha256_b64}, expires_in=expires_in)

    async def list_direct_parts(self, key: str, upload_id: str) -> builtins.list[StoredPart]:
        """ListParts, every page."""
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Key": self.data_key(key), "UploadId": upload_id}
        parts: builtins.list[StoredPart] = []
        while True:
            page = await self.call("listing parts", self.client.list_parts, **kwargs)
            for item in page.get("Parts", []):
                parts.append(
                    StoredPart(
                        number=int(item["PartNumber"]),
                        size=int(item["Size"]),
                        etag=str(item["ETag"]),
                        sha256_b64=item.get("ChecksumSHA256"),
                    )
                )
            if not page.get("IsTruncated"):
                return sorted(parts, key=lambda p: p.number)
            kwargs["PartNumberMarker"] = page.get("NextPartNumberMarker", 0)

    async def assemble_direct_upload(self, key: str, upload_id: str, parts: builtins.list[StoredPart]) -> None:
        """CompleteMultipartUpload with the listed parts (and their checksums where the backend reported them)."""
        listed: builtins.list[dict[str, Any]] = []
        for part in parts:
            entry: dict[str, Any] = {"PartNumber": part.number, "ETag": part.etag}
            if part.sha256_b64:
                entry["ChecksumSHA256"] = part.sha256_b64
            listed.append(entry)
        await self.call(
            "assembling a direct upload",
            self.client.complete_multipart_upload,
            Bucket=self.config.bucket,
            Key=self.data_key(key),
            UploadId=upload_id,
            MultipartUpload={"Parts": listed},
        )

    async def read_assembled(self, key: str, start: int, end: int) -> AsyncIterator[bytes]:
        if start >= end:
            return
        response = await self.call(
            f"reading back {key}",
            self.client.get_object,
            Bucket=self.config.bucket,
            Key=self.data_key(key),
            Range=f"bytes={start}-{end - 1}",
        )
        body = response["Body"]
        try:
            while chunk := await self.call(f"reading back {key}", body.read, self.config.buffer_size):
                yield chunk
        finally:
            await asyncio.get_running_loop().run_in_executor(self.executor, body.close)

    async def publish_assembled(self, key: str, metadata: Mapping[str, str]) -> ObjectInfo:
        """Writing the metadata publishes the assembled bytes."""
        head = await self.call(
            f"stat {key}", self.client.head_object, Bucket=self.config.bucket, Key=self.data_key(key)
        )
        await self.put_meta(key, {"metadata": dict(metadata), "size": int(head["ContentLength"])})
        return await self.stat(key)

    async def discard_direct_upload(self, key: str, upload_id: str | None) -> None:
        if upload_id is not None:
            try:
                await self.call(
                    "aborting a direct upload",
                    self.client.abort_multipart_upload,
                    Bucket=self.config.bucket,
                    Key=self.data_key(key),
                    UploadId=upload_id,
                )
            except ObjectNotFound:
                pass
        try:  # published (its metadata written): not this call's to delete, whoever aborts the upload
            await self._read_metadata(key)
            return
        except ObjectNotFound:
            pass
        await self.call(
            f"discarding {key}", self.client.delete_object, Bucket=self.config.bucket, Key=self.data_key(key)
        )
