"""An in-memory ledger with the contract of ``engine.ledger.Ledger``, for the race explorer.

Same rules as the DuckDB ledger for the writes the executor makes: ``create_operation`` (one
operation per call node and per submission key), ``apply`` (compare-and-swap on row version and
cancel generation; one operation per server task id; never a receipt), and ``accept_terminal``
(``engine.acceptance.check_acceptance`` against the stored row, then at most one receipt and one
outbox entry per call node). It must not decide any state (``engine.machine`` does) and must not be
used outside simulations: nothing here is durable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.acceptance import check_acceptance, receipt_of
from engine.errors import DuplicateOperation, InvalidRecord, LedgerError, ReceiptConflict, StaleWrite
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
)

Json = dict[str, object]


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


__all__ = [
    "Entry",
    "Held",
    "Json",
    "MemLedger",
    "OutboxEntry",
]
