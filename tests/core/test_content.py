"""The Synapse content model: every seed example round-trips; invalid descriptors are refused with a reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from transfer.core.model import mime
from transfer.core.model.content import (
    CodeContent,
    ContentBundle,
    FileContent,
    JSONContent,
    TextContent,
    TransferMode,
    Transport,
    choose_transfer_mode,
    parse_descriptor,
)

# The JSON examples of seed 000, verbatim.
SEED_TEXT = """{ "type": "inline", "content_type": "text/plain", "encoding": "none", "charset": "utf-8", "language": "zh-CN", "data": "你好,世界!" }"""  # noqa: E501
SEED_JSON = """{ "type": "inline", "content_type": "application/json", "encoding": "none", "schema": "https://schema.synapse.com/v1/agent-info", "data": { "agent_id": "agent-001", "name": "智能助手", "version": "1.2.0" } }"""  # noqa: E501
SEED_CODE = """{ "type": "inline", "content_type": "text/plain", "encoding": "none", "language": "python", "version": "3.11", "dependencies": ["requests>=2.28", "pydantic>=2.0"], "data": "def hello(name: str) -> str:\\n return f\\"Hello, {name}!\\"" }"""  # noqa: E501
SEED_FILE_INLINE = """{ "type": "inline", "content_type": "image/png", "encoding": "base64", "size": 524288, "name": "screenshot.png", "role": "reference", "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==" }"""  # noqa: E501
SEED_FILE_URL = """{ "type": "url", "content_type": "video/mp4", "encoding": "none", "size": 15728640, "name": "demo.mp4", "role": "result", "url": "https://storage.synapse.com/files/demo.mp4", "url_expires_at": "2026-06-30T23:59:59Z", "download_method": "GET", "range_supported": true, "width": 1920, "height": 1080, "duration": 30.5, "resolution": "1920x1080" }"""  # noqa: E501
SEED_BUNDLE = """{ "id": "bundle-001", "name": "分析报告", "description": "包含分析结果、图表和原始数据", "items": [ { "id": "item-001", "role": "main", "content": { "type": "inline", "content_type": "text/markdown", "encoding": "none", "charset": "utf-8", "language": "zh-CN", "data": "# 分析报告\\n\\n本次分析共发现 **3** 个关键问题..." } }, { "id": "item-002", "role": "reference", "content": { "type": "url", "content_type": "image/png", "encoding": "none", "size": 204800, "name": "chart.png", "role": "reference", "url": "https://storage.synapse.com/reports/chart.png" } }, { "id": "item-003", "role": "attachment", "content": { "type": "url", "content_type": "application/json", "encoding": "gzip", "size": 1048576, "name": "raw_data.json.gz", "role": "attachment", "url": "https://storage.synapse.com/reports/raw_data.json.gz" } } ], "total_size": 1253376, "created_at": "2026-06-28T10:00:00Z" }"""  # noqa: E501

SEEDS = [
    (SEED_TEXT, TextContent),
    (SEED_JSON, JSONContent),
    (SEED_CODE, CodeContent),
    (SEED_FILE_INLINE, FileContent),
    (SEED_FILE_URL, FileContent),
    (SEED_BUNDLE, ContentBundle),
]


@pytest.mark.parametrize(("text", "model"), SEEDS)
def test_seed_examples_round_trip(text: str, model: type) -> None:
    document = json.loads(text)
    parsed = parse_descriptor(document)
    assert type(parsed) is model
    assert parsed.to_json() == document
    # and the direct model validates the same way
    assert model.model_validate(document).to_json() == document


def test_bundle_items_are_recognised_by_type() -> None:
    bundle = parse_descriptor(json.loads(SEED_BUNDLE))
    assert isinstance(bundle, ContentBundle)
    assert [type(i.content) for i in bundle.items] == [TextContent, FileContent, FileContent]


def test_bundle_recognises_code_and_json_items() -> None:
    doc = json.loads(SEED_BUNDLE)
    doc["items"].append({"id": "c", "role": "attachment", "content": json.loads(SEED_CODE)})
    doc["items"].append({"id": "j", "role": "attachment", "content": json.loads(SEED_JSON)})
    bundle = ContentBundle.model_validate(doc)
    assert [type(i.content) for i in bundle.items][-2:] == [CodeContent, JSONContent]
    assert bundle.to_json() == doc


def _file(**overrides: Any) -> dict[str, Any]:
    doc = json.loads(SEED_FILE_URL)
    doc.update(overrides)
    return {k: v for k, v in doc.items() if v is not None}


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (_file(url=None), "url mode requires 'url'"),
        (_file(url="ftp://example.com/x"), "absolute http(s) URL"),
        (_file(url="/relative/path"), "absolute http(s) URL"),
        (_file(checksum="md5:abc"), "checksum must be"),
        (_file(checksum="sha256:" + "0" * 63), "checksum must be"),
        (_file(role="owner"), "role"),
        (_file(size=-1), "size"),
        (_file(download_method="PUT"), "download_method"),
        (_file(url_expires_at="tomorrow"), "url_expires_at"),
        (_file(url_expires_at="2026-06-30T23:59:59"), "timezone"),
        (_file(type="inline", url=None), "inline content requires 'data'"),
        (_file(type="inline", data="not base64 !!"), "base64"),
        (_file(type="streaming"), "streaming mode requires"),
        (
            _file(type="streaming", streaming_session_id="s", total_chunks=3, chunk_size=4 << 20),
            "total_chunks 3 inconsistent",
        ),
        (_file(name=""), "name"),
        (_file(unexpected_field=1), "unexpected_field"),
        (_file(content_type="nonsense"), "MIME type"),
    ],
)
def test_invalid_file_descriptors_are_refused(doc: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError) as info:
        FileContent.model_validate(doc)
    assert fragment in str(info.value)


def test_inline_threshold_is_enforced_and_configurable() -> None:
    import base64

    data = base64.b64encode(b"x" * ((1 << 20) + 1)).decode()
    doc = {"type": "inline", "content_type": "text/plain", "name": "a", "data": data}
    with pytest.raises(ValidationError, match="inline threshold"):
        FileContent.model_validate(doc)
    exact = base64.b64encode(b"x" * (1 << 20)).decode()
    assert FileContent.model_validate({**doc, "data": exact}).type is TransferMode.INLINE
    with pytest.raises(ValidationError, match="inline threshold"):
        FileContent.model_validate(
            {**doc, "data": base64.b64encode(b"x" * 11).decode()}, context={"inline_threshold": 10}
        )


def test_streaming_descriptor_consistent_with_size() -> None:
    doc = _file(type="streaming", streaming_session_id="s1", total_chunks=3, chunk_size=6 << 20)
    FileContent.model_validate(doc)  # 15 MiB in 6 MiB chunks -> 3
    gz = _file(
        type="streaming", encoding="gzip", encoded_size=100, streaming_session_id="s", total_chunks=1, chunk_size=100
    )
    FileContent.model_validate(gz)  # chunks cover the encoded bytes


def test_checksum_is_normalised() -> None:
    f = FileContent.model_validate(_file(checksum="AB" * 32))
    assert f.checksum == "sha256:" + "ab" * 32


def test_bundle_total_size_must_match() -> None:
    doc = json.loads(SEED_BUNDLE)
    doc["total_size"] = 1
    with pytest.raises(ValidationError, match="total_size"):
        ContentBundle.model_validate(doc)
    doc = json.loads(SEED_BUNDLE)
    doc["items"][1]["role"] = "result"  # a FileContent role, not a bundle item role
    with pytest.raises(ValidationError, match="role"):
        ContentBundle.model_validate(doc)
    doc = json.loads(SEED_BUNDLE)
    doc["items"][1]["id"] = "item-001"
    with pytest.raises(ValidationError, match="unique"):
        ContentBundle.model_validate(doc)


def test_bundle_item_of_unknown_shape_is_refused() -> None:
    doc = json.loads(SEED_BUNDLE)
    doc["items"][0]["content"] = ["not", "an", "object"]
    with pytest.raises(ValidationError, match="not a Text, JSON, Code or File"):
        ContentBundle.model_validate(doc)


def test_json_content_requires_a_value() -> None:
    with pytest.raises(ValidationError):
        JSONContent.model_validate({"type": "inline", "content_type": "application/json", "data": None})


@pytest.mark.parametrize(
    ("size", "transport", "mode"),
    [
        (0, Transport.MESSAGE, TransferMode.INLINE),
        (1 << 20, Transport.MESSAGE, TransferMode.INLINE),
        ((1 << 20) + 1, Transport.MESSAGE, TransferMode.URL),
        ((1 << 20) + 1, Transport.STREAM, TransferMode.STREAMING),
        (None, Transport.MESSAGE, TransferMode.STREAMING),
        (10, Transport.FORM, TransferMode.MULTIPART),
        (10 << 30, Transport.FORM, TransferMode.MULTIPART),
    ],
)
def test_choose_transfer_mode(size: int | None, transport: Transport, mode: TransferMode) -> None:
    assert choose_transfer_mode(size, transport) is mode


def test_mode_threshold_is_a_setting() -> None:
    assert choose_transfer_mode(100, inline_threshold=99) is TransferMode.URL


def test_32_mime_constants() -> None:
    assert len(mime.ALL_TYPES) == 32
    assert len(set(mime.ALL_TYPES)) == 32
    assert mime.MIME_IMAGE_ICO == "image/x-icon" and mime.MIME_VIDEO_AVI == "video/x-msvideo"
