"""Value types of the engine: the ``toolOperation.v1`` record, local states, server statuses, events and effects.

Everything here is a frozen value. No I/O, no clock, no randomness: the transition function in
``engine.machine`` is the only thing that turns one operation value into the next.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import NewType

SCHEMA_VERSION = "toolOperation.v1"

CallNodeId = NewType("CallNodeId", str)
OperationId = NewType("OperationId", str)
"""Finality's own id for an operation row (never sent to a server)."""
TaskId = NewType("TaskId", str)
"""The server's id: an MCP ``taskId`` or an AIP-151 operation ``name``."""
IdempotencyKey = NewType("IdempotencyKey", str)
Digest = NewType("Digest", str)
Epoch = NewType("Epoch", int)
Principal = NewType("Principal", str)

_KEY_NAMESPACE = uuid.UUID("6f1d1c3e-6a59-4cf5-9a55-9b1f1f0a7e11")


class LocalState(StrEnum):
    """Where Finality stands with an operation. Never a wire word; see ``ServerStatus`` for those."""

    SUBMITTING = "SUBMITTING"
    WORKING = "WORKING"
    INPUT_REQUIRED = "INPUT_REQUIRED"
    SUBMISSION_UNKNOWN = "SUBMISSION_UNKNOWN"
    NOT_FOUND_SAFE = "NOT_FOUND_SAFE"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    TERMINAL_OBSERVED = "TERMINAL_OBSERVED"
    FETCHING_RESULT = "FETCHING_RESULT"
    ACCEPTED = "ACCEPTED"
    CANCELLED_ACCEPTED = "CANCELLED_ACCEPTED"
    NEVER_CREATED = "NEVER_CREATED"
    EXPIRED_WITH_RECEIPT = "EXPIRED_WITH_RECEIPT"
    UNKNOWN = "UNKNOWN"


RECEIPT_STATES = frozenset({LocalState.ACCEPTED, LocalState.CANCELLED_ACCEPTED})
"""States that hold a terminal receipt. They absorb every later event."""

POLLING_STATES = frozenset(
    {
        LocalState.WORKING,
        LocalState.CANCEL_REQUESTED,
        LocalState.TERMINAL_OBSERVED,
        LocalState.FETCHING_RESULT,
    }
)
"""States in which the executor keeps talking to the server on its own."""

RECONCILIATION_STATES = frozenset({LocalState.UNKNOWN})
"""States that wait for a person: nothing moves them but a reconciliation decision."""


class ServerStatus(StrEnum):
    """The server's own view of the operation, normalised across protocols by the adapters.

    MCP reports ``working/input_required/completed/failed/cancelled``; AIP-151 reports ``done`` plus
    ``error`` or ``response``, which the adapter maps to ``COMPLETED``, ``FAILED`` or (error code 1)
    ``CANCELLED``.
    """

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (ServerStatus.COMPLETED, ServerStatus.FAILED, ServerStatus.CANCELLED)


class Protocol(StrEnum):
    """A protocol adapter, by wire contract version. Similar-looking URLs never make two the same."""

    MCP_2025_11_25 = "mcp-2025-11-25"
    MCP_2026_07_28 = "mcp-2026-07-28"
    AIP_151 = "aip-151"
    LEGACY_SYNC = "legacy-sync"


class Role(StrEnum):
    """Whether an operation's receipt may advance the caller (primary) or is only compared (shadow)."""

    PRIMARY = "primary"
    SHADOW = "shadow"


class NotFoundClass(StrEnum):
    """How a "not found" from the server is read, per the seed's expiry/404 rule."""

    NEVER_CREATED = "NEVER_CREATED"
    EXPIRED_WITH_RECEIPT = "EXPIRED_WITH_RECEIPT"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True, slots=True)
class ToolRef:
    """Which tool, at which version, described by which descriptor version."""

    name: str
    version: str
    descriptor_version: str
    side_effects: bool = True
    """True unless the tool is declared side-effect-free; unknown tools are assumed to have effects."""


