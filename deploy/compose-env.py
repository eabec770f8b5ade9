#!/usr/bin/env python3
"""The secrets docker-compose.yml needs, generated for one deployment: ``python3 deploy/compose-env.py``.

Writes ``.env`` next to docker-compose.yml (Compose reads it by itself), readable by its owner only, with:

  S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY  the bucket's one identity (SeaweedFS's s3.json, MinIO's root user, and
                                           the service's AWS_* variables): 20 and 40 random characters
  TRANSFER_SIGNING_KEYS                    the URL signing key (32 random bytes), given to every replica; never
                                           kept in the bucket
  TRANSFER_API_KEYS                        one admin API key, by its SHA-256 only

and prints the admin key once, on stdout: it is not written anywhere. Add keys for agents with ``transfer keys new``.
An existing .env is never overwritten (``--force`` does, and then the bucket's credentials no longer match a
SeaweedFS volume created with the old ones).

Only the standard library: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import string
import sys
from pathlib import Path

TOKEN_PREFIX = "tk_"  # the service's key format (transfer.core.auth): "tk_" + 43 base64url characters, 256 bits
ACCESS_KEY_ALPHABET = string.ascii_uppercase + string.digits


def new_token() -> str:
    """A new API key, as ``transfer keys new`` makes them."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def environment(token: str) -> dict[str, str]:
    """The variables of a new deployment; ``token`` is the admin key whose SHA-256 is configured."""
    return {
        "S3_ACCESS_KEY_ID": "".join(secrets.choice(ACCESS_KEY_ALPHABET) for _ in range(20)),
        "S3_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),  # 40 characters, as AWS's
        "TRANSFER_SIGNING_KEYS": json.dumps({"k1": secrets.token_urlsafe(32)}),
        "TRANSFER_API_KEYS": json.dumps(
            {"admin": {"sha256": hashlib.sha256(token.encode()).hexdigest(), "scopes": ["admin"]}}
        ),
    }


def env_file(values: dict[str, str]) -> str:
    """``values`` as a .env file: single-quoted, so Compose takes them as they are (no ``$`` interpolation)."""
    lines = ["# secrets of docker-compose.yml, made by deploy/compose-env.py: keep this file to yourself"]
    lines += [f"{name}='{value}'" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    root = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, default=root / ".env", help="default: .env beside docker-compose.yml")
    parser.add_argument("--force", action="store_true", help="replace an existing file")
    args = parser.parse_args(argv)
    token = new_token()
    text = env_file(environment(token))
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if args.force else os.O_EXCL)
    try:
        fd = os.open(args.output, flags, 0o600)
    except FileExistsError:
        print(f"{args.output} exists; keep it, or replace it with --force", file=sys.stderr)
        return 1
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # also when --force truncated a file made with other permissions
        out.write(text)
    print(f"wrote {args.output} (mode 0600); the admin API key, shown once and stored nowhere:", file=sys.stderr)
    print(token)
    return 0


if __name__ == "__main__":
    sys.exit(main())
