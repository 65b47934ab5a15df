"""``finality explore``: the table, JSON, exit codes, traces and the explorer_runs record."""

from __future__ import annotations

import io
import json
from pathlib import Path

from engine.explore.cli import EXIT_DIVERGENT, EXIT_OK, EXIT_USAGE, main
from engine.ledger.duckdb import Ledger


def run(*argv: str) -> tuple[int, str, str]:
    """``finality explore`` on the explorer's model (``--code model``) unless the words say otherwise."""
    words = list(argv) if "--code" in argv or "--list" in argv else ["--code", "model", *argv]
    out, err = io.StringIO(), io.StringIO()
    code = main(words, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_a_clean_run_prints_a_row_per_scenario_and_protocol_and_exits_0() -> None:
    """Every scenario/protocol pair gets a row with its interleavings; the total is the budget."""
    code, out, _ = run("--permutations", "600")
    assert code == EXIT_OK
    assert "0 divergent of 600 distinct interleavings" in out
    assert "crash-restart              aip-151" in out
    assert "shortest failing interleaving" not in out


def test_json_output_carries_the_counts_per_pair() -> None:
    """--json prints one document: totals, and per pair explored/exhaustive/divergent."""
    code, out, _ = run("--json", "--scenario", "happy", "--permutations", "1000")
    doc = json.loads(out)
    assert code == EXIT_OK
    assert doc["rules"] == "engine"
    assert doc["divergent"] == 0
    assert [(p["protocol"], p["exhaustive"]) for p in doc["pairs"]] == [
        ("mcp-2025-11-25", True),
        ("mcp-2026-07-28", True),
        ("aip-151", True),
    ]
    assert doc["explored"] == sum(p["explored"] for p in doc["pairs"]) == 289 + 207 + 207


def test_a_broken_variant_exits_1_and_prints_the_shortest_failing_interleaving() -> None:
    """A divergence makes the exit code 1 and the trace is printed step by step."""
    code, out, _ = run(
        "--rules", "ack-as-terminal", "--scenario", "complete-vs-cancel", "--permutations", "300"
    )
    assert code == EXIT_DIVERGENT
    assert "DIVERGENT complete-vs-cancel on mcp-2026-07-28" in out
    trace = out.split("shortest failing interleaving:\n", 1)[1]
    assert "caller    cancel" in trace
    assert "DIVERGENCE terminal: accepted cancelled; the server's truth is completed" in trace


def test_an_unknown_scenario_is_a_usage_error() -> None:
    """Exit 2 and the known names on stderr."""
    code, _, err = run("--scenario", "no-such-race")
    assert code == EXIT_USAGE
    assert "complete-vs-cancel" in err


def test_a_zero_budget_is_a_usage_error() -> None:
    """--permutations must be at least 1."""
    code, _, _ = run("--permutations", "0")
    assert code == EXIT_USAGE


def test_list_names_scenarios_open_findings_and_rule_sets() -> None:
    """--list shows what can be selected."""
    code, out, _ = run("--list")
    assert code == EXIT_OK
    assert "rollback-creation-echo" in out
    assert "skip-fetch" in out


def test_the_ledger_gets_one_explorer_run_per_scenario_and_protocol(tmp_path: Path) -> None:
    """--ledger records each pair's counts with rules 'engine' (the divergence gate's input)."""
    path = tmp_path / "explore.duckdb"
    code, _, _ = run(
        "--ledger", str(path), "--scenario", "complete-vs-cancel", "--permutations", "500", "--seed", "3"
    )
    assert code == EXIT_OK
    with Ledger.open(path, read_only=True) as ledger:
        rows = ledger.explorer_runs()
    assert [(r["scenario"], r["protocol"]) for r in rows] == [
        ("complete-vs-cancel", "mcp-2025-11-25"),
        ("complete-vs-cancel", "mcp-2026-07-28"),
        ("complete-vs-cancel", "aip-151"),
    ]
    assert {(r["rules"], r["seed"], r["divergent"], r["exhaustive"], r["code"]) for r in rows} == {
        ("engine", 3, 0, True, "model")
    }
    assert [r["distinct_interleavings"] for r in rows] == [35, 71, 71]
