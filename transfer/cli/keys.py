"""``transfer keys new``: make an API key."""

from __future__ import annotations

import argparse
import json

from transfer.cli.console import CliError


def cmd_keys_new(args: argparse.Namespace) -> int:
    """Print a new API key and the settings entry that admits it (only its SHA-256 is stored)."""
    from transfer.core.auth import Scope, new_token, token_hash

    try:
        scopes = sorted({Scope(s.strip()).value for s in args.scopes.split(",") if s.strip()})
    except ValueError as exc:
        raise CliError("invalid_request", "scopes are upload, read and admin") from exc
    token = new_token()
    entry = {args.name: {"sha256": token_hash(token), "scopes": scopes}}
    print(f"key (give it to the client; it is not stored anywhere): {token}")
    print(f"add to TRANSFER_API_KEYS: {json.dumps(entry)}")
    return 0
