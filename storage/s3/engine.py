"""What an S3 engine really does with the requests this backend depends on, learnt at start-up by probes, never
guessed from the server's name. Engines differ exactly there:

=====================================  ==========  ==========  ==========  ===========
probe                                  AWS S3      Ceph 16.2   Ceph 20.2   Swift s3api
=====================================  ==========  ==========  ==========  ===========
PutObject If-None-Match: * (atomic)    yes         yes         yes         not atomic
PutObject If-Match                     quoted      unquoted    quoted      refused
If-Match on a missing key              404         412         404         -
CompleteMultipartUpload If-None-Match  yes         ignored     yes         yes
CompleteMultipartUpload If-Match       quoted      ignored     quoted      refused
UploadPartCopy copy-source-if-match    yes         ignored     ignored     yes
PutObject x-amz-checksum-sha256        verified    stored      stored      verified
UploadPart x-amz-checksum-sha256       verified    stored      verified    verified
=====================================  ==========  ==========  ==========  ===========

(AWS from its documentation; the others as these probes see them: Ceph 20.2.4 from Debian sid, 16.2.15 from Debian
12, Swift 2.38. Ceph 20.2 accepts the If-Match of a PutObject quoted or not, and only the quoted form on
CompleteMultipartUpload; it honours copy-source conditions on CopyObject, which this backend does not use, but not on
UploadPartCopy; it verifies a part's checksum only in a multipart upload created with ``ChecksumAlgorithm=SHA256``,
as the probe's and the direct uploads' are. Swift checks its conditions before writing, not atomically.)

The probes run on a reserved prefix (``<prefix>probe/<random>/…``, outside the data and metadata namespaces) and
delete what they made: about forty requests (a second on Ceph here), once per engine and process.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import botocore.exceptions
import httpx

from storage.errors import BackendUnavailable, StorageError

if TYPE_CHECKING:
    from storage.s3.client import S3Client

IfMatchForm = Literal["quoted", "unquoted", "ignored", "refused", "broken"]
IF_MATCH_FORMS: dict[IfMatchForm, str] = {
    "quoted": "used: the ETag as returned",
    "unquoted": "used: the ETag without its quotes",
}
STALE_ETAG = '"00000000000000000000000000000000"'  # no object has this ETag (the MD5 of nothing is d41d8…)


def response_status(exc: BaseException) -> int | None:
    """The HTTP status of the S3 answer behind a translated error, when there was one."""
    cause = exc.__cause__
    if isinstance(cause, botocore.exceptions.ClientError):
        status = cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def quoted(etag: str) -> str:
    """``etag`` with its quotes, as S3 returns it."""
    return etag if etag.startswith('"') else f'"{etag}"'


def unquoted(etag: str) -> str:
    """``etag`` without its quotes, as Ceph 16 stores (and compares) it."""
    return etag[1:-1] if len(etag) >= 2 and etag.startswith('"') and etag.endswith('"') else etag


def in_form(etag: str, form: IfMatchForm) -> str:
    """``etag`` written the way an engine of ``form`` compares it (quoted unless it compares unquoted)."""
    return unquoted(etag) if form == "unquoted" else quoted(etag)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """What an S3 engine was seen to do at start-up. Each field is the outcome of a request or two.

    An ``IfMatchForm`` says how a request's ``If-Match`` with the current ETag fared: ``quoted`` (as S3 returns it:
    AWS, MinIO, Ceph 20.2), ``unquoted`` (only without the quotes: Ceph 16 compares byte for byte with the ETag it
    stores), ``refused`` (501/400: Swift's s3api on a PUT), ``ignored`` (a stale ETag is accepted too: no compare at
    all), ``broken`` (neither form of the current ETag is accepted)."""

    conditional_create: bool  # PutObject If-None-Match: * refuses an existing key, and one of eight racers wins
    if_match: IfMatchForm  # PutObject If-Match
    if_match_missing: int | None  # the status of If-Match on a key with no object (AWS, Ceph 20: 404; Ceph 16: 412)
    get_if_match: IfMatchForm  # GetObject If-Match with the ETag (quoted / unquoted), what pinned readers send
    complete_if_none_match: bool  # CompleteMultipartUpload honours If-None-Match: * (Ceph 16: ignored, overwrites)
    complete_if_match: IfMatchForm  # CompleteMultipartUpload If-Match (Ceph 16: ignored)
    copy_if_match: bool  # UploadPartCopy refuses a stale x-amz-copy-source-if-match (Ceph 16, 20.2: copies anyway)
    put_checksum_verified: bool  # PutObject refuses a wrong x-amz-checksum-sha256 (Ceph 16 and 20: stored)
    part_checksums_verified: bool  # UploadPart refuses a wrong x-amz-checksum-sha256 (Ceph 16: stored unchecked)
    presign: str  # the presigned-URL signature the engine accepts: "sigv4", or "none"

    @property
    def compare_and_set(self) -> bool:
        """Replace-if-version is atomic on the engine (the server compares, not us)."""
        return self.if_match in IF_MATCH_FORMS

    def rows(self) -> list[tuple[str, str, str]]:
        """(probe, outcome, what the backend does with it), for ``transfer storage check``."""
        yes = {True: "yes", False: "no"}
        return [
            (
                "conditional create (If-None-Match: *)",
                yes[self.conditional_create],
                "used: new ids, parts, records" if self.conditional_create else "not atomic: one replica only",
            ),
            (
                "conditional replace (PutObject If-Match)",
                self.if_match,
                IF_MATCH_FORMS.get(self.if_match, "no compare-and-set: one replica only"),
            ),
            ("If-Match on a missing key", str(self.if_match_missing or "-"), "either means: changed"),
            ("GetObject If-Match (pinned reads)", self.get_if_match, "readers never mix two versions"),
            (
                "conditional CompleteMultipartUpload (If-None-Match: *)",
                yes[self.complete_if_none_match],
                "used: a large create-if-absent is decided by its completion"
                if self.complete_if_none_match
                else "a large create-if-absent claims its key by its metadata first",
            ),
            (
                "conditional CompleteMultipartUpload (If-Match)",
                self.complete_if_match,
                IF_MATCH_FORMS.get(
                    self.complete_if_match, "a large replace compares by HEAD first (one process at a time)"
                ),
            ),
            (
                "UploadPartCopy copy-source-if-match",
                yes[self.copy_if_match],
                "used: a copied range is of the version read"
                if self.copy_if_match
                else "the source's version is checked by HEAD after the copies",
            ),
            (
                "PutObject checksum verified (x-amz-checksum-sha256)",
                yes[self.put_checksum_verified],
                "presigned PUTs checked by the engine and read back"
                if self.put_checksum_verified
                else "presigned PUTs read back before publication (the engine stores wrong ones)",
            ),
            (
                "UploadPart checksum verified (x-amz-checksum-sha256)",
                yes[self.part_checksums_verified],
                "direct parts checked by the engine and read back"
                if self.part_checksums_verified
                else "direct parts read back before publication (the engine stores wrong ones)",
            ),
            (
                "presigned URL signature",
                self.presign,
                "signed_url and direct uploads" if self.presign != "none" else "no signed_url, no direct uploads",
            ),
        ]


class EngineProbe:
    """The probes of :class:`EngineProfile` on one bucket of ``storage``: :meth:`run` once."""

    def __init__(self, storage: S3Client) -> None:
        self.s = storage
        self.c = storage.client
        self.base = f"{storage.config.prefix}probe/{secrets.token_hex(8)}/"

    async def raw(self, fn: Callable[..., Any], **kwargs: Any) -> tuple[int, Any]:
        """One probe request: (HTTP status, response or None); a refusal is an outcome, not an error."""
        try:
            return 200, await self.s.call("probing", fn, Bucket=self.s.config.bucket, **kwargs)
        except StorageError as exc:
            status = response_status(exc)
            if status is None:
                raise
            return status, None

    async def etag(self, key: str) -> str:
        """The current ETag of probe object ``key``, as returned (HEAD)."""
        head = (await self.raw(self.c.head_object, Key=key))[1]
        if head is None:
            raise BackendUnavailable(f"S3 lost a probe object in {self.s.config.bucket!r}")
        return str(head["ETag"])

    async def run(self) -> EngineProfile:
        """Every probe, in order (some change the probe object: each reads its version first); whatever happens,
        the probe objects are deleted and no multipart upload is left open."""
        c, a = self.c, self.base + "a"
        made = [a, self.base + "missing", self.base + "put"]
        try:
            status, _ = await self.raw(c.put_object, Key=a, Body=b"1", IfNoneMatch="*")
            if status in (409, 412):  # the key is new to this probe: our own create, retried after its answer was lost
                head = (await self.raw(c.head_object, Key=a))[1]
                if head is not None and head.get("ContentLength") == 1:
                    status = 200
            if status != 200:
                raise BackendUnavailable(f"S3 refused a probe PutObject ({status}) in {self.s.config.bucket!r}")
            status, _ = await self.raw(c.put_object, Key=a, Body=b"2", IfNoneMatch="*")
            conditional_create = status in (409, 412) and await self.create_race(self.base + "race")
            if_match = await self.put_if_match(a)
            status, _ = await self.raw(c.put_object, Key=self.base + "missing", Body=b"", IfMatch='"0"')
            if_match_missing = status if status != 200 and if_match != "refused" else None
            get_if_match = await self.get_if_match(a)
            complete_if_none_match = await self.complete(a, IfNoneMatch="*") in (409, 412)
            complete_if_match = await self.complete_if_match(a)
            copy_if_match = await self.copy_if_match(a, get_if_match)
            put_checksum_verified = await self.put_checksum(self.base + "put")
            part_checksums_verified = await self.part_checksum(self.base + "c")
            return EngineProfile(
                conditional_create=conditional_create,
                if_match=if_match,
                if_match_missing=if_match_missing,
                get_if_match=get_if_match,
                complete_if_none_match=complete_if_none_match,
                complete_if_match=complete_if_match,
                copy_if_match=copy_if_match,
                put_checksum_verified=put_checksum_verified,
                part_checksums_verified=part_checksums_verified,
                presign=await self.presign(a),
            )
        finally:
            for key in made:
                with contextlib.suppress(StorageError):
                    await self.s.call("cleaning up probes", c.delete_object, Bucket=self.s.config.bucket, Key=key)

    async def put_if_match(self, key: str) -> IfMatchForm:
        """PutObject If-Match with the current ETag, quoted then unquoted; the form that works must also refuse the
        version it just replaced."""
        current = await self.etag(key)
        for form in ("quoted", "unquoted"):
            value = in_form(current, form)
            status, _ = await self.raw(self.c.put_object, Key=key, Body=b"3", IfMatch=value)
            if status == 200:
                status, _ = await self.raw(self.c.put_object, Key=key, Body=b"4", IfMatch=value)  # now stale
                return "ignored" if status == 200 else form
            if status in (400, 501):
                return "refused"
        return "broken"

    async def get_if_match(self, key: str) -> IfMatchForm:
        """GetObject If-Match with the current ETag, quoted then unquoted: the first form answered with the bytes."""
        etag = await self.etag(key)
        for form in ("quoted", "unquoted"):
            status, answer = await self.raw(self.c.get_object, Key=key, IfMatch=in_form(etag, form))
            if answer is not None:
                answer["Body"].close()
            if status in (200, 206):
                return form
        return "broken"

    async def create_race(self, key: str, writers: int = 8) -> bool:
        """``writers`` concurrent If-None-Match: * creators of one new key: exactly one may win. (A check made
        before the write, as Swift's s3api makes it, lets several win; one race cannot prove atomicity, but it
        catches that.)"""
        c = self.c
        try:
            outcomes = await asyncio.gather(
                *(self.raw(c.put_object, Key=key, Body=b"%d" % i, IfNoneMatch="*") for i in range(writers))
            )
            return sum(status == 200 for status, _ in outcomes) == 1
        finally:
            with contextlib.suppress(StorageError):
                await self.s.call("cleaning up probes", c.delete_object, Bucket=self.s.config.bucket, Key=key)

    async def complete(self, key: str, **condition: str) -> int | None:
        """A one-part multipart upload onto ``key`` completed under ``condition``: the completion's status (None if
        the upload could not be made at all). An upload left open by a refusal is aborted."""
        c = self.c
        _, started = await self.raw(c.create_multipart_upload, Key=key)
        if started is None:
            return None
        upload_id = str(started["UploadId"])
        status = None
        try:
            _, part = await self.raw(c.upload_part, Key=key, UploadId=upload_id, PartNumber=1, Body=b"5")
            if part is None:
                return None
            status, _ = await self.raw(
                c.complete_multipart_upload,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
                **condition,
            )
            return status
        finally:
            if status != 200:
                with contextlib.suppress(StorageError):
                    await self.s.call(
                        "probing", c.abort_multipart_upload, Bucket=self.s.config.bucket, Key=key, UploadId=upload_id
                    )

    async def complete_if_match(self, key: str) -> IfMatchForm:
        """CompleteMultipartUpload If-Match with the current ETag, quoted then unquoted (Ceph 20.2 takes only the
        quoted one there, though its PutObject takes both); the form that works must refuse a stale one."""
        for form in ("quoted", "unquoted"):
            status = await self.complete(key, IfMatch=in_form(await self.etag(key), form))
            if status == 200:
                stale = await self.complete(key, IfMatch=in_form(STALE_ETAG, form))
                return "ignored" if stale == 200 else form
            if status in (400, 501) or status is None:
                return "refused"
        return "broken"

    async def copy_if_match(self, source: str, form: IfMatchForm) -> bool:
        """UploadPartCopy of ``source`` with a stale x-amz-copy-source-if-match: refused (412), while the current
        ETag copies."""
        if form not in IF_MATCH_FORMS:
            return False
        c, target = self.c, self.base + "copy"
        _, started = await self.raw(c.create_multipart_upload, Key=target)
        if started is None:
            return False
        upload_id = str(started["UploadId"])
        source_of = {"Bucket": self.s.config.bucket, "Key": source}
        copy: dict[str, Any] = {"Key": target, "UploadId": upload_id, "PartNumber": 1, "CopySource": source_of}
        try:
            stale, _ = await self.raw(c.upload_part_copy, **copy, CopySourceIfMatch=in_form(STALE_ETAG, form))
            current, _ = await self.raw(
                c.upload_part_copy, **copy, CopySourceIfMatch=in_form(await self.etag(source), form)
            )
            return stale == 412 and current == 200
        finally:
            with contextlib.suppress(StorageError):
                await self.s.call(
                    "probing", c.abort_multipart_upload, Bucket=self.s.config.bucket, Key=target, UploadId=upload_id
                )

    async def put_checksum(self, key: str) -> bool:
        """PutObject with a wrong x-amz-checksum-sha256: refused (the engine verifies it) or stored."""
        status, _ = await self.raw(self.c.put_object, Key=key, Body=b"6", ChecksumSHA256=_wrong_sha256())
        return status != 200

    async def part_checksum(self, key: str) -> bool:
        """UploadPart with a wrong x-amz-checksum-sha256, in an upload created for SHA-256 checksums (as direct
        uploads are): refused (the engine verifies part checksums) or stored."""
        c = self.c
        _, started = await self.raw(c.create_multipart_upload, Key=key, ChecksumAlgorithm="SHA256")
        if started is None:
            return False
        upload_id = str(started["UploadId"])
        try:
            status, _ = await self.raw(
                c.upload_part, Key=key, UploadId=upload_id, PartNumber=1, Body=b"6", ChecksumSHA256=_wrong_sha256()
            )
            return status != 200
        finally:
            with contextlib.suppress(StorageError):
                await self.s.call(
                    "probing", c.abort_multipart_upload, Bucket=self.s.config.bucket, Key=key, UploadId=upload_id
                )

    async def presign(self, key: str) -> str:
        """A presigned GetObject URL fetched without credentials: ``sigv4`` if the engine serves it."""
        url = await self.s.call(
            "probing", self.c.generate_presigned_url, "get_object", Params={"Bucket": self.s.config.bucket, "Key": key}
        )
        async with httpx.AsyncClient(timeout=self.s.config.read_timeout) as http:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url)).status_code == 200:
                    return "sigv4"
        return "none"


def _wrong_sha256() -> str:
    return base64.b64encode(hashlib.sha256(b"not these bytes").digest()).decode()
