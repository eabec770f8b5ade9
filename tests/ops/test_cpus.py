"""Where received bytes are hashed: in a worker thread beside the event loop when the process has more than one CPU,
on the loop itself when it has one (a thread could not run beside it; the hop would only add context switches).
The affinity is read from the process (``taskset``), and the digests are the same either way."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from storage.local import LocalStorage
from tests.storage_conformance import read_all
from transfer.core.model.content import ContentEncoding
from transfer.core.uploads.state import FileIntent
from transfer.service import cpus
from transfer.service.container import Services
from transfer.service.files.ingest import UploadRequest
from transfer.service.files.records import object_key
from transfer.service.hashing import OFFLOAD_BYTES, PieceHasher
from transfer.settings import Settings

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]


def test_usable_cpus_follows_the_affinity_the_process_is_started_with() -> None:
    code = "from transfer.service import cpus; print(cpus.usable_cpus(), cpus.SINGLE)"
    pinned = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert pinned.stdout.split() == ["1", "True"]
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    expected = len(os.sched_getaffinity(0))  # this machine's (the quota, if any, can only lower it)
    count, single = free.stdout.split()
    assert 1 <= int(count) <= expected and single == str(int(count) == 1)


class _Recorder:
    def __init__(self) -> None:
        self.threads: list[int] = []

    def update(self, data: bytes, /) -> None:
        self.threads.append(threading.get_ident())


async def test_the_piece_hasher_stays_on_the_loop_on_one_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.get_ident()
    for single, large_on_loop in ((False, False), (True, True)):
        monkeypatch.setattr(cpus, "SINGLE", single)
        recorder = _Recorder()
        hasher = PieceHasher(recorder)
        await hasher.update(b"x" * OFFLOAD_BYTES)
        await hasher.update(b"x" * 100)
        await hasher.update(b"x" * (cpus.LOOP_HASH_MAX + 1))  # longer than the loop is held for, even on one CPU
        assert (recorder.threads[0] == loop_thread) is large_on_loop
        assert recorder.threads[1] == loop_thread
        assert recorder.threads[2] != loop_thread


@pytest.mark.parametrize(("single", "buffer_size"), [(False, 1 << 20), (True, 1 << 20), (True, 8 << 20)])
async def test_an_upload_is_hashed_on_the_loop_only_on_one_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, single: bool, buffer_size: int
) -> None:
    """12 MiB sent plain and 12 MiB sent gzip-coded: with more than one CPU every batch of the plain body hops to a
    worker thread; on one CPU none does (unless a batch is longer than the loop may be held for: a buffer size of
    8 MiB), while decoding the coded one still does. The files read back whole."""
    monkeypatch.setattr(cpus, "SINGLE", single)
    hops: list[str] = []
    real_to_thread = asyncio.to_thread

    async def counted(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        hops.append(getattr(func, "__qualname__", ""))
        return await real_to_thread(func, *args, **kwargs)

    settings = Settings(data_dir=tmp_path / "data", signing_keys={"t": "0123456789abcdef0123"}, buffer_size=buffer_size)
    files = Services.build(settings, LocalStorage(settings.data_dir)).files
    await files.start()
    try:
        data = os.urandom(12 << 20)

        async def body(blob: bytes) -> AsyncIterator[bytes]:
            for at in range(0, len(blob), 256 << 10):
                yield blob[at : at + (256 << 10)]

        monkeypatch.setattr(asyncio, "to_thread", counted)
        plain = await files.upload(body(data), UploadRequest(intent=FileIntent(name="plain.bin")))
        plain_hops = hops.count("_Digests.step")
        del hops[:]
        coded = await files.upload(
            body(gzip.compress(data, 1)),
            UploadRequest(body_encoding=ContentEncoding.GZIP, intent=FileIntent(name="coded.bin")),
        )
        coded_hops = hops.count("_Digests.step")
        monkeypatch.setattr(asyncio, "to_thread", real_to_thread)
        assert (plain_hops == 0) is (single and buffer_size <= cpus.LOOP_HASH_MAX)
        assert coded_hops > 0
        for record in (plain, coded):
            assert record.sha256 == hashlib.sha256(data).hexdigest()
            assert await read_all(files.storage, object_key(record.id)) == data
    finally:
        await files.close()


async def test_a_hash_awaited_at_once_runs_on_the_loop_only_where_the_rule_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chunked door, the read-backs and the MCP authorised upload hash through ``cpus.hashed``: a thread with
    two CPUs (beyond ``at_most``), the loop with one, and the thread again past ``LOOP_HASH_MAX``."""
    loop_thread = threading.get_ident()

    def where(_: bytes) -> int:
        return threading.get_ident()

    for single, size, at_most, on_loop in (
        (False, 1 << 20, 0, False),
        (False, 100, 1 << 10, True),
        (True, 1 << 20, 0, True),
        (True, cpus.LOOP_HASH_MAX + 1, 0, False),
    ):
        monkeypatch.setattr(cpus, "SINGLE", single)
        ran_on = await cpus.hashed(where, size, b"", at_most=at_most)
        assert (ran_on == loop_thread) is on_loop, (single, size, at_most)
