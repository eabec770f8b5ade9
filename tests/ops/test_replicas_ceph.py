"""Three ``transfer serve`` replicas on one Ceph bucket behind HAProxy (round robin, no stickiness), the two RADOS
Gateways of the test cluster shared between them: what one replica starts, the next continues, on an engine whose
compare-and-set is real (no replica runs with TRANSFER_SINGLE_REPLICA here). Every test runs on Ceph 16.2 and 20.2.

Every upload protocol with consecutive requests on different replicas (HAProxy names the replica that answered in
``x-served-by``), concurrent writers to one upload (exactly one wins), a replica SIGKILLed in the middle of a request
and the upload resumed on another, a quota held exactly under concurrent uploads on all replicas, a job followed
from another replica, sweeps on every replica at once, and a direct plan's corrupt part: refused by Ceph 20.2 as it
is sent, stored unchecked by Ceph 16.2 and refused there by the read-back.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import xxhash

from benchmarks.replicas import serve_unpinned as replica  # one way to start a replica, shared
from devtools.ceph import CephCluster
from devtools.s3server import free_ports, s3_client
from transfer.core.auth import new_token, token_hash

pytestmark = [pytest.mark.s3, pytest.mark.ceph, pytest.mark.slow, pytest.mark.e2e]

MiB = 1 << 20
CHUNK = 5 * MiB
OWNER, QUOTA, ADMIN = new_token(), new_token(), new_token()
QUOTA_BYTES = 10 * MiB
TUS = {"tus-resumable": "1.0.0"}
REPLICAS = 3


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@dataclass
class Fleet:
    """The replicas (direct URLs, pids, work dirs), the balancer in front, the bucket behind."""

    urls: list[str]
    pids: list[int]
    workdirs: list[Path]
    balancer: str
    bucket: str
    cluster: CephCluster

    def http(self, token: str = OWNER) -> httpx.Client:
        """A client through the balancer, one connection per request (HAProxy balances each request anyway)."""
        return httpx.Client(
            base_url=self.balancer,
            timeout=120,
            headers=auth(token),
            limits=httpx.Limits(max_keepalive_connections=0),
        )


def haproxy_config(port: int, backends: list[str]) -> str:
    servers = "\n".join(
        f"    server r{i} {urlsplit(url).netloc} check inter 300ms fall 3 rise 1" for i, url in enumerate(backends)
    )
    return f"""global
    maxconn 512

defaults
    mode http
    timeout connect 2s
    timeout check 2s
    timeout client 120s
    timeout server 120s
    retries 2
    option redispatch

