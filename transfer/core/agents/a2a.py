"""Lossless conversions between Synapse ``FileContent`` and the file shapes of A2A and MCP. Pure functions on JSON.

    A2A v1.0 Part          {"url" | "raw", "filename", "mediaType", "metadata"}
    A2A v0.3 FilePart      {"kind": "file", "file": {"uri" | "bytes", "mimeType", "name"}, "metadata"}
    MCP EmbeddedResource   {"type": "resource", "resource": {"uri", "mimeType", "blob"}, "_meta"}   (inline)
    MCP ResourceLink       {"type": "resource_link", "uri", "name", "mimeType", "size"?, "_meta"}   (url/streaming)

What the target cannot carry (checksum, size, encoding, expiry, role, streaming fields, …) travels as the whole
descriptor, minus the bytes, under ``metadata["synapse"]`` (A2A) or ``_meta["dev.synapse/descriptor"]`` (MCP), so
FileContent -> part -> FileContent gives back an equal descriptor. Parts from elsewhere (no such metadata) become a
FileContent from what they say: inline bytes get their size and SHA-256 computed, a URL becomes url mode.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any, Literal
from urllib.parse import quote, unquote, urlsplit

from transfer.core.model.content import ContentEncoding, FileContent, TransferMode, load_descriptor
from transfer.errors import InvalidDescriptor

A2A_KEY = "synapse"
MCP_KEY = "dev.synapse/descriptor"
OCTET_STREAM = "application/octet-stream"


def _carried(descriptor: FileContent) -> dict[str, Any]:
    doc = descriptor.to_json()
    doc.pop("data", None)
    return doc


def file_to_a2a_part(descriptor: FileContent, version: Literal["1.0", "0.3"] = "1.0") -> dict[str, Any]:
    """A FileContent as an A2A file part (v1.0 ``Part`` by default, or v0.3 ``FilePart``)."""
    if descriptor.type is TransferMode.INLINE:
        assert descriptor.data is not None
        content: tuple[str, str] = ("raw", descriptor.data) if version == "1.0" else ("bytes", descriptor.data)
    else:
        if descriptor.url is None:
            raise InvalidDescriptor(f"a {descriptor.type.value} descriptor without a url cannot become an A2A part")
        content = ("url", descriptor.url) if version == "1.0" else ("uri", descriptor.url)
    metadata = {A2A_KEY: _carried(descriptor)}
    if version == "1.0":
        return {
            content[0]: content[1],
            "filename": descriptor.name,
            "mediaType": descriptor.content_type,
            "metadata": metadata,
        }
    file = {content[0]: content[1], "mimeType": descriptor.content_type, "name": descriptor.name}
    return {"kind": "file", "file": file, "metadata": metadata}


def a2a_part_to_file(part: dict[str, Any]) -> FileContent:
    """An A2A file part (v1.0 or v0.3) as a FileContent."""
    if not isinstance(part, dict):
        raise InvalidDescriptor("an A2A part is a JSON object")
    metadata: dict[str, Any] = part["metadata"] if isinstance(part.get("metadata"), dict) else {}
    if isinstance(part.get("file"), dict):  # v0.3 FilePart
        file = part["file"]
        data, url = file.get("bytes"), file.get("uri")
        name, media = file.get("name"), file.get("mimeType")
    else:  # v1.0 Part
        data, url = part.get("raw"), part.get("url")
        name, media = part.get("filename"), part.get("mediaType") or part.get("media_type")
    return _rebuild(data, url, name, media, metadata.get(A2A_KEY))


def file_to_mcp_content(descriptor: FileContent) -> dict[str, Any]:
    """A FileContent as an MCP content block: EmbeddedResource (inline bytes) or ResourceLink (a URL)."""
    meta = {MCP_KEY: _carried(descriptor)}
    if descriptor.type is TransferMode.INLINE:
        file_id = (descriptor.metadata or {}).get("file_id")
        key = file_id or (descriptor.checksum or "").removeprefix("sha256:") or "inline"
        uri = f"synapse://files/{key}/{quote(descriptor.name, safe='')}"
        resource = {"uri": uri, "mimeType": descriptor.content_type, "blob": descriptor.data}
        return {"type": "resource", "resource": resource, "_meta": meta}
    if descriptor.url is None:
        raise InvalidDescriptor(f"a {descriptor.type.value} descriptor without a url cannot become a resource link")
    link: dict[str, Any] = {
        "type": "resource_link",
        "uri": descriptor.url,
        "name": descriptor.name,
        "mimeType": descriptor.content_type,
    }
    if descriptor.description:
        link["description"] = descriptor.description
    if descriptor.size is not None and (descriptor.encoding in (None, ContentEncoding.NONE)):
        link["size"] = descriptor.size  # MCP's size is the raw bytes at the URI
    link["_meta"] = meta
    return link


def mcp_content_to_file(block: dict[str, Any]) -> FileContent:
    """An MCP EmbeddedResource (blob or text) or ResourceLink as a FileContent."""
    if not isinstance(block, dict):
        raise InvalidDescriptor("an MCP content block is a JSON object")
    meta: dict[str, Any] = block["_meta"] if isinstance(block.get("_meta"), dict) else {}
    carried = meta.get(MCP_KEY)
    if block.get("type") == "resource" and isinstance(block.get("resource"), dict):
        resource = block["resource"]
        data = resource.get("blob")
        if data is None and isinstance(resource.get("text"), str):
            data = base64.b64encode(resource["text"].encode("utf-8")).decode("ascii")
        name = None if isinstance(carried, dict) else _name_from_uri(str(resource.get("uri", "")))
        return _rebuild(data, None, name, resource.get("mimeType"), carried)
    if block.get("type") == "resource_link":
        return _rebuild(None, block.get("uri"), block.get("name"), block.get("mimeType"), carried, block.get("size"))
    raise InvalidDescriptor("expected an MCP content block of type resource or resource_link")


def _name_from_uri(uri: str) -> str:
    path = urlsplit(uri).path.rstrip("/")
    return unquote(path.rsplit("/", 1)[-1]) if path else ""


def _rebuild(data: Any, url: Any, name: Any, media: Any, carried: Any, size: Any = None) -> FileContent:
    if (data is None) == (url is None):
        raise InvalidDescriptor("a file part carries exactly one of inline bytes or a URL")
    if isinstance(carried, dict):  # ours: the descriptor, with the part's own fields put back
        doc = dict(carried)
        if data is not None:
            doc["data"] = data
        else:
            doc["url"] = url
        if name:
            doc["name"] = name
        if media:
            doc["content_type"] = media
        return _file(doc)
    doc = {"content_type": media or OCTET_STREAM, "name": name or "", "metadata": {"source": "a2a/mcp part"}}
    if data is not None:
        try:
            raw = base64.b64decode(str(data), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidDescriptor("the part's bytes are not base64") from None
        doc.update(
            type="inline",
            encoding="base64",
            data=data,
            size=len(raw),
            checksum="sha256:" + hashlib.sha256(raw).hexdigest(),
        )
    else:
        doc.update(type="url", url=url, download_method="GET")
        if isinstance(size, int) and size >= 0:
            doc["size"] = size
    if not doc["name"]:
        doc["name"] = _name_from_uri(str(url or "")) or "file"
    return _file(doc)


def _file(doc: dict[str, Any]) -> FileContent:
    descriptor = load_descriptor(doc)
    if not isinstance(descriptor, FileContent):
        raise InvalidDescriptor("the part does not describe a file")
    return descriptor
