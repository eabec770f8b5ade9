"""Standard Webhooks signatures (https://www.standardwebhooks.com, spec "Signature scheme"): what a receiver checks
with the ``standardwebhooks`` library or Svix's. Pure: no I/O.

    webhook-id         the event id (the same on every retry: a receiver deduplicates by it)
    webhook-timestamp  integer Unix seconds of this attempt (receivers refuse ones far from their clock)
    webhook-signature  ``v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>``, one per secret in force,
                       separated by spaces (a rotated secret signs beside the new one until it is retired)

A secret is ``whsec_`` and the base64 of 24 to 64 random bytes (the spec's recommendation); the bytes are the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable

from transfer.errors import InvalidRequest

PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh signing secret in the spec's form."""
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The key bytes of a ``whsec_`` secret; InvalidRequest for anything else (or fewer than 24 bytes)."""
    try:
        key = base64.b64decode(secret.removeprefix(PREFIX), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("a webhook secret is whsec_ followed by base64", field="secret") from None
    if not secret.startswith(PREFIX) or not 24 <= len(key) <= 64:
        raise InvalidRequest("a webhook secret is whsec_ and the base64 of 24 to 64 bytes", field="secret")
    return key


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,`` signature of ``body`` sent as message ``msg_id`` at ``timestamp``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    mac = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def webhook_headers(secrets_in_force: Iterable[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one attempt, signed with every secret in force."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in secrets_in_force),
    }
