"""What TP WebSocket subscribers hold, counted across connections: connections and subscriptions per API key and
per process (one connection's own bound is ``tp_max_subscriptions`` resource ids, in the binding).

A subscription is one topic a connection hears: a resource id followed is two (the notifies relayed about it and,
for an import, its progress), each sender inbox one. Each costs the process a set entry and the topic's name, a few
hundred bytes (a connection delivers every topic into its one outbox; there is no queue or task per topic), and is
let go when its connection closes.

- per key: ``tp_max_websockets_per_key`` connections, ``tp_max_subscriptions_per_key`` subscriptions;
- per process: ``tp_max_websockets`` connections, ``tp_max_subscriptions_total`` subscriptions;
- per connection: what waits to be sent, ``OUTBOX_BYTES`` (:class:`Outbox`).

Callers without a key (the service runs open) count as one key. A connection past a limit is refused at the
handshake (``too_many_connections``); a subscription past one closes its connection with 1008 and
``too_many_subscriptions``, as the per-connection bound does.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field

from transfer.errors import TooManyConnections, TooManySubscriptions
from transfer.settings import Settings


@dataclass
class SubscriptionLedger:
    """The counts of the module docstring, for one process."""

    websockets_per_key: int = 100
    websockets: int = 1000
    subscriptions_per_key: int = 10_000
    subscriptions: int = 100_000
    open_by_key: dict[str, int] = field(default_factory=dict)
    held_by_key: dict[str, int] = field(default_factory=dict)
    open_total: int = 0
    held_total: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> SubscriptionLedger:
        """The limits ``settings`` name (``tp_max_websockets*``, ``tp_max_subscriptions_*``), nothing counted yet."""
        return cls(
            settings.tp_max_websockets_per_key,
            settings.tp_max_websockets,
            settings.tp_max_subscriptions_per_key,
            settings.tp_max_subscriptions_total,
        )

    def connect(self, key: str) -> None:
        """A WebSocket connection of ``key`` (its name; "" without keys) opens; TooManyConnections past a limit."""
        if self.open_total >= self.websockets:
            raise TooManyConnections(
                f"this server holds {self.websockets} TP WebSocket connections, its limit; retry shortly",
                headers={"retry-after": "1"},
                limit="websocket_process",
            )
        if self.open_by_key.get(key, 0) >= self.websockets_per_key:
            raise TooManyConnections(
                f"this key holds {self.websockets_per_key} TP WebSocket connections, its limit; close one first",
                headers={"retry-after": "1"},
                limit="websocket_key",
            )
        self.open_total += 1
        self.open_by_key[key] = self.open_by_key.get(key, 0) + 1

    def disconnect(self, key: str) -> None:
        """A WebSocket connection of ``key`` closed (after it let go of its subscriptions: :meth:`unsubscribe`)."""
        self.open_total -= 1
        self._drop(self.open_by_key, key, 1)

    def unsubscribe(self, key: str, count: int) -> None:
        """``key`` let go of ``count`` subscriptions."""
        self.held_total -= count
        self._drop(self.held_by_key, key, count)

    def subscribe(self, key: str) -> None:
        """One more subscription for ``key``; TooManySubscriptions past a limit."""
        if self.held_total >= self.subscriptions:
            raise TooManySubscriptions(f"this server holds {self.subscriptions} subscriptions, its limit")
        if self.held_by_key.get(key, 0) >= self.subscriptions_per_key:
            raise TooManySubscriptions(f"this key holds {self.subscriptions_per_key} subscriptions, its limit")
        self.held_total += 1
        self.held_by_key[key] = self.held_by_key.get(key, 0) + 1

    @staticmethod
    def _drop(counts: dict[str, int], key: str, amount: int) -> None:
        left = counts.get(key, 0) - amount
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)


OUTBOX_BYTES = 4 << 20  # characters of envelopes waiting to go out on one connection (at least two of the largest)


class Outbox:
    """What waits to go out on one WebSocket connection, at most ``limit`` characters (and 1,000 envelopes):
    answers to the client's own messages wait for room (:meth:`put`: the connection stops reading its messages
    meanwhile), notifies published to its subscriptions drop the oldest waiting instead (:meth:`drop_in`: a
    publisher never waits for a slow subscriber). A count alone let 1,000 relayed envelopes of up to 1 MiB each wait
    for a client that does not read."""

    def __init__(self, limit: int, count: int = 1000) -> None:
        self.limit = limit
        self.count = count
        self.items: collections.deque[str] = collections.deque()
        self.size = 0
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def _full(self) -> bool:
        return self.size >= self.limit or len(self.items) >= self.count

    def _append(self, text: str) -> None:
        self.items.append(text)
        self.size += len(text)
        self._ready.set()
        if self._full():
            self._room.clear()

    async def put(self, text: str) -> None:
        """Queue ``text`` once there is room."""
        while self._full():
            await self._room.wait()
        self._append(text)

    def drop_in(self, text: str) -> None:
        """Queue ``text`` now, dropping the oldest waiting envelopes to make room."""
        while self.items and (self.size + len(text) > self.limit or len(self.items) >= self.count):
            self.size -= len(self.items.popleft())
        self._append(text)

    async def get(self) -> str:
        """The oldest envelope waiting (once there is one)."""
        while not self.items:
            self._ready.clear()
            await self._ready.wait()
        text = self.items.popleft()
        self.size -= len(text)
        if not self._full():
            self._room.set()
        return text
