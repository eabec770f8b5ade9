"""Jobs and their progress as an AIFlowy Chat 1.1 event stream (seed 001), plus server-side imports.

GET  /v1/jobs/{id}            the job's state as JSON
GET  /v1/jobs/{id}/events     text/event-stream; ``Last-Event-ID`` (or ``?last_event_id=``) resumes after that event;
                              204 once the stream has ended (the id of its ``error``/``done`` event)
POST /v1/imports              the service resolves a descriptor itself (SSRF-guarded) -> 202 {job_id, …}

A job id is a session id (``s_…``: any replica), an import (``j_…``) or the ``job_id`` a client gave
``POST /v1/files?job_id=…`` (that process only; open the stream first, it waits for the upload to start).

How job events map to envelopes (SSE ``id`` = envelope ``index``, ``<index>-end`` on the terminal event, see
transfer.core.agents.aiflowy; ``message_id`` = the job id):

    start     event message  workflow/status    {"node_id": job, "state": "start", "kind", "name"?, "total"?}
    progress  event message  tool/progress      {"tool_call_id": job, "name": kind, "bytes", "total"?, "percent"?,
                                                 sessions also "chunks_stored", "total_chunks", "state"}
    result    event message  tool/tool_result   {"tool_call_id": job, "name": kind, "status": "success",
                                                 "result": {"file_id", "descriptor": FileContent}}
    end       event message  workflow/status    {"node_id": job, "state": "end", "reason": "completed"}
    error     event error    system/error       {"code", "message", "retryable", "detail"?}; the stream ends here
                                                (the failed job's end and done are never sent)
    done      event done     system/done        payload {}, meta {"bytes", "duration_ms", "latency_ms",
                                                 "throughput_bps"}
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from transfer.api.caller import caller_of
from transfer.core.agents import aiflowy
from transfer.core.auth import Scope
from transfer.errors import NotFound
from transfer.service.container import Services
from transfer.service.jobs.progress import Job, ProgressEvent


class ImportRequest(BaseModel):
    descriptor: dict[str, Any] = Field(description="a FileContent (url or inline mode) to fetch and store here")
    job_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_-]{8,64}$")


def render(event: ProgressEvent, job: Job, conversation_id: str) -> tuple[str, dict[str, Any]]:
    """A job event as (SSE event name, aiflowy envelope)."""
    common: dict[str, Any] = {"conversation_id": conversation_id, "message_id": job.id, "index": event.index}
    data = event.data
    if event.kind == "start":
        payload = {"node_id": job.id, "state": "start", **data}
        return "message", aiflowy.envelope("workflow", "status", payload, **common)
    if event.kind == "progress":
        payload = {"tool_call_id": job.id, "name": job.kind, **data}
        return "message", aiflowy.envelope("tool", "progress", payload, **common)
    if event.kind == "result":
        payload = {"tool_call_id": job.id, "name": job.kind, "status": "success", "result": data}
        return "message", aiflowy.envelope("tool", "tool_result", payload, **common)
    if event.kind == "end":
        payload = {"node_id": job.id, "state": "end", "reason": data["state"]}
        return "message", aiflowy.envelope("workflow", "status", payload, **common)
    if event.kind == "error":
        payload = {k: data[k] for k in ("code", "message", "retryable") if k in data}
        if data.get("detail"):
            payload["detail"] = data["detail"]
        return "error", aiflowy.envelope("system", "error", payload, **common)
    meta = {
        "bytes": data["bytes"],
        "duration_ms": data["duration_ms"],
        "latency_ms": data["duration_ms"],
        "throughput_bps": data["throughput_bps"],
    }
    return "done", aiflowy.envelope("system", "done", {}, meta=meta, **common)


def terminal_index(job: Job) -> int | None:
    """The index of the event that ends ``job``'s stream (its first ``error``, else ``done``), once it has one."""
    for event in job.events:
        if event.kind in aiflowy.TERMINAL_EVENTS:
            return event.index
    return None


def job_document(job: Job) -> dict[str, Any]:
    doc: dict[str, Any] = {"job_id": job.id, "kind": job.kind, "state": job.state, "bytes": job.bytes}
    if job.total is not None:
        doc["total"] = job.total
    for event in job.events:
        if event.kind == "result":
            doc["result"] = event.data
        elif event.kind == "error":
            doc["error"] = event.data
    return doc


