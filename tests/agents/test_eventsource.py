"""Job progress streams as a WHATWG EventSource sees them, driven by Node's `eventsource` package (installed here
with npm from tests/node/eventsource/package-lock.json on first use) against a real server.

An EventSource reconnects by itself whenever a stream closes; only a non-200 answer (204 by convention) makes it
stop. So after the terminal event (``done``, or ``error`` of a failed job) the reconnect must get 204, and nothing
may follow the terminal event on any connection."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, running
from transfer.core.agents import aiflowy
from transfer.settings import Settings

NODE_DIR = Path(__file__).parent.parent / "node" / "eventsource"
# a bound on a hung follower only (one that kept reconnecting would never exit): not a timing assertion
HANG_GUARD = 60


@pytest.fixture(scope="session")
def follow_script() -> Path:
    """tests/node/eventsource/follow.mjs, with its locked `eventsource` installed (npm ci on a fresh checkout)."""
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        pytest.fail("node and npm are needed to drive the eventsource package (Debian: apt-get install nodejs npm)")
    if not (NODE_DIR / "node_modules" / "eventsource" / "package.json").is_file():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=600)
    return NODE_DIR / "follow.mjs"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, sse_heartbeat=0.5)
    with running(settings) as server:
        yield server


@dataclass
class Follower:
    """One `node follow.mjs` process: what it printed, line by line."""

    process: subprocess.Popen[str]
    lines: list[dict[str, Any]] = field(default_factory=list)

    def wait_open(self) -> None:
        """Block until the first connection is open (the server then holds the waiting job)."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"the follower ended before opening: {self.process.stderr and self.process.stderr.read()}"
        self.lines.append(json.loads(line))
        assert self.lines[-1] == {"open": True}

    def finish(self) -> list[dict[str, Any]]:
        try:
            out, err = self.process.communicate(timeout=HANG_GUARD)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, err = self.process.communicate()
            pytest.fail(f"EventSource never stopped (it kept reconnecting or hung); it saw: {self.lines}{out}")
        assert self.process.returncode == 0, err
        self.lines += [json.loads(line) for line in out.splitlines() if line.strip()]
        return self.lines

    @property
    def events(self) -> list[dict[str, Any]]:
        return [line for line in self.lines if "event" in line]


