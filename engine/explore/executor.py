"""The simulated executor: ``engine.runtime.driver.Driver``'s reactions, one atomic step at a time.

What to do is read from the operation's local state exactly as ``Driver.advance`` does (a restart
therefore resumes from the ledger alone: SUBMITTING without a send of its own becomes
SUBMISSION_UNKNOWN and looks up by key), and every reply becomes the same event the driver would
build, stepped through the same ``step`` and recorded through the ledger's ``apply`` /
``accept_terminal``. Instead of awaiting a reply, the executor leaves its request in the simulated
network and reacts when the explorer delivers the reply (or a loss/timeout). It decides no state
itself and must not import the driver's I/O stack.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol as TypingProtocol

from engine.adapters.base import CancelResult, Created, Outcome, ServerView
from engine.errors import DuplicateOperation, StaleWrite
from engine.explore.server import Failure, Kind, Reply, Request, value_key
from engine.ledger.memory import Held, MemLedger
from engine.model import (
    CancelAcknowledged,
    CancelConfirmed,
    CancelRefusedTerminal,
    Digest,
    Epoch,
    Event,
    FetchStarted,
    IdempotencyKey,
    InlineResultReturned,
    LocalState,
    LookupFound,
    LookupProvedAbsent,
    LookupUnavailable,
    NotFound,
    Operation,
    Protocol,
    Resubmitted,
    ResultRejected,
    ResultVerified,
    ServerStatus,
    StatusObserved,
    SubmissionLost,
    Submitted,
    TaskId,
    Transition,
    digest_of,
)
from engine.runtime.plan import Step, next_step

S = LocalState
Json = dict[str, object]

MAX_FETCH_ATTEMPTS = 4
"""``engine.runtime.driver.MAX_FETCH_ATTEMPTS`` (a test keeps the two equal)."""
MAX_INPUT_RESENDS = 3
"""How often the driver re-sends a stored answer when the server replays the answered round."""


class Host(TypingProtocol):
    """What the executor needs from the simulated world."""

    ledger: MemLedger
    protocol: Protocol
    lookup_by_key: bool

    def commit(
        self, op: Operation, event: Event, *, payload: Json | None = None, request: Request | None = None
    ) -> Operation: ...

    def decide(self, op: Operation, event: Event) -> Transition: ...

    def send(self, request: Request) -> None: ...

    def next_rid(self) -> int: ...

    def server_version(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Reactions:
    """How the executor reacts. The defaults are the driver's; the others are deliberately broken."""

    skip_fetch: bool = False
    """Accept a terminal without fetching its result (an empty result is made up instead)."""
    new_key_on_unknown: bool = False
    """From SUBMISSION_UNKNOWN, resubmit under a fresh key instead of looking up by the old one."""
    stamp_current_epoch: bool = False
    """Stamp the status in a creating/lookup response with the epoch of the operation as reloaded,
    instead of the epoch the request was sent under. This is what ``engine/runtime/driver.py`` does
    today (``_apply_view(op, ...)`` with the operation ``commit`` returned); it lets a fenced
    executor's late creating response past the epoch fence, so the explorer's ``engine`` rules keep
    the driver's documented rule (events carry the epoch of the executor that sent the request)
    and ``driver-epoch-stamp`` reproduces the code as written."""


@dataclass(slots=True)
class Memory:
    """``Driver._Memory``: lost on restart, by design."""

    fresh_submit: bool = False
    cancel_sent: int = 0
    fetch_attempts: int = 0
    input_resends: int = 0
    resend_input: bool = False
    poll_mark: tuple[int, Operation] | None = None
    """(server version, operation) when the last status read went out: a poll that could not see
    anything new is not scheduled (it would return the same status and change nothing)."""
    held: Outcome | None = None
    """The last terminal outcome this process held (the driver fetches from it first)."""
    refetch: bool = False
    """A held copy was refused: fetch from the server from now on."""
    proved_absent: bool = False
    """This process's own lookup proved the submission absent (``Driver._Memory.proved_absent``)."""


