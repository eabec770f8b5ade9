"""Loopback ports for servers the tests and benchmarks start in other processes (Swift, Ceph, ``transfer serve``)."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

__all__ = ["free_port", "free_ports"]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def _port_block() -> range:
    """This process's block of ports below the ephemeral range: one block per pytest-xdist worker (``gwN``), another
    for a process that is not one, so two workers never draw the same port."""
    top = min(_ephemeral_low(), 65536)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = 1500
    start = top - size * (index + 1)
    if start < 1024:  # a tiny ephemeral range's low end: any unprivileged port, as the kernel would pick
        return range(1024, max(top, 1025))
    return range(start, start + size)


_next_port: list[int] = []  # where this process's walk through its block stands


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now, for servers started in other processes (each binds its own). They
    come from below the kernel's ephemeral range, from a block of this process's own (:func:`_port_block`): a port
    the kernel hands out for ``bind(0)`` and for every outgoing connection comes from the ephemeral range, so a
    port probed free there could be taken before the server binds it — seen as "address already in use" under the
    parallel suite. Here only another test's allocation could take it, and none draws from this block. The walk
    starts at a random place and goes on where it stopped, so one run does not reuse a port it just gave out."""
    block = _port_block()
    if not _next_port:
        _next_port.append(random.randrange(len(block)))
    ports: list[int] = []
    for _ in range(len(block)):
        port = block[_next_port[0] % len(block)]
        _next_port[0] += 1
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or lingering): the next one
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"no {n} free ports in {block}")


def free_port() -> int:
    """One loopback port free now, for a server started in another process (see :func:`free_ports`)."""
    return free_ports(1)[0]