def jobs_router(services: Services, base_url: Callable[[Request], str], needs: Callable[[Scope], Any]) -> APIRouter:
    router = APIRouter()
    settings = services.settings

    @router.get("/v1/jobs/{job_id}", dependencies=[needs(Scope.READ)], tags=["jobs"], summary="A job's state")
    async def job_state(request: Request, job_id: str) -> dict[str, Any]:
        job = await services.job(job_id, base_url(request), caller_of(request), wait=False)  # a look creates nothing
        return job_document(job)

    @router.get(
        "/v1/jobs/{job_id}/events",
        dependencies=[needs(Scope.READ)],
        tags=["jobs"],
        summary="Progress as an AIFlowy Chat 1.1 SSE stream (events message / error / done)",
        response_class=StreamingResponse,
        responses={
            200: {"content": {"text/event-stream": {}}},
            204: {"description": "the stream already ended (Last-Event-ID named its terminal event): stop"},
        },
    )
    async def job_events(
        request: Request,
        job_id: str,
        conversation_id: Annotated[
            str | None, Query(min_length=1, max_length=128, description="default: a new conv_… id")
        ] = None,
        last_event_id_query: Annotated[
            str | None,
            Query(alias="last_event_id", max_length=64, description="as Last-Event-ID, for clients that cannot set it"),
        ] = None,
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> Response:
        """Replays the job's events after ``Last-Event-ID`` and follows it live until its terminal event (``error``
        or ``done``), then closes. A reconnect after the terminal event gets 204, which stops an EventSource."""
        after, terminal = -1, False
        if last_event_id is not None:
            after, terminal = aiflowy.parse_last_event_id(last_event_id)
        elif last_event_id_query is not None:
            after, terminal = aiflowy.parse_last_event_id(last_event_id_query, "last_event_id")
        if terminal:
            # WHATWG HTML §9.2: 204 tells an EventSource to stop reconnecting; nothing follows a terminal event
            return Response(status_code=204)
        job = await services.job(job_id, base_url(request), caller_of(request))
        end = terminal_index(job)
        if end is not None and after >= end:
            return Response(status_code=204)  # a client that kept the plain index of the terminal event
        conversation = conversation_id or aiflowy.new_conversation_id()

        async def frames() -> AsyncIterator[bytes]:
            retry: int | None = 2000  # sent once, with the first event
            opened = time.monotonic()
            async for event in job.follow(after, heartbeat=settings.sse_heartbeat):
                if event is None:
                    if job.state == "pending" and time.monotonic() - opened > settings.job_wait_ttl:
                        # a job that never started (a mistyped id, an upload that never came): say so and end
                        gone = NotFound(f"job {job.id!r} did not start within {settings.job_wait_ttl:g} s")
                        payload = {"code": gone.code, "message": gone.message, "retryable": False}
                        doc = aiflowy.envelope(
                            "system", "error", payload, conversation_id=conversation, message_id=job.id
                        )
                        yield aiflowy.sse_frame("error", doc, None, retry)
                        return
                    yield aiflowy.KEEP_ALIVE
                    continue
                name, doc = render(event, job, conversation)
                yield aiflowy.sse_frame(name, doc, event.index, retry)
                retry = None
                if name in aiflowy.TERMINAL_EVENTS:
                    return  # a failed job's log goes on with end and done: they are never sent

        headers = {"cache-control": "no-cache, no-transform", "x-accel-buffering": "no"}
        return StreamingResponse(frames(), media_type=aiflowy.MEDIA_TYPE, headers=headers)

    @router.post(
        "/v1/imports",
        dependencies=[needs(Scope.UPLOAD)],
        status_code=202,
        tags=["jobs"],
        summary="Fetch a descriptor's content server-side and store it (private addresses refused)",
    )
    async def start_import(request: Request, body: ImportRequest) -> dict[str, Any]:
        descriptor = services.imports.parse(body.descriptor, settings.inline_threshold)
        base = base_url(request)
        job = await services.imports.start(descriptor, base, caller_of(request), job_id=body.job_id)
        return {
            "job_id": job.id,
            "status_url": f"{base}/v1/jobs/{job.id}",
            "events_url": f"{base}/v1/jobs/{job.id}/events",
        }

    return router
