"""FileContent <-> A2A parts (v1.0 and v0.3) and MCP resources: lossless round trips, and the outputs accepted by
the protocols' own type definitions (a2a-sdk protobuf / pydantic types, mcp_types)."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime
from typing import Any

import mcp_types
import pytest
from a2a.compat.v0_3 import types as a2a_v03
from a2a.types import a2a_pb2
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

from transfer.core.agents.a2a import a2a_part_to_file, file_to_a2a_part, file_to_mcp_content, mcp_content_to_file
from transfer.core.model.content import FileContent
from transfer.errors import InvalidDescriptor

DATA = b"hello, agents"
INLINE = FileContent.model_validate(
    {
        "type": "inline",
        "content_type": "text/plain",
        "encoding": "base64",
        "data": base64.b64encode(DATA).decode(),
        "name": "hello.txt",
        "size": len(DATA),
        "checksum": "sha256:" + hashlib.sha256(DATA).hexdigest(),
        "role": "attachment",
        "metadata": {"file_id": "f_" + "a" * 32},
    }
)
URL = FileContent.model_validate(
    {
        "type": "url",
        "content_type": "application/x-ndjson",
        "encoding": "gzip",
        "size": 10_000_000,
        "encoded_size": 1_000_000,
        "checksum": "sha256:" + "b" * 64,
        "name": "log.ndjson",
        "url": "https://files.example.com/v1/files/f_1/content?exp=1&kid=k&sig=s",
        "url_expires_at": "2026-12-01T00:00:00Z",
        "download_method": "GET",
        "range_supported": True,
        "description": "a big log",
    }
)
STREAMING = FileContent.model_validate(
    {
        "type": "streaming",
        "content_type": "video/mp4",
        "size": 300,
        "name": "live.mp4",
        "url": "https://files.example.com/v1/sessions/s_1/chunks?exp=1&kid=k&sig=s",
        "streaming_session_id": "s_1",
        "total_chunks": 3,
        "chunk_size": 100,
    }
)


@pytest.mark.parametrize("descriptor", [INLINE, URL, STREAMING], ids=["inline", "url", "streaming"])
@pytest.mark.parametrize("version", ["1.0", "0.3"])
def test_a2a_round_trip_is_lossless(descriptor: FileContent, version: Any) -> None:
    part = file_to_a2a_part(descriptor, version)
    assert a2a_part_to_file(part).to_json() == descriptor.to_json()


def test_v1_part_is_a_valid_a2a_proto_part() -> None:
    for descriptor in (INLINE, URL):
        part = file_to_a2a_part(descriptor)
        message = json_format.ParseDict(part, a2a_pb2.Part())
        assert message.filename == descriptor.name and message.media_type == descriptor.content_type
        if descriptor is INLINE:
            assert message.raw == DATA
        else:
            assert message.url == descriptor.url
        # and what the proto serialises back converts to the same descriptor
        again = json_format.MessageToDict(message)
        assert a2a_part_to_file(again).to_json() == descriptor.to_json()


def test_v03_part_is_a_valid_a2a_filepart() -> None:
    inline = a2a_v03.FilePart.model_validate(file_to_a2a_part(INLINE, "0.3"))
    assert isinstance(inline.file, a2a_v03.FileWithBytes) and base64.b64decode(inline.file.bytes) == DATA
    linked = a2a_v03.FilePart.model_validate(file_to_a2a_part(URL, "0.3"))
    assert isinstance(linked.file, a2a_v03.FileWithUri) and linked.file.uri == URL.url


def test_foreign_parts_become_descriptors() -> None:
    raw = {"raw": base64.b64encode(DATA).decode(), "filename": "x.txt", "mediaType": "text/plain"}
    inline = a2a_part_to_file(raw)
    assert inline.size == len(DATA) and inline.checksum == "sha256:" + hashlib.sha256(DATA).hexdigest()
    linked = a2a_part_to_file({"kind": "file", "file": {"uri": "https://x.example/a/report%20v2.pdf"}})
    assert (
        linked.type.value == "url"
        and linked.name == "report v2.pdf"
        and linked.content_type == "application/octet-stream"
    )
    for bad in ({"filename": "x"}, {"raw": "!!", "url": "https://x"}, {"raw": "not base64!"}, []):
        with pytest.raises(InvalidDescriptor):
            a2a_part_to_file(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("descriptor", [INLINE, URL, STREAMING], ids=["inline", "url", "streaming"])
def test_mcp_round_trip_and_types(descriptor: FileContent) -> None:
    block = file_to_mcp_content(descriptor)
    if descriptor is INLINE:
        parsed = mcp_types.EmbeddedResource.model_validate(block)
        assert isinstance(parsed.resource, mcp_types.BlobResourceContents)
    else:
        link = mcp_types.ResourceLink.model_validate(block)
        assert link.uri == descriptor.url
        assert link.size == (None if descriptor.encoding and descriptor.encoding.value != "none" else descriptor.size)
    assert mcp_content_to_file(block).to_json() == descriptor.to_json()


def test_foreign_mcp_text_resource() -> None:
    block = {
        "type": "resource",
        "resource": {"uri": "file:///tmp/notes.md", "mimeType": "text/markdown", "text": "# hi"},
    }
    descriptor = mcp_content_to_file(block)
    assert descriptor.name == "notes.md" and base64.b64decode(descriptor.data or "") == b"# hi"
    with pytest.raises(InvalidDescriptor):
        mcp_content_to_file({"type": "text", "text": "x"})


@given(
    data=st.binary(max_size=2000),
    name=st.text(min_size=1, max_size=40).filter(lambda s: s.strip() == s and s),
    media=st.sampled_from(["application/octet-stream", "image/png", "text/csv; charset=utf-8"]),
    version=st.sampled_from(["1.0", "0.3"]),
)
def test_any_inline_file_survives_both_protocols(data: bytes, name: str, media: str, version: Any) -> None:
    descriptor = FileContent.model_validate(
        {
            "type": "inline",
            "content_type": media,
            "encoding": "base64",
            "data": base64.b64encode(data).decode(),
            "name": name,
            "size": len(data),
            "checksum": "sha256:" + hashlib.sha256(data).hexdigest(),
        }
    )
    assert a2a_part_to_file(file_to_a2a_part(descriptor, version)) == descriptor
    assert mcp_content_to_file(file_to_mcp_content(descriptor)) == descriptor


def test_expiry_survives() -> None:
    back = a2a_part_to_file(file_to_a2a_part(URL))
    assert back.url_expires_at == datetime(2026, 12, 1, tzinfo=UTC)
