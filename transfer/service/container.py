"""All services over one storage backend, built once and shared by every front door (REST, tus, SSE, TP bindings,
MCP): there is exactly one FileService, SessionService, … per process."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from storage.base import Storage
from transfer.core.auth import TRUSTED, Grant
from transfer.core.sessions import SessionState
from transfer.errors import NotFound, SessionAborted, SessionExpired
from transfer.service.a2a import A2AService
from transfer.service.backends import make_storage
from transfer.service.bundles import BundleService
from transfer.service.files import FileService
from transfer.service.imports import ImportService
from transfer.service.progress import Job, ProgressHub
from transfer.service.quota import SessionQuota
from transfer.service.sessions import SessionService, is_session_id
from transfer.service.tp import TPService
from transfer.service.tus import TusService
from transfer.settings import Settings

SESSION_POLL = 0.5  # seconds between looks at a session record changed by another replica
IDLE_STOP = 10.0  # a session follower nobody reads stops after this long


@dataclass
class Services:
    settings: Settings
    files: FileService
    sessions: SessionService
    tus: TusService
    bundles: BundleService
    hub: ProgressHub
    imports: ImportService
    tp: TPService
    a2a: A2AService

    @classmethod
    def build(
        cls, settings: Settings, storage: Storage | None = None, *, clock: Callable[[], float] = time.time
    ) -> Services:
        files = FileService(storage or make_storage(settings), settings, clock=clock)
        quota = SessionQuota(files.storage, settings.max_open_sessions_per_key)
        sessions = SessionService(files.storage, settings, clock=clock, quota=quota, lifecycle=files.lifecycle)
        hub = ProgressHub(
            max_jobs=settings.max_jobs,
            retention=settings.job_retention,
            max_waiting=settings.max_waiting_jobs,
            wait_ttl=settings.job_wait_ttl,
        )
        imports = ImportService(files, hub)
        return cls(
            settings=settings,
            files=files,
            sessions=sessions,
            tus=TusService(files.storage, settings, clock=clock, quota=quota, lifecycle=files.lifecycle),
            bundles=BundleService(files.storage, files, clock=clock),
            hub=hub,
            imports=imports,
            tp=TPService(files, sessions, imports, clock=clock),
            a2a=A2AService(files, imports, clock=clock),
        )

    async def start(self) -> None:
        await self.files.start()

    async def close(self) -> None:
        await self.tp.close()
        await self.imports.close()
        await self.hub.close()
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
            if not wait or job_id.startswith(("j_", "f_", "b_")):
                raise  # server-made ids: it is not (or no longer) in this process
            return self.hub.find(ProgressHub.check_id(job_id), wait_for="upload", owner=caller.owner)
        if not caller.sees(job.owner):
            raise NotFound(f"no job {job_id!r} in this process")
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
