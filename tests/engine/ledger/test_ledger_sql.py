"""The ledger package's shape: one text per shared statement, rendered per dialect; no driver imported where it must not be."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine.ledger import duckdb_client, sql
from engine.ledger.duckdb import Ledger

LEDGER = Path(__file__).resolve().parents[3] / "engine" / "ledger"

_STATEMENTS = sorted(
    (name, value)
    for name, value in vars(sql).items()
    if name.isupper() and isinstance(value, str) and value.lstrip().startswith(("SELECT", "INSERT", "UPDATE"))
)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_a_postgres_rendering_has_psycopg_placeholders_and_every_fragment_filled() -> None:
    """Rendered for PostgreSQL, a shared text keeps its parameters (as %s), its literal % (as %%) and no fragment."""
    text = "SELECT a FROM t WHERE b = ? AND c LIKE 'x%' ORDER BY a{c}"
    assert (
        sql.render(text, "postgres")
        == "SELECT a FROM t WHERE b = %s AND c LIKE 'x%%' ORDER BY a COLLATE \"C\""
    )
    assert sql.render(text, "duckdb") == "SELECT a FROM t WHERE b = ? AND c LIKE 'x%' ORDER BY a"


@pytest.mark.parametrize(("name", "text"), _STATEMENTS, ids=[n for n, _ in _STATEMENTS])
def test_every_shared_statement_is_one_text_both_dialects_can_bind(name: str, text: str) -> None:
    """Each shared statement renders in both dialects with the same parameters and no fragment left over."""
    duck, pg = sql.render(text, "duckdb"), sql.render(text, "postgres")
    assert "{" not in duck, name
    assert "{" not in pg, name
    assert duck.count("?") == len(re.findall(r"(?<!%)%s", pg)), name


def test_duckdb_prepares_every_shared_statement_on_a_migrated_ledger(tmp_path: Path) -> None:
    """Every shared statement that stands alone is valid SQL over the real DuckDB schema (prepared, not run)."""
    path = tmp_path / "ledger.duckdb"
    Ledger.open(path).close()
    con = duckdb_client.connect(str(path))
    try:
        for _, text in _STATEMENTS:
            con.execute(f"PREPARE probe AS {sql.render(text, 'duckdb')}")
            con.execute("DEALLOCATE probe")
    finally:
        con.close()


def test_analyst_sql_does_not_import_the_postgres_driver() -> None:
    """engine/ledger/analyst.py names what it needs of a ledger itself: it never imports engine.ledger.postgres."""
    assert not {m for m in _imports(LEDGER / "analyst.py") if m.startswith("engine.ledger.postgres")}


def test_the_shared_ledger_logic_imports_no_database_driver() -> None:
    """base.py, sql.py, rows.py and schema.py import neither duckdb nor psycopg (only the drivers do)."""
    for module in ("base.py", "sql.py", "rows.py", "schema.py"):
        imported = _imports(LEDGER / module)
        assert not {m for m in imported if m.split(".")[0] in {"duckdb", "psycopg", "psycopg_pool"}}, module
