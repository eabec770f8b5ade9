"""A process-wide budget of buffer bytes: a semaphore counted in bytes, first come first served.

Every upload of a backend takes its part buffers from one budget, so the memory they hold is bounded for the
process, whatever the number of concurrent uploads: an upload that finds the budget spent waits (and stops reading
its request body, so TCP flow control slows its client) until a part in flight is stored and gives its bytes back.

Deadlock-free by construction as long as every holder can finish what it holds without asking for more: a writer
takes the whole of a part's buffer before it starts filling it (never byte by byte), the small objects a holder
writes meanwhile (records) take nothing from the budget, and a request larger than the whole budget is served as
the whole budget (one such holder at a time).

The budget also keeps the buffers it has handed out once they come back (:meth:`ByteBudget.buffer`,
:meth:`ByteBudget.give_back`): a part buffer is allocated once and filled again by the next part, of this upload or
another, so the process neither pays for fresh memory on every part (page faults, zeroing: it was the largest cost
on the event loop of an upload into S3) nor returns it to the system and takes it again. What the budget holds,
handed out and kept together, never exceeds its total.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class ByteBudget:
    """``total`` bytes shared by every holder; :meth:`acquire` waits in arrival order."""

    def __init__(self, total: int) -> None:
        if total <= 0:
            raise ValueError("a budget needs at least one byte")
        self.total = total
        self.in_use = 0
        self.peak = 0  # the most bytes held at once (tests and benchmarks read it)
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._free: list[bytearray] = []  # buffers given back, for the next holder of the same size
        self._free_bytes = 0

    @property
    def kept(self) -> int:
        """Bytes of buffers given back and kept for reuse (not held by anyone)."""
        return self._free_bytes

    def buffer(self, n: int) -> bytearray:
        """A buffer of exactly ``n`` bytes for ``n`` bytes already held (:meth:`acquire`): one given back earlier
        when one of that size is kept (its old contents are still in it), else a new one."""
        for i in range(len(self._free) - 1, -1, -1):
            if len(self._free[i]) == n:
                found = self._free.pop(i)
                self._free_bytes -= n
                return found
        # none of that size: what is held and what is kept must not exceed the total once this one is allocated,
        # so kept buffers (of other sizes) go first, the oldest first
        while self._free and self.in_use + self._free_bytes > self.total:
            self._free_bytes -= len(self._free.pop(0))
        return bytearray(n)

    def give_back(self, buf: bytearray, held: int) -> None:
        """Release ``held`` bytes and keep ``buf`` (when it is exactly that size) for the next :meth:`buffer`; the
        caller must not touch ``buf`` again."""
        if len(buf) == held and held > 0:
            self._free.append(buf)
            self._free_bytes += held
        self.release(held)

    def clamp(self, n: int) -> int:
        """What a request for ``n`` bytes really holds: never more than the whole budget."""
        return max(0, min(n, self.total))

    async def acquire(self, n: int) -> int:
        """Hold ``n`` bytes (at most the whole budget); returns what is held, to give back with :meth:`release`."""
        n = self.clamp(n)
        if not self._waiters and self.in_use + n <= self.total:
            self._take(n)
            return n
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, future)
        self._waiters.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release(n)  # granted just as it was cancelled: give it back
            else:
                with contextlib.suppress(ValueError):  # _wake may have dropped it already
                    self._waiters.remove(entry)
                self._wake()  # a smaller request behind it may fit now
            raise
        return n

    def release(self, n: int) -> None:
        """Give back ``n`` bytes taken by :meth:`acquire`."""
        self.in_use -= n
        if self.in_use < 0:
            raise RuntimeError("released more bytes than were held")
        self._wake()

    def _take(self, n: int) -> None:
        self.in_use += n
        self.peak = max(self.peak, self.in_use)

    def _wake(self) -> None:
        while self._waiters:
            n, future = self._waiters[0]
            if future.done():  # cancelled, being removed by its owner
                self._waiters.popleft()
                continue
            if self.in_use + n > self.total:
                return  # first come first served: nobody overtakes the head
            self._waiters.popleft()
            self._take(n)
            future.set_result(None)
