"""Contract fixtures: every ``ledger`` test runs on DuckDB (a file), on PostgreSQL (a fresh database on
one throwaway PostgreSQL 15 per run, started by ``engine.testing.postgres``) and on the explorer's
memory ledger (``engine.ledger.memory.MemoryPort``).

Nothing is skipped on DuckDB and PostgreSQL: if PostgreSQL cannot start, every test that needs it
errors with the reason. On the memory ledger a test is skipped only where it cannot apply, and the
skip says why: it opens the ledger by its file or URL (``target``), it checks the database itself
(its ``ledger`` is typed ``Ledger | PgLedger``), or it is marked ``not_in_memory(reason)`` because
it exercises a record the memory ledger does not keep.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.ledger import open_ledger
from engine.ledger.duckdb import Ledger
from engine.ledger.memory import MemoryPort
from engine.ledger.port import LedgerPort
from engine.ledger.postgres import PgLedger
from engine.testing.postgres import TemporaryPostgres, shared_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> TemporaryPostgres:
    return shared_cluster()


@pytest.fixture
def pg_url(pg_cluster: TemporaryPostgres) -> str:
    """A new, empty database on the test server."""
    return pg_cluster.create_database(f"t_{uuid.uuid4().hex[:16]}")


NO_TARGET = (
    "memory: this test opens the ledger by its file or URL (again, read-only, or from several "
    "connections at once); the memory ledger lives in one process's memory and has none"
)
DATABASE_ONLY = (
    "memory: this test checks the database itself (its constraints, SQL or connections); the memory "
    "ledger has no database, its rules are the ones the other tests check through the port"
)


@pytest.fixture(params=["duckdb", "postgres", "memory"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """Where a ledger of ``backend`` lives: a DuckDB file, or a fresh PostgreSQL database."""
    if backend == "memory":
        pytest.skip(NO_TARGET)
    if backend == "duckdb":
        return str(tmp_path / "ledger.duckdb")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def ledger(backend: str, request: pytest.FixtureRequest) -> Iterator[LedgerPort | Ledger | PgLedger]:
    if backend == "memory":
        marked = request.node.get_closest_marker("not_in_memory")
        if marked is not None:
            pytest.skip(f"memory: {marked.args[0]}")
        if "PgLedger" in str(request.function.__annotations__.get("ledger", "")):
            pytest.skip(DATABASE_ONLY)
        yield MemoryPort("http://127.0.0.1:1")  # type: ignore[misc]
        return
    led = open_ledger(str(request.getfixturevalue("target")))
    try:
        yield led
    finally:
        led.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "not_in_memory(reason): the test exercises a record the memory ledger does not keep"
    )
