"""``finality explore``: the table, JSON, exit codes and the explorer_runs record (shipped code)."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest

from engine.explore.cli import EXIT_CAPPED, EXIT_OK, EXIT_USAGE, main
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


def test_exhaustive_mode_exhausts_a_small_pair_and_reports_its_space_exact() -> None:
    """--exhaustive searches each pair without a shared budget: small trees are exhausted, their
    space exact, named in the JSON's ``exhausted``; nothing capped, exit 0."""
    code, out, err = run("--exhaustive", "--json", "--scenario", "task-id-reused", "--scenario", "happy")
    doc = json.loads(out)
    assert code == EXIT_OK
    assert doc["mode"] == "exhaustive"
    assert doc["permutations"] is None
    assert doc["exhaustive_mode"] == {"space_limit": 1_000_000, "pair_runs": 2_000_000, "pair_seconds": None}
    assert {(p["ending"], p["space_kind"], p["space_estimated"]) for p in doc["pairs"]} == {
        ("exhaustive", "exact", False)
    }
    happy = {p["protocol"]: p for p in doc["pairs"] if p["scenario"] == "happy"}
    assert (happy["mcp-2025-11-25"]["space"], happy["mcp-2025-11-25"]["explored"]) == (1_116, 1_116)
    assert len(doc["exhausted"]) == 6
    assert doc["at_limit"] == doc["capped"] == []
    assert "happy@mcp-2025-11-25 exhaustive: 1,116 interleavings" in err


def test_exhaustive_mode_proves_a_pair_at_its_space_limit_large_and_records_the_bound(tmp_path: Path) -> None:
    """A pair that covers --space-limit interleavings without exhausting ends ``at-limit``: its space
    is at least what it covered (a bound, not an estimate), in the table, the JSON and explorer_runs."""
    path = tmp_path / "explore.duckdb"
    code, out, _ = run(
        "--exhaustive", "--json", "--ledger", str(path), "--scenario", "happy", "--space-limit", "300"
    )
    doc = json.loads(out)
    assert code == EXIT_OK
    ends = {p["protocol"]: (p["ending"], p["space_kind"]) for p in doc["pairs"]}
    assert ends == dict.fromkeys(("mcp-2025-11-25", "mcp-2026-07-28", "aip-151"), ("at-limit", "at_least"))
    for p in doc["pairs"]:
        assert p["space"] == p["explored"] >= 300
        assert not p["exhaustive"]
        assert p["space_under_1m"] is None
    assert len(doc["at_limit"]) == 3
    with Ledger.open(path, read_only=True) as ledger:
        rows = ledger.explorer_runs()
    assert [(r["exhaustive"], r["space_kind"]) for r in rows] == [(False, "at_least")] * 3
    assert [r["space"] for r in rows] == [float(p["space"]) for p in doc["pairs"]]
    _, table, _ = run("--exhaustive", "--scenario", "happy", "--space-limit", "300")
    assert "3 covered 300 interleavings without exhausting (space proven >= 300), 0 capped" in table
    assert ">=3" in table


def test_exhaustive_mode_flags_a_pair_that_hit_its_run_cap_and_exits_3(tmp_path: Path) -> None:
    """A pair that hits --pair-runs before exhausting or reaching the limit is neither: CAPPED in the
    table, in the JSON's ``capped``, its space an estimate, and the exit code is 3."""
    code, out, _ = run("--exhaustive", "--scenario", "happy", "--pair-runs", "20")
    assert code == EXIT_CAPPED
    assert "CAPPED" in out
    assert "3 capped" in out
    assert "happy@mcp-2025-11-25 (runs," in out
    code, out, _ = run("--exhaustive", "--json", "--scenario", "happy", "--pair-runs", "20")
    doc = json.loads(out)
    assert code == EXIT_CAPPED
    assert len(doc["capped"]) == 3
    assert {(p["ending"], p["space_kind"]) for p in doc["pairs"]} == {("capped", "estimate")}


def test_exhaustive_mode_takes_no_shared_budget_and_its_caps_need_it() -> None:
    """--exhaustive with --permutations or another strategy, and its caps without it, are usage errors."""
    assert run("--exhaustive", "--permutations", "10")[0] == EXIT_USAGE
    assert run("--exhaustive", "--strategy", "dfs")[0] == EXIT_USAGE
    assert run("--pair-runs", "10", "--scenario", "happy")[0] == EXIT_USAGE
    assert run("--pair-seconds", "10", "--scenario", "happy")[0] == EXIT_USAGE
    assert run("--space-limit", "10", "--scenario", "happy")[0] == EXIT_USAGE
    assert run("--exhaustive", "--pair-seconds", "0")[0] == EXIT_USAGE


def test_the_budget_run_records_each_pairs_space_and_what_kind_of_figure_it_is(tmp_path: Path) -> None:
    """explorer_runs says per pair its space and whether it is exact (exhausted) or estimated (sampled)."""
    path = tmp_path / "explore.duckdb"
    code, out, _ = run(
        "--json",
        "--ledger",
        str(path),
        "--scenario",
        "task-id-reused",
        "--scenario",
        "happy",
        "--permutations",
        "60",
    )
    doc = json.loads(out)
    assert code == EXIT_OK
    with Ledger.open(path, read_only=True) as ledger:
        rows = ledger.explorer_runs()
    assert [(r["exhaustive"], r["space_kind"]) for r in rows] == [
        (p["exhaustive"], "exact" if p["exhaustive"] else "estimate") for p in doc["pairs"]
    ]
    assert {"exact", "estimate"} <= {r["space_kind"] for r in rows}
    assert [round(float(str(r["space"]))) for r in rows] == [p["space"] for p in doc["pairs"]]


def test_pair_selects_one_scenario_under_one_protocol() -> None:
    """--pair SCENARIO@PROTOCOL runs just that pair (e.g. a capped one again with a larger cap); a
    protocol the scenario does not list, or no protocol, is a usage error."""
    code, out, _ = run(
        "--exhaustive", "--json", "--pair", "happy@aip-151", "--pair", "task-id-reused@aip-151"
    )
    doc = json.loads(out)
    assert code == EXIT_OK
    assert [(p["scenario"], p["protocol"], p["ending"]) for p in doc["pairs"]] == [
        ("happy", "aip-151", "exhaustive"),
        ("task-id-reused", "aip-151", "exhaustive"),
    ]
    assert run("--pair", "happy")[0] == EXIT_USAGE
    assert run("--pair", "happy@mcp-1999")[0] == EXIT_USAGE
    assert run("--pair", "no-such-race@aip-151")[0] == EXIT_USAGE
    assert run("--pair", "input-replayed@aip-151")[0] == EXIT_USAGE


def test_the_shipped_drivers_log_is_counted_once_per_message_not_printed_run_after_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every explored run is a whole operation's life: the driver's warnings come out as one line per
    message with its count on stderr, and none of them reaches the log handlers one by one."""
    with caplog.at_level(logging.WARNING, logger="engine.runtime.driver"):
        code, _, err = run("--pair", "input-replayed@mcp-2025-11-25", "--permutations", "40")
    assert code == EXIT_OK
    assert not [r for r in caplog.records if r.name == "engine.runtime.driver"]
    (line,) = [line for line in err.splitlines() if "input_required without a request yet" in line]
    assert re.fullmatch(r"finality explore: the shipped driver logged [\d,]+ x WARNING: '.*'", line), line
    # The filter is gone with the run: the driver logs as before outside the explorer.
    assert not logging.getLogger("engine.runtime.driver").filters