frontend api
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    http-response set-header x-served-by %s
{servers}
"""


@pytest.fixture(scope="module")
def fleet(ceph: CephCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    bucket = f"fleet-{uuid.uuid4().hex[:12]}"
    s3_client(ceph.endpoint).create_bucket(Bucket=bucket)
    keys = {
        "owner": {"sha256": token_hash(OWNER), "scopes": ["upload", "read"]},
        "quota": {"sha256": token_hash(QUOTA), "scopes": ["upload", "read"], "max_bytes": QUOTA_BYTES},
        "admin": {"sha256": token_hash(ADMIN), "scopes": ["admin"]},
    }
    ports = free_ports(1)
    balancer = f"http://127.0.0.1:{ports[0]}"
    with ExitStack() as stack:
        starting = []
        for i in range(REPLICAS):
            gateway = ceph.gateways[i % len(ceph.gateways)]
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
                "TRANSFER_PUBLIC_URL": balancer,
                "TRANSFER_SIGNING_KEYS": json.dumps({"t": "0123456789abcdef0123"}),
                "TRANSFER_API_KEYS": json.dumps(keys),
                "TRANSFER_ALLOWED_HOSTS": json.dumps(["127.0.0.1"]),
                "TRANSFER_SESSION_GC_INTERVAL": "0.5",
            }
            workdir = root / f"r{i}"
            workdir.mkdir()
            starting.append((workdir, replica(workdir, env)))
        # started side by side (each `transfer serve` imports, probes its engine and loads its keys)
        with ThreadPoolExecutor(REPLICAS) as pool:
            futures = [pool.submit(cm.__enter__) for _, cm in starting]
            for (_, cm), future in zip(starting, futures, strict=True):
                with contextlib.suppress(Exception):
                    future.result()
                    stack.push(cm.__exit__)
            started = [future.result() for future in futures]
        urls = [url for url, _ in started]
        pids = [pid for _, pid in started]
        workdirs = [workdir for workdir, _ in starting]
        balancer_url = stack.enter_context(_haproxy_on(root, urls, ports[0]))
        yield Fleet(urls, pids, workdirs, balancer_url, bucket, ceph)


@contextmanager
def _haproxy_on(root: Path, urls: list[str], port: int) -> Iterator[str]:
    binary = shutil.which("haproxy")
    if binary is None:
        pytest.skip("HAProxy is not installed (`make install` installs Debian's haproxy)")
    conf = root / "haproxy.cfg"
    conf.write_text(haproxy_config(port, urls))
    log = open(root / "haproxy.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([binary, "-db", "-f", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while sum(_served_by(url) is not None for _ in range(REPLICAS)) < REPLICAS:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("haproxy did not start: " + (root / "haproxy.log").read_text())
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _served_by(url: str) -> str | None:
    try:
        return httpx.get(url + "/healthz", timeout=1).headers.get("x-served-by")
    except httpx.TransportError:
        return None


def served(responses: list[httpx.Response]) -> list[str]:
    return [r.headers.get("x-served-by", "?") for r in responses]


def consecutive_on_different_replicas(responses: list[httpx.Response]) -> None:
    by = served(responses)
    assert len(set(by)) >= 2, by
    assert all(a != b for a, b in zip(by, by[1:], strict=False)), by  # round robin: never the same twice in a row


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_back(http: httpx.Client, descriptor: dict[str, Any], data: bytes) -> None:
    got = http.get(descriptor["url"])
    assert got.status_code == 200 and hashlib.sha256(got.content).digest() == hashlib.sha256(data).digest()


# --- every upload protocol, request after request on different replicas -------------------------------------------


def test_tus_across_replicas(fleet: Fleet) -> None:
    data = os.urandom(3 * MiB + 5)
    with fleet.http() as http:
        name = base64.b64encode(b"t.bin").decode()
        created = http.post(
            "/tus/files/", headers={**TUS, "upload-length": str(len(data)), "upload-metadata": f"filename {name}"}
        )
        assert created.status_code == 201, created.text
        path = urlsplit(created.headers["location"]).path
        answers = [created]
        offset = 0
        while offset < len(data):
            head = http.head(path, headers=TUS)
            assert head.status_code == 200 and int(head.headers["upload-offset"]) == offset
            piece = data[offset : offset + MiB]
            patch = http.patch(
                path,
                content=piece,
                headers={**TUS, "upload-offset": str(offset), "content-type": "application/offset+octet-stream"},
            )
            assert patch.status_code == 204, patch.text
            answers += [head, patch]
            offset += len(piece)
        descriptor = http.get(path, headers={"accept": "application/json"})
        answers.append(descriptor)
        consecutive_on_different_replicas(answers)
        assert descriptor.json()["checksum"] == sha(data)
        read_back(http, descriptor.json(), data)


def test_ietf_resumable_across_replicas(fleet: Fleet) -> None:
    data = os.urandom(2 * MiB + 11)
    with fleet.http() as http:
        created = http.post(
            "/v1/uploads", headers={"upload-complete": "?0", "upload-length": str(len(data))}, content=data[:MiB]
        )
        assert created.status_code == 201, created.text
        path = urlsplit(created.headers["location"]).path
        answers = [created]
        offset = MiB
        while offset < len(data):
            head = http.head(path)
            assert int(head.headers["upload-offset"]) == offset
            piece = data[offset : offset + MiB]
            last = offset + len(piece) == len(data)
            patch = http.patch(
                path,
                content=piece,
                headers={
                    "upload-offset": str(offset),
                    "upload-complete": "?1" if last else "?0",
                    "content-type": "application/partial-upload",
                },
            )
            assert patch.status_code == (201 if last else 204), patch.text
            answers += [head, patch]
            offset += len(piece)
        consecutive_on_different_replicas(answers)
        assert answers[-1].json()["checksum"] == sha(data)
        read_back(http, answers[-1].json(), data)


def test_chunked_session_across_replicas(fleet: Fleet) -> None:
    data = os.urandom(3 * CHUNK + 4321)
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    with fleet.http() as http:
        opened = http.post(
            "/v1/sessions", json={"name": "s.bin", "size": len(data), "chunk_size": CHUNK, "checksum": sha(data)}
        )
        assert opened.status_code == 201, opened.text
        sid = opened.json()["streaming_session_id"]
        answers = [opened]
        for index, piece in enumerate(pieces):
            checksum = {"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(piece)}
            put = http.put(f"/v1/sessions/{sid}/chunks/{index}", content=piece, headers=checksum)
            assert put.status_code == 201, put.text
            answers.append(put)
        status = http.get(f"/v1/sessions/{sid}")
        assert status.json()["missing"] == [] and status.json()["bytes_received"] == len(data)
        done = http.post(f"/v1/sessions/{sid}/complete", json={})
        assert done.status_code == 200, done.text
        consecutive_on_different_replicas([*answers, status, done])
        assert done.json()["checksum"] == sha(data)
        read_back(http, done.json(), data)


def put_direct_part(http: httpx.Client, pid: str, number: int, data: bytes, declared: bytes | None = None) -> Any:
    """Ask (through the balancer) for part ``number``'s URL for ``declared`` bytes, then PUT ``data`` to it."""
    digest = hashlib.sha256(declared if declared is not None else data).hexdigest()
    r = http.post(f"/v1/direct/{pid}/parts", json={"parts": [{"number": number, "sha256": digest}]})
    assert r.status_code == 200, r.text
    target = r.json()["parts"][0]
    headers = dict(target["headers"])
    return r, httpx.put(target["url"], content=data, headers=headers, timeout=60)


