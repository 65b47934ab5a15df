"""The documentation the analysts and newcomers read is checked against the code."""

from __future__ import annotations

import re
from pathlib import Path

from engine.ledger.duckdb import Ledger
from engine.model import LocalState

ROOT = Path(__file__).resolve().parents[2]


def documented_tables() -> dict[str, list[str]]:
    tables: dict[str, list[str]] = {}
    current: str | None = None
    for line in (ROOT / "docs" / "ledger.md").read_text().splitlines():
        heading = re.match(r"^### (\w+)$", line)
        if heading:
            current = heading.group(1)
            tables[current] = []
            continue
        cell = re.match(r"^\| (\w+) \| [A-Z]+ \|", line)
        if current and cell:
            tables[current].append(cell.group(1))
    return tables


def test_ledger_docs_list_every_table_and_column_in_order() -> None:
    """docs/ledger.md matches the real schema, table by table, column by column."""
    with Ledger.open(":memory:") as led:
        real = led.table_columns()
    assert documented_tables() == real


def test_readme_state_list_matches_local_states() -> None:
    """The README's list of local states is exactly LocalState."""
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- states -->")[1]
    listed = re.findall(r"`([A-Z_]+)`", block)
    assert listed == [s.value for s in LocalState]
