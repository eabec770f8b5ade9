"""Digest fields (RFC 9530 ``Content-Digest`` / ``Repr-Digest``), descriptor checksums and the strong ETag.

Pure: parsing and formatting only; hashing happens where the bytes flow.
"""

from __future__ import annotations

import base64
import binascii
import re

from transfer.errors import InvalidDigestHeader

SUPPORTED_ALGORITHMS = ("sha-256",)

_MEMBER_RE = re.compile(r"^([a-z*][a-z0-9_\-.*]*)=:([A-Za-z0-9+/=]*):(?:;.*)?$")


def parse_digest_field(value: str) -> dict[str, bytes]:
    """Parse an RFC 9530 digest field (a Structured Fields dictionary of byte sequences) into
    ``{algorithm: digest bytes}``. Raises InvalidDigestHeader when it is not well formed."""
    out: dict[str, bytes] = {}
    for member in value.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        m = _MEMBER_RE.match(member)
        if not m:
            raise InvalidDigestHeader(f"malformed digest member {member[:80]!r}; expected e.g. sha-256=:<base64>:")
        try:
            out[m.group(1)] = base64.b64decode(m.group(2), validate=True)
        except binascii.Error as exc:
            raise InvalidDigestHeader(f"digest for {m.group(1)} is not valid base64") from exc
    if not out:
        raise InvalidDigestHeader("empty digest field")
    return out


def sha256_from_digest_field(value: str) -> bytes | None:
    """The sha-256 digest carried by the field, or None if it names only algorithms we do not support."""
    digests = parse_digest_field(value)
    sha = digests.get("sha-256")
    if sha is not None and len(sha) != 32:
        raise InvalidDigestHeader("sha-256 digest must be 32 bytes")
    return sha


def format_digest_field(sha256_hex: str) -> str:
    """``sha-256=:<base64>:`` for a SHA-256 given in hex."""
    return "sha-256=:" + base64.b64encode(bytes.fromhex(sha256_hex)).decode("ascii") + ":"


def strong_etag(sha256_hex: str, suffix: str = "") -> str:
    """A strong entity tag derived from the SHA-256 of the bytes served (RFC 9110 §8.8.3)."""
    return f'"{sha256_hex}{suffix}"'
