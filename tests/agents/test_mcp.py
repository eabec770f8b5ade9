"""The MCP tools through the official SDK client: over streamable HTTP (/mcp of a live server) and over stdio
(`transfer mcp` as a subprocess). Large content never travels in MCP messages: descriptors and paths do."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import xxhash
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import LiveServer, running
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

pytestmark = pytest.mark.anyio

TOOLS = {
    "upload_file",
    "upload_content",
    "open_session",
    "send_chunk",
    "complete_session",
    "session_status",
    "describe",
    "resolve",
    "create_bundle",
    "tp_resource_mount",
    "tp_resource_unmount",
    "tp_resource_notify",
    "tp_poll_messages",
}


def structured(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data: dict[str, Any] = result.structured_content
    return data


def tool_error(result: Any) -> dict[str, Any]:
    assert result.is_error
    body: dict[str, Any] = json.loads(result.content[0].text)["error"]
    return body


@pytest.fixture
def mcp_server(tmp_path: Path) -> Any:
    root = tmp_path / "root"
    root.mkdir()
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        mcp_root=root,
        mcp_max_inline_bytes=256 << 10,
        inline_threshold=4096,
    )
    with running(settings) as live:
        yield live, root


async def test_tools_are_listed_with_precise_schemas(mcp_server: tuple[LiveServer, Path]) -> None:
    live, _ = mcp_server
    async with Client(f"{live.url}/mcp") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert TOOLS <= set(tools)
    upload = tools["upload_file"].input_schema
    assert upload["required"] == ["path"]
    assert upload["properties"]["encoding"]["enum"] == ["none", "gzip", "deflate", "zstd"]
    assert tools["tp_resource_mount"].input_schema["required"] == ["tp_envelope"]
    assert "ctx" not in tools["resolve"].input_schema["properties"]
    # the descriptor is a JSON object with a short schema naming its required fields (our loader validates it)
    descriptor = tools["resolve"].input_schema["properties"]["descriptor"]
    assert descriptor["type"] == "object"
    assert {"required": ["type", "content_type"]} in descriptor["anyOf"]
    assert len(json.dumps(tools["resolve"].input_schema)) < 2000  # was 7.8 KB: the expanded union of the models
    bundle_defs = tools["create_bundle"].input_schema["$defs"]
    assert bundle_defs["BundleItemInput"]["required"] == ["role"]
    role = bundle_defs["BundleItemInput"]["properties"]["role"]
    assert role["enum"] == ["main", "reference", "attachment", "thumbnail"]  # inlined, not a $ref
    assert set(bundle_defs) == {"BundleItemInput"}


def _refs(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        own = [str(schema["$ref"])] if "$ref" in schema else []
        return own + [r for v in schema.values() for r in _refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _refs(v)]
    return []


async def test_tools_suit_strict_callers(mcp_server: tuple[LiveServer, Path]) -> None:
    """openai-agents' own converter takes the file tools' schemas for strict mode as they are, enums inlined: no
    ``$ref`` to a plain enum (``$defs/FileRole``) in their inputs or results."""
    from agents.strict_schema import ensure_strict_json_schema

    live, _ = mcp_server
    async with Client(f"{live.url}/mcp") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    for name in ("upload_file", "upload_content", "describe", "create_bundle"):
        schemas = [tools[name].input_schema, tools[name].output_schema]
        assert [r for s in schemas for r in _refs(s) if "Role" in r or "Method" in r] == [], name
    for name in ("upload_file", "upload_content", "describe"):
        strict = ensure_strict_json_schema(json.loads(json.dumps(tools[name].input_schema)))
        assert strict["additionalProperties"] is False and _refs(strict) == [], name
        assert set(strict["required"]) == set(strict["properties"]), name
    assert tools["upload_content"].input_schema["properties"]["role"]["anyOf"][0]["enum"] == [
        "reference",
        "result",
        "attachment",
    ]


async def test_create_bundle_suits_strict_callers_and_takes_content_as_json_text(
    mcp_server: tuple[LiveServer, Path],
) -> None:
    """create_bundle's item content was an open object, which strict mode refuses: it is the Synapse content as JSON
    text now (the seed's JSON data and metadata are any JSON value, which no closed schema states), so the converter
    takes the schema, every object in it closed; the text is checked by the descriptor loader; an object is still
    taken from callers that are not strict."""
    from agents.strict_schema import ensure_strict_json_schema

    live, _ = mcp_server
    async with Client(f"{live.url}/mcp") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        strict = ensure_strict_json_schema(json.loads(json.dumps(tools["create_bundle"].input_schema)))
        item = strict["$defs"]["BundleItemInput"]
        assert item["additionalProperties"] is False and set(item["required"]) == set(item["properties"])
        assert item["properties"]["content"]["anyOf"][0]["type"] == "string"
        text = {"type": "inline", "content_type": "text/plain", "charset": "utf-8", "data": "# notes"}
        data = {"type": "inline", "content_type": "application/json", "data": {"k": [1, 2.5, None]}}
        # what a strict caller sends: every property, nulls for those it does not use
        items = [
            {"role": "main", "id": None, "file_id": None, "content": json.dumps(text)},
            {"role": "reference", "id": "data", "file_id": None, "content": json.dumps(data)},
        ]
        args = {"items": items, "name": "strict", "description": None, "expires_in": None}
        bundle = structured(await client.call_tool("create_bundle", args))
        assert [i["content"]["data"] for i in bundle["items"]] == ["# notes", {"k": [1, 2.5, None]}]
        lenient = structured(await client.call_tool("create_bundle", {"items": [{"role": "main", "content": text}]}))
        assert lenient["items"][0]["content"]["data"] == "# notes"
        broken = tool_error(
            await client.call_tool("create_bundle", {"items": [{"role": "main", "content": '{"type": "inl'}]})
        )
        assert broken["code"] == "invalid_request" and "item 0" in broken["message"]
        wrong = tool_error(
            await client.call_tool("create_bundle", {"items": [{"role": "main", "content": json.dumps({"type": 1})}]})
        )
        assert wrong["code"] in ("invalid_request", "invalid_descriptor")


# code-comment leftovers: runs of spaces, line breaks, reST or Markdown code markup, a setting's name
LEFTOVERS = re.compile(
    r"  |`|\n|:func:|:class:|\b(?:" + "|".join(f for f in Settings.model_fields if "_" in f) + r")\b"
)


def _descriptions(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "description" and isinstance(value, str):
                yield value
            else:
                yield from _descriptions(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _descriptions(value)


async def test_tools_read_well_and_say_what_they_do(mcp_server: tuple[LiveServer, Path]) -> None:
    """What an LLM reads: plain sentences (no code-comment leftovers, sizes in words), annotations per the MCP
    ToolAnnotations, and an output schema that names the fields of each result."""
    live, _ = mcp_server
    async with Client(f"{live.url}/mcp") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    for tool in tools.values():
        texts = [tool.description or "", *_descriptions(tool.input_schema), *_descriptions(tool.output_schema)]
        for text in texts:
            assert not LEFTOVERS.search(text), (tool.name, text)
        assert tool.annotations is not None, tool.name
        hints = tool.annotations
        assert None not in (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint), tool.name
        assert hints.open_world_hint is not None, tool.name
        out = tool.output_schema
        assert out is not None and out["type"] == "object" and out.get("additionalProperties") is False, tool.name
    assert "256 KiB" in (tools["upload_content"].description or "")  # this server's message limit, in words
    assert tools["tp_resource_unmount"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert tools["resolve"].annotations.open_world_hint is True  # type: ignore[union-attr]
    for name in ("describe", "session_status"):
        assert tools[name].annotations.read_only_hint is True  # type: ignore[union-attr]
    for name in ("upload_file", "upload_content", "create_bundle", "tp_resource_notify"):
        assert tools[name].annotations.destructive_hint is False, name  # type: ignore[union-attr]
    assert {"url", "checksum", "size"} <= set(tools["describe"].output_schema["properties"])  # type: ignore[index]


async def test_argument_errors_are_our_json_error(mcp_server: tuple[LiveServer, Path]) -> None:
    """Arguments that do not fit a tool's schema come back like every other tool error: isError, our JSON body,
    code invalid_request, naming the fields; an unknown tool is not_found; a bad descriptor invalid_descriptor."""
    live, _ = mcp_server
    async with Client(f"{live.url}/mcp") as client:
        cases: list[tuple[str, dict[str, Any], str, set[str]]] = [
            ("send_chunk", {"session_id": "s", "index": -1}, "invalid_request", {"index", "data"}),
            ("upload_content", {"data": 5, "name": ""}, "invalid_request", {"data", "name"}),
            ("create_bundle", {"items": [{"role": "boss"}]}, "invalid_request", {"items.0.role"}),
            ("describe", {}, "invalid_request", {"file_id"}),
            ("no_such_tool", {}, "not_found", set()),
        ]
        for name, args, code, fields in cases:
            result = await client.call_tool(name, args)
            body = tool_error(result)
            assert body["code"] == code and body["status"] in (400, 404), (name, body)
            assert result.structured_content is None  # an error body is no result of the tool's output schema
            assert fields <= {e["field"] for e in body.get("detail", {}).get("errors", [])}, (name, body)
        bad = tool_error(await client.call_tool("resolve", {"descriptor": {"type": "url", "name": "x"}}))
        assert bad["code"] == "invalid_descriptor"


async def test_http_lists_only_tools_that_work_there(tmp_path: Path) -> None:
    """Over HTTP without TRANSFER_MCP_ROOT, tools may not touch the server's files: no upload_file, and resolve
    takes no path (both could only answer 403); resolve still returns small content."""
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})
    with running(settings) as live:
        async with Client(f"{live.url}/mcp") as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert "upload_file" not in tools and TOOLS - {"upload_file"} <= set(tools)
            resolve = tools["resolve"]
            assert set(resolve.input_schema["properties"]) == {"descriptor"}
            assert resolve.annotations is not None and resolve.annotations.read_only_hint is True
            small = structured(await client.call_tool("upload_content", {"data": "hi", "name": "h.txt"}))
            back = structured(await client.call_tool("resolve", {"descriptor": small}))
            assert back["content"] == "hi"
            refused = tool_error(await client.call_tool("resolve", {"descriptor": small, "path": "x"}))
            assert refused["code"] == "invalid_request"


async def test_upload_file_then_resolve_to_a_path_over_http(mcp_server: tuple[LiveServer, Path]) -> None:
    live, root = mcp_server
    data = os.urandom(3 << 20)  # far above what one MCP message carries here (256 KiB)
    (root / "big.bin").write_bytes(data)
    async with Client(f"{live.url}/mcp") as client:
        descriptor = structured(await client.call_tool("upload_file", {"path": "big.bin"}))
        assert descriptor["type"] == "url" and descriptor["size"] == len(data)
        assert descriptor["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
        assert "data" not in descriptor
        # the server's resolve is a server-side fetch, and loopback is refused (SSRF) unless allowed; but this is
        # the service's own signed URL: read from storage in-process, its signature checked as a download's
        copied = structured(await client.call_tool("resolve", {"descriptor": descriptor, "path": "copy.bin"}))
        assert copied["size"] == len(data) and (root / "copy.bin").read_bytes() == data
        tampered = {**descriptor, "url": descriptor["url"].replace("sig=", "sig=x")}
        bad_sig = tool_error(await client.call_tool("resolve", {"descriptor": tampered, "path": "copy2.bin"}))
        assert bad_sig["code"] == "signature_invalid" and not (root / "copy2.bin").exists()
        foreign = {**descriptor, "url": live.url + "/healthz"}  # any other URL on loopback: refused as before
        refused = tool_error(await client.call_tool("resolve", {"descriptor": foreign, "path": "copy3.bin"}))
        assert refused["code"] == "destination_refused"
        assert not (root / "copy3.bin").exists()
        # outside the root: refused, nothing written
        escape = tool_error(await client.call_tool("upload_file", {"path": "../data/x"}))
        assert escape["code"] == "forbidden"
        bad = tool_error(await client.call_tool("resolve", {"descriptor": {"type": "url", "name": "x"}}))
        assert bad["code"] == "invalid_descriptor"  # rejected by our loader, before any fetch
        missing = tool_error(await client.call_tool("describe", {"file_id": "f_" + "0" * 32}))
        assert missing["code"] == "not_found" and missing["status"] == 404


async def test_http_resolve_works_when_the_network_is_allowed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        mcp_root=root,
        fetch_allow_networks=["127.0.0.0/8"],
        inline_threshold=4096,
    )
    data = os.urandom(300_000)
    (root / "a.bin").write_bytes(data)
    with running(settings) as live:
        async with Client(f"{live.url}/mcp") as client:
            descriptor = structured(await client.call_tool("upload_file", {"path": "a.bin"}))
            out = structured(await client.call_tool("resolve", {"descriptor": descriptor, "path": "sub/b.bin"}))
            assert out["size"] == len(data)
            assert (root / "sub" / "b.bin").read_bytes() == data
            again = tool_error(await client.call_tool("resolve", {"descriptor": descriptor, "path": "sub/b.bin"}))
            assert again["code"] == "conflict"
            too_big = tool_error(await client.call_tool("resolve", {"descriptor": descriptor}))
            assert too_big["code"] == "invalid_request" and "path" in too_big["message"]


async def test_small_content_inline_and_chunked_session(mcp_server: tuple[LiveServer, Path]) -> None:
    live, _ = mcp_server
    async with Client(f"{live.url}/mcp") as client:
        small = structured(
            await client.call_tool(
                "upload_content", {"data": "hello agents", "name": "hello.txt", "content_type": "text/plain"}
            )
        )
        assert small["type"] == "inline" and base64.b64decode(small["data"]) == b"hello agents"
        back = structured(await client.call_tool("resolve", {"descriptor": small}))
        assert back == {"content": "hello agents", "content_encoding": "utf-8", "size": 12}

        big = tool_error(
            await client.call_tool(
                "upload_content",
                {"data": base64.b64encode(b"x" * (300 << 10)).decode(), "name": "x", "data_encoding": "base64"},
            )
        )
        assert big["code"] == "payload_too_large"

        payload = os.urandom(200_000)
        session = structured(
            await client.call_tool("open_session", {"name": "s.bin", "size": len(payload), "chunk_size": 65536})
        )
        sid = session["streaming_session_id"]
        assert session["total_chunks"] == 4 and session["descriptor"]["type"] == "streaming"
        for index in (3, 0, 2, 1):
            part = payload[index * 65536 : (index + 1) * 65536]
            args = {"session_id": sid, "index": index, "data": base64.b64encode(part).decode()}
            if index == 1:
                args["checksum"] = "xxh3-128:" + xxhash.xxh3_128_hexdigest(part)
            receipt = structured(await client.call_tool("send_chunk", args))
            assert receipt["size"] == len(part) and receipt["duplicate"] is False
        wrong = tool_error(
            await client.call_tool(
                "send_chunk",
                {"session_id": sid, "index": 0, "data": base64.b64encode(b"y" * 65536).decode()},
            )
        )
        assert wrong["code"] == "chunk_conflict"
        bad_sum = tool_error(
            await client.call_tool(
                "send_chunk",
                {
                    "session_id": sid,
                    "index": 0,
                    "data": base64.b64encode(payload[:65536]).decode(),
                    "checksum": "xxh3-128:" + "0" * 32,
                },
            )
        )
        assert bad_sum["code"] == "chunk_checksum_mismatch"
        status = structured(await client.call_tool("session_status", {"session_id": sid}))
        assert status["stored_count"] == 4
        final = structured(await client.call_tool("complete_session", {"session_id": sid}))
        assert final["type"] == "url" and final["checksum"] == "sha256:" + hashlib.sha256(payload).hexdigest()
        bundle = structured(
            await client.call_tool(
                "create_bundle",
                {"items": [{"role": "main", "file_id": final["metadata"]["file_id"]}], "name": "b"},
            )
        )
        assert bundle["items"][0]["content"]["checksum"] == final["checksum"]
    async with httpx.AsyncClient() as http:  # the descriptor works for a plain HTTP client
        assert (await http.get(final["url"])).content == payload


async def test_tp_tools_and_poll(mcp_server: tuple[LiveServer, Path]) -> None:
    live, _ = mcp_server
    async with Client(f"{live.url}/mcp") as client:
        small = structured(await client.call_tool("upload_content", {"data": "x" * 5000, "name": "t.txt"}))
        fid = small["metadata"]["file_id"]
        envelope = {
            "tp_version": "1.0.0",
            "message_id": str(uuid.uuid4()),
            "message_type": "resource_mount",
            "sender": "agent-a",
            "receiver": "agent-b",
            "payload": {"resource_id": fid},
        }
        reply = structured(await client.call_tool("tp_resource_mount", {"tp_envelope": envelope}))
        assert reply["payload"]["resource"]["checksum"] == small["checksum"]
        assert reply["in_reply_to"] == envelope["message_id"] and reply["receiver"] == "agent-a"
        wrong = tool_error(await client.call_tool("tp_resource_unmount", {"tp_envelope": envelope}))
        assert wrong["code"] == "invalid_request"
        note = {**envelope, "message_id": str(uuid.uuid4()), "message_type": "resource_notify"}
        note["payload"] = {"resource_id": fid, "event": "available"}
        accepted = structured(await client.call_tool("tp_resource_notify", {"tp_envelope": note}))
        assert accepted == {"correlation_id": note["message_id"]}
        polled = structured(await client.call_tool("tp_poll_messages", {"receiver": "agent-b"}))
        assert [m["message_id"] for m in polled["messages"]] == [note["message_id"]]
        assert polled["messages"][0]["trace_info"]["hop_count"] == 1
        assert polled["messages"][0]["trace_info"]["original_protocol"] == "mcp_tool_call"
        empty = structured(await client.call_tool("tp_poll_messages", {"receiver": "agent-b"}))
        assert empty == {"messages": []}


async def test_http_endpoint_needs_a_key_and_checks_scopes(tmp_path: Path) -> None:
    reader, uploader = new_token(), new_token()
    settings = Settings(
        data_dir=tmp_path / "data",
        signing_keys={"t": "0123456789abcdef0123"},
        api_keys={
            "reader": {"sha256": token_hash(reader), "scopes": ["read"]},
            "uploader": {"sha256": token_hash(uploader), "scopes": ["upload", "read"]},
        },
    )
    with running(settings) as live:
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{live.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"
        async with Client(_bearer(f"{live.url}/mcp", reader)) as client:
            denied = tool_error(await client.call_tool("upload_content", {"data": "x", "name": "x"}))
            assert denied["code"] == "insufficient_scope"
        async with Client(_bearer(f"{live.url}/mcp", uploader)) as client:
            ok = structured(await client.call_tool("upload_content", {"data": "x", "name": "x"}))
            assert ok["size"] == 1


@asynccontextmanager
async def _bearer(url: str, token: str) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport with our key on every request."""
    import httpx2

    async with (
        httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=30) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


async def test_stdio_server_with_its_own_http(tmp_path: Path) -> None:
    """`transfer mcp --serve-http` as an agent runs it: stdio for MCP, the URLs it hands out served in-process."""
    from devtools.serving import free_port

    port = free_port()
    work = tmp_path / "work"
    work.mkdir()
    data = os.urandom(2 << 20)
    (work / "in.bin").write_bytes(data)
    env = {
        **os.environ,
        "TRANSFER_DATA_DIR": str(tmp_path / "data"),
        "TRANSFER_PORT": str(port),
        "TRANSFER_SIGNING_KEYS": json.dumps({"t": "0123456789abcdef0123"}),
    }
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "transfer", "mcp", "--serve-http"], env=env, cwd=str(work)
    )
    async with Client(params) as client:
        descriptor = structured(await client.call_tool("upload_file", {"path": "in.bin"}))
        assert descriptor["url"].startswith(f"http://127.0.0.1:{port}/")
        out = structured(await client.call_tool("resolve", {"descriptor": descriptor, "path": "out/copy.bin"}))
        assert out["size"] == len(data)
    assert (work / "out" / "copy.bin").read_bytes() == data


