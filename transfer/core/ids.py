"""Resource ids: a kind prefix and 128 random bits in lowercase hex (``f_…`` files, ``s_…`` sessions, ``t_…`` tus
uploads, ``b_…`` bundles, ``d_…`` direct-upload plans, ``az_…`` upload authorisations). One place makes and checks
them, so a malformed id is refused before it becomes a storage key."""

from __future__ import annotations

import hashlib
import secrets
import zlib

_HEX = frozenset("0123456789abcdef")


# (lanes, lane): the ids this process makes fall in ``lane`` of ``lanes`` (lane_of); None: anywhere
_DRAWN_INTO: tuple[int, int] | None = None


def lane_of(thing: str, lanes: int) -> int:
    """Which of ``lanes`` lanes an id (or an id-derived name) falls in: by its random part (after the last ``_``),
    so an upload, the file it publishes and that file's removal fall in the same one. A key's usage shards are
    lanes (:mod:`transfer.service.accounting.usage`)."""
    return zlib.crc32(thing.rpartition("_")[2].encode()) % lanes


def draw_ids_into(lanes: int, lane: int) -> None:
    """From now on, the ids this process makes fall in ``lane`` of ``lanes`` (about ``lanes`` draws each, three
    bits fewer of chance for 8 lanes: 125 random bits). A replica that counts its uploads in usage shards of its
    own keeps the versions of those records it knows current, instead of losing its first write to a replica that
    wrote since. Set once, by the process that serves (``transfer serve``)."""
    global _DRAWN_INTO
    _DRAWN_INTO = (lanes, lane % lanes) if lanes > 1 else None


def new_id(prefix: str) -> str:
    """A fresh id of the kind ``prefix`` (e.g. ``"f_"``), in this process's lane if it has one."""
    drawn = _DRAWN_INTO
    while True:
        token = secrets.token_hex(16)
        if drawn is None or lane_of(token, drawn[0]) == drawn[1]:
            return prefix + token


def is_id(value: str, prefix: str) -> bool:
    """Whether ``value`` is an id of the kind ``prefix``: the prefix and exactly 32 lowercase hex digits."""
    return value.startswith(prefix) and len(value) == len(prefix) + 32 and _HEX.issuperset(value[len(prefix) :])


def owner_folder(owner: str) -> str:
    """``owners/<key hash>/``: the folder of what is kept per API key (its open-upload slots, its file index).
    Hashed: key names are free text."""
    return f"owners/{hashlib.sha256(owner.encode('utf-8')).hexdigest()[:32]}/"
