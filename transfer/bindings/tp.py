"""TP transport bindings over HTTP (seed 002 §9.2-9.6): thin adapters that parse an envelope, hand it to
:class:`TPService`, and render the outcome in their protocol.

POST /tp/v1/resource/{mount|unmount|notify}   REST (§9.5): ``application/tp+json``; ``TP-Version``,
                                              ``TP-Contract-Ref`` checked when sent; 200 + envelope,
                                              202 + {"correlation_id"}, 4xx/5xx + TPError
POST /tp/v1/{other area}/…                    valid TP paths this service does not serve: 501 TPError
POST /tp/v1                                   native HTTP/2 mode (§9.2.3): dispatched by ``message_type``;
                                              exactly ``application/tp+json`` (415 otherwise), ``TP-Contract-Ref``
                                              and ``TP-Message-Id`` required and equal to the envelope's
                                              ``protocol_contract_ref`` / ``message_id`` (400
                                              ``tp_{contract_ref,message_id}_{missing,mismatch}``)
WS   /tp/v1                                   native WebSocket (§9.2.2): subprotocol ``tp.v1``, one envelope per
                                              text frame; replies, errors (``message_type: "error"``) and pushed
                                              ``resource_notify`` messages as frames
POST /a2a                                     A2A JSON-RPC 2.0 (§9.3): ``tp.resource.mount|unmount|notify`` with
                                              ``params.tp_envelope``; batches; the envelope bytes pass unaltered.
                                              The standard A2A methods (SendMessage, GetTask, message/send, …)
                                              on the same endpoint go to :mod:`transfer.bindings.a2a`
GET  /tp/v1/messages?receiver=…&wait=…       the reverse direction: messages kept for a receiver (long poll)
POST /tp/v1/prompt                            prompt embedding (§9.6): text with ```` ```tp-envelope ```` blocks in,
                                              text with the reply block out

TPError body: ``{"code", "message", "status", "retryable", "related_message_id"?, "detail"?}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from starlette.websockets import WebSocketDisconnect

from transfer.bindings.a2a import answer_a2a, dumps, is_a2a_method
from transfer.core.agents.a2a_protocol import RpcCode
from transfer.core.agents.tp import (
    MEDIA_TYPE,
    MESSAGE_TYPES,
    METHOD_TO_TYPE,
    RESOURCE_TYPES,
    TP_VERSION,
    WEBSOCKET_SUBPROTOCOL,
    Binding,
    Envelope,
    element_spans,
    embed_in_prompt,
    extract_from_prompt,
    loads_strict,
    make_envelope,
    member_spans,
    parse_envelope,
    tp_error,
    validate_envelope,
)
from transfer.core.auth import Grant
from transfer.core.numerals import decimal
from transfer.errors import (
    InvalidEnvelope,
    InvalidRequest,
    NotFound,
    TooLarge,
    TooManySubscriptions,
    TPContractRefMismatch,
    TPContractRefMissing,
    TPMessageIdMismatch,
    TPMessageIdMissing,
    TPVersionUnsupported,
    TransferError,
    UnsupportedMediaType,
    UnsupportedMessageType,
)
from transfer.service.agents.subscriptions import OUTBOX_BYTES, Outbox
from transfer.service.agents.tp import TPOutcome, receiver_topic
from transfer.service.container import Services
from transfer.service.identity.directory import Identities
from transfer.service.jobs.progress import ProgressEvent

JSON_TYPES = (MEDIA_TYPE, "application/json")
PARSE_IN_THREAD = 1 << 20  # JSON bodies larger than this are decoded and parsed off the event loop
_REST_PATHS = {path: mtype for mtype, (_, path) in MESSAGE_TYPES.items() if path}


def tp_error_response(exc: TransferError, related: str | None = None) -> JSONResponse:
    return JSONResponse(tp_error(exc, related), status_code=exc.status, headers=exc.headers or None)


def outcome_response(outcome: TPOutcome) -> Response:
    if outcome.reply is not None:
        headers = {"tp-version": TP_VERSION, "tp-message-id": outcome.reply.message_id}
        return Response(outcome.reply.raw, status_code=outcome.status, media_type=MEDIA_TYPE, headers=headers)
    return JSONResponse(outcome.body(), status_code=outcome.status)


async def read_capped(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and (decimal(length) or 0) > limit:
        raise TooLarge(f"the body is larger than {limit} bytes", limit=limit)
    pieces: list[bytes] = []
    received = 0
    async for piece in request.stream():
        received += len(piece)
        if received > limit:
            raise TooLarge(f"the body is larger than {limit} bytes", limit=limit)
        pieces.append(piece)
    return b"".join(pieces)  # one copy at the end: growing a buffer piece by piece re-copies large bodies


def check_media_type(request: Request, allowed: tuple[str, ...]) -> None:
    raw = request.headers.get("content-type", "")
    if raw.split(";")[0].strip().lower() not in allowed:
        raise UnsupportedMediaType(f"Content-Type must be {' or '.join(allowed)}", supported=list(allowed))


def job_notice(event: ProgressEvent, rid: str, sender: str, receiver: Any, binding: Binding, now: float) -> Envelope:
    """A job event as a ``resource_notify`` envelope (progress pushed to WebSocket subscribers)."""
    payload: dict[str, Any] = {"resource_id": rid, "event": event.kind, "index": event.index, **event.data}
    return make_envelope("resource_notify", payload, sender=sender, receiver=receiver, binding=binding, timestamp=now)


def tp_http_router(services: Services, auth: Identities, base_url: Callable[[Request], str]) -> APIRouter:
    """TP over HTTP: the REST binding (``/tp/v1/<area>/<verb>``, §9.5), the native HTTP binding (``POST /tp/v1``,
    §9.2.3), prompt embedding (``/tp/v1/prompt``) and the mailbox long poll (``/tp/v1/messages``)."""
    router = APIRouter()
    tp = services.tp
    settings = services.settings
    cap = settings.tp_max_envelope_size

    async def run_http(request: Request, expected_type: str | None) -> Response:
        related: str | None = None
        # the native mode (§9.2.3) fixes the media type and requires both headers; REST (§9.5.2) checks them when sent
        native = expected_type is None
        try:
            authorize = await auth.grant(request.headers.get("authorization"))
            check_media_type(request, (MEDIA_TYPE,) if native else JSON_TYPES)
            ref = request.headers.get("tp-contract-ref")
            mid = request.headers.get("tp-message-id")
            if native and ref is None:
                raise TPContractRefMissing("POST /tp/v1 needs TP-Contract-Ref: <contract_id> (TP §9.2.3)")
            if native and mid is None:
                raise TPMessageIdMissing("POST /tp/v1 needs TP-Message-Id: <message_id> (TP §9.2.3)")
            version = request.headers.get("tp-version")
            if version is not None and version.split(".")[0] != TP_VERSION.split(".")[0]:
                raise TPVersionUnsupported(f"TP-Version {version!r} is not supported; this is {TP_VERSION}")
            envelope = parse_envelope(await read_capped(request, cap), cap)
            related = envelope.message_id
            if expected_type is not None and envelope.message_type != expected_type:
                raise InvalidEnvelope(
                    f"this endpoint takes {expected_type}; the envelope is {envelope.message_type}",
                    expected=expected_type,
                )
            if ref is not None and (envelope.contract_ref is not None or native) and ref != envelope.contract_ref:
                raise TPContractRefMismatch(
                    f"TP-Contract-Ref {ref!r} differs from the envelope's protocol_contract_ref "
                    f"({envelope.contract_ref!r})"
                    if envelope.contract_ref is not None
                    else f"TP-Contract-Ref {ref!r} names a contract; the envelope has no protocol_contract_ref"
                )
            if mid is not None and mid != envelope.message_id:
                raise TPMessageIdMismatch("TP-Message-Id differs from the envelope's message_id")
            binding = Binding.REST_API if expected_type is not None else Binding.NATIVE_TP
            outcome = await tp.handle(envelope, binding, authorize, base_url(request))
        except TransferError as exc:
            return tp_error_response(exc, related)
        return outcome_response(outcome)

    rest_doc: dict[str, Any] = dict(
        tags=["tp"],
        response_class=Response,
        openapi_extra={"requestBody": {"required": True, "content": {MEDIA_TYPE: {"schema": {"type": "object"}}}}},
        responses={200: {"content": {MEDIA_TYPE: {}}}, 202: {"description": "accepted: {correlation_id}"}},
    )

    @router.post("/tp/v1/resource/mount", summary="TP resource_mount (REST binding)", **rest_doc)
    async def tp_mount(request: Request) -> Response:
        return await run_http(request, "resource_mount")

    @router.post("/tp/v1/resource/unmount", summary="TP resource_unmount (REST binding)", **rest_doc)
    async def tp_unmount(request: Request) -> Response:
        return await run_http(request, "resource_unmount")

    @router.post("/tp/v1/resource/notify", summary="TP resource_notify (REST binding)", **rest_doc)
    async def tp_notify(request: Request) -> Response:
        return await run_http(request, "resource_notify")

    @router.post("/tp/v1", summary="TP native HTTP binding: any envelope, dispatched by message_type", **rest_doc)
    async def tp_native(request: Request) -> Response:
        return await run_http(request, None)

    @router.post(
        "/tp/v1/prompt",
        tags=["tp"],
        summary="TP prompt embedding: text with ```tp-envelope blocks in, the reply block out",
        response_class=Response,
        openapi_extra={"requestBody": {"required": True, "content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def tp_prompt(request: Request) -> Response:
        related: str | None = None
        try:
            authorize = await auth.grant(request.headers.get("authorization"))
            check_media_type(request, ("text/plain", "text/markdown"))
            try:
                text = (await read_capped(request, cap)).decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequest("the prompt is not UTF-8 text") from None
            replies = []
            for envelope in extract_from_prompt(text, cap):
                related = envelope.message_id
                outcome = await tp.handle(envelope, Binding.PROMPT_EMBEDDING, authorize, base_url(request))
                reply = tp.as_envelope(outcome, envelope, Binding.PROMPT_EMBEDDING)
                replies.append(embed_in_prompt(reply, settings.tp_identity, primer=False))
        except TransferError as exc:
            return tp_error_response(exc, related)
        return Response("\n".join(replies), media_type="text/plain; charset=utf-8")

    @router.get(
        "/tp/v1/messages",
        tags=["tp"],
        summary="Messages waiting for a receiver (long poll; each delivered once): {messages: [envelope, ...]}",
    )
    async def tp_messages(
        request: Request,
        receiver: Annotated[str, Query(min_length=1, max_length=1024, description="the TP identity polled for")],
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        wait: Annotated[float, Query(ge=0, le=60, description="seconds to wait when nothing is there yet")] = 0,
    ) -> Response:
        try:
            grant = await auth.grant(request.headers.get("authorization"))
            topic = receiver_topic(receiver)
            queue = tp.subscribe(topic)  # before the first look (which checks the key), so nothing slips between
            try:
                messages = await tp.poll(receiver, grant, limit)
                if not messages and wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(queue.get(), timeout=wait)
                    messages = await tp.poll(receiver, grant, limit)
            finally:
                tp.unsubscribe(topic, queue)
        except TransferError as exc:
            return tp_error_response(exc)
        return JSONResponse({"messages": messages})

    @router.post("/tp/v1/{area}/{rest:path}", tags=["tp"], summary="Other TP message types (not served here)")
    async def tp_other(area: str, rest: str) -> Response:
        path = f"{area}/{rest}"
        known = _REST_PATHS.get(path) or next(
            (m for p, m in _REST_PATHS.items() if "{id}" in p and _matches(p, path)), None
        )
        if known is None:
            return tp_error_response(NotFound(f"no TP endpoint /tp/v1/{path}"))
        return tp_error_response(
            UnsupportedMessageType(
                f"this service handles {', '.join(RESOURCE_TYPES)}, not {known}", supported=list(RESOURCE_TYPES)
            )
        )

    return router


def tp_jsonrpc_router(services: Services, auth: Identities, base_url: Callable[[Request], str]) -> APIRouter:
    """TP over A2A JSON-RPC 2.0 (``POST /a2a``, §9.3), beside the A2A methods themselves."""
    router = APIRouter()
    tp = services.tp
    settings = services.settings
    cap = settings.tp_max_envelope_size

    # -- A2A JSON-RPC 2.0 ------------------------------------------------------------------------------------------

    @router.post(
        "/a2a",
        tags=["tp"],
        summary="A2A JSON-RPC 2.0: SendMessage / GetTask (A2A 1.0), message/send / tasks/get (A2A 0.3), and "
        "tp.resource.mount / unmount / notify with params.tp_envelope (batches too)",
        response_class=Response,
        openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {}}}}},
    )
    async def a2a_jsonrpc(request: Request) -> Response:
        try:
            authorize = await auth.grant(request.headers.get("authorization"))
            check_media_type(request, ("application/json", "application/json-rpc"))
            raw = await read_capped(request, settings.max_json_body)
        except TransferError as exc:
            return Response(
                _rpc_error(None, RpcCode.UNAUTHENTICATED if exc.status == 401 else -32600, exc),
                status_code=exc.status,
                media_type="application/json",
                headers=exc.headers or None,
            )

        def parse() -> tuple[str, Any, list[tuple[int, int]]]:
            text = raw.decode("utf-8")
            doc = loads_strict(text)
            return text, doc, element_spans(text) if isinstance(doc, list) else []

        try:
            # a file sent inline makes a large body: CPU work of that size stays off the event loop
            text, doc, spans = await asyncio.to_thread(parse) if len(raw) > PARSE_IN_THREAD else parse()
        except (UnicodeDecodeError, InvalidEnvelope) as exc:
            return Response(
                _rpc_error(None, -32700, InvalidRequest(f"parse error: {exc}")), media_type="application/json"
            )
        base = base_url(request)

        async def one(obj: Any, obj_text: str) -> str | None:
            if not isinstance(obj, dict):
                return _rpc_error(None, -32600, InvalidRequest("a request is a JSON object"))
            rid = obj.get("id")
            if "id" in obj and not (
                rid is None or isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool))
            ):
                return _rpc_error(None, -32600, InvalidRequest("id must be a string, a number or null"))
            notification = "id" not in obj
            if obj.get("jsonrpc") != "2.0" or not isinstance(obj.get("method"), str):
                return _rpc_error(rid, -32600, InvalidRequest('a request needs "jsonrpc": "2.0" and a method'))
            if is_a2a_method(obj["method"]):
                answer = await answer_a2a(services, obj, authorize, base, request.headers.get("a2a-version"))
                return None if notification else dumps(answer)
            mtype = METHOD_TO_TYPE.get(obj["method"])
            if mtype is None or mtype not in RESOURCE_TYPES:
                exc = UnsupportedMessageType(
                    f"method {obj['method']!r} not found here", supported=[MESSAGE_TYPES[t][0] for t in RESOURCE_TYPES]
                )
                return None if notification else _rpc_error(rid, -32601, exc)
            try:
                params = obj.get("params")
                if not isinstance(params, dict) or not isinstance(params.get("tp_envelope"), dict):
                    raise InvalidEnvelope("params must be an object with tp_envelope (a MessageEnvelope object)")
                p0, p1 = member_spans(obj_text)["params"]
                params_text = obj_text[p0:p1]
                e0, e1 = member_spans(params_text)["tp_envelope"]
                envelope = validate_envelope(params["tp_envelope"], params_text[e0:e1].encode("utf-8"))
                if len(envelope.raw) > cap:
                    raise TooLarge(f"envelope is larger than {cap} bytes", limit=cap)
                if envelope.message_type != mtype:
                    raise InvalidEnvelope(f"method {obj['method']} carries {mtype}, not {envelope.message_type}")
                outcome = await tp.handle(envelope, Binding.A2A_JSONRPC, authorize, base)
            except TransferError as exc:
                code = -32602 if isinstance(exc, InvalidRequest | TooLarge) else -32000
                return None if notification else _rpc_error(rid, code, exc)
            if notification:
                return None
            if outcome.reply is not None:
                result = '{"tp_envelope":' + outcome.reply.raw.decode("utf-8") + "}"
            else:
                result = json.dumps(outcome.body(), separators=(",", ":"))
            return '{"jsonrpc":"2.0","id":' + json.dumps(rid) + ',"result":' + result + "}"

        if isinstance(doc, list):
            if not doc:
                return Response(_rpc_error(None, -32600, InvalidRequest("empty batch")), media_type="application/json")
            answers = [await one(item, text[a:b]) for item, (a, b) in zip(doc, spans, strict=True)]
            out = [a for a in answers if a is not None]
            if not out:
                return Response(status_code=204)
            return Response("[" + ",".join(out) + "]", media_type="application/json")
        answer = await one(doc, text)
        if answer is None:
            return Response(status_code=204)
        return Response(answer, media_type="application/json")

    return router


def tp_websocket_router(services: Services, auth: Identities) -> APIRouter:
    """TP over its native WebSocket (``/tp/v1``, subprotocol ``tp.v1``, §9.2): envelopes both ways, subscriptions."""
    router = APIRouter()
    tp = services.tp
    settings = services.settings
    cap = settings.tp_max_envelope_size

    # -- native WebSocket ---------------------------------------------------------------------------------------------

    @router.websocket("/tp/v1")
    async def tp_websocket(ws: WebSocket) -> None:
        if WEBSOCKET_SUBPROTOCOL not in ws.scope.get("subprotocols", []):
            exc: TransferError = InvalidRequest(f"use the WebSocket subprotocol {WEBSOCKET_SUBPROTOCOL}")
            await ws.send_denial_response(tp_error_response(exc))
            return
        try:
            authorize = await auth.grant(ws.headers.get("authorization"))
            owner = authorize.owner or ""  # without keys, every caller counts as one key
            tp.ledger.connect(owner)  # connections per key and per process (transfer.service.agents.subscriptions)
        except TransferError as exc:
            await ws.send_denial_response(tp_error_response(exc))
            return
        try:
            await _serve_websocket(ws, authorize, owner)
        finally:
            tp.ledger.disconnect(owner)

    async def _serve_websocket(ws: WebSocket, authorize: Grant, owner: str) -> None:
        await ws.accept(subprotocol=WEBSOCKET_SUBPROTOCOL)
        base = settings.public_url or str(ws.base_url).rstrip("/").replace("ws", "http", 1)
        outbox = Outbox(max(OUTBOX_BYTES, 2 * cap))
        tasks: set[asyncio.Task[None]] = set()
        topics: set[str] = set()

        def spawn(coro: Any) -> None:
            task = asyncio.create_task(coro)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        def deliver(raw: bytes) -> None:
            """Every topic of this connection delivers here: a full outbox loses its oldest envelopes, as a
            subscriber's queue did (a connection that does not read loses notifies, not the service memory)."""
            outbox.drop_in(raw.decode("utf-8"))

        # What one connection may accumulate is bounded: the resource ids it follows (each a relay topic and a job
        # topic, and a follower task for a job) and the sender inboxes it hears; past the bound it is closed with
        # 1008 and a TPError naming the limit, not grown (60,000 ids once took 480 MiB). Across connections the
        # key's and the process's subscriptions are bounded too (tp.ledger).
        max_topics = 2 * settings.tp_max_subscriptions + MAX_INBOXES
        followed: set[str] = set()

        def listen(topic: str) -> None:
            if topic not in topics:
                if len(topics) >= max_topics:
                    raise TooManySubscriptions(f"one connection follows at most {settings.tp_max_subscriptions} ids")
                tp.ledger.subscribe(owner)
                topics.add(topic)
                tp.listen(topic, deliver)

        def follow_once(rid: str, receiver: Any) -> None:
            if rid not in followed:  # one follower per job, however often it is named
                if len(followed) >= settings.tp_max_subscriptions:
                    raise TooManySubscriptions(f"one connection follows at most {settings.tp_max_subscriptions} ids")
                followed.add(rid)
                spawn(follow(rid, receiver))

        async def follow(rid: str, receiver: Any) -> None:
            try:
                job = await services.job(rid, base, authorize)
            except TransferError:
                return  # not a job here (a stored file, say): relayed notifies only
            async for event in job.follow(heartbeat=None):
                if event is not None:
                    note = job_notice(
                        event, rid, settings.tp_identity, receiver, Binding.NATIVE_TP, services.files.clock()
                    )
                    await outbox.put(note.raw.decode("utf-8"))

        def error_frame(exc: TransferError, related: str | None, receiver: Any) -> str:
            note = make_envelope(
                "error",
                {"error": tp_error(exc, related)},
                sender=settings.tp_identity,
                receiver=receiver,
                binding=Binding.NATIVE_TP,
                timestamp=services.files.clock(),
                in_reply_to=related,
            )
            return note.raw.decode("utf-8")

        async def send_all() -> None:
            while True:
                await ws.send_text(await outbox.get())

        spawn(send_all())
        try:
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("text") is None:
                    reason = json.dumps(tp_error(InvalidEnvelope("TP frames are UTF-8 JSON text, not binary")))
                    await ws.close(code=1008, reason=reason[:120])
                    break
                envelope = None
                try:
                    envelope = parse_envelope(message["text"].encode("utf-8"), cap)
                    inbox = tp.inbox_topic(envelope.sender, authorize)
                    if inbox is not None:
                        listen(inbox)  # messages for this sender come here too
                    subscription = await tp.subscription(envelope, authorize)
                    if subscription is not None:
                        for _rid, refusal in subscription.refused:
                            await outbox.put(error_frame(refusal, envelope.message_id, envelope.sender))
                        for topic in subscription.topics:
                            listen(topic)
                        for rid in subscription.follow:
                            follow_once(rid, envelope.sender)
                        ack = make_envelope(
                            "resource_notify",
                            {"status": "subscribed", "subscribe": subscription.subscribed},
                            sender=settings.tp_identity,
                            receiver=envelope.sender,
                            binding=Binding.NATIVE_TP,
                            timestamp=services.files.clock(),
                            in_reply_to=envelope.message_id,
                        )
                        await outbox.put(ack.raw.decode("utf-8"))
                        continue
                    outcome = await tp.handle(envelope, Binding.NATIVE_TP, authorize, base)
                    reply = tp.as_envelope(outcome, envelope, Binding.NATIVE_TP)
                    await outbox.put(reply.raw.decode("utf-8"))
                    job_id = tp.job_of(outcome)
                    if job_id is not None:
                        follow_once(job_id, envelope.sender)
                except TooManySubscriptions as exc:
                    await ws.close(code=1008, reason=close_reason(exc))
                    break
                except TransferError as exc:
                    related = envelope.message_id if envelope is not None else None
                    await outbox.put(error_frame(exc, related, envelope.sender if envelope else None))
        except WebSocketDisconnect:
            pass
        finally:
            # Subscriptions go first and cannot be skipped: they are what publishers hold on to. Then the tasks, from
            # a snapshot: each finished task removes itself from ``tasks`` (done callback) while we wait for it.
            for topic in topics:
                tp.unsubscribe(topic, deliver)
            tp.ledger.unsubscribe(owner, len(topics))
            topics.clear()
            running = list(tasks)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    return router


