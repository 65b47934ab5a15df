"""The executor is split by concern, and how it shares its ledger comes from the ledger's port, never its type."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.ledger.duckdb import Ledger
from engine.model import Epoch
from service.executor.leases import SoleOwner, tenancy_for

PACKAGE = Path(__file__).resolve().parents[2] / "service" / "executor"
BACKENDS = {"Ledger", "PgLedger", "MemLedger"}


def _classes() -> list[tuple[str, int]]:
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                found.append((f"{path.name}:{node.name}", node.end_lineno - node.lineno + 1))
    return found


def test_no_class_of_the_executor_is_over_500_lines() -> None:
    """Each concern of the executor is a class of at most 500 lines."""
    sizes = _classes()
    assert len(sizes) >= 6, sizes
    assert max(n for _, n in sizes) <= 500, sizes


def test_the_executor_never_asks_a_ledger_backend_its_type() -> None:
    """No isinstance on a ledger backend and no import of one: the port says what a backend can do."""
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                assert node.module not in ("engine.ledger.postgres", "engine.ledger.duckdb"), path.name
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "isinstance"
            ):
                named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                assert not named & BACKENDS, (path.name, node.lineno)


def test_a_ledger_without_leasing_runs_alone_and_refuses_leases(tmp_path: Path) -> None:
    """DuckDB's port offers no leasing: the executor owns it alone, and asking for leases is refused."""
    ledger = Ledger.open(tmp_path / "alone.duckdb")
    try:
        assert ledger.leasing is None
        alone = tenancy_for(ledger, owner="o", token="t", lease_s=None)
        assert isinstance(alone, SoleOwner)
        assert not alone.shared
        assert alone.handle(Epoch(3)) is ledger
        with pytest.raises(ValueError, match="leasing"):
            tenancy_for(ledger, owner="o", token="t", lease_s=5.0)
    finally:
        ledger.close()
