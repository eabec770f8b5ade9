"""What one HTTP/2 connection may make the server do before any request on it is authenticated, counted as frames
arrive (the lessons of the 2019 Netflix advisories, CVE-2023-44487 "rapid reset" and the 2024 CONTINUATION flood,
as Go's ``net/http2``, nginx, Envoy and h2o apply them).

- **Frame sizes** (RFC 9113 §4.2): a frame longer than ``SETTINGS_MAX_FRAME_SIZE`` is refused as soon as its 9-byte
  header arrives (``FRAME_SIZE_ERROR``), not after its whole length has been buffered (the ``h2`` library checks it
  only once the frame is complete: up to 16 MiB held for a frame it then refuses).
- **Header blocks** (RFC 9113 §4.3, §6.10): the encoded bytes of one HEADERS block and its CONTINUATION frames are
  counted as each frame header arrives; past ``header_block`` bytes the connection ends with
  ``GOAWAY(ENHANCE_YOUR_CALM)`` before the frame's payload is buffered. ``h2`` alone holds up to 64 frames of the
  maximum frame size per block (64 MiB with 1 MiB frames) for as long as the client keeps the block open. The
  budget is ``SETTINGS_MAX_HEADER_LIST_SIZE``: HPACK never encodes a field longer than the 32 bytes of overhead
  that the list size counts per field (RFC 7541 §5.2, RFC 9113 §6.5.2), so a block within the list size fits it.
- **Resets** (rapid reset, CVE-2023-44487): a connection may reset ``reset_allowance`` streams more than it let
  this server answer, counting RST_STREAM frames from the client and the streams this server refused (a client
  that keeps opening streams past the limit is resetting them by proxy). A client that cancels some requests
  among many it lets finish never comes near it; one that opens streams only to reset them is stopped after
  ``reset_allowance`` of them, however fast or slow the server is at the time (a rate per second would not trip
  on a server the attack has already slowed down to that rate).
- **Frame rates**: SETTINGS, PING, PRIORITY (with RFC 9218's PRIORITY_UPDATE) and DATA frames carrying no data
  without END_STREAM, each kind counted on its own, are held to a rate per second with a burst of one second's
  worth (a token bucket; a long-lived connection legitimately sends a PING now and then). Past either bound the
  connection ends with ``GOAWAY(ENHANCE_YOUR_CALM)``. Counting happens frame by frame inside the parse loop, so a
  256 KiB read holding 17,000 SETTINGS frames stops at the first frame over budget instead of answering every one
  of them first (which held the event loop for seconds).
- **Fairness**: one call parses at most ``FRAMES_PER_TURN`` frames, a header-block frame counting as
  ``HEADER_WEIGHT`` (:attr:`GuardedFrameBuffer.more` says that some wait); the protocol lets the event loop serve
  other connections before it parses the rest. A read of 256 KiB can hold thousands of small frames, and ``h2``
  spends ~0.3 ms on each HEADERS frame: parsed in one go, one connection's read held every other client for a tenth
  of a second or more.

Nothing here does I/O: :class:`GuardedFrameBuffer` is the ``h2`` connection's frame buffer and raises
:class:`Abuse` (an ``h2`` ``DenialOfServiceError``, so ``h2`` itself queues the GOAWAY with its error code); the
protocol (:mod:`transfer.api.protocol.h2protocol`) logs one line, counts the metric and closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import h2.exceptions
from h2.frame_buffer import FrameBuffer
from hyperframe.frame import Frame

# frame types (RFC 9113 §6; RFC 9218 §7.1) and flags the guard reads from a frame's header
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING = 0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6
CONTINUATION, PRIORITY_UPDATE = 0x9, 0x10
END_STREAM, END_HEADERS, PADDED = 0x1, 0x4, 0x8
HEADER_BLOCK_TYPES = frozenset({HEADERS, PUSH_PROMISE, CONTINUATION})
FRAME_HEADER = 9
# frames parsed before other connections get the event loop, a header block frame counting as HEADER_WEIGHT (h2 spends
# ~0.3 ms on one HEADERS frame, ~20 µs on a DATA frame): 4 request heads, or a 512 KiB read of 16 KiB DATA frames
FRAMES_PER_TURN = 32
HEADER_WEIGHT = 8

# the metric label of each counted kind (transfer_h2_abuse{kind})
RATE_KINDS = {
    RST_STREAM: "reset",
    SETTINGS: "settings",
    PING: "ping",
    PRIORITY: "priority",
    PRIORITY_UPDATE: "priority",
}


class Abuse(h2.exceptions.DenialOfServiceError):
    """The peer broke one of the connection's bounds: ``h2`` answers GOAWAY(ENHANCE_YOUR_CALM)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class H2Limits:
    """The per-connection bounds of the module docstring."""

    header_block: int = 64 << 10  # encoded bytes of one header block
    reset_allowance: int = 100  # resets beyond the streams answered
    control_per_second: int = 200


