"""The DuckDB ledger: migrations, compare-and-swap, group commit, acceptTerminal and bad files."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from engine.errors import (
    DuplicateOperation,
    InvalidRecord,
    LedgerCorrupt,
    LedgerError,
    LedgerUnavailable,
    ReceiptConflict,
    SchemaTooNew,
    StaleWrite,
)
from engine.ledger import duckdb as duckdb_ledger
from engine.ledger import duckdb_client
from engine.ledger.duckdb import Ledger
from engine.ledger.port import HeldOutcome, Json, WriteGroup
from engine.ledger.rows import operation_from_record, operation_to_record
from engine.ledger.schema import SUPPORTED_SCHEMA
from engine.machine import step
from engine.model import (
    AcceptTerminal,
    CancelConfirmed,
    CancelRequested,
    Epoch,
    EpochRaised,
    Event,
    FetchStarted,
    LocalState,
    Operation,
    ResultVerified,
    Role,
    ServerStatus,
    StatusObserved,
    Submitted,
    TaskId,
    Transition,
    digest_of,
)
from engine.testing import EPOCH_START, make_operation

S = LocalState
E = Epoch(1)
NOW = EPOCH_START
PAYLOAD: dict[str, object] = {"content": [{"type": "text", "text": "report"}], "isError": False}


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger.open(tmp_path / "ledger.duckdb") as led:
        yield led  # type: ignore[misc]


def advance(ledger: Ledger, op: Operation, event: Event) -> Operation:
    t = step(op, event, NOW)
    assert t.accepted, t.reason
    if any(isinstance(e, AcceptTerminal) for e in t.effects):
        ledger.accept_terminal(t, PAYLOAD)
        return t.after
    return ledger.apply(t)


def to_fetching(ledger: Ledger, call_node: str = "n1", **kw: object) -> Operation:
    op, _ = ledger.create_operation(make_operation(call_node, **kw), {"report": call_node})  # type: ignore[arg-type]
    task = TaskId(f"task-{call_node}")
    op = advance(ledger, op, Submitted(task, E))
    op = advance(ledger, op, StatusObserved(task, ServerStatus.COMPLETED, E))
    return advance(ledger, op, FetchStarted(E))


def verified(op: Operation) -> Transition:
    return step(op, ResultVerified(op.task_id, ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)


# ------------------------------------------------------------------------------------- migrations


def test_migrations_are_recorded_once_and_reopen_cleanly(tmp_path: Path) -> None:
    """Opening twice applies each migration once."""
    path = tmp_path / "l.duckdb"
    Ledger.open(path).close()
    with Ledger.open(path) as led:
        assert led.schema_version() == SUPPORTED_SCHEMA
        assert led.count("operations") == 0


def _in_a_fresh_process(code: str) -> subprocess.CompletedProcess[str]:
    # A fresh interpreter: nothing this test process loaded into DuckDB earlier can hide a failure.
    return subprocess.run(
        [sys.executable, "-c", f"import os; from engine.ledger.duckdb import Ledger; {code}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_fresh_ledger_whose_process_dies_right_after_opening_opens_again(tmp_path: Path) -> None:
    """A process killed just after creating (migrating) a ledger, before DuckDB checkpoints: the next
    process opens it (it must not have to replay the schema from the WAL, which asks to download an
    extension)."""
    path = str(tmp_path / "ledger.duckdb")
    died = _in_a_fresh_process(f"led = Ledger.open({path!r}); os._exit(0)")  # no close: no checkpoint
    assert died.returncode == 0, died.stderr
    reopened = _in_a_fresh_process(f"print(Ledger.open({path!r}).schema_version())")
    assert reopened.returncode == 0, reopened.stderr
    assert reopened.stdout.strip() == str(SUPPORTED_SCHEMA)


def test_ledger_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    """A file written by a newer Finality is refused with both versions named."""
    path = tmp_path / "l.duckdb"
    Ledger.open(path).close()
    con = duckdb_client.connect(str(path))
    con.execute("INSERT INTO schema_migrations VALUES (999, 'future', now())")
    con.close()
    with pytest.raises(SchemaTooNew, match="999"):
        Ledger.open(path)


def test_corrupt_file_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    """A file that is not a DuckDB ledger is named as such, and left untouched."""
    path = tmp_path / "l.duckdb"
    path.write_bytes(b"this is not a database at all, just text" * 10)
    before = path.read_bytes()
    with pytest.raises(LedgerCorrupt, match="not a DuckDB ledger"):
        Ledger.open(path)
    assert path.read_bytes() == before


def test_truncated_ledger_file_is_refused(tmp_path: Path) -> None:
    """A ledger cut short is reported as damaged, not opened half-way."""
    path = tmp_path / "l.duckdb"
    with Ledger.open(path) as led:
        led.create_operation(make_operation("n1"), {})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(LedgerError):
        Ledger.open(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unwritable_folder_is_refused(tmp_path: Path) -> None:
    """A folder that cannot be written names the problem."""
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(LedgerUnavailable, match="not writable"):
            Ledger.open(tmp_path / "l.duckdb")
    finally:
        tmp_path.chmod(0o700)


def test_missing_folder_is_refused(tmp_path: Path) -> None:
    """A ledger path in a folder that does not exist is refused before anything is created."""
    with pytest.raises(LedgerUnavailable, match="does not exist"):
        Ledger.open(tmp_path / "nope" / "l.duckdb")


def test_read_only_open_of_a_missing_file_is_refused(tmp_path: Path) -> None:
    """Readers never create a ledger."""
    with pytest.raises(LedgerUnavailable):
        Ledger.open(tmp_path / "l.duckdb", read_only=True)


def test_read_only_ledger_sees_committed_rows(tmp_path: Path) -> None:
    """An analyst's read-only handle reads what the writer committed."""
    path = tmp_path / "l.duckdb"
    with Ledger.open(path) as led:
        to_fetching(led)
    with Ledger.open(path, read_only=True) as ro:
        op = ro.by_call_node("n1")
        assert op is not None
        assert op.state is S.FETCHING_RESULT