@pytest.mark.parametrize("port_flag", [False, True])
async def test_plain_stdio_never_hands_out_a_url_nothing_serves(tmp_path: Path, port_flag: bool) -> None:
    """`transfer mcp` as an agent's config usually runs it: no flags, no public URL. The URLs it hands out are
    served by the process itself (a free port, or --port when given), for as long as the agent keeps it."""
    from devtools.serving import free_port

    work = tmp_path / "work"
    work.mkdir()
    data = os.urandom((1 << 20) + 10)  # above the inline threshold: url mode
    (work / "in.bin").write_bytes(data)
    env = {k: v for k, v in os.environ.items() if k not in ("TRANSFER_PORT", "TRANSFER_PUBLIC_URL")}
    env["TRANSFER_DATA_DIR"] = str(tmp_path / "data")
    port = free_port()
    args = ["-m", "transfer", "mcp", *(["--port", str(port)] if port_flag else [])]
    params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(work))
    async with Client(params) as client:
        descriptor = structured(await client.call_tool("upload_file", {"path": "in.bin"}))
        assert descriptor["type"] == "url"
        if port_flag:
            assert descriptor["url"].startswith(f"http://127.0.0.1:{port}/")
        async with httpx.AsyncClient() as http:
            got = await http.get(descriptor["url"])
        assert got.status_code == 200 and got.content == data


