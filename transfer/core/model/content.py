"""The Synapse content model (seed 000): the data model of the service, with the seed's exact JSON names.

Serialisation follows the Go definitions' ``omitempty``: absent optional fields are left out, so a document parsed
from JSON serialises back to the same JSON (:meth:`ContentBase.to_json`). Validation is what a receiver relies on:

* ``inline``   requires ``data`` (for files: base64, decoded length at most the inline threshold);
* ``url``      requires ``url`` (absolute http/https);
* ``streaming`` requires ``streaming_session_id``, ``total_chunks`` and ``chunk_size``, and when the size is known,
  ``total_chunks == ceil(encoded_size or size / chunk_size)``;
* ``checksum`` is ``sha256:<64 lowercase hex>`` (bare hex and upper case are accepted and normalised);
* roles come from the seed's enumerations; a bundle's ``total_size`` equals the sum of its items' ``size``.

The inline threshold defaults to 1 MiB; pass ``context={"inline_threshold": n}`` to ``model_validate`` to change it.
"""

from __future__ import annotations

import enum
import functools
import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Self

import httpx
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from transfer.core.jsontext import parse_json
from transfer.core.model.mime import validate_media_type
from transfer.errors import InvalidDescriptor

INLINE_THRESHOLD: Final = 1 << 20  # 1 MiB (1,048,576 bytes), seed 000 §1.1

_CHECKSUM_RE = re.compile(r"^(?:sha256:)?([0-9a-fA-F]{64})$")
_BASE64_RE = re.compile(r"^[A-Za-z0-9+/\-_]*={0,2}$")


class TransferMode(enum.StrEnum):
    """How a FileContent's bytes travel (seed 000): inline, a signed URL, a streaming session, or multipart."""

    INLINE = "inline"
    URL = "url"
    STREAMING = "streaming"
    MULTIPART = "multipart"


class ContentEncoding(enum.StrEnum):
    """The encoding of a content object's bytes as it travels: none, base64 (inline), or a compression codec."""

    NONE = "none"
    BASE64 = "base64"
    GZIP = "gzip"
    DEFLATE = "deflate"  # zlib-wrapped (RFC 9110 §8.4.1.2); decoders also accept raw deflate
    ZSTD = "zstd"  # our extension beyond the seed (RFC 8878, window limited per RFC 9659)


class FileRole(enum.StrEnum):
    """Why a file is attached to a message (seed 000): referenced, a result, or an attachment."""

    REFERENCE = "reference"
    RESULT = "result"
    ATTACHMENT = "attachment"


class BundleItemRole(enum.StrEnum):
    """What an item is to its ContentBundle (seed 000 §3.5)."""

    MAIN = "main"
    REFERENCE = "reference"
    ATTACHMENT = "attachment"
    THUMBNAIL = "thumbnail"


class DownloadMethod(enum.StrEnum):
    """How a descriptor's url is fetched (seed 000): GET, POST, or a signed URL."""

    GET = "GET"
    POST = "POST"
    SIGNED_URL = "signed_url"


def normalize_checksum(value: str) -> str:
    """``sha256:<64 lowercase hex>`` from either that form or bare hex; ValueError otherwise."""
    m = _CHECKSUM_RE.match(value.strip())
    if not m:
        raise ValueError("checksum must be 'sha256:' followed by 64 hex digits")
    return "sha256:" + m.group(1).lower()


def checksum_hex(checksum: str) -> str:
    """The 64 lowercase hex digits of a checksum in either accepted form."""
    return normalize_checksum(checksum)[len("sha256:") :]


def base64_decoded_length(data: str) -> int:
    """Exact decoded length of a padded or unpadded base64 string, without decoding it."""
    n = len(data.rstrip("="))
    return n * 3 // 4


def format_timestamp(value: datetime) -> str:
    """RFC 3339 UTC, ``Z`` suffix, no fractional part unless there is one."""
    return value.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_enum_values=False,
    )

    def to_json(self) -> dict[str, Any]:
        """The seed's JSON shape: optional fields that are absent are omitted (Go ``omitempty``)."""
        return self.model_dump(mode="json", exclude_none=True, by_alias=True)


