"""An in-memory ledger with the contract of ``engine.ledger.Ledger``, for the race explorer.

Same rules as the DuckDB ledger for the writes the executor makes: ``create_operation`` (one
operation per call node and per submission key), ``apply`` (compare-and-swap on row version and
cancel generation; one operation per server task id; never a receipt), and ``accept_terminal``
(``engine.acceptance.check_acceptance`` against the stored row, then at most one receipt and one
outbox entry per call node). It must not decide any state (``engine.machine`` does) and must not be
used outside simulations: nothing here is durable.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime

from engine.acceptance import check_acceptance, receipt_of
from engine.errors import DuplicateOperation, InvalidRecord, LedgerError, ReceiptConflict, StaleWrite
from engine.ledger.port import (
    ApprovalRequest,
    BatchOutcome,
    GroupOutcome,
    HeldOutcome,
    Json,
    PollRecord,
    WriteGroup,
)
from engine.ledger.receipts import accept_each
from engine.ledger.rows import refuse_receipt_states, require_resolution
from engine.ledger.writes import chain
from engine.model import (
    RECEIPT_STATES,
    AcceptTerminal,
    CallNodeId,
    Digest,
    LocalState,
    Operation,
    Receipt,
    Role,
    TaskId,
    Transition,
    canonical_json,
)


@dataclass(frozen=True, slots=True)
class Held:
    """A terminal outcome kept before acceptance (``engine.ledger.HeldOutcome`` without the clock)."""

    status: str
    digest: Digest
    payload: Json
    task_id: TaskId | None
    epoch_echo: int | None


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """The one ready entry a primary operation's receipt releases downstream."""

    call_node_id: CallNodeId
    operation_id: str
    terminal_status: str
    result_digest: Digest | None
    payload: Json | None


@dataclass(frozen=True, slots=True)
class Entry:
    """An item for a person: ``kind`` is ``unknown``, ``effects`` or ``approval``."""

    operation_id: str
    kind: str
    detail: str
    input_round: int = 0
    open: bool = True


