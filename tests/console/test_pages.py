"""One AppTest per console page against a seeded ledger read read-only (no service running)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from engine.clock import SystemClock

Open = Callable[[str], AppTest]
ROOT = Path(__file__).resolve().parents[2]


def texts(at: AppTest) -> str:
    parts = [
        e.value
        for kind in ("error", "warning", "info", "success", "caption", "markdown")
        for e in getattr(at, kind)
    ]
    return "\n".join(str(p) for p in parts)


def frame(at: AppTest, column: str) -> pd.DataFrame:
    """The first table on the page that has ``column`` (plain tables carry no key in AppTest)."""
    for element in at.dataframe:
        if column in element.value.columns:
            return element.value
    raise AssertionError(f"no table with a {column!r} column")


def charts(at: AppTest) -> list[str]:
    return [c.proto.spec for c in at.get("plotly_chart")]


def test_overview_shows_six_gates_arms_alerts_and_in_flight(console: Open) -> None:
    """The overview lists all six gates with raw values and thresholds, the arms, alerts and in-flight work."""
    at = console("pages/overview.py")
    gates = frame(at, "passes when")
    assert list(gates["gate"]) == [
        "terminal_divergence",
        "duplicate_operations",
        "poll_amplification",
        "cancel_confirmation",
        "unknown_reconciliation",
        "traceability",
    ]
    assert {"result", "value", "passes when", "detail"} <= set(gates.columns)
    assert list(frame(at, "raw inputs")["gate"]) == list(gates["gate"])  # below, one row per gate
    assert "FAIL" in set(gates["result"])  # the seeded ledger has UNKNOWNs older than 15 minutes
    by_gate = dict(zip(gates["gate"], gates["value"], strict=True))
    assert by_gate["unknown_reconciliation"].endswith(" min")  # the gate is in minutes, and so is its value
    assert dict(zip(gates["gate"], gates["passes when"], strict=True))["cancel_confirmation"] == "< 60.0 s"
    assert set(frame(at, "in_flight")["arm"]) >= {"canary", "control", "shadow"}
    assert any("UNKNOWN operation(s) open longer than 15 min" in e.value for e in at.error)
    assert charts(at), "the in-flight chart is drawn"


def test_cancel_latency_draws_percentiles_with_the_60_s_line_and_keeps_filters(console: Open) -> None:
    """p50/p95/p99 per protocol with the 60 s line; switching the series to arms keeps the other filters."""
    at = console("pages/cancel_latency.py")
    spec = charts(at)[0]
    assert "60 s gate" in spec
    assert "p99" in spec
    at.selectbox(key="cancel_latency_by").set_value("arm").run()
    assert not at.exception
    assert at.selectbox(key="cancel_latency_window").value == "fits the data"
    assert "Showing the last 7 days in 6 hours buckets." in texts(at)  # the seeded week, not one bucket
    assert "canary p99" in charts(at)[0] or "control p99" in charts(at)[0]
    summary = frame(at, "over_60s")
    assert {"p50_s", "p95_s", "p99_s", "over_60s"} <= set(summary.columns)
    slowest = at.dataframe(key="cancel_latency_slowest").value
    assert len(slowest) > 0
    assert slowest["latency_s"].is_monotonic_decreasing


def test_reconciliation_shows_ages_against_15_minutes_and_refuses_writes_without_a_service(
    console: Open,
) -> None:
    """Open entries by age with the 15-minute line; resolving from a read-only console is refused clearly."""
    at = console("pages/reconciliation.py")
    assert "15 min" in charts(at)[0]
    aging = frame(at, "next step")
    assert list(aging.columns[:5]) == ["age (min)", "over 15 min", "kind", "reason", "next step"]
    assert (aging["over 15 min"] == "OVER").any()
    assert not (aging["over 15 min"] == "OVER").all()
    assert aging["age (min)"].is_monotonic_decreasing
    assert aging["next step"].str.len().min() > 20
    # The picked entry (the oldest) is spelled out in full below, next step and all.
    picked = at.selectbox(key="reconciliation_entry")
    assert picked.value == int(aging["entry"].iloc[0])
    assert str(aging["call node"].iloc[0]) in str(picked.format_func(picked.value))
    assert any(f"**Next step:** {aging['next step'].iloc[0]}" in str(m.value) for m in at.markdown)
    at.text_area(key="reconciliation_reason").set_value("found it by key")
    at.button(key="reconciliation_submit").click().run()
    assert any("read-only" in e.value for e in at.error)


def test_gate_compliance_says_seeded_explorer_rows_do_not_count(console: Open) -> None:
    """A seeded ledger has no run of the shipped code: the page says the divergence gate fails, and lists the seeded rows."""
    at = console("pages/gate_compliance.py")
    assert not at.metric, "a seeded explorer row must not be shown as coverage"
    assert any("No explorer run of the shipped code" in w.value for w in at.warning)
    # What a person with a running service does (its explorer records to the ledger it holds).
    assert any("finality serve --explore" in w.value for w in at.warning)
    codes = {c for df in at.dataframe if "code" in df.value.columns for c in df.value["code"]}
    assert codes, "the coverage table lists the seeded rows"
    assert "shipped" not in codes


def test_gate_history_reads_newest_first_and_the_what_if_in_the_tables_units(console: Open) -> None:
    """The history table starts at the newest run with PASS/FAIL words; the what-if shows thresholds with units."""
    at = console("pages/gate_compliance.py")
    history = frame(at, "evaluated at")
    assert len(history) > 0
    assert history["run"].is_monotonic_decreasing  # newest run first
    assert set(history["result"]) <= {"PASS", "FAIL"}
    assert "gate(s) would still fail" in texts(at)
    at.number_input(key="gates_cancel_p99").set_value(1e9)
    at.number_input(key="gates_unknown_min").set_value(1e9).run()
    what_if = frame(at, "what if")
    # The divergence gate has no shipped-code explorer run on this seed: no threshold makes it pass.
    others = what_if[what_if["gate"] != "terminal_divergence"]
    assert (others["what if"] == "PASS").all()
    assert (what_if["now"] == "FAIL").any()
    assert dict(zip(what_if["gate"], what_if["passes when (now)"], strict=True))[
        "unknown_reconciliation"
    ] == ("≤ 15.0 min")


def test_operations_filter_and_one_call_nodes_timeline(console: Open) -> None:
    """Filtering by state lists only that state; a call node shows its transitions, requests and receipt."""
    at = console("pages/operations.py")
    at.multiselect(key="operations_states").set_value(["UNKNOWN"])
    at.selectbox(key="operations_range").set_value("everything").run()
    listing = at.dataframe(key="operations_table").value
    assert len(listing) > 0
    assert set(listing["state"]) == {"UNKNOWN"}
    at.multiselect(key="operations_states").set_value(["CANCELLED_ACCEPTED"]).run()
    node = at.dataframe(key="operations_table").value.iloc[0]["call_node_id"]
    at.text_input(key="operations_key").set_value(node).run()
    timeline = frame(at, "occurred_at")
    assert {"transition", "request", "receipt"} <= set(timeline["kind"])
    assert "CancelRequested" in set(timeline["what"])
    assert at.multiselect(key="operations_states").value == ["CANCELLED_ACCEPTED"]


def test_approvals_offer_approve_and_reject_with_the_question_and_deadline(console: Open) -> None:
    """Each answerable round reads its question, call node, tool and countdown, with Approve and Reject;
    answering needs the service (refused read-only)."""
    at = console("pages/approvals.py")
    text = texts(at)
    assert "deadline **in " in text
    assert "call node `" in text
    assert "NaT" not in text
    approve = [b for b in at.button if b.label == "Approve"]
    assert approve
    assert len([b for b in at.button if b.label == "Reject"]) == len(approve)
    answered = frame(at, "answered_at")
    assert list(answered.columns[:4]) == [
        "call_node_id",
        "tool_name",
        "input_round",
        "actor",
    ]  # not a UUID first
    assert answered["call_node_id"].notna().all()
    approve[0].click().run()
    assert any("read-only" in e.value for e in at.error)


def test_rollout_control_disables_promote_while_gates_fail(console: Open) -> None:
    """Without a service the page says so, shows failing gates, and every action is disabled."""
    at = console("pages/rollout_control.py")
    assert "No rollout status" in texts(at)
    assert any("Promotion is disabled while gates fail" in e.value for e in at.error)
    assert at.button(key="rollout_promote").disabled
    assert at.button(key="rollout_rollback").disabled


def test_sql_runs_examples_and_refuses_writes(console: Open) -> None:
    """An example query returns rows (downloadable); a DELETE is refused with the sandbox's message."""
    at = console("pages/sql.py")
    at.button(key="sql_run").click().run()
    assert len(at.dataframe[0].value) > 0
    assert len(at.get("download_button")) == 2
    at.text_area(key="sql_query").set_value("DELETE FROM receipts").run()
    at.button(key="sql_run").click().run()
    assert any("read-only sandbox" in e.value for e in at.error)