def test_direct_plan_across_replicas(fleet: Fleet) -> None:
    data = os.urandom(2 * CHUNK + 99)
    with fleet.http() as http:
        plan = http.post("/v1/direct", json={"size": len(data), "checksum": sha(data).removeprefix("sha256:")})
        assert plan.status_code == 201, plan.text
        pid, ps = plan.json()["id"], plan.json()["part_size"]
        answers = [plan]
        for number in range(1, plan.json()["part_count"] + 1):
            asked, put = put_direct_part(http, pid, number, data[(number - 1) * ps : number * ps])
            assert put.status_code == 200, put.text
            answers.append(asked)
        done = http.post(f"/v1/direct/{pid}/complete", json={})
        assert done.status_code == 200, done.text
        consecutive_on_different_replicas([*answers, done])
        assert done.json()["checksum"] == sha(data)
        read_back(http, done.json(), data)


def test_direct_plan_never_publishes_wrong_bytes(fleet: Fleet) -> None:
    """A part whose bytes do not match its signed x-amz-checksum-sha256. Ceph 20.2 refuses it as it is sent (400
    BadDigest, as AWS does): the part stays missing, and the right bytes sent again complete the plan. Ceph 16.2
    stores it: the service's read-back at completion is what refuses the plan, and nothing is published."""
    data = os.urandom(CHUNK + 7)
    corrupt = data[:CHUNK][:100] + bytes([data[100] ^ 1]) + data[101:CHUNK]
    with fleet.http() as http:
        plan = http.post("/v1/direct", json={"size": len(data), "checksum": sha(data).removeprefix("sha256:")})
        pid = plan.json()["id"]
        _, put = put_direct_part(http, pid, 1, corrupt, declared=data[:CHUNK])
        _, second = put_direct_part(http, pid, 2, data[CHUNK:])
        assert second.status_code == 200
        if fleet.cluster.release == "20.2":
            assert put.status_code == 400 and "<Code>BadDigest</Code>" in put.text, put.text
            assert http.get(f"/v1/direct/{pid}").json()["missing"] == [1]
            _, put = put_direct_part(http, pid, 1, data[:CHUNK])
            assert put.status_code == 200, put.text
            done = http.post(f"/v1/direct/{pid}/complete", json={})
            assert done.status_code == 200 and done.json()["checksum"] == sha(data), done.text
            read_back(http, done.json(), data)
            return
        assert put.status_code == 200, put.text  # the engine took it: it does not check the part's checksum
        done = http.post(f"/v1/direct/{pid}/complete", json={})
        assert done.status_code == 422 and done.json()["error"]["code"] == "checksum_mismatch", done.text
        assert http.get("/v1/files").json()["files"] == [] or all(
            f["checksum"] != sha(data) for f in http.get("/v1/files").json()["files"]
        )


