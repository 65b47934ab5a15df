"""demo.seed: a seeded ledger keeps the ledger's invariants, and later writes continue after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import LedgerError
from engine.ledger.duckdb import Ledger
from engine.ledger.sandbox import run_query
from engine.testing import make_operation


def one(path: Path, sql: str) -> object:
    return run_query(path, sql).rows[0][0]


def test_seeded_history_keeps_one_receipt_and_one_outbox_row_per_call_node(seeded_ledger: Path) -> None:
    """Terminal operations hold exactly one receipt; only primaries reach the outbox, each joining its receipt."""
    assert one(seeded_ledger, "SELECT count(*) FROM operations") == 3000
    terminal = one(
        seeded_ledger, "SELECT count(*) FROM op_state WHERE state IN ('ACCEPTED','CANCELLED_ACCEPTED')"
    )
    assert one(seeded_ledger, "SELECT count(*) FROM receipts") == terminal
    assert (
        one(
            seeded_ledger,
            "SELECT count(*) FROM outbox o JOIN receipts r USING (call_node_id) WHERE r.role = 'shadow'",
        )
        == 0
    )
    assert one(seeded_ledger, "SELECT count(DISTINCT state) FROM op_state") >= 10
    assert (
        one(
            seeded_ledger,
            "SELECT count(*) FROM transitions t JOIN op_state s USING (operation_id) "
            "WHERE t.row_version = s.row_version AND t.to_state <> s.state",
        )
        == 0
    )


def test_writes_after_seeding_continue_the_sequences(seeded_ledger: Path, tmp_path: Path) -> None:
    """A new operation after the import gets the next transition seq, not a reused one."""
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(seeded_ledger.read_bytes())
    with Ledger.open(copy) as ledger:
        before = ledger.count("transitions")
        ledger.create_operation(make_operation("after-seeding"), {})
        seqs = ledger._rows(
            "SELECT max(seq) AS m, count(DISTINCT seq) AS d, count(*) AS n FROM transitions", []
        )[0]
    assert seqs["m"] == before + 1
    assert seqs["d"] == seqs["n"]


def test_import_refuses_tables_it_must_not_write(tmp_path: Path) -> None:
    """Gate runs and the rollout's chain are never bulk-imported."""
    import pyarrow as pa

    with (
        Ledger.open(tmp_path / "l.duckdb") as ledger,
        pytest.raises(LedgerError, match="cannot be bulk-imported"),
    ):
        ledger.import_rows({"gate_runs": pa.table({"run_id": [1]})})
