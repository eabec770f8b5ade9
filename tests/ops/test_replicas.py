"""Two ``transfer serve`` processes (A and B) on one Ceph bucket, each on its own RADOS Gateway of the session's
cluster, behind a round-robin proxy on loopback: what one replica starts, the other continues, on an engine whose
compare-and-set is atomic (no TRANSFER_SINGLE_REPLICA here). An upload through A is followed through B (the AIFlowy
SSE stream, with the same event ids and ``Last-Event-ID`` resume); tus PATCHes and chunk PUTs alternate between A
and B; sessions complete on B; racing deletes through both refund once; every SHA-256 is checked on the bytes
downloaded back. Another key gets 404 on either replica. (Three replicas behind HAProxy: ``test_replicas_ceph.py``.)"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import xxhash
from httpx_sse import aconnect_sse

from benchmarks.replicas import serve_unpinned
from devtools.ceph import CephCluster
from devtools.s3server import s3_client
from tests.rrproxy import RoundRobinProxy
from transfer.core.agents import aiflowy
from transfer.core.auth import new_token, token_hash

pytestmark = [pytest.mark.s3, pytest.mark.ceph, pytest.mark.slow, pytest.mark.e2e]

MiB = 1 << 20
CHUNK = 5 * MiB  # the smallest part S3 composes
OWNER, OTHER, ADMIN, RACER = new_token(), new_token(), new_token(), new_token()
TUS = {"tus-resumable": "1.0.0"}


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@dataclass
class Replicas:
    a: str
    b: str
    proxy: RoundRobinProxy


@pytest.fixture(scope="module")
def replicas(ceph: CephCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """A and B for the whole module (the tests use their own ids and keys), on the session's one cluster."""
    root = tmp_path_factory.mktemp("replicas")
    bucket = f"replicas-{uuid.uuid4().hex[:12]}"
    s3_client(ceph.endpoint).create_bucket(Bucket=bucket)
    keys = {
        "owner": {"sha256": token_hash(OWNER), "scopes": ["upload", "read"]},
        "other": {"sha256": token_hash(OTHER), "scopes": ["upload", "read"]},
        "racer": {"sha256": token_hash(RACER), "scopes": ["upload", "read"]},
        "admin": {"sha256": token_hash(ADMIN), "scopes": ["admin"]},
    }
    with ExitStack() as stack:
        proxy = stack.enter_context(RoundRobinProxy([]))
        urls = []
        for i, name in enumerate(("a", "b")):
            gateway = ceph.gateways[i % len(ceph.gateways)]  # A and B on different gateways
            env = {
                **os.environ,
                "TRANSFER_STORAGE": "s3",
                "TRANSFER_S3_BUCKET": bucket,
                "TRANSFER_S3_ENDPOINT_URL": gateway.url,
                "TRANSFER_S3_ADDRESSING_STYLE": "path",
                "TRANSFER_S3_PART_SIZE": str(5 * MiB),
                "TRANSFER_SINGLE_REPLICA": "false",  # the engine's compare-and-set makes replicas safe
                "AWS_ACCESS_KEY_ID": gateway.access_key,
                "AWS_SECRET_ACCESS_KEY": gateway.secret_key,
                "AWS_REGION": gateway.region,
                "TRANSFER_PUBLIC_URL": proxy.url,  # descriptors point at the balancer, as in a deployment
                "TRANSFER_SIGNING_KEYS": json.dumps({"t": "0123456789abcdef0123"}),
                "TRANSFER_API_KEYS": json.dumps(keys),
                "TRANSFER_ALLOWED_HOSTS": json.dumps(["127.0.0.1"]),
            }
            workdir = root / name
            workdir.mkdir()
            url, _pid = stack.enter_context(serve_unpinned(workdir, env))  # two minutes to start under load
            urls.append(url)
        proxy.backends.extend((u.hostname or "", u.port or 0) for u in map(urlsplit, urls))
        yield Replicas(urls[0], urls[1], proxy)


async def read_events(http: httpx.AsyncClient, url: str, **kw: Any) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    async with aconnect_sse(http, "GET", url, **kw) as source:
        assert source.response.status_code == 200, await source.response.aread()
        async for sse in source.aiter_sse():
            out.append((sse.event, sse.id, aiflowy.validate(json.loads(sse.data))))
    return out


