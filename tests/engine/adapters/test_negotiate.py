"""Call planning: a task where both sides allow it, a synchronous call only within budget, else refuse."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.adapters.base import Capabilities, TaskSupport, ToolInfo
from engine.adapters.negotiate import CallMode, plan_call
from engine.errors import NegotiationError
from engine.model import Protocol

MINUTE = timedelta(minutes=1)


def caps(support: TaskSupport | None, *, tasks: bool = True, protocol: Protocol = Protocol.MCP_2025_11_25):
    tools = {} if support is None else {"tool": ToolInfo("tool", support)}
    return Capabilities(
        protocol=protocol, tasks=tasks, cancel=tasks, list=False, lookup_by_key=False, tools=tools
    )


@pytest.mark.parametrize("support", [TaskSupport.OPTIONAL, TaskSupport.REQUIRED])
def test_a_tool_that_allows_tasks_on_a_task_server_runs_as_a_task(support):
    """Server support plus optional/required tool support plans a task."""
    plan = plan_call(caps(support), "tool", sync_limit=None, wait_budget=MINUTE)
    assert plan.mode is CallMode.TASK


def test_a_required_tool_on_a_server_without_tasks_is_refused():
    """'required' with no server support can run neither way."""
    with pytest.raises(NegotiationError, match="requires a task"):
        plan_call(caps(TaskSupport.REQUIRED, tasks=False), "tool", sync_limit=MINUTE, wait_budget=MINUTE)


@pytest.mark.parametrize(("support", "tasks"), [(TaskSupport.FORBIDDEN, True), (TaskSupport.OPTIONAL, False)])
def test_without_task_support_a_call_runs_synchronously_when_its_limit_fits_the_budget(support, tasks):
    """A forbidden tool, or a server without tasks, falls back to a synchronous call within budget."""
    plan = plan_call(caps(support, tasks=tasks), "tool", sync_limit=MINUTE, wait_budget=2 * MINUTE)
    assert plan.mode is CallMode.SYNC


def test_without_a_published_synchronous_limit_the_long_call_is_refused():
    """No limit, no synchronous fallback."""
    with pytest.raises(NegotiationError, match="no synchronous limit"):
        plan_call(caps(TaskSupport.FORBIDDEN), "tool", sync_limit=None, wait_budget=MINUTE)


def test_a_synchronous_limit_longer_than_the_wait_budget_is_refused():
    """The caller would give up before the tool is done."""
    with pytest.raises(NegotiationError, match="exceeds the wait budget"):
        plan_call(caps(TaskSupport.FORBIDDEN), "tool", sync_limit=10 * MINUTE, wait_budget=MINUTE)


def test_a_tool_the_server_does_not_list_is_refused_on_mcp():
    """MCP servers list their tools; an unlisted one is not offered."""
    with pytest.raises(NegotiationError, match="does not offer"):
        plan_call(caps(None), "tool", sync_limit=MINUTE, wait_budget=MINUTE)


def test_aip_151_runs_every_call_as_an_operation():
    """AIP-151 publishes no tool list; every long method returns an Operation."""
    plan = plan_call(caps(None, protocol=Protocol.AIP_151), "tool", sync_limit=None, wait_budget=MINUTE)
    assert plan.mode is CallMode.TASK


@given(
    support=st.sampled_from(TaskSupport),
    tasks=st.booleans(),
    limit=st.one_of(st.none(), st.integers(0, 600).map(lambda s: timedelta(seconds=s))),
    budget=st.integers(0, 600).map(lambda s: timedelta(seconds=s)),
)
def test_a_plan_never_sends_a_task_that_was_not_declared_nor_waits_past_the_budget(
    support, tasks, limit, budget
):
    """Property: TASK only with server and tool support; SYNC only within budget and never for 'required'."""
    try:
        plan = plan_call(caps(support, tasks=tasks), "tool", sync_limit=limit, wait_budget=budget)
    except NegotiationError:
        return
    if plan.mode is CallMode.TASK:
        assert tasks
        assert support is not TaskSupport.FORBIDDEN
    else:
        assert support is not TaskSupport.REQUIRED
        assert limit is not None
        assert limit <= budget
