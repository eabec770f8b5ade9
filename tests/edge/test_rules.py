"""The connection layer's counting rules on their own, no sockets (transfer.api.protocol.h2guard, .admission,
transfer.service.agents.subscriptions): the boundaries the attack tests (``tests/edge/``) rely on, each checked
at its edge with a clock the test moves."""

from __future__ import annotations

import asyncio

import h2.exceptions
import pytest

from tests.edge.attacks import CONTINUATION, DATA, END_HEADERS, HEADERS, PING, RST_STREAM, SETTINGS, frame
from transfer.api.protocol.admission import PENALISED, ConnectionLimits
from transfer.api.protocol.h2guard import (
    FRAMES_PER_TURN,
    HEADER_WEIGHT,
    Abuse,
    FrameGuard,
    GuardedFrameBuffer,
    H2Limits,
    RateBudget,
)
from transfer.errors import TooManyConnections, TooManySubscriptions
from transfer.service.agents.subscriptions import Outbox, SubscriptionLedger


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def buffer(limits: H2Limits | None = None, clock: Clock | None = None, max_frame: int = 1 << 20) -> GuardedFrameBuffer:
    frames = GuardedFrameBuffer(FrameGuard(limits or H2Limits(), clock or Clock()))
    frames._preamble_len = 0  # past the connection preface
    frames.max_frame_size = max_frame
    return frames


def parse(frames: GuardedFrameBuffer, data: bytes) -> list[object]:
    frames.add_data(data)
    return list(frames)


def test_a_rate_budget_allows_its_rate_with_a_burst_of_one_second() -> None:
    budget = RateBudget(10, now=0.0)
    assert all(budget.spend(0.0) for _ in range(10)) and not budget.spend(0.0)
    assert budget.spend(0.1) and not budget.spend(0.1)  # a tenth of a second buys one
    assert sum(budget.spend(10.0) for _ in range(20)) == 10  # idle time never banks more than the burst


def test_a_header_block_over_the_budget_is_refused_on_the_frame_header_before_its_payload() -> None:
    frames = buffer(H2Limits(header_block=1000))
    assert parse(frames, frame(HEADERS, 0, 1, b"a" * 600)) == []  # the block begins (no END_HEADERS)
    assert parse(frames, frame(CONTINUATION, 0, 1, b"b" * 300)) == []
    with pytest.raises(Abuse) as abuse:  # 9 header bytes of the next frame are enough: its payload never came
        parse(frames, frame(CONTINUATION, 0, 1, b"c" * 200)[:9])
    assert abuse.value.kind == "header_block" and abuse.value.error_code == 0xB


def test_a_block_exactly_at_the_budget_passes_and_the_next_block_starts_from_zero() -> None:
    frames = buffer(H2Limits(header_block=1000))
    parse(frames, frame(HEADERS, 0, 1, b"a" * 500))
    (block,) = parse(frames, frame(CONTINUATION, END_HEADERS, 1, b"b" * 500))  # one HEADERS frame, joined by h2
    assert len(block.data) == 1000 and frames.guard.block == 0  # type: ignore[attr-defined]
    parse(frames, frame(HEADERS, 0, 3, b"c" * 1000))  # the next block has the whole budget again


def test_a_frame_over_the_maximum_size_is_refused_before_its_payload_is_buffered() -> None:
    frames = buffer(max_frame=16384)
    with pytest.raises(h2.exceptions.FrameTooLargeError):
        parse(frames, frame(DATA, 0, 1, b"")[:0] + (16385).to_bytes(3, "big") + bytes([DATA, 0]) + (1).to_bytes(4))


def test_resets_are_allowed_beyond_the_answered_responses_up_to_the_allowance() -> None:
    guard = FrameGuard(H2Limits(reset_allowance=3), Clock())
    for _ in range(3):
        guard.reset()
    guard.response_done()  # one answered buys one more reset
    guard.reset()
    with pytest.raises(Abuse) as abuse:
        guard.reset()
    assert abuse.value.kind == "reset" and "5 streams reset for 1 answered" in str(abuse.value)


