"""DuckDB's Python client, for the ledger: the one module that imports ``duckdb`` (TID251).

The DuckDB ledger (``engine.ledger.duckdb``), the analysts' sandbox and its snapshots
(``engine.ledger.sandbox``) and the tests that read a ledger file raw reach DuckDB through these
names, so what of DuckDB the project depends on is listed here and nowhere else. It adds nothing
to the client: no behaviour, no wrapping. It must not hold SQL or ledger rules.
"""

from __future__ import annotations

from duckdb import (
    ConstraintException,
    Error,
    InterruptException,
    InvalidInputException,
    IOException,
    OutOfMemoryException,
    TransactionException,
    connect,
)
from duckdb import DuckDBPyConnection as Connection

__all__ = [
    "Connection",
    "ConstraintException",
    "Error",
    "IOException",
    "InterruptException",
    "InvalidInputException",
    "OutOfMemoryException",
    "TransactionException",
    "connect",
]
