"""The server-side task state machine, shared by all three protocols. Pure: no I/O, no clock.

A task's work is a timeline, not a coroutine: ``input_rounds + 1`` equal work segments separated by
input rounds. Every method takes ``now`` (monotonic seconds) and first *advances* the task through
whatever happened up to ``now``, in time order, so the result depends only on the call sequence and
the times given. Terminal states absorb every later event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from refserver.fault import Fault, FaultBook
from refserver.sim import SimSpec
from refserver.tool import Outcome, ToolFailure, ToolOutput, declined_outcome


class Status(StrEnum):
    """The server's task status; the MCP words, which AIP-151 renders as ``done`` plus a result."""

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})


class Retention(StrEnum):
    """Where the task's ttl is counted from."""

    FROM_CREATION = "from_creation"
    FROM_COMPLETION = "from_completion"


class AnswerResult(StrEnum):
    ACCEPTED = "accepted"
    STALE = "stale"
    UNKNOWN = "unknown"


class CancelRejected(Exception):
    """Synchronous cancel of a task that is already terminal (MCP 2025-11-25 answers -32602)."""

    def __init__(self, status: Status) -> None:
        super().__init__(f"task is already {status.value}")
        self.status = status


ELICITATION_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Approve this step"},
        "note": {"type": "string", "title": "Note"},
    },
    "required": ["approve"],
}


@dataclass(frozen=True, slots=True)
class InputRound:
    """One request for input; ``key`` is unique per task and doubles as the JSON-RPC id on 2025-11-25."""

    key: str
    number: int
    message: str


@dataclass(frozen=True, slots=True)
class View:
    """What one read of the task shows."""

    status: Status
    status_message: str | None
    updated_at: float
    progress: float
    input_round: InputRound | None = None
    outcome: Outcome | None = None
    stale: bool = False


