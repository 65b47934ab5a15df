"""The ledger contract, held on both backends: DuckDB (``Ledger``) and PostgreSQL (``PgLedger``), via ``open_ledger``.

The scenarios are tests/engine/ledger/test_ledger.py's (the source of truth for expected behaviour), plus
group commit with mixed outcomes, the outbox, polls, approvals, reconciliation, the rollout chain,
and a side-by-side check that the same history reads the same on both. Leases are PostgreSQL's
alone (DuckDB has one writing process): see the ``lease`` tests at the end.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path

import pytest
from ledger_kit import (
    NOW,
    PAYLOAD,
    E,
    RawError,
    advance,
    at_once,
    close_extra,
    created,
    handles,
    raw,
    rollout_event,
    to_fetching,
    verified,
)

from engine.clock import monotonic_seconds
from engine.errors import (
    DuplicateOperation,
    InvalidRecord,
    LeaseLost,
    LedgerError,
    LedgerUnavailable,
    ReceiptConflict,
    SchemaTooNew,
    StaleWrite,
)
from engine.ledger import duckdb as duck_ledger
from engine.ledger import is_postgres, open_ledger
from engine.ledger import postgres as pg_ledger
from engine.ledger.duckdb import Ledger
from engine.ledger.port import (
    ApprovalRequest,
    BatchOutcome,
    ExplorerRun,
    Fence,
    GroupOutcome,
    HeldOutcome,
    Lease,
    LedgerPort,
    PollRecord,
    WriteGroup,
    refusals,
)
from engine.ledger.postgres import LEASE_COLUMNS, PgLedger
from engine.machine import step
from engine.model import (
    AcceptTerminal,
    CancelConfirmed,
    CancelRequested,
    Epoch,
    EpochRaised,
    FetchStarted,
    GateRecord,
    InputAnswered,
    LocalState,
    NotFound,
    Operation,
    OperationId,
    Protocol,
    Reconciled,
    Role,
    ServerStatus,
    StatusObserved,
    Submitted,
    TaskId,
    digest_of,
)
from engine.revision import running_revision
from engine.runtime.report import creation_report, operation_report
from engine.testing import make_operation
from rollout.audit import GENESIS
from rollout.controller import verify_ledger
from rollout.plan import RolloutState, Stage

S = LocalState


def supported(target: str) -> int:
    return pg_ledger.SUPPORTED_SCHEMA if is_postgres(target) else duck_ledger.SUPPORTED_SCHEMA


# ------------------------------------------------------------------------------------- migrations


def test_migrations_are_recorded_once_and_reopen_cleanly(target: str) -> None:
    """Opening twice applies each migration once, and the second open finds the schema current."""
    open_ledger(target).close()
    with open_ledger(target) as led:
        assert led.schema_version() == supported(target)
        assert led.count("operations") == 0
        (row,) = raw(led, "SELECT count(*), count(DISTINCT version) FROM schema_migrations")
        assert row == (supported(target), supported(target))


def test_ledger_from_a_newer_schema_is_refused(target: str) -> None:
    """A ledger migrated by a newer Finality is refused with both versions named."""
    with open_ledger(target) as led:
        raw(led, "INSERT INTO schema_migrations VALUES (999, 'future', now())")
    with pytest.raises(SchemaTooNew, match="999"):
        open_ledger(target)


def test_read_only_handle_sees_committed_rows_and_writes_nothing(target: str) -> None:
    """An analyst's read-only handle reads what the writer committed and cannot write."""
    with open_ledger(target) as led:
        to_fetching(led)
    with open_ledger(target, read_only=True) as ro:
        op = ro.by_call_node("n1")
        assert op is not None
        assert op.state is S.FETCHING_RESULT
        started = monotonic_seconds()
        with pytest.raises(LedgerUnavailable, match="read-only"):
            ro.create_operation(make_operation("n2"), {})
        assert monotonic_seconds() - started < 1.0  # said at once, not after waiting for a creator
        assert ro.count("operations") == 1


def test_both_backends_have_the_same_tables_and_columns(tmp_path: Path, pg_url: str) -> None:
    """Every table and view has the same columns in the same order; PostgreSQL's op_state adds only the lease columns."""
    with open_ledger(str(tmp_path / "l.duckdb")) as duck, open_ledger(pg_url) as pg:
        duck_columns = duck.table_columns()
        pg_columns = pg.table_columns()
    assert set(pg_columns) == set(duck_columns)
    for table, columns in duck_columns.items():
        extra = list(LEASE_COLUMNS) if table == "op_state" else []
        assert pg_columns[table] == columns + extra, table


# ------------------------------------------------------------------------------ creation and CAS


def test_asking_again_for_a_call_node_returns_its_operation(ledger: LedgerPort) -> None:
    """A call node has one operation and one key; asking again returns it."""
    first, was_created = ledger.create_operation(make_operation("n1"), {"report": "n1"})
    again, created_again = ledger.create_operation(
        replace(make_operation("n1"), operation_id="op-other"),  # type: ignore[arg-type]
        {"report": "n1"},
    )
    assert was_created
    assert not created_again
    assert again == first
    assert ledger.count("operations") == 1
    assert ledger.arguments(first.operation_id) == {"report": "n1"}


def test_same_call_node_with_another_request_is_refused(ledger: LedgerPort) -> None:
    """A call node cannot silently switch to a different request."""
    ledger.create_operation(make_operation("n1"), {})
    other = replace(make_operation("n1", arguments={"report": "else"}), operation_id="op-x")  # type: ignore[arg-type]
    with pytest.raises(DuplicateOperation, match="different request"):
        ledger.create_operation(other, {})
    with pytest.raises(DuplicateOperation, match="different request"):
        ledger.create_many([(other, {})])


def test_a_new_operation_must_start_in_submitting(ledger: LedgerPort) -> None:
    """Only a fresh SUBMITTING record at row version 0 can be created."""
    with pytest.raises(InvalidRecord):
        ledger.create_operation(replace(make_operation("n1"), state=S.WORKING), {})
    with pytest.raises(InvalidRecord):
        ledger.create_many([(replace(make_operation("n2"), row_version=3), {})])
    assert ledger.count("operations") == 0


def test_create_many_returns_existing_operations_and_creates_the_rest(ledger: LedgerPort) -> None:
    """One group commit: call nodes that have an operation get it back, the others are created once."""
    existing = created(ledger, "old")
    items = [(make_operation(n), {"report": n}) for n in ("old", "new-1", "new-2")]
    out = ledger.create_many(items)  # type: ignore[arg-type]
    assert [(op.operation_id, made) for op, made in out] == [
        (existing.operation_id, False),
        ("op-new-1", True),
        ("op-new-2", True),
    ]
    again = ledger.create_many(items)  # type: ignore[arg-type]
    assert [made for _, made in again] == [False, False, False]
    assert ledger.count("operations") == 3
    assert ledger.count("transitions") == 3  # one Created line each, never two


def _arm(op_id: str, node: str) -> dict[str, object]:
    return {
        "operation_id": op_id,
        "call_node_id": node,
        "tool_name": "generate_report",
        "role": "primary",
        "arm": "control",
        "stage": "off",
        "bucket": 1,
        "canary_bp": 0,
        "server_name": "old",
        "rerouted_from": None,
        "primary_operation_id": None,
        "rollout_seq": 0,
        "assigned_at": NOW,
    }


@pytest.mark.not_in_memory("rollout assignments are the rollout's records; a simulation writes none")
def test_create_many_writes_the_arms_of_the_operations_it_creates_and_no_other(ledger: LedgerPort) -> None:
    """The arm of each operation a group creates is written with it; an existing one's arm is not."""
    existing = created(ledger, "old")
    items = [(make_operation(n), {"report": n}) for n in ("old", "new-1", "new-2")]
    arms = [_arm(op.operation_id, op.call_node_id) for op, _ in items]
    out = ledger.create_many(items, arms=arms)  # type: ignore[arg-type]
    assert [made for _, made in out] == [False, True, True]
    assert sorted(str(a["call_node_id"]) for a in ledger.assignments()) == ["new-1", "new-2"]
    # A fresh operation id for the existing call node: the database's uniqueness finds the one it holds.
    retry = replace(make_operation("old"), operation_id=OperationId("op-old-again"))
    more = [(retry, {"report": "old"}), (make_operation("new-3"), {"report": "new-3"})]
    again = ledger.create_many(
        more,  # type: ignore[arg-type]
        arms=[_arm(op.operation_id, op.call_node_id) for op, _ in more],
    )
    assert [(op.operation_id, made) for op, made in again] == [
        (existing.operation_id, False),
        ("op-new-3", True),
    ]
    assert sorted(str(a["call_node_id"]) for a in ledger.assignments()) == ["new-1", "new-2", "new-3"]
    assert ledger.count("operations") == 4


def test_by_call_nodes_reads_the_operations_of_many_call_nodes_at_once(ledger: LedgerPort) -> None:
    """One read answers many call nodes: each one that has an operation, by call node; the rest are absent."""
    first, second = created(ledger, "first"), created(ledger, "second")
    found = ledger.by_call_nodes(["second", "none", "first", "second"])
    assert found == {"first": first, "second": second}
    assert ledger.by_call_nodes([]) == {}


