"""Progress of long operations ("jobs"): single-stream uploads, chunked sessions and server-side imports.

A job is a short, ordered log of events; readers (the AIFlowy SSE stream, TP ``resource_notify`` over WebSocket)
follow it and resume after the last index they saw. Events are protocol-neutral; each front door renders them:

    start     {"kind", "name"?, "total"?}                    the job is running
    progress  {"bytes", "total"?, "percent"?, ...}           at most every PROGRESS_INTERVAL seconds or 1 %
    result    {"descriptor": FileContent JSON, "file_id"}    the stored file (success)
    error     TransferError payload {"code", "message", "status", "retryable", "detail"?}
    end       {"state": "completed" | "failed"}
    done      {"bytes", "duration_ms", "throughput_bps"}     always last

Upload and import jobs run in one process; their events are recorded in the storage backend as they happen (see
:mod:`transfer.service.jobs.journal`), so a reader on any replica follows them with the same indexes. Session jobs are
derived from the session record in the storage backend, so any replica can follow any session.

Memory and time are bounded whatever ids readers send: at most ``MAX_EVENTS`` events per job (older progress events
are dropped first); a job a reader opened before its upload started ("waiting") is one of at most ``max_waiting``
and fails with not_found ``wait_ttl`` seconds later if no writer took it; finished jobs (and session followers nobody
reads) are forgotten ``retention`` seconds later, sooner when more than ``max_jobs`` are kept. Every lookup is a dict
lookup plus popping the expired heads of two queues (each queue has one delay, so it is in deadline order): O(1)
amortised, never a scan of all jobs.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from transfer.errors import Conflict, InvalidRequest, NotFound, TooManyJobs, TransferError

EventKind = Literal["start", "progress", "result", "error", "end", "done"]
JOB_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
PROGRESS_INTERVAL = 0.25
MAX_EVENTS = 256


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """One numbered event of a job's progress stream (``index`` orders them; a reconnecting reader resumes after its
    last index)."""

    index: int
    kind: EventKind
    data: dict[str, Any]


@dataclass(slots=True)
class Job:
    """A background upload, session or import whose progress events readers follow over SSE; its state runs pending
    → running → completed | failed."""

    id: str
    kind: str  # "upload" | "session" | "import"
    events: list[ProgressEvent] = field(default_factory=list)
    state: str = "pending"  # pending -> running -> completed | failed
    bytes: int = 0
    total: int | None = None
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    _next_index: int = 0
    _last_progress: float = 0.0
    _last_percent: int = -1
    _published_bytes: int = -1
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    watchers: int = 0
    expires: float | None = None  # monotonic time the hub forgets it (None: running, kept)
    owner: str | None = None  # the API key whose upload/import it reports on, or whose reader opened it waiting
    _on_end: Callable[[Job], None] | None = None
    _recorded: asyncio.Event | None = None  # set once the journal has written the job's first record
    _recorder: asyncio.Future[None] | None = None  # the journal's task recording the job

    def recording(self, recorder: asyncio.Future[None]) -> asyncio.Event:
        """The journal records this job with ``recorder``; it sets the event returned once the job's first record
        is written (see :meth:`recorded`)."""
        self._recorder = recorder
        self._recorded = asyncio.Event()
        return self._recorded

    async def recorded(self) -> None:
        """Wait until other replicas can find this job (at once when nothing records it)."""
        if self._recorded is not None:
            await self._recorded.wait()

    async def settled(self) -> None:
        """Wait until the records of this finished job are written, so that any replica reads its end."""
        if self._recorder is not None:
            await asyncio.shield(self._recorder)

    @property
    def finished(self) -> bool:
        """Whether the job has completed or failed (no event follows)."""
        return self.state in ("completed", "failed")

    @property
    def signal(self) -> asyncio.Event:
        """Set at the next event: take it before looking at ``events`` so that nothing slips in between."""
        return self._changed

    def replay(self, event: ProgressEvent) -> None:
        """An event that the process running the job recorded, with its index (a follower on another replica).
        Older indexes than the last one replayed are ignored, so replays may overlap."""
        if event.index < self._next_index or self.finished and event.kind not in ("end", "done"):
            return
        if event.kind == "start":
            self.state = "running"
            self.total = event.data.get("total")
        elif event.kind == "progress":
            self.bytes = int(event.data.get("bytes", self.bytes))
        elif event.kind == "done":
            self.bytes = int(event.data.get("bytes", self.bytes))
        self._next_index = event.index
        self._publish(event.kind, event.data)
        if event.kind in ("result", "error"):
            self.state = "completed" if event.kind == "result" else "failed"
            self.ended = time.monotonic()
            if self._on_end is not None:
                self._on_end(self)

    def _publish(self, kind: EventKind, data: dict[str, Any]) -> None:
        self.events.append(ProgressEvent(self._next_index, kind, data))
        self._next_index += 1
        if len(self.events) > MAX_EVENTS:  # drop the oldest progress event; start/result/error/done stay
            for i, event in enumerate(self.events):
                if event.kind == "progress":
                    del self.events[i]
                    break
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def start(self, name: str | None = None, total: int | None = None, **extra: Any) -> None:
        """Mark the job running (once; later calls change nothing) and tell its watchers."""
        if self.state != "pending":
            return
        self.state = "running"
        self.total = total
        self.started = time.monotonic()
        data: dict[str, Any] = {"kind": self.kind, **extra}
        if name is not None:
            data["name"] = name
        if total is not None:
            data["total"] = total
        self._publish("start", data)

    def advance(self, done: int, *, force: bool = False, **extra: Any) -> None:
        """Bytes done so far; publishes at most every PROGRESS_INTERVAL seconds or whole percent."""
        if self.finished:
            return
        if self.state == "pending":
            self.start()
        self.bytes = done
        now = time.monotonic()
        percent = int(done * 100 / self.total) if self.total else -1
        if not force and now - self._last_progress < PROGRESS_INTERVAL and percent == self._last_percent:
            return
        self._last_progress, self._last_percent, self._published_bytes = now, percent, done
        data: dict[str, Any] = {"bytes": done, **extra}
        if self.total is not None:
            data["total"] = self.total
            data["percent"] = round(done * 100 / self.total, 1) if self.total else 100.0
        self._publish("progress", data)

    def succeed(self, result: dict[str, Any]) -> None:
        """Complete the job with ``result`` (once) after the last progress event."""
        if self.finished:
            return
        if self.state == "pending":
            self.start()
        if self._published_bytes != self.bytes:  # the last word on bytes comes before the result
            self.advance(self.bytes, force=True)
        self.state = "completed"
        self._publish("result", result)
        self._end()

    def fail(self, exc: TransferError) -> None:
        """End the job with ``exc`` as its error (once); watchers see it, retryable or not."""
        if self.finished:
            return
        self.state = "failed"
        body = exc.to_payload()["error"]
        body["retryable"] = exc.retryable
        self._publish("error", body)
        self._end()

    def _end(self) -> None:
        self.ended = time.monotonic()
        if self._on_end is not None:
            self._on_end(self)
        self._publish("end", {"state": self.state})
        duration = max(self.ended - self.started, 1e-6)
        self._publish(
            "done",
            {
                "bytes": self.bytes,
                "duration_ms": round(duration * 1000),
                "throughput_bps": round(self.bytes / duration),
                "state": self.state,
            },
        )

    async def follow(self, after: int = -1, *, heartbeat: float | None = None) -> AsyncIterator[ProgressEvent | None]:
        """Events with index > ``after``, live, until ``done``; yields None every ``heartbeat`` idle seconds."""
        self.watchers += 1
        try:
            while True:
                changed = self._changed
                for event in list(self.events):
                    if event.index > after:
                        after = event.index
                        yield event
                        if event.kind == "done":
                            return
                try:
                    await asyncio.wait_for(changed.wait(), timeout=heartbeat)
                except TimeoutError:
                    yield None
        finally:
            self.watchers -= 1


class ProgressHub:
    """The jobs of this process, bounded in number and lifetime (see the module docstring)."""

    def __init__(
        self,
        *,
        max_jobs: int = 10_000,
        retention: float = 600.0,
        max_waiting: int = 1000,
        wait_ttl: float = 60.0,
        on_open: Callable[[Job], None] | None = None,
    ) -> None:
        self._jobs: dict[str, Job] = {}
        self.on_open = on_open  # told of every job a writer opens here (the journal records it for other replicas)
        self.max_jobs = max_jobs
        self.retention = retention
        self.max_waiting = max_waiting
        self.wait_ttl = wait_ttl
        self._waiting: dict[str, Job] = {}  # opened by a reader, no writer yet
        # (deadline, job), appended in deadline order; an entry whose deadline is no longer the job's is stale
        self._waiting_q: deque[tuple[float, Job]] = deque()
        self._retired_q: deque[tuple[float, Job]] = deque()
        self._sources: dict[str, asyncio.Task[None]] = {}
        self._timer: asyncio.TimerHandle | None = None

    @staticmethod
    def new_id(prefix: str) -> str:
        """A new random job id with ``prefix``."""
        return f"{prefix}_{secrets.token_hex(16)}"

    @staticmethod
    def is_id(job_id: str) -> bool:
        """Whether ``job_id`` has the form of a job id."""
        return JOB_ID.match(job_id) is not None

    @staticmethod
    def check_id(job_id: str) -> str:
        """``job_id`` if it has the form of a job id, else InvalidRequest."""
        if not JOB_ID.match(job_id):
            raise InvalidRequest("job_id must be 8-64 characters of A-Z a-z 0-9 _ -")
        return job_id

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def waiting(self) -> int:
        """How many jobs wait for a free slot now."""
        return len(self._waiting)

    def _add(self, job: Job) -> Job:
        job._on_end = self._ended
        self._jobs[job.id] = job
        return job

    def _forget(self, job: Job) -> None:
        job.expires = None
        if self._jobs.get(job.id) is job:
            del self._jobs[job.id]
        if self._waiting.get(job.id) is job:
            del self._waiting[job.id]

    def _retire(self, job: Job) -> None:
        """Forget ``job`` after ``retention`` seconds unless it runs again meanwhile."""
        job.expires = time.monotonic() + self.retention
        self._retired_q.append((job.expires, job))

    def _ended(self, job: Job) -> None:
        if self._waiting.get(job.id) is job:
            del self._waiting[job.id]
        if self._jobs.get(job.id) is job:
            self._retire(job)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._waiting_q and self._waiting_q[0][0] <= now:
            deadline, job = self._waiting_q.popleft()
            if job.expires == deadline and self._waiting.get(job.id) is job:
                self._forget(job)  # before failing it: a failed job would be kept for `retention`
                job.fail(NotFound(f"job {job.id!r} did not start within {self.wait_ttl:g} s"))
        while self._retired_q and self._retired_q[0][0] <= now:
            deadline, job = self._retired_q.popleft()
            if job.expires == deadline:
                self._forget(job)

    def _arm_timer(self) -> None:
        """Expire waiting jobs on time even if no other lookup comes (their followers get not_found then). One
        timer per hub, re-armed until the head of the queue is due: the loop's clock is not time.monotonic."""
        if self._timer is None and self._waiting_q:
            delay = max(0.0, self._waiting_q[0][0] - time.monotonic()) + 0.01
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._expire()
        self._arm_timer()

    def _make_room(self) -> None:
        """Forget retired jobs early, oldest first, while ``max_jobs`` are kept."""
        while len(self._jobs) >= self.max_jobs and self._retired_q:
            deadline, job = self._retired_q.popleft()
            if job.expires == deadline:
                self._forget(job)

    def open(self, job_id: str, kind: str, owner: str | None = None) -> Job:
        """The job a writer (of ``owner``'s key) reports to. A reader of the same key may have opened it first
        (waiting): the writer takes it over. One that another key opened waiting is dropped (its reader gets
        not_found), so nobody can watch or block another key's upload by guessing its id. A job already running
        or finished under this id is a Conflict. Running jobs are never evicted (each is bounded by the upload or
        import it reports on)."""
        self._expire()
        job = self._jobs.get(job_id)
        if job is not None and (job.state != "pending" or job.kind != kind):
            raise Conflict(f"job {job_id!r} already exists")
        if job is not None and job.owner != owner:
            self._forget(job)
            job.fail(NotFound(f"no job {job_id!r} in this process"))
            job = None
        if job is None:
            self._make_room()
            job = self._add(Job(job_id, kind, owner=owner))
        else:
            self.adopt(job)
            source = self._sources.pop(job_id, None)
            if source is not None:  # a reader was watching the journal for it: the writer is here after all
                source.cancel()
        if self.on_open is not None:
            self.on_open(job)
        return job

    def adopt(self, job: Job) -> None:
        """``job`` has a writer now (here or on another replica): it is no longer waiting to start."""
        if self._waiting.get(job.id) is job:
            del self._waiting[job.id]
        job.expires = None

    def find(self, job_id: str, *, wait_for: str | None = None, owner: str | None = None) -> Job:
        """A job to read; ``wait_for`` (a kind) opens a waiting one so a reader can subscribe before the upload
        it names has started: at most ``max_waiting`` at once (else TooManyJobs), each failing with not_found
        after ``wait_ttl`` seconds unless a writer opened it."""
        self._expire()
        job = self._jobs.get(job_id)
        if job is not None:
            return job
        if wait_for is None:
            raise NotFound(f"no job {job_id!r} in this process")
        self._make_room()
        if len(self._waiting) >= self.max_waiting or len(self._jobs) >= self.max_jobs:
            retry = max(1, round(self._waiting_q[0][0] - time.monotonic())) if self._waiting_q else 1
            raise TooManyJobs(
                f"{len(self._waiting)} jobs are already waiting for their upload to start",
                headers={"retry-after": str(retry)},
            )
        job = self._add(Job(job_id, wait_for, owner=owner))
        job.expires = time.monotonic() + self.wait_ttl
        self._waiting[job_id] = job
        self._waiting_q.append((job.expires, job))
        self._arm_timer()
        return job

    def derived(
        self, job_id: str, kind: str, source: Callable[[Job], Awaitable[None]], owner: str | None = None
    ) -> Job:
        """A job whose events come from ``source`` (e.g. polling a session record), run while it is unfinished;
        the source may return early when nobody watches (``job.watchers``); the next reader starts it again."""
        self._expire()
        job = self._jobs.get(job_id)
        if job is None:
            self._make_room()
            job = self._add(Job(job_id, kind, owner=owner))
        self.watch(job, source)
        return job

    def watch(self, job: Job, source: Callable[[Job], Awaitable[None]]) -> None:
        """Run ``source`` for ``job`` unless one runs already or the job is over. A waiting job keeps its deadline
        (its source calls :meth:`adopt` once the job has started elsewhere)."""
        if job.id not in self._sources and not job.finished:
            if self._waiting.get(job.id) is not job:
                job.expires = None
            task = asyncio.create_task(self._run_source(job, source))
            self._sources[job.id] = task

    async def _run_source(self, job: Job, source: Callable[[Job], Awaitable[None]]) -> None:
        try:
            await source(job)
        except TransferError as exc:
            never_started = job.state == "pending"
            job.fail(exc)  # its followers learn why
            if never_started:  # e.g. an id that names no session: nothing worth keeping
                self._forget(job)
        finally:
            ours = self._sources.get(job.id) is asyncio.current_task()  # else a writer here took the job over
            if ours:
                del self._sources[job.id]
            if ours and not job.finished and self._jobs.get(job.id) is job and self._waiting.get(job.id) is not job:
                self._retire(job)  # stopped for lack of readers: forgotten later unless one comes back

    async def close(self) -> None:
        """Stop the hub's timer and the jobs' sources, and wait for them."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        tasks = list(self._sources.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def counted(body: AsyncIterator[bytes], job: Job) -> AsyncIterator[bytes]:
    """``body`` unchanged, reporting the bytes received to ``job``."""
    done = 0
    async for piece in body:
        done += len(piece)
        job.advance(done)
        yield piece
