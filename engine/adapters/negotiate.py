"""Call planning: may this tool call run as a task, only synchronously, or not at all?

Pure: decides from negotiated ``Capabilities`` and the caller's limits alone. No I/O, no clock.
It never guesses support a server did not declare.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from engine.adapters.base import Capabilities, TaskSupport
from engine.errors import NegotiationError
from engine.model import Protocol


class CallMode(StrEnum):
    TASK = "task"
    """Submit as a task/operation and poll it."""
    SYNC = "sync"
    """Call synchronously (no task); the tool's published limit fits the caller's wait budget."""


@dataclass(frozen=True, slots=True)
class CallPlan:
    tool: str
    mode: CallMode
    reason: str


# AIP-151 publishes no tool list: every method that takes long returns an Operation by contract.
_UNLISTED_TOOLS = frozenset({Protocol.AIP_151})


def plan_call(
    caps: Capabilities, tool: str, *, sync_limit: timedelta | None, wait_budget: timedelta
) -> CallPlan:
    """Decide how ``tool`` may be called on the server ``caps`` describes.

    Args:
        caps: what negotiation found.
        tool: the tool's name.
        sync_limit: the tool's published synchronous limit (per-tool configuration), if any.
        wait_budget: how long the caller may wait for a synchronous answer.

    Returns:
        ``TASK`` when both the server and the tool allow a task, else ``SYNC`` when the tool's
        synchronous limit fits the wait budget.

    Raises:
        NegotiationError: the server does not offer the tool, the tool requires a task the server
            cannot run, or the call could only run synchronously and its limit is unknown or too long.
    """
    info = caps.tools.get(tool)
    if info is None and caps.protocol not in _UNLISTED_TOOLS:
        raise NegotiationError(f"the server does not offer tool {tool!r}")
    support = info.task_support if info is not None else TaskSupport.OPTIONAL
    if caps.tasks and support is not TaskSupport.FORBIDDEN:
        return CallPlan(tool, CallMode.TASK, f"server runs tool calls as tasks; tool allows it ({support})")
    if support is TaskSupport.REQUIRED:
        raise NegotiationError(
            f"tool {tool!r} requires a task, but the server ({caps.protocol}) does not support tasks "
            "for tools/call; refusing"
        )
    why_not = "the server does not support tasks" if not caps.tasks else f"tool {tool!r} forbids tasks"
    if sync_limit is None:
        raise NegotiationError(
            f"{why_not}, and tool {tool!r} publishes no synchronous limit; refusing the long call"
        )
    if sync_limit > wait_budget:
        raise NegotiationError(
            f"{why_not}, and tool {tool!r}'s synchronous limit {sync_limit} exceeds the wait budget "
            f"{wait_budget}; refusing"
        )
    return CallPlan(tool, CallMode.SYNC, f"{why_not}; synchronous limit {sync_limit} fits {wait_budget}")


__all__ = [
    "CallMode",
    "CallPlan",
    "plan_call",
]
