"""Webhooks against a real receiver that verifies every delivery with the ``standardwebhooks`` library: every door's
upload gives exactly one ``file.published`` with the file's SHA-256; deletes, expiry, aborts and quota refusals one
event each; a receiver that is down, answers 500 or answers slowly gets every event once it is back; what it never
takes is dead-lettered and can be sent again; secrets rotate without a missed event; private addresses are
refused."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp import Client

from tests.agents.test_mcp import structured
from tests.conftest import Clock, running
from tests.events.conftest import Hooked, event_settings, subscribe
from tests.events.receiver import Receiver
from tests.upload_conformance import chunk_size_for, doors, file_id_of
from transfer import metrics
from transfer.core.auth import token_hash

SIZE = 200_000


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def settle(receiver: Receiver, seconds: float = 1.0) -> None:
    """Long enough for a second delivery of anything to arrive, were one sent."""
    time.sleep(seconds)


def upload(http: httpx.Client, data: bytes, name: str = "a.bin", **params: Any) -> str:
    r = http.post("/v1/files", content=data, params={"name": name, **params})
    assert r.status_code == 201, r.text
    return str(r.json()["metadata"]["file_id"])


def test_every_door_publishes_exactly_one_event_with_the_files_sha256(hooked: Hooked) -> None:
    http, receiver = hooked.http, hooked.receiver
    expected: dict[str, tuple[str, str]] = {}  # file id -> (checksum, door)

    def payload(door: str) -> bytes:
        return os.urandom(SIZE) + door.encode()

    for door in doors(chunk_size_for(http), s3=False):
        data = payload(door.name)
        opened = door.open(http, data)
        assert opened.response.status_code in (200, 201), opened.response.text
        door.send(http, opened, data)
        first = door.complete(http, opened, data)
        assert first.status_code in (200, 201, 204), first.text
        door.complete(http, opened, data)  # a second completion: the same file, no second event
        file_id = file_id_of(first)
        expected[file_id] = (sha(data), "tus" if door.name == "ietf" else door.name)

    raw = payload("post")
    expected[upload(http, raw)] = (sha(raw), "upload")
    put = payload("put")
    r = http.put("/v1/files/p.bin", content=put)
    assert r.status_code == 201, r.text
    expected[r.json()["metadata"]["file_id"]] = (sha(put), "upload")
    form = payload("multipart")
    r = http.post("/v1/files", files={"file": ("m.bin", form, "application/octet-stream")})
    assert r.status_code == 201, r.text
    expected[r.json()["metadata"]["file_id"]] = (sha(form), "upload")

    async def through_mcp() -> None:
        async with Client(f"{hooked.live.url}/mcp") as client:
            text = b"mcp content " * 100
            done = structured(await client.call_tool("upload_content", {"data": text.decode(), "name": "m.txt"}))
            expected[done["metadata"]["file_id"]] = (sha(text), "mcp")
            plan = structured(await client.call_tool("authorize_upload", {"name": "az.bin", "max_size": SIZE * 2}))
            body = payload("authorization")
            async with httpx.AsyncClient(timeout=60) as plain:
                put = await plain.put(plan["upload"]["url"], headers=plan["upload"]["headers"], content=body)
            assert put.status_code == 201, put.text
            expected[put.json()["metadata"]["file_id"]] = (sha(body), "authorization")

    anyio.run(through_mcp)

    receiver.wait(lambda r: len(r.of("file.published")) >= len(expected))
    settle(receiver)
    published = receiver.of("file.published")
    assert all(n == 1 for n in receiver.ids("file.published").values())  # one event id, delivered once
    got = {
        d.payload["data"]["file"]["id"]: (d.payload["data"]["file"]["checksum"], d.payload["data"]["door"])
        for d in published
    }
    assert got == expected
    assert receiver.forged == 0
    assert hooked.live.objects() and not [k for k in hooked.live.objects() if k.startswith("events/outbox/")]


def test_racing_deletes_give_one_event_and_the_file_record_in_it(hooked: Hooked) -> None:
    http, receiver = hooked.http, hooked.receiver
    ids = [upload(http, os.urandom(1000), name=f"d{i}.txt") for i in range(3)]
    answers: list[int] = []

    def delete(file_id: str) -> None:
        with httpx.Client(base_url=hooked.live.url, timeout=30) as own:
            answers.append(own.delete(f"/v1/files/{file_id}").status_code)

    threads = [threading.Thread(target=delete, args=(f,)) for f in ids for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [204] * 3 + [404] * 6
    receiver.wait(lambda r: len(r.of("file.deleted")) >= 3)
    settle(receiver)
    deleted = receiver.of("file.deleted")
    assert sorted(d.payload["data"]["file"]["id"] for d in deleted) == sorted(ids)
    assert len(receiver.ids("file.deleted")) == 3 and len(receiver.ids("file.published")) == 3


def test_expiry_and_abort_each_give_one_event(hooked: Hooked, clock: Clock) -> None:
    http, receiver = hooked.http, hooked.receiver
    doomed = upload(http, b"short-lived", name="e.txt", expires_in=60)
    kept = upload(http, b"kept", name="k.txt")
    created = http.post("/tus/files", headers={"tus-resumable": "1.0.0", "upload-length": "100"})
    assert created.status_code == 201, created.text
    assert http.delete(created.headers["location"], headers={"tus-resumable": "1.0.0"}).status_code == 204
    clock.advance(120)
    gc = http.post("/v1/admin/gc").json()["removed"]
    assert gc["expired_files"] == 1
    http.post("/v1/admin/gc")  # a second sweep finds nothing more to tell
    receiver.wait(lambda r: r.of("file.expired") and r.of("upload.aborted"))
    settle(receiver)
    assert [d.payload["data"]["file"]["id"] for d in receiver.of("file.expired")] == [doomed]
    assert not receiver.of("file.deleted")
    aborted = receiver.of("upload.aborted")
    assert len(aborted) == 1 and aborted[0].payload["data"]["upload_id"].startswith("t_")
    assert kept not in {d.payload["data"].get("file", {}).get("id") for d in receiver.of("file.expired")}


def test_a_receiver_down_during_50_uploads_gets_all_50_once_back(hooked: Hooked) -> None:
    http, receiver = hooked.http, hooked.receiver
    receiver.stop()
    ids = {upload(http, os.urandom(512), name=f"{i}.bin") for i in range(50)}
    time.sleep(1.0)
    assert not receiver.deliveries
    waiting = http.get("/v1/admin/events").json()
    assert waiting["waiting"] == 50, waiting
    receiver.start()  # the same port
    receiver.wait(lambda r: len(r.of("file.published")) >= 50, timeout=60)
    settle(receiver)
    assert {d.payload["data"]["file"]["id"] for d in receiver.of("file.published")} == ids
    assert all(n == 1 for n in receiver.ids().values())
    assert http.get("/v1/admin/events").json()["waiting"] == 0


def test_a_receiver_that_answers_500_or_slowly_is_retried(tmp_path: Path, receiver: Receiver) -> None:
    settings = event_settings(tmp_path, events_timeout=0.5)
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        subscribe(http, receiver)
        receiver.status = 500
        first = upload(http, b"one")
        receiver.wait(lambda r: r.attempts >= 3)
        assert not receiver.deliveries
        receiver.status, receiver.delay = 204, 1.0  # takes it, but too late: the service tries again
        second = upload(http, b"two")
        receiver.wait(lambda r: r.attempts >= 6)
        receiver.delay = 0.0
        receiver.wait(lambda r: {d.payload["data"]["file"]["id"] for d in r.of("file.published")} >= {first, second})
        settle(receiver)
        # a slow answer the service gave up on may still have been taken: the same webhook-id, deduplicated by it
        assert set(receiver.ids()) == {d.id for d in receiver.deliveries} and len(set(receiver.ids())) == 2


def test_an_event_never_taken_is_dead_lettered_and_can_be_sent_again(tmp_path: Path, receiver: Receiver) -> None:
    with (
        running(event_settings(tmp_path, events_max_age=1.0)) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        sub = subscribe(http, receiver)
        receiver.status = 500
        file_id = upload(http, b"never taken")
        deadline = time.monotonic() + 30
        while not (dead := http.get("/v1/admin/events/dead").json()["events"]):
            assert time.monotonic() < deadline, "never dead-lettered"
            time.sleep(0.1)
        [letter] = dead
        assert letter["type"] == "file.published" and letter["data"]["file"]["id"] == file_id
        assert letter["failed"][sub["id"]]["last_error"] == "HTTP 500"
        assert http.get("/v1/admin/events").json()["waiting"] == 0
        receiver.status = 204
        retried = http.post(f"/v1/admin/events/dead/{letter['id']}/retry")
        assert retried.status_code == 202, retried.text
        receiver.wait(lambda r: len(r.deliveries) == 1)
        assert receiver.deliveries[0].id == letter["id"]
        assert http.get("/v1/admin/events/dead").json()["events"] == []
        assert http.post(f"/v1/admin/events/dead/{letter['id']}/retry").json()["error"]["code"] == "not_found"


def test_a_rotated_secret_signs_beside_the_new_one_until_retired(hooked: Hooked) -> None:
    http, receiver, sub = hooked.http, hooked.receiver, hooked.subscription
    old = receiver.secrets[0]
    rotated = http.post(f"/v1/admin/subscriptions/{sub['id']}/rotate", json={"grace": 3600})
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["secret"]
    assert new != old and len(rotated.json()["secrets"]) == 2
    for count, secret in enumerate((new, old), start=1):  # a receiver that knows either verifies every delivery
        receiver.secrets = [secret]
        upload(http, secret.encode())
        receiver.wait(lambda r, count=count: len(r.deliveries) == count)
    assert receiver.forged == 0
    retired = http.post(f"/v1/admin/subscriptions/{sub['id']}/rotate", json={"grace": 0}).json()
    receiver.secrets = [old]  # retired by now: its signatures are gone
    upload(http, b"after retirement")
    receiver.wait(lambda r: r.forged >= 1)
    receiver.secrets = [retired["secret"]]
    receiver.wait(lambda r: len(r.deliveries) == 3)


def test_subscriptions_to_private_addresses_are_refused(tmp_path: Path) -> None:
    settings = event_settings(tmp_path, hooks_allow_networks=[])
    with running(settings) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        for url in (
            "http://127.0.0.1:9/x",
            "http://localhost/x",
            "http://169.254.169.254/latest/meta-data",
            "http://10.0.0.1/x",
            "http://[::ffff:127.0.0.1]/x",
            "http://[64:ff9b::a9fe:a9fe]/x",
        ):
            r = http.post("/v1/admin/subscriptions", json={"url": url})
            assert (r.status_code, r.json()["error"]["code"]) == (403, "destination_refused"), (url, r.text)
        for url in ("ftp://example.com/x", "not a url", "http://user:pw@example.com/"):
            r = http.post("/v1/admin/subscriptions", json={"url": url})
            assert r.status_code in (400, 403), (url, r.text)
        r = http.post("/v1/admin/subscriptions", json={"url": "https://example.com/x", "types": ["file.nope"]})
        assert r.json()["error"]["code"] == "invalid_request"
        assert http.get("/v1/admin/subscriptions").json()["subscriptions"] == []


def test_subscriptions_take_only_their_types_and_keys(tmp_path: Path) -> None:
    alice, bob, admin = (
        "tk_alice_0123456789abcdef0123456789",
        "tk_bob_0123456789abcdef0123456789ab",
        "tk_admin_0123456789abcdef012345678",
    )
    keys = {
        "alice": {"sha256": token_hash(alice), "scopes": ["upload", "read"]},
        "bob": {"sha256": token_hash(bob), "scopes": ["upload", "read"], "max_bytes": 1000},
        "admin": {"sha256": token_hash(admin), "scopes": ["admin"]},
    }
    everything, alices, deletions = Receiver().start(), Receiver().start(), Receiver().start()
    try:
        with running(event_settings(tmp_path, api_keys=keys)) as live, ExitStack() as clients:
            a, b, root = (
                clients.enter_context(
                    httpx.Client(base_url=live.url, timeout=30, headers={"authorization": f"Bearer {t}"})
                )
                for t in (alice, bob, admin)
            )
            subscribe(root, everything)
            subscribe(root, alices, owners=["alice"])
            subscribe(root, deletions, types=["file.deleted"])
            assert a.post("/v1/admin/subscriptions", json={"url": everything.url}).status_code == 403
            mine = upload(a, b"alice's")
            upload(b, b"bob's")
            refused = b.post("/v1/files", content=b"x" * 2000, params={"name": "big"})
            assert refused.json()["error"]["code"] == "quota_exceeded"
            assert root.delete(f"/v1/files/{mine}").status_code == 204  # deletes are the admin's
            everything.wait(lambda r: len(r.deliveries) == 4)
            alices.wait(lambda r: len(r.deliveries) == 2)
            deletions.wait(lambda r: len(r.deliveries) == 1)
            settle(everything)
            kinds = sorted(
                (d.payload["type"], d.payload["data"].get("owner") or d.payload["data"]["file"]["owner"])
                for d in everything.deliveries
            )
            assert kinds == [
                ("file.deleted", "alice"),
                ("file.published", "alice"),
                ("file.published", "bob"),
                ("quota.exceeded", "bob"),
            ]
            quota = everything.of("quota.exceeded")[0].payload["data"]
            assert quota["door"] == "upload" and quota["owner"] == "bob"
            assert {d.payload["type"] for d in alices.deliveries} == {"file.published", "file.deleted"}
            assert deletions.deliveries[0].payload["data"]["file"]["id"] == mine
    finally:
        for r in (everything, alices, deletions):
            r.stop()


def test_above_the_outbox_limit_events_are_dropped_and_counted(tmp_path: Path, receiver: Receiver) -> None:
    def dropped() -> float:
        return sum(s.value for m in metrics.events_dropped.collect() for s in m.samples if s.name.endswith("_total"))

    before = dropped()
    with (
        running(event_settings(tmp_path, events_outbox_limit=5)) as live,
        httpx.Client(base_url=live.url, timeout=30) as http,
    ):
        subscribe(http, receiver)
        receiver.stop()
        for i in range(12):
            upload(http, os.urandom(100), name=f"{i}")
        time.sleep(0.5)
        assert http.get("/v1/admin/events").json()["waiting"] == 5
        assert dropped() - before == 7
        receiver.start()
        receiver.wait(lambda r: len(r.deliveries) == 5)
        settle(receiver)
        assert len(receiver.deliveries) == 5


def test_events_off_answer_events_disabled(tmp_path: Path) -> None:
    with running(event_settings(tmp_path, events=False)) as live, httpx.Client(base_url=live.url, timeout=30) as http:
        upload(http, b"no events")
        for method, path in (
            ("GET", "/v1/events"),
            ("GET", "/v1/admin/subscriptions"),
            ("GET", "/v1/admin/events/dead"),
        ):
            r = http.request(method, path)
            assert (r.status_code, r.json()["error"]["code"]) == (404, "events_disabled")
        assert not [k for k in live.objects() if k.startswith("events/")]