@dataclass(frozen=True, slots=True)
class Operation:
    """``toolOperation.v1``: one durable record per long-running tool call node.

    ``row_version`` grows by one with every write and is what compare-and-swap writes match.
    """

    operation_id: OperationId
    call_node_id: CallNodeId
    request_digest: Digest
    tool: ToolRef
    principal: Principal
    protocol: Protocol
    adapter_version: str
    server: str
    idempotency_key: IdempotencyKey
    state: LocalState
    epoch: Epoch
    created_at: datetime
    updated_at: datetime
    role: Role = Role.PRIMARY
    task_id: TaskId | None = None
    poll_cursor: str | None = None
    server_status: ServerStatus | None = None
    input_round: int = 0
    answered_round: int = 0
    input_request_key: str | None = None
    cancel_generation: int = 0
    cancel_requested_at: datetime | None = None
    expires_at: datetime | None = None
    result_digest: Digest | None = None
    result_held: bool = False
    effect_reconciliation_required: bool = False
    submit_attempts: int = 0
    row_version: int = 0
    schema_version: str = SCHEMA_VERSION

    @property
    def has_receipt(self) -> bool:
        return self.state in RECEIPT_STATES


@dataclass(frozen=True, slots=True)
class Receipt:
    """A terminal receipt: the one fact the calling node may consume."""

    call_node_id: CallNodeId
    operation_id: OperationId
    request_digest: Digest
    task_id: TaskId | None
    tool_version: str
    epoch: Epoch
    cancel_generation: int
    status: ServerStatus
    result_digest: Digest | None
    accepted_at: datetime
    cancel_evidence: str | None = None
    """Why a cancelled terminal was accepted (e.g. the cancel response); ``None`` otherwise."""
    audit_result_digest: Digest | None = None
    """Digest of a result read after cancel: attached for audit, never a success payload."""


# ----------------------------------------------------------------------------------------- events
# Events are facts that already happened: something the server said, or something a person asked.
# Server-originated events carry the epoch of the executor that sent the request, so that a reply
# to an older execution is fenced.


@dataclass(frozen=True, slots=True)
class Submitted:
    """The server returned a queryable id for the submission (or a key lookup found it)."""

    task_id: TaskId
    epoch: Epoch
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SubmissionLost:
    """The connection broke (or timed out) before the server returned an id."""

    epoch: Epoch
    reason: str


@dataclass(frozen=True, slots=True)
class InlineResultReturned:
    """The server answered the submission with the final outcome itself (no task was created).

    Also how a submission the server refused before starting any work ends: ``FAILED``, with the
    error as the outcome to fetch and verify.
    """

    status: ServerStatus
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class LookupFound:
    """A lookup by the submission key found the operation the lost submission created."""

    task_id: TaskId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class LookupProvedAbsent:
    """The server proved, by the submission key, that no operation was created."""

    epoch: Epoch


@dataclass(frozen=True, slots=True)
class LookupUnavailable:
    """The server cannot look operations up by key: a person must find the operation."""

    epoch: Epoch
    reason: str


@dataclass(frozen=True, slots=True)
class Resubmitted:
    """A new submission under the SAME key.

    Without ``actor`` it is the driver's, allowed only because the server proved by the key that
    the first one never existed; with ``actor`` it is a person's decision (after they declared the
    operation absent), recorded with their reason.
    """

    epoch: Epoch
    actor: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StatusObserved:
    """A poll returned the server's status.

    ``input_request_key`` identifies the input round when the status is ``INPUT_REQUIRED``;
    a key equal to the round already answered is a replay.
    """

    task_id: TaskId
    status: ServerStatus
    epoch: Epoch
    poll_cursor: str | None = None
    input_request_key: str | None = None
    expires_at: datetime | None = None
    result_held: bool = False
    """The reply carried the terminal outcome itself (2026-07-28 ``DetailedTask``, AIP-151 ``done``)
    and the executor now holds it, so it survives the server expiring the operation."""


@dataclass(frozen=True, slots=True)
class InputAnswered:
    """A person answered the input request of one round."""

    input_round: int
    actor: str


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """Someone asked to cancel. ``generation`` must be the next cancel generation."""

    generation: int
    actor: str
    reason: str


@dataclass(frozen=True, slots=True)
class CancelConfirmed:
    """The server confirmed the cancelled terminal state (MCP 2025-11-25 cancel success response)."""

    task_id: TaskId
    generation: int
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class CancelAcknowledged:
    """The server acknowledged the cancel without confirming a terminal state (2026-07-28, AIP-151)."""

    task_id: TaskId
    generation: int
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class CancelRefusedTerminal:
    """The server refused the cancel because the task was already terminal (-32602 on 2025-11-25)."""

    task_id: TaskId
    generation: int
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class FetchStarted:
    """The executor began fetching the terminal result."""

    epoch: Epoch


