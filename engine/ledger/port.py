"""What every ledger backend offers: ``LedgerPort`` (and ``LeasingLedgerPort`` for shared ledgers) and the record types they return.

Types only: no database driver, no I/O. The DuckDB, PostgreSQL and in-memory backends satisfy these
protocols, and ``tests/contract`` holds them to the same behaviour.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import repeat
from pathlib import Path
from typing import NamedTuple, Protocol, Self, overload

import pyarrow as pa

from engine.errors import (
    LedgerError,
)
from engine.model import (
    GateRecord,
    LocalState,
    Operation,
    Receipt,
    Transition,
)

Json = dict[str, object]


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What a person is asked in one input round: the server's message and schema (with its digest),
    and until when an answer is still useful (``None``: no deadline)."""

    message: str
    requested_schema: Json
    schema_digest: str
    deadline: datetime | None


class PollRecord(NamedTuple):
    """One protocol request as the polls table records it."""

    operation_id: str
    server: str
    method: str
    epoch: int
    sent_at: datetime
    received_at: datetime | None
    outcome: str


@dataclass(frozen=True, slots=True)
class OutboxAck:
    """A recorded acknowledgement: ``consumer``'s downstream advanced on the entry of ``call_node_id``."""

    consumer: str
    call_node_id: str
    seq: int
    acknowledged_at: datetime
    repeated: bool
    """True when this consumer had acknowledged the entry before (the earlier record stands)."""


@dataclass(frozen=True, slots=True)
class ExplorerRun:
    """One explorer result as ``explorer_runs`` records it (the input of the divergence gate)."""

    scenario: str
    protocol: str
    seed: int
    explored: int
    distinct_interleavings: int
    divergent: int
    exhaustive: bool
    rules: str
    """Which rule set ran: ``engine`` for the real rules, else the name of a deliberately broken variant."""
    shortest_trace: str | None
    started_at: datetime
    finished_at: datetime
    code: str
    """What ran: ``shipped`` (the driver and adapters that ship, against the reference servers),
    ``model`` (the explorer's simulated executor), ``seeded`` (made up by the demo seeding, never a
    run). Only ``shipped`` runs count toward the terminal_divergence gate."""
    revision: str | None
    """The git revision of the code that ran (``engine.revision.running_revision``)."""
    space: float | None = None
    """The pair's interleavings as far as the run knows them: an exact count, a proven lower bound
    or an estimate, as ``space_kind`` says (``None``: not known)."""
    space_kind: str | None = None
    """``exact`` (the pair was exhausted), ``at_least`` (the run covered ``space`` distinct
    interleavings and stopped at its limit), ``estimate`` (random probes: neither a count nor a
    bound); ``None``: not recorded (rows of older revisions, the demo's)."""


@dataclass(frozen=True, slots=True)
class HeldOutcome:
    """A terminal outcome kept by the ledger before acceptance (inline results, done operations)."""

    status: str
    digest: str
    payload: Json
    task_id: str | None
    epoch_echo: int | None
    held_at: datetime


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """Per-transition result of a group commit: the stored operation, or why it was refused."""

    operation: Operation | None
    error: LedgerError | None