def test_the_creation_report_is_the_report_the_ledger_gives_of_a_new_operation(ledger: LedgerPort) -> None:
    """Before its first write, an operation's report built without a read equals the one read back."""
    op, _ = ledger.create_operation(make_operation("fresh"), {"report": "fresh"})
    assert creation_report(op) == operation_report(ledger, "fresh")
    moved = ledger.apply(step(op, Submitted(TaskId("t-fresh"), Epoch(1)), op.created_at))
    with pytest.raises(ValueError, match="read its report"):
        creation_report(moved)


def test_create_many_with_a_call_node_twice_creates_it_once(ledger: LedgerPort) -> None:
    """The same call node twice in one batch: the second gets the first's operation."""
    out = ledger.create_many([(make_operation("twice"), {"report": "twice"})] * 2)
    assert [made for _, made in out] == [True, False]
    assert ledger.count("operations") == 1


def test_concurrent_creation_of_one_call_node_yields_one_operation(
    target: str, ledger: Ledger | PgLedger
) -> None:
    """Eight writers (separate connections on PostgreSQL) racing to create one call node end with one row."""
    writers = handles(target, ledger, 8)
    try:
        results = at_once(
            [
                (
                    lambda h=h, i=i: h.create_operation(
                        replace(make_operation("race"), operation_id=f"op-{i}"),  # type: ignore[arg-type]
                        {"report": "race"},
                    )
                )
                for i, h in enumerate(writers)
            ]
        )
    finally:
        close_extra(target, writers)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    made = [r for r in results if not isinstance(r, BaseException)]
    assert [c for _, c in made].count(True) == 1
    assert len({op.operation_id for op, _ in made}) == 1
    assert ledger.count("operations") == 1


def test_concurrent_overlapping_create_many_yields_one_operation_per_call_node(
    target: str, ledger: Ledger | PgLedger
) -> None:
    """Four writers group-creating overlapping sets of call nodes (in different orders) end with one row each."""
    writers = handles(target, ledger, 4)
    nodes = [f"n{i:02d}" for i in range(30)]

    def batch(h: LedgerPort, k: int) -> list[tuple[str, bool]]:
        mine = nodes[k * 5 : k * 5 + 15]
        if k % 2:
            mine = list(reversed(mine))
        items = [(replace(make_operation(n), operation_id=f"op-{n}-{k}"), {"report": n}) for n in mine]
        return [(op.operation_id, made) for op, made in h.create_many(items)]  # type: ignore[arg-type]

    try:
        results = at_once([lambda h=h, k=k: batch(h, k) for k, h in enumerate(writers)])
    finally:
        close_extra(target, writers)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert ledger.count("operations") == len(nodes[:30])
    made = [m for r in results if not isinstance(r, BaseException) for _, m in r]
    assert made.count(True) == 30


def test_stale_write_fails_cleanly_and_changes_nothing(ledger: LedgerPort) -> None:
    """A transition built on an old read is refused; the row and the log stay as they were."""
    op = created(ledger, "n1")
    moved = advance(ledger, op, Submitted(TaskId("t1"), E))
    log_before = ledger.count("transitions")
    with pytest.raises(StaleWrite):
        ledger.apply(step(op, Submitted(TaskId("t2"), E), NOW))
    assert ledger.get(op.operation_id) == moved
    assert ledger.count("transitions") == log_before


def test_stale_cancel_generation_fails(ledger: LedgerPort) -> None:
    """A cancel built on a stale generation never lands."""
    op = created(ledger, "n1")
    op = advance(ledger, op, Submitted(TaskId("t1"), E))
    advance(ledger, op, CancelRequested(1, "a", "r"))
    with pytest.raises(StaleWrite):
        ledger.apply(step(op, CancelRequested(1, "b", "r"), NOW))
    current = ledger.get(op.operation_id)
    assert current is not None
    assert current.cancel_generation == 1


def test_a_write_with_the_right_version_but_a_stale_cancel_generation_is_refused(ledger: LedgerPort) -> None:
    """The compare-and-swap covers the cancel generation too, not only the row version."""
    op = created(ledger, "n1")
    op = advance(ledger, op, Submitted(TaskId("t1"), E))
    t = step(op, StatusObserved(TaskId("t1"), ServerStatus.WORKING, E), NOW)
    forged = replace(t, before=replace(t.before, cancel_generation=5))
    with pytest.raises(StaleWrite):
        ledger.apply(forged)
    assert ledger.get(op.operation_id) == op


def test_rejected_transitions_are_recorded_with_their_reason(ledger: LedgerPort) -> None:
    """An illegal event is logged as rejected and leaves the operation as it was."""
    op = created(ledger, "n1")
    t = step(op, FetchStarted(E), NOW)
    assert not t.accepted
    ledger.apply(t)
    rows = ledger.transitions(op.operation_id)
    assert rows[-1]["accepted"] is False
    assert "nothing terminal" in str(rows[-1]["cause"])
    assert ledger.get(op.operation_id) == op


def test_task_id_reused_for_another_request_is_refused(ledger: LedgerPort) -> None:
    """One server task id binds to one operation; a reuse is refused by the database."""
    a = created(ledger, "a")
    b = created(ledger, "b")
    advance(ledger, a, Submitted(TaskId("same"), E))
    with pytest.raises(DuplicateOperation, match="same"):
        ledger.apply(step(b, Submitted(TaskId("same"), E), NOW))
    current = ledger.get(b.operation_id)
    assert current is not None
    assert current.state is S.SUBMITTING


def test_the_database_enforces_one_operation_per_call_node_and_task(ledger: Ledger | PgLedger) -> None:
    """Raw inserts of a second identity for a call node, or a second binding of a task id, fail in the database."""
    a = created(ledger, "a")
    advance(ledger, a, Submitted(TaskId("t"), E))
    with pytest.raises(RawError):
        raw(
            ledger,
            "INSERT INTO op_identity SELECT 'op-z', call_node_id, role, request_digest, tool_name, "
            "tool_version, descriptor_version, side_effects, principal, protocol, adapter_version, server, 'k-z', "
            "arguments, schema_version, created_at FROM op_identity",
        )
    with pytest.raises(RawError):
        raw(ledger, "INSERT INTO task_bindings SELECT server, task_id, 'op-z', bound_at FROM task_bindings")


# ---------------------------------------------------------------------------------- group commit


def test_a_group_of_polls_and_one_submission_binds_only_the_submitted_task(ledger: LedgerPort) -> None:
    """In one group commit, polls bind no task id and the one new task id is bound (a reuse is refused)."""
    polled = [advance(ledger, created(ledger, f"p{i}"), Submitted(TaskId(f"tp{i}"), E)) for i in range(3)]
    fresh = created(ledger, "fresh")
    group = [
        step(op, StatusObserved(op.task_id, ServerStatus.WORKING, E, poll_cursor="c"), NOW)  # type: ignore[arg-type]
        for op in polled
    ]
    group.insert(1, step(fresh, Submitted(TaskId("tfresh"), E), NOW))
    assert all(o.error is None for o in ledger.apply_many(group))
    polls_only = [
        step(t.after, StatusObserved(t.after.task_id, ServerStatus.WORKING, E, poll_cursor="d"), NOW)  # type: ignore[arg-type]
        for t in group
    ]
    assert all(o.error is None for o in ledger.apply_many(polls_only))
    other = created(ledger, "other")
    with pytest.raises(DuplicateOperation, match="tfresh"):
        ledger.apply(step(other, Submitted(TaskId("tfresh"), E), NOW))
    with pytest.raises(DuplicateOperation, match="tp2"):
        ledger.apply(step(other, Submitted(TaskId("tp2"), E), NOW))


def test_a_repeated_status_is_compared_with_the_row_and_writes_no_log_row(ledger: LedgerPort) -> None:
    """A status report step leaves unlogged (``Transition.logged``) is checked like any write, alone
    (apply), in a batch (apply_many) and in a write group: on the row as it is it writes nothing at
    all; once another writer moved the row it is refused; in neither case is a log row written."""
    task = TaskId("t-still")
    op = advance(ledger, created(ledger, "still"), Submitted(task, E))
    op = advance(ledger, op, StatusObserved(task, ServerStatus.WORKING, E))
    again = step(op, StatusObserved(task, ServerStatus.WORKING, E), NOW)
    assert (again.accepted, again.logged, again.after) == (True, False, op)
    other = created(ledger, "other")
    submitted = step(other, Submitted(TaskId("t-other"), E), NOW)
    log = ledger.count("transitions")

    assert ledger.apply(again) == op
    assert [o.error for o in ledger.apply_many([again, submitted])] == [None, None]
    assert ledger.commit_group(WriteGroup(transitions=(again,))).transitions[0].error is None
    assert ledger.count("transitions") == log + 1  # the submission's row alone
    assert ledger.get(op.operation_id) == op

    moved = advance(ledger, op, CancelRequested(1, "bob", "no longer needed"))
    log = ledger.count("transitions")
    with pytest.raises(StaleWrite):
        ledger.apply(again)
    assert isinstance(ledger.apply_many([again])[0].error, StaleWrite)
    assert isinstance(ledger.commit_group(WriteGroup(transitions=(again,))).transitions[0].error, StaleWrite)
    assert ledger.count("transitions") == log
    assert ledger.get(op.operation_id) == moved


