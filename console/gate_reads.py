"""The gates as the console shows them: the latest recorded run when current, else evaluated afresh;
the gate history and the explorer's coverage. Reads only (re-evaluation asks the service to record)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pandas as pd  # type: ignore[import-untyped]

from console.core import (
    InsightsCore,
    _limit,
)
from console.sources import (
    SERVICE_RUN_SLACK_S,
)
from console.views import GateView
from engine.clock import monotonic_seconds
from engine.errors import (
    QueryFailed,
)
from engine.ledger.gate_sql import (
    advance_clock,
    gate_inputs_from_recorded,
    gate_inputs_from_values,
    recorded_run_from_rows,
)
from engine.revision import running_revision

__all__ = ["GateReads"]


class GateReads(InsightsCore):
    """The six gates, their history and the race explorer's coverage."""

    def gate_inputs(self) -> tuple[dict[str, dict[str, object]], datetime]:
        """The six gates' raw inputs, read from the ledger now (``engine.ledger.gate_sql``, the ``Ledger.gate_inputs`` shape)."""
        now = self.now()
        sql = self.sql_of("gate_inputs", now=now, revision=running_revision())
        self.last_sql["gate_inputs"] = sql
        columns, rows, _, _ = self._run(sql, 1)
        if not rows:
            raise QueryFailed("the gate-inputs query returned no row")
        return gate_inputs_from_values(columns, rows[0]), now

    def recorded_gates(self) -> GateView | None:
        """The six gates from the latest recorded run when it is current, else None (with no scan).

        Service: the service records a run every ``gate_interval_s``; a run read through its SQL
        snapshot is current while no older than that interval plus ``SERVICE_RUN_SLACK_S``. File:
        nobody writes the ledger, so a run is current when nothing was written after it (the last
        recorded write instant and the row counts, ``RecordedRun.written_since``); its clock-dependent
        ages are then advanced to now, which is exactly what a fresh evaluation would read.
        """
        if not self.has_table("gate_runs"):
            return None
        columns, rows, _, _ = self._run(self.sql_of("latest_gate_run"), 100)
        run = recorded_run_from_rows(columns, rows)
        if run is None or run.inputs is None:
            return None
        now = self.now()
        age = max(0.0, (now - run.evaluated_at).total_seconds())
        if self.info.kind == "service":
            bound = self.gate_interval_s + SERVICE_RUN_SLACK_S
            if self.gate_interval_s <= 0 or age > bound:
                return None
            inputs, aged, basis = (
                run.inputs,
                0.0,
                (
                    f"run #{run.run_id}, recorded by the service every {self.gate_interval_s:g} s "
                    f"(a run older than {bound:g} s is not used)"
                ),
            )
        else:
            if run.written_since() is not None:
                return None
            inputs, aged = advance_clock(run.inputs, age), age
            basis = f"run #{run.run_id}; nothing written to the ledger since" + (
                f", ages advanced {age:.0f} s to now" if age >= 1 else ""
            )
        view = GateView.evaluate(inputs, run.evaluated_at, self.info.kind)
        return replace(view, run_id=run.run_id, basis=basis, aged_s=aged)

    def gates(self, thresholds: object | None = None, *, max_age_s: float | None = None) -> GateView:
        """The six gates, by ``rollout.gates.evaluate``; with other ``Thresholds``, the what-if on the same inputs.

        From the latest recorded run when it is current (``recorded_gates``), or this console's own
        last evaluation when newer and no older than ``max_age_s`` (default ``gate_cache_s``);
        otherwise evaluated afresh (a whole-ledger scan, about a second at a million operations).
        ``evaluated_at`` says when the inputs were read and ``basis`` why they are current. To
        evaluate other thresholds on the inputs a view was built from, use ``GateView.with_thresholds``.
        """
        limit = self.gate_cache_s if max_age_s is None else max_age_s
        candidates: list[GateView] = []
        own = self._gate_view
        if own is not None and monotonic_seconds() - own[0] <= limit:
            candidates.append(own[1])
        recorded = self.recorded_gates()
        if recorded is not None:
            candidates.append(recorded)
        view = max(candidates, key=lambda v: v.evaluated_at) if candidates else self._evaluate_here()
        return view if thresholds is None else view.with_thresholds(thresholds)

    def _evaluate_here(self) -> GateView:
        inputs, now = self.gate_inputs()
        view = replace(
            GateView.evaluate(inputs, now, self.info.kind),
            basis="evaluated now by this console (no current recorded run)",
        )
        self._gate_view = (monotonic_seconds(), view)
        return view

    def reevaluate(self) -> GateView:
        """Evaluate the gates afresh now ("Re-evaluate now").

        Service: ``POST /api/v1/gates`` (the service reads its live ledger and records the run).
        File: this console reads the ledger file itself (read-only: nothing is recorded).
        """
        at = self.now()
        body = self.source.evaluate_gates()
        if body is None:
            view = self._evaluate_here()
            view = replace(view, basis="re-evaluated now by this console (read-only: not recorded)")
        else:
            try:
                inputs = gate_inputs_from_recorded({str(g["gate"]): g["inputs"] for g in body["gates"]})
            except (KeyError, TypeError, ValueError) as exc:
                raise QueryFailed(f"the service's gate evaluation could not be read: {exc}") from exc
            run_id = body.get("run_id")
            view = replace(
                GateView.evaluate(inputs, at, self.info.kind),
                run_id=int(run_id) if isinstance(run_id, int) else None,
                basis=f"re-evaluated now by the service (POST /api/v1/gates), recorded as run #{run_id}",
            )
        self._gate_view = (monotonic_seconds(), view)
        with self._lock:
            self._cache.clear()  # the gate history shows the new run as soon as the snapshot has it
        return view

    # gates ----------------------------------------------------------------------------------

    def gate_history(self, *, runs: int = 200) -> pd.DataFrame:
        return self._named("gate_history", runs=_limit(runs))

    def explorer_coverage(self) -> pd.DataFrame:
        return self._named("explorer_coverage")

    def explorer_runs(self, *, limit: int = 200) -> pd.DataFrame:
        return self._named("explorer_runs", limit=_limit(limit))
