"""All services over one storage backend, built once and shared by every front door (REST, tus, SSE, TP bindings,
MCP): there is exactly one FileService, SessionService, … per process, and every shared piece is built here alone:
the record store (compare-and-set records, one retry policy), the accounting (lifetimes, quotas, usage), the one
publisher, the open-upload slots of each folder, the upload engine (parts and hashing) and the one upload lifecycle
every door registers its kind with.

The set owns its background work and its shutdown. Every host (``transfer serve``, ``transfer mcp`` over stdio, the
tests) calls :meth:`Services.start` and :meth:`Services.close` and so runs the same maintenance: the sweeps listed in
:meth:`Services.maintenance`, each an ``async def sweep_x(self) -> int`` of a service returning how many things it
removed, run every ``interval`` seconds. To add one, write the method on its service and add one line there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from storage.base import Storage, require_replica_safe
from transfer import metrics
from transfer.core.auth import TRUSTED, Grant
from transfer.core.uploads.sessions import SessionState
from transfer.errors import (
    NotFound,
    SessionAborted,
    SessionExpired,
    TooManyAuthorizations,
    TooManyPlans,
    TransferError,
)
from transfer.service.accounting.lifecycle import Lifecycle
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.accounting.slots import OpenSlots
from transfer.service.agents.a2a import A2AService
from transfer.service.agents.tp import TPService
from transfer.service.backends import make_storage
from transfer.service.events.service import EventService
from transfer.service.files.bundles import BundleService
from transfer.service.files.publisher import Publisher
from transfer.service.files.service import FileService
from transfer.service.identity.directory import Identities
from transfer.service.jobs.imports import ImportService
from transfer.service.jobs.journal import JobJournal
from transfer.service.jobs.progress import Job, ProgressHub
from transfer.service.jobs.resolve import ResolveService
from transfer.service.metered import metered
from transfer.service.uploads.authorizations import Authorizations
from transfer.service.uploads.chunked import ChunkService
from transfer.service.uploads.chunkstore import ChunkStore
from transfer.service.uploads.direct import DirectService
from transfer.service.uploads.engine import UploadEngine
from transfer.service.uploads.lifecycle import UploadLifecycle
from transfer.service.uploads.sessions import SessionService, is_session_id
from transfer.service.uploads.tus import TusService
from transfer.settings import Settings

log = logging.getLogger("transfer.maintenance")

SESSION_POLL = 0.5  # seconds between looks at a session record changed by another replica
IDLE_STOP = 10.0  # a session follower nobody reads stops after this long


@dataclass(frozen=True, slots=True)
class Sweep:
    """One piece of background work: ``run`` every ``interval`` seconds; it returns how many things it removed."""

    name: str
    interval: float
    run: Callable[[], Awaitable[int]]


@dataclass
class Services:
    """The composition root: every service of one process built once over one storage backend and one upload engine
    (:meth:`build`), started and closed together."""

    settings: Settings
    files: FileService
    sessions: SessionService
    tus: TusService
    bundles: BundleService
    hub: ProgressHub
    journal: JobJournal
    imports: ImportService
    resolve: ResolveService
    tp: TPService
    a2a: A2AService
    authorizations: Authorizations
    direct: DirectService
    chunks: ChunkService
    uploads: UploadLifecycle
    identities: Identities  # who calls (keys, key records, access tokens) and every owner's limits
    events: EventService
    _users: int = 0  # hosts that started the set and have not closed it yet (stdio MCP + its HTTP server: two)
    _sweepers: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def build(
        cls, settings: Settings, storage: Storage | None = None, *, clock: Callable[[], float] = time.time
    ) -> Services:
        """The one set of services of a process over ``storage`` (default: the one the settings name), every
        backend operation counted in the metrics (:mod:`transfer.service.metered`)."""
        store = metered(storage or make_storage(settings))
        records = RecordStore(store)
        identities = Identities(settings, records, clock=clock)
        terms = Lifecycle(records, settings, clock=clock, limits=identities.limits)
        publisher = Publisher(records, settings, terms, clock=clock)
        events = EventService(records, settings, terms, clock=clock)  # the pre-upload hook, the event outbox
        publisher.events = events  # every publication, removal, abort and quota refusal is told to it
        files = FileService(settings, publisher, clock=clock)
        s = settings
        slots = {  # a key's open uploads, one counter per folder (tus and sessions share theirs)
            "sessions": OpenSlots(records, s.max_open_sessions_per_key, clock=clock),
            "plans": OpenSlots(
                records,
                s.max_open_direct_plans_per_key,
                folder="plans",
                noun="open upload plans",
                error=TooManyPlans,
                clock=clock,
            ),
            "authorizations": OpenSlots(
                records,
                s.max_open_authorizations_per_key,
                folder="authorizations",
                noun="open upload authorisations",
                error=TooManyAuthorizations,
                clock=clock,
            ),
            "chunked": OpenSlots(
                records, s.max_open_sessions_per_key, folder="chunked", noun="open chunked uploads", clock=clock
            ),
        }
        engine = UploadEngine(store)  # parts and running hashes of every door
        uploads = UploadLifecycle(store, records, publisher, clock=clock)  # every upload's record and life
        sessions = SessionService(
            store,
            settings,
            clock=clock,
            lifecycle=uploads,
            slots=slots["sessions"],
            engine=engine,
            check_signed=files.check_signed,
        )
        journal = JobJournal(files.storage, retention=settings.job_retention, clock=clock)
        hub = ProgressHub(
            max_jobs=settings.max_jobs,
            retention=settings.job_retention,
            max_waiting=settings.max_waiting_jobs,
            wait_ttl=settings.job_wait_ttl,
            on_open=journal.record,
        )
        imports = ImportService(files, hub)
        return cls(
            settings=settings,
            files=files,
            sessions=sessions,
            tus=TusService(store, settings, clock=clock, lifecycle=uploads, slots=slots["sessions"], engine=engine),
            bundles=BundleService(files.storage, files, clock=clock),
            hub=hub,
            journal=journal,
            imports=imports,
            resolve=ResolveService(settings, imports),
            tp=TPService(files, sessions, imports, clock=clock),
            a2a=A2AService(files, imports, clock=clock),
            authorizations=Authorizations(files, uploads, slots["authorizations"]),
            direct=DirectService(store, settings, clock=clock, lifecycle=uploads, slots=slots["plans"]),
            chunks=ChunkService(ChunkStore(files, records, clock=clock), uploads, slots["chunked"], clock=clock),
            uploads=uploads,
            identities=identities,
            events=events,
        )

    def maintenance(self) -> list[Sweep]:
        """The background work of every host, in one place: a new sweep is one line here."""
        every = self.settings.session_gc_interval
        return [
            Sweep("uploads", every, self.uploads.sweep),
            Sweep("abandoned_uploads", every, self.files.sweep_abandoned_uploads),
            Sweep("expired_files", every, self.files.sweep_expired_files),
            Sweep("shared_content", every, self.files.sweep_shared_content),
            Sweep("jobs", every, self.journal.sweep_jobs),
            Sweep("tp_mailboxes", every, self.tp.sweep_mailboxes),
            Sweep("expired_bundles", every, self.bundles.sweep_expired_bundles),
            Sweep("chunks", every, self.chunks.store.sweep_chunks),
            *self.events_maintenance(),
        ]

    def events_maintenance(self) -> list[Sweep]:
        """The delivery loop's look at the outbox and the feed's retention, when events are on."""
        if not self.settings.events:
            return []
        return [
            Sweep("events", self.settings.events_scan_interval, self.events.dispatcher.look),
            Sweep("event_feed", max(self.settings.session_gc_interval, 60.0), self.events.feed.sweep),
        ]

    async def start(self) -> None:
        """Open the backend and start the maintenance. A host that shares a started set (stdio MCP serving HTTP
        too) may start it again: only the first start and the last close act."""
        self._users += 1
        if self._users > 1:
            return
        await self.files.start()
        # an engine without atomic compare-and-set refuses replicas unless told this process runs alone
        require_replica_safe(self.files.storage, self.settings.single_replica)
        await self.identities.start()
        self.events.start()
        self._sweepers = [
            asyncio.create_task(self._repeat(sweep), name=f"sweep:{sweep.name}") for sweep in self.maintenance()
        ]

    async def _repeat(self, sweep: Sweep) -> None:
        while True:
            await asyncio.sleep(sweep.interval)
            await self._run(sweep)

    async def _run(self, sweep: Sweep) -> int:
        """One run of ``sweep``, counted in the metrics; how many it removed, -1 when it failed (logged: it runs
        again at its next interval)."""
        try:
            removed = await sweep.run()
        except Exception as exc:  # noqa: BLE001 - a bug in one sweep must not end its loop for the process's lifetime
            metrics.sweep_ran(sweep.name, 0, ok=False)
            how = "failed" if isinstance(exc, TransferError) else "failed unexpectedly (a bug)"
            log.exception("sweep %s %s; retrying at the next interval", sweep.name, how)
            return -1
        metrics.sweep_ran(sweep.name, removed)
        if removed:
            log.info("sweep %s removed %d", sweep.name, removed)
        return removed

    async def sweep_now(self) -> dict[str, int]:
        """Every sweep of :meth:`maintenance` once, now, one after the other (one failing does not stop the
        others); what each removed (-1: failed). What an operator's ``gc`` asks for: the same list the hosts run
        periodically, so no sweep is left out."""
        return {sweep.name: await self._run(sweep) for sweep in self.maintenance()}

    async def close(self) -> None:
        """Stop the maintenance and every background task, then close the backend (by the last host to close)."""
        self._users -= 1
        if self._users > 0:
            return
        sweepers, self._sweepers = self._sweepers, []
        for task in sweepers:
            task.cancel()
        await asyncio.gather(*sweepers, return_exceptions=True)
        await self.events.close()
        await self.tp.close()
        await self.chunks.close()
        await self.imports.close()
        await self.hub.close()
        await self.journal.close()
        await self.identities.close()
        await self.files.close()

    async def job(self, job_id: str, base_url: str, caller: Grant, *, wait: bool = True) -> Job:
        """The job to follow, if the caller may see it (its key's; any for admin; NotFound otherwise, as for an
        unknown id): a session (from its record, on any replica) or an upload/import of this process. With
        ``wait``, an unknown id that could be a client-chosen upload id is opened waiting for the caller's key
        (bounded in number, expiring: see ProgressHub.find), so a reader can subscribe before its upload starts;
        without, NotFound."""
        if is_session_id(job_id):
            await self.sessions.load(job_id, caller)  # NotFound unless the caller may see the session
            return self.hub.derived(job_id, "session", lambda job: self._follow_session(job, base_url))
        try:
            job = self.hub.find(job_id)
        except NotFound:
            job = await self._recorded_job(job_id, caller, wait=wait)
        if not caller.sees(job.owner):
            raise NotFound(f"no job {job_id!r}")
        return job

    async def _recorded_job(self, job_id: str, caller: Grant, *, wait: bool) -> Job:
        """A job this process does not hold: one another replica runs (followed through its records), else, with
        ``wait`` and a client-chosen id, one opened waiting for its upload, here or on any replica."""
        doc = await self.journal.load(job_id) if ProgressHub.is_id(job_id) else None
        if doc is not None:
            owner = doc.get("owner")
            if not caller.sees(owner if isinstance(owner, str) else None):
                raise NotFound(f"no job {job_id!r}")
            return self.hub.derived(job_id, str(doc.get("kind")), self.journal.follow, owner=owner)
        if not wait or job_id.startswith(("j_", "f_", "b_")):
            raise NotFound(f"no job {job_id!r}")  # server-made ids are recorded before anyone can know them
        job = self.hub.find(ProgressHub.check_id(job_id), wait_for="upload", owner=caller.owner)
        hub, journal, ttl = self.hub, self.journal, self.settings.job_wait_ttl
        self.hub.watch(job, lambda job: journal.follow(job, wait=ttl, adopt=hub.adopt))
        return job

    async def _follow_session(self, job: Job, base_url: str) -> None:
        """Turn the session record into job events: progress as chunks arrive, the descriptor on completion."""
        sid = job.id
        last: tuple[int, int] | None = None
        idle = 0.0
        while True:
            status = await self.sessions.status(sid, TRUSTED)
            if job.state == "pending":
                job.start(
                    status["name"], status["size"], chunk_size=status["chunk_size"], total_chunks=status["total_chunks"]
                )
            state = status["state"]
            seen = (int(status["bytes_received"]), int(status["stored_count"]))
            if seen != last:
                last = seen
                job.advance(
                    seen[0], force=True, chunks_stored=seen[1], total_chunks=status["total_chunks"], state=state
                )
            if state == SessionState.COMPLETED.value:
                record = await self.files.record(status["file_id"], TRUSTED)
                descriptor = await self.files.describe(record, base_url, inline=False)
                job.succeed({"file_id": record.id, "descriptor": descriptor.to_json()})
                return
            if state == SessionState.ABORTED.value:
                raise SessionAborted(f"session {sid} was aborted")
            if state == SessionState.EXPIRED.value:
                raise SessionExpired(f"session {sid} expired")
            idle = 0.0 if job.watchers else idle + SESSION_POLL
            if idle >= IDLE_STOP:
                return
            await self.sessions.wait_for_change(sid, SESSION_POLL)
