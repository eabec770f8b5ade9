"""The A2A protocol as this service speaks it: the Agent Card, the JSON-RPC methods, the shapes of messages and
tasks, and the error codes. Pure: JSON in, JSON out, no I/O.

Two dialects share one endpoint, told apart by the method name (A2A §9, JSON-RPC binding):

    A2A 1.0   SendMessage / GetTask          proto-JSON shapes: Part {raw | url, filename, mediaType},
                                             Task.status.state "TASK_STATE_COMPLETED", role "ROLE_AGENT"
    A2A 0.3   message/send / tasks/get       pydantic shapes: FilePart {kind: "file", file: {bytes | uri, …}},
                                             Task {kind: "task", status.state "completed"}

What the service does with a message: every file part (inline bytes or a URL) becomes a stored file of the
caller's key; the answer is a task, already completed, with one artifact per file whose part is a ``url`` part (a
signed, expiring URL) carrying ``size``, ``sha256`` and the whole Synapse descriptor in its metadata. Text and data
parts are words for agents, not files: they are not stored. The task record outlives the URLs: ``GetTask`` signs
fresh ones.

Errors (A2A §9.5 and JSON-RPC 2.0 §5.1): ``-32001`` task not found, ``-32002`` not cancelable, ``-32003`` push
notifications not supported, ``-32004`` unsupported operation, ``-32007`` no extended card, ``-32009`` version not
supported, ``-32602`` invalid params (the service's 4xx errors), ``-32603`` internal (its 5xx errors). ``data`` is a
list with one ``google.rpc.ErrorInfo`` whose ``metadata`` carries the service's own error code, status and
retryability, all as strings (ErrorInfo metadata is a string map).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import pybase64

from transfer.core.agents.a2a import A2A_KEY, a2a_part_to_file, file_to_a2a_part
from transfer.core.model.content import FileContent, TransferMode, format_timestamp, normalize_checksum
from transfer.errors import (
    AccessDenied,
    Conflict,
    DestinationRefused,
    InsufficientScope,
    InvalidDescriptor,
    InvalidRequest,
    TaskNotFound,
    TransferError,
    Unauthenticated,
    UnsupportedOperation,
)

A2A_PATH = "/a2a"
CARD_PATH = "/.well-known/agent-card.json"  # A2A 1.0 §8.2 (well-known URI, RFC 8615)
LEGACY_CARD_PATH = "/.well-known/agent.json"  # A2A 0.2 and early 0.3 clients
VERSION_HEADER = "a2a-version"
SUPPORTED_VERSIONS = ("1.0", "0.3")
MAX_FILE_PARTS = 64  # file parts in one message: each one is a stored file (and maybe a fetch)
MAX_ID_LENGTH = 256  # client-chosen ids we echo (messageId, contextId)
_URL_SAFE_TO_STANDARD = str.maketrans("-_", "+/")
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
A2A_DOMAIN = "a2a-protocol.org"


class Dialect(enum.StrEnum):
    """The A2A protocol versions this service speaks (method names and part shapes differ between them)."""

    V1_0 = "1.0"
    V0_3 = "0.3"


class Operation(enum.StrEnum):
    """The A2A JSON-RPC operations, whatever their method name in each dialect."""

    SEND = "send"
    GET = "get"
    CANCEL = "cancel"  # every task here is already completed: not cancelable
    STREAM = "stream"  # streaming is not offered (the card says so)
    LIST = "list"
    PUSH = "push"  # push notification configs
    EXTENDED_CARD = "extended_card"


METHODS: dict[str, tuple[Dialect, Operation]] = {
    "SendMessage": (Dialect.V1_0, Operation.SEND),
    "GetTask": (Dialect.V1_0, Operation.GET),
    "CancelTask": (Dialect.V1_0, Operation.CANCEL),
    "SendStreamingMessage": (Dialect.V1_0, Operation.STREAM),
    "SubscribeToTask": (Dialect.V1_0, Operation.STREAM),
    "ListTasks": (Dialect.V1_0, Operation.LIST),
    "CreateTaskPushNotificationConfig": (Dialect.V1_0, Operation.PUSH),
    "GetTaskPushNotificationConfig": (Dialect.V1_0, Operation.PUSH),
    "ListTaskPushNotificationConfigs": (Dialect.V1_0, Operation.PUSH),
    "DeleteTaskPushNotificationConfig": (Dialect.V1_0, Operation.PUSH),
    "GetExtendedAgentCard": (Dialect.V1_0, Operation.EXTENDED_CARD),
    "message/send": (Dialect.V0_3, Operation.SEND),
    "tasks/get": (Dialect.V0_3, Operation.GET),
    "tasks/cancel": (Dialect.V0_3, Operation.CANCEL),
    "message/stream": (Dialect.V0_3, Operation.STREAM),
    "tasks/resubscribe": (Dialect.V0_3, Operation.STREAM),
    "tasks/pushNotificationConfig/set": (Dialect.V0_3, Operation.PUSH),
    "tasks/pushNotificationConfig/get": (Dialect.V0_3, Operation.PUSH),
    "tasks/pushNotificationConfig/list": (Dialect.V0_3, Operation.PUSH),
    "tasks/pushNotificationConfig/delete": (Dialect.V0_3, Operation.PUSH),
    "agent/getAuthenticatedExtendedCard": (Dialect.V0_3, Operation.EXTENDED_CARD),
}


# -- errors ------------------------------------------------------------------------------------------------------


class RpcCode(enum.IntEnum):
    """JSON-RPC 2.0 error codes, with A2A's own in the -32001… range."""

    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603
    TASK_NOT_FOUND = -32001
    TASK_NOT_CANCELABLE = -32002
    PUSH_NOTIFICATION_NOT_SUPPORTED = -32003
    UNSUPPORTED_OPERATION = -32004
    CONTENT_TYPE_NOT_SUPPORTED = -32005
    EXTENDED_AGENT_CARD_NOT_CONFIGURED = -32007
    VERSION_NOT_SUPPORTED = -32009
    # this service's own, in JSON-RPC's implementation-defined range and clear of A2A's -32001…-32009
    UNAUTHENTICATED = -32040
    FORBIDDEN = -32041