@dataclass(frozen=True, slots=True)
class Pending:
    request: Request
    op: Operation
    """The operation as the executor held it when it sent the request (what the driver awaits with)."""
    probe: bool = False


class SimExecutor:
    """One executor incarnation at one execution epoch. A crash replaces it with a fresh one."""

    __slots__ = ("alive", "epoch", "host", "incarnation", "mem", "pending", "pollers", "reactions")

    def __init__(
        self, host: Host, incarnation: int, epoch: Epoch, reactions: Reactions, pollers: int
    ) -> None:
        self.host = host
        self.incarnation = incarnation
        self.epoch = epoch
        self.reactions = reactions
        self.pollers = pollers
        self.mem = Memory()
        self.pending: dict[int, Pending] = {}
        self.alive = True

    # ------------------------------------------------------------------------------------ plan

    def plan(self, op: Operation) -> str | None:
        """The one action ``Driver.advance`` would take now (``engine.runtime.plan.next_step``, the
        table the driver itself uses), or None (parked, fenced or awaiting a reply)."""
        mem = self.mem
        due = next_step(
            op,
            epoch=self.epoch,
            fresh_submit=mem.fresh_submit,
            cancel_sent=mem.cancel_sent,
            proved_absent=mem.proved_absent,
        )
        if due in (Step.FENCED, Step.WAIT, Step.DONE):
            return None
        busy = bool(self.pending)
        if due is Step.POLL or due is Step.PROBE:
            return self._poll_plan(op, busy)
        return None if busy else due.value

    def _poll_plan(self, op: Operation, busy: bool) -> str | None:
        if self.mem.resend_input and op.state is S.WORKING and not busy:
            return "poll"
        if self.mem.poll_mark == (self.host.server_version(), op):
            return None
        if not busy:
            return "poll"
        if len(self.pending) < self.pollers and all(
            p.request.kind is Kind.GET for p in self.pending.values()
        ):
            return "poll"
        return None

    # ------------------------------------------------------------------------------------- act

    def _send(
        self,
        op: Operation,
        kind: Kind,
        *,
        probe: bool = False,
        key: IdempotencyKey | None = None,
        generation: int = 0,
    ) -> None:
        request = Request(
            self.host.next_rid(), kind, self.incarnation, op.epoch, op.task_id, key=key, generation=generation
        )
        self.pending[request.rid] = Pending(request, op, probe)
        self.host.send(request)

    def act(self, op: Operation, plan: str) -> None:
        """Carry out ``plan`` (from ``plan(op)``) as ``Driver.advance`` would."""
        host = self.host
        mem = self.mem
        match plan:
            case "submit":
                mem.fresh_submit = False
                key = op.idempotency_key
                if self.reactions.new_key_on_unknown and op.submit_attempts:
                    key = IdempotencyKey(f"{key}~{op.submit_attempts}")
                self._send(op, Kind.SUBMIT, key=key)
            case "resume-submitting":
                # Found in SUBMITTING without having sent it: never send blindly; look it up.
                host.commit(op, SubmissionLost(op.epoch, "executor restarted while submitting"))
            case "lookup":
                if self.reactions.new_key_on_unknown:
                    after = host.commit(op, LookupProvedAbsent(op.epoch))
                    self.mem.proved_absent = after.state is S.NOT_FOUND_SAFE
                elif not host.lookup_by_key:
                    # The adapter refuses before sending anything: a person must find the task.
                    reason = "cannot look the submission up by key; find it by key, digest and time window"
                    host.commit(op, LookupUnavailable(op.epoch, reason))
                else:
                    self._send(op, Kind.LOOKUP, key=op.idempotency_key)
            case "resubmit":
                mem.proved_absent = False
                after = host.commit(op, Resubmitted(op.epoch))
                if after.state is S.SUBMITTING:
                    mem.fresh_submit = True
            case "poll":
                if mem.resend_input and op.state is S.WORKING:
                    mem.resend_input = False
                    self.send_answer(op)
                mem.poll_mark = (host.server_version(), op)
                self._send(op, Kind.GET, probe=op.state is S.UNKNOWN)
            case "cancel":
                self._send(op, Kind.CANCEL, generation=op.cancel_generation)
            case "fetch-start":
                host.commit(op, FetchStarted(op.epoch))
            case "fetch":
                # ``Driver._fetch``: the outcome this process held, else the ledger's if the row
                # says one is held, else ask the server.
                outcome = None if mem.refetch else mem.held
                use_ledger_copy = outcome is None and op.result_held and not mem.refetch
                held = host.ledger.held_outcome(op.operation_id) if use_ledger_copy else None
                if held is not None:
                    outcome = Outcome(
                        ServerStatus(held.status), held.payload, held.digest, held.task_id, held.epoch_echo
                    )
                if outcome is not None:
                    self._verify(op, outcome)
                elif self.reactions.skip_fetch:
                    made_up: Json = {}
                    status = op.server_status or ServerStatus.COMPLETED
                    event = ResultVerified(op.task_id, status, digest_of(made_up), op.epoch)
                    host.commit(op, event, payload=made_up)
                else:
                    self._send(op, Kind.RESULT)
            case _:
                raise ValueError(f"unknown plan {plan!r}")

    def send_answer(self, op: Operation) -> None:
        """``Driver.send_answer``: the stored answer of the answered round, bound to its request key."""
        answer = self.host.ledger.answer_of(op.operation_id, op.answered_round)
        if answer is None or op.input_request_key is None:
            return
        request = Request(
            self.host.next_rid(),
            Kind.INPUT,
            self.incarnation,
            op.epoch,
            op.task_id,
            input_key=op.input_request_key,
        )
        self.host.send(request)

    # --------------------------------------------------------------------------------- replies

    def on_timeout(self, rid: int) -> None:
        """The request (or its reply) was lost or came too late: ``BackendUnavailable``."""
        pending = self.pending.pop(rid, None)
        if pending is not None:
            self._unavailable(pending)

    def _unavailable(self, pending: Pending) -> None:
        op = pending.op
        match pending.request.kind:
            case Kind.SUBMIT:
                self.host.commit(
                    op, SubmissionLost(op.epoch, "no usable reply to the submission"), request=pending.request
                )
            case Kind.GET:
                self.mem.poll_mark = None
            case _:
                # LOOKUP, RESULT and AUDIT are tried again later; a CANCEL stays unsent (its
                # acknowledgement may be lost after the server cancelled) and is sent again.
                pass

    def on_reply(self, reply: Reply) -> None:
        """React to the reply of one of this incarnation's requests."""
        pending = self.pending.pop(reply.rid, None)
        if pending is None:
            return
        request, op, value = pending.request, pending.op, reply.value
        host = self.host
        if value is Failure.UNAVAILABLE:
            self._unavailable(pending)
            return
        match request.kind:
            case Kind.SUBMIT:
                if isinstance(value, Created):
                    self._bind(
                        op,
                        value.view,
                        request,
                        Submitted(value.view.task_id, op.epoch, value.view.expires_at),
                    )
                elif isinstance(value, Outcome):
                    self._hold(op, value)
                    host.commit(op, InlineResultReturned(value.status, op.epoch), request=request)
                else:
                    host.commit(op, SubmissionLost(op.epoch, f"submission failed: {value}"), request=request)
            case Kind.LOOKUP:
                if isinstance(value, ServerView):
                    self._bind(op, value, request, LookupFound(value.task_id, op.epoch))
                elif value is Failure.ABSENT:
                    after = host.commit(op, LookupProvedAbsent(op.epoch), request=request)
                    self.mem.proved_absent = after.state is S.NOT_FOUND_SAFE
                else:
                    reason = f"cannot look the submission up by key ({value}); find it by key, digest and time window"
                    host.commit(op, LookupUnavailable(op.epoch, reason), request=request)
            case Kind.GET:
                if isinstance(value, ServerView):
                    self.apply_view(op, value, request)
                elif value is Failure.NOT_FOUND and not pending.probe:
                    host.commit(op, NotFound(op.epoch), request=request)
            case Kind.CANCEL:
                self._on_cancel(op, value, request)
            case Kind.RESULT:
                if isinstance(value, Outcome):
                    self._verify(op, self._as_adapter(op, value), request)
                elif value is Failure.NOT_FOUND:
                    host.commit(op, NotFound(op.epoch), request=request)
                else:
                    self.mem.fetch_attempts += 1
                    if self.mem.fetch_attempts >= MAX_FETCH_ATTEMPTS:
                        host.commit(op, ResultRejected(str(value), op.epoch), request=request)
            case Kind.AUDIT:
                if isinstance(value, Outcome):
                    outcome = self._as_adapter(op, value)
                    host.ledger.attach_audit_result(op, outcome.payload)
                    if outcome.status is ServerStatus.COMPLETED:
                        event = StatusObserved(op.task_id or TaskId(""), ServerStatus.COMPLETED, op.epoch)
                        host.commit(op, event, request=request)
            case Kind.INPUT:
                pass

    def _as_adapter(self, op: Operation, outcome: Outcome) -> Outcome:
        # The 2025-11-25 adapter reads whatever tasks/result returns for a task it knows is
        # cancelled as the CANCELLED outcome, never as success.
        if self.host.protocol is Protocol.MCP_2025_11_25 and op.server_status is ServerStatus.CANCELLED:
            return replace(outcome, status=ServerStatus.CANCELLED)
        return outcome

    def _bind(
        self, op: Operation, view: ServerView, request: Request, event: Submitted | LookupFound
    ) -> None:
        """``Driver._submit``/``_look_up`` after a view came back: bind the task, then read the view."""
        host = self.host
        try:
            after = host.commit(op, event, request=request)
        except DuplicateOperation as exc:
            # A task id already bound to another call: never adopt another request's task.
            lost = host.commit(
                op,
                SubmissionLost(op.epoch, f"server returned task id {view.task_id} already bound: {exc}"),
                request=request,
            )
            host.commit(
                lost,
                LookupUnavailable(op.epoch, f"server reused task id {view.task_id} for another request"),
                request=request,
            )
            return
        # The driver reads the view against the operation ``commit`` returned (reloaded after a
        # lost compare-and-swap); the event keeps the epoch the request was sent under.
        self.apply_view(after, view, request, epoch=None if self.reactions.stamp_current_epoch else op.epoch)

    def apply_view(
        self, op: Operation, view: ServerView, request: Request | None, epoch: Epoch | None = None
    ) -> None:
        """``Driver._apply_view``: hold an inline outcome, detect a replayed input round, observe."""
        mem = self.mem
        if view.outcome is not None and view.status.terminal:
            self._hold(op, view.outcome)
        if (
            view.input_request is None
            and view.status is ServerStatus.INPUT_REQUIRED
            and op.state is not S.CANCEL_REQUESTED
        ):
            # The driver opens no round without the server's request: it polls again instead.
            mem.poll_mark = None
            return
        answered_before = op.answered_round == op.input_round and op.input_round > 0
        replay = (
            view.status is ServerStatus.INPUT_REQUIRED
            and answered_before
            and view.input_request is not None
            and view.input_request.key == op.input_request_key
        )
        event = StatusObserved(
            view.task_id,
            view.status,
            op.epoch if epoch is None else epoch,
            input_request_key=view.input_request.key if view.input_request else None,
            expires_at=view.expires_at,
            result_held=view.outcome is not None,
        )
        self.host.commit(op, event, request=request)
        if replay and mem.input_resends < MAX_INPUT_RESENDS:
            mem.input_resends += 1
            mem.resend_input = True

    def _on_cancel(self, op: Operation, value: object, request: Request) -> None:
        host = self.host
        generation = request.generation
        task = op.task_id or TaskId("")
        if value is Failure.NOT_FOUND:
            self.mem.cancel_sent = generation
            host.commit(op, NotFound(op.epoch), request=request)
            return
        if not isinstance(value, CancelResult):
            self.mem.cancel_sent = generation
            return
        self.mem.cancel_sent = generation
        match value:
            case CancelResult.CONFIRMED:
                after = host.commit(op, CancelConfirmed(task, generation, op.epoch), request=request)
                if after.state is S.CANCELLED_ACCEPTED:
                    # Read what the cancelled task left, for the audit trail only.
                    self._send(after, Kind.AUDIT)
            case CancelResult.ACKNOWLEDGED:
                host.commit(op, CancelAcknowledged(task, generation, op.epoch), request=request)
            case CancelResult.ALREADY_TERMINAL:
                host.commit(op, CancelRefusedTerminal(task, generation, op.epoch), request=request)

    def _verify(self, op: Operation, outcome: Outcome, request: Request | None = None) -> None:
        """``Driver._fetch`` once an outcome is in hand (held, or just fetched)."""
        host = self.host
        epoch = Epoch(outcome.epoch_echo) if outcome.epoch_echo is not None else op.epoch
        event = ResultVerified(outcome.task_id or op.task_id, outcome.status, outcome.digest, epoch)
        t = host.decide(op, event)
        if not t.accepted:
            self.mem.fetch_attempts += 1
            try:
                host.ledger.apply(t)  # recorded as rejected, with its reason
            except StaleWrite:
                # ``Driver.advance``: the row moved; the next advance starts from the fresh one.
                return
            # A held copy that was refused is never offered again: ask the server afresh.
            self.mem.refetch = True
            self.mem.held = None
            if epoch != op.epoch and self.mem.fetch_attempts < MAX_FETCH_ATTEMPTS:
                return
            host.commit(op, ResultRejected(t.reason, op.epoch), request=request)
            return
        host.commit(op, event, payload=outcome.payload, request=request)

    def _hold(self, op: Operation, outcome: Outcome) -> None:
        self.mem.held = outcome
        self.host.ledger.hold_outcome(
            op.operation_id,
            Held(
                outcome.status.value,
                Digest(outcome.digest),
                outcome.payload,
                outcome.task_id,
                outcome.epoch_echo,
            ),
        )

    def clone(self, host: Host) -> SimExecutor:
        """An independent copy bound to ``host`` (the cloned world)."""
        twin = SimExecutor(host, self.incarnation, self.epoch, self.reactions, self.pollers)
        mem = self.mem
        twin.mem = Memory(
            mem.fresh_submit,
            mem.cancel_sent,
            mem.fetch_attempts,
            mem.input_resends,
            mem.resend_input,
            mem.poll_mark,
            mem.held,
            mem.refetch,
            mem.proved_absent,
        )
        twin.pending = dict(self.pending)
        twin.alive = self.alive
        return twin

    def state_key(self, rank: dict[int, int], mark: tuple[int, Operation] | None) -> tuple[object, ...]:
        """Memory and waiting requests, request ids by rank and the poll mark as "still current"."""
        mem = self.mem
        return (
            self.incarnation,
            self.epoch,
            self.alive,
            mem.fresh_submit,
            mem.cancel_sent,
            mem.fetch_attempts,
            mem.input_resends,
            mem.resend_input,
            mem.poll_mark is not None and mem.poll_mark == mark,
            value_key(mem.held) if mem.held is not None else None,
            mem.refetch,
            mem.proved_absent,
            tuple(
                (rank[rid], request_key(p.request, rank), p.op, p.probe)
                for rid, p in sorted(self.pending.items())
            ),
        )


def request_key(request: Request, rank: dict[int, int]) -> tuple[object, ...]:
    """A request with its id replaced by its rank among the ids still alive."""
    return (
        rank[request.rid],
        request.kind,
        request.owner,
        request.epoch,
        request.task_id,
        request.key,
        request.generation,
        request.input_key,
    )


__all__ = [
    "MAX_FETCH_ATTEMPTS",
    "MAX_INPUT_RESENDS",
    "Host",
    "Json",
    "Memory",
    "Pending",
    "Reactions",
    "S",
    "SimExecutor",
    "request_key",
]