class Task:
    """One task (MCP) or operation (AIP-151) and everything that happened to it."""

    def __init__(
        self,
        *,
        task_id: str,
        tool: str,
        echo: Mapping[str, Any],
        sim: SimSpec,
        principal: str | None,
        key: str | None,
        request_digest: str,
        epoch: int | None,
        created_at: float,
        ttl_s: float | None,
        retention: Retention,
        is_error_fails: bool,
        planned: Outcome,
        faults: FaultBook,
        ttl_bump_s: float = 0.0,
    ) -> None:
        self.task_id = task_id
        self.tool = tool
        self.echo = dict(echo)
        self.sim = sim
        self.principal = principal
        self.key = key
        self.request_digest = request_digest
        self.epoch = epoch
        self.created_at = created_at
        self.ttl_s = ttl_s
        self.retention = retention
        self.is_error_fails = is_error_fails
        self.planned = planned
        self.faults = faults
        self.ttl_bump_s = ttl_bump_s

        self.status = Status.WORKING
        self.status_message: str | None = None
        self.updated_at = created_at
        self.segment_s = sim.duration_s / (sim.input_rounds + 1)
        self.segment_started_at = created_at
        self.rounds_answered = 0
        self.answers: dict[str, dict[str, Any]] = {}
        self.cancel_requested_at: float | None = None
        self.cancel_at: float | None = None
        self.terminal_at: float | None = None
        self.outcome: Outcome | None = None
        self.result_epoch: int | None = epoch
        self.deleted_at: float | None = None
        self.deleted_reason: str | None = None
        self._last_served: View | None = None
        self._replay: InputRound | None = None
        self._replay_for_get = False
        self._replay_for_stream = False

    # -- reading -----------------------------------------------------------------------------------

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def deleted(self) -> bool:
        return self.deleted_at is not None

    def pending_round(self) -> InputRound | None:
        if self.status is not Status.INPUT_REQUIRED:
            return None
        return self._round(self.rounds_answered + 1)

    def _round(self, number: int) -> InputRound:
        return InputRound(
            key=f"round-{self.task_id}-{number}",
            number=number,
            message=f"{self.tool}: approve step {number} of {self.sim.input_rounds}?",
        )

    def progress(self, now: float) -> float:
        total = self.sim.duration_s
        if self.status is Status.COMPLETED:
            return 1.0
        if total <= 0:
            return 0.0
        done = self.rounds_answered + (1 if self.status is Status.INPUT_REQUIRED else 0)
        elapsed = done * self.segment_s
        if self.status is Status.WORKING:
            elapsed += min(self.segment_s, max(0.0, now - self.segment_started_at))
        return min(1.0, elapsed / total)

    def next_event_at(self) -> float | None:
        """When the task will next change by itself (for waiters); ``None`` if only a client can move it."""
        if self.terminal:
            return None
        candidates = [self.cancel_at] if self.cancel_at is not None else []
        if self.status is Status.WORKING:
            candidates.append(self.segment_started_at + self.segment_s)
        return min(candidates) if candidates else None

    def expires_at(self) -> float | None:
        """When the task is deleted; a task is never deleted before it is terminal."""
        if self.terminal_at is None:
            return None
        if self.faults.has(Fault.EXPIRE_EARLY):
            return self.terminal_at
        if self.ttl_s is None:
            return None
        if self.retention is Retention.FROM_CREATION:
            return max(self.created_at + self.ttl_s, self.terminal_at)
        return self.terminal_at + self.ttl_s

    def view(self, now: float, *, consume_replay: bool = True) -> View:
        """The current state as a poll sees it; may present a replayed input round once."""
        self.advance(now)
        if (
            consume_replay
            and self._replay_for_get
            and self._replay is not None
            and self.status is Status.WORKING
        ):
            self._replay_for_get = False
            view = View(
                Status.INPUT_REQUIRED,
                f"waiting for input round {self._replay.number}",
                self.updated_at,
                self.progress(now),
                input_round=self._replay,
            )
        else:
            view = View(
                self.status,
                self.status_message,
                self.updated_at,
                self.progress(now),
                input_round=self.pending_round(),
                outcome=self.outcome,
            )
        if view.status not in TERMINAL:
            self._last_served = view
        return view

    def stale_view(self) -> View:
        """The last non-terminal snapshot a reader was shown (or the initial one), marked stale."""
        base = self._last_served or View(Status.WORKING, None, self.created_at, 0.0)
        return View(
            base.status, base.status_message, base.updated_at, base.progress, base.input_round, None, True
        )

    @property
    def stream_replay_due(self) -> bool:
        return self._replay_for_stream and self._replay is not None and not self.terminal

    def take_stream_replay(self) -> InputRound | None:
        """The replayed round to re-send once on a ``tasks/result`` stream, if any is due."""
        if self._replay_for_stream and self._replay is not None and not self.terminal:
            self._replay_for_stream = False
            return self._replay
        return None

    def knows_round(self, key: str) -> bool:
        pending = self.pending_round()
        return key in self.answers or (pending is not None and pending.key == key)

    # -- moving ------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Apply every scheduled change up to ``now`` in time order (work before cancel on a tie)."""
        while not self.terminal:
            events: list[tuple[float, int]] = []
            if self.status is Status.WORKING:
                events.append((self.segment_started_at + self.segment_s, 0))
            if self.cancel_at is not None:
                events.append((self.cancel_at, 1))
            if not events:
                return
            at, kind = min(events)
            if at > now:
                return
            if kind == 0:
                self._segment_done(at)
            else:
                self._settle(Status.CANCELLED, None, at, "cancelled by request")

    def _segment_done(self, at: float) -> None:
        if self.rounds_answered < self.sim.input_rounds:
            self.status = Status.INPUT_REQUIRED
            self.status_message = f"waiting for input round {self.rounds_answered + 1}"
            self.updated_at = at
        else:
            self._finish(self.planned, at)

    def _finish(self, outcome: Outcome, at: float) -> None:
        if isinstance(outcome, ToolFailure):
            self._settle(Status.FAILED, outcome, at, outcome.message)
        elif outcome.is_error and self.is_error_fails:
            self._settle(Status.FAILED, outcome, at, "the tool reported an error (isError)")
        else:
            self._settle(Status.COMPLETED, outcome, at, None)

    def _settle(self, status: Status, outcome: Outcome | None, at: float, message: str | None) -> None:
        if self.terminal:
            return
        self.status = status
        self.status_message = message
        self.outcome = outcome
        self.updated_at = at
        self.terminal_at = at
        self.ttl_s = None if self.ttl_s is None else self.ttl_s + self.ttl_bump_s
        if outcome is not None and self.faults.take(Fault.STALE_EPOCH_RESULT, "result"):
            self.result_epoch = (self.epoch or 0) - 1
        elif outcome is not None and self.faults.take(Fault.FUTURE_EPOCH_RESULT, "result"):
            self.result_epoch = (self.epoch or 0) + 1

    def echo_for(self, request_epoch: int | None) -> int | None:
        """The execution epoch a reply carrying the result echoes.

        A reply belongs to the request that fetched it: when that request states its executor's
        epoch, that is echoed; otherwise the creating request's. The ``stale_epoch_result`` fault
        makes the echo one less, as a reply from an older executor would be, and
        ``future_epoch_result`` one more, as a reply meant for a newer executor would be.
        """
        offset = 0
        if self.result_epoch is not None and self.epoch is not None:
            offset = self.result_epoch - self.epoch
        elif self.result_epoch is not None:
            offset = self.result_epoch
        base = request_epoch if request_epoch is not None else self.epoch
        if base is None:
            return self.result_epoch
        return base + offset

    def answer(self, key: str, response: Mapping[str, Any], now: float) -> AnswerResult:
        """Apply the client's answer to input round ``key``; stale and unknown keys change nothing.

        ``response`` is an elicitation result: ``action`` ``accept`` resumes the work, anything else
        ends the task with an ``isError`` tool result, as a real tool would report a refusal.
        """
        self.advance(now)
        pending = self.pending_round()
        if pending is None or pending.key != key:
            return AnswerResult.STALE if key in self.answers else AnswerResult.UNKNOWN
        self.answers[key] = dict(response)
        self.rounds_answered += 1
        action = response.get("action")
        if action != "accept":
            self._finish(declined_outcome(self.tool, self.echo, pending.number, str(action)), now)
            return AnswerResult.ACCEPTED
        self.status = Status.WORKING
        self.status_message = None
        self.updated_at = now
        self.segment_started_at = now
        if self.faults.take(Fault.INPUT_REPLAYED, "answer"):
            self._replay = pending
            self._replay_for_get = True
            self._replay_for_stream = True
        self.advance(now)
        return AnswerResult.ACCEPTED

    def _complete_if_faulted(self, now: float) -> None:
        if not self.terminal and self.faults.take(Fault.COMPLETE_ON_CANCEL, "cancel"):
            # The work "finishes" in the instant the cancel arrives, whatever rounds were left.
            self._finish(self.planned, now)

    def cancel_now(self, now: float) -> None:
        """MCP 2025-11-25 cancel: ``cancelled`` before the reply, or refused if already terminal.

        Raises:
            CancelRejected: the task is already terminal.
        """
        self.advance(now)
        self._complete_if_faulted(now)
        if self.terminal:
            raise CancelRejected(self.status)
        self.cancel_requested_at = now
        self._settle(Status.CANCELLED, None, now, "cancelled by request")

    def request_cancel(self, now: float, delay_s: float) -> bool:
        """Cooperative cancel: takes effect ``delay_s`` later unless the work ends first.

        Returns whether a cancel is now pending or done (``False`` for an already finished task).
        """
        self.advance(now)
        self._complete_if_faulted(now)
        if self.terminal:
            return False
        if self.cancel_at is None:
            self.cancel_requested_at = now
            self.cancel_at = now + delay_s
        self.advance(now)
        return True

    def mark_deleted(self, now: float, reason: str) -> None:
        if self.deleted_at is None:
            self.deleted_at = now
            self.deleted_reason = reason


def outcome_is_result(outcome: Outcome | None) -> bool:
    """Whether there is a stored result or error to fetch (a cancelled task has none)."""
    return isinstance(outcome, ToolOutput | ToolFailure)


__all__ = [
    "ELICITATION_SCHEMA",
    "TERMINAL",
    "AnswerResult",
    "CancelRejected",
    "InputRound",
    "Retention",
    "Status",
    "Task",
    "View",
    "outcome_is_result",
]
