"""Upload and import jobs recorded in the storage backend, so that a reader on any replica follows them.

The process that runs a job records it under ``jobs/<id>/`` as two small JSON records:

    jobs/<id>/state      {"id", "kind", "owner", "state", "updated_at", "events": [{"index", "kind", "data"}, ...]}
                         every event but progress (start, result, error, end, done: at most five), rewritten at
                         each state change
    jobs/<id>/progress   {"index", "data", "updated_at"}: the latest progress event, overwritten at most every
                         PROGRESS_RECORD_INTERVAL seconds (and once more before the job's final state)

so a job costs a handful of writes whatever its size, and a follower two reads per look. Events keep the index the
running process gave them, so SSE ids and ``Last-Event-ID`` resume work across replicas. A follower on another
replica (:meth:`JobJournal.follow`) replays the records into a local :class:`Job` every FOLLOW_POLL seconds; its
readers see the same events as readers of the running process, minus progress events between two looks. The
progress record is written before the state record, and read after it, so a follower that sees the final state
has the last progress too.

Owners travel in the state record: a reader of another key gets not_found, as for a job of its own process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from storage.base import Storage
from storage.errors import StorageError
from transfer.errors import NotFound, TransferError, storage_errors_translated
from transfer.service.files.documents import read_document, write_document
from transfer.service.jobs.progress import EventKind, Job, ProgressEvent

log = logging.getLogger("transfer.jobs")

PREFIX = "jobs/"
PROGRESS_RECORD_INTERVAL = 0.5  # seconds between two writes of a job's progress record
FOLLOW_POLL = 0.5  # seconds between a follower's looks at the records
WAIT_POLL_MAX = 2.0  # a job not recorded yet is looked for less and less often, up to this interval
IDLE_STOP = 10.0  # a follower nobody reads stops after this long (the next reader starts it again)
STALLED = 24 * 3600.0  # an unfinished job not recorded for this long lost its process: the sweep removes it
EVENT_KINDS: frozenset[str] = frozenset({"start", "progress", "result", "error", "end", "done"})


def job_key(job_id: str, part: str) -> str:
    """The record ``part`` of a job. Job ids may begin with ``_`` or ``-``, which object keys may not; those get
    an ``x.`` prefix (job ids never hold a dot, so no two ids share a key)."""
    segment = job_id if job_id[:1].isalnum() else f"x.{job_id}"
    return f"{PREFIX}{segment}/{part}"


def _event(doc: Any) -> ProgressEvent:
    if not isinstance(doc, dict) or doc.get("kind") not in EVENT_KINDS or not isinstance(doc.get("index"), int):
        raise ValueError(f"not a job event: {doc!r}")
    kind: EventKind = doc["kind"]
    data = doc.get("data")
    return ProgressEvent(doc["index"], kind, data if isinstance(data, dict) else {})


def _event_doc(event: ProgressEvent) -> dict[str, Any]:
    return {"index": event.index, "kind": event.kind, "data": event.data}


class JobJournal:
    """Records the jobs of this process (:meth:`record`) and follows those of other processes (:meth:`follow`)."""

    def __init__(self, storage: Storage, *, retention: float, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.retention = retention
        self.clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the process that runs the job -------------------------------------------------------------------------------

    def record(self, job: Job) -> None:
        """Record ``job`` until it ends (a ProgressHub ``on_open`` hook: called when a writer opens a job)."""
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._record(job, job.recording(finished), finished))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record(self, job: Job, first: asyncio.Event, done: asyncio.Future[None]) -> None:
        written_state = -1  # index of the last state event recorded
        written_progress = -1
        progress_at = -PROGRESS_RECORD_INTERVAL
        loop = asyncio.get_running_loop()
        try:
            while True:
                signal = job.signal
                events = list(job.events)
                states = [e for e in events if e.kind != "progress"]
                progress = next((e for e in reversed(events) if e.kind == "progress"), None)
                final = job.finished
                state_due = bool(states) and states[-1].index != written_state
                wait: float | None = None
                if progress is not None and progress.index != written_progress:
                    due = progress_at + PROGRESS_RECORD_INTERVAL - loop.time()
                    if due <= 0 or state_due or final:  # the last progress goes before the state that follows it
                        await self._write_progress(job, progress)
                        written_progress, progress_at = progress.index, loop.time()
                    else:
                        wait = due
                if state_due:
                    await self._write_state(job, states)
                    written_state = states[-1].index
                    first.set()
                if final and any(e.kind == "done" for e in states) and written_state == states[-1].index:
                    return
                if wait is None:
                    await signal.wait()
                else:
                    try:
                        await asyncio.wait_for(signal.wait(), timeout=wait)
                    except TimeoutError:
                        pass
        except (TransferError, StorageError):
            # the job itself goes on here; readers on other replicas stop hearing of it (and say so on timeout)
            log.exception("recording job %s failed; it is followed on this replica only", job.id)
        finally:
            first.set()  # nobody waits for a record that will not come
            if not done.done():
                done.set_result(None)

    async def _write_state(self, job: Job, states: list[ProgressEvent]) -> None:
        doc = {
            "id": job.id,
            "kind": job.kind,
            "owner": job.owner,
            "state": job.state,
            "updated_at": self.clock(),
            "events": [_event_doc(e) for e in states],
        }
        await write_document(self.storage, job_key(job.id, "state"), doc)

    async def _write_progress(self, job: Job, event: ProgressEvent) -> None:
        doc = {**_event_doc(event), "updated_at": self.clock()}
        await write_document(self.storage, job_key(job.id, "progress"), doc)

    # -- any other process -------------------------------------------------------------------------------------------

    async def load(self, job_id: str) -> dict[str, Any] | None:
        """The state record of a job recorded by any process, or None."""
        try:
            doc = await read_document(self.storage, job_key(job_id, "state"))
        except NotFound:
            return None
        return doc if isinstance(doc, dict) and doc.get("id") == job_id else None

    async def _progress(self, job_id: str) -> ProgressEvent | None:
        try:
            return _event(await read_document(self.storage, job_key(job_id, "progress")))
        except (NotFound, ValueError):
            return None

    async def follow(self, job: Job, *, wait: float = 0.0, adopt: Callable[[Job], None] | None = None) -> None:
        """Replay the records of ``job`` (run by another process) into it until it ends, or until nobody has read
        it for IDLE_STOP seconds. A job not recorded yet is looked for during ``wait`` seconds (a reader that came
        before the upload), then NotFound; one recorded for another owner than ``job.owner`` (when set) is
        NotFound. ``adopt`` is told once the job has started."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        idle = 0.0
        started = False
        pause = FOLLOW_POLL
        while True:
            doc = await self.load(job.id)
            if doc is None:
                if loop.time() >= deadline:
                    raise NotFound(f"no job {job.id!r}")
                # bounded cost per waiting reader (each is one of max_waiting): fewer looks as the wait goes on
                await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
                pause = min(pause * 1.5, WAIT_POLL_MAX)
                continue
            if job.owner is not None and doc.get("owner") != job.owner:
                raise NotFound(f"no job {job.id!r}")
            events = [_event(e) for e in doc.get("events", [])]
            progress = await self._progress(job.id)
            if progress is not None:
                events.append(progress)
            if not started and events and adopt is not None:
                adopt(job)
            started = started or bool(events)
            for event in sorted(events, key=lambda e: e.index):
                job.replay(event)
            if job.finished and any(e.kind == "done" for e in job.events):
                return
            idle = 0.0 if job.watchers else idle + FOLLOW_POLL
            if idle >= IDLE_STOP and started:
                return
            await asyncio.sleep(FOLLOW_POLL)

    # -- maintenance -------------------------------------------------------------------------------------------------

    async def sweep_jobs(self) -> int:
        """Remove the records of jobs that ended ``retention`` seconds ago, and of unfinished ones not recorded
        for STALLED seconds (their process died); how many jobs."""
        now = self.clock()
        states: list[str] = []
        with storage_errors_translated():
            async for info in self.storage.list(PREFIX):
                if info.key.endswith("/state"):
                    states.append(info.key)
        removed = 0
        for key in states:
            try:
                doc = await read_document(self.storage, key)
            except NotFound:
                continue
            updated = float(doc.get("updated_at", 0)) if isinstance(doc, dict) else 0.0
            if isinstance(doc, dict) and doc.get("state") not in ("completed", "failed"):
                progress = await self._read_updated(key.removesuffix("state") + "progress")
                if now - max(updated, progress) < STALLED:
                    continue
            elif now - updated < self.retention:
                continue
            with storage_errors_translated():
                await self.storage.delete(key.removesuffix("state") + "progress")
                await self.storage.delete(key)
            removed += 1
        return removed

    async def _read_updated(self, key: str) -> float:
        try:
            doc = await read_document(self.storage, key)
        except NotFound:
            return 0.0
        return float(doc.get("updated_at", 0)) if isinstance(doc, dict) else 0.0

    async def close(self) -> None:
        """Let the recorders write what they have (briefly), then stop them."""
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