@dataclass(frozen=True, slots=True)
class ResultVerified:
    """The result was fetched, parsed, bound to this task and verified; its digest is known."""

    task_id: TaskId | None
    status: ServerStatus
    result_digest: Digest
    epoch: Epoch
    """The epoch of the executor that fetched the result (never the server's echo)."""
    epoch_echo: Epoch | None = None
    """The execution epoch the server echoed with the result, if it echoes one. Both it and
    ``epoch`` must match the operation's: an echo never stands in for the fetching executor's."""


@dataclass(frozen=True, slots=True)
class ResultRejected:
    """The result was fetched but failed verification (wrong task, too large, schema mismatch)."""

    reason: str
    epoch: Epoch
    result_digest: Digest | None = None
    """The digest of the candidate result that failed, when one could be read (for the person)."""


@dataclass(frozen=True, slots=True)
class NotFound:
    """The server does not know the operation (404, -32602, ``NOT_FOUND``).

    ``proved_never_created`` is set only when a lookup by submission key proved it never existed.
    """

    epoch: Epoch
    proved_never_created: bool = False


@dataclass(frozen=True, slots=True)
class Reconciled:
    """A person resolved an UNKNOWN operation: bound it to the server's task, or declared it absent.

    "Absent" ends the wait without a receipt (NOT_FOUND_SAFE); it never resubmits by itself."""

    actor: str
    reason: str
    task_id: TaskId | None


@dataclass(frozen=True, slots=True)
class EpochRaised:
    """Rollback raised the execution epoch; the operation now belongs to the new executor."""

    epoch: Epoch
    actor: str


Event = (
    Submitted
    | SubmissionLost
    | InlineResultReturned
    | LookupFound
    | LookupProvedAbsent
    | LookupUnavailable
    | Resubmitted
    | StatusObserved
    | InputAnswered
    | CancelRequested
    | CancelConfirmed
    | CancelAcknowledged
    | CancelRefusedTerminal
    | FetchStarted
    | ResultVerified
    | ResultRejected
    | NotFound
    | Reconciled
    | EpochRaised
)


# ---------------------------------------------------------------------------------------- effects
# Effects are what the executor must do next. The machine never performs them.


@dataclass(frozen=True, slots=True)
class Submit:
    key: IdempotencyKey


@dataclass(frozen=True, slots=True)
class LookUp:
    key: IdempotencyKey


@dataclass(frozen=True, slots=True)
class Poll:
    pass


@dataclass(frozen=True, slots=True)
class FetchResult:
    pass


@dataclass(frozen=True, slots=True)
class SendCancel:
    generation: int


@dataclass(frozen=True, slots=True)
class AwaitApproval:
    input_round: int
    input_request_key: str | None


@dataclass(frozen=True, slots=True)
class SendInput:
    input_round: int
    input_request_key: str | None


@dataclass(frozen=True, slots=True)
class OpenReconciliation:
    reason: str


@dataclass(frozen=True, slots=True)
class AcceptTerminal:
    """Write the receipt (and, for a primary operation, one ready outbox entry) in one transaction."""

    receipt: Receipt


@dataclass(frozen=True, slots=True)
class FlagEffectReconciliation:
    reason: str


Effect = (
    Submit
    | LookUp
    | Poll
    | FetchResult
    | SendCancel
    | AwaitApproval
    | SendInput
    | OpenReconciliation
    | AcceptTerminal
    | FlagEffectReconciliation
)


@dataclass(frozen=True, slots=True)
class Transition:
    """What ``step`` decided: the next operation value, what to do, and how to record it.

    ``accepted`` is False for an illegal or stale event; the operation is then unchanged and
    ``reason`` says why, to be recorded as a rejected transition.
    """

    before: Operation
    after: Operation
    event: Event
    effects: tuple[Effect, ...]
    accepted: bool
    reason: str
    at: datetime
    logged: bool = True
    """False only for a status report that repeats what the operation already holds (the task is
    still working, nothing else new): the ledger still compares it with the row as it is, so a late
    or stale one is refused like any other write (and its retry against the row it finds is logged
    as refused), but it keeps no ``transitions`` row for it: the request is in ``polls``."""

    @property
    def state_changed(self) -> bool:
        return self.before.state != self.after.state


# --------------------------------------------------------------------------------------- helpers


