"""kill -9 of the service at random points, many trials: 0 lost, 0 second operations, 0 double receipts.

    python bench/restart.py [--trials 100] [--calls 8] [--groups 5] [--json]

Each trial uses a fresh ledger against shared reference servers (MCP 2025-11-25 with key lookup,
AIP-151, MCP 2026-07-28 without key lookup), rotating the protocol per trial. With ``--json`` the
trials are reported as ``--groups`` equal groups (each figure's runs are the groups' counts), in
the ``bench/figures.py`` shape; the target for every count is 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.crashtrial import run_trial
from bench.figures import Report
from refserver.testing import RefServer
from service.testing import config_text


def result_seconds(started: float) -> float:
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--groups", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    servers = {
        "mcp": RefServer("mcp-2025-11-25", time_scale=0.05, idempotency=True),
        "aip": RefServer("aip-151", time_scale=0.05),
        "ext": RefServer("mcp-2026-07-28", time_scale=0.05),
    }
    totals: Counter[str] = Counter()
    states: Counter[str] = Counter()
    groups = max(1, min(args.groups, args.trials))
    per_group: list[Counter[str]] = [Counter() for _ in range(groups)]
    started = time.perf_counter()
    try:
        for server in servers.values():
            server.start()
        for trial in range(args.trials):
            name, tool = [
                ("aip", "analyze_upload"),
                ("mcp", "generate_report"),
                ("ext", "apply_batch_change"),
            ][trial % 3]
            trial_started = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp:
                config = Path(tmp) / "finality.toml"
                config.write_text(config_text(servers, global_qps=200))
                result = run_trial(
                    config=config,
                    ledger=Path(tmp) / "crash.duckdb",
                    server_stats=servers[name].stats,
                    tool=tool,
                    calls=args.calls,
                    seed=50_000 + trial,
                    kill_window=0.8,
                )
            for key in (
                "submitted",
                "acknowledged",
                "lost",
                "second_operations",
                "double_receipts",
                "double_executions",
                "unfinished",
            ):
                totals[key] += getattr(result, key)
                per_group[trial * groups // args.trials][key] += getattr(result, key)
            per_group[trial * groups // args.trials]["trials"] += 1
            per_group[trial * groups // args.trials]["seconds"] += result_seconds(trial_started)
            states.update(result.states)
            totals["trials"] += 1
            totals["clean_trials"] += int(result.clean)
    finally:
        for server in servers.values():
            server.stop()
    summary = {**totals, "end_states": dict(states), "seconds": round(time.perf_counter() - started, 1)}
    if args.json:
        report = Report(
            "restart", f"python bench/restart.py --trials {args.trials} --calls {args.calls} --json"
        )
        for key, name in (
            ("lost", "operations lost across kill -9 restarts"),
            ("second_operations", "second server operations for one call node"),
            ("double_receipts", "call nodes with more than one receipt"),
            ("double_executions", "side effects executed twice"),
            ("unfinished", "operations not terminal after restart"),
        ):
            report.add(name, "count", [g[key] for g in per_group], better="lower")
        report.add(
            "seconds per trial", "s", [g["seconds"] / max(1, g["trials"]) for g in per_group], better="lower"
        )
        report.notes.append(
            f"{totals['trials']} trials in {groups} groups (each figure's runs are per-group counts); "
            f"{args.calls} calls per trial, the service killed with SIGKILL at a random point and restarted; "
            f"{totals['clean_trials']} of {totals['trials']} trials clean; {totals['submitted']} calls submitted; "
            f"end states {dict(states)}; target: every count 0."
        )
        report.emit()
    else:
        print("\n".join(f"{k:20} {v}" for k, v in summary.items()))
    return 0 if totals["clean_trials"] == totals["trials"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