async def test_lifetimes_and_numbers_are_checked_as_on_every_door(mcp_server: tuple[LiveServer, Path]) -> None:
    """expires_in of 10^30 (an OverflowError at completion) or 10^11 (the year 5195) is refused when asked for,
    before a session reserves anything; a JSON true or 60.0 is not a number of seconds."""
    live, _ = mcp_server
    async with Client(f"{live.url}/mcp") as client:
        for seconds in (10**30, 10**11):
            opened = tool_error(
                await client.call_tool("open_session", {"name": "a.bin", "size": 5, "expires_in": seconds})
            )
            assert opened["code"] == "expires_in_too_long", opened
            stored = tool_error(
                await client.call_tool("upload_content", {"data": "hi", "name": "a.txt", "expires_in": seconds})
            )
            assert stored["code"] == "expires_in_too_long", stored
        for wrong in (True, 60.0):
            bad = tool_error(
                await client.call_tool("upload_content", {"data": "hi", "name": "a.txt", "expires_in": wrong})
            )
            assert bad["code"] == "invalid_request", bad
        bad = tool_error(await client.call_tool("open_session", {"name": "a.bin", "size": True}))
        assert bad["code"] == "invalid_request", bad


LAZY_MCP_SCRIPT = r"""
import gc, json, sys
from fastapi.testclient import TestClient
from transfer.core.auth import token_hash
from transfer.hosts import create_app
from transfer.settings import Settings

key = "k" * 40
scopes = ["upload", "read", "admin"]
settings = Settings(data_dir=sys.argv[1], api_keys={"u": {"sha256": token_hash(key), "scopes": scopes}})
app = create_app(settings)
seen = {"built": "transfer.bindings.mcp" in sys.modules}
gc.freeze()  # as transfer serve does with its start-up heap
frozen = gc.get_freeze_count()
initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
              "capabilities": {}, "clientInfo": {"name": "lazy", "version": "1"}}}
accept = {"accept": "application/json, text/event-stream"}
with TestClient(app, base_url="http://127.0.0.1:8000") as client:
    uploaded = client.post("/v1/files?name=a.txt", content=b"hello", headers={"authorization": "Bearer " + key})
    seen["served"] = [uploaded.status_code, "transfer.bindings.mcp" in sys.modules]
    refused = client.post("/mcp", json=initialize, headers=accept)
    seen["refused"] = [refused.status_code, refused.json()["error"]["code"], "transfer.bindings.mcp" in sys.modules]
    answered = client.post("/mcp", json=initialize, headers={**accept, "authorization": "Bearer " + key})
    seen["answered"] = [answered.status_code, "serverInfo" in answered.text, "transfer.bindings.mcp" in sys.modules]
    seen["frozen with the start-up heap"] = gc.get_freeze_count() > frozen
    metrics = client.get("/metrics", headers={"authorization": "Bearer " + key}).text
    seen["counted as /mcp"] = 'route="/mcp",status="200"' in metrics and 'route="/mcp",status="401"' in metrics
print(json.dumps(seen))
"""


