"""Jobs are records in storage, so any replica follows any job: two servers on one data directory (the local
backend's form of a shared bucket; the S3 form is tests/ops/test_replicas.py). The records stay bounded whatever the
upload's size: one state record and one progress record per job."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse

from tests.conftest import LiveServer, running
from tests.layout import stored_keys
from transfer.core.agents import aiflowy
from transfer.core.auth import new_token, token_hash
from transfer.settings import Settings

pytestmark = pytest.mark.anyio

MiB = 1 << 20
OWNER, OTHER = new_token(), new_token()


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[LiveServer, LiveServer]]:
    keys = {
        "owner": {"sha256": token_hash(OWNER), "scopes": ["upload", "read"]},
        "other": {"sha256": token_hash(OTHER), "scopes": ["upload", "read"]},
    }
    settings = Settings(
        data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, api_keys=keys, sse_heartbeat=0.2
    )
    with ExitStack() as stack:
        a = stack.enter_context(running(settings))
        b = stack.enter_context(running(settings))
        yield a, b


async def read_events(http: httpx.AsyncClient, url: str, **kw: Any) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    async with aconnect_sse(http, "GET", url, **kw) as source:
        assert source.response.status_code == 200
        async for sse in source.aiter_sse():
            out.append((sse.event, sse.id, aiflowy.validate(json.loads(sse.data))))
    return out


async def test_upload_on_one_server_is_followed_on_the_other(pair: tuple[LiveServer, LiveServer]) -> None:
    a, b = pair
    data = os.urandom(6 * MiB)
    sha = "sha256:" + hashlib.sha256(data).hexdigest()
    async with httpx.AsyncClient(timeout=60, headers=auth(OWNER)) as http:
        early = asyncio.create_task(read_events(http, f"{b.url}/v1/jobs/shared-job-01/events"))
        await asyncio.sleep(0.2)

        async def body() -> Any:
            for i in range(0, len(data), MiB):
                yield data[i : i + MiB]
                await asyncio.sleep(0.05)

        r = await http.post(f"{a.url}/v1/files", params={"job_id": "shared-job-01", "size": len(data)}, content=body())
        assert r.status_code == 201, r.text
        events = await asyncio.wait_for(early, 60)
        assert events[-1][0] == "done" and events[-1][1].endswith("-end")
        result = next(d for _n, _i, d in events if d["type"] == "tool_result")
        assert result["payload"]["result"]["descriptor"]["checksum"] == sha
        # a reader that comes after the end replays the same story from the records, on the other server
        late = await read_events(http, f"{b.url}/v1/jobs/shared-job-01/events")
        assert [i for _n, i, d in late if d["type"] != "progress"] == [
            i for _n, i, d in events if d["type"] != "progress"
        ]
        assert (await http.get(f"{b.url}/v1/jobs/shared-job-01", headers=auth(OTHER))).status_code == 404
    records = stored_keys(a.data_dir, "jobs/")
    assert records == ["jobs/shared-job-01/progress", "jobs/shared-job-01/state"]  # bounded: two records


async def test_import_job_ids_are_followed_anywhere_and_other_keys_get_404(
    pair: tuple[LiveServer, LiveServer],
) -> None:
    """A server-made job id (an import) that another server runs is found through its record; a failed job
    ends with its error on the other server too."""
    a, b = pair
    async with httpx.AsyncClient(timeout=60, headers=auth(OWNER)) as http:
        # a private address is refused by the import's destination policy: the job fails, on A
        stored = await http.post(f"{a.url}/v1/files", content=os.urandom(10_000), params={"inline": "false"})
        descriptor = stored.json()  # its URL is on loopback: a private address
        descriptor["url"] = descriptor["url"].split("?")[
            0
        ]  # unsigned: the service's own signed URLs are read in-process
        r = await http.post(f"{a.url}/v1/imports", json={"descriptor": descriptor})
        assert r.status_code == 202, r.text
        job = r.json()["job_id"]
        events = await read_events(http, f"{b.url}/v1/jobs/{job}/events")
        assert events[-1][0] == "error" and events[-1][2]["payload"]["code"] == "destination_refused"
        state = (await http.get(f"{b.url}/v1/jobs/{job}")).json()
        assert state["state"] == "failed" and state["error"]["code"] == "destination_refused"
        assert (await http.get(f"{b.url}/v1/jobs/{job}/events", headers=auth(OTHER))).status_code == 404
