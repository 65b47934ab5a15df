"""Simulated servers for the race explorer: one task store, three wire contracts.

A ``SimServer`` answers requests at the level of ``engine.adapters.base`` values (``Created``,
``ServerView``, ``Outcome``, ``CancelResult``), the way each protocol's adapter would report them:

* MCP 2025-11-25: ``tasks/get`` is status only; the outcome comes from ``tasks/result``; a cancel
  of a running task moves it to ``cancelled`` before replying (success is terminal evidence), a
  cancel of a terminal (or unknown) task is -32602.
* MCP 2026-07-28 (tasks extension): ``tasks/get`` carries the outcome inline; cancel is only an
  acknowledgement, and the task may still complete, fail or be cancelled later.
* AIP-151: ``GetOperation`` carries ``done`` plus ``response``/``error`` inline; cancel is best
  effort (acknowledged), a cancel that takes effect shows later as done with error code 1; a repeated
  create with the same ``request_id`` returns the same operation.

The server's own record (``SimTask.first_terminal``) is the oracle the explorer compares receipts
with. No I/O, no clock of its own (``now`` is passed in), no randomness.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from engine.adapters.base import CancelResult, Created, InputRequest, Outcome, ServerView
from engine.model import Digest, Epoch, IdempotencyKey, Protocol, ServerStatus, TaskId, digest_of

Json = dict[str, object]
P = Protocol
TERMINAL = frozenset({ServerStatus.COMPLETED, ServerStatus.FAILED, ServerStatus.CANCELLED})


class Kind(StrEnum):
    """What a request asks the server (the adapter method it stands for)."""

    SUBMIT = "submit"
    LOOKUP = "lookup"
    GET = "get"
    RESULT = "result"
    CANCEL = "cancel"
    INPUT = "input"
    AUDIT = "audit"


class Failure(StrEnum):
    """A reply that is not a value: the adapter raises (or, for ``ABSENT``, returns ``None``)."""

    NOT_FOUND = "not found"
    """``NotFoundOnServer``: 404, -32602 unknown task, ``NOT_FOUND``."""
    UNAVAILABLE = "unavailable"
    """``BackendUnavailable``: 429/503, a reset connection, a timeout."""
    CORRUPT = "truncated"
    """``ProtocolViolation``: the result failed verification (truncated, foreign, malformed)."""
    ABSENT = "proved absent"
    """A lookup by submission key proved that no operation was created."""


ReplyValue = Created | ServerView | Outcome | CancelResult | Failure


@dataclass(frozen=True, slots=True)
class Request:
    """One protocol request in flight. ``owner`` is the executor incarnation waiting for it."""

    rid: int
    kind: Kind
    owner: int
    epoch: Epoch
    task_id: TaskId | None = None
    key: IdempotencyKey | None = None
    generation: int = 0
    input_key: str | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to request ``rid``, travelling back to its owner."""

    rid: int
    kind: Kind
    owner: int
    value: ReplyValue


Message = Request | Reply


@dataclass(slots=True)
class SimTask:
    """One task/operation as the server holds it."""

    task_id: TaskId
    key: IdempotencyKey | None
    status: ServerStatus
    exec_epoch: Epoch
    """The execution epoch of the request that created it; outcomes echo it (as the refserver does)."""
    expires_at: datetime
    script_pos: int = 0
    input_key: str | None = None
    input_seq: int = 0
    cancel_requested: bool = False
    first_terminal: ServerStatus | None = None
    """The first terminal state the server entered: the truth a receipt must match."""
    digest: Digest | None = None
    """Digest of the outcome of ``first_terminal``."""
    deleted: bool = False
    late_done: bool = False

    def copy(self) -> SimTask:
        return SimTask(
            self.task_id,
            self.key,
            self.status,
            self.exec_epoch,
            self.expires_at,
            self.script_pos,
            self.input_key,
            self.input_seq,
            self.cancel_requested,
            self.first_terminal,
            self.digest,
            self.deleted,
            self.late_done,
        )


_PAYLOADS: dict[tuple[Protocol, TaskId, ServerStatus], tuple[Json, Digest]] = {}


def _payload(protocol: Protocol, task_id: TaskId, status: ServerStatus) -> tuple[Json, Digest]:
    """The outcome a task reports in ``status``, with its digest (kept: digests are costly)."""
    key = (protocol, task_id, status)
    hit = _PAYLOADS.get(key)
    if hit is None:
        payload = _outcome_payload(protocol, task_id, status)
        hit = _PAYLOADS[key] = (payload, digest_of(payload))
    return hit


def _outcome_payload(protocol: Protocol, task_id: TaskId, status: ServerStatus) -> Json:
    if status is ServerStatus.COMPLETED:
        return {"content": [{"type": "text", "text": f"report for {task_id}"}], "task": task_id}
    if status is ServerStatus.FAILED:
        return {"code": -32000, "message": "tool failed", "task": task_id}
    if protocol is P.AIP_151:
        return {"code": 1, "message": "CANCELLED", "task": task_id}
    return {"code": -32603, "message": "no result stored for a cancelled task", "task": task_id}


