"""The suite's schedule on two workers: the longest files start first.

`make unit` runs `pytest -n 2 --dist loadfile --no-loadscope-reorder`: xdist hands whole files to the
workers in collection order. By default it would order them by their number of tests, which puts the
files of a few long browser, demo and restart tests last, where one of them runs alone while the other
worker idles. Collected in the order below instead (the slowest first, measured in CI's durations),
the short files fill in around them. Only the order changes: every test still runs.
"""

from __future__ import annotations

import pytest

# Files whose tests take over about 30 s together on a CI machine, slowest first. A new slow file
# belongs here; a file missing from the list runs after these, in the usual order.
SLOW_FIRST = (
    "tests/bench/test_mutants_explorer.py",  # the explorer half of make mutants, ~90 s of one core
    "tests/console/test_browser.py",
    "tests/demo/test_demo_living.py",
    "tests/service/test_restart_recovery.py",
    "tests/console/test_browser_walk.py",
    "tests/pg/test_cluster.py",
    "tests/pg/test_executors.py",
    "tests/console/test_browser_roles.py",
    "tests/rollout/test_rollback.py",
    "tests/rollout/test_rollout_service.py",
    "tests/service/test_analyst_reads.py",
    "tests/console/test_browser_signin.py",
    "tests/console/test_outage.py",
    "tests/pg/test_epoch_refusals.py",
    "tests/service/test_service_http.py",
    "tests/engine/ledger/test_ledger.py",
    "tests/console/test_notebook.py",
    "tests/pg/test_cluster_actions.py",
    "tests/engine/runtime/test_call_cli.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(
        key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank))
    )  # stable: files stay whole