@pytest.mark.anyio
async def test_mcp_authorisation_across_replicas(fleet: Fleet) -> None:
    """authorize_upload on one replica, the PUT to the bucket, confirm_upload on the next, authorize_download on the
    third: each MCP session is held by one replica, the authorisation is a record in the bucket."""
    from mcp import Client

    from tests.agents.test_mcp import _bearer, structured

    size = 6 * MiB
    data = os.urandom(size)
    async with Client(_bearer(f"{fleet.urls[0]}/mcp", OWNER)) as first:
        plan = structured(await first.call_tool("authorize_upload", {"name": "m.bin", "size": size}))
    async with httpx.AsyncClient(timeout=120) as http:
        put = await http.put(plan["upload"]["url"], headers=plan["upload"]["headers"], content=data)
        assert put.status_code == 200, put.text
    async with Client(_bearer(f"{fleet.urls[1]}/mcp", OWNER)) as second:
        confirmed = structured(await second.call_tool("confirm_upload", {"authorization_id": plan["authorization_id"]}))
    assert confirmed["checksum"] == sha(data)
    async with Client(_bearer(f"{fleet.urls[2]}/mcp", OWNER)) as third:
        fetch = structured(await third.call_tool("authorize_download", {"file_id": confirmed["metadata"]["file_id"]}))
    assert hashlib.sha256(httpx.get(fetch["download"]["url"], timeout=120).content).hexdigest() == sha(data)[7:]


# --- concurrent writers to one upload -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_tus_patches_at_one_offset_one_wins(fleet: Fleet) -> None:
    data = os.urandom(2 * MiB)
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=fleet.balancer, timeout=120, headers=auth(OWNER), limits=limits) as http:
        created = await http.post("/tus/files/", headers={**TUS, "upload-length": str(len(data))})
        path = urlsplit(created.headers["location"]).path
        bodies = [bytes([i]) * MiB for i in range(REPLICAS)]
        patches = await asyncio.gather(
            *(
                http.patch(
                    path,
                    content=body,
                    headers={**TUS, "upload-offset": "0", "content-type": "application/offset+octet-stream"},
                )
                for body in bodies
            )
        )
        codes = sorted(p.status_code for p in patches)
        assert codes.count(204) == 1 and all(c == 409 for c in codes if c != 204), [
            (p.status_code, p.text) for p in patches
        ]
        assert len(set(served(list(patches)))) >= 2
        winner = bodies[[p.status_code for p in patches].index(204)]
        head = await http.head(path, headers=TUS)
        assert head.headers["upload-offset"] == str(MiB)
        last = await http.patch(
            path,
            content=data[MiB:],
            headers={**TUS, "upload-offset": str(MiB), "content-type": "application/offset+octet-stream"},
        )
        assert last.status_code == 204, last.text
        descriptor = (await http.get(path, headers={"accept": "application/json"})).json()
        assert descriptor["checksum"] == sha(winner + data[MiB:])