@pytest.mark.parametrize(
    ("kind", "one", "label"),
    [
        (SETTINGS, frame(SETTINGS, 0, 0), "settings"),
        (PING, frame(PING, 0, 0, bytes(8)), "ping"),
        (DATA, frame(DATA, 0, 1), "empty_data"),
        (DATA, frame(DATA, 0x8, 1, b"\x03abc"), "empty_data"),  # padded, no data: counted as empty
        (RST_STREAM, frame(RST_STREAM, 0, 1, bytes(4)), "reset"),
    ],
)
def test_control_frames_past_their_rate_end_the_connection(kind: int, one: bytes, label: str) -> None:
    clock = Clock()
    guard = FrameGuard(H2Limits(reset_allowance=20, control_per_second=20), clock)
    for _ in range(20):
        guard.frame_header(len(one) - 9, kind, one[4], True, one[9] if len(one) > 9 else None)
    with pytest.raises(Abuse) as abuse:
        guard.frame_header(len(one) - 9, kind, one[4], True, one[9] if len(one) > 9 else None)
    assert abuse.value.kind == label
    if kind != RST_STREAM:  # a rate: a second later there is room again; resets are not a rate
        clock.now += 1
        guard.frame_header(len(one) - 9, kind, one[4], True, one[9] if len(one) > 9 else None)


def test_data_with_bytes_or_end_stream_is_never_counted_as_empty() -> None:
    guard = FrameGuard(H2Limits(control_per_second=10), Clock())
    for _ in range(1000):
        guard.frame_header(5, DATA, 0, True, 0x61)
        guard.frame_header(0, DATA, 0x1, True, None)


def test_frames_are_parsed_in_turns_header_blocks_weighing_more() -> None:
    frames = buffer()
    many = frame(SETTINGS, 0x1, 0) * (FRAMES_PER_TURN + 5)  # SETTINGS ACKs: parsed, no answer needed
    frames.add_data(many)
    assert len(list(frames)) == FRAMES_PER_TURN and frames.more
    frames.add_data(b"")
    assert len(list(frames)) == 5 and not frames.more
    assert FRAMES_PER_TURN // HEADER_WEIGHT >= 1  # at least one request head per turn


def test_connection_limits_per_process_per_client_and_the_trusted_proxies() -> None:
    limits = ConnectionLimits(4, 2, ["10.0.0.0/8"])
    one, two = limits.admit("192.0.2.1"), limits.admit("192.0.2.1")
    assert limits.admit("192.0.2.1") == "client"
    proxy = [limits.admit("10.1.2.3"), limits.admit("10.1.2.3")]  # a trusted proxy: only the process limit
    assert limits.admit("192.0.2.2") == "process"
    assert not isinstance(one, str) and not isinstance(two, str)
    one.release()
    one.release()  # once only
    assert limits.open == 3 and limits.by_client == {"192.0.2.1": 1}
    assert not isinstance(limits.admit("192.0.2.1"), str)
    for ticket in [two, *proxy]:
        assert not isinstance(ticket, str)
        ticket.release()
    assert limits.by_client == {"192.0.2.1": 1} and limits.open == 1
    error = limits.message("client")
    assert isinstance(error, TooManyConnections) and error.status == 503 and error.detail == {"limit": "client"}


def test_an_address_that_drew_enhance_your_calm_waits_out_its_penalty() -> None:
    clock = Clock()
    limits = ConnectionLimits(100, 0, ["127.0.0.0/8"], penalty=10, clock=clock)
    ticket = limits.admit("192.0.2.9")
    assert not isinstance(ticket, str)
    ticket.punish()
    assert limits.admit("192.0.2.9") == "penalty"
    limits.punish("127.0.0.1")  # a trusted proxy's address is never penalised
    limits.punish(None)
    assert not isinstance(limits.admit("127.0.0.1"), str)
    clock.now += 10.1
    assert not isinstance(limits.admit("192.0.2.9"), str) and limits.penalised == {}