def _run_app_script(script: str, data_dir: Path) -> Any:
    """Run ``script`` in a fresh interpreter (nothing else has imported the MCP SDK there); its last line of output,
    as JSON."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", script, str(data_dir)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_http_mcp_is_loaded_on_its_first_authenticated_call_and_stops_with_the_app(tmp_path: Path) -> None:
    """The MCP SDK is most of an idle server's heap: ``create_app`` and every other route leave it unloaded, a
    request without a key is refused before it loads, the first one with a key loads it and is answered as any
    later one (what it loaded frozen with the start-up heap, as transfer serve freezes it), and the app's lifespan ends
    (its session manager stopped) without hanging."""
    seen = _run_app_script(LAZY_MCP_SCRIPT, tmp_path / "data")
    assert seen == {
        "built": False,
        "served": [201, False],
        "refused": [401, "unauthenticated", False],
        "answered": [200, True, True],
        "frozen with the start-up heap": True,
        "counted as /mcp": True,
    }


BROKEN_MCP_SCRIPT = r"""
import importlib.abc, json, sys


class NoMcp(importlib.abc.MetaPathFinder):  # an install whose MCP SDK is missing
    def find_spec(self, name, path, target=None):
        if name == "mcp" or name.startswith("mcp."):
            raise ImportError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, NoMcp())
