"""The pure TP core: envelope validation, byte-exact trace_info rewriting, hop limits, prompt embedding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transfer.core.agents.tp import (
    Binding,
    Envelope,
    TraceInfo,
    element_spans,
    embed_in_prompt,
    extract_from_prompt,
    forward,
    member_spans,
    parse_envelope,
    validate_envelope,
    with_trace_info,
)
from transfer.errors import (
    EncryptedResourceRefused,
    HopLimitExceeded,
    InvalidEnvelope,
    NoEnvelopeInPrompt,
    TooLarge,
    TPVersionUnsupported,
)

BASE = {
    "tp_version": "1.0.0",
    "message_id": "m-1",
    "message_type": "resource_notify",
    "sender": "fay:a",
    "receiver": {"fay_id": "b"},
    "protocol_contract_ref": "c-9",
    "payload": {"resource_id": "f_1", "event": "progress"},
    "signature": {"alg": "ed25519", "value": "c2ln"},
}


def test_valid_envelope_keeps_its_bytes() -> None:
    text = b'{ "tp_version" : "1.0.0",\n "message_id":"m", "message_type":"resource_mount", "payload":{} }'
    envelope = parse_envelope(text, 1 << 20)
    assert envelope.raw == text and envelope.message_type == "resource_mount" and envelope.trace is None


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ([], InvalidEnvelope),
        ({**BASE, "tp_version": 1}, InvalidEnvelope),
        ({**BASE, "tp_version": "2.0.0"}, TPVersionUnsupported),
        ({**BASE, "message_id": ""}, InvalidEnvelope),
        ({**BASE, "payload": []}, InvalidEnvelope),
        ({**BASE, "sender": 5}, InvalidEnvelope),
        (
            {**BASE, "trace_info": {"original_protocol": "smoke", "original_message_id": "x", "hop_count": 0}},
            InvalidEnvelope,
        ),
        (
            {**BASE, "trace_info": {"original_protocol": "native_tp", "original_message_id": "x", "hop_count": -1}},
            InvalidEnvelope,
        ),
        (
            {**BASE, "trace_info": {"original_protocol": "native_tp", "original_message_id": "x", "hop_count": True}},
            InvalidEnvelope,
        ),
        (
            {**BASE, "trace_info": {"original_protocol": "native_tp", "original_message_id": "x", "hop_count": 6}},
            HopLimitExceeded,
        ),
    ],
)
def test_invalid_envelopes(doc: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        validate_envelope(doc)


def test_bad_json_duplicates_and_size() -> None:
    with pytest.raises(InvalidEnvelope):
        parse_envelope(b"{nope", 1000)
    with pytest.raises(InvalidEnvelope):
        parse_envelope(b"\xff\xfe", 1000)
    with pytest.raises(InvalidEnvelope, match="twice"):
        parse_envelope(
            b'{"tp_version":"1.0.0","message_id":"a","message_id":"b","message_type":"x","payload":{}}', 1000
        )
    with pytest.raises(InvalidEnvelope):
        parse_envelope(b'{"tp_version":"1.0.0","message_id":"a","message_type":"x","payload":{"n":NaN}}', 1000)
    with pytest.raises(TooLarge):
        parse_envelope(json.dumps(BASE).encode(), 10)


def test_forward_counts_hops_and_refuses_the_sixth() -> None:
    envelope = validate_envelope(BASE)
    first = parse_envelope(forward(envelope, Binding.A2A_JSONRPC), 1 << 20)
    assert first.trace == TraceInfo("a2a_jsonrpc", "m-1", 1)
    current = first
    for hop in range(2, 6):
        current = parse_envelope(forward(current, Binding.MCP_TOOL_CALL), 1 << 20)
        assert current.trace is not None and current.trace.hop_count == hop
        assert current.trace.original_protocol == "a2a_jsonrpc"  # where it started stays
    with pytest.raises(HopLimitExceeded):
        forward(current, Binding.REST_API)


def _without(text: str, name: str) -> str:
    spans = member_spans(text)
    start, end = spans[name]
    return text[:start] + text[end:]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)


@given(
    extra=st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in BASE), json_values, max_size=4),
    indent=st.sampled_from([None, 0, 2]),
    ascii_only=st.booleans(),
    with_trace=st.booleans(),
)
def test_trace_rewrite_changes_no_other_byte(
    extra: dict[str, object], indent: int | None, ascii_only: bool, with_trace: bool
) -> None:
    doc: dict[str, object] = {**BASE, **extra}
    if with_trace:
        doc["trace_info"] = {"original_protocol": "rest_api", "original_message_id": "m-0", "hop_count": 2}
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only)
    out = with_trace_info(text.encode(), TraceInfo("native_tp", "m-0", 3)).decode()
    assert json.loads(out)["trace_info"] == {
        "original_protocol": "native_tp",
        "original_message_id": "m-0",
        "hop_count": 3,
    }
    rest = {k: v for k, v in json.loads(out).items() if k != "trace_info"}
    assert rest == {k: v for k, v in doc.items() if k != "trace_info"}
    if with_trace:  # everything outside the trace_info value is byte-identical
        assert _without(out, "trace_info") == _without(text, "trace_info")
    else:  # the original text is a prefix, up to its closing brace
        assert out.startswith(text.rstrip()[:-1])


def test_element_spans_of_a_batch() -> None:
    text = ' [ {"a": [1, 2]} , "x", 3 ] '
    assert [text[a:b] for a, b in element_spans(text)] == ['{"a": [1, 2]}', '"x"', "3"]
    assert element_spans("[]") == []


def test_prompt_round_trip_and_refusals() -> None:
    envelope = validate_envelope(BASE)
    prompt = embed_in_prompt(envelope, "fay:a")
    assert "```tp-envelope\n" in prompt and "security level: basic" in prompt
    (back,) = extract_from_prompt("some chat first\n" + prompt + "\nthanks", 1 << 20)
    assert back.raw == envelope.raw
    with pytest.raises(NoEnvelopeInPrompt):
        extract_from_prompt("```json\n{}\n```", 1 << 20)
    secret = validate_envelope({**BASE, "payload": {"resource": {"name": "x", "requires_encryption": True}}})
    with pytest.raises(EncryptedResourceRefused):
        embed_in_prompt(secret, "fay:a")
    hidden = "```tp-envelope\n" + json.dumps(secret.doc) + "\n```\n"
    with pytest.raises(EncryptedResourceRefused):
        extract_from_prompt(hidden, 1 << 20)
    with pytest.raises(InvalidEnvelope):
        extract_from_prompt("```tp-envelope\nnot json\n```", 1 << 20)


def test_envelope_is_frozen() -> None:
    envelope = Envelope(b"{}", {})
    with pytest.raises(AttributeError):
        envelope.raw = b"x"  # type: ignore[misc]
