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
    abort     -> :meth:`DirectService.abort`; expired plans go in :meth:`DirectService.sweep_direct_plans`

Why read back: S3's additional checksums give SHA-256 per part and, for multipart objects, only a checksum of the
part checksums (COMPOSITE); a full-object checksum type exists for CRC algorithms only. No backend hands us the
whole file's SHA-256, so the service hashes the assembled bytes as the bucket serves them (ranged reads in
parallel, hashed in order). The client's payload never passes through the service; the read-back is the service
reading from its own bucket.

A backend without the DIRECT_UPLOAD capability (local storage) answers every call with DirectUploadUnsupported
(409 ``direct_upload_unsupported``): clients fall back to uploading through the service.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from storage.base import Capability, PartUrl, Storage, StoredPart, SupportsDirectUpload, rules_of
from storage.parts import part_count
from transfer.core.auth import TRUSTED, Grant
from transfer.core.ids import is_id, new_id
from transfer.core.model.content import FileRole, checksum_hex
from transfer.core.uploads.state import UploadEvent, UploadState, state_at, transition
from transfer.errors import (
    ChecksumMismatch,
    DirectUploadUnsupported,
    Gone,
    InvalidRequest,
    NotFound,
    PlanIncomplete,
    SizeMismatch,
    StorageUnavailable,
    TooLarge,
    TooManyPlans,
    TransferError,
    storage_errors_translated,
)
from transfer.service import cpus
from transfer.service.accounting.slots import SessionQuota
from transfer.service.files.publisher import SNIFF_BYTES, Candidate, Publisher, file_id_for
from transfer.service.files.records import FileRecord, object_key
from transfer.service.uploads.engine import UploadEngine
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


def is_plan_id(value: str) -> bool:
    """Whether ``value`` is a direct-upload plan id."""
    return is_id(value, "d_")


def _plan_key(pid: str) -> str:
    return f"{PLAN_PREFIX}{pid}.json"


@dataclass(frozen=True, slots=True)
class Plan:
    """The record of one direct upload."""

    id: str
    owner: str | None
    size: int
    part_size: int
    upload_id: str
    created_at: float
    expires_at: float
    name: str | None = None
    content_type: str | None = None
    checksum: str | None = None  # sha256:<hex> declared at planning (else at completion)
    role: str | None = None
    description: str | None = None
    state: str = "open"  # an UploadState value, moved only by the engine's transition table (open, completed, aborted)
    file_id: str | None = None
    file_ttl: int | None = None  # seconds the published file lives (None: until deleted)

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
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Plan:
        """A plan record as stored."""
        return cls(**doc)

    def state_at(self, now: float) -> UploadState:
        """The plan's state at ``now`` (an open one past its expiry is expired)."""
        return state_at(UploadState(self.state), self.expires_at, now)

    def after(self, event: UploadEvent, now: float, **changes: Any) -> Plan:
        """This plan after ``event`` (the table's refusal when it may not happen now), with ``changes``."""
        state = transition(self.state_at(now), event, upload_id=f"upload plan {self.id}")
        return replace(self, state=state.value, **changes)


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