# ------------------------------------------------------------------------------------- records


def test_record_round_trips() -> None:
    """The flat toolOperation.v1 record rebuilds the same operation."""
    op = replace(make_operation("n1"), task_id=TaskId("t"), server_status=ServerStatus.WORKING)
    assert operation_from_record(operation_to_record(op)) == op


def test_record_missing_fields_names_them() -> None:
    """A record without required fields is refused, every missing field named."""
    record = operation_to_record(make_operation("n1"))
    del record["request_digest"]
    del record["epoch"]
    with pytest.raises(InvalidRecord, match="request_digest, epoch"):
        operation_from_record(record)


def test_record_of_another_schema_version_is_refused() -> None:
    """A record carries its schema version and a foreign one is refused."""
    record = operation_to_record(make_operation("n1"))
    record["schema_version"] = "toolOperation.v9"
    with pytest.raises(InvalidRecord, match="v9"):
        operation_from_record(record)


# ------------------------------------------------------------------------------ creation and CAS


def test_asking_again_for_a_call_node_returns_its_operation(ledger: Ledger) -> None:
    """A call node has one operation and one key; asking again returns it."""
    first, created = ledger.create_operation(make_operation("n1"), {"report": "n1"})
    again, created_again = ledger.create_operation(
        replace(make_operation("n1"), operation_id="op-other"),  # type: ignore[arg-type]
        {"report": "n1"},
    )
    assert created
    assert not created_again
    assert again.operation_id == first.operation_id
    assert again.idempotency_key == first.idempotency_key
    assert ledger.count("operations") == 1


def test_same_call_node_with_another_request_is_refused(ledger: Ledger) -> None:
    """A call node cannot silently switch to a different request."""
    ledger.create_operation(make_operation("n1"), {})
    other = replace(make_operation("n1", arguments={"report": "else"}), operation_id="op-x")  # type: ignore[arg-type]
    with pytest.raises(DuplicateOperation, match="different request"):
        ledger.create_operation(other, {})


