"""The A2A front door: the Agent Card and the standard A2A JSON-RPC methods, a thin adapter over
:class:`A2AService` (shapes and codes in :mod:`transfer.core.agents.a2a_protocol`).

GET  /.well-known/agent-card.json   the public Agent Card (A2A 1.0 §8.2; also at /.well-known/agent.json for
                                    older clients): the JSON-RPC endpoint, the bearer scheme when API keys are
                                    configured, the cap on inline bytes
POST /a2a                           SendMessage / GetTask (A2A 1.0) and message/send / tasks/get (A2A 0.3), beside
                                    the TP methods ``tp.resource.*`` (:mod:`transfer.bindings.tp` reads the body
                                    under ``TRANSFER_MAX_JSON_BODY`` and hands A2A methods here)

The card is public, as A2A discovery needs (it names no resource and holds no secret); every method call carries
the API key like any other front door, and its scope is checked by the service (upload to send, read to get).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request

from transfer import __version__
from transfer.api.responses import AsciiJSONResponse
from transfer.core.agents.a2a_protocol import (
    CARD_PATH,
    LEGACY_CARD_PATH,
    METHODS,
    Operation,
    agent_card,
    check_version,
    get_task_id,
    parse_message,
    render_task,
    rpc_error,
    send_result,
    unsupported,
)
from transfer.core.auth import Grant
from transfer.errors import TransferError
from transfer.service.container import Services
from transfer.service.identity.directory import Identities

log = logging.getLogger("transfer.a2a")


def is_a2a_method(method: str) -> bool:
    return method in METHODS


async def answer_a2a(
    services: Services, obj: dict[str, Any], caller: Grant, base_url: str, version_header: str | None
) -> dict[str, Any]:
    """The JSON-RPC response object for one A2A call (``obj`` has passed the JSON-RPC 2.0 checks); errors are
    answered as JSON-RPC errors with A2A's codes, never raised."""
    rid = obj.get("id")
    method = str(obj["method"])
    dialect, operation = METHODS[method]
    try:
        check_version(version_header)
        params = obj.get("params")
        if operation is Operation.SEND:
            task = await services.a2a.send(parse_message(params), caller, base_url)
            result = send_result(task, dialect)
        elif operation is Operation.GET:
            task = await services.a2a.get(get_task_id(params), caller, base_url)
            result = render_task(task, dialect)
        elif operation is Operation.CANCEL:  # an unknown task is not found (-32001), as for tasks/get
            await services.a2a.load(get_task_id(params), caller)
            raise unsupported(operation, method)
        else:
            raise unsupported(operation, method)
    except TransferError as exc:
        return rpc_error(rid, exc)
    except Exception:  # a bug: a JSON-RPC client still gets a JSON-RPC error, and the log gets the trace
        log.exception("A2A %s failed", method)
        return rpc_error(rid, TransferError("internal error; see the server log"))
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def dumps(response: dict[str, Any]) -> str:
    return json.dumps(response, separators=(",", ":"), ensure_ascii=True)


def a2a_router(services: Services, auth: Identities, base_url: Callable[[Request], str]) -> APIRouter:
    router = APIRouter()
    settings = services.settings

    def card(request: Request) -> AsciiJSONResponse:
        doc = agent_card(
            base_url(request),
            version=__version__,
            auth_enabled=auth.enabled,
            max_json_body=settings.max_json_body,
            tp_identity=settings.tp_identity,
        )
        return AsciiJSONResponse(doc, headers={"cache-control": "public, max-age=300"})

    summary = "The A2A Agent Card (public): endpoint, methods, auth scheme, inline-bytes cap"

    @router.get(CARD_PATH, tags=["a2a"], summary=summary)
    async def agent_card_route(request: Request) -> AsciiJSONResponse:
        return card(request)

    @router.get(LEGACY_CARD_PATH, tags=["a2a"], summary=summary + " (path of A2A 0.2 clients)")
    async def legacy_agent_card_route(request: Request) -> AsciiJSONResponse:
        return card(request)

    return router
