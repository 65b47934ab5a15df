"""The outbox's consumers, held on both backends: acceptance-ordered cursors, idempotent acknowledgements,
refusals recorded, and the traceability gate computed from the acknowledgements (issue 21)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from ledger_kit import NOW, PAYLOAD, E, advance, created, raw, to_fetching, verified

from engine.errors import AckRefused
from engine.ledger.duckdb import Ledger
from engine.ledger.gate_sql import UNACKED_STALE_S
from engine.ledger.postgres import PgLedger
from engine.machine import step
from engine.model import CancelConfirmed, CancelRequested, Submitted, TaskId
from rollout.gates import evaluate


def _accept_three(ledger: Ledger | PgLedger) -> list[str]:
    """Three primary calls accepted in order c0, c1 (cancelled), c2; their call nodes."""
    ledger.accept_terminal(verified(to_fetching(ledger, "c0")), PAYLOAD)
    sent = advance(ledger, created(ledger, "c1"), Submitted(TaskId("t-c1"), E))
    asked = advance(ledger, sent, CancelRequested(1, "alice", "not needed"))
    ledger.accept_terminal(step(asked, CancelConfirmed(TaskId("t-c1"), 1, E), NOW), None)
    ledger.accept_terminal(verified(to_fetching(ledger, "c2"), {**PAYLOAD, "n": 2}), {**PAYLOAD, "n": 2})
    return ["c0", "c1", "c2"]


def test_a_consumer_reads_ready_entries_in_acceptance_order_after_its_cursor(
    ledger: Ledger | PgLedger,
) -> None:
    """Entries come in acceptance order with receipt status and digests; ``after`` skips what came before."""
    nodes = _accept_three(ledger)
    entries = ledger.outbox_ready("wf", None, 10)
    assert [e["call_node_id"] for e in entries] == nodes
    seqs = [int(str(e["seq"])) for e in entries]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 3
    assert entries[0]["status"] == "completed"
    assert entries[0]["result"] == PAYLOAD
    assert entries[0]["result_digest"] is not None
    later = ledger.outbox_ready("wf", seqs[0], 10)
    assert [e["call_node_id"] for e in later] == nodes[1:]
    assert [e["call_node_id"] for e in ledger.outbox_ready("wf", None, 1)] == nodes[:1]


def test_a_cancelled_calls_entry_carries_cancel_evidence_and_no_success_payload(
    ledger: Ledger | PgLedger,
) -> None:
    """The cancelled call's entry: status cancelled, cancel evidence from the receipt, no result or digest."""
    _accept_three(ledger)
    (entry,) = [e for e in ledger.outbox_ready("wf", None, 10) if e["call_node_id"] == "c1"]
    assert entry["status"] == "cancelled"
    assert entry["result"] is None
    assert entry["result_digest"] is None
    assert entry["cancel_evidence"]


def test_an_unacknowledged_entry_is_delivered_again_and_an_ack_is_recorded_once_per_consumer(
    ledger: Ledger | PgLedger,
) -> None:
    """At-least-once to the consumer, exactly-once as recorded: a second ack is a no-op, another consumer's is its own."""
    _accept_three(ledger)
    first = ledger.outbox_ready("wf", None, 10)[0]
    # The consumer died before acknowledging: from the same cursor it receives the entry again.
    assert ledger.outbox_ready("wf", None, 10)[0]["call_node_id"] == first["call_node_id"]
    digest = first["result_digest"]
    ack = ledger.ack_outbox("wf", "c0", "completed", str(digest), NOW)
    again = ledger.ack_outbox("wf", "c0", "completed", str(digest), NOW + timedelta(seconds=5))
    assert not ack.repeated
    assert again.repeated
    assert again.acknowledged_at == ack.acknowledged_at
    other = ledger.ack_outbox("billing", "c0", "completed", str(digest), NOW)
    assert not other.repeated
    assert raw(ledger, "SELECT count(*) FROM outbox_acks") == [(2,)]
    assert [e["call_node_id"] for e in ledger.outbox_ready("wf", None, 10)] == ["c1", "c2"]
    assert [e["call_node_id"] for e in ledger.outbox_ready("audit", None, 10)] == ["c0", "c1", "c2"]
    lag = {str(r["consumer"]): r for r in ledger.outbox_lag()}
    assert lag["wf"]["acknowledged"] == 1
    assert lag["wf"]["behind"] == 2


def test_an_ack_of_a_missing_or_mismatching_entry_is_refused_and_recorded(ledger: Ledger | PgLedger) -> None:
    """No such entry, a wrong status, a wrong digest: each refused, each kept in outbox_ack_refusals."""
    _accept_three(ledger)
    with pytest.raises(AckRefused) as missing:
        ledger.ack_outbox("wf", "nobody", "completed", None, NOW)
    assert missing.value.missing
    with pytest.raises(AckRefused, match="status"):
        ledger.ack_outbox("wf", "c1", "completed", None, NOW)
    with pytest.raises(AckRefused, match="digest") as forged:
        ledger.ack_outbox("wf", "c0", "completed", "sha256:forged", NOW)
    assert not forged.value.missing
    assert raw(ledger, "SELECT count(*) FROM outbox_ack_refusals") == [(3,)]
    assert raw(ledger, "SELECT count(*) FROM outbox_acks") == [(0,)]


