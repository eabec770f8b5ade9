"""The resolver's in-order hasher: pieces that arrive ahead of the hash frontier are hashed from memory while the
window holds them, and only what arrived while it was full is read back from the file."""

from __future__ import annotations

import hashlib
import os
import random
import threading
from pathlib import Path

import pytest

from transfer.client.fetch import Assembler

PIECE = 64 << 10


def _feed(tmp_path: Path, pieces: int, window: int, order: list[int]) -> tuple[Assembler, bytes]:
    data = os.urandom(pieces * PIECE)
    fd = os.open(tmp_path / "out.part", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    asm = Assembler(fd, PIECE, window)
    asm.finish(len(data))
    hasher = threading.Thread(target=asm.run)
    hasher.start()
    scratch = bytearray(PIECE)
    for index in order:
        buf = asm.take()
        pooled = buf is not None
        target = buf if buf is not None else scratch
        target[:] = data[index * PIECE : (index + 1) * PIECE]
        asm.deposit(index * PIECE, target, PIECE, pooled)
    hasher.join()
    os.close(fd)
    assert (tmp_path / "out.part").read_bytes() == data
    return asm, data


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_out_of_order_pieces_within_the_window_are_hashed_without_reading_back(tmp_path: Path, seed: int) -> None:
    order = list(range(16))
    random.Random(seed).shuffle(order)
    asm, data = _feed(tmp_path, 16, window=16, order=order)
    assert asm.sha.hexdigest() == hashlib.sha256(data).hexdigest()
    assert asm.read_back == 0


def test_pieces_beyond_a_full_window_are_read_back_and_still_hashed_in_order(tmp_path: Path) -> None:
    order = list(range(15, -1, -1))  # the frontier arrives last: everything else waits
    asm, data = _feed(tmp_path, 16, window=4, order=order)
    assert asm.sha.hexdigest() == hashlib.sha256(data).hexdigest()
    assert 0 < asm.read_back < len(data)
