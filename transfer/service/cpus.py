"""How many CPUs the process can use at once, and what follows when it is one.

On a single CPU a worker thread cannot hash one piece while the event loop receives the next: handing each piece to it
only adds two context switches and a wake-up of the loop. So where the service hashes received bytes in a thread
(:mod:`transfer.service.files.ingest`, :class:`transfer.service.hashing.PieceHasher`), it hashes them on the
loop when :data:`SINGLE` is true (a batch of 1 MiB holds the loop ~0.6 ms; none longer than :data:`LOOP_HASH_MAX`). An
upload into the discarding sink on a server pinned to one core: 1.01 -> 0.92 s of CPU per GiB, 0.58x -> 0.64x one-core
SHA-256 (AMD EPYC, medians of 5, two rounds in turn). Decoding and encoding stay in the thread (their cost per byte is
less predictable), and so do the storage's writes (they may wait on the disk).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["LOOP_HASH_MAX", "SINGLE", "hash_on_loop", "hashed", "usable_cpus"]

T = TypeVar("T")


def usable_cpus() -> int:
    """How many CPUs this process can run on at once: its CPU affinity (``taskset``, a pinned container), lowered
    by a cgroup v2 CPU quota (a container's ``cpus`` limit, rounded up)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        group = next(line[3:].strip("/") for line in lines if line.startswith("0::"))
        quota, period = Path("/sys/fs/cgroup", group, "cpu.max").read_text().split()
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError, StopIteration):
        pass
    return max(1, count)


SINGLE = usable_cpus() == 1  # decided at start: the affinity or the quota a process is started with
# ... and then at most this many bytes are hashed in one go on the loop (~2.5 ms of SHA-256): a larger step (a
# buffer_size configured past it) goes to the thread, where the kernel time-slices it with the loop's other work
LOOP_HASH_MAX = 4 << 20


def hash_on_loop(size: int, at_most: int) -> bool:
    """Whether ``size`` bytes are hashed on the event loop: ``at_most`` of them (fewer than a thread hop would
    cost), or on a single CPU up to :data:`LOOP_HASH_MAX`."""
    return size <= at_most or (SINGLE and size <= LOOP_HASH_MAX)


async def hashed(work: Callable[..., T], size: int, *args: Any, at_most: int = 0) -> T:
    """``work(*args)``, which hashes ``size`` bytes: on the event loop when :func:`hash_on_loop` says so, else in a
    worker thread (the digests release the GIL). For a hash the caller awaits at once, with nothing to overlap."""
    if hash_on_loop(size, at_most):
        return work(*args)
    return await asyncio.to_thread(work, *args)