def test_evidence_page_offers_the_bundle_and_shows_the_sql_behind_charts(console: Open) -> None:
    """The bundle is a download; every page's queries are listed with their SQL."""
    at = console("pages/evidence_bundle.py")
    assert len(at.get("download_button")) == 1
    sql = "\n".join(c.value for c in at.code)
    assert "FROM reconciliation" in sql
    assert "percentile_cont" in sql


def test_the_duplicate_gates_link_opens_operations_filtered_to_the_duplicated_ones(
    seeded_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's link carries ?duplicated=1; Operations opened by it ticks the filter and lists only duplicated operations."""
    from console.frame import GATE_LINKS

    page, params = GATE_LINKS["duplicate_operations"]
    assert (page, params) == ("pages/operations.py", {"duplicated": "1"})
    monkeypatch.delenv("FINALITY_SERVICE_URL", raising=False)
    monkeypatch.setenv("FINALITY_LEDGER", str(seeded_ledger))
    monkeypatch.setenv("FINALITY_ACTOR", "tester")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=30)
    at.switch_page(page)
    at.query_params.update(params)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.checkbox(key="operations_duplicated").value is True
    assert at.selectbox(key="operations_range").value == "everything"
    # The seeded ledger binds no operation to a second task: the filtered page lists none.
    assert at.dataframe(key="operations_table").value.empty
    assert "0 operations match" in texts(at)
    at.checkbox(key="operations_duplicated").uncheck().run()
    assert len(at.dataframe(key="operations_table").value) > 0