def rpc_code_of(exc: TransferError) -> RpcCode:
    """The JSON-RPC error code that tells an A2A client what happened (most specific first)."""
    if isinstance(exc, UnsupportedOperation):
        reason = str(exc.detail.get("reason"))
        return RpcCode[reason] if reason in RpcCode.__members__ else RpcCode.UNSUPPORTED_OPERATION
    if isinstance(exc, TaskNotFound):
        return RpcCode.TASK_NOT_FOUND
    if isinstance(exc, Unauthenticated):
        return RpcCode.UNAUTHENTICATED
    if isinstance(exc, InsufficientScope):
        return RpcCode.FORBIDDEN
    if isinstance(exc, DestinationRefused):  # a part's URL the service will not fetch: the client's to change
        return RpcCode.INVALID_PARAMS
    if isinstance(exc, AccessDenied):
        return RpcCode.FORBIDDEN
    if isinstance(exc, Conflict) and exc.status < 500:  # a record busy past its retries (503) is the server's
        return RpcCode.UNSUPPORTED_OPERATION
    return RpcCode.INVALID_PARAMS if exc.status < 500 else RpcCode.INTERNAL_ERROR


def rpc_error(rid: Any, exc: TransferError, code: RpcCode | None = None) -> dict[str, Any]:
    """A JSON-RPC 2.0 error response (§5.1) for ``exc``; ``data`` carries the service's error as an ErrorInfo."""
    code = code if code is not None else rpc_code_of(exc)
    metadata = {"code": exc.code, "status": str(exc.status), "retryable": "true" if exc.retryable else "false"}
    for key, value in exc.detail.items():
        metadata.setdefault(str(key), value if isinstance(value, str) else json.dumps(value, separators=(",", ":")))
    info = {"@type": ERROR_INFO_TYPE, "reason": code.name, "domain": A2A_DOMAIN, "metadata": metadata}
    error = {"code": int(code), "message": exc.message, "data": [info]}
    return {"jsonrpc": "2.0", "id": rid, "error": error}


def unsupported(operation: Operation, method: str) -> UnsupportedOperation:
    """The A2A answer to a method the card does not offer."""
    if operation is Operation.CANCEL:
        message = "tasks here complete while the message is answered; none can be canceled"
        return UnsupportedOperation(message, reason=RpcCode.TASK_NOT_CANCELABLE.name)
    if operation is Operation.PUSH:
        message = "push notifications are not supported"
        return UnsupportedOperation(message, reason=RpcCode.PUSH_NOTIFICATION_NOT_SUPPORTED.name)
    if operation is Operation.EXTENDED_CARD:
        message = "there is no extended card: the public card is all there is"
        return UnsupportedOperation(message, reason=RpcCode.EXTENDED_AGENT_CARD_NOT_CONFIGURED.name)
    what = "streaming" if operation is Operation.STREAM else "listing tasks"
    message = f"{method}: {what} is not supported; see the Agent Card"
    return UnsupportedOperation(message, reason=RpcCode.UNSUPPORTED_OPERATION.name)