class ContentBase(_Model):
    """Fields every content type shares (seed 000 §1.2)."""

    type: TransferMode
    content_type: str = Field(min_length=1, max_length=255)
    encoding: ContentEncoding | None = None
    size: int | None = Field(default=None, ge=0)
    encoded_size: int | None = Field(default=None, ge=0)
    checksum: str | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("checksum")
    @classmethod
    def _checksum(cls, v: str | None) -> str | None:
        return None if v is None else normalize_checksum(v)

    @field_validator("content_type")
    @classmethod
    def _content_type(cls, v: str) -> str:
        return validate_media_type(v)


class TextContent(ContentBase):
    """Plain text (seed 000 §3.1)."""

    charset: str = "utf-8"
    language: str | None = None
    data: str


class JSONContent(ContentBase):
    """Structured JSON (seed 000 §3.2). ``schema`` is exposed as ``schema_`` in Python."""

    schema_: str | None = Field(default=None, alias="schema")
    schema_url: str | None = None
    data: Any

    @field_validator("data")
    @classmethod
    def _data_present(cls, v: Any) -> Any:
        if v is None:
            raise ValueError("data must be a JSON value (object, array, string, number or boolean)")
        return v


class CodeContent(ContentBase):
    """Source code (seed 000 §3.3)."""

    language: str = Field(min_length=1)
    version: str | None = None
    dependencies: list[str] | None = None
    data: str


_ORIGIN_RE = re.compile(r"https?://[^/?#]*", re.IGNORECASE)
_ABSOLUTE_URL_RE = re.compile(r"^https?://[^\s/?#]+[^\s]*$", re.IGNORECASE)
_ASCII_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")  # what httpx refuses anywhere in a URL (non-ASCII: quoted)
_URL_MAX = 65536  # httpx's longest URL


def _url_problem(url: str) -> str | None:
    """Why the parser that fetches ``url`` cannot use it (an ambiguous IPv4 form such as http://0177.0.0.1/, a
    bad port), or None."""
    try:
        port = httpx.URL(url).port
    except httpx.InvalidURL as exc:
        return str(exc)
    if port is not None and not 0 < port <= 65535:  # httpx parses any digits; sockets take 16 bits
        return f"port {port} out of range"
    return None


_origin_problem = functools.lru_cache(maxsize=1024)(_url_problem)


class FileContent(ContentBase):
    """A file in inline, url or streaming mode (seed 000 §3.4)."""

    name: str = Field(min_length=1, max_length=1024)
    role: FileRole | None = None
    description: str | None = None
    # inline
    data: str | None = None
    # url
    url: str | None = None
    url_expires_at: AwareDatetime | None = None
    download_method: DownloadMethod | None = None
    range_supported: bool | None = None
    # streaming
    streaming_session_id: str | None = None
    total_chunks: int | None = Field(default=None, ge=0)
    chunk_size: int | None = Field(default=None, gt=0)
    # media metadata
    width: int | None = Field(default=None, ge=0)
    height: int | None = Field(default=None, ge=0)
    duration: float | None = Field(default=None, ge=0)
    resolution: str | None = None
    thumbnail_url: str | None = None

    @field_serializer("url_expires_at")
    def _ser_expiry(self, v: datetime | None) -> str | None:
        return None if v is None else format_timestamp(v)

    @field_validator("url", "thumbnail_url")
    @classmethod
    def _absolute_url(cls, v: str | None) -> str | None:
        if v is not None and not _ABSOLUTE_URL_RE.match(v):
            raise ValueError("must be an absolute http(s) URL")
        if v is not None:
            # parsed here by the parser that fetches it, so a URL it cannot parse (an ambiguous IPv4 form such as
            # http://0177.0.0.1/, a bad port) is an invalid descriptor, not a failure halfway through a fetch
            origin = _ORIGIN_RE.match(v)
            if origin is None or len(v) > _URL_MAX or _ASCII_CONTROL_RE.search(v):
                problem = _url_problem(v)  # the whole URL (httpx's own message for what it refuses)
            else:
                # the rest of the URL is only quoted, never refused: parse its origin, once per origin (httpx's
                # parser runs in Python, character by character: ~100 µs a signed URL, on every descriptor)
                problem = _origin_problem(origin.group(0))
            if problem is not None:
                raise ValueError(f"must be an absolute http(s) URL ({problem})")
        return v

    @model_validator(mode="after")
    def _mode_fields(self, info: ValidationInfo) -> Self:
        threshold = INLINE_THRESHOLD
        if isinstance(info.context, dict) and "inline_threshold" in info.context:
            threshold = int(info.context["inline_threshold"])
        if self.type is TransferMode.INLINE:
            if self.data is None:
                raise ValueError("inline content requires 'data'")
            if not _BASE64_RE.match(self.data):
                raise ValueError("inline file 'data' must be base64")
            if base64_decoded_length(self.data) > threshold:
                raise ValueError(f"inline data exceeds the inline threshold of {threshold} bytes; use url mode")
        elif self.type is TransferMode.URL:
            if not self.url:
                raise ValueError("url mode requires 'url'")
        elif self.type is TransferMode.STREAMING:
            missing = [f for f in ("streaming_session_id", "total_chunks", "chunk_size") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"streaming mode requires {', '.join(missing)}")
            assert self.total_chunks is not None and self.chunk_size is not None
            length = self.encoded_size if self.encoded_size is not None else self.size
            if length is not None:
                expected = math.ceil(length / self.chunk_size)
                if self.total_chunks != expected and not (length == 0 and self.total_chunks == 1):
                    raise ValueError(
                        f"total_chunks {self.total_chunks} inconsistent with {length} bytes in chunks of "
                        f"{self.chunk_size} (expected {expected})"
                    )
        return self


