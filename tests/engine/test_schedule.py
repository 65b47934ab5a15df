"""Poll timing: jitter bounds, Retry-After, budgets, expiry, and the QPS window."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.schedule import PollPolicy, RateWindow, busiest_window, next_poll_at, poll_delay, retry_delay
from engine.testing import EPOCH_START

POLICY = PollPolicy(
    default_interval=timedelta(seconds=1),
    min_interval=timedelta(milliseconds=50),
    max_interval=timedelta(seconds=30),
    jitter=0.2,
)


@given(advised_ms=st.one_of(st.none(), st.integers(0, 120_000)), seed=st.integers(0, 2**32))
def test_jitter_stays_within_bounds_and_never_polls_early(advised_ms: int | None, seed: int) -> None:
    """The delay is the clamped advice plus at most 20 % of it, never less than the advice."""
    advised = timedelta(milliseconds=advised_ms) if advised_ms is not None else None
    base = min(
        max(POLICY.default_interval if advised is None else advised, POLICY.min_interval), POLICY.max_interval
    )
    delay = poll_delay(POLICY, advised, random.Random(seed))
    assert base <= delay <= base * 1.2


def test_same_seed_gives_the_same_schedule() -> None:
    """Randomness comes only from the injected generator."""
    a = [poll_delay(POLICY, timedelta(seconds=2), random.Random(7)) for _ in range(3)]
    b = [poll_delay(POLICY, timedelta(seconds=2), random.Random(7)) for _ in range(3)]
    assert a == b


def test_retry_after_is_honoured() -> None:
    """A server's Retry-After is waited out in full."""
    delay = retry_delay(POLICY, 1, timedelta(seconds=3), random.Random(1))
    assert timedelta(seconds=3) <= delay < timedelta(seconds=3) + POLICY.min_interval


def test_backoff_grows_and_is_capped() -> None:
    """Without Retry-After the wait doubles per failure, up to the maximum interval."""
    rng = random.Random(3)
    assert retry_delay(POLICY, 40, None, rng) <= POLICY.max_interval
    assert retry_delay(POLICY, 1, None, rng) <= POLICY.retry_backoff


def test_no_poll_is_planned_past_the_wait_budget() -> None:
    """A poll that would land after the deadline is not planned."""
    assert (
        next_poll_at(EPOCH_START, timedelta(seconds=5), deadline=EPOCH_START + timedelta(seconds=4)) is None
    )


def test_last_poll_happens_at_expiry_at_the_latest() -> None:
    """A poll is pulled forward to the expiry instant, so the outcome is read before deletion."""
    expires = EPOCH_START + timedelta(seconds=2)
    assert next_poll_at(EPOCH_START, timedelta(seconds=5), expires_at=expires) == expires


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 20),
    gaps_ms=st.lists(st.integers(0, 400), min_size=1, max_size=200),
)
def test_rate_window_holds_in_every_one_second_window(limit: int, gaps_ms: list[int]) -> None:
    """Whatever the arrival pattern, sends that wait for ``earliest`` never exceed the limit in any 1 s window."""
    window = RateWindow(limit)
    now = EPOCH_START
    sent = []
    for gap in gaps_ms:
        now += timedelta(milliseconds=gap)
        at = max(now, window.earliest(now))
        assert window.take(at)
        sent.append(at)
        now = at
    assert busiest_window(sent) <= limit


def test_rate_window_refuses_a_send_over_the_limit() -> None:
    """take() refuses, and records nothing, when the window is full."""
    window = RateWindow(2)
    assert window.take(EPOCH_START)
    assert window.take(EPOCH_START)
    assert not window.take(EPOCH_START + timedelta(milliseconds=999))
    assert window.take(EPOCH_START + timedelta(seconds=1))


@settings(max_examples=200, deadline=None)
@given(
    global_limit=st.integers(1, 15),
    server_limit=st.integers(1, 15),
    arrivals=st.lists(st.tuples(st.integers(0, 300), st.booleans()), min_size=1, max_size=200),
)
def test_booked_slots_keep_every_window_and_serve_first_come_first(
    global_limit: int, server_limit: int, arrivals: list[tuple[int, bool]]
) -> None:
    """Slots booked across a global and a per-server window respect both limits, in arrival order."""
    overall, server = RateWindow(global_limit), RateWindow(server_limit)
    now = EPOCH_START
    booked: list[tuple[datetime, bool]] = []
    for gap, to_server in arrivals:
        now += timedelta(milliseconds=gap)
        windows = [overall, server] if to_server else [overall]
        at = max(w.slot(now) for w in windows)
        for w in windows:
            w.reserve(at)
        booked.append((at, to_server))
    times = [at for at, _ in booked]
    assert times == sorted(times)
    assert busiest_window(times) <= global_limit
    assert busiest_window([at for at, s in booked if s]) <= server_limit
