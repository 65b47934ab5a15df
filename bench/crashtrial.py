"""Crash-recovery trials: kill -9 the service at random points and check nothing was lost or doubled.

Used by the test suite (a few trials) and ``bench/restart.py`` (many). Each trial submits calls,
kills the service with SIGKILL after a seeded random delay, restarts it on the same ledger, waits
(bounded) until every acknowledged call ends, and counts losses, second operations and double
receipts from the ledger and from the reference server's own records.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from engine import RECEIPT_STATES, Ledger, LocalState
from engine.clock import SystemClock, monotonic_seconds
from engine.errors import ServiceRefused, ServiceUnavailable
from service.testing import ServiceProcess

CLOCK = SystemClock()


@dataclass
class TrialResult:
    submitted: int = 0
    acknowledged: int = 0
    lost: int = 0
    second_operations: int = 0
    double_receipts: int = 0
    double_executions: int = 0
    unfinished: int = 0
    states: Counter[str] = field(default_factory=Counter)

    @property
    def clean(self) -> bool:
        return self.lost == self.second_operations == self.double_receipts == self.double_executions == 0


def run_trial(
    *,
    config: Path,
    ledger: Path,
    server_stats: Callable[[], dict[str, Any]],
    tool: str,
    calls: int,
    seed: int,
    kill_window: float = 1.0,
    finish_timeout: float = 60.0,
) -> TrialResult:
    """One kill -9 trial; ``server_stats`` returns the reference server's ``/admin/stats``."""
    rng = random.Random(seed)
    result = TrialResult()
    nodes = [f"t{seed}-c{i}" for i in range(calls)]
    acknowledged: list[str] = []
    service = ServiceProcess(ledger, config, seed=seed).start()
    killer = threading.Timer(rng.uniform(0.02, kill_window), service.kill)
    killer.start()
    try:
        with service.client() as client:
            for node in nodes:
                result.submitted += 1
                duration = rng.choice([400, 2000, 6000])
                try:
                    client.submit(
                        call_node=node,
                        tool=tool,
                        arguments={"n": node, "_sim": {"duration_ms": duration, "ttl_ms": 3_600_000}},
                    )
                    acknowledged.append(node)
                except (ServiceUnavailable, ServiceRefused):
                    break
    finally:
        killer.join()
        service.kill()
        service.close()
    result.acknowledged = len(acknowledged)
    restarted = ServiceProcess(ledger, config, seed=seed + 1).start()
    try:
        with restarted.client() as client:
            deadline = monotonic_seconds() + finish_timeout
            while monotonic_seconds() < deadline:
                states = {op["call_node_id"]: op["state"] for op in client.operations(limit=10_000)}
                if all(states.get(n) in _SETTLED for n in states):
                    break
                CLOCK.sleep_blocking(timedelta(seconds=0.1))
    finally:
        restarted.close()
    with Ledger.open(ledger, read_only=True) as led:
        ops = {op.call_node_id: op for op in led.operations()}
        receipts = led.count("receipts")
        keys = [op.idempotency_key for op in ops.values()]
    result.lost = sum(1 for n in acknowledged if n not in ops)
    result.double_receipts = max(0, receipts - sum(1 for op in ops.values() if op.state in RECEIPT_STATES))
    result.unfinished = sum(1 for op in ops.values() if op.state not in _SETTLED)
    result.states = Counter(op.state.value for op in ops.values())
    stats = server_stats()
    per_key = Counter(t.get("key") for t in stats.get("tasks", []) if t.get("key") in set(keys))
    result.second_operations = sum(count - 1 for count in per_key.values() if count > 1)
    executions = stats.get("executions", {})
    seen: Counter[str] = Counter()
    for runs in executions.values() if isinstance(executions, dict) else []:
        for run in runs:
            args = run.get("arguments", {}) if isinstance(run, dict) else {}
            if isinstance(args, dict) and str(args.get("n", "")).startswith(f"t{seed}-"):
                seen[str(args["n"])] += 1
    result.double_executions = sum(c - 1 for c in seen.values() if c > 1)
    return result


_SETTLED = {s.value for s in RECEIPT_STATES} | {LocalState.UNKNOWN.value, LocalState.INPUT_REQUIRED.value}