def one_connection_per_request() -> httpx.Client:
    """Through the proxy, each request on its own connection: consecutive requests alternate between A and B."""
    return httpx.Client(timeout=120, limits=httpx.Limits(max_keepalive_connections=0))


@pytest.mark.anyio
async def test_an_upload_through_a_is_followed_through_b(replicas: Replicas) -> None:
    data = os.urandom(8 * MiB + 17)
    sha = "sha256:" + hashlib.sha256(data).hexdigest()
    job = "replica-job-0001"
    async with httpx.AsyncClient(timeout=120, headers=auth(OWNER)) as http:
        follower = asyncio.create_task(read_events(http, f"{replicas.b}/v1/jobs/{job}/events"))
        await asyncio.sleep(0.3)  # not required: a reader that comes later replays the same records

        async def body() -> Any:
            for i in range(0, len(data), MiB):
                yield data[i : i + MiB]
                await asyncio.sleep(0.1)  # an upload that lasts, so that B sees it running

        r = await http.post(
            f"{replicas.a}/v1/files", params={"job_id": job, "size": len(data), "name": "r.bin"}, content=body()
        )
        assert r.status_code == 201, r.text
        assert r.json()["checksum"] == sha
        events = await asyncio.wait_for(follower, 120)

        kinds = [(name, doc["domain"], doc["type"]) for name, _id, doc in events]
        assert kinds[0] == ("message", "workflow", "status") and events[0][2]["payload"]["state"] == "start"
        assert kinds[-1] == ("done", "system", "done") and events[-1][1].endswith("-end")
        indexes = [doc["index"] for _name, _id, doc in events]
        assert indexes == sorted(set(indexes))  # in order, none twice
        result = next(doc for _n, _i, doc in events if doc["type"] == "tool_result")
        assert result["payload"]["result"]["descriptor"]["checksum"] == sha
        assert events[-1][2]["meta"]["bytes"] == len(data)

        # A, which ran it, tells the same story with the same ids (B may have missed progress between two looks)
        on_a = await read_events(http, f"{replicas.a}/v1/jobs/{job}/events")
        assert {i for _n, i, _d in events} <= {i for _n, i, _d in on_a}
        assert [i for n, i, d in on_a if d["type"] != "progress"] == [
            i for n, i, d in events if d["type"] != "progress"
        ]

        # resume on B after the result: only what follows; after the terminal id: 204 (EventSource stops)
        result_id = next(i for _n, i, d in events if d["type"] == "tool_result")
        rest = await read_events(http, f"{replicas.b}/v1/jobs/{job}/events", headers={"last-event-id": result_id})
        assert [i for _n, i, _d in rest] == [i for _n, i, _d in events][
            [i for _n, i, _d in events].index(result_id) + 1 :
        ]
        end = await http.get(f"{replicas.b}/v1/jobs/{job}/events", headers={"last-event-id": events[-1][1]})
        assert end.status_code == 204
        state = (await http.get(f"{replicas.b}/v1/jobs/{job}")).json()
        assert state["state"] == "completed" and state["result"]["descriptor"]["checksum"] == sha

        # another key: not found on either replica, whether the job runs there or not
        for base in (replicas.a, replicas.b):
            other = await http.get(f"{base}/v1/jobs/{job}", headers=auth(OTHER))
            assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
            stream = await http.get(f"{base}/v1/jobs/{job}/events", headers=auth(OTHER))
            assert stream.status_code == 404

        # the descriptor's URL goes through the balancer, to either replica
        url = result["payload"]["result"]["descriptor"]["url"]
        for _ in range(2):
            got = await http.get(url)
            assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == sha.removeprefix("sha256:")


