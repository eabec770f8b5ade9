"""The 32 MIME type constants of the Synapse content type system (seed 000, section 4), plus groups of them."""

from __future__ import annotations

import re
from typing import Final

from transfer.errors import InvalidRequest

# Text (6)
MIME_TEXT_PLAIN: Final = "text/plain"
MIME_TEXT_MARKDOWN: Final = "text/markdown"
MIME_TEXT_HTML: Final = "text/html"
MIME_TEXT_CSV: Final = "text/csv"
MIME_TEXT_CSS: Final = "text/css"
MIME_TEXT_XML: Final = "text/xml"
# Application (7)
MIME_JSON: Final = "application/json"
MIME_XML: Final = "application/xml"
MIME_PDF: Final = "application/pdf"
MIME_ZIP: Final = "application/zip"
MIME_GZIP: Final = "application/gzip"
MIME_OCTET_STREAM: Final = "application/octet-stream"
MIME_MULTIPART_FORM: Final = "multipart/form-data"
# Image (8)
MIME_IMAGE_JPEG: Final = "image/jpeg"
MIME_IMAGE_PNG: Final = "image/png"
MIME_IMAGE_WEBP: Final = "image/webp"
MIME_IMAGE_GIF: Final = "image/gif"
MIME_IMAGE_SVG: Final = "image/svg+xml"
MIME_IMAGE_BMP: Final = "image/bmp"
MIME_IMAGE_TIFF: Final = "image/tiff"
MIME_IMAGE_ICO: Final = "image/x-icon"
# Video (5)
MIME_VIDEO_MP4: Final = "video/mp4"
MIME_VIDEO_WEBM: Final = "video/webm"
MIME_VIDEO_AVI: Final = "video/x-msvideo"
MIME_VIDEO_MOV: Final = "video/quicktime"
MIME_VIDEO_MKV: Final = "video/x-matroska"
# Audio (6)
MIME_AUDIO_MP3: Final = "audio/mpeg"
MIME_AUDIO_WAV: Final = "audio/wav"
MIME_AUDIO_AAC: Final = "audio/aac"
MIME_AUDIO_OGG: Final = "audio/ogg"
MIME_AUDIO_FLAC: Final = "audio/flac"
MIME_AUDIO_WEBM: Final = "audio/webm"

TEXT_TYPES: Final = (MIME_TEXT_PLAIN, MIME_TEXT_MARKDOWN, MIME_TEXT_HTML, MIME_TEXT_CSV, MIME_TEXT_CSS, MIME_TEXT_XML)
APPLICATION_TYPES: Final = (
    MIME_JSON,
    MIME_XML,
    MIME_PDF,
    MIME_ZIP,
    MIME_GZIP,
    MIME_OCTET_STREAM,
    MIME_MULTIPART_FORM,
)
IMAGE_TYPES: Final = (
    MIME_IMAGE_JPEG,
    MIME_IMAGE_PNG,
    MIME_IMAGE_WEBP,
    MIME_IMAGE_GIF,
    MIME_IMAGE_SVG,
    MIME_IMAGE_BMP,
    MIME_IMAGE_TIFF,
    MIME_IMAGE_ICO,
)
VIDEO_TYPES: Final = (MIME_VIDEO_MP4, MIME_VIDEO_WEBM, MIME_VIDEO_AVI, MIME_VIDEO_MOV, MIME_VIDEO_MKV)
AUDIO_TYPES: Final = (MIME_AUDIO_MP3, MIME_AUDIO_WAV, MIME_AUDIO_AAC, MIME_AUDIO_OGG, MIME_AUDIO_FLAC, MIME_AUDIO_WEBM)
ALL_TYPES: Final = TEXT_TYPES + APPLICATION_TYPES + IMAGE_TYPES + VIDEO_TYPES + AUDIO_TYPES

