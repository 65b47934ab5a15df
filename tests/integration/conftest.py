"""Fixtures of the race integration tests: one reference server per kind for the whole session (reset
before every test) and a fresh ledger per test. The helpers and the invariant check are in ``race_kit``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from race_kit import Fleet

from engine.ledger.duckdb import Ledger
from refserver.testing import RefServer


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    servers = Fleet()
    yield servers
    servers.stop()


@pytest.fixture
def server(request: pytest.FixtureRequest, fleet: Fleet) -> RefServer:
    """The reference server of kind ``request.param``, with no tasks, counters or faults left."""
    chosen = fleet.get(request.param)
    chosen.reset()
    return chosen


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    opened = Ledger.open(tmp_path / "ledger.duckdb")
    yield opened
    opened.close()
