"""What an MCP client (and the LLM behind it) reads about the tools: descriptions, annotations, and the schemas of
inputs and results.

Descriptions are plain sentences for a model to read, with sizes from the running settings ("4 MiB"), never a
setting's name. Annotations follow the MCP specification's ``ToolAnnotations`` (readOnlyHint, destructiveHint,
idempotentHint, openWorldHint). Result models describe exactly the JSON the tools return (the SDK checks each
result against them); the descriptor a caller hands to ``resolve`` is a JSON object with a short schema naming its
required fields, validated by our own loader (:func:`transfer.core.model.content.load_descriptor`) rather than by the
expanded union of every content model, which was 7.8 KB of schema for one argument.
"""

from __future__ import annotations

from typing import Any, Literal

from mcp_types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

from transfer.core.model.content import BundleItemRole, ContentEncoding, DownloadMethod, FileRole, TransferMode


def size_text(n: int) -> str:
    """A byte count as a person writes it: ``4 MiB``, ``1 MiB``, ``256 KiB``, ``1000 bytes``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


# -- the descriptor argument of resolve ---------------------------------------------------------------------------

DESCRIPTOR_INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The descriptor exactly as a tool or another agent gave it: a Synapse FileContent (type, "
    "content_type, name, and data, url or streaming_session_id) or a ContentBundle (id, items, created_at).",
    "properties": {
        "type": {"enum": [m.value for m in TransferMode]},
        "content_type": {"type": "string"},
        "name": {"type": "string"},
        "size": {"type": "integer", "minimum": 0},
        "checksum": {"type": "string", "description": "sha256:<64 hex digits>"},
        "data": {"type": "string"},
        "url": {"type": "string"},
        "streaming_session_id": {"type": "string"},
        "id": {"type": "string"},
        "items": {"type": "array", "items": {"type": "object"}},
        "created_at": {"type": "string"},
    },
    "anyOf": [{"required": ["type", "content_type"]}, {"required": ["id", "items", "created_at"]}],
}


# -- results --------------------------------------------------------------------------------------------------------


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Descriptor(_Result):
    """A Synapse FileContent: inline (base64 data), url (a signed URL with ranges) or streaming (chunks)."""

    type: Literal[TransferMode.INLINE, TransferMode.URL, TransferMode.STREAMING]
    content_type: str
    name: str
    encoding: ContentEncoding | None = None
    size: int | None = Field(default=None, description="bytes of the original content")
    encoded_size: int | None = None
    checksum: str | None = Field(default=None, description="sha256:<hex> of the original bytes")
    metadata: dict[str, Any] | None = None
    role: FileRole | None = None
    description: str | None = None
    data: str | None = None
    url: str | None = None
    url_expires_at: str | None = None
    download_method: DownloadMethod | None = None
    range_supported: bool | None = None
    streaming_session_id: str | None = None
    total_chunks: int | None = None
    chunk_size: int | None = None
    width: int | None = None
    height: int | None = None
    duration: float | None = None
    resolution: str | None = None
    thumbnail_url: str | None = None


class FileList(_Result):
    """A page of stored files in file-id order; next_cursor fetches the next page (null: the last one)."""

    files: list[Descriptor]
    next_cursor: str | None = None


class HttpRequestPlan(_Result):
    """How to transfer the bytes outside MCP: one HTTP request to an expiring URL (SEP-2631 style)."""

    url: str
    method: Literal["PUT", "GET"]
    headers: dict[str, str]
    expires_at: str = Field(description="RFC 3339: the request must start before this")


class UploadAuthorization(_Result):
    """Where to PUT a file (its bytes never travel in MCP), the size limit, and until when to confirm it."""

    authorization_id: str
    upload: HttpRequestPlan
    max_size: int = Field(description="largest body the URL accepts, in bytes")
    size: int | None = Field(default=None, description="the exact body length the URL takes, when one was given")
    expires_at: str = Field(description="RFC 3339: confirm_upload answers until then")
    direct: bool = Field(description="the URL is the storage bucket's own: confirm_upload verifies and publishes")
    complete: bool = Field(
        default=False,
        description="this key stores the declared content already: the file is published, no PUT is needed "
        "(confirm_upload answers its descriptor)",
    )


class DownloadAuthorization(_Result):
    """An expiring URL to GET a stored file, with the size and SHA-256 to check what arrives."""

    download: HttpRequestPlan
    size: int
    checksum: str = Field(description="sha256:<hex> of the bytes the URL serves")
    content_type: str
    name: str


class SessionUrls(_Result):
    chunk: str
    status: str
    complete: str
    events: str


class _SessionFacts(_Result):
    """What every session result says about the session."""

    streaming_session_id: str
    state: str
    name: str
    size: int | None
    chunk_size: int
    total_chunks: int | None
    expires_at: str


class OpenedSession(_SessionFacts):
    """A chunked upload session: its id, where to send chunks, and (size known) its streaming descriptor."""

    urls: SessionUrls
    descriptor: Descriptor | None = None


class ChunkReceipt(_Result):
    index: int
    size: int
    xxh3: str = Field(description="xxh3-128 of the stored chunk")
    duplicate: bool = Field(description="true when these bytes were already stored")


class SessionStatus(_SessionFacts):
    """Stored and missing chunks as inclusive [first, last] index ranges."""

    stored: list[list[int]]
    stored_count: int
    bytes_received: int | None
    checksum: str | None
    missing: list[list[int]] | None = None
    file_id: str | None = None


class Resolved(_Result):
    """A written file (path, size, checksum), small content (content, content_encoding, size) or a bundle's files."""

    path: str | None = None
    size: int | None = None
    checksum: str | None = None
    content: str | None = None
    content_encoding: Literal["utf-8", "base64"] | None = None
    directory: str | None = None
    files: list[str] | None = None