def test_group_commit_applies_many_and_refuses_only_the_stale(ledger: LedgerPort) -> None:
    """One transaction for many operations; a stale one is refused alone."""
    ops = [created(ledger, f"g{i}") for i in range(50)]
    batch = [step(op, Submitted(TaskId(f"t{i}"), E), NOW) for i, op in enumerate(ops)]
    batch[7] = replace(batch[7], before=replace(batch[7].before, row_version=5))
    outcomes = ledger.apply_many(batch)
    assert sum(o.error is None for o in outcomes) == 49
    assert isinstance(outcomes[7].error, StaleWrite)
    assert ledger.get(ops[7].operation_id) == ops[7]
    assert ledger.get(ops[8].operation_id) == batch[8].after


def test_group_commit_chains_transitions_of_one_operation(ledger: LedgerPort) -> None:
    """Several transitions of one operation in one batch land in order."""
    op = created(ledger, "c")
    t1 = step(op, Submitted(TaskId("t"), E), NOW)
    t2 = step(t1.after, StatusObserved(TaskId("t"), ServerStatus.WORKING, E), NOW)
    t3 = step(t2.after, StatusObserved(TaskId("t"), ServerStatus.COMPLETED, E), NOW)
    assert all(o.error is None for o in ledger.apply_many([t1, t2, t3]))
    assert ledger.get(op.operation_id) == t3.after
    assert [r["to_state"] for r in ledger.transitions(op.operation_id)][-2:] == [
        "WORKING",
        "TERMINAL_OBSERVED",
    ]


def test_a_chain_begun_on_a_superseded_row_is_refused_whole_though_its_tail_matches_the_row(
    ledger: LedgerPort,
) -> None:
    """A batch's chain of one operation is swapped as one: when its head was read before another write
    moved the row, its tail is refused too, even where the tail's row version is the row's now (an
    old-epoch driver's writes after a rollback's adoption; found by the explorer's group-rollback)."""
    op = created(ledger, "superseded")
    moved = advance(ledger, op, Submitted(TaskId("t-s"), E))  # another writer: row version 1 now
    t1 = step(op, Submitted(TaskId("t-s"), E), NOW)  # read at row version 0
    t2 = step(t1.after, StatusObserved(TaskId("t-s"), ServerStatus.COMPLETED, E), NOW)
    assert t2.before.row_version == moved.row_version
    outcomes = ledger.apply_many([t1, t2])
    assert [type(o.error).__name__ for o in outcomes] == ["StaleWrite", "StaleWrite"]
    assert ledger.get(op.operation_id) == moved


def test_group_commit_with_mixed_outcomes(ledger: LedgerPort) -> None:
    """Fresh, stale, chained, unchained, log-only and stale log-only transitions in one batch: each gets its own verdict."""
    a, b, c, d, e, f = (created(ledger, n) for n in "abcdef")
    f_old = f
    f = advance(ledger, f, Submitted(TaskId("t-f"), E))
    t_a = step(a, Submitted(TaskId("t-a"), E), NOW)
    t_b = replace(step(b, Submitted(TaskId("t-b"), E), NOW), before=replace(b, row_version=9))
    t_c1 = step(c, Submitted(TaskId("t-c"), E), NOW)
    t_c2 = step(t_c1.after, StatusObserved(TaskId("t-c"), ServerStatus.WORKING, E), NOW)
    t_d1 = step(d, Submitted(TaskId("t-d"), E), NOW)
    t_d2 = step(d, Submitted(TaskId("t-d2"), E), NOW)  # built on d's old row: does not chain
    t_e = step(e, FetchStarted(E), NOW)  # rejected: log only
    t_f = step(f_old, FetchStarted(E), NOW)  # rejected, about a row that has moved since
    assert not t_e.accepted
    assert t_e.after == t_e.before
    outcomes = ledger.apply_many([t_a, t_b, t_c1, t_c2, t_d1, t_d2, t_e, t_f])
    verdicts = [type(o.error).__name__ if o.error else "ok" for o in outcomes]
    assert verdicts == ["ok", "StaleWrite", "ok", "ok", "ok", "StaleWrite", "ok", "StaleWrite"]
    assert [(i, type(e).__name__) for i, e in refusals(outcomes)] == [
        (1, "StaleWrite"),
        (5, "StaleWrite"),
        (7, "StaleWrite"),
    ]
    assert list(outcomes) == [outcomes[i] for i in range(len(outcomes))]
    assert outcomes[0] == BatchOutcome(t_a.after, None)
    assert outcomes[1].operation is None
    assert "chain" in str(outcomes[5].error)
    assert ledger.get(a.operation_id) == t_a.after
    assert ledger.get(b.operation_id) == b
    assert ledger.get(c.operation_id) == t_c2.after
    assert ledger.get(d.operation_id) == t_d1.after
    assert ledger.get(e.operation_id) == e
    assert ledger.get(f.operation_id) == f
    assert [r["accepted"] for r in ledger.transitions(e.operation_id)] == [True, False]
    assert (
        len(ledger.transitions(f.operation_id)) == 2
    )  # Created, Submitted: the stale log line was not written
    assert len(ledger.transitions(b.operation_id)) == 1


def test_group_commit_names_a_reused_task_id_and_commits_the_rest(ledger: LedgerPort) -> None:
    """A constraint failure in a batch falls back to one transaction each: the offender alone is refused."""
    a, g, h = (created(ledger, n) for n in "agh")
    advance(ledger, a, Submitted(TaskId("same"), E))
    t_g = step(g, Submitted(TaskId("same"), E), NOW)
    t_h = step(h, Submitted(TaskId("t-h"), E), NOW)
    outcomes = ledger.apply_many([t_g, t_h])
    assert isinstance(outcomes[0].error, DuplicateOperation)
    assert outcomes[1].error is None
    assert ledger.get(g.operation_id) == g
    assert ledger.get(h.operation_id) == t_h.after


def test_apply_refuses_to_write_a_receipt_state(ledger: LedgerPort) -> None:
    """Only accept_terminal can move an operation into a receipt state."""
    op = to_fetching(ledger)
    with pytest.raises(LedgerError, match="accept_terminal"):
        ledger.apply(verified(op))
    with pytest.raises(LedgerError, match="accept_terminal"):
        ledger.apply_many([verified(op)])
    others = [created(ledger, f"r{i}") for i in range(5)]
    group = [step(o, Submitted(TaskId(f"t-r{i}"), E), NOW) for i, o in enumerate(others)]
    with pytest.raises(LedgerError, match="accept_terminal"):
        ledger.apply_many([*group[:2], verified(op), *group[2:]])  # one in a group refuses the group
    assert ledger.get(others[0].operation_id) == others[0]
    assert ledger.count("receipts") == 0


# ------------------------------------------------------------------------------- acceptTerminal


def test_accept_terminal_writes_one_receipt_and_one_ready_outbox_entry(ledger: LedgerPort) -> None:
    """The acceptance transaction writes the receipt, the result and one ready outbox row."""
    op = to_fetching(ledger)
    receipt = ledger.accept_terminal(verified(op), PAYLOAD)
    assert receipt.result_digest == digest_of(PAYLOAD)
    assert ledger.receipt(op.call_node_id) == receipt
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 1
    assert ledger.result_payload(op.operation_id) == PAYLOAD
    row = ledger.receipt_of_operation(op.operation_id)
    assert row is not None
    assert row["role"] == "primary"
    stored = ledger.get(op.operation_id)
    assert stored is not None
    assert stored.state is S.ACCEPTED


