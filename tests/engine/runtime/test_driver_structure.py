"""The driver is split by concern: no part of it over 500 lines, and each method written in one part."""

from __future__ import annotations

import inspect

from engine.runtime.driver import Driver


def _parts() -> list[type]:
    """The classes ``Driver`` is composed of, itself included."""
    return [c for c in Driver.__mro__ if c.__module__.startswith("engine.runtime.")]


def test_no_part_of_the_driver_is_over_500_lines() -> None:
    """Each concern of the driver (recording, submission, polling, cancelling, approvals) is at most 500 lines."""
    sizes = {part.__name__: len(inspect.getsourcelines(part)[0]) for part in _parts()}
    assert {"Driver", "DriverCore", "Submission", "Polling", "Cancelling", "Approvals"} <= set(sizes), sizes
    assert max(sizes.values()) <= 500, sizes


def test_each_method_of_the_driver_is_written_in_one_of_its_parts() -> None:
    """No part of ``Driver`` writes a method another part writes too (one would silently win)."""
    seen: dict[str, str] = {}
    for part in _parts():
        for name, value in vars(part).items():
            if inspect.isfunction(value) and not name.startswith("__"):
                assert name not in seen, f"{name} is written in {seen[name]} and in {part.__name__}"
                seen[name] = part.__name__
    assert {"advance", "commit", "request_cancel", "record_answer", "resubmit", "submit_new"} <= set(seen)