def follow(script: Path, url: str, last_event_id: str | None = None) -> Follower:
    args = ["node", str(script), url] + ([last_event_id] if last_event_id is not None else [])
    return Follower(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


def test_eventsource_stops_after_done_and_sees_nothing_more(follow_script: Path, live: LiveServer) -> None:
    job_id = "es-done-0001"
    follower = follow(follow_script, f"{live.url}/v1/jobs/{job_id}/events")
    follower.wait_open()
    data = os.urandom(3 << 20)
    r = httpx.post(f"{live.url}/v1/files", params={"job_id": job_id, "name": "a.bin"}, content=data, timeout=30)
    assert r.status_code == 201 and r.json()["checksum"] == "sha256:" + hashlib.sha256(data).hexdigest()
    lines = follower.finish()
    events = follower.events
    assert [e["event"] for e in events][-1] == "done" and [e["event"] for e in events].count("done") == 1
    assert "error" not in [e["event"] for e in events]
    assert events[-1]["id"] == f"{len(events) - 1}-end" and [e["id"] for e in events[:-1]] == [
        str(i) for i in range(len(events) - 1)
    ]
    # the stream closed after done; EventSource reconnected with the terminal id, got 204 and stopped for good
    assert lines[-1] == {"closed": True, "status": 204}
    assert [line for line in lines if "open" in line] == [{"open": True}]


def test_eventsource_stops_after_a_terminal_error(follow_script: Path, live: LiveServer) -> None:
    job_id = "es-error-0001"
    follower = follow(follow_script, f"{live.url}/v1/jobs/{job_id}/events")
    follower.wait_open()
    bad = {"job_id": job_id, "checksum": "sha256:" + "0" * 64}
    r = httpx.post(f"{live.url}/v1/files", params=bad, content=os.urandom(200_000), timeout=30)
    assert r.status_code == 422
    lines = follower.finish()
    names = [e["event"] for e in follower.events]
    # before: the reconnect after `error` was sent the failed job's `end` and `done`, then hung on keep-alives
    assert names[-1] == "error" and names.count("error") == 1 and "done" not in names
    assert follower.events[-1]["type"] == "error" and follower.events[-1]["id"].endswith("-end")
    assert lines[-1] == {"closed": True, "status": 204}


@pytest.mark.parametrize("outcome", ["done", "error"])
def test_eventsource_opened_after_the_end_replays_once_then_stops(
    follow_script: Path, live: LiveServer, outcome: str
) -> None:
    job_id = f"es-late-{outcome}-01"
    params = {"job_id": job_id} | ({"size": "5"} if outcome == "error" else {})
    r = httpx.post(f"{live.url}/v1/files", params=params, content=b"0123456789", timeout=30)
    assert r.status_code == (201 if outcome == "done" else 422)
    follower = follow(follow_script, f"{live.url}/v1/jobs/{job_id}/events")
    lines = follower.finish()
    names = [e["event"] for e in follower.events]
    assert names[-1] == outcome and names.count(outcome) == 1 and names.count("done") <= 1
    assert names[0] == "message" and follower.events[0]["type"] == "status"
    assert lines[-1] == {"closed": True, "status": 204}
    assert [line for line in lines if "open" in line] == [{"open": True}]


def test_eventsource_resuming_at_the_plain_index_of_the_end_stops_at_once(
    follow_script: Path, live: LiveServer
) -> None:
    job_id = "es-resume-0001"
    assert httpx.post(f"{live.url}/v1/files", params={"job_id": job_id}, content=b"x" * 100).status_code == 201
    done_index = _terminal_index(live, job_id)
    follower = follow(follow_script, f"{live.url}/v1/jobs/{job_id}/events", str(done_index))
    assert follower.finish() == [{"closed": True, "status": 204}]


def _terminal_index(live: LiveServer, job_id: str) -> int:
    with httpx.stream("GET", f"{live.url}/v1/jobs/{job_id}/events", timeout=30) as response:
        ids = [line[4:] for line in response.iter_lines() if line.startswith("id: ")]
    assert ids[-1].endswith("-end")
    return int(ids[-1].removesuffix("-end"))


@pytest.mark.parametrize("header", ["7-end", "end", "0-end"])
def test_a_reconnect_with_a_terminal_id_is_204_without_a_lookup(live: LiveServer, header: str) -> None:
    # on any replica, after the job is forgotten, and for an id nobody knows: the client saw the end; stop it
    for job_id in ("forgotten-job-01", f"j_{'0' * 32}"):
        r = httpx.get(f"{live.url}/v1/jobs/{job_id}/events", headers={"last-event-id": header})
        assert r.status_code == 204 and r.content == b""
        q = httpx.get(f"{live.url}/v1/jobs/{job_id}/events", params={"last_event_id": header.strip()})
        assert q.status_code == 204


@pytest.mark.parametrize("header", ["7-done", "x-end", "-end", "7-end-end", "99999999999999999999-end"])
def test_ids_the_stream_never_sent_are_refused(live: LiveServer, header: str) -> None:
    r = httpx.get(f"{live.url}/v1/jobs/some-job-0001/events", headers={"last-event-id": header})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"


def test_event_ids_round_trip() -> None:
    assert [aiflowy.event_id(e, 3) for e in ("message", "error", "done")] == ["3", "3-end", "3-end"]
    assert aiflowy.event_id("error", None) == "end" and aiflowy.event_id("message", None) is None
    for event in aiflowy.SSE_EVENTS:
        sent = aiflowy.event_id(event, 12)
        assert sent is not None
        assert aiflowy.parse_last_event_id(sent) == (12, event in aiflowy.TERMINAL_EVENTS)
    assert aiflowy.parse_last_event_id("-1") == (-1, False)