def canonical_json(value: object) -> str:
    """The JSON text digests are computed over: sorted keys, no whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest_of(value: object) -> Digest:
    """``sha256:<hex>`` over the canonical JSON of ``value``."""
    return Digest("sha256:" + hashlib.sha256(canonical_json(value).encode()).hexdigest())


def digest_bytes(data: bytes) -> Digest:
    return Digest("sha256:" + hashlib.sha256(data).hexdigest())


def submission_key(call_node_id: CallNodeId, request_digest: Digest) -> IdempotencyKey:
    """The one submission key of a call node: a UUID derived from call node and request.

    Deterministic so that a crash between choosing the key and recording it cannot mint a second key.
    """
    return IdempotencyKey(str(uuid.uuid5(_KEY_NAMESPACE, f"{call_node_id}\n{request_digest}")))


@dataclass(frozen=True, slots=True)
class CallRequest:
    """What a caller asks for: one tool call at one call node."""

    call_node_id: CallNodeId
    tool: ToolRef
    arguments: dict[str, object] = field(default_factory=dict)
    principal: Principal = Principal("anonymous")

    @property
    def request_digest(self) -> Digest:
        return digest_of({"tool": self.tool.name, "version": self.tool.version, "arguments": self.arguments})


def request_mismatch(op: Operation, request: CallRequest, *, server: str | None = None) -> str | None:
    """Which field of ``request`` differs from the request call node ``op`` already holds; ``None``
    when it is the same request (so the call node may resume or return ``op``).

    One rule for every caller (``finality call``, the service): a call node names one request, so
    another tool, other arguments, another server (when the caller names one) or another principal
    are refused, never answered with this operation's result. Checked in that order.
    """
    if op.tool.name != request.tool.name or op.tool.version != request.tool.version:
        return "tool"
    if op.request_digest != request.request_digest:
        return "arguments digest"
    if server is not None and op.server != server:
        return "server"
    if op.principal != request.principal:
        return "principal"
    return None


def new_operation(
    request: CallRequest,
    *,
    operation_id: OperationId,
    protocol: Protocol,
    adapter_version: str,
    server: str,
    epoch: Epoch,
    now: datetime,
    role: Role = Role.PRIMARY,
) -> Operation:
    """A fresh operation in SUBMITTING, with its one submission key."""
    digest = request.request_digest
    return Operation(
        operation_id=operation_id,
        call_node_id=request.call_node_id,
        request_digest=digest,
        tool=request.tool,
        principal=request.principal,
        protocol=protocol,
        adapter_version=adapter_version,
        server=server,
        idempotency_key=submission_key(request.call_node_id, digest),
        state=LocalState.SUBMITTING,
        epoch=epoch,
        created_at=now,
        updated_at=now,
        role=role,
    )


@dataclass(frozen=True, slots=True)
class GateRecord:
    """One gate's verdict as ``gate_runs`` stores it."""

    gate: str
    passed: bool
    value: float | None
    threshold: float | None
    verdict: str
    inputs: dict[str, object]


__all__ = [
    "POLLING_STATES",
    "RECEIPT_STATES",
    "RECONCILIATION_STATES",
    "SCHEMA_VERSION",
    "AcceptTerminal",
    "AwaitApproval",
    "CallNodeId",
    "CallRequest",
    "CancelAcknowledged",
    "CancelConfirmed",
    "CancelRefusedTerminal",
    "CancelRequested",
    "Digest",
    "Effect",
    "Epoch",
    "EpochRaised",
    "Event",
    "FetchResult",
    "FetchStarted",
    "FlagEffectReconciliation",
    "GateRecord",
    "IdempotencyKey",
    "InlineResultReturned",
    "InputAnswered",
    "LocalState",
    "LookUp",
    "LookupFound",
    "LookupProvedAbsent",
    "LookupUnavailable",
    "NotFound",
    "NotFoundClass",
    "OpenReconciliation",
    "Operation",
    "OperationId",
    "Poll",
    "Principal",
    "Protocol",
    "Receipt",
    "Reconciled",
    "Resubmitted",
    "ResultRejected",
    "ResultVerified",
    "Role",
    "SendCancel",
    "SendInput",
    "ServerStatus",
    "StatusObserved",
    "SubmissionLost",
    "Submit",
    "Submitted",
    "TaskId",
    "ToolRef",
    "Transition",
    "canonical_json",
    "digest_bytes",
    "digest_of",
    "new_operation",
    "submission_key",
]