@dataclass(slots=True)
class SimServer:
    """The server side of one scenario: its tasks, its work script and its wire contract."""

    protocol: Protocol
    script: tuple[str, ...]
    """What the work does, in order: ``progress``, ``input`` (ask for input), ``complete`` or ``fail``."""
    lookup_by_key: bool
    ttl: timedelta
    reuse_id: TaskId | None = None
    """Hand out this (already used) id to the first task created: a server reusing task ids."""
    flip: bool = False
    """Non-compliant: after a cancel won, the finished work shows as ``completed`` on later reads."""
    echo_creation_epoch: bool = False
    """Outcomes echo the epoch the task was created under (the refserver's way) instead of the
    epoch of the request they answer (what the adapters document: "the executor's epoch")."""
    tasks: dict[TaskId, SimTask] = field(default_factory=dict)
    by_key: dict[IdempotencyKey, TaskId] = field(default_factory=dict)
    created: list[TaskId] = field(default_factory=list)
    version: int = 0

    # --------------------------------------------------------------------------------- helpers

    def main_task(self) -> SimTask | None:
        """The first task created in this run (the one the call node's receipt must describe)."""
        return self.tasks.get(self.created[0]) if self.created else None

    def _create(self, key: IdempotencyKey | None, epoch: Epoch, now: datetime) -> SimTask:
        task_id = self.reuse_id if self.reuse_id is not None and not self.created else None
        task_id = task_id or TaskId(f"t{len(self.created) + 1}")
        task = SimTask(task_id, key, ServerStatus.WORKING, epoch, now + self.ttl)
        self.tasks[task_id] = task
        self.created.append(task_id)
        if key is not None and self.lookup_by_key:
            self.by_key[key] = task_id
        self.version += 1
        return task

    def _outcome(self, task: SimTask, status: ServerStatus, epoch: Epoch) -> Outcome:
        payload, digest = _payload(self.protocol, task.task_id, status)
        echo = task.exec_epoch if self.echo_creation_epoch else epoch
        return Outcome(status, payload, digest, task.task_id, echo)

    def view(self, task: SimTask, epoch: Epoch) -> ServerView:
        """What a status read shows: the outcome inline on 2026-07-28 and AIP-151."""
        request = None
        if task.status is ServerStatus.INPUT_REQUIRED and task.input_key is not None:
            request = InputRequest(task.input_key, "need input", {}, Digest("sha256:schema"))
        outcome = None
        if task.status.terminal and self.protocol is not P.MCP_2025_11_25:
            outcome = self._outcome(task, task.status, epoch)
        return ServerView(
            task.task_id, task.status, expires_at=task.expires_at, input_request=request, outcome=outcome
        )

    def _finish(self, task: SimTask, status: ServerStatus) -> None:
        task.status = status
        task.input_key = None
        if task.first_terminal is None:
            task.first_terminal = status
            task.digest = _payload(self.protocol, task.task_id, status)[1]
        self.version += 1

    # -------------------------------------------------------------------------------- requests

    def handle(self, request: Request, now: datetime) -> ReplyValue | None:
        """Process one delivered request; ``None`` when the request gets no reply worth modelling."""
        match request.kind:
            case Kind.SUBMIT | Kind.LOOKUP:
                key = request.key
                if key is not None and key in self.by_key:
                    # AIP-155 request_id / SEP-3182 idempotency key: the same single call.
                    existing = self.tasks[self.by_key[key]]
                    view = self.view(existing, request.epoch)
                    return Created(view) if request.kind is Kind.SUBMIT else view
                created = self._create(key, request.epoch, now)
                view = self.view(created, request.epoch)
                return Created(view) if request.kind is Kind.SUBMIT else view
            case Kind.GET:
                live = self._live(request.task_id)
                return Failure.NOT_FOUND if live is None else self.view(live, request.epoch)
            case Kind.RESULT | Kind.AUDIT:
                live = self._live(request.task_id)
                if live is None:
                    return Failure.NOT_FOUND
                if live.status not in TERMINAL:
                    # 2025 tasks/result would block; 2026/AIP re-read a running task: no outcome.
                    return Failure.UNAVAILABLE if self.protocol is P.MCP_2025_11_25 else Failure.CORRUPT
                return self._outcome(live, live.status, request.epoch)
            case Kind.CANCEL:
                return self._cancel(request)
            case Kind.INPUT:
                live = self._live(request.task_id)
                if (
                    live is not None
                    and live.status is ServerStatus.INPUT_REQUIRED
                    and live.input_key == request.input_key
                ):
                    live.status = ServerStatus.WORKING
                    live.input_key = None
                    self.version += 1
                # Stale or repeated keys change nothing (2026: servers ignore stale keys).
                return None

    def _live(self, task_id: TaskId | None) -> SimTask | None:
        task = self.tasks.get(task_id) if task_id is not None else None
        return None if task is None or task.deleted else task

    def _cancel(self, request: Request) -> ReplyValue:
        task = self._live(request.task_id)
        if self.protocol is P.MCP_2025_11_25:
            if task is None or task.status.terminal:
                # -32602 covers both "terminal" and "unknown id"; the adapter reads it as terminal.
                return CancelResult.ALREADY_TERMINAL
            self._finish(task, ServerStatus.CANCELLED)
            return CancelResult.CONFIRMED
        if task is None:
            return Failure.NOT_FOUND
        if not task.status.terminal and not task.cancel_requested:
            task.cancel_requested = True
            self.version += 1
        return CancelResult.ACKNOWLEDGED

    # ------------------------------------------------------------------------------ server work

    def work(self) -> list[tuple[str, TaskId]]:
        """The internal steps the server may take next, as ``(action, task id)``, in a fixed order."""
        out: list[tuple[str, TaskId]] = []
        for task in self.tasks.values():
            if task.deleted:
                continue
            if task.status not in TERMINAL:
                if task.status is ServerStatus.WORKING and task.script_pos < len(self.script):
                    out.append((self.script[task.script_pos], task.task_id))
                elif task.status is ServerStatus.INPUT_REQUIRED and task.script_pos < len(self.script):
                    # The work may also end while it waits for input.
                    nxt = self._next_terminal(task)
                    if nxt is not None:
                        out.append((nxt, task.task_id))
                if task.cancel_requested:
                    out.append(("honour-cancel", task.task_id))
            elif (
                task.first_terminal is ServerStatus.CANCELLED
                and self.flip
                and not task.late_done
                and task.status is ServerStatus.CANCELLED
            ):
                out.append(("finish-late", task.task_id))
        return out

    def _next_terminal(self, task: SimTask) -> str | None:
        rest = self.script[task.script_pos :]
        return next((s for s in rest if s in ("complete", "fail")), None)

    def do_work(self, action: str, task_id: TaskId) -> None:
        task = self.tasks[task_id]
        match action:
            case "progress":
                # The work moves on without changing status (a new status message on the next read).
                task.script_pos += 1
                self.version += 1
            case "input":
                task.input_seq += 1
                task.status = ServerStatus.INPUT_REQUIRED
                task.input_key = f"{task_id}/in{task.input_seq}"
                task.script_pos += 1
                self.version += 1
            case "complete" | "fail":
                task.script_pos = len(self.script)
                status = ServerStatus.COMPLETED if action == "complete" else ServerStatus.FAILED
                self._finish(task, status)
            case "honour-cancel":
                self._finish(task, ServerStatus.CANCELLED)
            case "finish-late":
                # The work ran to its end after the cancel won; this server then shows it.
                task.late_done = True
                task.status = ServerStatus.COMPLETED
                self.version += 1
            case _:
                raise ValueError(f"unknown server work {action!r}")

    def evict(self, task_id: TaskId) -> None:
        """Lose or delete a task: later reads answer "not found"."""
        self.tasks[task_id].deleted = True
        self.version += 1

    def clone(self) -> SimServer:
        """An independent copy (tasks are mutable and copied one by one)."""
        return SimServer(
            self.protocol,
            self.script,
            self.lookup_by_key,
            self.ttl,
            self.reuse_id,
            self.flip,
            self.echo_creation_epoch,
            {task_id: task.copy() for task_id, task in self.tasks.items()},
            dict(self.by_key),
            list(self.created),
            self.version,
        )

    def state_key(self) -> tuple[object, ...]:
        """The server's state without its version counter (only ever compared for equality)."""
        return (
            tuple(
                (
                    t.task_id,
                    t.key,
                    t.status,
                    t.exec_epoch,
                    t.expires_at,
                    t.script_pos,
                    t.input_key,
                    t.input_seq,
                    t.cancel_requested,
                    t.first_terminal,
                    t.digest,
                    t.deleted,
                    t.late_done,
                )
                for t in self.tasks.values()
            ),
            tuple(self.by_key.items()),
            tuple(self.created),
        )


def value_key(value: ReplyValue) -> object:
    """A hashable stand-in for a reply value (payloads are dictionaries; their digests stand in)."""
    if isinstance(value, Outcome):
        return ("outcome", value.status, value.digest, value.task_id, value.epoch_echo)
    if isinstance(value, Created):
        return ("created", value_key(value.view))
    if isinstance(value, ServerView):
        request = value.input_request.key if value.input_request is not None else None
        outcome = value_key(value.outcome) if value.outcome is not None else None
        return ("view", value.task_id, value.status, value.expires_at, request, outcome)
    return value


__all__ = [
    "TERMINAL",
    "Failure",
    "Json",
    "Kind",
    "Message",
    "P",
    "Reply",
    "ReplyValue",
    "Request",
    "SimServer",
    "SimTask",
    "value_key",
]