def test_traceability_is_measured_from_acknowledgements_not_from_outbox_rows(
    ledger: Ledger | PgLedger,
) -> None:
    """No ack: no data; all acked: passes; a refused ack or a stale unacknowledged entry fails it."""
    _accept_three(ledger)
    now = NOW + timedelta(seconds=10)
    gate = {r.gate: r for r in evaluate(ledger.gate_inputs(now)).results}["traceability"]
    assert not gate.passed
    assert gate.verdict.startswith("no data")
    for e in ledger.outbox_ready("wf", None, 10):
        status, digest = str(e["status"]), e["result_digest"]
        ledger.ack_outbox("wf", str(e["call_node_id"]), status, None if digest is None else str(digest), now)
    inputs = ledger.gate_inputs(now)["traceability"]
    assert inputs["advances"] == 3
    assert inputs["untraceable"] == 0
    assert inputs["unacknowledged"] == 0
    assert {r.gate: r for r in evaluate(ledger.gate_inputs(now)).results}["traceability"].passed
    with pytest.raises(AckRefused):
        ledger.ack_outbox("wf", "c2", "completed", "sha256:forged", now)
    gate = {r.gate: r for r in evaluate(ledger.gate_inputs(now)).results}["traceability"]
    assert not gate.passed
    assert gate.value == pytest.approx(3 / 4)
    assert "1 acknowledgements refused" in gate.verdict


def test_an_entry_no_consumer_acknowledges_goes_stale_with_its_age(ledger: Ledger | PgLedger) -> None:
    """Entries ready longer than the threshold are counted, with the oldest one's age, and fail the gate."""
    nodes = _accept_three(ledger)
    entry = ledger.outbox_ready("wf", None, 10)[0]
    ledger.ack_outbox("wf", nodes[0], "completed", str(entry["result_digest"]), NOW)
    accepted_at = raw(ledger, "SELECT max(created_at) FROM outbox")[0][0]
    assert accepted_at is not None
    late = accepted_at + timedelta(seconds=UNACKED_STALE_S + 60)  # type: ignore[operator]
    inputs = ledger.gate_inputs(late)["traceability"]
    assert inputs["unacknowledged"] == 2
    assert inputs["stale_unacknowledged"] == 2
    assert float(str(inputs["oldest_unacknowledged_s"])) >= UNACKED_STALE_S + 60
    gate = {r.gate: r for r in evaluate(ledger.gate_inputs(late)).results}["traceability"]
    assert not gate.passed
    assert "2 entries unacknowledged" in gate.verdict


def test_entries_written_before_the_numbering_migration_come_first_in_acceptance_order(target: str) -> None:
    """A ledger from before the outbox migration: its entries get seq <= 0 in acceptance order, new ones follow."""
    from engine.ledger import open_ledger
    from engine.ledger.schema import MIGRATIONS, OUTBOX_DELIVERY_NAME, PG_MIGRATIONS

    migrations = PG_MIGRATIONS if "://" in target else MIGRATIONS
    mine = next(version for version, name, _ in migrations if name == OUTBOX_DELIVERY_NAME)
    with open_ledger(target) as led:
        _accept_three(led)
        # Back to the schema before the migration (its statements undone), the rows kept.
        for statement in (
            "DROP TABLE outbox_ack_refusals",
            "DROP TABLE outbox_acks",
            *(["DROP INDEX outbox_seq_order"] if "://" in target else []),
            "ALTER TABLE outbox DROP COLUMN seq",
            "DROP SEQUENCE outbox_seq",
            # The migrations that came after it (approvals' closed rounds, access denials), undone too.
            "ALTER TABLE approvals DROP COLUMN closed_at",
            "ALTER TABLE approvals DROP COLUMN closed_reason",
            "DROP TABLE access_denials",  # and the access denials after that
            "ALTER TABLE explorer_runs DROP COLUMN space",  # and the explorer runs' space after that
            "ALTER TABLE explorer_runs DROP COLUMN space_kind",
            f"DELETE FROM schema_migrations WHERE version >= {mine}",
        ):
            raw(led, statement)
    with open_ledger(target) as led:
        assert led.schema_version() == migrations[-1][0]
        led.accept_terminal(verified(to_fetching(led, "c3")), PAYLOAD)
        entries = led.outbox_ready("wf", None, 10)
    assert [e["call_node_id"] for e in entries] == ["c0", "c1", "c2", "c3"]
    assert [int(str(e["seq"])) for e in entries] == [-2, -1, 0, 1]