@dataclass(slots=True)
class MemLedger:
    """Operations, receipts, outbox, held outcomes, answers and open items, all in dictionaries."""

    server: str = "sim"
    _ops: dict[str, Operation] = field(default_factory=dict)
    _by_node: dict[str, str] = field(default_factory=dict)
    _by_key: dict[str, str] = field(default_factory=dict)
    _bindings: dict[tuple[str, str], str] = field(default_factory=dict)
    _arguments: dict[str, Json] = field(default_factory=dict)
    receipts: dict[str, Receipt] = field(default_factory=dict)
    outbox: dict[str, OutboxEntry] = field(default_factory=dict)
    results: dict[str, Json] = field(default_factory=dict)
    audit: list[tuple[str, Json | None]] = field(default_factory=list)
    held: dict[str, Held] = field(default_factory=dict)
    answers: dict[tuple[str, int], Json] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)
    writes: int = 0
    rejected: int = 0

    # ---------------------------------------------------------------------------------- writes

    def create_operation(self, op: Operation, arguments: Json) -> tuple[Operation, bool]:
        """Record a new operation in SUBMITTING, or return the call node's existing one.

        Raises:
            DuplicateOperation: the call node (or key) exists for a different request.
        """
        if op.state is not LocalState.SUBMITTING or op.row_version != 0:
            raise InvalidRecord("a new operation starts in SUBMITTING at row version 0")
        existing_id = self._by_node.get(op.call_node_id) or self._by_key.get(op.idempotency_key)
        if existing_id is not None:
            existing = self._ops[existing_id]
            if existing.request_digest != op.request_digest:
                raise DuplicateOperation(
                    "call node (for a different request)", f"{op.call_node_id} ({existing.request_digest})"
                )
            return existing, False
        if op.operation_id in self._ops:
            raise DuplicateOperation("operation id", op.operation_id)
        self._ops[op.operation_id] = op
        self._by_node[op.call_node_id] = op.operation_id
        self._by_key[op.idempotency_key] = op.operation_id
        self._arguments[op.operation_id] = arguments
        self.writes += 1
        return op, True

    def _swap(self, before: Operation, after: Operation) -> None:
        current = self._ops.get(before.operation_id)
        if (
            current is None
            or current.row_version != before.row_version
            or current.cancel_generation != before.cancel_generation
        ):
            raise StaleWrite(before.operation_id, before.row_version)
        if after.task_id is not None and after.task_id != before.task_id:
            key = (after.server, after.task_id)
            bound = self._bindings.get(key)
            if bound is not None and bound != after.operation_id:
                raise DuplicateOperation("server task id", f"{after.server} {after.task_id}")
            self._bindings[key] = after.operation_id
        self._ops[after.operation_id] = after
        self.writes += 1

    def apply(self, transition: Transition) -> Operation:
        """Compare-and-swap one transition.

        A transition that changes nothing (rejected, or a repeat) is only logged, but it too must
        describe the row as it is.

        Raises:
            StaleWrite: the row moved since ``transition.before`` was read.
            DuplicateOperation: the new server task id is already bound to another operation.
            LedgerError: the transition would write a receipt (that is ``accept_terminal``'s job).
        """
        t = transition
        if any(isinstance(e, AcceptTerminal) for e in t.effects) or (
            t.after.state in RECEIPT_STATES and t.before.state not in RECEIPT_STATES
        ):
            raise LedgerError("a transition to a receipt state goes through accept_terminal, never apply")
        if t.after != t.before:
            self._swap(t.before, t.after)
            return t.after
        # Nothing to write but the log line; it must still be about the row as it is.
        current = self._ops.get(t.before.operation_id)
        if (
            current is None
            or current.row_version != t.before.row_version
            or current.cancel_generation != t.before.cancel_generation
        ):
            raise StaleWrite(t.before.operation_id, t.before.row_version)
        if not t.accepted:
            self.rejected += 1
        return t.after

    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        """The single acceptance point: match the row, then write one receipt and one outbox entry.

        Raises:
            ReceiptConflict: a field does not match, or the call node already holds a receipt.
            StaleWrite: the row moved since it was read.
        """
        receipt = receipt_of(transition)
        current = self._ops.get(receipt.operation_id)
        check_acceptance(current, transition, payload)
        assert current is not None
        if receipt.call_node_id in self.receipts:
            # The receipts table's primary key: a second receipt for a call node never lands.
            raise ReceiptConflict(
                receipt.call_node_id, "receipt", self.receipts[receipt.call_node_id].status, receipt.status
            )
        after = transition.after
        self._swap(current, after)
        self.receipts[receipt.call_node_id] = receipt
        accepted = after.state is LocalState.ACCEPTED
        if payload is not None and accepted:
            self.results[current.operation_id] = payload
        if current.role is Role.PRIMARY:
            self.outbox[receipt.call_node_id] = OutboxEntry(
                receipt.call_node_id,
                current.operation_id,
                receipt.status.value,
                receipt.result_digest,
                payload if accepted else None,
            )
        return receipt

    def attach_audit_result(self, op: Operation, payload: Json | None) -> None:
        """Keep a result read after the terminal beside the receipt (never as a success payload)."""
        self.audit.append((op.operation_id, payload))

    def hold_outcome(self, operation_id: str, held: Held) -> None:
        self.held[operation_id] = held

    def held_outcome(self, operation_id: str) -> Held | None:
        return self.held.get(operation_id)

    def record_answer(self, operation_id: str, input_round: int, answer: Json) -> bool:
        """Store a person's answer for one round; False if that round was already answered."""
        key = (operation_id, input_round)
        if key in self.answers:
            return False
        self.answers[key] = answer
        return True

    def answer_of(self, operation_id: str, input_round: int) -> Json | None:
        return self.answers.get((operation_id, input_round))

    def open_entry(self, op: Operation, kind: str, detail: str) -> None:
        """Open a reconciliation (``unknown``/``effects``) or approval item for a person."""
        self.entries.append(Entry(op.operation_id, kind, detail, op.input_round))

    def resolve_open(self, operation_id: str, kind: str) -> int:
        """Close every open item of one kind for an operation; returns how many."""
        closed = 0
        for i, e in enumerate(self.entries):
            if e.open and e.operation_id == operation_id and e.kind == kind:
                self.entries[i] = Entry(e.operation_id, e.kind, e.detail, e.input_round, open=False)
                closed += 1
        return closed

    # ----------------------------------------------------------------------------------- reads

    def get(self, operation_id: str) -> Operation | None:
        return self._ops.get(operation_id)

    def by_call_node(self, call_node_id: str) -> Operation | None:
        found = self._by_node.get(call_node_id)
        return self._ops[found] if found is not None else None

    def by_call_nodes(self, call_node_ids: Sequence[str]) -> dict[str, Operation]:
        found = (self.by_call_node(node) for node in call_node_ids)
        return {op.call_node_id: op for op in found if op is not None}

    def by_key(self, key: str) -> Operation | None:
        found = self._by_key.get(key)
        return self._ops[found] if found is not None else None

    def by_task(self, server: str, task_id: str) -> Operation | None:
        found = self._bindings.get((server, task_id))
        return self._ops[found] if found is not None else None

    def arguments(self, operation_id: str) -> Json:
        return self._arguments[operation_id]

    def operations(self) -> list[Operation]:
        return list(self._ops.values())

    def has_entry(self, operation_id: str, kind: str, input_round: int | None = None) -> bool:
        """Whether an open item of ``kind`` (for ``input_round``, if given) waits for a person."""
        return any(
            e.open
            and e.operation_id == operation_id
            and e.kind == kind
            and (input_round is None or e.input_round == input_round)
            for e in self.entries
        )

    def clone(self) -> MemLedger:
        """An independent copy (every stored value is immutable, so the containers are enough)."""
        return MemLedger(
            self.server,
            dict(self._ops),
            dict(self._by_node),
            dict(self._by_key),
            dict(self._bindings),
            dict(self._arguments),
            dict(self.receipts),
            dict(self.outbox),
            dict(self.results),
            list(self.audit),
            dict(self.held),
            dict(self.answers),
            list(self.entries),
            self.writes,
            self.rejected,
        )

    def state_key(self) -> tuple[object, ...]:
        """Everything a later step or check can observe, as one hashable value."""
        return (
            tuple(self._ops.values()),
            tuple(self._bindings.items()),
            tuple(self.receipts.values()),
            tuple((k, h.status, h.digest, h.task_id, h.epoch_echo) for k, h in self.held.items()),
            tuple(self.answers),
            tuple(self.entries),
        )