def test_second_acceptance_is_refused(ledger: LedgerPort) -> None:
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
        ("operation_id", {"operation_id": "op-nobody"}),
        ("task_id", {"task_id": "task-other"}),
        ("tool_version", {"tool_version": "9.9.9"}),
        ("epoch", {"epoch": 7}),
        ("cancel_generation", {"cancel_generation": 3}),
        ("status", {"status": ServerStatus.FAILED}),
        ("result_digest", {"result_digest": "sha256:tampered"}),
    ],
)
def test_accept_terminal_refuses_any_mismatch_naming_the_field(
    ledger: LedgerPort, field: str, change: dict[str, object]
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
    assert ledger.count("results") == 0
    assert ledger.get(op.operation_id) == op


def test_result_digest_is_checked_against_the_payload(ledger: LedgerPort) -> None:
    """A payload that does not hash to the verified digest is refused."""
    op = to_fetching(ledger)
    with pytest.raises(ReceiptConflict, match="result_digest"):
        ledger.accept_terminal(verified(op), {"content": [], "isError": True})
    assert ledger.count("receipts") == 0


def test_acceptance_on_a_stale_read_is_refused(ledger: LedgerPort) -> None:
    """A transition computed from an old read of the row is refused as stale, and writes nothing."""
    op = to_fetching(ledger)
    t = verified(op)
    stale = replace(t, before=replace(t.before, row_version=op.row_version - 1))
    with pytest.raises(StaleWrite):
        ledger.accept_terminal(stale, PAYLOAD)
    assert ledger.count("receipts") == 0
    assert ledger.get(op.operation_id) == op


def test_acceptance_under_a_raised_epoch_is_refused(ledger: LedgerPort) -> None:
    """A result accepted by an executor whose epoch was raised meanwhile is fenced."""
    op = to_fetching(ledger)
    t = verified(op)
    advance(ledger, op, EpochRaised(Epoch(2), "rollback"))
    with pytest.raises((StaleWrite, ReceiptConflict)):
        ledger.accept_terminal(t, PAYLOAD)
    assert ledger.count("receipts") == 0


def test_cancelled_is_accepted_on_the_cancel_response_without_a_payload(ledger: Ledger | PgLedger) -> None:
    """A confirmed cancel writes a cancelled receipt with no success payload in the outbox."""
    op = created(ledger, "c")
    op = advance(ledger, op, Submitted(TaskId("t"), E))
    op = advance(ledger, op, CancelRequested(1, "a", "r"))
    t = step(op, CancelConfirmed(TaskId("t"), 1, E), NOW)
    receipt = ledger.accept_terminal(t, None)
    assert receipt.status is ServerStatus.CANCELLED
    assert receipt.cancel_evidence
    ledger.attach_audit_result(t.after, "result-after-cancel", PAYLOAD, NOW + timedelta(seconds=1))
    assert ledger.count("receipt_audit") == 1
    assert ledger.result_payload(op.operation_id) is None
    assert raw(ledger, "SELECT payload, terminal_status FROM outbox") == [(None, "cancelled")]


@pytest.mark.not_in_memory(
    "gate inputs are SQL over the ledger's tables (engine.ledger.gate_sql); the explorer checks its invariants on the memory ledger itself"
)
def test_a_cancel_pending_until_a_person_declares_its_lost_operation_absent(ledger: LedgerPort) -> None:
    """A cancel whose task the server lost (UNKNOWN) is pending; once a person declares it absent it is not."""
    op = created(ledger, "lost")
    op = advance(ledger, op, Submitted(TaskId("t-lost"), E))
    op = advance(ledger, op, CancelRequested(1, "a", "closed the tab"))
    op = advance(ledger, op, NotFound(E))
    assert op.state is S.UNKNOWN
    later = NOW + timedelta(seconds=90)
    pending = ledger.gate_inputs(later)["cancel_confirmation"]
    assert (pending["pending"], pending["oldest_pending_s"]) == (1, 90.0)
    op = advance(ledger, op, Reconciled("operator", "the server no longer has the task", None))
    assert op.state is S.NOT_FOUND_SAFE
    # Found by the demo: counted as pending for good, it failed cancel_confirmation for the run.
    assert ledger.gate_inputs(later)["cancel_confirmation"]["pending"] == 0


def test_shadow_receipt_never_reaches_the_outbox(ledger: LedgerPort) -> None:
    """A shadow operation gets a receipt for comparison, and no outbox entry."""
    op = to_fetching(ledger, "s1", role=Role.SHADOW)
    ledger.accept_terminal(verified(op), PAYLOAD)
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 0


def test_database_refuses_a_second_receipt_or_outbox_row(ledger: Ledger | PgLedger) -> None:
    """Uniqueness lives in the database: raw inserts of a second receipt or outbox row fail."""
    op = to_fetching(ledger)
    ledger.accept_terminal(verified(op), PAYLOAD)
    with pytest.raises(RawError):
        raw(ledger, "INSERT INTO receipts SELECT * FROM receipts")
    with pytest.raises(RawError):
        raw(ledger, "INSERT INTO outbox SELECT * FROM outbox")
    assert ledger.count("receipts") == 1


def test_outbox_rows_exist_only_through_acceptance(ledger: Ledger | PgLedger) -> None:
    """No transition writes the outbox; an outbox row without a receipt is refused by the database."""
    ops = [to_fetching(ledger, f"o{i}") for i in range(3)]
    cancelled = advance(
        ledger,
        advance(ledger, created(ledger, "oc"), Submitted(TaskId("t-oc"), E)),
        CancelRequested(1, "a", "r"),
    )
    assert ledger.count("outbox") == 0
    assert ledger.count("receipts") == 0
    with pytest.raises(RawError):
        raw(
            ledger,
            "INSERT INTO outbox VALUES ('nobody', 'op-nobody', 'ready', 'completed', NULL, NULL, now())",
        )
    ledger.accept_terminal(verified(ops[0]), PAYLOAD)
    ledger.accept_terminal(step(cancelled, CancelConfirmed(TaskId("t-oc"), 1, E), NOW), None)
    assert ledger.count("outbox") == 2
    assert raw(
        ledger,
        "SELECT count(*) FROM outbox o JOIN receipts r USING (call_node_id) "
        "WHERE r.status = o.terminal_status",
    ) == [(2,)]


def test_accept_many_decides_each_acceptance_on_its_own(ledger: LedgerPort) -> None:
    """Group-committed acceptances: a match, a forged digest, a duplicate and a stale one each get their own verdict."""
    x = to_fetching(ledger, "x")
    y = to_fetching(ledger, "y")
    z = to_fetching(ledger, "z")
    good = verified(x)
    forged = verified(y, {"content": [], "isError": True})
    stale = replace(verified(z), before=replace(z, row_version=1))
    outcomes = ledger.accept_many([(good, PAYLOAD), (forged, PAYLOAD), (good, PAYLOAD), (stale, PAYLOAD)])
    verdicts = [type(o.error).__name__ if o.error else "ok" for o in outcomes]
    assert verdicts == ["ok", "ReceiptConflict", "StaleWrite", "StaleWrite"]
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 1
    assert ledger.get(y.operation_id) == y
    assert ledger.get(z.operation_id) == z


def test_concurrent_acceptances_write_exactly_one_receipt(target: str, ledger: Ledger | PgLedger) -> None:
    """Six writers (separate connections on PostgreSQL) accepting the same terminal at once: one receipt, one outbox entry."""
    op = to_fetching(ledger)
    t = verified(op)
    writers = handles(target, ledger, 6)
    try:
        results = at_once([lambda h=h: h.accept_terminal(t, PAYLOAD) for h in writers])
    finally:
        close_extra(target, writers)
    wins = [r for r in results if not isinstance(r, BaseException)]
    assert len(wins) == 1, results
    if is_postgres(target):
        assert all(
            isinstance(r, StaleWrite | ReceiptConflict) for r in results if isinstance(r, BaseException)
        )
    assert ledger.count("receipts") == 1
    assert ledger.count("outbox") == 1


def test_concurrent_acceptances_of_many_operations_write_one_receipt_each(
    target: str, ledger: Ledger | PgLedger
) -> None:
    """Four writers each accept the same twenty terminals in batches: twenty receipts, no more."""
    ops = [to_fetching(ledger, f"m{i}") for i in range(20)]
    items = [(verified(op), PAYLOAD) for op in ops]
    writers = handles(target, ledger, 4)

    def accept_all(h: LedgerPort, k: int) -> int:
        mine = items if k % 2 == 0 else list(reversed(items))
        return sum(o.error is None for o in h.accept_many(mine))

    try:
        results = at_once([lambda h=h, k=k: accept_all(h, k) for k, h in enumerate(writers)])
    finally:
        close_extra(target, writers)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(r for r in results if isinstance(r, int)) == 20
    assert ledger.count("receipts") == 20
    assert ledger.count("outbox") == 20


def test_a_write_group_commits_every_kind_of_write_and_refuses_items_alone(ledger: LedgerPort) -> None:
    """One group: held outcomes, transitions, acceptances (against the rows the transitions leave) and polls."""
    a, b = created(ledger, "ga"), created(ledger, "gb")
    x = to_fetching(ledger, "gx")
    y = to_fetching(ledger, "gy")
    t_a = step(a, Submitted(TaskId("t-ga"), E), NOW)
    t_b = replace(step(b, Submitted(TaskId("t-gb"), E), NOW), before=replace(b, row_version=4))
    t_x = step(x, StatusObserved(TaskId("task-gx"), ServerStatus.COMPLETED, E), NOW)
    group = WriteGroup(
        transitions=[t_a, t_b, t_x],
        acceptances=[(verified(t_x.after), PAYLOAD), (verified(y, {"content": []}), PAYLOAD)],
        polls=[PollRecord(a.operation_id, "srv", "tasks/get", 1, NOW, NOW, "ok")],
        held=[(a.operation_id, HeldOutcome("completed", digest_of(PAYLOAD), PAYLOAD, "t-ga", None, NOW))],
    )
    outcome = ledger.commit_group(group)
    assert [type(o.error).__name__ if o.error else "ok" for o in outcome.transitions] == [
        "ok",
        "StaleWrite",
        "ok",
    ]
    assert [type(o.error).__name__ if o.error else "ok" for o in outcome.acceptances] == [
        "ok",
        "ReceiptConflict",
    ]
    assert ledger.get(a.operation_id) == t_a.after
    assert ledger.get(b.operation_id) == b
    stored = ledger.get(x.operation_id)
    assert stored is not None
    assert stored.state is S.ACCEPTED
    assert ledger.get(y.operation_id) == y
    assert (ledger.count("receipts"), ledger.count("outbox"), ledger.count("polls")) == (1, 1, 1)
    assert ledger.held_outcome(a.operation_id) is not None
    assert ledger.commit_group(WriteGroup()) == GroupOutcome([], [])


def test_a_write_group_with_a_reused_task_id_refuses_only_that_transition(ledger: LedgerPort) -> None:
    """A uniqueness failure inside a group: retried piece by piece, the offender alone is refused."""
    a, g, h = (created(ledger, n) for n in ("ra", "rg", "rh"))
    advance(ledger, a, Submitted(TaskId("same"), E))
    z = to_fetching(ledger, "rz")
    outcome = ledger.commit_group(
        WriteGroup(
            transitions=[
                step(g, Submitted(TaskId("same"), E), NOW),
                step(h, Submitted(TaskId("t-rh"), E), NOW),
            ],
            acceptances=[(verified(z), PAYLOAD)],
            polls=[PollRecord(g.operation_id, "srv", "tasks/get", 1, NOW, None, "ok")],
        )
    )
    assert isinstance(outcome.transitions[0].error, DuplicateOperation)
    assert outcome.transitions[1].error is None
    assert outcome.acceptances[0].error is None
    assert ledger.get(g.operation_id) == g
    assert (ledger.count("receipts"), ledger.count("polls")) == (1, 1)


# ------------------------------------------------------- polls, approvals, reconciliation, held


def test_polls_are_recorded_and_counted(ledger: LedgerPort) -> None:
    """Protocol requests land in the polls table, per operation and per outcome."""
    rows = [
        PollRecord(
            "op-a",
            "srv",
            "tasks/get",
            1,
            NOW + timedelta(seconds=i),
            NOW + timedelta(seconds=i, milliseconds=5),
            "ok",
        )
        for i in range(3)
    ] + [PollRecord("op-b", "srv", "tasks/get", 1, NOW, None, "unavailable")]
    ledger.record_polls(rows)
    ledger.record_polls([])
    assert ledger.poll_count("op-a") == 3
    assert ledger.poll_counts() == [("ok", 3), ("unavailable", 1)]
    polled = ledger.polls("op-b")
    assert len(polled) == 1
    assert polled[0]["received_at"] is None
    assert polled[0]["sent_at"] == NOW
    assert len(ledger.polls()) == 4


def test_approvals_bind_an_answer_to_its_round(ledger: LedgerPort) -> None:
    """An approval opens once per round; a stale round's answer is refused; an answered round takes no second answer."""
    op = created(ledger, "ap")
    op = advance(ledger, op, Submitted(TaskId("t-ap"), E))
    op = advance(
        ledger, op, StatusObserved(TaskId("t-ap"), ServerStatus.INPUT_REQUIRED, E, input_request_key="k1")
    )
    assert op.state is S.INPUT_REQUIRED
    request = ApprovalRequest("ok?", {"type": "object"}, "sha256:s", None)
    assert ledger.open_approval(op, request, at=NOW) is True
    assert ledger.open_approval(op, request, at=NOW) is False
    assert [a["input_round"] for a in ledger.approvals()] == [op.input_round]
    assert ledger.record_answer(op.operation_id, op.input_round - 1, {"ok": True}, "bob", NOW) is False
    assert ledger.answer_of(op.operation_id, op.input_round) is None
    assert ledger.record_answer(op.operation_id, op.input_round, {"ok": True}, "bob", NOW) is True
    assert ledger.record_answer(op.operation_id, op.input_round, {"ok": False}, "eve", NOW) is False
    assert ledger.answer_of(op.operation_id, op.input_round) == {"ok": True}
    assert ledger.approvals() == []
    (answered,) = ledger.approvals(pending_only=False)
    assert answered["actor"] == "bob"
    assert answered["status"] == "answered"
    advance(ledger, op, InputAnswered(op.input_round, "bob"))


def _asking(ledger: LedgerPort, call_node: str, key: str = "k1") -> Operation:
    op = created(ledger, call_node)
    op = advance(ledger, op, Submitted(TaskId(f"t-{call_node}"), E))
    return advance(
        ledger,
        op,
        StatusObserved(TaskId(f"t-{call_node}"), ServerStatus.INPUT_REQUIRED, E, input_request_key=key),
    )


def _open(ledger: LedgerPort, op: Operation, deadline: timedelta) -> None:
    opened = ledger.open_approval(
        op, ApprovalRequest("ok?", {"type": "object"}, "sha256:s", NOW + deadline), at=NOW
    )
    assert opened


def test_rounds_close_when_their_operation_moves_past_them_or_their_deadline_passes(
    ledger: LedgerPort,
) -> None:
    """A cancelled operation's round and a round the server replaced are closed (why and when recorded),
    a round past its deadline is expired, and only the round still asked before its deadline stays listed."""
    waiting = _asking(ledger, "rw")
    _open(ledger, waiting, timedelta(minutes=1))
    cancelled = _asking(ledger, "rc")
    _open(ledger, cancelled, timedelta(hours=1))
    advance(ledger, cancelled, CancelRequested(1, "ops", "not needed"))
    moved = _asking(ledger, "rm")
    _open(ledger, moved, timedelta(hours=1))
    moved = advance(
        ledger, moved, StatusObserved(TaskId("t-rm"), ServerStatus.INPUT_REQUIRED, E, input_request_key="k2")
    )
    assert moved.input_round == 2
    _open(ledger, moved, timedelta(hours=1))

    # A round opened by an executor whose move into it is not committed yet is left alone.
    early = advance(ledger, created(ledger, "re"), Submitted(TaskId("t-re"), E))
    asked = step(
        early, StatusObserved(TaskId("t-re"), ServerStatus.INPUT_REQUIRED, E, input_request_key="k1"), NOW
    )
    _open(ledger, asked.after, timedelta(hours=1))

    assert ledger.close_rounds(NOW + timedelta(seconds=30)) == 2
    rows = {(a["operation_id"], a["input_round"]): a for a in ledger.approvals(pending_only=False)}
    closed = rows[(cancelled.operation_id, 1)]
    assert (closed["status"], closed["closed_reason"]) == (
        "closed",
        "the operation moved on to CANCEL_REQUESTED",
    )
    assert closed["closed_at"] == NOW + timedelta(seconds=30)
    replaced = rows[(moved.operation_id, 1)]
    assert (replaced["status"], replaced["closed_reason"]) == ("closed", "the server moved on to round 2")
    assert sorted((a["operation_id"], a["input_round"]) for a in ledger.approvals()) == sorted(
        [(waiting.operation_id, 1), (moved.operation_id, 2), (early.operation_id, 1)]
    )

    assert ledger.close_rounds(NOW + timedelta(minutes=1)) == 1
    expired = ledger.approval(waiting.operation_id, 1)
    assert expired is not None
    assert (expired["status"], expired["closed_reason"]) == ("expired", "its deadline passed")
    assert expired["closed_at"] == NOW + timedelta(minutes=1)
    assert sorted((a["operation_id"], a["input_round"]) for a in ledger.approvals()) == sorted(
        [(moved.operation_id, 2), (early.operation_id, 1)]
    )
    assert (
        ledger.record_answer(waiting.operation_id, 1, {"ok": True}, "bob", NOW + timedelta(minutes=2))
        is False
    )
    assert ledger.close_rounds(NOW + timedelta(minutes=2)) == 0


def test_reconciliation_entries_open_once_and_resolve_once(ledger: LedgerPort) -> None:
    """One open entry per operation and kind; resolving needs an actor and a reason and closes it once."""
    op = created(ledger, "rc")
    first = ledger.open_reconciliation(
        op, kind="unknown", reason="lost", window_end=NOW, candidates=["t1"], at=NOW
    )
    again = ledger.open_reconciliation(op, kind="unknown", reason="lost again", window_end=NOW, at=NOW)
    other = ledger.open_reconciliation(op, kind="effects", reason="cancel won", window_end=NOW, at=NOW)
    assert first == again
    assert other != first
    assert ledger.open_reconciliation_counts() == [("effects", 1), ("unknown", 1)]
    (entry,) = [e for e in ledger.reconciliation() if e["kind"] == "unknown"]
    assert entry["candidates"] == '["t1"]'
    assert entry["idempotency_key"] == op.idempotency_key
    with pytest.raises(InvalidRecord):
        ledger.resolve_reconciliation(first, actor=" ", resolution="x", at=NOW)
    assert ledger.resolve_reconciliation(first, actor="bob", resolution="found it", at=NOW) is True
    assert ledger.resolve_reconciliation(first, actor="bob", resolution="found it", at=NOW) is False
    assert ledger.resolve_open(op.operation_id, kind="effects", actor="bob", resolution="none", at=NOW) == 1
    assert ledger.resolve_open(op.operation_id, kind="effects", actor="bob", resolution="none", at=NOW) == 0
    assert ledger.reconciliation() == []
    assert len(ledger.reconciliation(open_only=False)) == 2
    reopened = ledger.open_reconciliation(op, kind="unknown", reason="lost", window_end=NOW, at=NOW)
    assert reopened not in (first, other)


def test_concurrent_openers_of_one_reconciliation_entry_get_the_same_entry(pg_url: str, pg: PgLedger) -> None:
    """Several executors opening the same (operation, kind) entry at once end with one open entry.

    PostgreSQL only: DuckDB's optimistic transactions do not conflict on two new rows (its one
    writing process opens entries from one thread)."""
    target, ledger = pg_url, pg
    op = created(ledger, "rc")
    writers = handles(target, ledger, 4)
    try:
        results = at_once(
            [
                lambda h=h: h.open_reconciliation(op, kind="unknown", reason="r", window_end=NOW, at=NOW)
                for h in writers
            ]
        )
    finally:
        close_extra(target, writers)
    ids = {r for r in results if isinstance(r, int)}
    assert len(ids) == 1, results
    assert len(ledger.reconciliation()) == 1


def test_held_outcomes_survive_and_a_later_copy_replaces_an_earlier_one(ledger: LedgerPort) -> None:
    """A terminal outcome kept before acceptance is read back as held; holding again replaces it."""
    first = HeldOutcome("completed", digest_of(PAYLOAD), PAYLOAD, "t1", 1, NOW)
    ledger.hold_outcome("op-h", first)
    assert ledger.held_outcome("op-h") == first
    second = replace(first, status="failed", epoch_echo=None)
    ledger.hold_many([("op-h", second), ("op-i", first)])
    assert ledger.held_outcome("op-h") == second
    assert ledger.held_outcome("op-i") == first
    assert ledger.held_outcome("op-none") is None


@pytest.mark.not_in_memory(
    "settings, explorer runs and gate runs are the service's and the gates' records; a simulation writes none"
)
def test_settings_explorer_runs_and_gate_runs(ledger: LedgerPort) -> None:
    """Settings replace by key; explorer and gate runs are numbered by the ledger."""
    assert ledger.setting("global_qps") is None
    ledger.put_setting("global_qps", "50", NOW)
    ledger.put_setting("global_qps", "75", NOW)
    assert ledger.setting("global_qps") == "75"
    run = ExplorerRun(
        "s",
        "p",
        1,
        10,
        8,
        0,
        True,
        "engine",
        None,
        NOW,
        NOW + timedelta(seconds=2),
        code="shipped",
        revision=running_revision(),
    )
    assert ledger.record_explorer_run(run) == 1
    assert ledger.record_explorer_run(run) == 2
    assert [r["run_id"] for r in ledger.explorer_runs()] == [1, 2]
    results = [
        GateRecord("traceability", True, 0.0, 0.0, "ok", {"n": 1}),
        GateRecord("duplicates", False, None, 0.0, "no data", {}),
    ]
    first = ledger.record_gate_run(results, NOW)
    second = ledger.record_gate_run(results, NOW)
    assert second == first + 1
    runs = ledger.gate_runs()
    assert [(r["run_id"], r["gate"]) for r in runs] == [
        (second, "duplicates"),
        (second, "traceability"),
        (first, "duplicates"),
        (first, "traceability"),
    ]
    assert runs[1]["inputs"] == '{"n":1}'
    gates = ledger.gate_inputs(NOW)
    assert gates["poll_amplification"]["configured_qps"] == 75.0
    assert gates["terminal_divergence"]["explorer_runs"] == 2
    assert gates["terminal_divergence"]["interleavings"] == 16


@pytest.mark.not_in_memory("explorer runs are the service's records; a simulation writes none")
def test_an_explorer_run_records_its_space_and_whether_it_is_exact_a_bound_or_an_estimate(
    ledger: LedgerPort,
) -> None:
    """Each explorer run says how big its pair's space is and what that figure is: an exact count
    (exhausted), a proven lower bound (stopped at its limit) or an estimate; older kinds of run say
    nothing (NULL)."""

    def run(space: float | None, kind: str | None, exhaustive: bool) -> ExplorerRun:
        return ExplorerRun(
            "s", "p", 1, 10, 8, 0, exhaustive, "engine", None, NOW, NOW,
            code="shipped", revision="r", space=space, space_kind=kind,
        )  # fmt: skip

    for r in (run(8, "exact", True), run(1_000_004, "at_least", False), run(2.5e7, "estimate", False)):
        ledger.record_explorer_run(r)
    ledger.record_explorer_run(run(None, None, False))
    rows = ledger.explorer_runs()
    assert [(r["exhaustive"], r["space"], r["space_kind"]) for r in rows] == [
        (True, 8.0, "exact"),
        (False, 1_000_004.0, "at_least"),
        (False, 2.5e7, "estimate"),
        (False, None, None),
    ]


def test_explorer_runs_recorded_before_the_space_migration_say_no_space(target: str) -> None:
    """A ledger from before the explorer-space migration: its explorer runs get a NULL space and
    kind (not recorded, never 'exact'), and runs recorded after carry theirs."""
    from engine.ledger import open_ledger
    from engine.ledger.schema import EXPLORER_SPACE_NAME, MIGRATIONS, PG_MIGRATIONS

    migrations = PG_MIGRATIONS if "://" in target else MIGRATIONS
    mine = next(version for version, name, _ in migrations if name == EXPLORER_SPACE_NAME)
    assert mine == migrations[-1][0], "undo the migrations after this one here too"
    old = ExplorerRun("s", "p", 1, 10, 8, 0, True, "engine", None, NOW, NOW, code="shipped", revision="r")
    with open_ledger(target) as led:
        for statement in (
            "ALTER TABLE explorer_runs DROP COLUMN space",
            "ALTER TABLE explorer_runs DROP COLUMN space_kind",
            f"DELETE FROM schema_migrations WHERE version >= {mine}",
        ):
            raw(led, statement)
        raw(
            led,
            "INSERT INTO explorer_runs VALUES (nextval('explorer_run_seq'), 's', 'p', 1, 10, 8, 0, true, "
            "'engine', NULL, now(), now(), 'shipped', 'r')",
        )
    with open_ledger(target) as led:
        assert led.schema_version() == migrations[-1][0]
        led.record_explorer_run(replace(old, space=8.0, space_kind="exact"))
        rows = led.explorer_runs()
    assert [(r["exhaustive"], r["space"], r["space_kind"]) for r in rows] == [
        (True, None, None),
        (True, 8.0, "exact"),
    ]


# --------------------------------------------------------------------------------- rollout chain


def test_rollout_events_form_a_verified_hash_chain_written_by_compare_and_swap(
    ledger: Ledger | PgLedger,
) -> None:
    """Each action appends one link and moves the state in one transaction; a stale head or epoch is refused."""
    off = RolloutState(salt="s")
    shadow = replace(off, stage=Stage.SHADOW, shadow_tools=("generate_report",))
    first = rollout_event(ledger, prev=(0, GENESIS), before=off, after=shadow)
    with pytest.raises(StaleWrite):
        rollout_event(ledger, prev=(0, GENESIS), before=off, after=shadow)
    canary = replace(shadow, stage=Stage.CANARY, canary_bp=500)
    with pytest.raises(StaleWrite):
        rollout_event(ledger, prev=(first.seq, first.hash), before=replace(shadow, epoch=9), after=canary)
    with pytest.raises(LedgerError, match="chain head"):
        ledger.append_rollout_event(
            {**asdict(first), "seq": 5}, canary.as_json(), expected_seq=first.seq, expected_epoch=1
        )
    second = rollout_event(ledger, prev=(first.seq, first.hash), before=shadow, after=canary, action="canary")
    rolled = replace(canary, stage=Stage.ROLLED_BACK, canary_bp=0, epoch=2)
    third = rollout_event(
        ledger, prev=(second.seq, second.hash), before=canary, after=rolled, action="rollback"
    )
    assert ledger.execution_epoch() == 2
    state = ledger.rollout_state()
    assert state is not None
    assert (state["head_seq"], state["head_hash"], state["shadow_tools"]) == (
        3,
        third.hash,
        ["generate_report"],
    )
    assert [r["seq"] for r in ledger.rollout_events(newest_first=True, limit=2)] == [3, 2]
    report = verify_ledger(ledger)  # type: ignore[arg-type]
    assert report.ok, report.problems
    raw(ledger, "UPDATE rollout_events SET reason = 'edited' WHERE seq = 2")
    assert not verify_ledger(ledger).ok  # type: ignore[arg-type]


def test_two_first_rollout_actions_at_once_record_one(target: str, ledger: Ledger | PgLedger) -> None:
    """Two writers both appending the first link: one lands, the other is refused; the chain never forks."""
    off = RolloutState(salt="s")
    writers = handles(target, ledger, 2)
    try:
        results = at_once(
            [
                lambda h=h, k=k: rollout_event(
                    h, prev=(0, GENESIS), before=off, after=replace(off, stage=Stage.SHADOW, salt=f"s{k}")
                )
                for k, h in enumerate(writers)
            ]
        )
    finally:
        close_extra(target, writers)
    assert sum(not isinstance(r, BaseException) for r in results) == 1, results
    if is_postgres(target):
        assert all(isinstance(r, StaleWrite) for r in results if isinstance(r, BaseException))
    assert ledger.count("rollout_events") == 1
    assert verify_ledger(ledger).ok  # type: ignore[arg-type]


@pytest.mark.not_in_memory(
    "rollout assignments and shadow diffs are the rollout's records; a simulation writes none"
)
def test_assignments_and_shadow_diffs(ledger: LedgerPort) -> None:
    """One arm per operation (a second row is ignored); a shadow pair is compared once."""
    primary = to_fetching(ledger, "p")
    shadow = to_fetching(ledger, "p#shadow", role=Role.SHADOW)
    row = {
        "operation_id": primary.operation_id,
        "call_node_id": "p",
        "tool_name": "generate_report",
        "role": "primary",
        "arm": "control",
        "stage": "shadow",
        "bucket": 17,
        "canary_bp": 0,
        "server_name": "old",
        "rerouted_from": None,
        "primary_operation_id": None,
        "rollout_seq": 1,
        "assigned_at": NOW,
    }
    shadow_row = {
        **row,
        "operation_id": shadow.operation_id,
        "call_node_id": "p#shadow",
        "role": "shadow",
        "arm": "shadow",
        "primary_operation_id": primary.operation_id,
    }
    ledger.record_assignments([row, shadow_row])
    ledger.record_assignments([{**row, "arm": "canary"}])
    assert sorted(str(a["arm"]) for a in ledger.assignments()) == ["control", "shadow"]
    assert ledger.rollout_keys() == [("p", primary.operation_id, "FETCHING_RESULT")]
    assert ledger.shadow_pairs(ready_only=False) == [(primary.operation_id, shadow.operation_id)]
    assert ledger.shadow_pairs(ready_only=True) == []
    ledger.accept_terminal(verified(primary), PAYLOAD)
    ledger.accept_terminal(verified(shadow), PAYLOAD)
    assert ledger.shadow_pairs(ready_only=True) == [(primary.operation_id, shadow.operation_id)]
    diff = {
        "primary_operation_id": primary.operation_id,
        "shadow_operation_id": shadow.operation_id,
        "call_node_id": "p",
        "tool_name": "generate_report",
        "primary_status": "completed",
        "shadow_status": "completed",
        "primary_result_digest": "a",
        "shadow_result_digest": "a",
        "primary_content_digest": "c",
        "shadow_content_digest": "c",
        "primary_latency_ms": 10.0,
        "shadow_latency_ms": 14.5,
        "primary_polls": 2,
        "shadow_polls": 3,
        "diverged": False,
        "differences": "[]",
        "recorded_at": NOW,
    }
    assert ledger.record_shadow_diff(diff) is True
    assert ledger.record_shadow_diff(diff) is False
    assert ledger.shadow_pairs(ready_only=False) == []
    summary = ledger.shadow_summary()
    assert summary["compared"] == 1
    assert summary["awaiting_comparison"] == 0
    assert summary["mean_latency_delta_ms"] == pytest.approx(4.5)
    assert summary["mean_polls_delta"] == pytest.approx(1.0)
    assert [r["shadow_operation_id"] for r in ledger.shadow_diffs()] == [shadow.operation_id]
    assert ledger.shadow_diffs(diverged_only=True) == []


# -------------------------------------------------------------------- the same history, both reads


def _history(led: LedgerPort) -> None:
    """One deterministic history touching every table the reads aggregate."""
    at = NOW
    ops = []
    for i, protocol in enumerate(
        [Protocol.MCP_2025_11_25, Protocol.AIP_151, Protocol.LEGACY_SYNC, Protocol.MCP_2026_07_28] * 3
    ):
        op = led.create_operation(
            make_operation(f"h{i:02d}", protocol=protocol, now=at + timedelta(seconds=i)), {"i": i}
        )[0]
        ops.append(op)
    for i, op in enumerate(ops[:9]):
        ops[i] = advance(led, op, Submitted(TaskId(f"task-{i}"), E), at=at + timedelta(seconds=20))
    for i in (0, 1, 2, 3):
        ops[i] = advance(led, ops[i], StatusObserved(TaskId(f"task-{i}"), ServerStatus.COMPLETED, E))
        ops[i] = advance(led, ops[i], FetchStarted(E))
    for i in (0, 1):
        led.accept_terminal(step(ops[i], verified(ops[i]).event, at + timedelta(seconds=30 + i)), PAYLOAD)
    for i in (4, 5):
        ops[i] = advance(led, ops[i], CancelRequested(1, "a", "r"), at=at + timedelta(seconds=25))
    t = step(ops[4], CancelConfirmed(TaskId("task-4"), 1, E), at + timedelta(seconds=40))
    led.accept_terminal(t, None)
    polls = [
        PollRecord(
            ops[k % 9].operation_id,
            "srv",
            "tasks/get",
            1,
            at + timedelta(milliseconds=137 * k),
            None,
            ["ok", "unavailable", "ok"][k % 3],
        )
        for k in range(60)
    ]
    led.record_polls(polls)
    entry = led.open_reconciliation(
        ops[6], kind="unknown", reason="lost", window_end=at, at=at + timedelta(seconds=50)
    )
    led.open_reconciliation(
        ops[7], kind="unknown", reason="lost", window_end=at, at=at + timedelta(seconds=55)
    )
    led.resolve_reconciliation(entry, actor="bob", resolution="found", at=at + timedelta(seconds=90))
    led.record_explorer_run(
        ExplorerRun(
            "s",
            "p",
            1,
            10,
            8,
            0,
            True,
            "engine",
            None,
            at,
            at + timedelta(seconds=2),
            code="shipped",
            revision=running_revision(),
        )
    )
    led.put_setting("global_qps", "20", at)


def test_the_same_history_reads_the_same_on_both_backends(tmp_path: Path, pg_url: str) -> None:
    """Write one history to each backend: every aggregate and listing the service and the gates read agrees."""
    with open_ledger(str(tmp_path / "l.duckdb")) as duck, open_ledger(pg_url) as pg:
        _history(duck)
        _history(pg)
        later = NOW + timedelta(minutes=10)
        pg_gates, duck_gates = pg.gate_inputs(later), duck.gate_inputs(later)
        assert pg_gates.keys() == duck_gates.keys()
        for gate, inputs in duck_gates.items():
            # percentiles are interpolated in floating point by each engine: equal to the last bits
            for name, value in inputs.items():
                expected = pytest.approx(value, rel=1e-12) if isinstance(value, float) else value
                assert pg_gates[gate][name] == expected, (gate, name)
        assert duck_gates["unknown_reconciliation"]["open"] == 1
        assert duck_gates["cancel_confirmation"]["confirmed"] == 1
        assert pg.state_counts() == duck.state_counts()
        assert pg.poll_counts() == duck.poll_counts()
        assert pg.open_reconciliation_counts() == duck.open_reconciliation_counts()
        assert pg.live_by_protocol() == duck.live_by_protocol()
        assert pg.list_operations(limit=50) == duck.list_operations(limit=50)
        assert pg.list_operations(state="WORKING", protocol="aip-151") == duck.list_operations(
            state="WORKING", protocol="aip-151"
        )
        assert pg.operations() == duck.operations()
        assert pg.operations(states=[S.SUBMITTING, S.ACCEPTED], limit=3) == duck.operations(
            states=[S.SUBMITTING, S.ACCEPTED], limit=3
        )
        assert pg.reconciliation(open_only=False) == duck.reconciliation(open_only=False)
        for op in duck.operations():
            assert pg.transitions(op.operation_id) == duck.transitions(op.operation_id)
            assert pg.receipt(op.call_node_id) == duck.receipt(op.call_node_id)
            assert pg.receipt_of_operation(op.operation_id) == duck.receipt_of_operation(op.operation_id)
            if op.task_id is not None:
                assert pg.by_task(op.server, op.task_id) == duck.by_task(op.server, op.task_id)
        ids = [op.operation_id for op in duck.operations()] + ["op-missing"]
        assert pg.get_many(ids) == duck.get_many(ids)
        for table in sorted(duck_ledger._TABLES):
            assert pg.count(table) == duck.count(table), table


def test_an_unknown_table_is_refused_by_count(ledger: LedgerPort) -> None:
    """count() takes ledger tables only (its argument becomes SQL)."""
    with pytest.raises(LedgerError, match="unknown ledger table"):
        ledger.count("pg_authid; DROP TABLE receipts")


# ------------------------------------------------------------------------- leases (PostgreSQL only)


@pytest.fixture
def pg(pg_url: str) -> PgLedger:
    led = open_ledger(pg_url)
    assert isinstance(led, PgLedger)
    yield led  # type: ignore[misc]
    led.close()


def test_lease_claims_are_disjoint_and_skip_receipts_and_live_leases(pg: PgLedger) -> None:
    """Claimers never get the same operation; held leases and operations with a receipt are not offered."""
    ops = [created(pg, f"l{i}") for i in range(10)]
    done = to_fetching(pg, "done")
    pg.accept_terminal(verified(done), PAYLOAD)
    a = pg.claim("a", "tok-a", 4, 30, NOW)
    b = pg.claim("b", "tok-b", 100, 30, NOW)
    assert len(a) == 4
    assert len(b) == 6
    assert not {o.operation_id for o in a} & {o.operation_id for o in b}
    assert pg.claim("c", "tok-c", 100, 30, NOW + timedelta(seconds=29)) == []
    assert {o.operation_id for o in a + b} == {o.operation_id for o in ops}
    lease = pg.lease_of(a[0].operation_id)
    assert lease is not None
    assert (lease.owner, lease.token, lease.expires_at) == ("a", "tok-a", NOW + timedelta(seconds=30))
    assert {le.operation_id for le in pg.leases(owner="a")} == {o.operation_id for o in a}


def test_concurrent_claimers_split_the_work_without_overlap(pg_url: str, pg: PgLedger) -> None:
    """Four executors (separate connections) claiming at once: every operation leased exactly once (SKIP LOCKED)."""
    pg.create_many([(make_operation(f"w{i:03d}"), {"i": i}) for i in range(200)])
    writers = [open_ledger(pg_url) for _ in range(4)]

    def drain(h: PgLedger, k: int) -> list[str]:
        got: list[str] = []
        while batch := h.claim(f"ex{k}", f"tok{k}", 7, 30, NOW):
            got += [o.operation_id for o in batch]
        return got

    try:
        results = at_once([lambda h=h, k=k: drain(h, k) for k, h in enumerate(writers)])  # type: ignore[misc]
    finally:
        for h in writers:
            h.close()
    claimed = [i for r in results if isinstance(r, list) for i in r]
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len(claimed) == 200
    assert len(set(claimed)) == 200


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(pg: PgLedger) -> None:
    """After expiry another executor takes the operation over; every write of the old holder is refused, nothing changes."""
    op = created(pg, "f1")
    (mine,) = pg.claim("a", "tok-a", 10, 30, NOW)
    a = pg.fenced(Fence("a", "tok-a", epoch=1))
    b = pg.fenced(Fence("b", "tok-b", epoch=1))
    op = a.apply(step(mine, Submitted(TaskId("t-f1"), E), NOW))
    with pytest.raises(LeaseLost, match=r"taken over|not leased"):
        b.apply(step(op, StatusObserved(TaskId("t-f1"), ServerStatus.WORKING, E), NOW))
    assert pg.claim("b", "tok-b", 10, 30, NOW + timedelta(seconds=10)) == []  # still a's
    (taken,) = pg.claim("b", "tok-b", 10, 30, NOW + timedelta(seconds=31))
    assert taken == op
    assert pg.renew("a", "tok-a", 30, NOW + timedelta(seconds=32)) == []
    stale = step(op, StatusObserved(TaskId("t-f1"), ServerStatus.COMPLETED, E), NOW)
    with pytest.raises(LeaseLost) as lost:
        a.apply(stale)
    assert isinstance(lost.value, StaleWrite)
    outcomes = a.apply_many([stale, step(stale.after, FetchStarted(E), NOW)])
    assert all(isinstance(o.error, LeaseLost) for o in outcomes)
    assert pg.get(op.operation_id) == op
    op = b.apply(stale)
    op = b.apply(step(op, FetchStarted(E), NOW))
    with pytest.raises(LeaseLost):
        a.accept_terminal(verified(op), PAYLOAD)
    assert pg.count("receipts") == 0
    b.accept_terminal(verified(op), PAYLOAD)
    assert pg.count("receipts") == 1
    assert pg.count("operations") == 1
    assert pg.renew("b", "tok-b", 30, NOW) == []  # operations with a receipt are not renewed


def test_renew_keeps_held_leases_and_release_frees_them(pg: PgLedger) -> None:
    """Renewal moves the expiry of the leases still held; release hands them straight back."""
    for i in range(3):
        created(pg, f"r{i}")
    ids = sorted(o.operation_id for o in pg.claim("a", "tok-a", 10, 30, NOW))
    assert pg.renew("a", "tok-a", 60, NOW + timedelta(seconds=20)) == ids  # all now expire at +80
    assert pg.renew("a", "tok-a", 60, NOW, operation_ids=ids[:1]) == ids[:1]  # this one at +60
    assert pg.renew("a", "wrong-token", 60, NOW) == []
    assert pg.renew("someone", "tok-a", 60, NOW) == []
    assert [o.operation_id for o in pg.claim("b", "tok-b", 10, 30, NOW + timedelta(seconds=61))] == ids[:1]
    assert pg.release("a", "tok-a") == 2
    assert sorted(o.operation_id for o in pg.claim("c", "tok-c", 10, 30, NOW)) == ids[1:]


def test_a_raised_epoch_fences_executors_of_the_old_epoch(pg: PgLedger) -> None:
    """After a rollback raises the execution epoch, old-epoch executors can neither claim, create, write nor accept."""
    op = to_fetching(pg, "e1")
    (mine,) = pg.claim("a", "tok-a", 10, 300, NOW, epoch=1)
    old = pg.fenced(Fence("a", "tok-a", epoch=1))
    off = RolloutState(salt="s")
    rollout_event(
        pg,
        prev=(0, GENESIS),
        before=off,
        after=replace(off, stage=Stage.ROLLED_BACK, epoch=2),
        action="rollback",
    )
    with pytest.raises(LeaseLost, match="epoch is 2"):
        old.accept_terminal(verified(mine), PAYLOAD)
    with pytest.raises(LeaseLost, match="epoch"):
        old.apply(step(mine, CancelRequested(1, "a", "r"), NOW))
    with pytest.raises(LeaseLost, match="epoch"):
        old.create_operation(make_operation("e2"), {})
    with pytest.raises(LeaseLost, match="epoch"):
        pg.claim("a", "tok-a", 10, 30, NOW + timedelta(hours=1), epoch=1)
    assert pg.count("receipts") == 0
    assert pg.get(op.operation_id) == op
    new = pg.fenced(Fence("b", "tok-b", epoch=2))
    (adopted,) = pg.claim("b", "tok-b", 10, 30, NOW + timedelta(hours=1), epoch=2)
    adopted = new.apply(step(adopted, EpochRaised(Epoch(2), "rollback"), NOW))
    assert adopted.epoch == 2
    newer = created(pg, "e3", epoch=3)
    assert pg.claim("c", "tok-c", 10, 30, NOW + timedelta(hours=2), epoch=2) == [adopted]
    assert pg.lease_of(newer.operation_id) == Lease(newer.operation_id, None, None, None, None)


def test_operations_created_under_a_fence_are_leased_to_their_creator(pg: PgLedger) -> None:
    """A fenced creator holds what it creates; nobody else claims it before the lease runs out."""
    a = pg.fenced(Fence("a", "tok-a", epoch=1, lease_s=60))
    out = a.create_many([(make_operation(f"c{i}"), {"i": i}) for i in range(3)])
    assert [made for _, made in out] == [True, True, True]
    lease = pg.lease_of(out[0][0].operation_id)
    assert lease is not None
    assert (lease.owner, lease.token, lease.epoch) == ("a", "tok-a", 1)
    assert pg.claim("b", "tok-b", 10, 30, NOW + timedelta(seconds=59)) == []
    assert len(pg.claim("b", "tok-b", 10, 30, NOW + timedelta(seconds=61))) == 3


def test_a_crashed_executor_is_taken_over_without_a_second_operation_or_receipt(
    pg_url: str, pg: PgLedger
) -> None:
    """Executor A creates and half-drives 30 operations, then dies; B takes over after expiry and finishes them.
    A's late writes are refused: 30 operations, 30 task bindings, 30 receipts, 30 outbox rows."""
    a_led = open_ledger(pg_url)
    b_led = open_ledger(pg_url)
    assert isinstance(a_led, PgLedger)
    assert isinstance(b_led, PgLedger)
    a_token, b_token = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    a = a_led.fenced(Fence("a", a_token, epoch=1, lease_s=10))
    b = b_led.fenced(Fence("b", b_token, epoch=1, lease_s=10))
    try:
        items = [(make_operation(f"k{i:02d}"), {"i": i}) for i in range(30)]
        ops = [op for op, _ in a.create_many(items)]
        zombie = []
        for i, op in enumerate(ops[:20]):
            op = a.apply(step(op, Submitted(TaskId(f"task-{i}"), E), NOW))
            op = a.apply(step(op, StatusObserved(TaskId(f"task-{i}"), ServerStatus.COMPLETED, E), NOW))
            op = a.apply(step(op, FetchStarted(E), NOW))
            if i < 5:
                a.accept_terminal(verified(op), PAYLOAD)
            else:
                zombie.append(op)
        # A dies here. B retries the same calls (same call nodes): it gets A's operations back.
        again = b.create_many(items)
        assert [made for _, made in again] == [False] * 30
        assert b_led.claim("b", b_token, 100, 10, NOW + timedelta(seconds=5)) == []
        taken = b_led.claim("b", b_token, 100, 10, NOW + timedelta(seconds=11))
        assert len(taken) == 25
        for op in taken:
            i = int(op.call_node_id[1:])
            if op.state is S.SUBMITTING:
                op = b.apply(step(op, Submitted(TaskId(f"task-{i}"), E), NOW))
                op = b.apply(step(op, StatusObserved(TaskId(f"task-{i}"), ServerStatus.COMPLETED, E), NOW))
                op = b.apply(step(op, FetchStarted(E), NOW))
            b.accept_terminal(verified(op), PAYLOAD)
        # A wakes up and tries to finish what it had in flight.
        late = a.accept_many([(verified(op), PAYLOAD) for op in zombie])
        assert all(isinstance(o.error, LeaseLost) for o in late)
    finally:
        a_led.close()
        b_led.close()
    for table in ("operations", "task_bindings", "receipts", "outbox", "results"):
        assert pg.count(table) == 30, table
    assert raw(pg, "SELECT count(*) FROM op_state WHERE state <> 'ACCEPTED'") == [(0,)]


@pytest.mark.not_in_memory(
    "refused control API attempts are the service's record; a simulation has no control API"
)
def test_refused_control_api_attempts_are_recorded_and_read_newest_first(ledger: LedgerPort) -> None:
    """``record_denial`` keeps who, which token, what and when; ``denials`` reads them newest first."""
    for i, (principal, status) in enumerate((("", 401), ("vera", 403))):
        ledger.record_denial(
            {
                "recorded_at": NOW + timedelta(seconds=i),
                "principal": principal,
                "token_id": "vera-laptop" if principal else "",
                "method": "POST",
                "path": "/api/v1/rollout/rollback",
                "permission": "rollout",
                "status": status,
                "needed_role": "release-manager" if status == 403 else "",
                "reason": "refused",
                "client": "127.0.0.1",
            }
        )
    rows = ledger.denials(limit=10)
    assert [(r["principal"], r["status"]) for r in rows] == [("vera", 403), ("", 401)]
    assert rows[0]["token_id"] == "vera-laptop"
    assert rows[0]["needed_role"] == "release-manager"
    assert ledger.denials(limit=1)[0]["principal"] == "vera"
