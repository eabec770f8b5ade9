"""Events on several ``transfer serve`` processes sharing one local data directory (local storage's
compare-and-set holds across processes, as S3's does across replicas): three replicas sweeping the same expired
files at once, and deleting the same files at once, send one event per change; a replica killed with SIGKILL
between the publications and their delivery loses none of them: another process delivers them."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from benchmarks.replicas import serve_unpinned
from tests.events.receiver import Receiver


def replica_env(data_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TRANSFER_DATA_DIR": str(data_dir),
        "TRANSFER_SIGNING_KEYS": json.dumps({"t": "0123456789abcdef0123"}),
        "TRANSFER_SINGLE_REPLICA": "false",
        "TRANSFER_EVENTS": "true",
        "TRANSFER_HOOKS_ALLOW_NETWORKS": json.dumps(["127.0.0.0/8"]),
        "TRANSFER_EVENTS_SCAN_INTERVAL": "0.2",
        "TRANSFER_EVENTS_RETRY_BASE": "0.1",
        "TRANSFER_EVENTS_RETRY_MAX": "0.5",
        "TRANSFER_SESSION_GC_INTERVAL": "3600",  # the test runs the sweeps, on every replica at once
    }


@contextmanager
def replicas(tmp_path: Path, count: int) -> Iterator[list[tuple[str, int]]]:
    data = tmp_path / "data"
    with ExitStack() as stack:
        out = []
        for i in range(count):
            workdir = tmp_path / f"r{i}"
            workdir.mkdir()
            out.append(stack.enter_context(serve_unpinned(workdir, replica_env(data))))
        yield out


def at_once(calls: list[tuple[str, str, str]]) -> list[int]:
    """``(method, url, path)`` requests sent together from threads; their statuses."""
    statuses: list[int] = []
    barrier = threading.Barrier(len(calls))

    def one(method: str, url: str, path: str) -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            barrier.wait()
            statuses.append(http.request(method, path).status_code)

    threads = [threading.Thread(target=one, args=call) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def test_three_replicas_sweeping_and_deleting_at_once_send_one_event_per_change(
    tmp_path: Path, receiver: Receiver
) -> None:
    with replicas(tmp_path, 3) as urls:
        a = urls[0][0]
        with httpx.Client(base_url=a, timeout=60) as http:
            made = http.post("/v1/admin/subscriptions", json={"url": receiver.url})
            assert made.status_code == 201, made.text
            receiver.secrets.append(made.json()["secret"])
            short = [
                http.post("/v1/files", content=os.urandom(300), params={"name": f"e{i}", "expires_in": 1}).json()
                for i in range(8)
            ]
            kept = [http.post("/v1/files", content=os.urandom(300), params={"name": f"k{i}"}).json() for i in range(6)]
        expiring = {d["metadata"]["file_id"] for d in short}
        doomed = [d["metadata"]["file_id"] for d in kept]
        time.sleep(2.5)  # past their expiry on every replica's clock
        at_once([("POST", url, "/v1/admin/gc") for url, _ in urls])
        deletes = at_once([("DELETE", url, f"/v1/files/{f}") for f in doomed for url, _ in urls])
        assert sorted(deletes) == [204] * len(doomed) + [404] * (2 * len(doomed))
        receiver.wait(lambda r: len(r.of("file.expired")) >= 8 and len(r.of("file.deleted")) >= 6, timeout=60)
        time.sleep(1.5)  # any second delivery would have come by now
        assert {d.payload["data"]["file"]["id"] for d in receiver.of("file.expired")} == expiring
        assert {d.payload["data"]["file"]["id"] for d in receiver.of("file.deleted")} == set(doomed)
        assert len(receiver.of("file.published")) == 14
        assert all(n == 1 for n in receiver.ids().values()), receiver.ids().most_common(3)


def test_a_replica_killed_between_publication_and_delivery_loses_nothing(tmp_path: Path, receiver: Receiver) -> None:
    receiver.stop()  # nothing is delivered before the kill
    with replicas(tmp_path, 1) as [(url, pid)]:
        with httpx.Client(base_url=url, timeout=60) as http:
            made = http.post("/v1/admin/subscriptions", json={"url": receiver.url})
            receiver.secrets.append(made.json()["secret"])
            ids = {
                http.post("/v1/files", content=os.urandom(500), params={"name": f"{i}"}).json()["metadata"]["file_id"]
                for i in range(20)
            }
            assert http.get("/v1/admin/events").json()["waiting"] == 20
        os.kill(pid, signal.SIGKILL)
    receiver.start()
    with replicas_on(tmp_path, "after"):
        receiver.wait(lambda r: len(r.of("file.published")) >= 20, timeout=60)
        time.sleep(1.0)
    assert {d.payload["data"]["file"]["id"] for d in receiver.of("file.published")} == ids
    assert all(n == 1 for n in receiver.ids().values())


@contextmanager
def replicas_on(tmp_path: Path, name: str) -> Iterator[tuple[str, int]]:
    """One more replica on the data directory of :func:`replicas` under ``tmp_path``."""
    workdir = tmp_path / name
    workdir.mkdir()
    with serve_unpinned(workdir, replica_env(tmp_path / "data")) as served:
        yield served
