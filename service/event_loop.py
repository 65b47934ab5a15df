"""The event loop the executor's process runs on: uvloop's, for ``finality serve`` and the benchmarks
that measure its executor (``run``).

At 10,000 operations in flight asyncio's own Python (the selector loop, its socket transports,
timer handles) took about a fifth of the executor process's samples
(bench/results/profiles/scale-s11-before.md); uvloop runs the same asyncio API on libuv, in C. This module chooses the loop and nothing else: it must not change what runs on it
(the explorer and the tests keep their own loops).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a new uvloop event loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


__all__ = ["run"]
