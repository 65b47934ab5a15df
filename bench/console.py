"""Console render time per page on a large seeded ledger (default 1,000,000 operations), cold and warm.

The ledger is generated once per invocation with ``demo.seed`` (its generation time is a
note), or reused: ``--ledger PATH`` reads PATH when it exists and otherwise generates it there and
keeps it, so a later run (``make bench``) does not generate it again. The console reads it read-only
(no service), as ``streamlit run app.py`` does with ``FINALITY_LEDGER`` set. A seeded ledger ends,
like a real one, with a gate run evaluated on its data; nothing is written after it, so the pages
show that run (file mode's "current") instead of rescanning for the gate inputs. A ledger without a
current run (generated before seeding recorded one) makes the gate pages rescan: the report says so.

Per page and run, through Streamlit's ``AppTest`` (the page's script, the console's ``app.py``
around it, and every query it makes):

* cold: a new session opens the page first (as by its URL) on a new ``Insights``: every console
  cache is empty (query results, gate inputs, the ledger's table list), so every query reads the
  ledger (a fresh read-only attach per query, as always in file mode). Only the operating system's
  file cache and the imported modules are shared between runs.
* warm: the same session renders the page again right away, with the console's caches as it ships
  them (query results 2 s, gate inputs 15 s, table list 60 s): what a widget change or a page
  switch within those seconds costs. The live refresh runs every 10 s, so it pays the cold query
  cost except for the gate inputs.

    python bench/console.py [--ops 1000000] [--ledger PATH] [--runs 5] [--json]

With ``--json`` the last stdout line is one ``bench.figures.Report``: per page "render <page> cold"
and "render <page> warm" (seconds, lower is better; warm's baseline is cold).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.figures import Report  # noqa: E402

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
CACHE_KEYS = ("FINALITY_CONSOLE_CACHE_S", "FINALITY_CONSOLE_GATE_CACHE_S", "FINALITY_CONSOLE_GATE_INTERVAL_S")


def render(page: str, components: object | None) -> tuple[float, float, object]:
    """One cold render of ``page`` in a new session on a new ``Insights``, then one warm re-render."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_resource.clear()  # a new Insights: no cached query, gate inputs or table list
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    if components is not None and hasattr(at, "_bidi_component_manager"):
        # The test harness scans installed packages for components once per AppTest; that scan is
        # the harness's own start-up, not the console's work, so it is done once per benchmark.
        at._bidi_component_manager = components
    if page != "pages/overview.py":
        at.switch_page(page)  # opened first, as by its URL
    started = time.perf_counter()
    at.run()
    cold = time.perf_counter() - started
    _check(at, page)
    started = time.perf_counter()
    at.run()
    warm = time.perf_counter() - started
    _check(at, page)
    return cold, warm, getattr(at, "_bidi_component_manager", None)


def _check(at: object, page: str) -> None:
    exceptions = getattr(at, "exception", [])
    if exceptions:
        raise RuntimeError(f"{page}: {exceptions[0].value}")
    errors = [e.value for e in getattr(at, "error", [])]
    if any("This page failed" in str(e) for e in errors):
        raise RuntimeError(f"{page}: {errors}")


def ledger_operations(path: Path) -> int:
    from engine import run_query

    return int(str(run_query(path, "SELECT count(*) FROM op_identity").rows[0][0]))


def gate_run_note(path: Path) -> str:
    """Whether the console will find a current recorded gate run on this ledger (file mode)."""
    from console.insights import Insights
    from console.sources import FileSource

    insights = Insights(FileSource(path), cache_s=0)
    try:
        view = insights.recorded_gates()
    finally:
        insights.close()
    if view is None:
        return "no current recorded gate run: the gate pages evaluate the gates afresh (a whole-ledger scan)"
    return f"the ledger's latest gate run (#{view.run_id}) is current (nothing written since): pages show it"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--ops", type=int, default=1_000_000, help="operations in a generated ledger")
    parser.add_argument("--ledger", help="reuse this ledger file, or generate it here and keep it")
    parser.add_argument("--runs", type=int, default=5, help="cold and warm renders per page")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one report as the last stdout line")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    command = "python bench/console.py " + " ".join(sys.argv[1:] if argv is None else argv)
    report = Report("console", command.strip())
    folder = tempfile.TemporaryDirectory(prefix="finality-bench-console-")
    try:
        if args.ledger and Path(args.ledger).is_file():
            ledger = Path(args.ledger)
            operations = ledger_operations(ledger)
            report.notes.append(f"ledger reused ({operations:,} operations); not generated in this run")
        else:
            from demo.seed import seed_ledger

            ledger = Path(args.ledger) if args.ledger else Path(folder.name) / "console.duckdb"
            ledger.parent.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            seed_ledger(ledger, operations=args.ops, seed=args.seed)
            generated_s = time.perf_counter() - started
            operations = args.ops
            report.notes.append(
                f"ledger of {operations:,} operations generated in {generated_s:.1f} s (demo.seed, once)"
                + (" and kept for --ledger reuse" if args.ledger else "")
            )
        report.notes.append(gate_run_note(ledger))
        os.environ.pop("FINALITY_SERVICE_URL", None)
        os.environ["FINALITY_LEDGER"] = str(ledger)
        for key in CACHE_KEYS:  # the console's caches as shipped
            os.environ.pop(key, None)

        cold: dict[str, list[float]] = {p: [] for p in PAGES}
        warm: dict[str, list[float]] = {p: [] for p in PAGES}
        components: object | None = None
        render(PAGES[0], None)  # imports and the harness's start-up, not measured
        for _ in range(args.runs):
            for page in PAGES:  # pages interleaved, so a noisy moment does not hit one page's runs only
                c, w, components = render(page, components)
                cold[page].append(c)
                warm[page].append(w)
    finally:
        folder.cleanup()

    over = []
    for page in PAGES:
        name = Path(page).stem
        figure = report.add(f"render {name} cold", "s", cold[page], better="lower")
        report.add(f"render {name} warm", "s", warm[page], baseline=f"render {name} cold", better="lower")
        if figure.median >= TARGET_S:
            over.append(f"{name} ({figure.median:.2f} s)")
    report.notes.append(
        f"target: every page under {TARGET_S} s cold (median); "
        + ("all pages under it" if not over else "over it: " + ", ".join(over))
    )
    report.notes.append(
        "cold: a new session opens the page first on a new Insights (no console cache; each query "
        "attaches the ledger read-only afresh); warm: the same session re-renders it at once with the "
        "console's caches as shipped (queries 2 s, gate inputs 15 s, table list 60 s)"
    )
    report.notes.append(f"{os.cpu_count()} CPUs; measured while other work may share the machine")

    if not args.json:
        print(
            f"{'page':22s} {'cold median':>12s} {'min':>7s} {'max':>7s} {'warm median':>12s} {'min':>7s} {'max':>7s}"
        )
        for page in PAGES:
            c, w = cold[page], warm[page]
            print(
                f"{Path(page).stem:22s} {_median(c):12.3f} {min(c):7.3f} {max(c):7.3f} "
                f"{_median(w):12.3f} {min(w):7.3f} {max(w):7.3f}"
            )
        for note in report.notes:
            print(f"- {note}")
    else:
        report.emit()
    return 0


def _median(values: list[float]) -> float:
    import statistics

    return float(statistics.median(values))


if __name__ == "__main__":
    raise SystemExit(main())
