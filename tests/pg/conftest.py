"""PostgreSQL fixtures: one throwaway PostgreSQL 15 per test run (initdb into a temporary folder,
127.0.0.1 only, started by ``engine.testing.postgres``), a fresh database per test.

Nothing is skipped: if PostgreSQL cannot start, every test that needs it errors with the reason.
"""

from __future__ import annotations

import uuid

import pytest

from engine.testing.postgres import TemporaryPostgres, shared_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> TemporaryPostgres:
    return shared_cluster()


@pytest.fixture
def pg_url(pg_cluster: TemporaryPostgres) -> str:
    """A new, empty database on the test server."""
    return pg_cluster.create_database(f"t_{uuid.uuid4().hex[:16]}")