@pytest.mark.anyio
async def test_concurrent_writers_of_one_chunk_one_wins(fleet: Fleet) -> None:
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=fleet.balancer, timeout=120, headers=auth(OWNER), limits=limits) as http:
        opened = await http.post("/v1/sessions", json={"size": 2 * CHUNK, "chunk_size": CHUNK})
        sid = opened.json()["streaming_session_id"]
        bodies = [bytes([i + 1]) * CHUNK for i in range(REPLICAS)]
        puts = await asyncio.gather(
            *(
                http.put(
                    f"/v1/sessions/{sid}/chunks/0",
                    content=body,
                    headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(body)},
                )
                for body in bodies
            )
        )
        codes = [p.status_code for p in puts]
        assert codes.count(201) == 1 and all(c == 409 for c in codes if c != 201), [
            (p.status_code, p.text) for p in puts
        ]
        winner = bodies[codes.index(201)]
        tail = b"t" * CHUNK
        put = await http.put(
            f"/v1/sessions/{sid}/chunks/1",
            content=tail,
            headers={"chunk-checksum": "xxh3-128:" + xxhash.xxh3_128_hexdigest(tail)},
        )
        assert put.status_code == 201, put.text
        done = await http.post(f"/v1/sessions/{sid}/complete", json={})
        assert done.status_code == 200, done.text
        assert done.json()["checksum"] == sha(winner + tail)


# --- quotas and jobs over all replicas ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_quota_is_exact_under_concurrent_uploads_on_every_replica(fleet: Fleet) -> None:
    size = 2 * MiB
    attempts = 8  # 16 MiB asked of a 10 MiB quota: five fit
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=fleet.balancer, timeout=120, headers=auth(QUOTA), limits=limits) as http:

        async def upload() -> httpx.Response:
            """As a client does: a 409 version_conflict (a record changed under the request) or a 503 record_busy
            (a record kept changing past the retry policy) is sent again."""
            for _ in range(10):
                r = await http.post("/v1/files", params={"size": size}, content=os.urandom(size))
                if r.status_code not in (409, 503):
                    return r
            return r

        answers = await asyncio.gather(*(upload() for _ in range(attempts)))
        codes = [a.status_code for a in answers]
        assert set(codes) <= {201, 413}, [(a.status_code, a.text) for a in answers]
        stored = codes.count(201)
        assert stored == QUOTA_BYTES // size, codes
        assert len(set(served(list(answers)))) >= 2  # spread by the balancer (a replica slow to answer its health
        # check on a loaded machine may sit a round out)
        usages = [(await http.get(f"{url}/v1/usage")).json() for url in fleet.urls]
    assert all(u == usages[0] for u in usages), usages  # the same on every replica
    assert usages[0]["bytes_used"] == stored * size, usages[0]


@pytest.mark.anyio
async def test_a_job_is_followed_from_another_replica(fleet: Fleet) -> None:
    from httpx_sse import aconnect_sse

    data = os.urandom(4 * MiB)
    job = f"fleet-job-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(timeout=120, headers=auth(OWNER)) as http:

        async def follow(base: str) -> list[Any]:
            async with aconnect_sse(http, "GET", f"{base}/v1/jobs/{job}/events") as source:
                return [json.loads(sse.data) async for sse in source.aiter_sse()]

        followers = [asyncio.create_task(follow(url)) for url in fleet.urls[1:]]

        async def body() -> Any:
            for i in range(0, len(data), MiB):
                yield data[i : i + MiB]
                await asyncio.sleep(0.1)

        r = await http.post(f"{fleet.urls[0]}/v1/files", params={"job_id": job, "size": len(data)}, content=body())
        assert r.status_code == 201, r.text
        for events in await asyncio.wait_for(asyncio.gather(*followers), 120):
            assert events[-1]["type"] == "done"
            result = next(e for e in events if e["type"] == "tool_result")
            assert result["payload"]["result"]["descriptor"]["checksum"] == sha(data)