class Outcomes(Sequence[BatchOutcome]):
    """A group commit's per-transition results held as two arrays, not one object each: the stored
    operation of each transition (None where refused) and the refusals by index.

    A group of thousands of transitions is usually refused nowhere; building a ``BatchOutcome`` for
    each would keep thousands of new objects alive at once, and the cyclic garbage collector,
    counting them, would walk the whole heap several times per group. Here an outcome is made
    only when it is read, and ``refusals`` answers the common question (which were refused?)
    from the sparse map alone. It compares equal to any sequence of the same outcomes.
    """

    __slots__ = ("_errors", "_operations")

    def __init__(
        self, operations: Sequence[Operation | None], errors: Mapping[int, LedgerError] | None = None
    ) -> None:
        self._operations = operations
        self._errors: Mapping[int, LedgerError] = errors or {}

    @property
    def errors(self) -> Mapping[int, LedgerError]:
        """The refused transitions' errors, by index."""
        return self._errors

    def __len__(self) -> int:
        return len(self._operations)

    @overload
    def __getitem__(self, index: int) -> BatchOutcome: ...
    @overload
    def __getitem__(self, index: slice) -> list[BatchOutcome]: ...
    def __getitem__(self, index: int | slice) -> BatchOutcome | list[BatchOutcome]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError(index)
        return BatchOutcome(self._operations[i], self._errors.get(i))

    def head(self, n: int) -> Outcomes:
        """The first ``n`` outcomes, still as two arrays."""
        return Outcomes(self._operations[:n], {i: e for i, e in self._errors.items() if i < n})

    def __iter__(self) -> Iterator[BatchOutcome]:
        if not self._errors:
            return map(BatchOutcome, self._operations, repeat(None))
        return map(BatchOutcome, self._operations, map(self._errors.get, range(len(self))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # (equal to lists, which are unhashable)

    def __repr__(self) -> str:
        return f"Outcomes({list(self)!r})"


def refusals(outcomes: Sequence[BatchOutcome]) -> Iterator[tuple[int, LedgerError]]:
    """The refused outcomes of a group, as (index, error), in order; from ``Outcomes``' sparse map
    without making an outcome per transition."""
    if isinstance(outcomes, Outcomes):
        return iter(sorted(outcomes.errors.items()))
    return ((i, o.error) for i, o in enumerate(outcomes) if o.error is not None)


@dataclass(frozen=True)
class WriteGroup:
    """What one group commit writes: see ``Ledger.commit_group``."""

    transitions: Sequence[Transition] = ()
    acceptances: Sequence[tuple[Transition, Json | None]] = ()
    polls: Sequence[PollRecord] = ()
    held: Sequence[tuple[str, HeldOutcome]] = ()

    @property
    def empty(self) -> bool:
        return not (self.transitions or self.acceptances or self.polls or self.held)

    @property
    def size(self) -> int:
        return len(self.transitions) + len(self.acceptances) + len(self.polls) + len(self.held)


@dataclass(frozen=True)
class GroupOutcome:
    """Per-item results of a group commit, in the order given."""

    transitions: Sequence[BatchOutcome]
    acceptances: Sequence[BatchOutcome]


class SnapshotSource(Protocol):
    """A ledger that copies itself, consistent, to a file (DuckDB: ``Ledger.snapshot``)."""

    @property
    def path(self) -> str: ...
    def snapshot(self, dest: str | Path) -> Path: ...


class LedgerPort(Protocol):
    """Everything the code above the ledger (runtime, service, rollout, CLI, seeding) calls on it.

    Both ``Ledger`` (DuckDB) and ``PgLedger`` (PostgreSQL) satisfy it; the contract tests in
    ``tests/contract`` hold them to the same behaviour.
    """

    # lifecycle and schema
    def close(self) -> None: ...
    def warm_up(self) -> None: ...
    def schema_version(self) -> int: ...

    # operation writes: creation, compare-and-swap, acceptance
    def create_operation(self, op: Operation, arguments: Json) -> tuple[Operation, bool]: ...
    def create_many(
        self,
        items: Sequence[tuple[Operation, Json]],
        *,
        arms: Sequence[dict[str, object]] = (),
    ) -> list[tuple[Operation, bool]]: ...
    def apply(self, transition: Transition) -> Operation: ...
    def apply_many(self, transitions: Sequence[Transition]) -> Sequence[BatchOutcome]: ...
    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt: ...
    def accept_many(self, items: Sequence[tuple[Transition, Json | None]]) -> Sequence[BatchOutcome]: ...
    def commit_group(self, group: WriteGroup) -> GroupOutcome: ...
    def attach_audit_result(self, op: Operation, kind: str, payload: Json | None, at: datetime) -> None: ...

    # polls, approvals, reconciliation, held outcomes
    def record_polls(self, rows: Sequence[PollRecord]) -> None: ...
    def open_approval(self, op: Operation, request: ApprovalRequest, *, at: datetime) -> bool: ...
    def record_answer(
        self, operation_id: str, input_round: int, answer: Json, actor: str, at: datetime
    ) -> bool: ...
    def close_rounds(self, at: datetime) -> int: ...
    def answer_of(self, operation_id: str, input_round: int) -> Json | None: ...
    def approval(self, operation_id: str, input_round: int) -> dict[str, object] | None: ...
    def approvals(self, *, pending_only: bool = True) -> list[dict[str, object]]: ...
    def open_reconciliation(
        self,
        op: Operation,
        *,
        kind: str,
        reason: str,
        window_end: datetime,
        candidates: Sequence[str] = (),
        at: datetime,
    ) -> int: ...
    def resolve_reconciliation(self, entry_id: int, *, actor: str, resolution: str, at: datetime) -> bool: ...
    def resolve_open(
        self, operation_id: str, *, kind: str, actor: str, resolution: str, at: datetime
    ) -> int: ...
    def reconciliation(self, *, open_only: bool = True) -> list[dict[str, object]]: ...
    def polls(self, operation_id: str | None = None) -> list[dict[str, object]]: ...
    def hold_outcome(self, operation_id: str, held: HeldOutcome) -> None: ...
    def hold_many(self, items: Sequence[tuple[str, HeldOutcome]]) -> None: ...
    def held_outcome(self, operation_id: str) -> HeldOutcome | None: ...

    # seeding, explorer, settings, gates
    def import_rows(self, tables: Mapping[str, pa.Table]) -> dict[str, int]: ...
    def record_explorer_run(self, run: ExplorerRun) -> int: ...
    def explorer_runs(self) -> list[dict[str, object]]: ...
    def put_setting(self, key: str, value: str, at: datetime) -> None: ...
    def setting(self, key: str) -> str | None: ...
    def gate_inputs(self, now: datetime) -> dict[str, dict[str, object]]: ...
    def take_turn(self, job: str, at: datetime, every: timedelta) -> bool: ...

    # the outbox's consumers
    def outbox_ready(self, consumer: str, after: int | None, limit: int) -> list[dict[str, object]]: ...
    def ack_outbox(
        self, consumer: str, call_node_id: str, status: str, result_digest: str | None, at: datetime
    ) -> OutboxAck: ...
    def outbox_lag(self) -> list[dict[str, object]]: ...

    def record_gate_run(self, results: Sequence[GateRecord], at: datetime) -> int: ...
    def gate_runs(self, limit: int = 500) -> list[dict[str, object]]: ...

    # access: refused control-API attempts
    def record_denial(self, row: dict[str, object]) -> None: ...
    def denials(self, *, limit: int = 100) -> list[dict[str, object]]: ...

    # rollout
    def rollout_state(self) -> dict[str, object] | None: ...
    def execution_epoch(self) -> int | None: ...
    def append_rollout_event(
        self, event: dict[str, object], state: dict[str, object], *, expected_seq: int, expected_epoch: int
    ) -> None: ...
    def rollout_events(
        self, *, limit: int | None = None, newest_first: bool = False
    ) -> list[dict[str, object]]: ...
    def record_assignments(self, rows: Sequence[dict[str, object]]) -> None: ...
    def assignments(self, *, limit: int = 1000) -> list[dict[str, object]]: ...
    def rollout_keys(self) -> list[tuple[str, str, str]]: ...
    def arm_counts(self) -> list[dict[str, object]]: ...
    def live_by_protocol(self) -> dict[str, dict[str, int]]: ...
    def shadow_pairs(self, *, ready_only: bool) -> list[tuple[str, str]]: ...
    def receipt_of_operation(self, operation_id: str) -> dict[str, object] | None: ...
    def poll_count(self, operation_id: str) -> int: ...
    def record_shadow_diff(self, row: dict[str, object]) -> bool: ...
    def shadow_diffs(self, *, diverged_only: bool = False, limit: int = 100) -> list[dict[str, object]]: ...
    def shadow_summary(self) -> dict[str, object]: ...
    def fenced_replies(self) -> int: ...

    # reads
    def list_operations(
        self,
        *,
        state: str | None = None,
        protocol: str | None = None,
        tool: str | None = None,
        principal: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, object]]: ...
    def state_counts(self) -> list[tuple[str, str, int]]: ...
    def poll_counts(self) -> list[tuple[str, int]]: ...
    def open_reconciliation_counts(self) -> list[tuple[str, int]]: ...
    def get(self, operation_id: str) -> Operation | None: ...
    def get_many(self, operation_ids: Sequence[str]) -> dict[str, Operation]: ...
    def by_call_node(self, call_node_id: str) -> Operation | None: ...
    def by_call_nodes(self, call_node_ids: Sequence[str]) -> dict[str, Operation]: ...
    def by_task(self, server: str, task_id: str) -> Operation | None: ...
    def by_key(self, key: str) -> Operation | None: ...
    def arguments(self, operation_id: str) -> Json: ...
    def operations(
        self, *, states: Sequence[LocalState] | None = None, limit: int | None = None
    ) -> list[Operation]: ...
    def receipt(self, call_node_id: str) -> Receipt | None: ...
    def result_payload(self, operation_id: str) -> Json | None: ...
    def transitions(self, operation_id: str) -> list[dict[str, object]]: ...
    def count(self, table: str) -> int: ...
    def table_columns(self) -> dict[str, list[str]]: ...
    def export_parquet(self, folder: str | Path) -> dict[str, int]: ...

    # what the backend can do
    @property
    def dialect(self) -> str:
        """The SQL the ledger's tables are read with: ``duckdb`` or ``postgres``."""
        ...

    @property
    def snapshots(self) -> SnapshotSource | None:
        """This ledger as one that copies itself to a file for analysts to read apart (DuckDB), or
        None: analysts read it in place (PostgreSQL). Callers ask this, never the backend's type."""
        ...

    @property
    def leasing(self) -> LeasingLedgerPort | None:
        """This ledger as one several executors share (leases, fencing, a shared QPS budget), or None.

        None: one process owns the ledger (DuckDB, memory). Callers ask this, never the backend's type.
        """
        ...


class LeasingLedgerPort(LedgerPort, Protocol):
    """A ledger several executor processes share: work is leased, writes are fenced (PostgreSQL only)."""

    def claim(
        self,
        owner: str,
        lease_token: str,
        limit: int,
        lease_s: float,
        now: datetime,
        *,
        epoch: int | None = None,
        servers: Sequence[str] | None = None,
    ) -> list[Operation]: ...
    def renew(
        self,
        owner: str,
        lease_token: str,
        lease_s: float,
        now: datetime,
        operation_ids: Sequence[str] | None = None,
    ) -> list[str]: ...
    def release(self, owner: str, lease_token: str, operation_ids: Sequence[str] | None = None) -> int: ...
    def lease_of(self, operation_id: str) -> Lease | None: ...
    def leases(self, *, owner: str | None = None) -> list[Lease]: ...
    def fenced(self, fence: Fence) -> Self: ...
    def book_send_slots(
        self, scopes: Sequence[str], caps: Sequence[int], first_slot: int, n: int
    ) -> list[int]: ...
    def prune_send_slots(self, before_slot: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Fence:
    """Who writes: an executor's lease token and execution epoch.

    A ``PgLedger.fenced(fence)`` handle writes an operation only while the operation's lease carries
    ``token`` and the ledger's execution epoch is not above ``epoch``. Operations it creates are
    leased to it for ``lease_s`` seconds from their ``created_at``.
    """

    owner: str
    token: str
    epoch: int
    lease_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Lease:
    """An operation's lease as ``op_state`` records it (all None when free)."""

    operation_id: str
    owner: str | None
    token: str | None
    epoch: int | None
    expires_at: datetime | None


__all__ = [
    "ApprovalRequest",
    "BatchOutcome",
    "ExplorerRun",
    "Fence",
    "GroupOutcome",
    "HeldOutcome",
    "Json",
    "Lease",
    "LeasingLedgerPort",
    "LedgerPort",
    "OutboxAck",
    "Outcomes",
    "PollRecord",
    "SnapshotSource",
    "WriteGroup",
    "refusals",
]