def test_penalties_are_remembered_for_a_bounded_number_of_addresses() -> None:
    clock = Clock()
    limits = ConnectionLimits(100, 0, [], penalty=10, clock=clock)
    for n in range(PENALISED + 50):
        limits.punish(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
    assert len(limits.penalised) <= PENALISED


def test_the_subscription_ledger_per_key_and_per_process() -> None:
    ledger = SubscriptionLedger(websockets_per_key=2, websockets=3, subscriptions_per_key=3, subscriptions=4)
    ledger.connect("a")
    ledger.connect("a")
    with pytest.raises(TooManyConnections, match="this key holds 2"):
        ledger.connect("a")
    ledger.connect("b")
    with pytest.raises(TooManyConnections, match="this server holds 3"):
        ledger.connect("c")
    for _ in range(3):
        ledger.subscribe("a")
    with pytest.raises(TooManySubscriptions, match="this key holds 3"):
        ledger.subscribe("a")
    ledger.subscribe("b")
    with pytest.raises(TooManySubscriptions, match="this server holds 4"):
        ledger.subscribe("b")
    ledger.unsubscribe("a", 3)
    ledger.disconnect("a")
    ledger.subscribe("b")
    ledger.connect("c")
    assert ledger.held_by_key == {"b": 2} and ledger.open_by_key == {"a": 1, "b": 1, "c": 1}


@pytest.mark.anyio
async def test_a_websocket_outbox_is_bounded_in_size_dropping_notifies_and_holding_answers() -> None:
    outbox = Outbox(limit=100)
    for n in range(30):
        outbox.drop_in(f"{n:04d}" * 5)  # 20 characters each: the oldest go
    assert outbox.size <= 100 and list(outbox.items) == [f"{n:04d}" * 5 for n in range(25, 30)]
    waiting = asyncio.ensure_future(outbox.put("x" * 20))  # an answer waits for room instead
    await asyncio.sleep(0)
    assert not waiting.done()
    assert await outbox.get() == "0025" * 5
    await asyncio.wait_for(waiting, 1)
    assert outbox.items[-1] == "x" * 20 and outbox.size == 100


def test_the_limits_docs_security_states_are_the_settings_defaults() -> None:
    """docs/SECURITY.md "Limits and timeouts": every row names settings and their defaults; a default changed in
    the code and not on the page (or the reverse) fails here."""
    import json as _json
    import re
    from pathlib import Path

    from transfer.settings import Settings

    page = (Path(__file__).resolve().parents[2] / "docs" / "SECURITY.md").read_text()
    table = page.split("### Limits and timeouts", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) >= 18
    units = {"KiB": 1 << 10, "MiB": 1 << 20}

    def value(text: str) -> object:
        text = text.strip().strip("`")
        if text.startswith("["):
            return _json.loads(text)
        number, _, unit = text.partition(" ")
        return int(number) * units[unit] if unit else _json.loads(number)

    for row in rows:
        names_cell, defaults_cell = row.split("|")[1:3]
        names = re.findall(r"`([a-z0-9_]+)`", names_cell)
        defaults = [value(v) for v in re.split(r",\s*(?![^\[]*\])", defaults_cell)]
        assert len(names) == len(defaults), row
        for name, stated in zip(names, defaults, strict=True):
            field = Settings.model_fields[name]
            default = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
            assert stated == default, (name, stated, default)


def test_trusted_proxies_must_be_networks() -> None:
    from pydantic import ValidationError

    from transfer.settings import Settings

    with pytest.raises(ValidationError, match="not a network"):
        Settings(trusted_proxies=["10.0.0.0/8", "proxy.example"])
    assert Settings(trusted_proxies=["10.1.2.3", "fd00::/8"]).trusted_proxies == ["10.1.2.3", "fd00::/8"]
