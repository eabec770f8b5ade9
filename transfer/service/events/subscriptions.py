"""Webhook subscriptions: where events are sent, which types, for which keys, signed with which secrets. One record
per subscription under ``events/subscriptions/<id>``; the admin API and ``transfer subscriptions`` manage them.

A subscription's URL is checked when it is made (http or https, a host that resolves only to addresses the
destination policy allows: the SSRF guard of server-side fetches, with ``hooks_allow_networks``) and again on
every delivery, on the address actually connected to. Rotation adds a new secret and keeps the old one signing
beside it until it is retired (Standard Webhooks: several signatures in one header), so a receiver can change its
secret without missing an event.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import httpx

from storage.errors import ObjectNotFound
from transfer.core.ids import is_id, new_id
from transfer.errors import (
    DestinationRefused,
    InvalidRequest,
    NotFound,
    TooManySubscriptions,
    storage_errors_translated,
)
from transfer.service.accounting.recordstore import RecordStore
from transfer.service.events.model import EVENT_TYPES, SUBSCRIPTIONS, Event, timestamp
from transfer.service.events.signing import new_secret, secret_key
from transfer.service.jobs.fetch import DestinationPolicy

MAX_URL = 2048
MAX_DESCRIPTION = 500
REFRESH = 5.0  # seconds this process trusts its copy of the subscriptions (another replica's change shows then)


@dataclass(frozen=True, slots=True)
class Subscription:
    """One webhook subscription: its URL, the event types it takes (None: all), the keys whose events it takes
    (None: every key's), its secrets (newest first; each with the time it is retired at, None: in force) and a
    description for people."""

    id: str
    url: str
    types: frozenset[str] | None
    owners: frozenset[str] | None
    secrets: tuple[tuple[str, float | None], ...]
    created: float
    description: str = ""

    def wants(self, event: Event) -> bool:
        """Whether this subscription takes ``event``."""
        if self.types is not None and event.type.value not in self.types:
            return False
        return self.owners is None or (event.owner is not None and event.owner in self.owners)

    def in_force(self, now: float) -> list[str]:
        """The secrets that sign a delivery at ``now``."""
        return [s for s, retired in self.secrets if retired is None or retired > now]

    def to_json(self) -> dict[str, Any]:
        """The subscription as its record stores it (secrets included)."""
        return {
            "id": self.id,
            "url": self.url,
            "types": None if self.types is None else sorted(self.types),
            "owners": None if self.owners is None else sorted(self.owners),
            "secrets": [[s, r] for s, r in self.secrets],
            "created": self.created,
            "description": self.description,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Subscription:
        """The subscription a record stores."""
        types, owners = doc.get("types"), doc.get("owners")
        return cls(
            id=str(doc["id"]),
            url=str(doc["url"]),
            types=None if types is None else frozenset(types),
            owners=None if owners is None else frozenset(owners),
            secrets=tuple((str(s), None if r is None else float(r)) for s, r in doc.get("secrets") or []),
            created=float(doc.get("created") or 0.0),
            description=str(doc.get("description") or ""),
        )

    def public(self, now: float) -> dict[str, Any]:
        """What the admin API shows (secrets only as their retirement times: they are shown once, when made)."""
        return {
            "id": self.id,
            "url": self.url,
            "types": None if self.types is None else sorted(self.types),
            "owners": None if self.owners is None else sorted(self.owners),
            "created_at": timestamp(self.created),
            "description": self.description,
            "secrets": [
                {"hint": s[:10] + "…", "retires_at": None if r is None else timestamp(r)}
                for s, r in self.secrets
                if r is None or r > now
            ],
        }


def subscription_key(sid: str) -> str:
    """Where subscription ``sid`` is kept."""
    return SUBSCRIPTIONS + sid


async def check_destination(url: str, policy: DestinationPolicy) -> str:
    """``url`` if a webhook or hook may be sent there (InvalidRequest for a malformed one, DestinationRefused for a
    scheme or an address the policy refuses). The address is checked again when each request connects."""
    if len(url) > MAX_URL:
        raise InvalidRequest(f"url longer than {MAX_URL} characters", field="url")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError) as exc:
        raise InvalidRequest(f"url is not a URL: {exc}", field="url") from None
    if parsed.scheme not in policy.schemes or not parsed.host:
        raise DestinationRefused("a webhook URL is http:// or https:// with a host", field="url")
    if parsed.userinfo:
        raise InvalidRequest("a webhook URL carries no user name or password", field="url")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        addresses = [ipaddress.ip_address(parsed.host)]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(parsed.host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise InvalidRequest(f"cannot resolve {parsed.host!r}: {exc.strerror or exc}", field="url") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    refused = [ip for ip in addresses if not policy.allows(ip)]
    if refused:
        raise DestinationRefused(
            f"{parsed.host} resolves to {refused[0]}, which this service does not send to (loopback, private, "
            "link-local and metadata addresses are refused; see TRANSFER_HOOKS_ALLOW_NETWORKS)",
            host=parsed.host,
        )
    return url


def _types(types: Iterable[str] | None) -> frozenset[str] | None:
    if types is None:
        return None
    chosen = frozenset(types)
    unknown = sorted(chosen - EVENT_TYPES)
    if unknown or not chosen:
        raise InvalidRequest(
            f"event types are some of {', '.join(sorted(EVENT_TYPES))}"
            + (f"; not {', '.join(unknown)}" if unknown else ""),
            field="types",
        )
    return chosen


class Subscriptions:
    """The subscriptions of a deployment, kept as records; this process's copy is refreshed every few seconds."""

    def __init__(
        self,
        records: RecordStore,
        policy: DestinationPolicy,
        *,
        limit: int,
        clock: Callable[[], float] = time.time,  # real time: secrets retire as deliveries are made
    ) -> None:
        self.records = records
        self.storage = records.storage
        self.policy = policy
        self.limit = limit
        self.clock = clock
        self._cached: list[Subscription] | None = None
        self._cached_at = 0.0

    async def all(self) -> list[Subscription]:
        """Every subscription, in id order, as stored now."""
        with storage_errors_translated():
            keys = [info.key async for info in self.storage.list(SUBSCRIPTIONS, limit=self.limit + 1)]
        found: list[Subscription] = []
        for key in keys:
            try:
                doc, _ = await self.records.read(key)
            except NotFound:
                continue
            found.append(Subscription.from_json(doc))
        self._cached, self._cached_at = found, time.monotonic()
        return found

    async def current(self) -> list[Subscription]:
        """Every subscription as this process knows it (read again when its copy is older than a few seconds)."""
        if self._cached is None or time.monotonic() - self._cached_at > REFRESH:
            return await self.all()
        return self._cached

    async def create(
        self,
        url: str,
        *,
        types: Iterable[str] | None = None,
        owners: Iterable[str] | None = None,
        description: str = "",
        secret: str | None = None,
    ) -> tuple[Subscription, str]:
        """A new subscription and its secret (made here unless given: ``whsec_…``). TooManySubscriptions when the
        deployment has ``max_event_subscriptions`` already."""
        await check_destination(url, self.policy)
        if len(description) > MAX_DESCRIPTION:
            raise InvalidRequest(f"description longer than {MAX_DESCRIPTION} characters", field="description")
        secret = secret or new_secret()
        secret_key(secret)  # refuses a malformed one
        if len(await self.all()) >= self.limit:
            raise TooManySubscriptions(
                f"this deployment has {self.limit} webhook subscriptions already", limit=self.limit
            )
        sub = Subscription(
            id=new_id("sub_"),
            url=url,
            types=_types(types),
            owners=None if owners is None else frozenset(owners),
            secrets=((secret, None),),
            created=self.clock(),
            description=description,
        )
        await self.records.create(subscription_key(sub.id), sub.to_json())
        self._cached = None
        return sub, secret

    async def get(self, sid: str) -> Subscription:
        """Subscription ``sid`` (NotFound when there is none)."""
        if not is_id(sid, "sub_"):
            raise NotFound(f"no subscription {sid!r}")
        try:
            doc, _ = await self.records.read(subscription_key(sid))
        except NotFound:
            raise NotFound(f"no subscription {sid!r}") from None
        return Subscription.from_json(doc)

    async def delete(self, sid: str) -> None:
        """Remove subscription ``sid``: no event is sent to it any more (NotFound when there is none)."""
        await self.get(sid)
        with storage_errors_translated():
            try:
                await self.storage.delete(subscription_key(sid))
            except ObjectNotFound:
                raise NotFound(f"no subscription {sid!r}") from None
        self._cached = None

    async def rotate(self, sid: str, *, grace: float, secret: str | None = None) -> tuple[Subscription, str]:
        """Give subscription ``sid`` a new secret; the ones in force now keep signing beside it for ``grace`` more
        seconds (0: retired now). Returns the subscription and the new secret."""
        if not 0 <= grace <= 7 * 24 * 3600:
            raise InvalidRequest("grace is 0 to 604800 seconds", field="grace")
        await self.get(sid)
        secret = secret or new_secret()
        secret_key(secret)
        now = self.clock()

        def change(sub: Subscription) -> Subscription:
            kept = tuple(
                (s, now + grace if r is None else min(r, now + grace)) for s, r in sub.secrets if r is None or r > now
            )
            return replace(sub, secrets=((secret, None), *kept))

        sub = await self.records.update(subscription_key(sid), Subscription.from_json, change, Subscription.to_json)
        self._cached = None
        return sub, secret
