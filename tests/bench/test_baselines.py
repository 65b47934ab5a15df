"""The baseline pollers the benchmarks compare Finality with follow their stated policies exactly."""

from __future__ import annotations

import itertools
import random

from bench_kit import load

pollers = load("pollers")
naive_retry = load("naive_retry")


def test_google_style_waits_are_full_jitter_under_a_ceiling_growing_1_5x_from_1_s_to_20_s():
    """Each wait is uniform in [0, ceiling]; the ceiling runs 1, 1.5, 2.25, ... and stops at 20 s."""
    waits = list(itertools.islice(pollers.google_delays(random.Random(3)), 40))
    ceilings = [min(1.0 * 1.5**i, 20.0) for i in range(40)]
    assert all(0 <= w <= c for w, c in zip(waits, ceilings, strict=True))
    assert max(waits[20:]) > 10  # the cap is reached, not a smaller one
    assert min(waits[:3]) < 1.0


def test_fastmcp_style_waits_start_at_20_ms_and_double_up_to_the_advised_interval():
    """20 ms, 40 ms, 80 ms, ... never above the server's advised pollInterval."""
    waits = list(itertools.islice(pollers.fastmcp_delays(2.0), 10))
    assert waits == [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.0, 2.0, 2.0]


def test_pollers_durations_spread_over_the_whole_range_and_are_shared_by_all_pollers():
    """The same seeded set of durations, from the shortest to the longest, for every poller."""
    spread = pollers.durations(random.Random(1), 40, 2.0, 30.0)
    assert len(spread) == 40
    assert min(spread) == 2.0
    assert abs(max(spread) - 30.0) < 1e-9
    assert spread == pollers.durations(random.Random(1), 40, 2.0, 30.0)


def test_the_naive_benchmark_arms_every_fault_the_reference_server_knows():
    """The seed's faults, and the server's resets, slow and malformed replies, all at the same rate."""
    from refserver.fault import Fault

    plan = naive_retry.fault_plan(0.04, 1)
    assert {r["fault"] for r in plan["rules"]} == {f.value for f in Fault}
    assert {r["rate"] for r in plan["rules"]} == {0.04}


fastmcp_compare = load("fastmcp_compare")


def test_the_comparison_run_fails_when_a_call_node_ran_twice_or_a_second_operation_was_created():
    """One server operation and one execution per call node, or the run is reported as failed."""
    from collections import Counter

    problems: list[str] = []
    fastmcp_compare.check_server(["a", "b"], Counter({"a": 1, "b": 2}), 3, problems)
    assert len(problems) == 2
    clean: list[str] = []
    fastmcp_compare.check_server(["a", "b"], Counter({"a": 1, "b": 1}), 2, clean)
    assert clean == []


def test_the_comparison_run_fails_when_a_call_node_has_no_result_or_two():
    """A call node without exactly one result is a problem, and delays count only completed calls."""
    records = [
        {"key": "a", "submitted_at": 0.0, "result_at": 3.5},
        {"key": "b", "submitted_at": 0.0, "error": "HTTP 500"},
    ]
    measured = fastmcp_compare.measured_from(records, ["a", "b"], 3.0, 0.2, 4.0, 4, 6, [])
    assert measured.completed == 1
    assert measured.delay_median_s == 0.5
    assert measured.cpu_ms_per_task == 200.0
    assert measured.status_reads_per_task == 2.0
    assert any("without exactly one result" in p for p in measured.problems)


def test_status_read_lateness_counts_from_the_previous_reply_of_the_same_task():
    """Each read: its arrival minus the previous reply for its task (the create's, then the last
    read's) minus the advised interval; a read sooner than advised is negative, a task without an
    answered create is left out."""
    timelines = {
        "on-time": [[10.0], [11.0, 11.25], [12.25, 12.5]],
        "late": [[10.0], [15.5, 16.0]],
        "early": [[10.0], [10.5, 10.5]],
        "no-create": [[20.0, 20.1]],
    }
    late = fastmcp_compare.read_lateness(timelines, 1.0)
    assert sorted(round(x, 6) for x in late) == [-0.5, 0.0, 0.0, 4.5]
