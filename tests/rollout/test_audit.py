"""The audit chain: every link hashes its predecessor; edits, deletions, reorderings and a dropped tail are caught."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from rollout.audit import GENESIS, Anchor, AuditEvent, canonical, next_event, row_hash, verify

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def chain(n: int) -> tuple[list[AuditEvent], Anchor]:
    rows: list[AuditEvent] = []
    seq, prev = 0, GENESIS
    state: dict[str, object] = {"stage": "off"}
    for i in range(n):
        after = {"stage": f"s{i}"}
        event = next_event(
            prev_seq=seq,
            prev_hash=prev,
            action="canary",
            actor=f"actor{i}",
            reason=f"reason {i}",
            override=i % 2 == 0,
            before_state=state,
            after_state=after,
            detail={"i": i},
            gate_inputs={"g": {"n": i, "at": T0 + timedelta(seconds=i)}},
            at=T0 + timedelta(minutes=i),
        )
        rows.append(event)
        seq, prev, state = event.seq, event.hash, after
    anchor = Anchor(rows[-1].seq, rows[-1].hash, canonical(state)) if rows else Anchor(0, GENESIS, "")
    return rows, anchor


def test_an_untouched_chain_verifies() -> None:
    """Links follow, hashes match, the anchor points at the last row."""
    rows, anchor = chain(5)
    report = verify(rows, anchor)
    assert report.ok, report.problems
    assert report.checked == 5
    assert rows[0].prev_hash == GENESIS
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(rows))


def test_an_empty_chain_without_anchor_verifies() -> None:
    """A ledger that never rolled anything out is consistent."""
    assert verify([], None).ok


@given(
    st.integers(0, 4),
    st.sampled_from(["actor", "reason", "detail", "after_state", "override", "recorded_at"]),
)
def test_editing_any_field_of_any_row_is_detected(index: int, field: str) -> None:
    """Changing one field of one row breaks that row's hash."""
    rows, anchor = chain(5)
    old = rows[index]
    changed: object
    match field:
        case "override":
            changed = not old.override
        case "recorded_at":
            changed = old.recorded_at + timedelta(microseconds=1)
        case _:
            changed = getattr(old, field) + "x"
    rows[index] = replace(old, **{field: changed})
    report = verify(rows, anchor)
    assert not report.ok
    assert any(f"seq={old.seq}" in p and "edited" in p for p in report.problems)


def test_editing_gate_inputs_is_detected() -> None:
    """The stored gate inputs must still match the digest the hash covers."""
    rows, anchor = chain(3)
    rows[1] = replace(rows[1], gate_inputs=rows[1].gate_inputs.replace('"n":1', '"n":0'))
    assert any("gate inputs" in p for p in verify(rows, anchor).problems)


def test_rehashing_an_edited_row_still_breaks_the_next_link() -> None:
    """An editor who recomputes the edited row's hash breaks its successor's prev_hash."""
    rows, anchor = chain(4)
    edited = replace(rows[1], reason="nothing to see")
    rows[1] = replace(edited, hash=row_hash(edited))
    problems = verify(rows, anchor).problems
    assert any("seq=3" in p and "prev_hash" in p for p in problems)


@given(st.integers(0, 4))
def test_deleting_any_row_is_detected(index: int) -> None:
    """A deleted row leaves a gap and a broken link, or (the last one) a chain shorter than its anchor."""
    rows, anchor = chain(5)
    del rows[index]
    assert not verify(rows, anchor).ok


def test_deleting_the_newest_row_is_caught_by_the_anchor() -> None:
    """Truncating the tail keeps every link intact, so only the anchor can tell."""
    rows, anchor = chain(5)
    problems = verify(rows[:-1], anchor).problems
    assert len(problems) == 1
    assert "ends at seq 4" in problems[0]


@given(st.integers(0, 3))
def test_swapping_two_neighbouring_rows_is_detected(index: int) -> None:
    """Reordering (exchanging positions, or exchanging their seq numbers) breaks the chain."""
    rows, anchor = chain(5)
    swapped = list(rows)
    swapped[index], swapped[index + 1] = swapped[index + 1], swapped[index]
    assert not verify(swapped, anchor).ok
    renumbered = list(rows)
    a, b = renumbered[index], renumbered[index + 1]
    renumbered[index], renumbered[index + 1] = replace(b, seq=a.seq), replace(a, seq=b.seq)
    assert not verify(renumbered, anchor).ok


def test_editing_the_current_state_is_detected() -> None:
    """The state row must be the state the last event left."""
    rows, anchor = chain(2)
    assert not verify(rows, replace(anchor, state=canonical({"stage": "full"}))).ok


def test_events_without_an_anchor_are_reported() -> None:
    """Rows exist but the state row was deleted."""
    rows, _ = chain(2)
    assert not verify(rows, None).ok