from fastapi.testclient import TestClient
from transfer.core.auth import token_hash
from transfer.hosts import create_app
from transfer.settings import Settings

key = "k" * 40
settings = Settings(data_dir=sys.argv[1], api_keys={"u": {"sha256": token_hash(key), "scopes": ["upload", "read"]}})
initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18",
              "capabilities": {}, "clientInfo": {"name": "broken", "version": "1"}}}
headers = {"accept": "application/json, text/event-stream", "authorization": "Bearer " + key}
seen = {}
with TestClient(create_app(settings), base_url="http://127.0.0.1:8000") as client:
    for attempt in ("first", "again"):
        r = client.post("/mcp", json=initialize, headers=headers)
        seen[attempt] = [r.status_code, r.json()["error"]["code"], "mcp" in r.json()["error"]["message"]]
    up = client.post("/v1/files?name=a.txt", content=b"hello", headers={"authorization": "Bearer " + key})
    seen["upload"] = up.status_code
print(json.dumps(seen))
"""


def test_http_mcp_without_a_working_sdk_answers_503_and_the_rest_serves_on(tmp_path: Path) -> None:
    """An install whose MCP SDK cannot be imported: ``/mcp`` answers 503 ``mcp_unavailable`` with the cause (a 500
    before), every time it is asked, and uploads go on."""
    seen = _run_app_script(BROKEN_MCP_SCRIPT, tmp_path / "data")
    assert seen == {"first": [503, "mcp_unavailable", True], "again": [503, "mcp_unavailable", True], "upload": 201}