@functools.lru_cache(maxsize=64)
def _timestamp_of(seconds: int) -> str:
    return format_timestamp(datetime.fromtimestamp(seconds, UTC))


def url_descriptor_json(
    *,
    content_type: str,
    encoding: ContentEncoding,
    size: int,
    encoded_size: int | None,
    checksum: str,
    metadata: dict[str, Any],
    name: str,
    role: FileRole | None,
    description: str | None,
    url: str,
    url_expires_at: datetime,
    download_method: DownloadMethod,
) -> dict[str, Any]:
    """The JSON of a url-mode :class:`FileContent` with these fields and ``range_supported`` true — what
    ``FileContent(type=url, …, range_supported=True).to_json()`` gives, key for key and in its order — built without
    the model. For descriptors of the service's own files only: their fields were checked when the file was
    published (media type, checksum form, name) and the URL is one the service made (its own signed URL, or its
    storage's presigned one), so the model's checks would find nothing, and a listing renders hundreds at once
    (building and dumping the model was 45 % of a page). A receiver still validates what it gets
    (:func:`load_descriptor`)."""
    doc: dict[str, Any] = {
        "type": "url",
        "content_type": content_type,
        "encoding": encoding.value,
        "size": size,
    }
    if encoded_size is not None:
        doc["encoded_size"] = encoded_size
    doc["checksum"] = checksum
    doc["metadata"] = metadata
    doc["name"] = name
    if role is not None:
        doc["role"] = role.value
    if description is not None:
        doc["description"] = description
    doc["url"] = url
    doc["url_expires_at"] = _timestamp_of(int(url_expires_at.timestamp()))  # format_timestamp's whole seconds
    doc["download_method"] = download_method.value
    doc["range_supported"] = True
    return doc


def _content_tag(value: Any) -> str | None:
    """Which content type a bundle item's JSON object is (the seed gives no explicit tag)."""
    if isinstance(value, BaseModel):
        return type(value).__name__
    if not isinstance(value, dict):
        return None
    if "name" in value:
        return "FileContent"
    if "charset" in value:
        return "TextContent"
    if "schema" in value or "schema_url" in value or not isinstance(value.get("data"), str):
        return "JSONContent"
    if "language" in value:  # code: language without charset (text requires charset)
        return "CodeContent"
    content_type = str(value.get("content_type", "")).split(";")[0].strip().lower()
    if content_type == "application/json" or content_type.endswith("+json"):
        return "JSONContent"
    return "TextContent"