# Types a browser may execute or render as an active document: served as attachments (issue: safe serving). The
# WHATWG MIME Sniffing Standard's "scriptable MIME types" (§4.6: HTML, any XML type, PDF), its JavaScript MIME type
# essences (§4.6), and the other types browsers have run script from: XSLT, HTML components, Flash, mixed-replace.
JAVASCRIPT_TYPES: Final = frozenset(
    {
        "application/ecmascript",
        "application/javascript",
        "application/x-ecmascript",
        "application/x-javascript",
        "text/ecmascript",
        "text/javascript",
        "text/javascript1.0",
        "text/javascript1.1",
        "text/javascript1.2",
        "text/javascript1.3",
        "text/javascript1.4",
        "text/javascript1.5",
        "text/jscript",
        "text/livescript",
        "text/x-ecmascript",
        "text/x-javascript",
    }
)
ACTIVE_TYPES: Final = JAVASCRIPT_TYPES | frozenset(
    {
        MIME_TEXT_HTML,
        MIME_TEXT_XML,
        MIME_XML,
        MIME_IMAGE_SVG,
        MIME_PDF,
        "application/xhtml+xml",
        "application/xslt+xml",
        "text/xsl",
        "text/x-component",
        "application/x-shockwave-flash",
        "multipart/x-mixed-replace",
    }
)


def is_active_type(content_type: str) -> bool:
    """True when a browser could run script from or render as a document content of this type: the types above,
    every ``+xml`` type (WHATWG: an XML MIME type), and anything that is not a valid media type at all."""
    if not is_media_type(content_type):
        return True
    t = essence(content_type)
    return t in ACTIVE_TYPES or t.endswith("+xml")


MAX_MEDIA_TYPE_LENGTH: Final = 255

# RFC 9110 §8.3.1 media-type = type "/" subtype parameters; parameters = *( OWS ";" OWS [ parameter ] );
# parameter = parameter-name "=" ( token / quoted-string ) (§5.6.2 token, §5.6.4 quoted-string). A strict subset:
# OWS is spaces only and quoted strings hold printable ASCII only (no HTAB, no obs-text), so a valid value carries no
# control character at all and is safe in any header field, JSON document or S3 metadata value.
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[ !#-\[\]-~]|\\[ -~])*"'
_MEDIA_TYPE_RE: Final = re.compile(rf"{_TOKEN}/{_TOKEN}(?: *; *(?:{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?)*")


def validate_media_type(value: str) -> str:
    """``value`` unchanged when it is a media type by RFC 9110 §8.3.1 of at most 255 characters without control
    characters (e.g. ``text/plain; charset=utf-8``); ValueError otherwise."""
    if not is_media_type(value):
        raise ValueError("content_type must be a MIME type such as 'text/plain' (RFC 9110 §8.3.1, at most 255 chars)")
    return value


def is_media_type(value: str) -> bool:
    """Whether :func:`validate_media_type` accepts ``value``."""
    return len(value) <= MAX_MEDIA_TYPE_LENGTH and _MEDIA_TYPE_RE.fullmatch(value) is not None


def require_media_type(value: str, field: str = "content_type") -> str:
    """:func:`validate_media_type` for a service operation: InvalidRequest (400) naming ``field``."""
    try:
        return validate_media_type(value)
    except ValueError as exc:
        raise InvalidRequest(f"{field} {value[:60]!r}: {exc}", field=field) from None


def essence(content_type: str) -> str:
    """The media type without parameters, lower-cased (``Text/HTML; charset=x`` -> ``text/html``)."""
    return content_type.split(";", 1)[0].strip().lower()


def is_compressible(content_type: str) -> bool:
    """True for types worth compressing on the fly (text and structured text); media and archives are not."""
    t = essence(content_type)
    return (
        t.startswith("text/")
        or t.endswith(("+json", "+xml"))
        or t
        in {
            MIME_JSON,
            MIME_XML,
            "application/javascript",
            "application/x-ndjson",
            "application/yaml",
            MIME_IMAGE_SVG,
            "application/wasm",
            "application/x-tar",
        }
    )


def is_textual(content_type: str) -> bool:
    """True for types whose bytes are text (returned as text rather than base64 by the MCP resolve tool)."""
    t = essence(content_type)
    return (
        t.startswith("text/")
        or t.endswith(("+json", "+xml"))
        or t in {MIME_JSON, MIME_XML, "application/javascript", "application/x-ndjson", "application/yaml"}
    )
