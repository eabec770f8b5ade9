"""REST front door for events: the caller's own events as a stream, and the admin's webhook subscriptions and
dead letters (thin: the operations are in ``transfer.service.events``). See docs/HOOKS.md.

GET    /v1/events                                   text/event-stream of the calling key's events (``types`` to
                                                    choose); resumes after ``Last-Event-ID`` (or ``?last_event_id=``)
GET    /v1/admin/events                             the outbox: events waiting, its limit
GET    /v1/admin/events/dead                        dead-lettered events, a page at a time (``limit``, ``cursor``)
POST   /v1/admin/events/dead/{id}/retry             send a dead-lettered event again to the subscriptions it failed
POST   /v1/admin/subscriptions                      a new webhook subscription; answers its secret (once)
GET    /v1/admin/subscriptions                      every subscription
GET    /v1/admin/subscriptions/{id}                 one subscription
DELETE /v1/admin/subscriptions/{id}                 remove it: nothing more is sent to it
POST   /v1/admin/subscriptions/{id}/rotate          a new secret; the old one signs beside it for ``grace`` seconds
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field

from transfer.api.caller import caller_of
from transfer.core.auth import Scope
from transfer.errors import EventsDisabled, InvalidRequest, TooManySubscriptions
from transfer.service.container import Services
from transfer.service.events.feed import check_cursor, cursor_time
from transfer.service.events.model import EVENT_TYPES, is_event_id

POLL = 0.5  # seconds between looks at the caller's feed while nothing new came
LOOKBACK = 2.0  # seconds a live stream looks back for events another replica wrote a little late
SENT_REMEMBERED = 2048  # event ids a live stream remembers (not to send one it looked back at twice)
MEDIA_TYPE = "text/event-stream"


class NewSubscription(BaseModel):
    url: str = Field(max_length=2048, description="where events are POSTed (http or https)")
    types: list[str] | None = Field(default=None, description="event types it takes (default: all)")
    owners: list[str] | None = Field(default=None, description="keys whose events it takes (default: every key's)")
    description: str = Field(default="", max_length=500)
    secret: str | None = Field(default=None, description="a whsec_ secret to sign with (default: one is made)")


class Rotation(BaseModel):
    grace: float = Field(default=86400.0, ge=0, le=604800, description="seconds the old secret keeps signing")
    secret: str | None = Field(default=None, description="the new whsec_ secret (default: one is made)")


def sse_frame(cursor: str, doc: dict[str, Any], retry: int | None) -> bytes:
    """One SSE event: its cursor as ``id``, its type as ``event``, the Standard Webhooks payload (with the event's
    ``id``) as ``data`` (WHATWG HTML §9.2)."""
    head = f"retry: {retry}\n" if retry is not None else ""
    data = json.dumps(doc, ensure_ascii=True, separators=(",", ":"))
    return f"{head}id: {cursor}\nevent: {doc.get('type', 'message')}\ndata: {data}\n\n".encode()


def events_router(services: Services, needs: Callable[[Scope], Any]) -> APIRouter:
    """The event stream and the admin's subscription and dead-letter endpoints."""
    router = APIRouter()
    events = services.events
    settings = services.settings
    streams = [0]  # streams open in this process

    def enabled() -> None:
        if not events.enabled:
            raise EventsDisabled("events are not recorded on this deployment (TRANSFER_EVENTS=false)")

    @router.get(
        "/v1/events",
        dependencies=[needs(Scope.READ)],
        tags=["events"],
        summary="The calling key's events (file.published, file.deleted, file.expired, upload.aborted, "
        "quota.exceeded) as a server-sent event stream, resumable with Last-Event-ID",
        response_class=StreamingResponse,
        responses={200: {"content": {MEDIA_TYPE: {}}}},
    )
    async def stream(
        request: Request,
        types: Annotated[str | None, Query(max_length=200, description="comma-separated types (default: all)")] = None,
        last_event_id_query: Annotated[
            str | None,
            Query(alias="last_event_id", max_length=64, description="as Last-Event-ID, for clients that cannot set it"),
        ] = None,
        last_event_id: Annotated[str | None, Header(max_length=64)] = None,
    ) -> Response:
        enabled()
        wanted: frozenset[str] | None = None
        if types:
            wanted = frozenset(t.strip() for t in types.split(",") if t.strip())
            if not wanted or not wanted <= EVENT_TYPES:
                raise InvalidRequest(f"types are some of {', '.join(sorted(EVENT_TYPES))}", field="types")
        resume = last_event_id if last_event_id is not None else last_event_id_query
        cursor = None if not resume else check_cursor(resume)
        owner = caller_of(request).owner
        if streams[0] >= settings.max_event_streams:
            raise TooManySubscriptions(
                f"{settings.max_event_streams} event streams are open on this server; try again later",
                headers={"retry-after": "5"},
            )

        async def frames() -> AsyncIterator[bytes]:
            streams[0] += 1
            try:
                retry: int | None = 2000
                sent: OrderedDict[str, None] = OrderedDict()
                after = cursor
                quiet = time.monotonic()
                while True:
                    # live, look back a little: an entry another replica wrote just after a later one of ours
                    look = after
                    if after is not None and sent:
                        look = f"{max(0, int((cursor_time(after) - LOOKBACK) * 1000)):013d}-"
                    page = await events.feed.after(owner, look, limit=100)
                    fresh = [(c, doc) for c, doc in page if str(doc.get("id")) not in sent]
                    if look != after and len(page) >= 100 and not fresh:  # a busy window: on from the last one
                        page = await events.feed.after(owner, after, limit=100)
                        fresh = [(c, doc) for c, doc in page if str(doc.get("id")) not in sent]
                    for c, doc in fresh:
                        sent[str(doc.get("id"))] = None
                        if len(sent) > SENT_REMEMBERED:
                            sent.popitem(last=False)
                        if after is None or c > after:
                            after = c
                        if wanted is not None and doc.get("type") not in wanted:
                            continue
                        yield sse_frame(c, doc, retry)
                        retry = None
                        quiet = time.monotonic()
                    if len(page) >= 100 and fresh:
                        continue  # more waiting: no pause
                    if time.monotonic() - quiet >= settings.sse_heartbeat:
                        yield b": keep-alive\n\n"
                        quiet = time.monotonic()
                    await asyncio.sleep(POLL)
            finally:
                streams[0] -= 1

        headers = {"cache-control": "no-cache, no-transform", "x-accel-buffering": "no"}
        return StreamingResponse(frames(), media_type=MEDIA_TYPE, headers=headers)

    @router.get(
        "/v1/admin/events",
        dependencies=[needs(Scope.ADMIN)],
        tags=["admin"],
        summary="The event outbox: events waiting for delivery at the last look, and its limit",
    )
    async def outbox() -> dict[str, Any]:
        enabled()
        return {"waiting": len(await events.outbox.ids()), "limit": events.outbox.limit}

    @router.get(
        "/v1/admin/events/dead",
        dependencies=[needs(Scope.ADMIN)],
        tags=["admin"],
        summary="Events some subscription never took within events_max_age, in id order, a page at a time",
    )
    async def dead(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        cursor: Annotated[str | None, Query(max_length=64, description="next_cursor of the previous page")] = None,
    ) -> dict[str, Any]:
        enabled()
        if cursor is not None and not is_event_id(cursor):
            raise InvalidRequest("cursor is not one this listing handed out", field="cursor")
        letters, next_cursor = await events.outbox.dead(limit=limit, after=cursor)
        return {"events": [letter.summary() for letter in letters], "next_cursor": next_cursor}

    @router.post(
        "/v1/admin/events/dead/{event_id}/retry",
        dependencies=[needs(Scope.ADMIN)],
        status_code=202,
        tags=["admin"],
        summary="Send a dead-lettered event again to the subscriptions it failed for",
    )
    async def retry(event_id: str) -> dict[str, Any]:
        enabled()
        entry = await events.outbox.revive(event_id, time.time())  # deliveries run on real time
        events.made(entry.event.id)
        return {"id": entry.event.id, "subscriptions": sorted(entry.targets or {})}

    @router.post(
        "/v1/admin/subscriptions",
        dependencies=[needs(Scope.ADMIN)],
        status_code=201,
        tags=["admin"],
        summary="A new webhook subscription; the answer carries its signing secret (shown only here and on rotate)",
    )
    async def subscribe(body: NewSubscription) -> dict[str, Any]:
        enabled()
        sub, secret = await events.subscriptions.create(
            body.url, types=body.types, owners=body.owners, description=body.description, secret=body.secret
        )
        return {**sub.public(time.time()), "secret": secret}

    @router.get(
        "/v1/admin/subscriptions", dependencies=[needs(Scope.ADMIN)], tags=["admin"], summary="Every subscription"
    )
    async def subscriptions() -> dict[str, Any]:
        enabled()
        now = time.time()
        return {"subscriptions": [s.public(now) for s in await events.subscriptions.all()]}

    @router.get(
        "/v1/admin/subscriptions/{sid}", dependencies=[needs(Scope.ADMIN)], tags=["admin"], summary="One subscription"
    )
    async def subscription(sid: str) -> dict[str, Any]:
        enabled()
        return (await events.subscriptions.get(sid)).public(time.time())

    @router.delete(
        "/v1/admin/subscriptions/{sid}",
        dependencies=[needs(Scope.ADMIN)],
        status_code=204,
        tags=["admin"],
        summary="Remove a subscription: nothing more is sent to it",
    )
    async def unsubscribe(sid: str) -> Response:
        enabled()
        await events.subscriptions.delete(sid)
        return Response(status_code=204)

    @router.post(
        "/v1/admin/subscriptions/{sid}/rotate",
        dependencies=[needs(Scope.ADMIN)],
        tags=["admin"],
        summary="Give a subscription a new secret; the old one keeps signing beside it for `grace` seconds",
    )
    async def rotate(sid: str, body: Rotation) -> dict[str, Any]:
        enabled()
        sub, secret = await events.subscriptions.rotate(sid, grace=body.grace, secret=body.secret)
        return {**sub.public(time.time()), "secret": secret}

    return router
