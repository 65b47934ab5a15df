"""Contract fixtures: every ``ledger`` test runs on DuckDB (a file) and on PostgreSQL (a fresh database on
one throwaway PostgreSQL 15 per run, started by ``engine.testing.postgres``).

Nothing is skipped: if PostgreSQL cannot start, every test that needs it errors with the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.ledger import open_ledger
from engine.ledger.duckdb import Ledger
from engine.ledger.postgres import PgLedger
from engine.testing.postgres import TemporaryPostgres, shared_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> TemporaryPostgres:
    return shared_cluster()


@pytest.fixture
def pg_url(pg_cluster: TemporaryPostgres) -> str:
    """A new, empty database on the test server."""
    return pg_cluster.create_database(f"t_{uuid.uuid4().hex[:16]}")


@pytest.fixture(params=["duckdb", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where a ledger of ``backend`` lives: a DuckDB file, or a fresh PostgreSQL database."""
    if backend == "duckdb":
        return str(tmp_path / "ledger.duckdb")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def ledger(target: str) -> Iterator[Ledger | PgLedger]:
    led = open_ledger(target)
    try:
        yield led
    finally:
        led.close()