AnyContent = Annotated[
    Annotated[FileContent, Tag("FileContent")]
    | Annotated[TextContent, Tag("TextContent")]
    | Annotated[JSONContent, Tag("JSONContent")]
    | Annotated[CodeContent, Tag("CodeContent")],
    Discriminator(
        _content_tag,
        custom_error_type="content_type_unknown",
        custom_error_message="content is not a Text, JSON, Code or File content object",
    ),
]


class ContentBundleItem(_Model):
    """One item of a ContentBundle: its id within the bundle, its role and its content."""

    id: str = Field(min_length=1, max_length=256)
    role: BundleItemRole
    content: AnyContent


class ContentBundle(_Model):
    """Several related content objects (seed 000 §3.5)."""

    id: str = Field(min_length=1, max_length=256)
    name: str | None = None
    description: str | None = None
    items: list[ContentBundleItem]
    total_size: int | None = Field(default=None, ge=0)
    created_at: AwareDatetime

    @field_serializer("created_at")
    def _ser_created(self, v: datetime) -> str:
        return format_timestamp(v)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        ids = [item.id for item in self.items]
        if len(ids) != len(set(ids)):
            raise ValueError("bundle item ids must be unique")
        if self.total_size is not None:
            declared = sum(item.content.size or 0 for item in self.items)
            if declared != self.total_size:
                raise ValueError(f"total_size {self.total_size} != sum of item sizes {declared}")
        return self


class Transport(enum.StrEnum):
    """How the content will travel, for :func:`choose_transfer_mode`."""

    MESSAGE = "message"  # a descriptor inside an agent message (MCP, A2A, TP, chat)
    FORM = "form"  # a browser form upload
    STREAM = "stream"  # produced progressively, or consumed while still being produced


def choose_transfer_mode(
    size: int | None, transport: Transport = Transport.MESSAGE, *, inline_threshold: int = INLINE_THRESHOLD
) -> TransferMode:
    """The seed's mode table (§1.1, §3.4): form uploads are multipart at any size; otherwise at most the inline
    threshold travels inline; larger, unknown-size or live content is ``streaming`` when the transport streams and
    ``url`` otherwise (unknown size is always streaming: a url descriptor must state its size)."""
    if transport is Transport.FORM:
        return TransferMode.MULTIPART
    if size is None:
        return TransferMode.STREAMING
    if size <= inline_threshold:
        return TransferMode.INLINE
    return TransferMode.STREAMING if transport is Transport.STREAM else TransferMode.URL


Content = FileContent | TextContent | JSONContent | CodeContent


def parse_descriptor(
    document: Any, *, inline_threshold: int = INLINE_THRESHOLD
) -> FileContent | TextContent | JSONContent | CodeContent | ContentBundle:
    """Validate a JSON document (already parsed) as a bundle or one content object; raises pydantic's
    ValidationError (the service turns it into ``invalid_descriptor``)."""
    context = {"inline_threshold": inline_threshold}
    if isinstance(document, dict) and "items" in document:
        return ContentBundle.model_validate(document, context=context)
    tag = _content_tag(document)
    model: type[Content] = {
        "FileContent": FileContent,
        "TextContent": TextContent,
        "JSONContent": JSONContent,
        "CodeContent": CodeContent,
    }.get(tag or "", FileContent)  # type: ignore[assignment]
    return model.model_validate(document, context=context)


def load_descriptor(
    document: str | bytes | dict[str, Any], *, inline_threshold: int = INLINE_THRESHOLD
) -> FileContent | TextContent | JSONContent | CodeContent | ContentBundle:
    """Parse and validate a descriptor (JSON text or an already parsed object); InvalidDescriptor otherwise."""
    try:  # nesting past transfer.core.jsontext.MAX_DEPTH: 400 json_too_deep, as on every door
        doc = parse_json(document) if isinstance(document, str | bytes) else document
    except ValueError as exc:
        raise InvalidDescriptor(f"descriptor is not JSON: {exc}") from None
    try:
        return parse_descriptor(doc, inline_threshold=inline_threshold)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'descriptor'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise InvalidDescriptor(f"invalid descriptor: {problems}") from None
