"""Direct-to-storage uploads on the client side: the bytes go to the bucket, the service only plans and verifies.

The file is read once, in order, one part at a time: each part's bytes update the whole file's SHA-256 and get
their own SHA-256 (two worker threads, at once), then go to a presigned URL that the bucket honours only for bytes
with that SHA-256. ``connections`` parts are in flight; memory is about ``connections + 1`` parts. The plan id is
remembered in a state file (as for ``--chunked``): a rerun asks the service which parts the bucket holds and sends
only the others (it still reads them locally, for the whole-file SHA-256). The service answers 409
``direct_upload_unsupported`` when its backend cannot take parts (local storage): :class:`DirectUploadUnsupported`
is raised before anything is sent, and the caller uploads through the service instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from transfer.client.chunks import _error_from, _first, _state_key, write_atomically
from transfer.core.model.content import checksum_hex
from transfer.errors import ChecksumMismatch, RemoteError

Progress = Callable[[int, int | None], None]
PartFilter = Callable[[int, bytes], bytes]

# Below this size a direct upload costs more round trips (plan, one URL request per part, completion, read-back)
# than it saves; the CLI uses it automatically at or above (8 parts of the default 8 MiB).
AUTO_DIRECT_THRESHOLD = 64 << 20


@dataclass(frozen=True, slots=True)
class DirectOptions:
    connections: int = 4
    retries: int = 5


def _plan_state(remember: Path | None, path: Path, server: str) -> Path | None:
    return remember / f"direct-{_state_key(path, server)}.json" if remember else None


async def _resume(
    http: httpx.AsyncClient, server: str, state_file: Path | None
) -> tuple[dict[str, Any], set[int]] | None:
    """The remembered plan and the part numbers the bucket holds, if the plan is still open."""
    if state_file is None or not state_file.exists():
        return None
    try:
        pid = json.loads(state_file.read_text()).get("plan")
    except ValueError:
        return None
    if not isinstance(pid, str):
        return None
    response = await http.get(f"{server}/v1/direct/{pid}")
    if response.status_code != 200 or response.json().get("state") != "open":
        return None
    doc: dict[str, Any] = response.json()
    return doc, {int(p["number"]) for p in doc.get("stored", [])}


async def upload_direct(
    http: httpx.AsyncClient,
    server: str,
    path: Path,
    *,
    options: DirectOptions,
    metadata: dict[str, Any] | None = None,
    progress: Progress | None = None,
    remember: Path | None = None,
    part_filter: PartFilter | None = None,
    on_part_stored: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Upload ``path`` straight to the service's bucket and return the descriptor (JSON) the service answers once it
    has verified the whole SHA-256. Raises DirectUploadUnsupported (nothing sent) when the backend cannot.

    ``part_filter`` (fault injection for tests) sees each part's bytes after they were added to the whole-file hash
    and before the part's own hash: a filter that changes them models a client whose reads are corrupted.
    ``on_part_stored`` is called with each part number the bucket accepted."""
    size = path.stat().st_size
    state_file = _plan_state(remember, path, server)
    resumed = await _resume(http, server, state_file)
    if resumed is None:
        body = {"size": size, **(metadata or {})}
        response = await http.post(f"{server}/v1/direct", json={k: v for k, v in body.items() if v is not None})
        if response.status_code != 201:
            raise _error_from(response)
        plan: dict[str, Any] = response.json()
        stored: set[int] = set()
        if state_file is not None:
            write_atomically(state_file, json.dumps({"plan": plan["id"], "path": str(path)}).encode())
    else:
        plan, stored = resumed
    pid, part_size, count = plan["id"], int(plan["part_size"]), int(plan["part_count"])
    whole = hashlib.sha256()
    sent = sum(min(part_size, size - (n - 1) * part_size) for n in stored)
    if progress:
        progress(sent, size)
    queue: asyncio.Queue[tuple[int, bytes, str] | None] = asyncio.Queue(maxsize=options.connections)

    async def read_all() -> None:
        with open(path, "rb") as f:
            for number in range(1, count + 1):
                offset = (number - 1) * part_size
                data = await asyncio.to_thread(os.pread, f.fileno(), min(part_size, size - offset), offset)
                if number in stored:
                    await asyncio.to_thread(whole.update, data)
                    continue
                original = data
                if part_filter is not None:
                    data = part_filter(number, data)
                _, part_sha = await asyncio.gather(
                    asyncio.to_thread(whole.update, original),
                    asyncio.to_thread(_sha256_hex, data),
                )
                await queue.put((number, data, part_sha))
        for _ in range(options.connections):
            await queue.put(None)

    async def send_parts() -> None:
        nonlocal sent
        while (item := await queue.get()) is not None:
            number, data, part_sha = item
            await _send_part(http, server, pid, number, data, part_sha, options)
            sent += len(data)
            if progress:
                progress(sent, size)
            if on_part_stored is not None:
                on_part_stored(number)

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(read_all())
            for _ in range(options.connections):
                tg.create_task(send_parts())
    except BaseExceptionGroup as group:
        raise _first(group) from None
    local = whole.hexdigest()
    response = await http.post(f"{server}/v1/direct/{pid}/complete", json={"checksum": "sha256:" + local})
    if response.status_code != 200:
        error = _error_from(response)
        if isinstance(error, ChecksumMismatch) and state_file is not None:
            state_file.unlink(missing_ok=True)  # the service aborted the plan: a rerun starts afresh
        raise error
    descriptor: dict[str, Any] = response.json()
    if checksum_hex(descriptor.get("checksum", "0" * 64)) != local:
        raise RemoteError("the published file's checksum differs from the local file's")
    if state_file is not None:
        state_file.unlink(missing_ok=True)
    return descriptor


def _sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _send_part(
    http: httpx.AsyncClient, server: str, pid: str, number: int, data: bytes, sha: str, options: DirectOptions
) -> None:
    """PUT one part to a fresh presigned URL; a refused part (BadDigest: changed in flight), an expired URL, a cut
    connection or a 5xx is retried with a new URL, a bounded number of times."""
    attempt = 0
    while True:
        response = await http.post(
            f"{server}/v1/direct/{pid}/parts", json={"parts": [{"number": number, "sha256": sha}]}
        )
        if response.status_code != 200:
            raise _error_from(response)
        target = response.json()["parts"][0]
        try:
            put = await http.request(target["method"], target["url"], content=data, headers=target["headers"])
            if put.status_code < 300:
                return
            failure: Exception = RemoteError(f"bucket refused part {number}: {put.status_code} {put.text[:200]}")
        except httpx.TransportError as exc:
            failure = exc
        attempt += 1
        if attempt > options.retries:
            raise RemoteError(f"part {number} failed after {options.retries} retries: {failure}") from failure
        await asyncio.sleep(min(0.1 * 2**attempt, 5.0))