def test_concurrent_creation_of_one_call_node_yields_one_operation(tmp_path: Path) -> None:
    """Two threads racing to create the same call node end with one row, enforced by the database."""
    ledger = Ledger.open(tmp_path / "l.duckdb")
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def create(i: int) -> None:
        barrier.wait(timeout=10)
        op = replace(make_operation("race"), operation_id=f"op-{i}")  # type: ignore[arg-type]
        results.append(ledger.create_operation(op, {"report": "race"})[1])

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results.count(True) == 1
    assert ledger.count("operations") == 1


class ReadCountingLedger(Ledger):
    """A real DuckDB ledger that records each read of operations by call node and each write transaction."""

    reads: list[list[str]]
    transactions: int

    def by_call_nodes(self, call_node_ids: Sequence[str]) -> dict[str, Operation]:
        self.reads.append(list(call_node_ids))
        return super().by_call_nodes(call_node_ids)

    def by_call_node(self, call_node_id: str) -> Operation | None:
        self.reads.append([call_node_id])
        return super().by_call_node(call_node_id)

    def _insert_fresh(
        self, fresh: Sequence[tuple[Operation, Json]], arms: Sequence[dict[str, object]] = ()
    ) -> set[str] | None:
        self.transactions += 1
        return super()._insert_fresh(fresh, arms)


def counting(path: Path) -> ReadCountingLedger:
    ledger = ReadCountingLedger.open(path)
    ledger.reads, ledger.transactions = [], 0
    return ledger


def test_creating_new_call_nodes_reads_nothing_before_the_one_transaction(tmp_path: Path) -> None:
    """A batch of new call nodes is one insert transaction and no read: the database's uniqueness is the
    lookup (the durable SUBMITTING records of a burst of submissions cost their commit alone)."""
    with counting(tmp_path / "l.duckdb") as ledger:
        out = ledger.create_many([(make_operation(f"new-{i}"), {"i": i}) for i in range(3)])  # type: ignore[arg-type]
        assert [made for _, made in out] == [True, True, True]
        assert ledger.reads == []
        assert ledger.transactions == 1
        assert ledger.count("operations") == 3


def test_a_batch_with_existing_call_nodes_creates_the_rest_in_one_transaction_and_reads_only_those(
    tmp_path: Path,
) -> None:
    """Existing call nodes in a batch are skipped by the insert and read back in one query, the new ones
    created in the same single transaction; a different request under an existing call node is refused."""
    with counting(tmp_path / "l.duckdb") as ledger:
        old, _ = ledger.create_operation(make_operation("old"), {"report": "old"})
        ledger.reads.clear()
        ledger.transactions = 0
        again = replace(make_operation("old"), operation_id="op-old-again")  # type: ignore[arg-type]
        out = ledger.create_many(
            [(again, {"report": "old"}), (make_operation("fresh"), {"report": "fresh"})]  # type: ignore[arg-type]
        )
        assert [(op.operation_id, made) for op, made in out] == [
            (old.operation_id, False),
            ("op-fresh", True),
        ]
        assert ledger.reads == [["old"]]
        assert ledger.transactions == 1
        other = replace(make_operation("old", arguments={"report": "else"}), operation_id="op-x")  # type: ignore[arg-type]
        with pytest.raises(DuplicateOperation, match="different request"):
            ledger.create_many([(other, {"report": "else"})])
        assert ledger.count("operations") == 2
        assert ledger.count("transitions") == 2  # one Created line each


def test_stale_write_fails_cleanly_and_changes_nothing(ledger: Ledger) -> None:
    """A transition built on an old read is refused; the row and the log stay as they were."""
    op, _ = ledger.create_operation(make_operation("n1"), {})
    moved = advance(ledger, op, Submitted(TaskId("t1"), E))
    log_before = ledger.count("transitions")
    with pytest.raises(StaleWrite):
        ledger.apply(step(op, Submitted(TaskId("t2"), E), NOW))
    assert ledger.get(op.operation_id) == moved
    assert ledger.count("transitions") == log_before


