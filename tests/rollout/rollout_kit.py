"""Helpers for the rollout tests: configs over an old-path and a new-path reference server, bounded waits."""

from __future__ import annotations

import asyncio
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping

from engine.ledger.duckdb import Ledger
from engine.testing.wait import wait_until_async
from refserver.testing import RefServer
from service.config import ServiceConfig, parse_config
from service.executor import Executor

TIME_SCALE = 0.05


def rollout_config(servers: Mapping[str, RefServer], *, qps: float = 200, extra: str = "") -> str:
    """Two tools on the old path with the new path as their shadow_server; one tool outside the rollout."""
    return f"""
global_qps = {qps}
rollout_salt = "rollout-test"

[poll]
default_interval_ms = 100
min_interval_ms = 50
max_interval_ms = 500
retry_backoff_ms = 50

[servers.old]
url = "{servers["old"].endpoint}"
protocol = "mcp-2025-11-25"
qps = {qps}

[servers.new]
url = "{servers["new"].endpoint}"
protocol = "mcp-2026-07-28"
qps = {qps}

[tools.generate_report]
server = "old"
shadow_server = "new"
side_effect_free = true

[tools.apply_batch_change]
server = "old"
shadow_server = "new"

[tools.analyze_upload]
server = "old"
side_effect_free = true
{extra}
"""


def parsed_config(servers: Mapping[str, RefServer], **kwargs: object) -> ServiceConfig:
    return parse_config(tomllib.loads(rollout_config(servers, **kwargs)))  # type: ignore[arg-type]


async def settle(predicate: Callable[[], bool], *, within: float, what: str) -> None:
    """Poll ``predicate`` (every 200 ms: each look costs the executor's loop a query) for at most ``within`` s."""
    await wait_until_async(predicate, within=within, every=0.2, what=what)


def states(ledger: Ledger) -> Counter[str]:
    out: Counter[str] = Counter()
    for state, _, count in ledger.state_counts():
        out[state] += count
    return out


def executions(server: RefServer) -> Counter[str]:
    """How many times each call node's work started on the server (by the ``n`` argument)."""
    seen: Counter[str] = Counter()
    for runs in server.stats().get("executions", {}).values():
        for run in runs:
            node = run.get("arguments", {}).get("n")
            if node is not None:
                seen[str(node)] += 1
    return seen


def created(server: RefServer) -> int:
    return int(server.stats()["operations_created"]["total"])


async def stop(executor: Executor, runner: asyncio.Task[None]) -> None:
    """Stop an in-process executor: let its loop finish every advance it started (bounded), then close."""
    executor.request_stop()
    await asyncio.wait_for(runner, timeout=40)
    await executor.aclose()