class DirectService:
    """Upload plans on a backend with the DIRECT_UPLOAD capability."""

    def __init__(
        self,
        storage: Storage,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.time,
        publisher: Publisher,
        engine: UploadEngine,
    ) -> None:
        # collaborators come from the composition root (Services.build), shared with every other door
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.publisher = publisher
        self.lifecycle = publisher.lifecycle
        self.engine = engine  # its keyed locks: one completion of a plan at a time here
        # open plans per key: a marker each, checked against its plan only when the key reaches the limit
        self.open_plans = SessionQuota(
            storage,
            settings.max_open_direct_plans_per_key,
            folder="plans",
            noun="open upload plans",
            error=TooManyPlans,
            clock=clock,
        )
        self.open_plans.register(is_plan_id, self._is_open)
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

    async def _change(self, pid: str, event: UploadEvent, at: float, **changes: Any) -> Plan:
        """Move the plan's record by ``event`` with compare-and-set (as of ``at``, when the operation was
        accepted); a second completion with the same file changes nothing."""

        def change(current: Plan) -> Plan | None:
            if event is UploadEvent.COMPLETE and current.state == "completed" and current.file_id == changes["file_id"]:
                return None
            return current.after(event, at, **changes)

        return await self.engine.update(_plan_key(pid), Plan.from_json, change, Plan.to_json)

    async def _is_open(self, pid: str) -> bool:
        """Whether plan ``pid`` still holds a slot of its key: open and not expired (for :attr:`open_plans`)."""
        try:
            plan = await self.load(pid, TRUSTED)
        except (NotFound, Gone):
            return False
        return plan.state == "open"

    async def load(self, pid: str, caller: Grant, *, allow_ended: bool = False) -> Plan:
        """The plan, if the caller may see it (its own; any for admin); NotFound otherwise, whether or not it
        exists. An expired or aborted plan is Gone unless ``allow_ended``."""
        return (await self._load(pid, caller, allow_ended=allow_ended))[0]

    async def _load(self, pid: str, caller: Grant, *, allow_ended: bool = False) -> tuple[Plan, str]:
        """:meth:`load`, and the version of the record it was read at."""
        self._backend()
        if not is_plan_id(pid):
            raise NotFound(f"no upload plan {pid!r}")
        try:
            doc, version = await self.engine.read(_plan_key(pid))
        except NotFound:
            raise NotFound(f"no upload plan {pid!r}") from None
        plan = Plan.from_json(doc)
        if not caller.sees(plan.owner):
            raise NotFound(f"no upload plan {pid!r}")
        if not allow_ended and plan.state == "aborted":
            raise Gone(f"upload plan {pid} was aborted")
        if not allow_ended and plan.state == "open" and self.clock() >= plan.expires_at:
            raise Gone(f"upload plan {pid} has expired")
        return plan, version

    async def create(
        self,
        *,
        size: int,
        caller: Grant,
        name: str | None = None,
        content_type: str | None = None,
        checksum: str | None = None,
        role: FileRole | None = None,
        description: str | None = None,
        expires_in: int | None = None,
    ) -> Plan:
        """A new plan owned by the caller's key: the backend's multipart upload is started now. Its ``size`` is
        reserved against the key's byte quota (QuotaExceeded, before anything is started, when it does not fit);
        ``expires_in``: the lifetime of the file it makes."""
        backend = self._backend()
        s = self.settings
        if size < 0:
            raise InvalidRequest("size must not be negative")
        if size > s.max_upload_size:
            raise TooLarge(f"{size} bytes exceed the upload limit of {s.max_upload_size}")
        self.publisher.check_fields(content_type=content_type, description=description)
        file_ttl = self.lifecycle.lifetime(caller.owner, expires_in)
        with storage_errors_translated():
            part_size = rules_of(self.storage).part_size(size, max_size=s.max_upload_size)
        pid = new_plan_id()
        now = self.clock()
        plan = Plan(
            id=pid,
            owner=caller.owner,
            size=size,
            part_size=part_size,
            upload_id="",
            created_at=now,
            expires_at=now + self._ttl(),
            name=name,
            content_type=content_type,
            checksum=None if checksum is None else _checksum(checksum),
            role=role.value if role else None,
            description=description,
            file_ttl=file_ttl,
        )
        if plan.checksum is not None:
            # content the key already stores: published now, sharing those bytes; the plan is born completed (no
            # part to send, ``complete`` answers the file) and holds no slot, reservation or multipart upload
            shared = await self.publisher.publish_known(self._candidate(plan, checksum_hex(plan.checksum), b""))
            if shared is not None:
                plan = replace(plan, state=UploadState.COMPLETED.value, file_id=shared.id)
                await self.engine.create(_plan_key(plan.id), plan.to_json())
                return plan
        await self.open_plans.acquire(caller.owner, pid)  # TooManyPlans at the key's limit
        await self.lifecycle.admit(caller.owner, pid, size, plan.expires_at)
        try:
            with storage_errors_translated():
                upload_id = await backend.begin_direct_upload(plan.key)
            plan = replace(plan, upload_id=upload_id)
            try:
                await self.engine.create(_plan_key(plan.id), plan.to_json())
            except BaseException:
                with storage_errors_translated():
                    await backend.discard_direct_upload(plan.key, upload_id)
                raise
        except BaseException:
            await self.lifecycle.release_after_failure(caller.owner, pid)
            raise
        return plan

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
        cached = self._plans.get(pid) if is_plan_id(pid) else None
        if cached is not None:
            try:
                with storage_errors_translated():
                    version: str | None = (await self.storage.stat(_plan_key(pid))).etag
            except NotFound:
                version = None
            if version != cached[1]:
                self._plans.pop(pid, None)
                cached = None
        plan, version = cached or await self._load(pid, caller)
        if not caller.sees(plan.owner):
            raise NotFound(f"no upload plan {pid!r}")
        if plan.state == "aborted":
            raise Gone(f"upload plan {pid} was aborted")
        if self.clock() >= plan.expires_at:
            raise Gone(f"upload plan {pid} has expired")
        self._require_open(plan)
        if pid not in self._plans:
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
        if plan.state != "open":
            return []
        with storage_errors_translated():
            return await self._backend().list_direct_parts(plan.key, plan.upload_id)

    def _require_open(self, plan: Plan) -> None:
        if plan.state == "completed":
            raise InvalidRequest(f"upload plan {plan.id} is already complete (file {plan.file_id})")

    async def complete(self, pid: str, caller: Grant, *, checksum: str | None = None) -> tuple[Plan, FileRecord]:
        """Check every part, assemble, verify the whole SHA-256 by reading the bytes back, publish. A completed plan
        returns its file again (a retried completion is answered, not refused)."""
        backend = self._backend()
        async with self.engine.locks.hold(pid):
            began = self.clock()
            plan = await self.load(pid, caller)
            if plan.state == "completed" and plan.file_id is not None:
                return plan, await self._record(plan.file_id)
            declared = plan.checksum
            if checksum is not None:
                given = _checksum(checksum)
                if declared is not None and declared != given:
                    raise InvalidRequest("the checksum differs from the one declared when planning")
                declared = given
            if declared is None:
                raise InvalidRequest("declare the file's checksum (sha256:<hex>) to complete")
            published = await self._published(plan)
            if published is not None:  # published, then the process stopped before the plan said so
                return await self._completed(pid, began, published), published
            parts = await self.stored_parts(plan)
            self._check_parts(plan, parts)
            # refused before the parts are assembled, the plan left open
            await self.publisher.require_room(
                plan.owner, plan.id, plan.size, what=f"upload plan {plan.id}", retry="delete files and complete again"
            )
            with storage_errors_translated():
                await backend.assemble_direct_upload(plan.key, plan.upload_id, parts)

            async def publish(record: FileRecord) -> None:
                with storage_errors_translated():
                    await backend.publish_assembled(plan.key, record.to_metadata())

            try:
                sha_hex, head = await self._read_back(backend, plan)
                if sha_hex != checksum_hex(declared):
                    raise ChecksumMismatch(
                        "SHA-256 of the uploaded parts does not match the declared checksum; nothing was "
                        "published and the plan is aborted",
                        expected=declared,
                        actual="sha256:" + sha_hex,
                    )
                record = await self.publisher.publish(self._candidate(plan, sha_hex, head), publish)
            except BaseException:
                if await self._published(plan) is None:  # not placed by a completion elsewhere either
                    await self._abort(plan, upload_used=True)
                raise
            return await self._completed(pid, began, record), record

    async def _completed(self, pid: str, began: float, record: FileRecord) -> Plan:
        """Record that plan ``pid`` published ``record``; its slot among its key's open plans goes now (not when
        the key next reaches its limit)."""
        plan = await self._change(pid, UploadEvent.COMPLETE, began, file_id=record.id)
        await self.open_plans.release(plan.owner, pid)
        return plan

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
        flight), hashed in order in a worker thread; also the first bytes, for the media type."""
        sha = hashlib.sha256()
        windows = [(start, min(start + READ_BACK_WINDOW, plan.size)) for start in range(0, plan.size, READ_BACK_WINDOW)]

        async def fetch(start: int, end: int) -> bytes:
            buf = bytearray()
            with storage_errors_translated():
                async for piece in backend.read_assembled(plan.key, start, end):
                    buf += piece
            if len(buf) != end - start:
                raise SizeMismatch(f"the assembled object is shorter than the plan's {plan.size} bytes")
            return bytes(buf)

        head = b""
        pending: list[asyncio.Task[bytes]] = []
        try:
            for i in range(len(windows)):
                while len(pending) < READ_BACK_AHEAD and i + len(pending) < len(windows):
                    pending.append(asyncio.create_task(fetch(*windows[i + len(pending)])))
                data = await pending.pop(0)
                if not head:
                    head = data[:SNIFF_BYTES]
                await cpus.hashed(sha.update, len(data), data)
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return sha.hexdigest(), head

    def _candidate(self, plan: Plan, sha_hex: str, head: bytes) -> Candidate:
        return Candidate(
            owner=plan.owner,
            upload_id=plan.id,
            size=plan.size,
            sha256=sha_hex,
            head=head,
            source="direct",
            name=plan.name,
            content_type=plan.content_type,
            role=FileRole(plan.role) if plan.role else None,
            description=plan.description,
            lifetime=plan.file_ttl,
            republishable_until=plan.expires_at,
        )

    async def _published(self, plan: Plan) -> FileRecord | None:
        """The plan's file if it is published (whatever the plan record says), else None."""
        try:
            return await self._record(file_id_for(plan.id))
        except (NotFound, StorageUnavailable):  # absent, or assembled and not yet given its record
            return None

    async def _record(self, file_id: str) -> FileRecord:
        with storage_errors_translated():
            info = await self.storage.stat(object_key(file_id))
        return FileRecord.from_metadata(info.metadata)

    async def status(self, pid: str, caller: Grant) -> tuple[Plan, list[StoredPart]]:
        """The plan and the parts the bucket holds."""
        plan = await self.load(pid, caller, allow_ended=True)
        if plan.state == "aborted":
            raise Gone(f"upload plan {pid} was aborted")
        return plan, await self.stored_parts(plan)

    async def abort(self, pid: str, caller: Grant) -> None:
        """Abort an unfinished plan: its parts are deleted, nothing is published. A completed plan's file stays."""
        plan = await self.load(pid, caller, allow_ended=True)
        if plan.state == "completed":
            raise InvalidRequest(f"upload plan {pid} is complete; delete its file instead")
        await self._abort(plan, upload_used=False)

    async def _abort(self, plan: Plan, *, upload_used: bool) -> None:
        with storage_errors_translated():
            await self._backend().discard_direct_upload(plan.key, None if upload_used else plan.upload_id)
        await self._change(plan.id, UploadEvent.ABORT, self.clock())
        self._plans.pop(plan.id, None)  # this process hands out no more part URLs for it (others see the record)
        await self.lifecycle.release_after_failure(plan.owner, plan.id)  # on the way out of a failure too
        try:
            await self.open_plans.release(plan.owner, plan.id)
        except TransferError as exc:  # best effort: the marker is dropped when the key next reaches its limit
            log.warning("the slot marker of plan %s stays until its key's limit is reached: %s", plan.id, exc)

    async def sweep_direct_plans(self) -> int:
        """Abort open plans past their expiry (their multipart uploads and any assembled bytes go) and delete the
        records of ended plans past it; returns how many plans were removed. Uploads whose record never got
        written are left to the abandoned-multipart sweep (same ``data/`` prefix)."""
        if not self.supported:
            return 0
        removed = 0
        now = self.clock()
        with storage_errors_translated():
            keys = [info.key async for info in self.storage.list(PLAN_PREFIX)]
        for key in keys:
            pid = key[len(PLAN_PREFIX) :].removesuffix(".json")
            if not is_plan_id(pid):
                continue
            try:
                plan = await self.load(pid, TRUSTED, allow_ended=True)
                if now < plan.expires_at:
                    continue
                if plan.state == "open" and await self._published(plan) is None:
                    with storage_errors_translated():
                        await self._backend().discard_direct_upload(plan.key, plan.upload_id)
                    await self.lifecycle.release(plan.owner, plan.id)
                with storage_errors_translated():
                    await self.storage.delete(key)
                await self.open_plans.release(plan.owner, plan.id)
                removed += 1
            except TransferError:
                log.warning("sweep could not remove upload plan %s; retrying at the next interval", pid)
        return removed
