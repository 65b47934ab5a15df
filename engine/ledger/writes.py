"""The shared SQL ledger's group-committed writes: new operations, compare-and-swap, write groups.

``create_many``, ``apply_many`` and ``commit_group`` run the driver's one-transaction batch and,
where the database refuses it on a uniqueness conflict, retry item by item so that only the
offender is refused and named. ``chain`` and ``outcomes`` are the rule for how transitions of one
operation chain within a batch (the memory ledger uses the same rule).

It must not import a database driver, and it decides nothing about states (``engine.machine`` does).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any, Final

from engine.acceptance import receipt_of
from engine.errors import DuplicateOperation, LeaseLost, LedgerError, StaleWrite
from engine.ledger import sql
from engine.ledger.port import (
    BatchOutcome,
    GroupOutcome,
    HeldOutcome,
    Json,
    Outcomes,
    PollRecord,
    WriteGroup,
)
from engine.ledger.reads import EngineReads
from engine.ledger.receipts import Receipts
from engine.ledger.rows import _transition_row, held_rows, refuse_receipt_states, require_new
from engine.model import Operation, Transition

__all__ = ["GroupWrites", "chain", "outcomes"]


_AFTER: Final = attrgetter("after")
_AFTER_ID: Final = attrgetter("after.operation_id")
_BEFORE_ID: Final = attrgetter("before.operation_id")
_AFTER_TASK: Final = attrgetter("after.task_id")
_BEFORE_TASK: Final = attrgetter("before.task_id")
_LOGGED: Final = attrgetter("logged")


def chain(
    transitions: Sequence[Transition],
) -> tuple[dict[str, Transition], dict[str, Transition], dict[int, LedgerError]]:
    """Collapse chains: per operation, the first transition (whose ``before`` the ledger must hold) and
    the last (whose ``after`` it will hold); and the transitions that do not chain, by index."""
    ids = list(map(_AFTER_ID, transitions))
    if len(set(ids)) == len(ids) and ids == list(map(_BEFORE_ID, transitions)):
        # The common group: one transition per operation, nothing to chain (no Python step each).
        alone = dict(zip(ids, transitions, strict=True))
        return alone, alone, {}
    first: dict[str, Transition] = {}
    last: dict[str, Transition] = {}
    chain_errors: dict[int, LedgerError] = {}
    for i, t in enumerate(transitions):
        key = t.after.operation_id
        if t.before.operation_id != key:
            chain_errors[i] = LedgerError("transition changes operation id")
            continue
        if key in last:
            prev = last[key].after
            if t.before.row_version != prev.row_version:
                chain_errors[i] = StaleWrite(key, t.before.row_version, "does not chain within the batch")
                continue
        else:
            first[key] = t
        last[key] = t
    return first, last, chain_errors


def outcomes(
    transitions: Sequence[Transition],
    chain_errors: Mapping[int, LedgerError],
    refused: Mapping[str, LedgerError],
) -> Outcomes:
    """Each transition's outcome: its chain error, its operation's refusal (a plain stale write is
    named by the transition's own row version), or written."""
    written: list[Operation | None] = list(map(_AFTER, transitions))
    if not chain_errors and not refused:
        return Outcomes(written)
    errors: dict[int, LedgerError] = dict(chain_errors)
    for i, t in enumerate(transitions):
        if i not in errors and t.after.operation_id in refused:
            error = refused[t.after.operation_id]
            if isinstance(error, StaleWrite) and not isinstance(error, LeaseLost):
                error = StaleWrite(t.after.operation_id, t.before.row_version)
            errors[i] = error
    for i in errors:
        written[i] = None
    return Outcomes(written, errors)


class GroupWrites(Receipts, EngineReads):
    """Creating operations, compare-and-swapping transitions and committing write groups."""

    @abstractmethod
    def _insert_fresh(
        self, fresh: Sequence[tuple[Operation, Json]], arms: Sequence[dict[str, object]] = ()
    ) -> set[str] | None:
        """Insert new operations, and the arms (assignment rows) of those inserted, in one
        transaction; the ids inserted (another creator's call node or key skipped), or None if the
        backend refused the whole batch."""

    @abstractmethod
    def _created_by_another(self, op: Operation) -> Operation | None:
        """The operation that holds ``op``'s call node or key, once its creator has committed."""

    @abstractmethod
    def _apply_one(self, t: Transition) -> BatchOutcome:
        """Compare-and-swap one transition in its own transaction."""

    @abstractmethod
    def _apply_batch(self, transitions: Sequence[Transition]) -> Sequence[BatchOutcome]:
        """Many transitions in one transaction, each compare-and-swapped on its own."""

    @abstractmethod
    def _commit_group_once(self, group: WriteGroup) -> GroupOutcome:
        """A whole write group in one transaction (a uniqueness conflict aborts it all)."""

    def create_operation(self, op: Operation, arguments: Json) -> tuple[Operation, bool]:
        """Record a new operation in SUBMITTING, or return the call node's existing one.

        Returns:
            ``(operation, created)``; ``created`` is False when the call node already had one.

        Raises:
            DuplicateOperation: the call node (or key) exists for a different request.
        """
        require_new(op)
        inserted = self._insert_fresh([(op, arguments)])
        if inserted is not None and op.operation_id in inserted:
            return op, True
        existing = self._created_by_another(op)
        if existing is None:
            raise DuplicateOperation("submission key", op.idempotency_key)
        if existing.request_digest != op.request_digest:
            raise DuplicateOperation(
                "call node (for a different request)", f"{op.call_node_id} ({existing.request_digest})"
            )
        return existing, False

    def create_many(
        self,
        items: Sequence[tuple[Operation, Json]],
        *,
        arms: Sequence[dict[str, object]] = (),
    ) -> list[tuple[Operation, bool]]:
        """Group-committed ``create_operation``: one transaction for many new operations.

        Call nodes that already have an operation get it back (``created`` False). An item that
        conflicts otherwise (a different request under an existing call node, or another creator
        that won the race) is resolved on its own, as ``create_operation`` would, so that the
        offender is named.

        Nothing is read first: the insert's own transaction skips the call nodes the ledger already
        holds (``_insert_fresh``), and only those skipped are read afterwards, in one query. A
        submission of new call nodes thus costs its one transaction and no read.

        ``arms`` are rollout assignment rows (``record_assignments``'): the arm of each operation
        created here is written in the same transaction as the operation itself, so that a new
        call's record and its arm cost one durable commit (an item resolved on its own gets its arm
        written right after).
        """
        if not items:
            return []
        arm_of = {str(r["operation_id"]): r for r in arms}
        nodes = [op.call_node_id for op, _ in items]
        if len(set(nodes)) != len(nodes):
            return self._created_alone(items, arm_of, set())
        for op, _ in items:
            require_new(op)
        inserted = self._insert_fresh(items, [r for op, _ in items if (r := arm_of.get(op.operation_id))])
        if inserted is None:
            return self._created_alone(items, arm_of, set())
        skipped = [op.call_node_id for op, _ in items if op.operation_id not in inserted]
        existing = self.by_call_nodes(skipped) if skipped else {}
        out: list[tuple[Operation, bool]] = []
        alone: list[int] = []
        for op, args in items:
            have = existing.get(op.call_node_id)
            if op.operation_id in inserted:
                out.append((op, True))
            elif have is not None and have.request_digest == op.request_digest:
                out.append((have, False))
            else:
                alone.append(len(out))
                out.append(self.create_operation(op, args))
        self._record_arms([out[i] for i in alone], arm_of, inserted)
        return out

    def _created_alone(
        self,
        items: Sequence[tuple[Operation, Json]],
        arm_of: Mapping[str, dict[str, object]],
        written: set[str],
    ) -> list[tuple[Operation, bool]]:
        """Each item created on its own (``create_operation``), then the arms of those created."""
        out = [self.create_operation(op, args) for op, args in items]
        self._record_arms(out, arm_of, written)
        return out

    def _record_arms(
        self,
        created: Sequence[tuple[Operation, bool]],
        arm_of: Mapping[str, dict[str, object]],
        written: set[str],
    ) -> None:
        rows = [
            arm_of[op.operation_id]
            for op, new in created
            if new and op.operation_id in arm_of and op.operation_id not in written
        ]
        if rows:
            with self._tx() as tx:
                self._insert_arms(tx, rows)

    def apply(self, transition: Transition) -> Operation:
        """Compare-and-swap one transition into the ledger.

        Raises:
            StaleWrite: the row moved since ``transition.before`` was read (``LeaseLost`` when a
                fenced handle no longer holds the operation's lease).
            DuplicateOperation: the new server task id is already bound to another operation.
        """
        outcome = self.apply_many([transition])[0]
        if outcome.error is not None:
            raise outcome.error
        assert outcome.operation is not None
        return outcome.operation

    def apply_many(self, transitions: Sequence[Transition]) -> Sequence[BatchOutcome]:
        """Group commit: many transitions, one transaction, each compare-and-swapped on its own.

        Transitions of the same operation must chain (each ``before`` is the previous ``after``).
        A stale one is refused (``StaleWrite``) without touching the others. Rejected transitions
        (``accepted=False``) are only appended to the log.
        """
        refuse_receipt_states(transitions)
        if not transitions:
            return []
        try:
            if len(transitions) == 1:
                return [self._retrying(lambda: self._apply_one(transitions[0]))]
            return self._retrying(lambda: self._apply_batch(transitions))
        except Exception as exc:
            if not self._conflict(exc):
                raise
            if len(transitions) == 1:
                t = transitions[0]
                return [
                    BatchOutcome(
                        None, DuplicateOperation("server task id", f"{t.after.server} {t.after.task_id}")
                    )
                ]
        # One transition broke a constraint: one transaction each, so the others still commit and
        # the offender is named.
        out: list[BatchOutcome] = []
        for t in transitions:
            out.extend(self.apply_many([t]))
        return out

    def commit_group(self, group: WriteGroup) -> GroupOutcome:
        """Everything a service tick buffered, in ONE transaction (one durable commit).

        In order: held outcomes, transitions (each compare-and-swapped, as ``apply_many``),
        acceptances (each matched, as ``accept_many``, against the rows the transitions leave
        behind), then the protocol requests. A refused item is reported and writes nothing; the
        rest commit. If a uniqueness constraint fires, the group is retried piece by piece so
        that only the offender is refused.
        """
        refuse_receipt_states(group.transitions)
        for t, _ in group.acceptances:
            receipt_of(t)
        if group.empty:
            return GroupOutcome([], [])
        try:
            return self._retrying(lambda: self._commit_group_once(group))
        except Exception as exc:
            if not self._conflict(exc):
                raise
        self.hold_many(group.held)
        applied = self.apply_many(group.transitions)
        accepted = self.accept_many(group.acceptances)
        self.record_polls(group.polls)
        return GroupOutcome(applied, accepted)

    def _append_batch(
        self,
        tx: Any,
        transitions: Sequence[Transition],
        first: Mapping[str, Transition],
        last: Mapping[str, Transition],
        chain_errors: Mapping[int, LedgerError],
        refused: set[str],
        prepared: object = None,
    ) -> None:
        """A batch's new task bindings and log rows, for every operation not ``refused``.

        ``prepared``: what the driver already built from the whole batch, for its log rows
        (``_append_log``) where every transition is logged."""
        # A group of polls binds nothing: its task ids compared as two lists at C speed first, so
        # that only a group where some operation got a new task id is walked in Python.
        bound = (
            []
            if list(map(_AFTER_TASK, last.values())) == list(map(_BEFORE_TASK, first.values()))
            else sorted(
                k
                for k, t in last.items()
                if t.after.task_id is not None
                and t.after.task_id != first[k].before.task_id
                and k not in refused
            )
        )
        bindings = [[last[k].after.server, last[k].after.task_id, k, last[k].at] for k in bound]
        if bindings:
            self._insert_many(tx, "task_bindings", bindings)
        # A status report that repeats what the row holds is checked like any write but not logged
        # (``Transition.logged``, step's decision); whether a group has any is asked at C speed.
        unlogged = not all(map(_LOGGED, transitions))
        logged = (
            [
                t
                for i, t in enumerate(transitions)
                if t.logged and i not in chain_errors and t.after.operation_id not in refused
            ]
            if chain_errors or refused or unlogged
            else transitions
        )
        if logged:
            self._append_log(tx, logged, prepared if logged is transitions else None)

    def _append_log(self, tx: Any, transitions: Sequence[Transition], prepared: object = None) -> None:
        """Append the transitions' log rows (a driver may build them by column, from ``prepared``)."""
        self._insert_many(tx, "transitions", [_transition_row(t) for t in transitions])

    def record_polls(self, rows: Sequence[PollRecord]) -> None:
        """Append protocol requests to the polls table (group-committed by the caller)."""
        if not rows:
            return
        with self._tx() as tx:
            self._insert_polls(tx, rows)

    def _insert_polls(self, tx: Any, rows: Sequence[PollRecord]) -> None:
        self._insert_many(tx, "polls", [list(r) for r in rows])

    def hold_outcome(self, operation_id: str, held: HeldOutcome) -> None:
        """Keep a terminal outcome that arrived inline, so it survives a restart or the server's expiry."""
        self.hold_many([(operation_id, held)])

    def hold_many(self, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        if not items:
            return
        with self._tx() as tx:
            self._insert_held(tx, items)

    def _insert_held(self, tx: Any, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        self._insert_many(tx, "held_outcomes", held_rows(items), sql.HELD_REPLACE)
