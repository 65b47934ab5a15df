"""The one bounded wait: it returns what the predicate found, and gives up at its deadline naming what it waited for."""

from __future__ import annotations

import pytest

from engine.clock import monotonic_seconds
from engine.testing.wait import wait_until, wait_until_async


def test_a_wait_returns_the_first_truthy_answer_without_pausing_once_it_holds() -> None:
    """The predicate is asked until it answers; the answer itself comes back, and no look is skipped."""
    answers = iter([None, 0, "", {"status": "done"}])
    assert wait_until(lambda: next(answers), timeout=5, every=0.001) == {"status": "done"}
    started = monotonic_seconds()
    assert wait_until(lambda: 7, timeout=5, every=60) == 7  # already true: no pause of a minute
    assert monotonic_seconds() - started < 5


def test_a_wait_that_never_holds_fails_at_its_deadline_naming_what_it_waited_for() -> None:
    """No wait is unbounded: past ``timeout`` it raises AssertionError with ``what`` in the message."""
    looks = 0

    def never() -> bool:
        nonlocal looks
        looks += 1
        return False

    started = monotonic_seconds()
    with pytest.raises(AssertionError, match=r"timed out after 0\.05 s waiting for the server to answer"):
        wait_until(never, timeout=0.05, every=0.01, what="the server to answer")
    assert monotonic_seconds() - started >= 0.05
    assert looks >= 2


async def test_the_async_wait_lets_the_loop_run_and_is_bounded_the_same_way() -> None:
    """On an event loop the wait yields between looks, and fails at ``within`` like the thread's wait."""
    assert await wait_until_async(lambda: "ready", within=5) == "ready"
    with pytest.raises(AssertionError, match="waiting for nothing"):
        await wait_until_async(lambda: False, within=0.02, every=0.005, what="nothing")
