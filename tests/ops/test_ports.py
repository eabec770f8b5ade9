"""The ports the suite gives to servers it starts in other processes: below the kernel's ephemeral range (where
``bind(0)`` and every outgoing connection draw theirs, so a probed port could be taken before the server binds
it), one block per parallel worker, free when handed out, and not handed out twice by one process."""

from __future__ import annotations

import socket

import pytest

from devtools import ports


def test_each_worker_draws_from_its_own_block_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    low = ports._ephemeral_low()
    blocks = []
    for worker in ("", "gw0", "gw1", "gw2", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        blocks.append(set(ports._port_block()))
    for i, block in enumerate(blocks):
        assert block and max(block) < low and min(block) >= 1024
        for other in blocks[i + 1 :]:
            assert not block & other


def test_ports_are_free_distinct_and_skip_one_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    block = ports._port_block()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", block[10]))
        taken.listen()
        monkeypatch.setattr(ports, "_next_port", [8])  # the walk is about to reach the port in use
        given = ports.free_ports(5)
        assert block[10] not in given and len(set(given)) == 5 and set(given) <= set(block)
        assert given == [block[8], block[9], block[11], block[12], block[13]]
        for port in given:  # each can be bound by the server it is for
            with socket.socket() as server:
                server.bind(("127.0.0.1", port))
    assert ports.free_port() == block[14]  # the walk goes on: nothing handed out again
