"""Console render time per page on a large seeded ledger: AppTest run time, median of 5 with min and max.

Generates a ledger of ``--ops`` operations (default 1,000,000) with ``engine.seeding`` unless
``--ledger`` names an existing one, then opens each page read-only (no service) and times
``AppTest.run()``. Query caches are off (``FINALITY_CONSOLE_CACHE_S=0``) so every run reads the
ledger; gate inputs are measured both cold (first run) and as cached for 15 s (the console's default).

    python bench/console.py [--ops 1000000] [--ledger PATH] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAGES = (
    "pages/overview.py",
    "pages/cancel_latency.py",
    "pages/reconciliation.py",
    "pages/gate_compliance.py",
    "pages/operations.py",
    "pages/approvals.py",
    "pages/rollout_control.py",
    "pages/sql.py",
    "pages/evidence_bundle.py",
)
TARGET_S = 1.5


def measure(page: str, runs: int) -> list[float]:
    from streamlit.testing.v1 import AppTest

    times = []
    for _ in range(runs):
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
        at.run()
        if page != "pages/overview.py":
            at.switch_page(page)
        started = time.perf_counter()
        at.run()
        times.append(time.perf_counter() - started)
        if at.exception:
            raise RuntimeError(f"{page}: {at.exception[0].value}")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--ledger")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    folder = tempfile.TemporaryDirectory(prefix="finality-bench-console-")
    seconds = None
    if args.ledger:
        ledger = Path(args.ledger)
    else:
        from engine.seeding import seed_ledger

        ledger = Path(folder.name) / "console.duckdb"
        seconds = seed_ledger(ledger, operations=args.ops).seconds
    os.environ.pop("FINALITY_SERVICE_URL", None)
    os.environ["FINALITY_LEDGER"] = str(ledger)
    os.environ["FINALITY_CONSOLE_CACHE_S"] = "0"
    results = {}
    for gate_cache in ("0", "15"):
        os.environ["FINALITY_CONSOLE_GATE_CACHE_S"] = gate_cache
        import streamlit as st

        st.cache_resource.clear()
        for page in PAGES:
            times = measure(page, args.runs)
            results[(page, gate_cache)] = times
    folder.cleanup()
    report = {
        "operations": args.ops if not args.ledger else None,
        "ledger": str(ledger) if args.ledger else "generated",
        "seed_seconds": seconds,
        "runs": args.runs,
        "pages": [
            {
                "page": page,
                "gate_inputs": "cold every run" if cache == "0" else "cached 15 s",
                "median_s": round(statistics.median(t), 3),
                "min_s": round(min(t), 3),
                "max_s": round(max(t), 3),
                "under_target": statistics.median(t) < TARGET_S,
            }
            for (page, cache), t in results.items()
        ],
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        if seconds is not None:
            print(f"seeded {args.ops:,} operations in {seconds:.0f} s")
        print(f"{'page':28s} {'gate inputs':15s} {'median':>8s} {'min':>8s} {'max':>8s}")
        for row in report["pages"]:
            print(
                f"{row['page']:28s} {row['gate_inputs']:15s} {row['median_s']:8.3f} {row['min_s']:8.3f} "
                f"{row['max_s']:8.3f}{'' if row['under_target'] else '  over 1.5 s'}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
