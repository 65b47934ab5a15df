"""``finality explore``: the table, JSON, exit codes and the explorer_runs record (shipped code)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from engine.explore.cli import EXIT_OK, EXIT_USAGE, main
from engine.ledger.duckdb import Ledger


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_a_clean_run_prints_a_row_per_protocol_with_interleavings_runs_and_mode() -> None:
    """Each scenario/protocol pair gets a row; an exhausted small tree says so, with its runs."""
    code, out, _ = run("--scenario", "task-id-reused", "--permutations", "60")
    assert code == EXIT_OK
    rows = [line.split() for line in out.splitlines() if line.startswith("task-id-reused ")]
    assert [(r[1], r[4]) for r in rows] == [
        ("mcp-2025-11-25", "exhaustive"),
        ("mcp-2026-07-28", "exhaustive"),
        ("aip-151", "exhaustive"),
    ]
    assert "0 divergent of" in out
    assert "(3 of 3 scenario/protocol pairs exhaustive)" in out
    assert "shortest failing interleaving" not in out


def test_an_unknown_scenario_is_a_usage_error() -> None:
    """Exit 2 and the known names on stderr."""
    code, _, err = run("--scenario", "no-such-race")
    assert code == EXIT_USAGE
    assert "complete-vs-cancel" in err


def test_a_zero_budget_is_a_usage_error() -> None:
    """--permutations must be at least 1."""
    code, _, _ = run("--permutations", "0")
    assert code == EXIT_USAGE


def test_the_model_and_its_rule_sets_are_gone() -> None:
    """Only the shipped code runs: --code model and --rules are usage errors."""
    assert run("--code", "model", "--scenario", "happy")[0] == EXIT_USAGE
    assert run("--rules", "skip-fetch", "--scenario", "happy")[0] == EXIT_USAGE


def test_list_names_the_scenarios() -> None:
    """--list shows what can be selected."""
    code, out, _ = run("--list")
    assert code == EXIT_OK
    assert "rollback-creation-echo" in out
    assert "complete-vs-cancel" in out


def test_json_and_the_ledger_carry_interleavings_covered_and_runs_per_pair(tmp_path: Path) -> None:
    """--json prints one document (per pair: interleavings covered, runs, exhaustive); --ledger
    records each pair with its runs and interleavings covered, rules 'engine', code 'shipped'."""
    path = tmp_path / "explore.duckdb"
    code, out, _ = run(
        "--json",
        "--ledger",
        str(path),
        "--scenario",
        "complete-vs-cancel",
        "--permutations",
        "240",
        "--seed",
        "3",
    )
    doc = json.loads(out)
    assert code == EXIT_OK
    assert doc["code"] == "shipped"
    assert doc["divergent"] == 0
    assert [(p["protocol"], p["exhaustive"]) for p in doc["pairs"]] == [
        ("mcp-2025-11-25", True),
        ("mcp-2026-07-28", True),
        ("aip-151", True),
    ]
    assert doc["explored"] == sum(p["explored"] for p in doc["pairs"])
    assert doc["runs"] == sum(p["runs"] for p in doc["pairs"]) <= 240
    with Ledger.open(path, read_only=True) as ledger:
        rows = ledger.explorer_runs()
    assert [(r["scenario"], r["protocol"]) for r in rows] == [
        ("complete-vs-cancel", "mcp-2025-11-25"),
        ("complete-vs-cancel", "mcp-2026-07-28"),
        ("complete-vs-cancel", "aip-151"),
    ]
    assert {(r["rules"], r["seed"], r["divergent"], r["exhaustive"], r["code"]) for r in rows} == {
        ("engine", 3, 0, True, "shipped")
    }
    assert [r["distinct_interleavings"] for r in rows] == [p["explored"] for p in doc["pairs"]]
    assert [r["explored"] for r in rows] == [p["runs"] for p in doc["pairs"]]
    assert rows[2]["distinct_interleavings"] == 51


def test_each_pair_says_the_size_of_its_space_exact_when_exhaustive_estimated_when_sampled() -> None:
    """An exhaustive pair's space is its exact count of interleavings; a sampled pair's is an
    estimate (Knuth's random probes), at least what it covered, and a sampled pair estimated under
    a million is named, in the table and in the JSON."""
    code, out, _ = run(
        "--json", "--scenario", "task-id-reused", "--scenario", "happy", "--permutations", "60"
    )
    doc = json.loads(out)
    assert code == EXIT_OK
    exhaustive = [p for p in doc["pairs"] if p["exhaustive"]]
    sampled = [p for p in doc["pairs"] if not p["exhaustive"]]
    assert exhaustive
    assert sampled
    for p in exhaustive:
        assert (p["space"], p["space_estimated"], p["space_method"]) == (p["explored"], False, "exact")
    for p in sampled:
        assert p["space_estimated"]
        assert p["space_method"].startswith("Knuth random probes")
        assert p["space"] >= p["explored"]
    small = {f"{p['scenario']}@{p['protocol']}" for p in sampled if p["space_under_1m"]}
    assert set(doc["small_spaces_sampled"]) == small
    _, table, _ = run("--scenario", "happy", "--permutations", "30")
    assert "sampled though estimated under 1,000,000: happy@mcp-2025-11-25" in table
