"""The official a2a-sdk client (its card resolver, client factory and JSON-RPC transports, over HTTP to a real
server on loopback) exchanges files with the service: a 20 MiB file as inline bytes and as a URL part, the task's
signed URL downloaded and its SHA-256 compared, GetTask from the same and from another replica, another key's
task-not-found, A2A 0.3's message/send, and a failed message leaving nothing stored."""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, A2AClientError, Client, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError
from google.protobuf import json_format

from tests.conftest import Clock, LiveServer, running
from transfer.core.agents.a2a_protocol import decode_inline
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

pytestmark = pytest.mark.anyio

TOKENS = {name: new_token() for name in ("alice", "bob")}
MIB = 1 << 20


def settings_for(tmp_path: Path, **extra: Any) -> Settings:
    keys = {
        name: {"sha256": token_hash(token), "scopes": ["upload", "read"], "tp_identities": [f"fay:{name}"]}
        for name, token in TOKENS.items()
    }
    return Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys, **extra)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Settings that put the service on local storage, or on the S3 test server (task records included)."""
    if request.param == "s3":
        request.getfixturevalue("s3_env")  # TRANSFER_STORAGE=s3 and friends in the environment
        return {"storage": "s3"}
    return {}


@asynccontextmanager
async def a2a_client(url: str, token: str | None, *, version: str = "1.0") -> AsyncIterator[tuple[Client, Any]]:
    """An a2a-sdk client built the way its docs say: resolve the card, let the factory pick the transport (JSON-RPC,
    the interface of ``version``), the API key on every request."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=120) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        chosen = [i for i in card.supported_interfaces if i.protocol_version == version]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(chosen)
        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
        yield client, card


def file_message(*parts: pb.Part) -> pb.SendMessageRequest:
    message = pb.Message(message_id=str(uuid.uuid4()), role=pb.ROLE_USER, parts=list(parts))
    message.parts.insert(0, pb.Part(text="please store these"))  # words for agents: not stored
    return pb.SendMessageRequest(message=message)


async def send(client: Client, request: pb.SendMessageRequest) -> pb.Task:
    events = [event async for event in client.send_message(request)]
    assert len(events) == 1 and events[0].HasField("task"), events
    return events[0].task


def file_url(task: pb.Task) -> tuple[str, dict[str, Any]]:
    (artifact,) = task.artifacts
    (part,) = artifact.parts
    assert part.WhichOneof("content") == "url"
    return part.url, json_format.MessageToDict(part.metadata)


async def download_sha256(url: str) -> str:
    digest = hashlib.sha256()
    async with httpx.AsyncClient(timeout=120) as http, http.stream("GET", url) as response:  # signed: no key
        assert response.status_code == 200
        async for piece in response.aiter_bytes():
            digest.update(piece)
    return digest.hexdigest()


def stored_files(live: LiveServer, token: str) -> list[str]:
    answer = httpx.get(f"{live.url}/v1/files", headers={"authorization": f"Bearer {token}"})
    assert answer.status_code == 200
    return [f["metadata"]["file_id"] for f in answer.json()["files"]]


