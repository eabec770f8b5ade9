"""Follow a job's AIFlowy Chat 1.1 event stream (``GET /v1/jobs/{id}/events``): every envelope is validated, a cut
connection is resumed with ``Last-Event-ID``, an ``error`` event raises the service's error, ``done`` ends it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import SSEError, aconnect_sse

from transfer.client.resolver import raise_for_error
from transfer.core.agents import aiflowy
from transfer.errors import InvalidEnvelope, RemoteError, TransferError, errors_by_code


@dataclass(frozen=True, slots=True)
class JobEvent:
    event: str  # message | error | done
    envelope: dict[str, Any]

    @property
    def domain(self) -> str:
        return str(self.envelope["domain"])

    @property
    def type(self) -> str:
        return str(self.envelope["type"])

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.envelope.get("payload", {})
        return payload


def _raise_error_event(doc: dict[str, Any]) -> None:
    payload = doc.get("payload", {})
    cls = errors_by_code().get(str(payload.get("code")), TransferError)
    detail = payload.get("detail") if isinstance(payload.get("detail"), dict) else {}
    raise cls(str(payload.get("message", "job failed")), **detail)


async def follow_job(
    http: httpx.AsyncClient,
    url: str,
    *,
    conversation_id: str | None = None,
    last_event_id: int | None = None,
    reconnects: int = 5,
) -> AsyncIterator[JobEvent]:
    """Yield the events of ``url`` (a ``…/events`` URL) until ``done``; raises the job's error on ``error``."""
    params = {"conversation_id": conversation_id} if conversation_id else {}
    attempts = 0
    while True:
        headers = {"accept": aiflowy.MEDIA_TYPE}
        if last_event_id is not None:
            headers["last-event-id"] = str(last_event_id)
        try:
            async with aconnect_sse(http, "GET", url, params=params, headers=headers, timeout=None) as source:
                if source.response.status_code != 200:
                    await source.response.aread()
                    await raise_for_error(source.response)
                    raise RemoteError(f"event stream answered HTTP {source.response.status_code}")
                source.response.raise_for_status()
                async for sse in source.aiter_sse():
                    if not sse.data:  # a retry-only or comment-only block: nothing to dispatch
                        continue
                    if sse.event not in aiflowy.SSE_EVENTS:
                        raise InvalidEnvelope(f"unexpected SSE event name {sse.event!r}")
                    try:
                        doc = aiflowy.validate(json.loads(sse.data))
                    except ValueError as exc:
                        raise InvalidEnvelope(f"event data is not JSON: {exc}") from None
                    params["conversation_id"] = doc["conversation_id"]  # keep it across reconnects
                    if sse.id:
                        last_event_id, _ = aiflowy.parse_last_event_id(sse.id)  # a terminal id ends the loop below
                    if sse.event == "error":
                        _raise_error_event(doc)
                    yield JobEvent(sse.event, doc)
                    if sse.event == "done":
                        return
            raise httpx.RemoteProtocolError("event stream ended before done")
        except (httpx.TransportError, SSEError):
            attempts += 1
            if attempts > reconnects:
                raise RemoteError("the event stream kept breaking; giving up") from None