class MemoryPort:
    """``MemLedger`` behind the ``LedgerPort`` signatures of the writes and reads the driver makes.

    This is what the ledger contract suite (``tests/contract``) runs beside DuckDB and PostgreSQL:
    operations and their compare-and-swap, group commits, the acceptance point with its receipt
    and outbox entry, held outcomes, approval rounds (their answers, deadlines and closing) and
    reconciliation entries. It is also the race explorer's ledger (``engine.explore``). The
    service's own records (gate and explorer runs, rollout, leases, SQL) are not here: the contract
    tests of those say so in their skip reason.
    """

    def __init__(self, server: str = "sim") -> None:
        self.mem = MemLedger(server)
        self._held_at: dict[str, datetime] = {}
        self._entries: list[dict[str, object]] = []
        self._log: list[dict[str, object]] = []
        self._polls: list[PollRecord] = []
        self._approvals: dict[tuple[str, int], dict[str, object]] = {}
        """One row per (operation, input round), with the columns of the SQL ledgers' ``approvals``."""

    def close(self) -> None:
        """Nothing to release: the memory goes with the object."""

    # writes
    def create_operation(self, op: Operation, arguments: Json) -> tuple[Operation, bool]:
        stored, created = self.mem.create_operation(op, arguments)
        if created:
            self._log.append(
                {"operation_id": op.operation_id, "from_state": None, "to_state": op.state.value,
                 "event": "Created", "cause": "operation recorded before submission", "accepted": True,
                 "epoch": op.epoch, "row_version": op.row_version, "recorded_at": op.created_at}
            )  # fmt: skip
        return stored, created

    def create_many(
        self,
        items: Sequence[tuple[Operation, Json]],
        *,
        arms: Sequence[dict[str, object]] = (),
    ) -> list[tuple[Operation, bool]]:
        # The explorer's port keeps no rollout arms (it has no ``record_assignments``): ``arms`` is
        # accepted for the port's signature and left out.
        return [self.create_operation(op, arguments) for op, arguments in items]

    def _logged(self, t: Transition) -> None:
        self._log.append(
            {"operation_id": t.after.operation_id, "from_state": t.before.state.value,
             "to_state": t.after.state.value, "event": type(t.event).__name__, "cause": t.reason,
             "accepted": t.accepted, "epoch": t.after.epoch, "row_version": t.after.row_version,
             "recorded_at": t.at}
        )  # fmt: skip

    def apply(self, transition: Transition) -> Operation:
        after = self.mem.apply(transition)
        if transition.logged:
            self._logged(transition)
        return after

    def apply_many(self, transitions: Sequence[Transition]) -> Sequence[BatchOutcome]:
        """Each transition compare-and-swapped on its own, in order; transitions of one operation
        must chain (``engine.ledger.writes.chain``, the SQL ledgers' rule); a refused one writes nothing."""
        refuse_receipt_states(transitions)
        _, _, chain_errors = chain(transitions)
        out: list[BatchOutcome] = []
        refused: dict[str, LedgerError] = {}
        for i, t in enumerate(transitions):
            if i in chain_errors:
                out.append(BatchOutcome(None, chain_errors[i]))
                continue
            key = t.after.operation_id
            if key in refused:
                # The SQL ledgers swap an operation's chain as one (its head's ``before`` to its last
                # ``after``): the rest of a refused chain is refused with it, even where its row
                # version happens to match the row another writer left (a rollback's adoption).
                error = refused[key]
                out.append(
                    BatchOutcome(
                        None,
                        StaleWrite(key, t.before.row_version) if isinstance(error, StaleWrite) else error,
                    )
                )
                continue
            try:
                out.append(BatchOutcome(self.apply(t), None))
            except (StaleWrite, DuplicateOperation) as refusal:
                refused[key] = refusal
                out.append(BatchOutcome(None, refusal))
        return out

    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        receipt = self.mem.accept_terminal(transition, payload)
        self._logged(transition)
        return receipt

    def accept_many(self, items: Sequence[tuple[Transition, Json | None]]) -> Sequence[BatchOutcome]:
        for t, _ in items:
            receipt_of(t)  # refuses anything that is not an acceptance before anything is written
        return accept_each(self.accept_terminal, items)

    def commit_group(self, group: WriteGroup) -> GroupOutcome:
        """A group's writes in the SQL ledgers' order: held outcomes, transitions, acceptances
        (against the rows the transitions leave), polls; each item refused on its own."""
        self.hold_many(group.held)
        transitions = self.apply_many(group.transitions)
        acceptances = self.accept_many(group.acceptances)
        self.record_polls(group.polls)
        return GroupOutcome(transitions, acceptances)

    def record_polls(self, rows: Sequence[PollRecord]) -> None:
        self._polls.extend(rows)

    def polls(self, operation_id: str | None = None) -> list[dict[str, object]]:
        rows = sorted(self._polls, key=lambda r: r.sent_at)
        return [r._asdict() for r in rows if operation_id in (None, r.operation_id)]

    def poll_counts(self) -> list[tuple[str, int]]:
        return sorted(Counter(r.outcome for r in self._polls).items())

    def poll_count(self, operation_id: str) -> int:
        return sum(r.operation_id == operation_id for r in self._polls)

    def hold_outcome(self, operation_id: str, held: HeldOutcome) -> None:
        self.hold_many([(operation_id, held)])

    def hold_many(self, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        for operation_id, held in items:
            task = TaskId(held.task_id) if held.task_id is not None else None
            self.mem.hold_outcome(
                operation_id, Held(held.status, Digest(held.digest), held.payload, task, held.epoch_echo)
            )
            self._held_at[operation_id] = held.held_at

    def held_outcome(self, operation_id: str) -> HeldOutcome | None:
        held = self.mem.held_outcome(operation_id)
        if held is None:
            return None
        return HeldOutcome(
            held.status, held.digest, held.payload, held.task_id, held.epoch_echo, self._held_at[operation_id]
        )

    def attach_audit_result(self, op: Operation, kind: str, payload: Json | None, at: datetime) -> None:
        self.mem.attach_audit_result(op, payload)

    def open_approval(self, op: Operation, request: ApprovalRequest, *, at: datetime) -> bool:
        """Open the approval for the operation's current input round. False if it was already open."""
        key = (op.operation_id, op.input_round)
        if key in self._approvals:
            return False
        self._approvals[key] = {
            "operation_id": op.operation_id,
            "input_round": op.input_round,
            "request_key": op.input_request_key,
            "message": request.message,
            "requested_schema": canonical_json(request.requested_schema),
            "schema_digest": request.schema_digest,
            "deadline": request.deadline,
            "status": "pending",
            "answer": None,
            "actor": None,
            "opened_at": at,
            "answered_at": None,
            "closed_at": None,
            "closed_reason": None,
        }
        return True

    def record_answer(
        self, operation_id: str, input_round: int, answer: Json, actor: str, at: datetime
    ) -> bool:
        """Store the answer of a pending round. False if that round is not pending (stale or answered)."""
        row = self._approvals.get((operation_id, input_round))
        if row is None or row["status"] != "pending":
            return False
        if not self.mem.record_answer(operation_id, input_round, answer):
            return False
        row.update(status="answered", answer=canonical_json(answer), actor=actor, answered_at=at)
        return True

    def close_rounds(self, at: datetime) -> int:
        """Close every pending round that is no longer answerable at ``at`` (the SQL ledgers' rule,
        ``sql.ROUNDS_MOVED_PAST`` then ``sql.ROUNDS_EXPIRE``): its operation moved past it
        (``closed``) or its deadline passed (``expired``). Returns how many were closed."""
        closed = 0
        for row in self._approvals.values():
            op = self.mem.get(str(row["operation_id"]))
            if row["status"] != "pending" or op is None:
                continue
            round_ = int(str(row["input_round"]))
            if op.input_round > round_:
                reason = f"the server moved on to round {op.input_round}"
            elif op.input_round == round_ and op.state not in (LocalState.INPUT_REQUIRED, LocalState.UNKNOWN):
                reason = f"the operation moved on to {op.state.value}"
            else:
                continue
            row.update(status="closed", closed_at=at, closed_reason=reason)
            closed += 1
        for row in self._approvals.values():
            deadline = row["deadline"]
            if row["status"] == "pending" and isinstance(deadline, datetime) and deadline <= at:
                row.update(status="expired", closed_at=at, closed_reason="its deadline passed")
                closed += 1
        return closed

    def answer_of(self, operation_id: str, input_round: int) -> Json | None:
        row = self._approvals.get((operation_id, input_round))
        if row is None or row["status"] != "answered":
            return None
        return self.mem.answer_of(operation_id, input_round)

    def approval(self, operation_id: str, input_round: int) -> dict[str, object] | None:
        """One round's approval row (any status), or None if that round never asked a person."""
        row = self._approvals.get((operation_id, input_round))
        return dict(row) if row is not None else None

    def approvals(self, *, pending_only: bool = True) -> list[dict[str, object]]:
        rows = [r for r in self._approvals.values() if not pending_only or r["status"] == "pending"]
        rows.sort(key=lambda r: (r["opened_at"], r["operation_id"]))
        return [dict(r) for r in rows]

    def open_reconciliation(
        self,
        op: Operation,
        *,
        kind: str,
        reason: str,
        window_end: datetime,
        candidates: Sequence[str] = (),
        at: datetime,
    ) -> int:
        """Open an entry for a person; idempotent per (operation, kind) while one is open."""
        for i, entry in enumerate(self._entries):
            if (
                entry["operation_id"] == op.operation_id
                and entry["kind"] == kind
                and entry["status"] == "open"
            ):
                return i + 1
        self.mem.open_entry(op, kind, reason)
        self._entries.append(
            {
                "entry_id": len(self._entries) + 1,
                "operation_id": op.operation_id,
                "kind": kind,
                "reason": reason,
                "idempotency_key": op.idempotency_key,
                "task_id": op.task_id,
                "request_digest": op.request_digest,
                "window_start": op.created_at,
                "window_end": window_end,
                "candidates": json.dumps(list(candidates)),
                "status": "open",
                "opened_at": at,
                "resolved_at": None,
                "actor": None,
                "resolution": None,
            }
        )
        return len(self._entries)

    def resolve_reconciliation(self, entry_id: int, *, actor: str, resolution: str, at: datetime) -> bool:
        """Resolve one open entry; False if it is not open (resolved once, never twice)."""
        require_resolution(actor, resolution)
        if not 0 < entry_id <= len(self._entries) or self._entries[entry_id - 1]["status"] != "open":
            return False
        entry = self._entries[entry_id - 1]
        entry.update(status="resolved", resolved_at=at, actor=actor, resolution=resolution)
        self.mem.resolve_open(str(entry["operation_id"]), str(entry["kind"]))
        return True

    def resolve_open(self, operation_id: str, *, kind: str, actor: str, resolution: str, at: datetime) -> int:
        return sum(
            self.resolve_reconciliation(i + 1, actor=actor, resolution=resolution, at=at)
            for i, e in enumerate(self._entries)
            if e["operation_id"] == operation_id and e["kind"] == kind and e["status"] == "open"
        )

    def open_reconciliation_counts(self) -> list[tuple[str, int]]:
        kinds = Counter(str(e["kind"]) for e in self._entries if e["status"] == "open")
        return sorted(kinds.items())

    def reconciliation(self, *, open_only: bool = True) -> list[dict[str, object]]:
        return [dict(e) for e in self._entries if not open_only or e["status"] == "open"]

    # reads
    def get(self, operation_id: str) -> Operation | None:
        return self.mem.get(operation_id)

    def get_many(self, operation_ids: Sequence[str]) -> dict[str, Operation]:
        return {i: op for i in operation_ids if (op := self.mem.get(i)) is not None}

    def by_call_node(self, call_node_id: str) -> Operation | None:
        return self.mem.by_call_node(call_node_id)

    def by_call_nodes(self, call_node_ids: Sequence[str]) -> dict[str, Operation]:
        return self.mem.by_call_nodes(call_node_ids)

    def by_task(self, server: str, task_id: str) -> Operation | None:
        return self.mem.by_task(server, task_id)

    def by_key(self, key: str) -> Operation | None:
        return self.mem.by_key(key)

    def arguments(self, operation_id: str) -> Json:
        return self.mem.arguments(operation_id)

    def operations(
        self, *, states: Sequence[LocalState] | None = None, limit: int | None = None
    ) -> list[Operation]:
        """The operations, in creation order (of ``states`` only, if given; at most ``limit``)."""
        wanted = None if not states else set(states)
        found = [op for op in self.mem.operations() if wanted is None or op.state in wanted]
        return found if limit is None else found[:limit]

    def shadow_pairs(self, *, ready_only: bool) -> list[tuple[str, str]]:
        """No shadow pairs: the memory ledger keeps no rollout arms (see the class docstring)."""
        return []

    def receipt(self, call_node_id: str) -> Receipt | None:
        return self.mem.receipts.get(call_node_id)

    def receipt_of_operation(self, operation_id: str) -> dict[str, object] | None:
        op = self.mem.get(operation_id)
        receipt = self.mem.receipts.get(op.call_node_id) if op is not None else None
        if op is None or receipt is None:
            return None
        row: dict[str, object] = {f.name: getattr(receipt, f.name) for f in fields(receipt)}
        return {**row, "status": receipt.status.value, "role": op.role.value}

    def result_payload(self, operation_id: str) -> Json | None:
        return self.mem.results.get(operation_id)

    def transitions(self, operation_id: str) -> list[dict[str, object]]:
        """The operation's log in order (``seq`` is its position in this ledger's whole log)."""
        return [
            {"seq": i + 1, **row} for i, row in enumerate(self._log) if row["operation_id"] == operation_id
        ]

    def count(self, table: str) -> int:
        """Rows of one of the tables this ledger keeps.

        Raises:
            LedgerError: a table it does not keep (or that does not exist).
        """
        sizes = {
            "operations": len(self.mem.operations()),
            "op_state": len(self.mem.operations()),
            "op_identity": len(self.mem.operations()),
            "transitions": len(self._log),
            "receipts": len(self.mem.receipts),
            "outbox": len(self.mem.outbox),
            "results": len(self.mem.results),
            "receipt_audit": len(self.mem.audit),
            "held_outcomes": len(self.mem.held),
            "polls": len(self._polls),
            "reconciliation": len(self._entries),
        }
        if table not in sizes:
            raise LedgerError(f"unknown ledger table {table!r} (the memory ledger keeps {sorted(sizes)})")
        return sizes[table]


__all__ = [
    "Entry",
    "Held",
    "Json",
    "MemLedger",
    "MemoryPort",
    "OutboxEntry",
]
