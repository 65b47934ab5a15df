"""The identifier rules of ``engine.limits`` as CHECK constraints, on both ledger backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.ledger import open_ledger
from engine.ledger.port import LedgerPort
from engine.testing import make_operation


def _refuses(ledger: LedgerPort) -> None:
    for i, call_node in enumerate(("a\u0001b", "n" * 300, " ")):
        with pytest.raises(Exception, match=r"(?i)check"):
            ledger.create_operation(make_operation(call_node, arguments={"i": i}), {"i": i})
    ledger.create_operation(make_operation("fine-node"), {})
    assert [op["call_node_id"] for op in ledger.list_operations(limit=10)] == ["fine-node"]


def test_a_postgresql_ledger_refuses_rule_breaking_call_nodes_by_check_constraint(pg_url: str) -> None:
    """PostgreSQL migration 10: control characters, 300-byte and blank call node ids are refused."""
    with open_ledger(pg_url) as ledger:
        _refuses(ledger)


def test_a_duckdb_ledger_refuses_rule_breaking_call_nodes_by_check_constraint(tmp_path: Path) -> None:
    """DuckDB migration 8: the same call node ids are refused the same way."""
    with open_ledger(str(tmp_path / "l.duckdb")) as ledger:
        _refuses(ledger)