def test_chunk_puts_alternate_between_replicas_and_complete_on_b(replicas: Replicas) -> None:
    data = os.urandom(3 * CHUNK + 4321)
    sha = "sha256:" + hashlib.sha256(data).hexdigest()
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    with one_connection_per_request() as http:
        http.headers.update(auth(OWNER))
        r = http.post(
            f"{replicas.proxy.url}/v1/sessions",
            json={"name": "s.bin", "size": len(data), "chunk_size": CHUNK, "checksum": sha},
        )
        assert r.status_code == 201, r.text
        sid = r.json()["streaming_session_id"]
        first = len(replicas.proxy.routed)
        for index, piece in enumerate(pieces):
            checksum = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(piece)}
            put = http.put(f"{replicas.proxy.url}/v1/sessions/{sid}/chunks/{index}", content=piece, headers=checksum)
            assert put.status_code == 201, put.text
        assert set(replicas.proxy.routed[first:]) == {0, 1}  # both replicas took chunks
        status = http.get(f"{replicas.proxy.url}/v1/sessions/{sid}").json()
        assert status["missing"] == [] and status["bytes_received"] == len(data)
        assert http.get(f"{replicas.a}/v1/sessions/{sid}", headers=auth(OTHER)).status_code == 404
        done = http.post(f"{replicas.b}/v1/sessions/{sid}/complete", json={})
        assert done.status_code == 200, done.text
        descriptor = done.json()
        assert descriptor["checksum"] == sha
        got = http.get(descriptor["url"])
        assert hashlib.sha256(got.content).hexdigest() == sha.removeprefix("sha256:")


def test_tus_patches_alternate_between_replicas(replicas: Replicas) -> None:
    data = os.urandom(3 * MiB + 5)
    sha = hashlib.sha256(data).hexdigest()
    with one_connection_per_request() as http:
        http.headers.update(auth(OWNER))
        name = base64.b64encode(b"t.bin").decode()
        r = http.post(
            f"{replicas.proxy.url}/tus/files/",
            headers={**TUS, "upload-length": str(len(data)), "upload-metadata": f"filename {name}"},
        )
        assert r.status_code == 201, r.text
        location = r.headers["location"]
        path = urlsplit(location).path
        first = len(replicas.proxy.routed)
        offset = 0
        while offset < len(data):
            head = http.head(f"{replicas.proxy.url}{path}", headers=TUS)
            assert head.status_code == 200 and int(head.headers["upload-offset"]) == offset
            piece = data[offset : offset + MiB]
            patch = http.patch(
                f"{replicas.proxy.url}{path}",
                content=piece,
                headers={**TUS, "upload-offset": str(offset), "content-type": "application/offset+octet-stream"},
            )
            assert patch.status_code == 204, patch.text
            offset += len(piece)
            assert int(patch.headers["upload-offset"]) == offset
        assert set(replicas.proxy.routed[first:]) == {0, 1}
        assert http.head(f"{replicas.a}{path}", headers={**TUS, **auth(OTHER)}).status_code == 404
        descriptor = http.get(f"{replicas.b}{path}", headers={"accept": "application/json"}).json()
        assert descriptor["checksum"] == f"sha256:{sha}"
        got = http.get(descriptor["url"])
        assert hashlib.sha256(got.content).hexdigest() == sha


def test_racing_deletes_through_both_replicas_refund_once(replicas: Replicas) -> None:
    """Eight DELETEs of one file through A and B at once: one 204, seven 404, one refund (the claim in the usage
    record is a compare-and-set both replicas take part in)."""
    with httpx.Client(timeout=60) as http:
        kept = http.post(f"{replicas.a}/v1/files", content=os.urandom(MiB // 2), headers=auth(RACER))
        assert kept.status_code == 201, kept.text
        for _ in range(5):
            r = http.post(f"{replicas.b}/v1/files", content=os.urandom(MiB), headers=auth(RACER))
            assert r.status_code == 201, r.text
            doomed = r.json()["metadata"]["file_id"]

            def delete(i: int, doomed: str = doomed) -> int:
                base = (replicas.a, replicas.b)[i % 2]
                with httpx.Client(timeout=60) as one:
                    return one.delete(f"{base}/v1/files/{doomed}", headers=auth(ADMIN)).status_code

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                codes = sorted(pool.map(delete, range(8)))
            assert codes == [204] + [404] * 7, codes
            used = http.get(f"{replicas.a}/v1/usage", headers=auth(RACER)).json()
            assert used["bytes_used"] == MiB // 2 and used["files"] == 1
