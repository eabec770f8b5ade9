"""Direct-to-storage uploads: the client sends the bytes to the bucket itself, the service only plans, signs and
verifies.

    plan      -> :meth:`DirectService.create`: the backend starts a multipart upload; the plan record
                 (``direct/<plan id>.json``) holds its owner, size, part size, upload id and expiry
    part URLs -> :meth:`DirectService.part_urls`: one presigned UploadPart URL per part, each bound to the part's
                 SHA-256 (the bucket refuses other bytes) and expiring
    resume    -> :meth:`DirectService.status`: the parts the bucket holds (ListParts), so a client sends only the rest
    complete  -> :meth:`DirectService.complete`: every part checked (numbers 1..n, each of the planned size), the
                 parts assembled (still unpublished), read back from the bucket and hashed; published as a stored
                 file only when that SHA-256 equals the one the client declared; otherwise the assembled bytes are
                 deleted and the plan is aborted (nothing published)
    abort     -> :meth:`DirectService.abort`; expired plans go in the upload engine's one sweep

Why read back: S3's additional checksums give SHA-256 per part and, for multipart objects, only a checksum of the
part checksums (COMPOSITE); a full-object checksum type exists for CRC algorithms only. No backend hands us the
whole file's SHA-256, so the service hashes the assembled bytes as the bucket serves them (ranged reads in
parallel, hashed in order). The client's payload never passes through the service; the read-back is the service
reading from its own bucket.

A backend without the DIRECT_UPLOAD capability (local storage) answers every call with DirectUploadUnsupported
(409 ``direct_upload_unsupported``): clients fall back to uploading through the service.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Self

from storage.base import Capability, PartUrl, Storage, StoredPart, SupportsDirectUpload
from storage.parts import part_count
from storage.rules import rules_of
from transfer.core.auth import Grant
from transfer.core.ids import new_id
from transfer.core.model.content import checksum_hex
from transfer.core.uploads.state import NO_INTENT, FileIntent, UploadRecord, UploadState
from transfer.errors import (
    ChecksumMismatch,
    DirectUploadUnsupported,
    Gone,
    InvalidRequest,
    NotFound,
    PlanIncomplete,
    SizeMismatch,
    TooLarge,
    TransferError,
    storage_errors_translated,
)
from transfer.service.accounting.slots import OpenSlots
from transfer.service.files.publisher import SNIFF_BYTES, Candidate, file_id_for
from transfer.service.files.records import FileRecord, object_key
from transfer.service.hashing import ranges_ahead, read_back
from transfer.service.uploads.lifecycle import UploadKind, UploadLifecycle
from transfer.settings import Settings

log = logging.getLogger("transfer.direct")

PLAN_PREFIX = "direct/"
PART_URL_TTL = 3600  # seconds a part URL lives; a client asks again for parts it has not started by then
MAX_URLS_PER_REQUEST = 1000
PLAN_CACHE_SIZE = 1024
READ_BACK_WINDOW = 8 << 20  # bytes per ranged read of the verification
READ_BACK_AHEAD = 4  # ranged reads in flight while the hash runs (memory: READ_BACK_AHEAD x READ_BACK_WINDOW)


def new_plan_id() -> str:
    """A fresh direct-upload plan id (``d_`` and 128 random bits)."""
    return new_id("d_")


def _plan_key(pid: str, owner: str | None = None) -> str:
    return f"{PLAN_PREFIX}{pid}.json"


def _listed(key: str) -> tuple[str, bool] | None:
    name = key[len(PLAN_PREFIX) :]
    return (name.removesuffix(".json"), True) if name.endswith(".json") and "/" not in name else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan(UploadRecord):
    """The record of one direct upload: the shared fields of every upload, and its size, part size and the
    backend's multipart upload."""

    size: int
    part_size: int
    upload_id: str = ""
    checksum: str | None = None  # sha256:<hex> declared at planning (else at completion)

    @property
    def part_count(self) -> int:
        """How many parts the plan's size takes at its part size."""
        return part_count(self.size, self.part_size)

    @property
    def key(self) -> str:
        """The object the parts become: the file's own key (the file id follows from the plan id)."""
        return object_key(file_id_for(self.id))

    def part_length(self, number: int) -> int:
        """The length part ``number`` (from 1) must have."""
        return min(self.part_size, self.size - (number - 1) * self.part_size)

    def to_json(self) -> dict[str, Any]:
        """The plan record as stored."""
        return {
            **self.base_json(),
            "size": self.size,
            "part_size": self.part_size,
            "upload_id": self.upload_id,
            "checksum": self.checksum,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Self:
        """A plan record as stored (one written before the shared form: its flat fields)."""
        return cls(
            **cls.base_fields(doc),
            size=int(doc["size"]),
            part_size=int(doc["part_size"]),
            upload_id=str(doc.get("upload_id") or ""),
            checksum=doc.get("checksum"),
        )


def _checksum(value: str) -> str:
    try:
        return "sha256:" + checksum_hex(value)
    except ValueError as exc:
        raise InvalidRequest(f"checksum must be sha256:<64 hex digits>: {value!r}") from exc


def _sha256_b64(hex_or_checksum: str) -> str:
    """A part's SHA-256 as S3 wants it (base64 of the digest) from ``<64 hex>`` or ``sha256:<64 hex>``."""
    try:
        digest = bytes.fromhex(checksum_hex(hex_or_checksum))
    except (ValueError, binascii.Error, TransferError) as exc:
        raise InvalidRequest(f"part sha256 must be 64 hex digits: {hex_or_checksum!r}") from exc
    if len(digest) != 32:
        raise InvalidRequest(f"part sha256 must be 64 hex digits: {hex_or_checksum!r}")
    return base64.b64encode(digest).decode("ascii")


def _gone(plan: Plan, state: UploadState) -> TransferError:
    return Gone(f"upload plan {plan.id} " + ("was aborted" if state is UploadState.ABORTED else "has expired"))


class DirectService:
    """Upload plans on a backend with the DIRECT_UPLOAD capability: the direct-upload door of the one upload
    lifecycle (its wire: plans, part URLs, the read-back)."""

    def __init__(
        self,
        storage: Storage,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        lifecycle: UploadLifecycle,
        slots: OpenSlots,
    ) -> None:
        # collaborators come from the composition root (Services.build), shared with every other door
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.lifecycle = lifecycle
        self.kind = lifecycle.register(
            UploadKind(
                name="plan",
                noun="upload plan",
                prefix="d",
                decode=Plan.from_json,
                encode=Plan.to_json,
                key=_plan_key,
                listing=PLAN_PREFIX,
                listed=_listed,
                slots=slots,
                discard=self._discard,
                gone=_gone,
            )
        )
        # recently loaded plans and the record version each was read at, for part URLs only (see part_urls)
        self._plans: dict[str, tuple[Plan, str]] = {}

    @property
    def supported(self) -> bool:
        """Whether the backend takes uploads directly (the DIRECT_UPLOAD capability)."""
        return Capability.DIRECT_UPLOAD in self.storage.capabilities and isinstance(self.storage, SupportsDirectUpload)

    def _backend(self) -> SupportsDirectUpload:
        storage = self.storage
        if Capability.DIRECT_UPLOAD not in storage.capabilities or not isinstance(storage, SupportsDirectUpload):
            raise DirectUploadUnsupported(
                "this storage backend does not take uploads directly; upload through the service (POST /v1/files, "
                "sessions or tus)"
            )
        return storage

    def _ttl(self) -> float:
        """A plan must not outlive its multipart upload: the abandoned-upload sweep aborts those older than the
        backend's ``abandoned_upload_age``."""
        age = rules_of(self.storage).abandoned_upload_age
        return min(float(self.settings.session_ttl), float(self.settings.session_ttl if age is None else age))

    async def load(self, pid: str, caller: Grant, *, allow_ended: bool = False) -> Plan:
        """The plan, if the caller may see it (its own; any for admin); NotFound otherwise, whether or not it
        exists. An expired or aborted plan is Gone unless ``allow_ended``."""
        self._backend()
        return await self.lifecycle.load(self.kind, pid, caller, allow_ended=allow_ended)

    async def create(
        self, *, size: int, caller: Grant, intent: FileIntent = NO_INTENT, checksum: str | None = None
    ) -> Plan:
        """A new plan owned by the caller's key: the backend's multipart upload is started now. Its ``size`` is
        reserved against the key's byte quota (QuotaExceeded, before anything is started, when it does not fit).
        Content the key already stores (a declared ``checksum``) is published at once, sharing those bytes: the
        plan is born completed (no part to send, ``complete`` answers the file) and holds no slot, reservation or
        multipart upload."""
        backend = self._backend()
        s = self.settings
        if size < 0:
            raise InvalidRequest("size must not be negative")
        if size > s.max_upload_size:
            raise TooLarge(f"{size} bytes exceed the upload limit of {s.max_upload_size}")
        with storage_errors_translated():
            part_size = rules_of(self.storage).part_size(size, max_size=s.max_upload_size)
        now = self.clock()
        plan = Plan(
            id=new_plan_id(),
            owner=caller.owner,
            created_at=now,
            expires_at=now + self._ttl(),
            intent=intent,
            size=size,
            part_size=part_size,
            checksum=None if checksum is None else _checksum(checksum),
        )

        async def begin(plan: Plan) -> Plan:
            with storage_errors_translated():
                return replace(plan, upload_id=await backend.begin_direct_upload(plan.key))

        async def undo(plan: Plan) -> None:
            with storage_errors_translated():
                await backend.discard_direct_upload(plan.key, plan.upload_id)

        known = None if plan.checksum is None else (checksum_hex(plan.checksum), size)
        return await self.lifecycle.open(self.kind, plan, reserve=size, known=known, prepare=begin, undo=undo)

    async def part_urls(self, pid: str, parts: list[tuple[int, str]], caller: Grant) -> list[tuple[int, PartUrl]]:
        """A presigned URL per ``(part number, sha256 hex)``: the bucket takes only bytes with that SHA-256 for that
        part, until the URL expires (an hour at most, never past the plan's expiry). The URL binds the length
        too (the bucket refuses a part of any other length); :meth:`complete` checks every part's size again."""
        backend = self._backend()
        # A client asks for a URL per part: reading the plan record each time would cost three backend requests per
        # part. A copy loaded before serves as long as the record is still the version it was read at: one stat
        # tells (on S3 a HEAD and the small metadata GET, not the record's body), so a plan completed or aborted
        # through any replica is seen at once on every one (410 for an aborted plan's parts), and only a changed
        # record is read again.
        cached = self._plans.get(pid) if self.kind.owns(pid) else None
        if cached is not None:
            version: str | None = await self.lifecycle.version(self.kind, pid)
            if version != cached[1]:
                self._plans.pop(pid, None)
                cached = None
        if cached is None:
            self._backend()
            plan, version = await self.lifecycle.load_versioned(self.kind, pid, caller, allow_ended=False)
        else:
            plan, version = cached
        if not caller.sees(plan.owner):
            raise NotFound(f"no upload plan {pid!r}")
        state = plan.state_at(self.clock())
        if state in (UploadState.ABORTED, UploadState.EXPIRED):
            raise _gone(plan, state)
        self._require_open(plan)
        if pid not in self._plans and version:
            while len(self._plans) >= PLAN_CACHE_SIZE:
                self._plans.pop(next(iter(self._plans)))
            self._plans[pid] = (plan, version)
        if len(parts) > MAX_URLS_PER_REQUEST:
            raise InvalidRequest(f"at most {MAX_URLS_PER_REQUEST} part URLs per request")
        ttl = int(max(1.0, min(PART_URL_TTL, plan.expires_at - self.clock())))
        out = []
        for number, sha in parts:
            if not 1 <= number <= plan.part_count:
                raise InvalidRequest(f"part {number} is outside 1..{plan.part_count}")
            with storage_errors_translated():
                url = await backend.presign_part(
                    plan.key,
                    plan.upload_id,
                    number,
                    sha256_b64=_sha256_b64(sha),
                    size=plan.part_length(number),
                    expires_in=ttl,
                )
            out.append((number, url))
        return out

    async def stored_parts(self, plan: Plan) -> list[StoredPart]:
        """The parts the bucket holds for an open plan (ListParts): what a resuming client need not send."""
        if plan.state_at(self.clock()) is not UploadState.OPEN:
            return []
        with storage_errors_translated():
            return await self._backend().list_direct_parts(plan.key, plan.upload_id)

    def _require_open(self, plan: Plan) -> None:
        if plan.state is UploadState.COMPLETED:
            raise InvalidRequest(f"upload plan {plan.id} is already complete (file {plan.file_id})")

    async def complete(self, pid: str, caller: Grant, *, checksum: str | None = None) -> tuple[Plan, FileRecord]:
        """Check every part, assemble, verify the whole SHA-256 by reading the bytes back, publish. A completed plan
        returns its file again (a retried completion is answered, not refused). A mismatch aborts the plan:
        nothing is published and its parts go."""
        backend = self._backend()
        given = None if checksum is None else _checksum(checksum)

        async def gather(plan: Plan) -> tuple[Candidate, Any]:
            declared = plan.checksum
            if given is not None:
                if declared is not None and declared != given:
                    raise InvalidRequest("the checksum differs from the one declared when planning")
                declared = given
            if declared is None:
                raise InvalidRequest("declare the file's checksum (sha256:<hex>) to complete")
            parts = await self.stored_parts(plan)
            self._check_parts(plan, parts)
            # refused before the parts are assembled, the plan left open
            await self.lifecycle.require_room(plan, plan.size)
            with storage_errors_translated():
                await backend.assemble_direct_upload(plan.key, plan.upload_id, parts)
            sha_hex, head = await self._read_back(backend, plan)
            if sha_hex != checksum_hex(declared):
                raise _Mismatch(
                    ChecksumMismatch(
                        "SHA-256 of the uploaded parts does not match the declared checksum; nothing was "
                        "published and the plan is aborted",
                        expected=declared,
                        actual="sha256:" + sha_hex,
                    )
                )
            candidate = self.lifecycle.candidate(plan, size=plan.size, sha256=sha_hex, head=head, source="direct")

            async def place(record: FileRecord) -> None:
                with storage_errors_translated():
                    await backend.publish_assembled(plan.key, record.to_metadata())

            return candidate, place

        try:
            plan, record = await self.lifecycle.finish(self.kind, pid, caller, gather)
        except _Mismatch as mismatch:
            await self.lifecycle.abort(self.kind, pid, caller)
            raise mismatch.error from None
        self._plans.pop(pid, None)
        return plan, record

    def _check_parts(self, plan: Plan, parts: list[StoredPart]) -> None:
        """Every part 1..n present, each exactly the planned length (S3 would assemble any set of parts)."""
        have = {p.number: p for p in parts}
        missing = [n for n in range(1, plan.part_count + 1) if n not in have]
        extra = sorted(n for n in have if n > plan.part_count)
        wrong = [n for n, p in have.items() if n <= plan.part_count and p.size != plan.part_length(n)]
        if missing or extra or wrong:
            raise PlanIncomplete(
                f"upload plan {plan.id} cannot complete: {len(missing)} part(s) missing, {len(wrong)} of the wrong "
                "size; send them (again) and retry",
                missing=missing[:1000],
                wrong_size=sorted(wrong)[:1000],
                unexpected=extra[:1000],
            )

    async def _read_back(self, backend: SupportsDirectUpload, plan: Plan) -> tuple[str, bytes]:
        """SHA-256 of the assembled bytes as the bucket serves them: ranged reads in parallel (READ_BACK_AHEAD in
        flight), hashed in order; also the first bytes, for the media type."""

        async def fetch(start: int, end: int) -> bytes:
            buf = bytearray()
            with storage_errors_translated():
                async for piece in backend.read_assembled(plan.key, start, end):
                    buf += piece
            if len(buf) != end - start:
                raise SizeMismatch(f"the assembled object is shorter than the plan's {plan.size} bytes")
            return bytes(buf)

        sha = hashlib.sha256()
        windows = ranges_ahead(fetch, plan.size, window=READ_BACK_WINDOW, ahead=READ_BACK_AHEAD)
        got = await read_back(windows, sha, head=SNIFF_BYTES)
        return sha.hexdigest(), got.head

    async def status(self, pid: str, caller: Grant) -> tuple[Plan, list[StoredPart]]:
        """The plan and the parts the bucket holds."""
        plan = await self.load(pid, caller, allow_ended=True)
        if plan.state_at(self.clock()) is UploadState.ABORTED:
            raise _gone(plan, UploadState.ABORTED)
        return plan, await self.stored_parts(plan)

    async def abort(self, pid: str, caller: Grant) -> None:
        """Abort an unfinished plan: its parts are deleted, nothing is published. A completed plan's file stays."""
        plan = await self.load(pid, caller, allow_ended=True)
        if plan.state is UploadState.COMPLETED:
            raise InvalidRequest(f"upload plan {pid} is complete; delete its file instead")
        await self.lifecycle.abort(self.kind, pid, caller)

    async def _discard(self, plan: Plan) -> None:
        """What an ended plan holds beside its record: its multipart upload and any assembled bytes not published
        (the backend leaves a published object alone: a completion on another replica may have published it, and
        its own compensation removes it, refunded)."""
        self._plans.pop(plan.id, None)  # this process hands out no more part URLs for it (others see the record)
        if not self.supported or plan.state is UploadState.COMPLETED:
            return
        with storage_errors_translated():
            await self._backend().discard_direct_upload(plan.key, plan.upload_id or None)


class _Mismatch(Exception):
    """The assembled bytes are not the declared file: the plan is aborted once the completion has let it go."""

    def __init__(self, error: TransferError) -> None:
        super().__init__(error.message)
        self.error = error