async def test_sdk_sends_20_mib_inline_downloads_it_and_only_its_key_gets_the_task(
    tmp_path: Path, backend: dict[str, Any]
) -> None:
    # 20 MiB of bytes are ~27 MiB of base64 in the JSON-RPC body: over the default cap (16 MiB), so the operator
    # raises TRANSFER_MAX_JSON_BODY, as the card says
    settings = settings_for(tmp_path, max_json_body=32 * MIB, **backend)
    data = os.urandom(20 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    with running(settings) as live:
        async with a2a_client(live.url, TOKENS["alice"]) as (client, card):
            assert "bearer" in card.security_schemes
            assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
            assert str(32 * MIB) in card.description and "TRANSFER_MAX_JSON_BODY" in card.description
            part = pb.Part(raw=data, filename="weights.bin", media_type="application/octet-stream")
            task = await send(client, file_message(part))
            assert task.status.state == pb.TASK_STATE_COMPLETED
            url, metadata = file_url(task)
            assert metadata["size"] == len(data) and metadata["sha256"] == sha
            assert metadata["synapse"]["checksum"] == f"sha256:{sha}"
            assert task.artifacts[0].parts[0].filename == "weights.bin"
            assert await download_sha256(url) == sha

            again = await client.get_task(pb.GetTaskRequest(id=task.id))
            assert again.id == task.id and again.context_id == task.context_id
            assert again.artifacts[0].artifact_id == task.artifacts[0].artifact_id
            assert await download_sha256(file_url(again)[0]) == sha  # a freshly signed URL, same bytes

        async with a2a_client(live.url, TOKENS["bob"]) as (other, _):
            with pytest.raises(TaskNotFoundError):
                await other.get_task(pb.GetTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                await other.get_task(pb.GetTaskRequest(id="t_" + "0" * 32))  # the same answer as for no task
        async with a2a_client(live.url, None) as (anonymous, _):
            with pytest.raises(A2AClientError, match="401"):
                await anonymous.get_task(pb.GetTaskRequest(id=task.id))

    with running(settings) as replica:  # another process on the same storage: the task record is there
        async with a2a_client(replica.url, TOKENS["alice"]) as (client, _):
            assert (await client.get_task(pb.GetTaskRequest(id=task.id))).id == task.id


async def test_sdk_sends_a_url_part_fetched_through_the_ssrf_guard(tmp_path: Path) -> None:
    data = os.urandom(20 * MIB)
    sha = hashlib.sha256(data).hexdigest()
    allowed = settings_for(tmp_path, fetch_allow_networks=["127.0.0.0/8"])
    with running(allowed) as live:
        uploaded = httpx.post(
            f"{live.url}/v1/files?name=big.bin", content=data, headers={"authorization": f"Bearer {TOKENS['alice']}"}
        ).json()
        async with a2a_client(live.url, TOKENS["alice"]) as (client, _):
            task = await send(client, file_message(pb.Part(url=uploaded["url"], filename="copy.bin")))
            url, metadata = file_url(task)
            assert metadata["size"] == len(data) and metadata["sha256"] == sha
            assert await download_sha256(url) == sha
            assert task.artifacts[0].artifact_id != uploaded["metadata"]["file_id"]  # a new file of the caller

    refused = settings_for(tmp_path / "default")  # loopback is not fetched unless allowed
    with running(refused) as live:
        before = stored_files(live, TOKENS["alice"])
        async with a2a_client(live.url, TOKENS["alice"]) as (client, _):
            link = f"{live.url}/v1/files/f_{'0' * 32}/content"
            with pytest.raises(InvalidParamsError) as caught:
                await send(client, file_message(pb.Part(url=link)))
            assert caught.value.data is not None and caught.value.data["code"] == "destination_refused"
        assert stored_files(live, TOKENS["alice"]) == before
        # the service's own signed URL on loopback is not a server-side fetch: read from storage, its signature
        # checked as a download's (a tampered one is refused as a download would refuse it)
        small = os.urandom(2 * MIB)  # above the inline threshold: the answer is a url descriptor
        own = httpx.post(
            f"{live.url}/v1/files?name=own.bin", content=small, headers={"authorization": f"Bearer {TOKENS['alice']}"}
        ).json()
        async with a2a_client(live.url, TOKENS["alice"]) as (client, _):
            task = await send(client, file_message(pb.Part(url=own["url"], filename="own-copy.bin")))
            url, metadata = file_url(task)
            assert metadata["sha256"] == hashlib.sha256(small).hexdigest()
            assert await download_sha256(url) == hashlib.sha256(small).hexdigest()
            with pytest.raises(A2AClientError, match="-32041: signature does not match"):  # access denied
                await send(client, file_message(pb.Part(url=own["url"].replace("sig=", "sig=x"))))


async def test_a_failed_part_leaves_nothing_stored(tmp_path: Path) -> None:
    with running(settings_for(tmp_path)) as live:
        async with a2a_client(live.url, TOKENS["alice"]) as (client, _):
            good = pb.Part(raw=b"first file", filename="a.txt")
            bad = pb.Part(raw=b"second file", filename="b.txt")
            bad.metadata.update({"synapse": {"checksum": "sha256:" + "0" * 64}})  # declared, and wrong
            with pytest.raises(InvalidParamsError) as caught:
                await send(client, file_message(good, bad))
            assert caught.value.data is not None and caught.value.data["code"] == "checksum_mismatch"
            with pytest.raises(InvalidParamsError, match="no file part"):
                await send(client, pb.SendMessageRequest(message=pb.Message(message_id="m", parts=[])))
        assert stored_files(live, TOKENS["alice"]) == []
        assert live.leftovers() == []


async def test_inline_bytes_over_the_json_cap_are_refused_before_parsing(tmp_path: Path) -> None:
    with running(settings_for(tmp_path, max_json_body=1 * MIB)) as live:
        async with a2a_client(live.url, TOKENS["alice"]) as (client, card):
            assert str(1 * MIB) in card.description
            with pytest.raises(A2AClientError, match="413"):
                await send(client, file_message(pb.Part(raw=os.urandom(MIB), filename="big.bin")))
        assert stored_files(live, TOKENS["alice"]) == []


async def test_sdk_speaking_a2a_0_3_uses_message_send_and_tasks_get(tmp_path: Path) -> None:
    data = os.urandom(300_000)
    with running(settings_for(tmp_path)) as live:
        async with a2a_client(live.url, TOKENS["alice"], version="0.3") as (client, _):
            task = await send(client, file_message(pb.Part(raw=data, filename="v03.bin")))
            assert task.status.state == pb.TASK_STATE_COMPLETED
            url, metadata = file_url(task)
            assert metadata["size"] == len(data)
            assert await download_sha256(url) == hashlib.sha256(data).hexdigest()
            assert (await client.get_task(pb.GetTaskRequest(id=task.id))).id == task.id
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(pb.CancelTaskRequest(id=task.id))


async def test_methods_the_card_does_not_offer_get_a2a_codes_and_tp_methods_still_work(tmp_path: Path) -> None:
    with running(settings_for(tmp_path)) as live:
        async with a2a_client(live.url, TOKENS["alice"]) as (client, card):
            assert not card.capabilities.streaming and not card.capabilities.push_notifications
            with pytest.raises(UnsupportedOperationError):
                await client.list_tasks(pb.ListTasksRequest())
            with pytest.raises(TaskNotFoundError):  # as tasks/get says: an unknown task is not found (-32001)
                await client.cancel_task(pb.CancelTaskRequest(id="t_" + "0" * 32))
        auth = {"authorization": f"Bearer {TOKENS['alice']}"}
        raw = base64.b64encode(b"hello").decode()
        envelope = {
            "tp_version": "1.0.0",
            "message_id": "m-1",
            "message_type": "resource_mount",
            "sender": "fay:alice",
            "payload": {
                "resource": {
                    "type": "inline",
                    "content_type": "text/plain",
                    "encoding": "base64",
                    "name": "hello.txt",
                    "data": raw,
                    "size": 5,
                }
            },
        }
        batch = [
            {"jsonrpc": "2.0", "id": 1, "method": "tp.resource.mount", "params": {"tp_envelope": envelope}},
            {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": "t_" + "1" * 32}},
            {"jsonrpc": "2.0", "id": 3, "method": "NoSuchMethod"},
        ]
        answers = {a["id"]: a for a in httpx.post(f"{live.url}/a2a", json=batch, headers=auth).json()}
        assert "tp_envelope" in answers[1]["result"], answers[1]
        assert answers[2]["error"]["code"] == -32001
        assert answers[3]["error"]["code"] == -32601
        plain = httpx.post(f"{live.url}/a2a", json=batch[1], headers={**auth, "a2a-version": "9.9"}).json()
        assert plain["error"]["code"] == -32009


def rpc(method: str, params: Any, rid: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}


def message(*parts: Any, **extra: Any) -> dict[str, Any]:
    return {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": list(parts), **extra}}


RAW = base64.b64encode(b"bytes").decode()
HOSTILE: list[tuple[str, dict[str, Any], int, str]] = [
    ("no params", rpc("SendMessage", None), -32602, "invalid_request"),
    ("message not an object", rpc("SendMessage", {"message": []}), -32602, "invalid_request"),
    ("no messageId", rpc("SendMessage", {"message": {"parts": [{"raw": RAW}]}}), -32602, "invalid_request"),
    ("messageId too long", rpc("SendMessage", {"message": {"messageId": "m" * 300}}), -32602, "invalid_request"),
    ("parts not a list", rpc("SendMessage", message() | {"message": {"messageId": "m", "parts": {}}}), -32602, ""),
    ("a part not an object", rpc("SendMessage", message("raw")), -32602, "invalid_request"),
    ("only text", rpc("SendMessage", message({"text": "hi"})), -32602, "invalid_request"),
    ("raw and url at once", rpc("SendMessage", message({"raw": RAW, "url": "https://x.example/a"})), -32602, ""),
    ("raw not a string", rpc("SendMessage", message({"raw": 12})), -32602, "invalid_request"),
    ("raw not base64", rpc("SendMessage", message({"raw": "*not base64*"})), -32602, "invalid_request"),
    ("raw of bad length", rpc("SendMessage", message({"raw": "QUJDR"})), -32602, "invalid_request"),
    ("filename not a string", rpc("SendMessage", message({"raw": RAW, "filename": ["a"]})), -32602, ""),
    ("bad media type", rpc("SendMessage", message({"raw": RAW, "mediaType": "text/plain\r\nx: y"})), -32602, ""),
    ("file: URL", rpc("SendMessage", message({"url": "file:///etc/passwd"})), -32602, "invalid_request"),
    ("ftp: URL", rpc("message/send", message({"kind": "file", "file": {"uri": "ftp://x/y"}})), -32602, ""),
    ("0.3 file without content", rpc("message/send", message({"kind": "file", "file": {}})), -32602, ""),
    ("metadata endpoint", rpc("SendMessage", message({"url": "http://169.254.169.254/latest"})), -32602, ""),
    ("too many parts", rpc("SendMessage", message(*[{"raw": RAW}] * 65)), -32602, "invalid_request"),
    (
        "bad declared checksum",
        rpc("SendMessage", message({"raw": RAW, "metadata": {"synapse": {"checksum": "x"}}})),
        -32602,
        "",
    ),
    (
        "wrong declared size",
        rpc("SendMessage", message({"raw": RAW, "metadata": {"synapse": {"size": 9}}})),
        -32602,
        "size_mismatch",
    ),
    ("unknown taskId", rpc("SendMessage", message({"raw": RAW}, taskId="t_" + "2" * 32)), -32001, "task_not_found"),
    ("taskId as a path", rpc("GetTask", {"id": "../../files/f_" + "0" * 32}), -32001, "task_not_found"),
    ("task id not a string", rpc("GetTask", {"id": 7}), -32602, "invalid_request"),
    ("task id too long", rpc("tasks/get", {"id": "t" * 10_000}), -32001, "task_not_found"),
    ("streaming", rpc("SendStreamingMessage", message({"raw": RAW})), -32004, ""),
    ("push config", rpc("tasks/pushNotificationConfig/set", {}), -32003, ""),
    ("extended card", rpc("GetExtendedAgentCard", {}), -32007, ""),
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with running(settings_for(tmp_path_factory.mktemp("a2a"), max_upload_size=1 << 20)) as live:
        yield live


@pytest.mark.parametrize(("case", "call", "code", "error_code"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_a2a_calls_get_a2a_errors_and_store_nothing(
    shared: LiveServer, case: str, call: dict[str, Any], code: int, error_code: str
) -> None:
    answer = httpx.post(f"{shared.url}/a2a", json=call, headers={"authorization": f"Bearer {TOKENS['bob']}"})
    assert answer.status_code == 200, answer.text
    error = answer.json()["error"]
    assert error["code"] == code, error
    (info,) = error["data"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" and isinstance(info["metadata"]["code"], str)
    if error_code:
        assert info["metadata"]["code"] == error_code, error
    assert stored_files(shared, TOKENS["bob"]) == []
    assert shared.leftovers() == []


def test_scopes_and_ownership_on_a2a_methods(tmp_path: Path) -> None:
    reader, uploader = new_token(), new_token()
    settings = settings_for(tmp_path, max_upload_size=1 << 20)
    assert settings.api_keys is not None
    settings.api_keys["reader"] = {"sha256": token_hash(reader), "scopes": ["read"]}
    settings.api_keys["uploader"] = {"sha256": token_hash(uploader), "scopes": ["upload"]}
    big = base64.b64encode(os.urandom((1 << 20) + 1)).decode()
    with running(settings) as live:

        def call(token: str, body: dict[str, Any]) -> dict[str, Any]:
            answer = httpx.post(f"{live.url}/a2a", json=body, headers={"authorization": f"Bearer {token}"})
            assert answer.status_code == 200, answer.text
            result: dict[str, Any] = answer.json()
            return result

        task = call(TOKENS["alice"], rpc("SendMessage", message({"raw": RAW, "filename": "a.txt"})))["result"]["task"]
        assert call(reader, rpc("SendMessage", message({"raw": RAW})))["error"]["code"] == -32041
        assert call(uploader, rpc("GetTask", {"id": task["id"]}))["error"]["code"] == -32041
        assert call(reader, rpc("GetTask", {"id": task["id"]}))["error"]["code"] == -32001  # not the reader's
        own = call(TOKENS["alice"], rpc("SendMessage", message({"raw": RAW}, taskId=task["id"])))
        assert own["error"]["code"] == -32004  # completed tasks take no further messages
        other = call(TOKENS["bob"], rpc("SendMessage", message({"raw": RAW}, taskId=task["id"])))
        assert other["error"]["code"] == -32001
        too_big = call(TOKENS["bob"], rpc("SendMessage", message({"raw": big})))["error"]
        assert too_big["data"][0]["metadata"]["code"] == "payload_too_large"
        assert stored_files(live, TOKENS["bob"]) == []
        gone = call(TOKENS["alice"], rpc("tasks/get", {"id": task["id"]}))["result"]
        assert gone["kind"] == "task" and gone["status"]["state"] == "completed"


@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
@pytest.mark.parametrize("padded", [True, False])
def test_inline_bytes_are_read_in_every_form_proto3_json_allows(encode: Any, padded: bool) -> None:
    data = bytes(range(256)) * 3 + b"\xfb\xff"  # both alphabets differ on these: '+/' vs '-_'
    text = encode(data).decode()
    assert decode_inline(text if padded else text.rstrip("=")) == data


def test_an_open_service_publishes_a_card_without_a_security_scheme(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"})
    with running(settings) as live:
        card = httpx.get(f"{live.url}/.well-known/agent-card.json").json()
        assert "securitySchemes" not in card and "securityRequirements" not in card
        assert {i["url"] for i in card["supportedInterfaces"]} == {f"{live.url}/a2a"}
        assert httpx.get(f"{live.url}/.well-known/agent.json").json() == card


async def test_a_task_whose_file_expired_is_still_its_task(tmp_path: Path, clock: Clock) -> None:
    """Expiry on every door: GetTask after a task's file expired (swept or not) answers the task without that file,
    as after a delete; no URL to it, and no error for the whole task."""
    with running(settings_for(tmp_path, default_file_ttl=60, session_gc_interval=3600), clock) as live:
        async with a2a_client(live.url, TOKENS["alice"]) as (client, _):
            task = await send(client, file_message(pb.Part(raw=os.urandom(2000), filename="brief.bin")))
            assert len(task.artifacts) == 1
            clock.advance(60)
            again = await client.get_task(pb.GetTaskRequest(id=task.id))
            assert again.id == task.id and len(again.artifacts) == 0
