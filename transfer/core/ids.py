"""Resource ids: a kind prefix and 128 random bits in lowercase hex (``f_…`` files, ``s_…`` sessions, ``t_…`` tus
uploads, ``b_…`` bundles, ``d_…`` direct-upload plans, ``az_…`` upload authorisations). One place makes and checks
them, so a malformed id is refused before it becomes a storage key."""

from __future__ import annotations

import hashlib
import secrets

_HEX = frozenset("0123456789abcdef")


def new_id(prefix: str) -> str:
    """A fresh id of the kind ``prefix`` (e.g. ``"f_"``)."""
    return prefix + secrets.token_hex(16)


def is_id(value: str, prefix: str) -> bool:
    """Whether ``value`` is an id of the kind ``prefix``: the prefix and exactly 32 lowercase hex digits."""
    return value.startswith(prefix) and len(value) == len(prefix) + 32 and _HEX.issuperset(value[len(prefix) :])


def owner_folder(owner: str) -> str:
    """``owners/<key hash>/``: the folder of what is kept per API key (its open-upload slots, its file index).
    Hashed: key names are free text."""
    return f"owners/{hashlib.sha256(owner.encode('utf-8')).hexdigest()[:32]}/"