def test_stale_cancel_generation_fails(ledger: Ledger) -> None:
    """A cancel built on a stale generation never lands."""
    op, _ = ledger.create_operation(make_operation("n1"), {})
    op = advance(ledger, op, Submitted(TaskId("t1"), E))
    advance(ledger, op, CancelRequested(1, "a", "r"))
    with pytest.raises(StaleWrite):
        ledger.apply(step(op, CancelRequested(1, "b", "r"), NOW))
    current = ledger.get(op.operation_id)
    assert current is not None
    assert current.cancel_generation == 1


def test_rejected_transitions_are_recorded_with_their_reason(ledger: Ledger) -> None:
    """An illegal event is logged as rejected and leaves the operation as it was."""
    op, _ = ledger.create_operation(make_operation("n1"), {})
    t = step(op, FetchStarted(E), NOW)
    assert not t.accepted
    ledger.apply(t)
    rows = ledger.transitions(op.operation_id)
    assert rows[-1]["accepted"] is False
    assert "nothing terminal" in str(rows[-1]["cause"])
    assert ledger.get(op.operation_id) == op


def test_task_id_reused_for_another_request_is_refused(ledger: Ledger) -> None:
    """One server task id binds to one operation; a reuse is refused by the database."""
    a, _ = ledger.create_operation(make_operation("a"), {})
    b, _ = ledger.create_operation(make_operation("b"), {})
    advance(ledger, a, Submitted(TaskId("same"), E))
    with pytest.raises(DuplicateOperation, match="same"):
        ledger.apply(step(b, Submitted(TaskId("same"), E), NOW))
    current = ledger.get(b.operation_id)
    assert current is not None
    assert current.state is S.SUBMITTING


# ---------------------------------------------------------------------------------- group commit


def test_group_commit_applies_many_and_refuses_only_the_stale(ledger: Ledger) -> None:
    """One transaction for many operations; a stale one is refused alone."""
    ops = [ledger.create_operation(make_operation(f"g{i}"), {})[0] for i in range(50)]
    batch = [step(op, Submitted(TaskId(f"t{i}"), E), NOW) for i, op in enumerate(ops)]
    stale = replace(batch[7], before=replace(batch[7].before, row_version=5))
    batch[7] = stale
    outcomes = ledger.apply_many(batch)
    assert sum(o.error is None for o in outcomes) == 49
    assert isinstance(outcomes[7].error, StaleWrite)
    assert ledger.get(ops[7].operation_id) == ops[7]
    assert ledger.get(ops[8].operation_id) == batch[8].after


def test_group_commit_chains_transitions_of_one_operation(ledger: Ledger) -> None:
    """Several transitions of one operation in one batch land in order."""
    op, _ = ledger.create_operation(make_operation("c"), {})
    t1 = step(op, Submitted(TaskId("t"), E), NOW)
    t2 = step(t1.after, StatusObserved(TaskId("t"), ServerStatus.WORKING, E), NOW)
    t3 = step(t2.after, StatusObserved(TaskId("t"), ServerStatus.COMPLETED, E), NOW)
    assert all(o.error is None for o in ledger.apply_many([t1, t2, t3]))
    assert ledger.get(op.operation_id) == t3.after
    assert [r["to_state"] for r in ledger.transitions(op.operation_id)][-2:] == [
        "WORKING",
        "TERMINAL_OBSERVED",
    ]


def test_apply_refuses_to_write_a_receipt_state(ledger: Ledger) -> None:
    """Only accept_terminal can move an operation into a receipt state."""
    op = to_fetching(ledger)
    with pytest.raises(LedgerError, match="accept_terminal"):
        ledger.apply(verified(op))


# ------------------------------------------------------------------------------- acceptTerminal


def test_accept_terminal_writes_one_receipt_and_one_ready_outbox_entry(ledger: Ledger) -> None:
    """The acceptance transaction writes the receipt, the result and one ready outbox row."""
    op = to_fetching(ledger)
    receipt = ledger.accept_terminal(verified(op), PAYLOAD)
    assert receipt.result_digest == digest_of(PAYLOAD)
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 1
    assert ledger.result_payload(op.operation_id) == PAYLOAD
    stored = ledger.get(op.operation_id)
    assert stored is not None
    assert stored.state is S.ACCEPTED


