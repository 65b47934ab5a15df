"""A group commit's outcomes held as arrays (``engine.ledger.port.Outcomes``) read like a list of them."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from engine.errors import StaleWrite
from engine.ledger.duckdb import Ledger
from engine.ledger.port import BatchOutcome, Outcomes, refusals
from engine.machine import step
from engine.model import Epoch, Submitted, TaskId
from engine.testing import EPOCH_START, make_operation


def test_outcomes_index_iterate_and_compare_like_the_list_of_their_outcomes() -> None:
    """Each transition's outcome is at its index, refused ones with their error and no operation."""
    ops = [make_operation(f"o{i}") for i in range(4)]
    stale = StaleWrite(ops[2].operation_id, 1)
    outcomes = Outcomes([ops[0], ops[1], None, ops[3]], {2: stale})
    expected = [BatchOutcome(ops[0], None), BatchOutcome(ops[1], None), BatchOutcome(None, stale)]
    expected.append(BatchOutcome(ops[3], None))
    assert outcomes == expected
    assert list(outcomes) == expected
    assert len(outcomes) == 4
    assert outcomes[-2] == expected[2]
    assert outcomes[1:3] == expected[1:3]
    assert list(refusals(outcomes)) == [(2, stale)]
    assert list(refusals(expected)) == [(2, stale)]
    with pytest.raises(IndexError):
        outcomes[4]


def test_a_clean_group_commit_makes_no_object_per_transition(tmp_path: Path) -> None:
    """A DuckDB group commit of 2,000 written transitions leaves no tracked object per transition for
    the cyclic collector to walk: its outcomes are made when read."""
    with Ledger.open(tmp_path / "ledger.duckdb") as ledger:
        created = ledger.create_many([(make_operation(f"o{i}"), {}) for i in range(2_000)])
        group = [
            step(op, Submitted(TaskId(f"t{i}"), Epoch(1)), EPOCH_START) for i, (op, _) in enumerate(created)
        ]
        ledger.apply_many(group[:2])  # the first group's one-time costs (statements, caches)
        gc.collect()
        before = len(gc.get_objects())
        outcomes = ledger.apply_many(group[2:])
        grown = len(gc.get_objects()) - before
        assert grown < 200, grown
        assert not list(refusals(outcomes))
        assert [o.operation for o in outcomes] == [t.after for t in group[2:]]