# --- faults -------------------------------------------------------------------------------------------------------


def test_sweeps_run_on_every_replica_at_once_without_errors(fleet: Fleet) -> None:
    """Every replica sweeps every 0.5 s (expired sessions, uploads, plans, authorisations): an expired session is
    removed once, and no sweep on any replica fails while they race over the same records."""
    with fleet.http() as http:
        sid = http.post("/v1/sessions", json={"size": 10, "chunk_size": CHUNK, "ttl": 1}).json()["streaming_session_id"]
        deadline = time.monotonic() + 30
        while http.get(f"/v1/sessions/{sid}").json().get("state") not in ("expired", None):
            assert time.monotonic() < deadline, "the session was never swept"
            time.sleep(0.3)
        for url in fleet.urls:
            metrics = httpx.get(f"{url}/metrics", headers=auth(ADMIN)).text
            ran = re.findall(r'transfer_sweeps_total\{outcome="(\w+)",sweep="(\w+)"\} (\d+)', metrics)
            ran += [
                (o, s, n)
                for s, o, n in re.findall(r'transfer_sweeps_total\{sweep="(\w+)",outcome="(\w+)"\} (\S+)', metrics)
            ]
            assert any(o == "ok" and float(n) > 0 for o, _s, n in ran), metrics[:2000]
            assert not [(s, n) for o, s, n in ran if o == "failed" and float(n) > 0], url


def test_a_replica_killed_mid_patch_the_client_resumes_on_another(fleet: Fleet) -> None:
    """SIGKILL of the replica receiving a tus PATCH: the client asks the balancer for the offset (answered by a
    live replica), sends the rest, and the file is whole and published once. Runs last: it kills a replica."""
    data = os.urandom(6 * MiB)
    victim = 0
    with fleet.http() as http:
        created = http.post("/tus/files/", headers={**TUS, "upload-length": str(len(data))})
        path = urlsplit(created.headers["location"]).path
        sent = 0

        def slow_body() -> Iterator[bytes]:
            nonlocal sent
            for i in range(0, 3 * MiB, 256 << 10):
                sent += 256 << 10
                yield data[i : i + (256 << 10)]
                if sent == 2 * MiB:
                    os.kill(fleet.pids[victim], signal.SIGKILL)
                    time.sleep(0.5)

        with pytest.raises(httpx.TransportError):  # the replica died under the request
            httpx.patch(
                fleet.urls[victim] + path,
                content=slow_body(),
                headers={**auth(OWNER), **TUS, "upload-offset": "0", "content-type": "application/offset+octet-stream"},
                timeout=60,
            )
        deadline = time.monotonic() + 30
        while True:  # HAProxy's health check takes the dead replica out; until then a request may get a 503
            head = http.head(path, headers=TUS)
            if head.status_code == 200:
                break
            assert time.monotonic() < deadline, head
            time.sleep(0.2)
        offset = int(head.headers["upload-offset"])
        assert offset in (0, *range(0, 2 * MiB + 1)), offset
        while offset < len(data):
            piece = data[offset : offset + 2 * MiB]
            patch = http.patch(
                path,
                content=piece,
                headers={**TUS, "upload-offset": str(offset), "content-type": "application/offset+octet-stream"},
            )
            assert patch.status_code == 204, patch.text
            assert patch.headers["x-served-by"] != f"r{victim}"
            offset += len(piece)
        descriptor = http.get(path, headers={"accept": "application/json"}).json()
        assert descriptor["checksum"] == sha(data)
        read_back(http, descriptor, data)
        same = [f for f in http.get("/v1/files").json()["files"] if f.get("checksum") == sha(data)]
        assert len(same) <= 1  # published once