def _gate_compliance_with(
    runs: list[tuple[str, int, int, bool, float | None, str | None]],
    seeded_ledger: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AppTest:
    """The Gate compliance page on a copy of the seeded ledger holding these shipped-code explorer
    runs of the current revision: (scenario, runs, interleavings, exhaustive, space, space kind)."""
    import shutil

    from engine import open_ledger
    from engine.ledger.port import ExplorerRun
    from engine.revision import running_revision

    ledger_path = tmp_path / "explored.duckdb"
    shutil.copy(seeded_ledger, ledger_path)
    at_ = SystemClock().now()
    writer = open_ledger(str(ledger_path))
    try:
        for scenario, explored, interleavings, exhaustive, space, kind in runs:
            writer.record_explorer_run(
                ExplorerRun(
                    scenario,
                    "mcp-2025-11-25",
                    0,
                    explored,
                    interleavings,
                    0,
                    exhaustive,
                    "engine",
                    None,
                    at_,
                    at_,
                    "shipped",
                    running_revision(),
                    space,
                    kind,
                )
            )
    finally:
        writer.close()
    monkeypatch.delenv("FINALITY_SERVICE_URL", raising=False)
    monkeypatch.setenv("FINALITY_LEDGER", str(ledger_path))
    monkeypatch.setenv("FINALITY_ACTOR", "tester")
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "app.py"), default_timeout=30)
    at.switch_page("pages/gate_compliance.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_gate_compliance_counts_merged_interleavings_apart_from_the_runs_that_covered_them(
    seeded_ledger: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shipped-code exploration that merged equal states covers more interleavings than it ran:
    the page says so ("19,049 distinct interleavings ... covered by 10,300 runs"), never "19,049 of 10,300"."""
    at = _gate_compliance_with(
        [("happy", 10_300, 19_049, False, None, None)], seeded_ledger, tmp_path, monkeypatch
    )
    (explored,) = [m for m in at.metric if m.label == "Explored"]
    assert explored.value == "19,049 distinct interleavings, 0 divergent"
    assert "covered by 10,300 runs of the shipped code" in texts(at)


def test_gate_compliance_says_how_many_pairs_were_exhausted_proven_large_or_only_sampled(
    seeded_ledger: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pair any run exhausted counts as exact (another run's estimate of it does not count it
    twice), a pair that reached its limit as proven large, the rest as sampled only."""
    runs = [
        ("happy", 10, 10, True, 120.0, "exact"),
        ("happy", 10, 10, False, 90.0, "estimate"),
        ("stale-epoch", 10, 10, False, 1_000_000.0, "at_least"),
        ("input-replayed", 10, 10, False, 5e6, "estimate"),
    ]
    at = _gate_compliance_with(runs, seeded_ledger, tmp_path, monkeypatch)
    summary = "1 of 3 pairs exhausted (space exact), 1 proven at least their limit, 1 sampled only"
    assert summary in texts(at), texts(at)


def test_an_emptied_name_falls_back_to_the_consoles_configured_actor(console: Open) -> None:
    """FINALITY_ACTOR is the console's default actor: emptying the sidebar's name box brings it back,
    instead of leaving the console with no name and every action disabled."""
    at = console("pages/rollout_control.py")
    name = at.sidebar.text_input(key="app_actor_input")
    name.set_value("someone-else").run()
    assert at.session_state["app_actor"] == "someone-else"
    at.sidebar.text_input(key="app_actor_input").set_value("").run()
    assert at.session_state["app_actor"] == "tester"
    assert at.sidebar.text_input(key="app_actor_input").value == "tester"
    assert not any("No name yet" in c.value for c in at.sidebar.caption)
