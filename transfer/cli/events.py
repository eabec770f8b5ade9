"""``transfer subscriptions …`` and ``transfer events …``: an admin's webhook subscriptions and the event outbox
of a running service, through its admin API (docs/HOOKS.md)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from transfer.client.client import AsyncTransferClient
from transfer.client.resolver import raise_for_error
from transfer.service.events.model import EVENT_TYPES


def _api_key(args: argparse.Namespace) -> str | None:
    return getattr(args, "api_key", None) or os.environ.get("TRANSFER_API_KEY") or None


async def _call(args: argparse.Namespace, method: str, path: str, **kw: Any) -> Any:
    """One admin API call; its JSON (None for an empty answer). Errors leave as the service's TransferError."""
    async with AsyncTransferClient(args.server, api_key=_api_key(args)) as client:
        response = await client.http.request(method, f"{client.server}{path}", **kw)
        await raise_for_error(response)
        return response.json() if response.content else None


def _show(args: argparse.Namespace, doc: Any, line: Callable[[Any], str]) -> None:
    print(json.dumps(doc, indent=2) if args.json else line(doc))


def _subscription_line(sub: dict[str, Any]) -> str:
    types = ",".join(sub["types"]) if sub["types"] else "all"
    owners = ",".join(sub["owners"]) if sub["owners"] else "every key"
    return f"{sub['id']}  {sub['url']}  types={types}  owners={owners}"


async def cmd_subscriptions_add(args: argparse.Namespace) -> int:
    """Make a subscription; prints it with its secret (shown only now: give it to the receiver)."""
    body = {"url": args.url, "types": args.type or None, "owners": args.owner or None, "description": args.description}
    sub = await _call(args, "POST", "/v1/admin/subscriptions", json=body)
    _show(args, sub, lambda s: f"{_subscription_line(s)}\nsecret (shown once): {s['secret']}")
    return 0


async def cmd_subscriptions_ls(args: argparse.Namespace) -> int:
    """Every subscription, one a line."""
    doc = await _call(args, "GET", "/v1/admin/subscriptions")
    _show(args, doc, lambda d: "\n".join(_subscription_line(s) for s in d["subscriptions"]) or "(no subscriptions)")
    return 0


async def cmd_subscriptions_rm(args: argparse.Namespace) -> int:
    """Remove subscriptions: nothing more is sent to them."""
    for sid in args.ids:
        await _call(args, "DELETE", f"/v1/admin/subscriptions/{sid}")
        print(f"removed {sid}")
    return 0


async def cmd_subscriptions_rotate(args: argparse.Namespace) -> int:
    """A new secret for a subscription; the old one keeps signing beside it for ``--grace`` seconds."""
    body = {"grace": args.grace}
    sub = await _call(args, "POST", f"/v1/admin/subscriptions/{args.id}/rotate", json=body)
    _show(args, sub, lambda s: f"{_subscription_line(s)}\nnew secret (shown once): {s['secret']}")
    return 0


async def cmd_events_status(args: argparse.Namespace) -> int:
    """Events waiting in the outbox, and its limit."""
    doc = await _call(args, "GET", "/v1/admin/events")
    _show(args, doc, lambda d: f"{d['waiting']} events waiting (limit {d['limit']})")
    return 0


async def cmd_events_dead(args: argparse.Namespace) -> int:
    """Dead-lettered events, one a line: id, type, subject, and per subscription the attempts and last error."""
    doc = await _call(args, "GET", "/v1/admin/events/dead", params={"limit": args.limit})

    def lines(d: dict[str, Any]) -> str:
        out = []
        for e in d["events"]:
            subject = e["data"].get("file", {}).get("id") or e["data"].get("upload_id")
            failed = "; ".join(f"{sid}: {f['attempts']} attempts, {f['last_error']}" for sid, f in e["failed"].items())
            out.append(f"{e['id']}  {e['type']}  {subject}  {failed}")
        return "\n".join(out) or "(no dead-lettered events)"

    _show(args, doc, lines)
    return 0


async def cmd_events_retry(args: argparse.Namespace) -> int:
    """Send dead-lettered events again to the subscriptions they failed for."""
    for event_id in args.ids:
        doc = await _call(args, "POST", f"/v1/admin/events/dead/{event_id}/retry")
        print(f"{doc['id']}: sent again to {', '.join(doc['subscriptions'])}")
    return 0


def add_event_commands(sub: Any, service_options: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``subscriptions`` and ``events`` to the CLI's subcommands (``service_options``: --server, --api-key)."""
    p = sub.add_parser("subscriptions", help="admin: webhook subscriptions (Standard Webhooks)")
    subs = p.add_subparsers(dest="subscriptions_command", required=True)
    s = subs.add_parser("add", help="send events to a URL; prints its signing secret once")
    service_options(s)
    s.add_argument("url", help="http(s) URL the events are POSTed to")
    s.add_argument("--type", action="append", choices=sorted(EVENT_TYPES), help="an event type (repeat; default all)")
    s.add_argument("--owner", action="append", help="only this key's events (repeat; default every key's)")
    s.add_argument("--description", default="")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_subscriptions_add)
    s = subs.add_parser("ls", help="list subscriptions")
    service_options(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_subscriptions_ls)
    s = subs.add_parser("rm", help="remove subscriptions")
    service_options(s)
    s.add_argument("ids", nargs="+")
    s.set_defaults(func=cmd_subscriptions_rm)
    s = subs.add_parser("rotate", help="a new secret; the old one signs beside it for --grace seconds")
    service_options(s)
    s.add_argument("id")
    s.add_argument("--grace", type=float, default=86400.0, help="seconds the old secret keeps signing (default a day)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_subscriptions_rotate)

    p = sub.add_parser("events", help="admin: the event outbox and its dead letters")
    events = p.add_subparsers(dest="events_command", required=True)
    e = events.add_parser("status", help="events waiting for delivery")
    service_options(e)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_events_status)
    e = events.add_parser("dead", help="events a subscription never took within TRANSFER_EVENTS_MAX_AGE")
    service_options(e)
    e.add_argument("--limit", type=int, default=100)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_events_dead)
    e = events.add_parser("retry", help="send dead-lettered events again")
    service_options(e)
    e.add_argument("ids", nargs="+")
    e.set_defaults(func=cmd_events_retry)