class BundleContent(BaseModel):
    """A FileContent, TextContent, JSONContent or CodeContent."""

    model_config = ConfigDict(extra="allow")

    type: TransferMode
    content_type: str


class BundleItem(_Result):
    id: str
    role: BundleItemRole
    content: BundleContent


class Bundle(_Result):
    """A Synapse ContentBundle."""

    id: str
    name: str | None = None
    description: str | None = None
    items: list[BundleItem]
    total_size: int | None = None
    created_at: str


class Envelope(BaseModel):
    """A TP MessageEnvelope (other fields a sender added are kept)."""

    model_config = ConfigDict(extra="allow")

    tp_version: str
    message_id: str
    message_type: str
    payload: dict[str, Any]


class TpAnswer(_Result):
    """The reply envelope, or (a message accepted for delivery) only its correlation_id."""

    tp_version: str | None = None
    message_id: str | None = None
    message_type: str | None = None
    timestamp: str | None = None
    sender: str | dict[str, Any] | None = None
    receiver: str | dict[str, Any] | None = None
    protocol_contract_ref: str | None = None
    in_reply_to: str | None = None
    payload: dict[str, Any] | None = None
    trace_info: dict[str, Any] | None = None
    correlation_id: str | None = None


class Messages(_Result):
    messages: list[Envelope]


# -- descriptions and annotations -----------------------------------------------------------------------------------


def _hints(
    *, read_only: bool = False, destructive: bool = False, idempotent: bool = False, open_world: bool = False
) -> ToolAnnotations:
    return ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


