"""kill -9 of the service at random points: nothing acknowledged is lost, nothing is done twice."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.crashtrial import run_trial
from engine.ledger.duckdb import Ledger
from refserver.testing import RefServer
from service.testing import ServiceProcess

# Two kill points per protocol with key lookup (each trial starts the service twice, about 7 CPU-s;
# the suite's time allows six).
# The 100-trial figure is bench/restart.py's.
TRIALS = 6


@pytest.mark.parametrize("trial", range(TRIALS))
def test_kill_minus_nine_loses_nothing_and_doubles_nothing(
    trial: int, tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> None:
    """After a crash and restart: 0 lost, 0 second operations, 0 double receipts, 0 double executions."""
    # Alternate the side-effecting tool's server between protocols with key lookup.
    name, tool = [("aip", "analyze_upload"), ("mcp", "generate_report"), ("ext", "apply_batch_change")][
        trial % 3
    ]
    result = run_trial(
        config=write_config(),
        ledger=tmp_path / "crash.duckdb",
        server_stats=servers[name].stats,
        tool=tool,
        calls=8,
        seed=1000 + trial,
        kill_window=0.8,
    )
    assert result.clean, result
    assert result.unfinished == 0, result


def test_every_answered_submission_of_a_burst_is_in_the_ledger_after_a_kill_minus_nine(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> None:
    """Forty callers at once, the service killed (-9) as soon as the last is answered: the ledger holds
    each answered call node's operation under the id and submission key its answer named."""
    nodes = [f"burst-{i}" for i in range(40)]
    long = {"duration_ms": 600_000, "ttl_ms": 3_600_000}
    with ServiceProcess(tmp_path / "burst.duckdb", write_config()) as service:

        def submit(node: str) -> dict[str, object]:
            with service.client() as client:
                return client.submit(
                    call_node=node, tool="analyze_upload", arguments={"n": node, "_sim": long}
                )

        with ThreadPoolExecutor(len(nodes)) as pool:
            answers = list(pool.map(submit, nodes))
        service.kill()
    with Ledger.open(tmp_path / "burst.duckdb", read_only=True) as ledger:
        found = ledger.by_call_nodes(nodes)
    assert {str(a["call_node"]): (a["operation_id"], a["idempotency_key"]) for a in answers} == {
        node: (op.operation_id, op.idempotency_key) for node, op in found.items()
    }
