"""Start-up checks of what keeps a deployment closed: secrets that are evidently not secret, and listeners that
would serve without keys beyond this host. Pure: no I/O (the settings call these once, at start-up).

A secret is refused when it is a placeholder left from a template (``REPLACE…``, ``changeme``, ``<your key>``,
``${VAR}`` that Compose did not fill), a value published as a default (``minioadmin``, the fixed Compose
credentials of earlier versions), too short for what it protects, or one character repeated. The check never echoes
the value: messages name the setting and the reason only.

    placeholder_problem(value)          -> why ``value`` is a template's placeholder, or None (for names such as an
                                           access key id, which are not secret themselves)
    secret_problem(value, min_length=)  -> why ``value`` cannot be a secret, or None
    is_loopback(host)                   -> whether a bind address is reachable only from this host
"""

from __future__ import annotations

import ipaddress
from typing import Final

# Markers that only a template puts into a secret. Long enough that a random key (hex, base64) does not contain one
# by chance: a 5-letter marker occurs in about one random 40-character base64 secret in a million, these in fewer
# than one in a billion.
PLACEHOLDER_MARKERS: Final = ("replace", "changeme", "change-me", "change_me", "placeholder", "example", "xxxxxxxx")
# Not in hex or base64 alphabets: left by a template or an interpolation that did not happen
TEMPLATE_MARKERS: Final = ("${", "...", "…")
# Published defaults and the fixed credentials this project's docker-compose.yml carried before 0.1.0's release
PUBLISHED: Final = frozenset({"transfer-secret", "minioadmin", "minio123", "password", "secret", "admin", "changeit"})
MIN_DISTINCT: Final = 8  # different characters a secret of the minimum length holds at least (not "aaaa…", "abab…")

SIGNING_KEY_MIN: Final = 16  # bytes: 128 bits when random (HMAC-SHA256 keys; 32 random bytes recommended)
BUCKET_SECRET_MIN: Final = 8  # characters: MinIO's own minimum (AWS and Ceph issue 40)


def placeholder_problem(value: str) -> str | None:
    """Why ``value`` is a placeholder a template left (a marker, ``<…>``, nothing at all), or None."""
    lowered = value.strip().lower()
    if not lowered:
        return "is empty"
    for marker in (*PLACEHOLDER_MARKERS, *TEMPLATE_MARKERS):
        if marker in lowered:
            return f"is a placeholder (it contains {marker!r}): put the real value there"
    if lowered.startswith("<") and lowered.endswith(">"):
        return "is a placeholder (<…>): put the real value there"
    return None


def secret_problem(value: str, *, min_length: int) -> str | None:
    """Why ``value`` cannot be a real secret of at least ``min_length`` UTF-8 bytes (a placeholder, a published
    default, too short, too few different characters), or None when nothing evident is wrong with it."""
    problem = placeholder_problem(value)
    if problem is not None:
        return problem
    if value.strip().lower() in PUBLISHED:
        return "is a published default value: anyone may know it"
    if len(value.encode()) < min_length:
        return f"is shorter than {min_length} bytes"
    if len(set(value)) < min(MIN_DISTINCT, min_length):
        return f"has fewer than {MIN_DISTINCT} different characters: not a random secret"
    return None


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on loopback only: ``localhost``, 127.0.0.0/8, ``::1`` (an IPv4-mapped
    loopback too). A wildcard (``0.0.0.0``, ``::``, empty) or any other name or address is not."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name other than localhost may resolve anywhere
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