def tool_texts(*, inline: int, message: int, file_tools: bool) -> dict[str, tuple[str, ToolAnnotations]]:
    """Each tool's description and annotations, with this server's sizes (``inline``: the inline threshold;
    ``message``: the most one MCP message may carry). ``file_tools``: whether tools may read and write local paths
    (on stdio, or over HTTP with an allowed directory)."""
    inline_text, message_text = size_text(inline), size_text(message)
    resolve = (
        "Download a descriptor's content, verify its SHA-256 and size, and decode it. With path, write it there (a "
        "directory for a bundle), never replacing an existing file unless overwrite is true. Without path, content "
        f"up to {inline_text} comes back in the result: text as text, other bytes as base64."
        if file_tools
        else "Download a descriptor's content, verify its SHA-256 and size, and return it decoded: text as text, "
        f"other bytes as base64. Only content up to {inline_text} can be returned; this endpoint writes no files."
    )
    return {
        "upload_file": (
            "Upload a local file (path relative to the allowed directory). Returns its Synapse FileContent "
            f"descriptor: inline up to {inline_text}, otherwise a signed URL other agents can download.",
            _hints(),
        ),
        "upload_content": (
            f"Store content given in the call (text, or base64 bytes; at most {message_text}). Returns its "
            "FileContent descriptor. For larger content use upload_file or a chunked session.",
            _hints(),
        ),
        "open_session": (
            "Open a resumable chunked upload: send chunks with send_chunk (any order), then complete_session. "
            "Returns the session id and chunk size and, when the size is given, a streaming descriptor that "
            "other agents can follow while chunks arrive.",
            _hints(),
        ),
        "send_chunk": (
            f"Store one chunk of an open session (base64, at most {message_text}). Sending the same bytes for the "
            "same index again changes nothing; different bytes for a stored index are refused.",
            _hints(idempotent=True),
        ),
        "complete_session": (
            "Verify a session's chunks (size, SHA-256 when declared) and publish the content. Returns its url "
            "descriptor.",
            _hints(idempotent=True),
        ),
        "session_status": (
            "A session's state: which chunks are stored and which are missing, bytes received, expiry.",
            _hints(read_only=True, idempotent=True),
        ),
        "describe": (
            "A fresh FileContent descriptor (with a new signed URL) for a stored file, by its f_ id.",
            _hints(read_only=True, idempotent=True),
        ),
        "list_files": (
            "A page of stored files (your key's; all for an admin key) as url descriptors, in file-id order. "
            "Pass next_cursor back as cursor for the next page; it is null after the last page.",
            _hints(read_only=True, idempotent=True),
        ),
        "resolve": (
            resolve,
            _hints(read_only=not file_tools, destructive=file_tools, idempotent=True, open_world=True),
        ),
        "create_bundle": (
            "Group stored files (by f_ id) and inline text, JSON or code into a Synapse ContentBundle.",
            _hints(),
        ),
        "authorize_upload": (
            "Get a place to put a file without sending its bytes through MCP: an expiring signed URL, the method "
            "(PUT) and header fields to use, and the size limit. Upload with any HTTP client before upload.expires_at;"
            " then call confirm_upload for the file's descriptor (with its SHA-256). When direct is true the URL is "
            "the storage bucket's own and confirm_upload is what verifies and publishes the file. Give size (the exact "
            "length) when you know it: the URL then takes exactly that many bytes, sent with that Content-Length.",
            _hints(),
        ),
        "confirm_upload": (
            "The FileContent descriptor (checksum = SHA-256) of the file uploaded to an authorize_upload URL; an "
            "error with code conflict while nothing was uploaded yet.",
            _hints(read_only=True, idempotent=True),
        ),
        "authorize_download": (
            "Get an expiring URL to fetch a stored file (by its f_ id) with any HTTP client, with its size and "
            "SHA-256 to verify what arrives: the bytes never travel through MCP.",
            _hints(read_only=True),
        ),
        "tp_poll_messages": (
            "TP messages waiting for a receiver, oldest first. Each message is delivered once.",
            _hints(),
        ),
        "tp_resource_mount": (
            "Send a TP resource_mount envelope: offer a stored file (payload.resource_id), a FileContent "
            "(payload.resource) or a new chunked upload (payload.upload). Returns the reply envelope with the "
            "descriptor, or a correlation_id when a remote URL is being imported.",
            _hints(open_world=True),
        ),
        "tp_resource_unmount": (
            "Send a TP resource_unmount envelope: DELETES the file payload.resource_id (every URL to it stops "
            "working) or aborts that upload session. Returns the reply envelope.",
            _hints(destructive=True, idempotent=True),
        ),
        "tp_resource_notify": (
            "Send a TP resource_notify envelope: delivered to its receiver (tp_poll_messages) and to WebSocket "
            "subscribers. Returns its correlation_id.",
            _hints(),
        ),
    }


# -- schemas for strict clients -----------------------------------------------------------------------------------


def inline_enum_refs(schema: dict[str, Any]) -> None:
    """Replace, in place, every ``$ref`` to a plain enum in ``schema``'s ``$defs`` (``FileRole``, ``DownloadMethod``,
    …) with the enum itself, and drop the definitions no longer referred to. Strict tool callers (OpenAI's strict
    function calling, through openai-agents) take a schema without such references; object definitions stay."""
    defs = schema.get("$defs")
    if not isinstance(defs, dict):
        return
    enums = {f"#/$defs/{name}": d for name, d in defs.items() if isinstance(d, dict) and "enum" in d}
    if not enums:
        return

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref in enums:
                siblings = {k: walk(v) for k, v in node.items() if k != "$ref"}
                return {**{k: v for k, v in enums[ref].items() if k != "title"}, **siblings}
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    rewritten = walk({k: v for k, v in schema.items() if k != "$defs"})
    kept = {name: walk(d) for name, d in defs.items() if f"#/$defs/{name}" not in enums}
    schema.clear()
    schema.update(rewritten)
    if kept:
        schema["$defs"] = kept