MAX_INBOXES = 100  # distinct senders whose messages one connection hears


def close_reason(exc: TransferError) -> str:
    """A TPError as a WebSocket close reason: compact JSON within the 123 bytes RFC 6455 §5.5 allows."""
    doc = {"code": exc.code, "message": exc.message, "retryable": exc.retryable}
    while len(reason := json.dumps(doc, separators=(",", ":"))) > 123:
        message = str(doc["message"])
        doc["message"] = message[: max(0, len(message) - (len(reason) - 123) - 3)] + "..."
    return reason


def _matches(pattern: str, path: str) -> bool:
    a, b = pattern.split("/"), path.split("/")
    return len(a) == len(b) and all(x == y or x == "{id}" for x, y in zip(a, b, strict=True))


def _rpc_error(rid: Any, code: int, exc: TransferError) -> str:
    messages = {
        -32700: "Parse error",
        -32600: "Invalid Request",
        -32601: "Method not found",
        -32602: "Invalid params",
        -32000: "Server error",
        RpcCode.UNAUTHENTICATED: "Unauthenticated",
    }
    error = {"code": code, "message": f"{messages.get(code, 'Error')}: {exc.message}", "data": tp_error(exc)}
    return json.dumps({"jsonrpc": "2.0", "id": rid, "error": error}, separators=(",", ":"))
