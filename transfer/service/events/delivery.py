"""Delivery: every replica takes events from the outbox and sends them, at least once, to each subscription that
wants them, with Standard Webhooks signatures.

    confirmed here         the process that made a change hands its event id to its own workers (in memory; a full
                           queue only means the look below finds it)
    the look (a sweep)     every ``events_scan_interval`` the outbox is listed; an event due and held by nobody is
                           queued (a staged one whose maker crashed is first checked against the storage)
    a worker               claims the event by compare-and-set (a lease of ``events_lease`` seconds: one replica
                           works on it at a time), decides its subscriptions the first time, puts it in its owner's
                           feed, sends it to every subscription due, then records the results by compare-and-set:
                           a delivered subscription leaves the entry; a failed one is due again after a backoff
                           (doubling from ``events_retry_base`` up to ``events_retry_max``) until it has been tried
                           for ``events_max_age``, then the event is dead-lettered for it. An entry with nothing left
                           is deleted.

A delivery is a POST of the payload with ``webhook-id`` (the event id: the same on every attempt),
``webhook-timestamp`` and ``webhook-signature``; a 2xx answer within ``events_timeout`` takes it, anything else
(another status, a redirect, a timeout, a refused address) is a failure. Receivers deduplicate by ``webhook-id``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import replace

import httpx

from transfer import metrics
from transfer.core.ids import new_id
from transfer.errors import DestinationRefused, TransferError
from transfer.service.events.feed import Feed
from transfer.service.events.model import Check, Entry, Target, backoff
from transfer.service.events.outbox import Outbox
from transfer.service.events.signing import webhook_headers
from transfer.service.events.subscriptions import Subscription, Subscriptions
from transfer.service.jobs.fetch import GuardedTransport
from transfer.settings import Settings

log = logging.getLogger("transfer.events")

QUEUE = 10_000  # event ids waiting for this process's workers (beyond: the next look at the outbox finds them)
REMEMBERED = 100_000  # events whose next look this process remembers (so a look reads only what is due)
STAGED_SETTLE = 10.0  # seconds a staged event's own maker has to confirm it before another process checks it
RECHECK = 5.0  # seconds between checks of a staged event whose change is not visible yet
ERROR_TEXT = 300

Checker = Callable[[Check], Awaitable[bool]]


class Dispatcher:
    """This process's delivery workers and its look at the outbox (see the module text)."""

    def __init__(
        self,
        outbox: Outbox,
        subscriptions: Subscriptions,
        feed: Feed,
        settings: Settings,
        *,
        happened: Checker,
        grace: Callable[[Entry], float],
        clock: Callable[[], float] = time.time,
        wall: Callable[[], float] = time.time,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.outbox = outbox
        self.subscriptions = subscriptions
        self.feed = feed
        self.settings = settings
        self.happened = happened
        self.grace = grace
        self.clock = clock  # the service's: how old a staged event is (its timestamp is on it)
        self.wall = wall  # real time: leases, retries and their ages (a receiver comes back in real time)
        self.holder = new_id("p_")  # this process, in leases
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._queue: asyncio.Queue[str] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._busy: set[str] = set()  # queued or being worked on here
        self._confirmed: set[str] = set()  # staged events whose change this process made
        self._next: OrderedDict[str, float] = OrderedDict()  # event id -> when to look at it again
        self.delivered = 0

    # -- life ----------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers (on the running loop)."""
        self._queue = asyncio.Queue(QUEUE)
        transport = self._transport or GuardedTransport(self.subscriptions.policy)
        limits = httpx.Limits(max_connections=self.settings.events_concurrency * 2)
        self._client = httpx.AsyncClient(transport=transport, follow_redirects=False, limits=limits)
        self._workers = [
            asyncio.create_task(self._work(), name=f"events:{i}") for i in range(self.settings.events_concurrency)
        ]

    async def close(self) -> None:
        """Stop the workers (what they held is taken again by any replica once its lease ends)."""
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # -- work in -------------------------------------------------------------------------------------------------

    def confirmed(self, event_id: str) -> None:
        """This process made the change of staged event ``event_id``: send it now."""
        self._confirmed.add(event_id)
        if len(self._confirmed) > QUEUE:
            self._confirmed.pop()
        self._enqueue(event_id)

    def _enqueue(self, event_id: str) -> bool:
        if self._queue is None or event_id in self._busy:
            return self._queue is not None
        try:
            self._queue.put_nowait(event_id)
        except asyncio.QueueFull:
            return False  # the next look finds it: nothing is lost
        self._busy.add(event_id)
        return True

    async def look(self) -> int:
        """List the outbox and queue every event due that nobody here works on; how many were delivered (to every
        subscription that wanted them) since the last look. The delivery loop's sweep."""
        now = self.wall()
        for event_id in await self.outbox.ids():
            if event_id in self._busy or self._next.get(event_id, 0.0) > now:
                continue
            if not self._enqueue(event_id):
                break
        done, self.delivered = self.delivered, 0
        return done

    def _later(self, event_id: str, when: float) -> None:
        self._next[event_id] = when
        self._next.move_to_end(event_id)
        while len(self._next) > REMEMBERED:
            self._next.popitem(last=False)

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            event_id = await self._queue.get()
            try:
                await self.process(event_id)
            except TransferError as exc:
                log.warning("event %s not delivered now (retried at the next look): %s", event_id, exc)
                self._later(event_id, self.wall() + RECHECK)
            except Exception:  # a bug must not end the worker for the process's lifetime
                log.exception("event %s: delivery failed unexpectedly (a bug)", event_id)
                self._later(event_id, self.wall() + RECHECK)
            finally:
                self._busy.discard(event_id)

    # -- one event -----------------------------------------------------------------------------------------------

    async def process(self, event_id: str) -> None:
        """Take event ``event_id`` from the outbox (if due and held by nobody) and deliver it."""
        now, age_now = self.wall(), self.clock()
        entry = await self.outbox.read(event_id)
        if entry is None:
            self._confirmed.discard(event_id)
            self._next.pop(event_id, None)
            return
        mine = event_id in self._confirmed
        if entry.staged and not mine:
            age = age_now - entry.event.created
            if age < STAGED_SETTLE:
                self._later(event_id, now + STAGED_SETTLE - age)
                return
            assert entry.check is not None
            if not await self.happened(entry.check):
                if age > self.grace(entry):
                    log.info("event %s dropped: its change never happened", event_id)
                    await self.outbox.remove(event_id)
                else:
                    self._later(event_id, now + RECHECK)
                return
        if entry.held_by_other(self.holder, now):
            assert entry.lease is not None
            self._later(event_id, entry.lease[1])
            return
        if entry.targets is not None and entry.fed and entry.due(now) > now:
            self._later(event_id, entry.due(now))
            return
        subscriptions = {s.id: s for s in await self.subscriptions.current()}
        claimed = await self._claim(event_id, now, subscriptions)
        self._confirmed.discard(event_id)
        if claimed is None:
            return
        if not claimed.fed:
            await self.feed.append(claimed.event)
        assert claimed.targets is not None
        due = {sid: t for sid, t in claimed.targets.items() if t.due <= now}
        results = await asyncio.gather(
            *(self._send(claimed, subscriptions.get(sid)) for sid in due),
        )
        await self._settle(claimed, dict(zip(due, results, strict=True)))

    async def _claim(self, event_id: str, now: float, subscriptions: dict[str, Subscription]) -> Entry | None:
        """The entry, held by this process for a lease (confirmed, its subscriptions decided the first time), or
        None when another process holds it or it is gone."""
        lease = (self.holder, now + self.settings.events_lease)
        refused: list[Entry] = []

        def claim(entry: Entry) -> Entry | None:
            refused.clear()
            if entry.held_by_other(self.holder, now):
                refused.append(entry)
                return None
            targets = entry.targets
            if targets is None:
                targets = {sid: Target(0, now, now, "") for sid, sub in subscriptions.items() if sub.wants(entry.event)}
            return replace(entry, check=None, lease=lease, targets=targets)

        entry = await self.outbox.update(event_id, claim)
        if entry is None or refused:
            if refused and refused[0].lease is not None:
                self._later(event_id, refused[0].lease[1])
            return None
        return entry

    async def _send(self, entry: Entry, sub: Subscription | None) -> str | None:
        """One attempt to deliver ``entry`` to ``sub``: None when taken, else why not (a removed subscription takes
        it: there is nobody left to send it to)."""
        if sub is None:
            return None
        assert self._client is not None
        event = entry.event
        body = event.body()
        now = self.wall()
        headers = {
            "content-type": "application/json",
            "user-agent": "agent-transfer-webhooks",
            **webhook_headers(sub.in_force(now), event.id, int(now), body),
        }
        try:
            response = await self._client.post(
                sub.url, content=body, headers=headers, timeout=self.settings.events_timeout
            )
        except httpx.TimeoutException:
            error = f"no answer within {self.settings.events_timeout} s"
        except (httpx.HTTPError, DestinationRefused, OSError) as exc:
            error = (getattr(exc, "message", None) or str(exc) or type(exc).__name__)[:ERROR_TEXT]
        else:
            await response.aclose()
            if 200 <= response.status_code < 300:
                metrics.event_deliveries.labels("delivered").inc()
                return None
            error = f"HTTP {response.status_code}"
        metrics.event_deliveries.labels("failed").inc()
        return error

    async def _settle(self, claimed: Entry, results: dict[str, str | None]) -> None:
        """Record the results of one round by compare-and-set; bury what is past its age; delete what is done."""
        now = self.wall()
        s = self.settings
        dead: dict[str, Target] = {}

        def settle(entry: Entry) -> Entry:
            dead.clear()
            targets = dict(entry.targets or {})
            for sid, error in results.items():
                target = targets.get(sid)
                if target is None:
                    continue
                if error is None:
                    del targets[sid]
                    continue
                attempts = target.attempts + 1
                failed = Target(
                    attempts,
                    now + backoff(attempts, base=s.events_retry_base, cap=s.events_retry_max),
                    target.since,
                    error,
                )
                if now - target.since >= s.events_max_age:
                    dead[sid] = failed
                    del targets[sid]
                else:
                    targets[sid] = failed
            lease = None if entry.lease is not None and entry.lease[0] == self.holder else entry.lease
            return replace(entry, targets=targets, fed=True, lease=lease)

        entry = await self.outbox.update(claimed.event.id, settle)
        if entry is None:
            return
        if dead:
            metrics.event_deliveries.labels("dead").inc(len(dead))
            log.warning("event %s dead-lettered for %s", entry.event.id, ", ".join(sorted(dead)))
            await self.outbox.bury(entry, dead)
        if not entry.targets:
            await self.outbox.remove(entry.event.id)
            self._next.pop(entry.event.id, None)
            self.delivered += 1
        else:
            self._later(entry.event.id, entry.due(now))