class RateBudget:
    """A token bucket: ``per_second`` events a second, at most ``per_second`` at once."""

    __slots__ = ("capacity", "tokens", "stamp")

    def __init__(self, per_second: int, now: float) -> None:
        self.capacity = float(per_second)
        self.tokens = float(per_second)
        self.stamp = now

    def spend(self, now: float) -> bool:
        """One event at ``now``: False when the budget is exhausted."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.capacity)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class FrameGuard:
    """The counters of one connection (module docstring); ``clock`` is ``time.monotonic`` unless a test passes one."""

    def __init__(self, limits: H2Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        now = clock()
        self.resets = 0  # streams reset by the client or refused
        self.answered = 0  # responses this server completed
        self.control = {kind: RateBudget(limits.control_per_second, now) for kind in ("settings", "ping", "priority")}
        self.empty_data = RateBudget(limits.control_per_second, now)
        self.block = 0  # encoded header-block bytes of the block under way (0: none)

    def reset(self) -> None:
        """A stream was reset: by the client's RST_STREAM or by this server refusing it."""
        self.resets += 1
        if self.resets > self.limits.reset_allowance + self.answered:
            raise Abuse(
                "reset",
                f"{self.resets} streams reset for {self.answered} answered, over the allowance of "
                f"{self.limits.reset_allowance} (rapid reset, CVE-2023-44487)",
            )

    def response_done(self) -> None:
        """A response was sent whole: the client may reset one more stream."""
        self.answered += 1

    def frame_header(self, length: int, kind: int, flags: int, complete: bool, payload_first: int | None) -> None:
        """Check one frame by its header; ``complete``: its payload has arrived too (count it once, then);
        ``payload_first``: its first payload byte, when there is one (a DATA frame's pad length)."""
        if kind in HEADER_BLOCK_TYPES:
            if self.block + length > self.limits.header_block:
                raise Abuse(
                    "header_block",
                    f"a header block over {self.limits.header_block} bytes (HEADERS + CONTINUATION, RFC 9113 §6.10)",
                )
            if complete:
                self.block = 0 if flags & END_HEADERS else self.block + length
            return
        if not complete:
            return
        if kind == RST_STREAM:
            self.reset()
        elif kind in RATE_KINDS:
            label = RATE_KINDS[kind]
            if not self.control[label].spend(self.clock()):
                raise Abuse(label, f"more than {self.limits.control_per_second} {label} frames a second")
        elif kind == DATA and not flags & END_STREAM:
            carried = length
            if flags & PADDED and payload_first is not None:
                carried = length - 1 - payload_first
            if carried <= 0 and not self.empty_data.spend(self.clock()):
                raise Abuse(
                    "empty_data",
                    f"more than {self.limits.control_per_second} empty DATA frames a second (CVE-2019-9518)",
                )


class GuardedFrameBuffer(FrameBuffer):
    """``h2``'s frame buffer with the checks of :class:`FrameGuard` run on each frame header as soon as it arrives."""

    def __init__(self, guard: FrameGuard) -> None:
        super().__init__(server=True)
        self.guard = guard
        self.parsed = 0  # frames parsed in this turn
        self.more = False  # frames were left for the next turn

    def add_data(self, data: bytes | memoryview) -> None:  # type: ignore[override]
        super().add_data(data)
        self.parsed = 0  # ``h2`` calls this at the start of each receive_data(): a new turn
        self.more = False

    def __next__(self) -> Frame:
        data = self._data
        if self.parsed >= FRAMES_PER_TURN and len(data) >= FRAME_HEADER:
            self.more = True  # the rest waits for the next turn (``receive_data(b"")``)
            raise StopIteration
        if len(data) >= FRAME_HEADER:
            length = int.from_bytes(data[0:3], "big")
            if length > self.max_frame_size:  # RFC 9113 §4.2, before the payload is buffered
                raise h2.exceptions.FrameTooLargeError(f"frame of {length} bytes, over {self.max_frame_size}")
            complete = len(data) >= FRAME_HEADER + length
            if complete:
                self.parsed += HEADER_WEIGHT if data[3] in HEADER_BLOCK_TYPES else 1
            first = data[FRAME_HEADER] if complete and length else None
            self.guard.frame_header(length, data[3], data[4], complete, first)
        # the parent parses the frame, and calls this method again for the next one when it swallows a CONTINUATION
        return super().__next__()