def test_second_acceptance_is_refused(ledger: Ledger) -> None:
    """The same acceptance twice writes nothing the second time."""
    op = to_fetching(ledger)
    t = verified(op)
    ledger.accept_terminal(t, PAYLOAD)
    with pytest.raises((StaleWrite, ReceiptConflict)):
        ledger.accept_terminal(t, PAYLOAD)
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 1


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("call_node_id", {"call_node_id": "someone-else"}),
        ("request_digest", {"request_digest": "sha256:other"}),
        ("task_id", {"task_id": "task-other"}),
        ("tool_version", {"tool_version": "9.9.9"}),
        ("epoch", {"epoch": 7}),
        ("cancel_generation", {"cancel_generation": 3}),
        ("status", {"status": ServerStatus.FAILED}),
        ("result_digest", {"result_digest": "sha256:tampered"}),
    ],
)
def test_accept_terminal_refuses_any_mismatch_naming_the_field(
    ledger: Ledger, field: str, change: dict[str, object]
) -> None:
    """Each matched field, if it differs, refuses the acceptance with that field named and writes nothing."""
    op = to_fetching(ledger)
    t = verified(op)
    (effect,) = t.effects
    assert isinstance(effect, AcceptTerminal)
    forged = replace(t, effects=(AcceptTerminal(replace(effect.receipt, **change)),))  # type: ignore[arg-type]
    with pytest.raises(ReceiptConflict, match=field):
        ledger.accept_terminal(forged, PAYLOAD)
    assert ledger.count("receipts") == 0
    assert ledger.count("outbox") == 0
    assert ledger.get(op.operation_id) == op


def test_a_completed_receipt_for_an_operation_not_fetching_its_result_is_refused_naming_the_state(
    ledger: Ledger,
) -> None:
    """A completed acceptance from TERMINAL_OBSERVED (the fetch never started) is refused: state named, nothing written."""
    op, _ = ledger.create_operation(make_operation("n1"), {"report": "n1"})
    op = advance(ledger, op, Submitted(TaskId("task-n1"), E))
    op = advance(ledger, op, StatusObserved(TaskId("task-n1"), ServerStatus.COMPLETED, E))
    assert op.state is S.TERMINAL_OBSERVED
    # Every other field agrees with the row (same row version, status completed, the payload's
    # digest): only the state the ledger holds tells this receipt was never fetched and verified.
    forged = verified(replace(op, state=S.FETCHING_RESULT))
    with pytest.raises(ReceiptConflict, match="state"):
        ledger.accept_terminal(forged, PAYLOAD)
    assert ledger.count("receipts") == 0
    assert ledger.count("outbox") == 0
    assert ledger.get(op.operation_id) == op


def test_result_digest_is_checked_against_the_payload(ledger: Ledger) -> None:
    """A payload that does not hash to the verified digest is refused."""
    op = to_fetching(ledger)
    with pytest.raises(ReceiptConflict, match="result_digest"):
        ledger.accept_terminal(verified(op), {"content": [], "isError": True})


def test_acceptance_under_a_raised_epoch_is_refused(ledger: Ledger) -> None:
    """A result accepted by an executor whose epoch was raised meanwhile is fenced."""
    op = to_fetching(ledger)
    t = verified(op)
    advance(ledger, op, EpochRaised(Epoch(2), "rollback"))
    with pytest.raises((StaleWrite, ReceiptConflict)):
        ledger.accept_terminal(t, PAYLOAD)
    assert ledger.count("receipts") == 0


def test_cancelled_is_accepted_on_the_cancel_response_without_a_payload(ledger: Ledger) -> None:
    """A confirmed cancel writes a cancelled receipt with no success payload in the outbox."""
    op, _ = ledger.create_operation(make_operation("c"), {})
    op = advance(ledger, op, Submitted(TaskId("t"), E))
    op = advance(ledger, op, CancelRequested(1, "a", "r"))
    t = step(op, CancelConfirmed(TaskId("t"), 1, E), NOW)
    receipt = ledger.accept_terminal(t, None)
    assert receipt.status is ServerStatus.CANCELLED
    assert receipt.cancel_evidence
    ledger.attach_audit_result(t.after, "result-after-cancel", PAYLOAD, NOW + timedelta(seconds=1))
    assert ledger.count("receipt_audit") == 1
    assert ledger.result_payload(op.operation_id) is None
    rows = ledger._con.execute("SELECT payload, terminal_status FROM outbox").fetchall()
    assert rows == [(None, "cancelled")]


