"""Fault references, plans and budgets, and the ``_sim`` parser."""

from __future__ import annotations

import pytest

from refserver.fault import (
    Fault,
    FaultBook,
    FaultError,
    FaultPlan,
    FaultRequest,
    parse_fault_ref,
    parse_params,
)
from refserver.sim import SimError, SimOutcome, parse_sim


def test_fault_reference_accepts_a_name_or_an_object_with_params():
    """``"poll_429"`` and ``{"name": "poll_429", "times": 2}`` are both valid references."""
    assert parse_fault_ref("poll_429") == FaultRequest(Fault.POLL_429)
    ref = parse_fault_ref({"name": "poll_429", "times": 2, "retry_after_s": 0})
    assert ref.params.times == 2
    assert ref.params.retry_after_s == 0
    nested = parse_fault_ref({"name": "slow_response", "params": {"delay_ms": 5}})
    assert nested.params.delay_ms == 5


@pytest.mark.parametrize(
    "raw",
    ["poll_430", {"name": 3}, {"name": "poll_429", "times": 0}, {"name": "poll_429", "bogus": 1}, 7],
)
def test_bad_fault_references_are_refused_with_a_reason(raw):
    """Unknown names, bad params and wrong types raise FaultError."""
    with pytest.raises(FaultError):
        parse_fault_ref(raw)


def test_fault_params_reject_negative_delay():
    """delay_ms must not be negative."""
    with pytest.raises(FaultError):
        parse_params({"delay_ms": -1})


def test_count_rule_arms_only_the_first_n_matching_calls():
    """A count rule fires on the first N calls of its tool and ignores other tools."""
    plan = FaultPlan.from_json({"rules": [{"fault": "result_lost", "tool": "generate_report", "count": 2}]})
    fired = [bool(plan.arm("generate_report")) for _ in range(4)]
    assert fired == [True, True, False, False]
    assert plan.arm("apply_batch_change") == []


def test_rate_rule_is_deterministic_for_a_seed():
    """Two plans with the same seed fire on the same calls; the rate is roughly honoured."""
    raw = {"seed": 42, "rules": [{"fault": "poll_503", "tool": "*", "rate": 0.3}]}
    first = [bool(FaultPlan.from_json(raw).arm("x")) for _ in range(1)]
    plan_a, plan_b = FaultPlan.from_json(raw), FaultPlan.from_json(raw)
    run_a = [bool(plan_a.arm("x")) for _ in range(200)]
    run_b = [bool(plan_b.arm("x")) for _ in range(200)]
    assert run_a == run_b
    assert first == run_a[:1]
    assert 30 < sum(run_a) < 90


def test_rule_without_rate_or_count_matches_every_call():
    """A bare rule fires on every call of its tool."""
    plan = FaultPlan.from_json([{"fault": "slow_response"}])
    assert all(plan.arm("t") for _ in range(3))


@pytest.mark.parametrize(
    "raw",
    [
        {"rules": [{"fault": "poll_429", "rate": 2}]},
        {"rules": [{"fault": "poll_429", "rate": 0.5, "count": 1}]},
        {"rules": [{"fault": "poll_429", "extra": 1}]},
        {"rules": "nope"},
        {"seed": "x", "rules": []},
        {"rulez": []},
    ],
)
def test_malformed_plans_are_refused(raw):
    """Out-of-range rates, rate with count, unknown fields and wrong types raise FaultError."""
    with pytest.raises(FaultError):
        FaultPlan.from_json(raw)


def test_fault_book_spends_times_and_records_each_firing():
    """take() returns params until the budget is spent; arming twice adds budgets."""
    book = FaultBook([parse_fault_ref({"name": "result_lost", "times": 2}), FaultRequest(Fault.RESULT_LOST)])
    assert [book.take(Fault.RESULT_LOST, "r") is not None for _ in range(4)] == [True, True, True, False]
    assert book.take(Fault.POLL_429, "g") is None
    assert [f.fault for f in book.fired] == [Fault.RESULT_LOST] * 3


def test_sim_defaults_and_scaling():
    """Absent _sim means defaults; durations are scaled to seconds once."""
    sim = parse_sim(None, default_duration_ms=2000, time_scale=0.01)
    assert sim.duration_s == pytest.approx(0.02)
    assert sim.poll_interval_s == pytest.approx(0.005)
    assert sim.outcome is SimOutcome.COMPLETED
    assert sim.ttl_s is None
    assert not sim.is_short
    assert parse_sim({"duration_ms": 10}, default_duration_ms=2000, time_scale=1).is_short


@pytest.mark.parametrize(
    "raw",
    [
        {"duration_ms": -1},
        {"outcome": "maybe"},
        {"input_rounds": 1.5},
        {"durations_ms": 5},
        {"faults": ["nope"]},
        {"faults": "poll_429"},
        [],
        {"result_bytes": True},
    ],
)
def test_bad_sim_objects_are_refused_with_the_field_named(raw):
    """Every malformed _sim raises SimError."""
    with pytest.raises(SimError):
        parse_sim(raw, default_duration_ms=2000, time_scale=1)
