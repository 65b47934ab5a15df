"""``finality serve`` ends cleanly on SIGTERM, whatever its background work is doing at that moment."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from demo.seed import seed_ledger
from service.testing import ServiceProcess


def test_sigterm_during_the_first_gate_evaluation_ends_the_service_with_status_0(
    tmp_path: Path, write_config: Callable[..., Path]
) -> None:
    # The first gate evaluation starts with the service, on a worker thread. The ledger was closed
    # under it: DuckDB refused ("connection is busy") and the service died with a traceback.
    ledger = tmp_path / "ledger.duckdb"
    seed_ledger(ledger, operations=3_000, seed=3, gate_run_count=0)
    process = ServiceProcess(ledger, write_config(), startup_timeout=120).start()
    status = process.stop(timeout=60)
    stderr = process.stderr()
    process.close()
    assert "Traceback" not in stderr, stderr
    assert status == 0, stderr