def test_shadow_receipt_never_reaches_the_outbox(ledger: Ledger) -> None:
    """A shadow operation gets a receipt for comparison, and no outbox entry."""
    op = to_fetching(ledger, "s1", role=Role.SHADOW)
    ledger.accept_terminal(verified(op), PAYLOAD)
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 0


def test_database_refuses_a_second_receipt_or_outbox_row(ledger: Ledger) -> None:
    """Uniqueness lives in the database: raw inserts of a second receipt or outbox row fail."""
    op = to_fetching(ledger)
    ledger.accept_terminal(verified(op), PAYLOAD)
    con = ledger._con
    with pytest.raises(duckdb_client.ConstraintException):
        con.execute("INSERT INTO receipts SELECT * FROM receipts")
    with pytest.raises(duckdb_client.ConstraintException):
        con.execute("INSERT INTO outbox SELECT * FROM outbox")


def test_concurrent_acceptances_write_exactly_one_receipt(tmp_path: Path) -> None:
    """Many threads accepting the same terminal at once: one receipt, one outbox entry."""
    ledger = Ledger.open(tmp_path / "l.duckdb")
    op = to_fetching(ledger)
    t = verified(op)
    wins: list[str] = []
    losses: list[str] = []
    barrier = threading.Barrier(6)

    def accept() -> None:
        barrier.wait(timeout=10)
        try:
            ledger.accept_terminal(t, PAYLOAD)
            wins.append("ok")
        except (LedgerError, duckdb_client.Error) as exc:
            losses.append(type(exc).__name__)

    threads = [threading.Thread(target=accept) for _ in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert len(wins) == 1, (wins, losses)
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 1


# ------------------------------------------------------------------------ stateful, with the ledger


class LedgerAndMachine(RuleBasedStateMachine):
    """Random events through step and the real ledger: the ledger never holds two receipts."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger.open(":memory:")
        self.op, _ = self.ledger.create_operation(make_operation("stateful"), {})
        self.task = TaskId("t")

    def feed(self, event: Event) -> None:
        t = step(self.op, event, NOW)
        if any(isinstance(e, AcceptTerminal) for e in t.effects):
            self.ledger.accept_terminal(t, PAYLOAD if t.after.state is S.ACCEPTED else None)
        else:
            self.ledger.apply(t)
        self.op = t.after

    @rule()
    def submitted(self) -> None:
        self.feed(Submitted(self.task, E))

    @rule(status=st.sampled_from(list(ServerStatus)), key=st.sampled_from([None, "k1", "k2"]))
    def status(self, status: ServerStatus, key: str | None) -> None:
        self.feed(StatusObserved(self.task, status, E, input_request_key=key))

    @rule()
    def cancel(self) -> None:
        self.feed(CancelRequested(self.op.cancel_generation + 1, "a", "r"))

    @rule()
    def cancel_confirmed(self) -> None:
        self.feed(CancelConfirmed(self.task, self.op.cancel_generation, E))

    @rule()
    def fetch(self) -> None:
        self.feed(FetchStarted(E))

    @rule(status=st.sampled_from([ServerStatus.COMPLETED, ServerStatus.FAILED]))
    def verified(self, status: ServerStatus) -> None:
        self.feed(ResultVerified(self.task, status, digest_of(PAYLOAD), E))

    @invariant()
    def one_receipt_at_most_and_ledger_agrees(self) -> None:
        assert self.ledger.count("receipts") <= 1
        assert self.ledger.count("outbox") <= 1
        assert self.ledger.get(self.op.operation_id) == self.op

    def teardown(self) -> None:
        self.ledger.close()


LedgerAndMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_ledger_and_machine_never_hold_two_receipts = LedgerAndMachine.TestCase


def test_batched_acceptance_writes_each_matching_receipt_and_refuses_the_rest_alone(ledger: Ledger) -> None:
    """accept_many: one transaction; a stale or mismatching acceptance is refused by name, the others commit."""
    good = [to_fetching(ledger, f"ok{i}") for i in range(3)]
    stale_op = to_fetching(ledger, "stale")
    stale = verified(stale_op)
    moved = step(stale_op, EpochRaised(Epoch(2), "ops"), NOW)
    assert moved.accepted
    assert moved.after.row_version > stale_op.row_version
    ledger.apply(moved)  # the row moves on under the acceptance
    wrong_op = to_fetching(ledger, "wrong")
    wrong = verified(wrong_op)
    wrong_payload: dict[str, object] = {"content": [{"type": "text", "text": "other"}], "isError": False}
    shadow_op = to_fetching(ledger, "shadow", role=Role.SHADOW)
    items = [(verified(op), PAYLOAD) for op in good] + [
        (stale, PAYLOAD),
        (wrong, wrong_payload),
        (verified(shadow_op), PAYLOAD),
    ]
    outcomes = ledger.accept_many(items)
    assert [o.error is None for o in outcomes] == [True, True, True, False, False, True]
    assert isinstance(outcomes[3].error, StaleWrite)
    assert isinstance(outcomes[4].error, ReceiptConflict)
    assert outcomes[4].error.field == "result_digest"
    assert ledger.count("receipts") == 4  # three primaries and the shadow
    assert ledger.count("outbox") == 3  # never the shadow
    for op in good:
        stored = ledger.get(op.operation_id)
        assert stored is not None
        assert stored.state is S.ACCEPTED
        assert ledger.result_payload(op.operation_id) == PAYLOAD
    assert ledger.receipt(wrong_op.call_node_id) is None
    assert len(ledger.transitions(good[0].operation_id)) == 5


def test_a_group_that_accepts_a_held_outcome_writes_no_held_row_and_a_refused_one_keeps_it(
    ledger: Ledger,
) -> None:
    """An inline outcome held and accepted in one group needs no held row (its receipt and result
    are written beside it); an outcome whose acceptance the group refuses is still held."""
    ok, refused = to_fetching(ledger, "held-ok"), to_fetching(ledger, "held-refused")
    wrong: dict[str, object] = {"content": [{"type": "text", "text": "other"}], "isError": False}

    def held(op: Operation) -> tuple[str, HeldOutcome]:
        return op.operation_id, HeldOutcome("completed", digest_of(PAYLOAD), PAYLOAD, op.task_id, None, NOW)

    outcome = ledger.commit_group(
        WriteGroup(
            acceptances=[(verified(ok), PAYLOAD), (verified(refused), wrong)], held=[held(ok), held(refused)]
        )
    )
    assert [o.error is None for o in outcome.acceptances] == [True, False]
    assert ledger.result_payload(ok.operation_id) == PAYLOAD
    assert ledger.held_outcome(ok.operation_id) is None
    assert ledger.held_outcome(refused.operation_id) == held(refused)[1]


def counted_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The first words of each statement the DuckDB ledger runs over an Arrow batch, as they run."""
    statements: list[str] = []
    over, records_over = duckdb_ledger._over, duckdb_ledger._records_over

    def counting_over(tx: object, query: str, arrow_batch: object) -> list[tuple[object, ...]]:
        statements.append(" ".join(query.split()[:3]))
        return over(tx, query, arrow_batch)  # type: ignore[arg-type]

    def counting_records(tx: object, query: str, arrow_batch: object) -> list[dict[str, object]]:
        statements.append(" ".join(query.split()[:3]))
        return records_over(tx, query, arrow_batch)  # type: ignore[arg-type]

    monkeypatch.setattr(duckdb_ledger, "_over", counting_over)
    monkeypatch.setattr(duckdb_ledger, "_records_over", counting_records)
    return statements


def test_a_group_commit_writes_its_acceptances_with_its_transitions_unread(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's acceptances (one after the group's own transitions of its operation, one alone) are
    matched against their transitions' ``before``, which the compare-and-swap proves current, and
    written with the group's transitions: no row is read, one UPDATE and one log INSERT for all,
    the log in order, both receipts written."""
    working = advance(
        ledger, ledger.create_operation(make_operation("w"), {})[0], Submitted(TaskId("t-w"), E)
    )
    seen = step(working, StatusObserved(TaskId("t-w"), ServerStatus.COMPLETED, E), NOW)
    fetching = step(seen.after, FetchStarted(E), NOW)
    alone = to_fetching(ledger, "alone")
    statements = counted_statements(monkeypatch)
    outcome = ledger.commit_group(
        WriteGroup(
            transitions=[seen, fetching],
            acceptances=[(verified(fetching.after), PAYLOAD), (verified(alone), PAYLOAD)],
        )
    )
    assert [o.error for o in [*outcome.transitions, *outcome.acceptances]] == [None] * 4
    assert [q for q in statements if q.startswith(("SELECT", "UPDATE", "INSERT INTO transitions"))] == [
        "UPDATE op_state SET",
        "INSERT INTO transitions",
    ]
    assert (ledger.count("receipts"), ledger.count("outbox")) == (2, 2)
    log = [str(r["to_state"]) for r in ledger.transitions(working.operation_id)]
    assert log[-3:] == ["TERMINAL_OBSERVED", "FETCHING_RESULT", "ACCEPTED"]
    for op in (working, alone):
        stored = ledger.get(op.operation_id)
        assert stored is not None
        assert stored.state is S.ACCEPTED


def test_a_group_commit_refuses_an_acceptance_whose_row_moved_after_reading_it(
    ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acceptance computed from a row that moved since (a rollback adopted it) is refused as stale,
    as one matched against the row read: the compare-and-swap's shortfall sends the group to its
    checked retry, which reads the rows; the group's other acceptance commits."""
    moved, fine = to_fetching(ledger, "moved"), to_fetching(ledger, "fine")
    late = verified(moved)
    advance(ledger, moved, EpochRaised(Epoch(2), "rollback"))
    statements = counted_statements(monkeypatch)
    outcome = ledger.commit_group(WriteGroup(acceptances=[(late, PAYLOAD), (verified(fine), PAYLOAD)]))
    assert isinstance(outcome.acceptances[0].error, StaleWrite)
    assert outcome.acceptances[1].error is None
    assert statements.count("SELECT * FROM") == 1
    assert ledger.receipt(moved.call_node_id) is None
    assert (ledger.count("receipts"), ledger.count("outbox")) == (1, 1)


def test_batched_acceptance_refuses_an_operation_accepted_twice_in_one_batch(ledger: Ledger) -> None:
    """The same acceptance twice in one batch writes one receipt; the repeat is refused as stale."""
    op = to_fetching(ledger)
    t = verified(op)
    outcomes = ledger.accept_many([(t, PAYLOAD), (t, PAYLOAD)])
    assert outcomes[0].error is None
    assert isinstance(outcomes[1].error, StaleWrite)
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 1


def test_batched_acceptance_of_an_already_accepted_operation_writes_nothing(ledger: Ledger) -> None:
    """An acceptance already committed on its own is refused inside a later batch; the batch's others commit."""
    first = to_fetching(ledger, "first")
    ledger.accept_terminal(verified(first), PAYLOAD)
    second = to_fetching(ledger, "second")
    outcomes = ledger.accept_many([(verified(first), PAYLOAD), (verified(second), PAYLOAD)])
    assert isinstance(outcomes[0].error, StaleWrite | ReceiptConflict)
    assert outcomes[1].error is None
    assert ledger.count("receipts") == 2
    assert ledger.count("outbox") == 2


def test_batched_acceptance_refuses_a_transition_that_is_not_an_acceptance(ledger: Ledger) -> None:
    """Only acceptances go through accept_many; anything else is refused before a transaction starts."""
    op, _ = ledger.create_operation(make_operation("n1"), {"report": "n1"})
    with pytest.raises(LedgerError, match="AcceptTerminal"):
        ledger.accept_many([(step(op, Submitted(TaskId("t"), E), NOW), None)])
    assert ledger.count("receipts") == 0
