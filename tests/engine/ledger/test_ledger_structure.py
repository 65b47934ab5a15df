"""The ledger package is split by concern: no class over 500 lines, and each shared method written in one part."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from engine.ledger.base import SqlLedger
from engine.ledger.core import SqlCore
from engine.ledger.duckdb import Ledger
from engine.ledger.postgres import PgLedger

PACKAGE = Path(__file__).resolve().parents[3] / "engine" / "ledger"


def _classes() -> list[tuple[str, int]]:
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                found.append((f"{path.name}:{node.name}", node.end_lineno - node.lineno + 1))
    return found


def _parts(cls: type) -> list[type]:
    """The classes of the ledger package a driver is composed of, below the driver itself."""
    return [c for c in cls.__mro__[1:] if c.__module__.startswith("engine.ledger.") and c is not SqlLedger]


def _written(part: type) -> set[str]:
    """The methods a part writes out (abstract hooks, which only name what a driver supplies, left out)."""
    return {
        name
        for name, value in vars(part).items()
        if inspect.isfunction(value) and not getattr(value, "__isabstractmethod__", False)
    }


def test_no_class_of_the_ledger_package_is_over_500_lines() -> None:
    """Each concern of the ledger (the shared parts and each driver) is a class of at most 500 lines."""
    sizes = _classes()
    assert len(sizes) >= 12, sizes
    assert max(n for _, n in sizes) <= 500, sorted(sizes, key=lambda s: -s[1])[:3]


def test_each_method_both_sql_ledgers_share_is_written_in_one_part() -> None:
    """No part of ``SqlLedger`` writes a method another part writes too (one would silently win)."""
    seen: dict[str, str] = {}
    for part in [*_parts(SqlLedger), SqlLedger]:
        for name in _written(part):
            assert name not in seen, f"{name} is written in {seen[name]} and in {part.__name__}"
            seen[name] = part.__name__
    assert {"apply_many", "accept_many", "ack_outbox", "open_approval", "append_rollout_event"} <= set(seen)


def test_the_drivers_own_parts_write_nothing_the_shared_parts_write() -> None:
    """PostgreSQL's leases, fencing and send slots and DuckDB's whole-ledger paths add methods of their own."""
    shared = set().union(*(_written(p) for p in _parts(SqlLedger)))
    for driver in (Ledger, PgLedger):
        own = [p for p in _parts(driver) if not issubclass(SqlLedger, p) and p is not SqlCore]
        assert own, driver.__name__
        for part in own:
            assert not _written(part) & shared, (part.__name__, sorted(_written(part) & shared))
    assert {"claim", "renew", "release", "book_send_slots", "_epoch_refusal"} <= set().union(
        *(_written(p) for p in _parts(PgLedger))
    )
