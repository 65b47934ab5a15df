"""psycopg 3 and its pool, for the ledger: the one module that imports ``psycopg`` (TID251).

The PostgreSQL ledger (``engine.ledger.postgres`` and its leases), the analyst role's queries
(``engine.ledger.analyst``), the throwaway PostgreSQL for tests (``engine.testing.postgres``) and
the tests that read rows raw reach PostgreSQL through these names, so what of psycopg the project
depends on is listed here and nowhere else. It is its own module, not ``postgres.py``, because
``postgres.py`` imports ``analyst.py``. It adds nothing to the client: no behaviour, no wrapping.
It must not hold SQL or ledger rules.
"""

from __future__ import annotations

from psycopg import Connection, Cursor, Error, OperationalError, ProgrammingError, connect, errors, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow, dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

__all__ = [
    "Connection",
    "ConnectionPool",
    "Cursor",
    "Error",
    "OperationalError",
    "PoolTimeout",
    "ProgrammingError",
    "TupleRow",
    "connect",
    "conninfo_to_dict",
    "dict_row",
    "errors",
    "sql",
]
