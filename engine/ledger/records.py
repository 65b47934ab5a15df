"""The shared SQL ledger's service records: settings and periodic turns, gate runs, explorer runs, denials.

It stores what the service and the explorer report and hands out periodic turns; it evaluates no
gate and runs no exploration. It must not import a database driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from engine.ledger import sql
from engine.ledger.core import SqlCore
from engine.ledger.port import ExplorerRun
from engine.ledger.rows import _json_text
from engine.ledger.schema import ACCESS_DENIAL_COLUMNS
from engine.model import GateRecord

__all__ = ["ServiceRecords"]


class ServiceRecords(SqlCore):
    """Settings and turns, gate runs, explorer runs and refused control-API attempts."""

    def record_explorer_run(self, run: ExplorerRun) -> int:
        """Append one explorer result (per scenario and protocol); returns its run id."""
        with self._tx() as tx:
            row = tx.execute(
                self._q(sql.EXPLORER_RUN_INSERT),
                [
                    run.scenario,
                    run.protocol,
                    run.seed,
                    run.explored,
                    run.distinct_interleavings,
                    run.divergent,
                    run.exhaustive,
                    run.rules,
                    run.shortest_trace,
                    run.started_at,
                    run.finished_at,
                    run.code,
                    run.revision,
                    run.space,
                    run.space_kind,
                ],
            ).fetchone()
        assert row is not None
        return int(row[0])

    def explorer_runs(self) -> list[dict[str, object]]:
        return self._rows(sql.EXPLORER_RUNS)

    def put_setting(self, key: str, value: str, at: datetime) -> None:
        with self._tx() as tx:
            tx.execute(self._q(sql.SETTING_PUT), [key, value, at])

    def setting(self, key: str) -> str | None:
        row = self._fetchone(sql.SETTING, [key])
        return str(row[0]) if row else None

    def take_turn(self, job: str, at: datetime, every: timedelta) -> bool:
        """Whether the caller takes this interval's turn at ``job``, a periodic job that every
        process on the ledger runs but that must run once per interval for all of them together
        (the periodic gate run). The first caller once ``every`` (less a tenth, so that a turn is
        not lost to timer jitter) has passed since the last turn, by any process, takes it; the turn
        is recorded in the same transaction, under a lock on the job's name, so two processes
        never both take one. Whoever is alive takes the next turn: a dead process leaves no gap.
        """
        key = f"turn:{job}"
        with self._tx() as tx:
            self._serialise(tx, key)
            row = tx.execute(self._q(sql.SETTING), [key]).fetchone()
            if row is not None:
                last = datetime.fromisoformat(str(row[0]))
                if at - last < every * 0.9:
                    return False
            tx.execute(self._q(sql.SETTING_PUT), [key, at.isoformat(), at])
        return True

    def record_gate_run(self, results: Sequence[GateRecord], at: datetime) -> int:
        """Store one evaluation of the gates; returns its run id."""
        with self._tx() as tx:
            row = tx.execute(self._q(sql.GATE_RUN_ID), []).fetchone()
            assert row is not None
            run_id = int(row[0])
            if results:
                tx.executemany(
                    self._q(sql.GATE_RUN_INSERT),
                    [
                        [run_id, r.gate, r.passed, r.value, r.threshold, r.verdict, _json_text(r.inputs), at]
                        for r in results
                    ],
                )
        return run_id

    def gate_runs(self, limit: int = 500) -> list[dict[str, object]]:
        return self._rows(sql.GATE_RUNS, [limit])

    def record_denial(self, row: dict[str, object]) -> None:
        """Record one refused control-API attempt (``ACCESS_DENIAL_COLUMNS``)."""
        with self._tx() as tx:
            tx.execute(self._q(sql.DENIAL_INSERT), [row[c] for c in ACCESS_DENIAL_COLUMNS])

    def denials(self, *, limit: int = 100) -> list[dict[str, object]]:
        """Refused attempts, newest first."""
        return self._rows(sql.DENIALS, [limit])