def check_version(header: str | None) -> None:
    """The ``A2A-Version`` request header, when sent, must name a version served here (major.minor)."""
    if header is None or not header.strip():
        return
    parts = header.strip().split(".")
    if ".".join(parts[:2]) not in SUPPORTED_VERSIONS:
        raise UnsupportedOperation(
            f"A2A-Version {header.strip()[:20]!r} is not supported; "
            f"this service speaks {', '.join(SUPPORTED_VERSIONS)}",
            reason=RpcCode.VERSION_NOT_SUPPORTED.name,
        )


# -- the Agent Card ------------------------------------------------------------------------------------------------


def agent_card(
    base_url: str, *, version: str, auth_enabled: bool, max_json_body: int, tp_identity: str
) -> dict[str, Any]:
    """The public Agent Card (A2A 1.0 §8): where to call, what is offered, how to authenticate, and the limit on
    inline bytes (they travel inside the JSON-RPC body, which ``max_json_body`` caps)."""
    inline_limit = max_json_body * 3 // 4 - 4096  # base64 grows bytes by 4/3; the rest of the message needs room
    endpoint = base_url + A2A_PATH
    description = (
        "Stores files for agents and hands back signed URLs. Send a message with file parts: inline bytes "
        f"(raw / file.bytes) up to about {inline_limit} bytes, because the whole JSON-RPC request is capped at "
        f"{max_json_body} bytes (TRANSFER_MAX_JSON_BODY); anything larger as a url / file.uri part, which the "
        "service fetches itself (public http(s) addresses only). The answer is a completed task with one artifact "
        "per file: a url part (signed, expiring) with size and sha256 in its metadata. GetTask / tasks/get returns "
        "the task again with fresh URLs, to the key that created it only."
    )
    card: dict[str, Any] = {
        "name": "Agent large-content transfer service",
        "description": description,
        "version": version,
        "supportedInterfaces": [
            {"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": endpoint, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "documentationUrl": base_url + "/docs",
        "capabilities": {
            "streaming": False,
            "pushNotifications": False,
            "extendedAgentCard": False,
            "extensions": [
                {
                    "uri": "urn:synapse:file-descriptor",
                    "description": "file parts carry the Synapse FileContent descriptor in metadata.synapse; "
                    "TP resource_mount / unmount / notify are served as tp.resource.* methods on the same endpoint",
                    "required": False,
                    "params": {"tp_identity": tp_identity, "max_inline_bytes": inline_limit},
                }
            ],
        },
        "defaultInputModes": ["*/*"],
        "defaultOutputModes": ["*/*"],
        "skills": [
            {
                "id": "store-files",
                "name": "Store files and share them by URL",
                "description": "Every file part of the message is stored (checksum and size verified when its "
                "metadata.synapse declares them) and returned as a signed URL with its size and SHA-256.",
                "tags": ["files", "storage", "transfer", "signed-url"],
                "examples": ["Store this dataset and give me a link another agent can download."],
                "inputModes": ["*/*"],
                "outputModes": ["*/*"],
            }
        ],
    }
    if auth_enabled:
        card["securitySchemes"] = {
            "bearer": {
                "httpAuthSecurityScheme": {
                    "scheme": "Bearer",
                    "description": "an API key of this service (transfer keys new): Authorization: Bearer <key>",
                }
            }
        }
        card["securityRequirements"] = [{"schemes": {"bearer": {"list": []}}}]
    return card


# -- messages in ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InlinePart:
    """A file sent as bytes inside the message (base64 text, not yet decoded)."""

    data: str
    name: str | None
    media_type: str | None
    checksum: str | None  # declared in metadata.synapse: verified when stored
    size: int | None


@dataclass(frozen=True, slots=True)
class UrlPart:
    """A file sent by URL: a url-mode descriptor for the import path."""

    descriptor: FileContent


FilePart = InlinePart | UrlPart


@dataclass(frozen=True, slots=True)
class IncomingMessage:
    """An A2A message as this service reads it: its ids and the file parts it carries."""

    message_id: str
    context_id: str | None
    task_id: str | None
    parts: tuple[FilePart, ...]


def _field(obj: dict[str, Any], *names: str) -> Any:
    """A member by its proto-JSON name or its original (snake_case) name: parsers accept both (proto3 JSON)."""
    for name in names:
        if name in obj:
            return obj[name]
    return None


def _optional_id(obj: dict[str, Any], *names: str) -> str | None:
    value = _field(obj, *names)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_ID_LENGTH:
        raise InvalidRequest(f"message.{names[0]} must be a string of at most {MAX_ID_LENGTH} characters")
    return value


def parse_message(params: Any) -> IncomingMessage:
    """The file parts of ``SendMessage`` / ``message/send`` params (either dialect's part shapes); InvalidRequest
    when the message has none, or a part is malformed."""
    if not isinstance(params, dict) or not isinstance(params.get("message"), dict):
        raise InvalidRequest("params must be an object with a message")
    message = params["message"]
    message_id = _optional_id(message, "messageId", "message_id")
    if message_id is None:
        raise InvalidRequest("message.messageId is required")
    parts = message.get("parts", [])  # proto3 JSON leaves an empty list out
    if not isinstance(parts, list):
        raise InvalidRequest("message.parts must be a list")
    files: list[FilePart] = []
    for n, part in enumerate(parts):
        if not isinstance(part, dict):
            raise InvalidRequest(f"message.parts[{n}] must be an object")
        parsed = _file_part(part, n)
        if parsed is not None:
            files.append(parsed)
            if len(files) > MAX_FILE_PARTS:
                raise InvalidRequest(f"a message carries at most {MAX_FILE_PARTS} file parts", limit=MAX_FILE_PARTS)
    if not files:
        raise InvalidRequest("the message has no file part: send raw bytes or a url (A2A 0.3: file.bytes, file.uri)")
    return IncomingMessage(
        message_id=message_id,
        context_id=_optional_id(message, "contextId", "context_id"),
        task_id=_optional_id(message, "taskId", "task_id"),
        parts=tuple(files),
    )


def _file_part(part: dict[str, Any], n: int) -> FilePart | None:
    if isinstance(part.get("file"), dict):  # 0.3 FilePart
        file = part["file"]
        data, url = file.get("bytes"), file.get("uri")
        name, media = file.get("name"), file.get("mimeType")
    elif "raw" in part or "url" in part:  # 1.0 Part
        data, url = part.get("raw"), part.get("url")
        name, media = part.get("filename"), _field(part, "mediaType", "media_type")
    elif part.get("kind") == "file":
        raise InvalidRequest(f"message.parts[{n}]: a file part needs file.bytes or file.uri")
    else:
        return None  # text or data: not a file
    if (data is None) == (url is None):
        raise InvalidRequest(f"message.parts[{n}] carries exactly one of inline bytes or a URL")
    for field, value in (("name", name), ("media type", media)):
        if value is not None and not isinstance(value, str):
            raise InvalidRequest(f"message.parts[{n}]: the {field} must be a string")
    metadata: dict[str, Any] = part["metadata"] if isinstance(part.get("metadata"), dict) else {}
    carried = metadata[A2A_KEY] if isinstance(metadata.get(A2A_KEY), dict) else None
    if data is not None:
        if not isinstance(data, str):
            raise InvalidRequest(f"message.parts[{n}]: inline bytes are a base64 string")
        checksum, size = _declared(carried, n)
        return InlinePart(data, name or None, media or None, checksum, size)
    if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
        raise InvalidRequest(f"message.parts[{n}]: the URL must be http or https")
    try:
        descriptor = a2a_part_to_file(part)
    except InvalidDescriptor as exc:
        raise InvalidDescriptor(f"message.parts[{n}]: {exc.message}") from None
    if descriptor.type is not TransferMode.URL:
        raise InvalidRequest(f"message.parts[{n}]: a URL part must describe url-mode content")
    return UrlPart(descriptor)


def _declared(carried: dict[str, Any] | None, n: int) -> tuple[str | None, int | None]:
    """Checksum and size that our own descriptor (metadata.synapse) declares for inline bytes: verified on store."""
    if carried is None:
        return None, None
    checksum, size = carried.get("checksum"), carried.get("size")
    try:
        checksum = normalize_checksum(checksum) if isinstance(checksum, str) else None
    except ValueError as exc:
        raise InvalidRequest(f"message.parts[{n}]: metadata.synapse.checksum: {exc}") from None
    if size is not None and not (isinstance(size, int) and not isinstance(size, bool) and size >= 0):
        raise InvalidRequest(f"message.parts[{n}]: metadata.synapse.size must be a non-negative integer")
    return checksum, size


def decode_inline(data: str) -> bytes:
    """Inline bytes as proto3 JSON writes them: standard or URL-safe base64, padded or not; InvalidRequest
    otherwise. CPU work on large parts: call it off the event loop."""
    text = data.strip()
    if len(text) % 4 == 1:
        raise InvalidRequest("inline bytes are not base64 (bad length)")
    text += "=" * (-len(text) % 4)
    if "-" in text or "_" in text:  # the URL-safe alphabet (RFC 4648 §5)
        text = text.translate(_URL_SAFE_TO_STANDARD)
    try:
        return pybase64.b64decode(text, validate=True)
    except ValueError:
        raise InvalidRequest("inline bytes are not base64") from None


def get_task_id(params: Any) -> str:
    """The task id of ``GetTask`` / ``tasks/get`` params."""
    if not isinstance(params, dict) or not isinstance(params.get("id"), str) or not params["id"]:
        raise InvalidRequest("params.id (the task id) is required")
    if len(params["id"]) > MAX_ID_LENGTH:
        raise TaskNotFound(f"no task {params['id'][:40]!r}…")
    return str(params["id"])


# -- tasks out -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskView:
    """A completed task as this service keeps it: the stored files, described afresh (signed URLs)."""

    id: str
    context_id: str
    created_at: datetime
    files: tuple[FileContent, ...]
    missing: int = 0  # files of the task deleted since


def artifact_part(descriptor: FileContent, dialect: Dialect) -> dict[str, Any]:
    """A stored file as a ``url`` file part: the signed URL, with size and SHA-256 beside the whole descriptor."""
    version: Literal["1.0", "0.3"] = "1.0" if dialect is Dialect.V1_0 else "0.3"
    part = file_to_a2a_part(descriptor, version)
    part["metadata"]["size"] = descriptor.size
    part["metadata"]["sha256"] = (descriptor.checksum or "").removeprefix("sha256:")
    return part


def summary(task: TaskView) -> str:
    """What an agent reading the task's status message needs to know, in one paragraph."""
    lines = [f"Stored {len(task.files)} file{'s' if len(task.files) != 1 else ''}."]
    for d in task.files:
        lines.append(
            f"{d.name}: {d.size} bytes, {d.checksum}, URL valid until {format_timestamp(d.url_expires_at)}."
            if d.url_expires_at
            else f"{d.name}: {d.size} bytes, {d.checksum}."
        )
    if task.missing:
        lines.append(f"{task.missing} file(s) of this task have been deleted since.")
    lines.append("Ask for the task again (GetTask) for fresh URLs.")
    return " ".join(lines)


def render_task(task: TaskView, dialect: Dialect) -> dict[str, Any]:
    """The task as the dialect's ``Task`` JSON: completed, one artifact per stored file."""
    stamp = format_timestamp(task.created_at)
    artifacts = []
    for d in task.files:
        artifact: dict[str, Any] = {
            "artifactId": str((d.metadata or {}).get("file_id") or d.name),
            "name": d.name,
            "parts": [artifact_part(d, dialect)],
        }
        artifacts.append(artifact)
    text = summary(task)
    if dialect is Dialect.V1_0:
        status_message = {
            "messageId": f"{task.id}-status",
            "contextId": task.context_id,
            "taskId": task.id,
            "role": "ROLE_AGENT",
            "parts": [{"text": text}],
        }
        return {
            "id": task.id,
            "contextId": task.context_id,
            "status": {"state": "TASK_STATE_COMPLETED", "timestamp": stamp, "message": status_message},
            "artifacts": artifacts,
        }
    status_message = {
        "kind": "message",
        "messageId": f"{task.id}-status",
        "contextId": task.context_id,
        "taskId": task.id,
        "role": "agent",
        "parts": [{"kind": "text", "text": text}],
    }
    return {
        "kind": "task",
        "id": task.id,
        "contextId": task.context_id,
        "status": {"state": "completed", "timestamp": stamp, "message": status_message},
        "artifacts": artifacts,
    }


def send_result(task: TaskView, dialect: Dialect) -> dict[str, Any]:
    """The ``result`` of a send: A2A 1.0 wraps the task (``SendMessageResponse.task``); 0.3 returns it bare."""
    rendered = render_task(task, dialect)
    return {"task": rendered} if dialect is Dialect.V1_0 else rendered
