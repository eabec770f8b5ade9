"""``transfer keys create/list/revoke/rotate``: run-time API keys through a running service's admin API
(``/v1/admin/keys``, admin scope). ``transfer keys new`` (in :mod:`transfer.cli.keys`) still prints an entry for
``TRANSFER_API_KEYS``, the read-only keys of the environment (the bootstrap admin key).

Each command takes ``--server`` and ``--api-key`` (or TRANSFER_SERVER, TRANSFER_API_KEY) like the other admin
commands; a new key is printed once and never stored (only its SHA-256 is).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from transfer.client.client import DEFAULT_SERVER, AsyncTransferClient
from transfer.client.resolver import raise_for_error


def _client(args: argparse.Namespace) -> AsyncTransferClient:
    key = getattr(args, "api_key", None) or os.environ.get("TRANSFER_API_KEY") or None
    return AsyncTransferClient(args.server, api_key=key)


async def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    async with _client(args) as client:
        response = await client.http.request(method, f"{client.server}{path}", json=body)
        await raise_for_error(response)
        return response.json()


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _print_made(made: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(made, indent=2))
        return
    print(f"key (give it to the client; it is not stored anywhere): {made['key']}")
    print(f"name {made['name']}, key id {made['key_id']}, scopes {','.join(made['scopes'])}")


async def cmd_keys_create(args: argparse.Namespace) -> int:
    """Admin: a new run-time key; prints it once."""
    body: dict[str, Any] = {"name": args.name, "scopes": [s.strip() for s in args.scopes.split(",") if s.strip()]}
    for field in ("max_bytes", "default_file_ttl", "max_file_ttl", "expires_in"):
        if getattr(args, field) is not None:
            body[field] = getattr(args, field)
    if args.tp_identity:
        body["tp_identities"] = args.tp_identity
    _print_made(await _call(args, "POST", "/v1/admin/keys", body), args.json)
    return 0


async def cmd_keys_list(args: argparse.Namespace) -> int:
    """Admin: every key name with its live keys."""
    keys = (await _call(args, "GET", "/v1/admin/keys"))["keys"]
    if args.json:
        print(json.dumps(keys, indent=2))
        return 0
    for entry in keys:
        limits = ", ".join(f"{k} {entry[k]}" for k in ("max_bytes", "default_file_ttl", "max_file_ttl") if entry[k])
        print(f"{entry['name']}  scopes {','.join(entry['scopes'])}{'  ' + limits if limits else ''}")
        for key in entry["keys"]:
            print(
                f"  {key['key_id']}  created {_when(key['created_at'])} by {key['created_by'] or '-'}  "
                f"expires {_when(key['expires_at'])}"
            )
    return 0


async def cmd_keys_revoke(args: argparse.Namespace) -> int:
    """Admin: revoke every key of a name, or one by ``--key-id``."""
    body: dict[str, Any] = {"name": args.name}
    if args.key_id:
        body["key_id"] = args.key_id
    done = await _call(args, "POST", "/v1/admin/keys/revoke", body)
    print(json.dumps(done) if args.json else f"revoked {', '.join(done['revoked'])} of {done['name']}")
    return 0


async def cmd_keys_rotate(args: argparse.Namespace) -> int:
    """Admin: a new key for a name; its other keys stop after ``--grace`` seconds."""
    body: dict[str, Any] = {"name": args.name, "grace": args.grace}
    if args.expires_in is not None:
        body["expires_in"] = args.expires_in
    _print_made(await _call(args, "POST", "/v1/admin/keys/rotate", body), args.json)
    return 0


def add_key_commands(keys: Any, server_default: str = DEFAULT_SERVER) -> None:
    """Add create/list/revoke/rotate to the ``keys`` subcommands (an argparse subparsers object)."""

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--server", default=server_default, help="service URL (TRANSFER_SERVER)")
        p.add_argument("--api-key", help="an admin key (default: TRANSFER_API_KEY)")
        p.add_argument("--json", action="store_true", help="print JSON")

    k = keys.add_parser("create", help="admin: make a run-time key (every replica knows it at once)")
    k.add_argument("name")
    k.add_argument("--scopes", default="upload,read", help="comma-separated: upload, read, admin")
    k.add_argument("--max-bytes", type=int, help="byte quota of what the key stores")
    k.add_argument("--default-file-ttl", type=int, help="seconds its files live when an upload names none")
    k.add_argument("--max-file-ttl", type=int, help="the longest lifetime an upload may ask for")
    k.add_argument("--expires-in", type=int, help="seconds the key works (default: until revoked)")
    k.add_argument("--tp-identity", action="append", help="a TP identity whose mailbox it may read (repeatable)")
    common(k)
    k.set_defaults(func=cmd_keys_create)

    k = keys.add_parser("list", help="admin: run-time keys by name (ids, expiry, who made them)")
    common(k)
    k.set_defaults(func=cmd_keys_list)

    k = keys.add_parser("revoke", help="admin: revoke a name's keys (refused everywhere within the cache bound)")
    k.add_argument("name")
    k.add_argument("--key-id", help="only this key (see `transfer keys list`)")
    common(k)
    k.set_defaults(func=cmd_keys_revoke)

    k = keys.add_parser("rotate", help="admin: a new key for a name; the old ones stop after --grace seconds")
    k.add_argument("name")
    k.add_argument("--grace", type=int, default=0, help="seconds the old keys keep working (default 0)")
    k.add_argument("--expires-in", type=int, help="seconds the new key works (default: until revoked)")
    common(k)
    k.set_defaults(func=cmd_keys_rotate)
