"""One simulated run: the actors of a scenario, their atomic steps, and the checks on the outcome.

Actors: the caller (submit, cancel clicks, answers), the executor (``SimExecutor``: what the driver
does next, reactions to replies, crash/restart), an operator (epoch raise on rollback), a person
(reconciling an UNKNOWN), the server's own work (progress, input, completion, failure, honouring a
cancel, loss and expiry of tasks), the network (deliver any message in flight, so replies overtake
each other; lose, delay, duplicate, throttle or truncate within the scenario's budgets) and a
virtual clock. ``enabled()`` lists the steps that may run next in a fixed order; ``perform`` runs one.
Every state change goes through the rules' ``step`` and the in-memory ledger. Deterministic: no
wall clock, no randomness, no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from enum import StrEnum
from functools import cache

from engine.adapters.base import CancelResult, Created, Outcome, ServerView
from engine.errors import LedgerError, ReceiptConflict, StaleWrite
from engine.explore.executor import SimExecutor, request_key
from engine.explore.rules import Rules
from engine.explore.scenario import Scenario
from engine.explore.server import (
    TERMINAL,
    Failure,
    Kind,
    Message,
    Reply,
    ReplyValue,
    Request,
    SimServer,
    value_key,
)
from engine.ledger.memory import MemLedger
from engine.model import (
    RECEIPT_STATES,
    AcceptTerminal,
    AwaitApproval,
    CancelAcknowledged,
    CancelConfirmed,
    CancelRefusedTerminal,
    CancelRequested,
    Digest,
    Epoch,
    EpochRaised,
    Event,
    FlagEffectReconciliation,
    InputAnswered,
    LocalState,
    OpenReconciliation,
    Operation,
    OperationId,
    Protocol,
    Reconciled,
    ServerStatus,
    StatusObserved,
    Submitted,
    TaskId,
    Transition,
    new_operation,
)
from engine.testing import BATCH_TOOL, EPOCH_START, REPORT_TOOL, make_request

S = LocalState
Json = dict[str, object]
Action = tuple[str, str, object]
"""``(actor, verb, argument)``: one atomic step that may run next."""

SERVER = "sim"
OP_ID = OperationId("op-1")
OTHER_ID = OperationId("op-0")
REUSED_TASK = TaskId("t-old")
MAX_UNKNOWNS = 3
"""Times an operation may enter UNKNOWN in one run before the run counts as cycling."""
_PASSIVE = frozenset({S.WORKING, S.INPUT_REQUIRED, S.CANCEL_REQUESTED})
_REQUEST_FAULTS = frozenset({Kind.GET, Kind.RESULT, Kind.CANCEL, Kind.SUBMIT, Kind.LOOKUP})


class Divergence(StrEnum):
    """Why a run counts as divergent."""

    TERMINAL = "terminal"
    """The accepted terminal differs from the server's truth (status or result digest)."""
    DOUBLE_RECEIPT = "double-receipt"
    """A call node got (or the rules tried to write) a second receipt."""
    SECOND_OPERATION = "second-operation"
    """The server created a second operation for the call node."""
    UNFETCHED = "unfetched"
    """A completed/failed terminal advanced before its result was fetched and verified."""
    AFTER_CANCEL = "after-cancel"
    """Something advanced an operation that already held its receipt (a completion after cancel won)."""
    FENCE = "fence"
    """A reply for another execution epoch or an older cancel generation changed the operation."""
    LOST = "lost"
    """The run ended without a receipt and without a person being told, or a recorded request vanished."""
    REFUSED = "refused"
    """The ledger refused a write the rules asked for."""
    UNVERSIONED = "unversioned"
    """A recorded change did not raise the row version by one, so compare-and-swap cannot see it."""
    UNSETTLED = "unsettled"
    """The run did not settle within the step bound."""


Finding = tuple[Divergence, str]


def _describe(value: ReplyValue) -> str:
    if isinstance(value, Created):
        return f"created {value.view.task_id} ({value.view.status})"
    if isinstance(value, ServerView):
        extra = " +outcome" if value.outcome is not None else ""
        if value.input_request is not None:
            extra += f" asks {value.input_request.key}"
        return f"{value.task_id} {value.status}{extra}"
    if isinstance(value, Outcome):
        return f"outcome {value.status} (epoch {value.epoch_echo})"
    if isinstance(value, CancelResult):
        return f"cancel {value}"
    return str(value)


@cache
def _new_operation(
    call_node: str, operation_id: OperationId, protocol: Protocol, side_effects: bool
) -> Operation:
    """The call node's operation as the caller records it (kept: keys and digests are costly)."""
    request = make_request(call_node, tool=BATCH_TOOL if side_effects else REPORT_TOOL)
    return new_operation(
        request,
        operation_id=operation_id,
        protocol=protocol,
        adapter_version="sim",
        server=SERVER,
        epoch=Epoch(1),
        now=EPOCH_START,
    )


class World:
    """The state of one run and the steps that may change it."""

    def __init__(self, scenario: Scenario, protocol: Protocol, rules: Rules, *, trace: bool = False) -> None:
        self.scenario = scenario
        self.protocol = protocol
        self.rules = rules
        self.now = EPOCH_START
        self.ledger = MemLedger(SERVER)
        self.lookup_by_key = scenario.lookup_by_key
        self.server = SimServer(
            protocol,
            scenario.script_for(protocol),
            scenario.lookup_by_key,
            scenario.ttl,
            reuse_id=REUSED_TASK if scenario.reuse_task_id else None,
            flip=scenario.flip,
            echo_creation_epoch=scenario.echo_creation_epoch,
        )
        self.net: list[Message] = []
        self._rid = 0
        self.executors: list[SimExecutor] = [
            SimExecutor(self, 0, Epoch(1), rules.reactions, scenario.pollers)
        ]
        self.active = 0
        self.drops = scenario.drops
        self.delays = scenario.delays
        self.dups = scenario.dups
        self.throttles = scenario.throttles
        self.corrupts = scenario.corrupts
        self.crashes = scenario.crashes
        self.raises = scenario.epoch_raises
        self.evicts = 1 if scenario.evict else 0
        self.passes = 1 if scenario.expire else 0
        self.cancels = scenario.cancels
        self.max_generation = 0
        self.findings: list[Finding] = []
        self.aborted = False
        self.received: set[Digest] = set()
        self.steps = 0
        self.unknowns = 0
        self.lines: list[str] | None = [] if trace else None
        self.other: Operation | None = None
        if scenario.reuse_task_id:
            self._seed_other()

    def _seed_other(self) -> None:
        """Another call node's operation, already bound to the task id the server will reuse."""
        op = _new_operation("node-0", OTHER_ID, self.protocol, False)
        self.ledger.create_operation(op, {"report": "node-0"})
        self.other = self.ledger.apply(self.rules.step(op, Submitted(REUSED_TASK, Epoch(1)), self.now))

    # ------------------------------------------------------------------------- Host (executor)

    def next_rid(self) -> int:
        self._rid += 1
        return self._rid

    def send(self, request: Request) -> None:
        self.net.append(request)

    def server_version(self) -> int:
        return self.server.version

    def decide(self, op: Operation, event: Event) -> Transition:
        return self.rules.step(op, event, self.now)

    def commit(
        self, op: Operation, event: Event, *, payload: Json | None = None, request: Request | None = None
    ) -> Operation:
        """``Driver.commit``: step, record; on a lost compare-and-swap reload and step again."""
        ledger = self.ledger
        for _ in range(5):
            t = self.rules.step(op, event, self.now)
            try:
                if any(isinstance(e, AcceptTerminal) for e in t.effects):
                    ledger.accept_terminal(t, payload)
                else:
                    ledger.apply(t)
            except StaleWrite:
                reloaded = ledger.get(op.operation_id)
                if reloaded is None:
                    raise
                op = reloaded
                continue
            if t.after is not t.before:
                self._effects(t)
                self._check(t, event, payload, request)
            return t.after
        raise StaleWrite(op.operation_id, op.row_version, "kept losing the race")

    def _effects(self, t: Transition) -> None:
        if (
            t.before.state is S.UNKNOWN
            and t.after.state is not S.UNKNOWN
            and isinstance(t.event, StatusObserved)
        ):
            # ``Driver._effects``: the server answered again, nothing is left for a person to find.
            self.ledger.resolve_open(t.after.operation_id, "unknown")
        for effect in t.effects:
            if isinstance(effect, OpenReconciliation):
                self.ledger.open_entry(t.after, "unknown", effect.reason)
                self.unknowns += 1
                if self.unknowns > MAX_UNKNOWNS:
                    # Every lap of a livelock through UNKNOWN opens another item for a person.
                    self.findings.append(
                        (Divergence.UNSETTLED, f"UNKNOWN entered {self.unknowns} times: the operation cycles")
                    )
                    self.aborted = True
            elif isinstance(effect, FlagEffectReconciliation):
                self.ledger.open_entry(t.after, "effects", effect.reason)
            elif isinstance(effect, AwaitApproval):
                self.ledger.open_entry(t.after, "approval", "input required")

    def _check(self, t: Transition, event: Event, payload: Json | None, request: Request | None) -> None:
        """Invariants that hold for every recorded change (the end of the run checks the rest)."""
        before, after = t.before, t.after
        if not t.accepted or after == before:
            return
        if after.row_version != before.row_version + 1:
            self.findings.append(
                (
                    Divergence.UNVERSIONED,
                    f"{type(event).__name__} changed the operation ({before.state} -> {after.state}) at row "
                    f"version {before.row_version} -> {after.row_version}: compare-and-swap cannot see it",
                )
            )
        if before.state in RECEIPT_STATES and after.state is not before.state:
            what = (
                "a completion advanced after the cancel won"
                if before.state is S.CANCELLED_ACCEPTED
                else "a receipt was reopened"
            )
            self.findings.append((Divergence.AFTER_CANCEL, f"{what}: {before.state} -> {after.state}"))
        stamped = None if isinstance(event, EpochRaised) else getattr(event, "epoch", None)
        if isinstance(stamped, int) and stamped != before.epoch:
            self.findings.append(
                (
                    Divergence.FENCE,
                    f"{type(event).__name__} stamped epoch {stamped} changed an operation at epoch {before.epoch}",
                )
            )
        elif request is not None and request.epoch != before.epoch:
            self.findings.append(
                (
                    Divergence.FENCE,
                    f"the reply to {request.kind}#{request.rid} sent under epoch {request.epoch} changed an operation at epoch {before.epoch}",
                )
            )
        if isinstance(event, CancelConfirmed | CancelAcknowledged | CancelRefusedTerminal) and (
            event.generation != before.cancel_generation
        ):
            self.findings.append(
                (
                    Divergence.FENCE,
                    f"a reply to cancel generation {event.generation} changed an operation at generation {before.cancel_generation}",
                )
            )
        if after.state is S.ACCEPTED and before.state is not S.ACCEPTED:
            digest = after.result_digest
            if payload is None or digest is None or digest not in self.received:
                self.findings.append(
                    (
                        Divergence.UNFETCHED,
                        f"{after.server_status} accepted with a result the server never sent",
                    )
                )

    # ------------------------------------------------------------------------------- stepping

    def _waiting(self, msg: Message) -> bool:
        owner = self.executors[msg.owner]
        return owner.alive and msg.rid in owner.pending

    def enabled(self) -> list[Action]:
        """Every step that may run next, in a fixed order (the explorer chooses among them)."""
        op = self.ledger.get(OP_ID)
        if op is None:
            return [("caller", "submit", None)]
        out: list[Action] = []
        executor = self.executors[self.active]
        plan = executor.plan(op) if executor.alive else None
        if plan is not None:
            out.append(("executor", plan, self.active))
        net = self.net
        if net:
            kinds = self.scenario.fault_kinds
            faults = self.drops or self.delays or self.dups or self.throttles or self.corrupts
            executors = self.executors
            for i, msg in enumerate(net):
                out.append(("network", "deliver", i))
                kind = msg.kind
                if not faults or (kinds is not None and kind not in kinds):
                    continue
                if isinstance(msg, Request):
                    owner = executors[msg.owner]
                    waiting = owner.alive and msg.rid in owner.pending
                    if self.drops and (waiting or kind is Kind.INPUT):
                        out.append(("network", "drop", i))
                    if self.delays and waiting:
                        out.append(("network", "delay", i))
                    if self.dups and (kind is not Kind.SUBMIT or self.lookup_by_key):
                        out.append(("network", "duplicate", i))
                    if self.throttles and waiting and kind in _REQUEST_FAULTS:
                        out.append(("network", "throttle", i))
                else:
                    if self.drops:
                        out.append(("network", "drop", i))
                    if self.corrupts and kind is Kind.RESULT and isinstance(msg.value, Outcome):
                        out.append(("network", "truncate", i))
        server = self.server
        for work, task_id in server.work():
            # The late completion shows only once the cancel won (the operation holds its receipt).
            if work != "finish-late" or op.state is S.CANCELLED_ACCEPTED:
                out.append(("server", work, task_id))
        task = server.main_task() if self.evicts or self.scenario.expire else None
        if task is not None and not task.deleted:
            if self.evicts and task.status not in TERMINAL:
                out.append(("server", "lose-task", task.task_id))
            if self.scenario.expire:
                if self.now >= task.expires_at:
                    out.append(("server", "delete-expired", task.task_id))
                elif self.passes:
                    out.append(("clock", "pass-expiry", task.task_id))
        state = op.state
        if self.cancels and state in _PASSIVE:
            out.append(("caller", "cancel", None))
        if state is S.INPUT_REQUIRED and (OP_ID, op.input_round) not in self.ledger.answers:
            out.append(("caller", "answer", op.input_round))
        if self.scenario.reconciler and state is S.UNKNOWN and self._findable(op) is not None:
            out.append(("person", "reconcile", None))
        if state not in RECEIPT_STATES:
            if self.raises:
                out.append(("operator", "raise-epoch", None))
            if self.crashes:
                out.append(("executor", "crash", self.active))
        return out

    def _findable(self, op: Operation) -> TaskId | None:
        """The task a person would find by key, digest and time window (and may bind)."""
        for task_id in self.server.created:
            task = self.server.tasks[task_id]
            if task.key == op.idempotency_key and not task.deleted:
                bound = self.ledger.by_task(op.server, task_id)
                if bound is None or bound.operation_id == op.operation_id:
                    return task_id
        return None

    def perform(self, action: Action) -> None:
        """Run one step. A write the ledger refuses ends the run as divergent."""
        label = self.label(action) if self.lines is not None else ""
        try:
            self._perform(action)
        except ReceiptConflict as exc:
            kind = Divergence.DOUBLE_RECEIPT if exc.field == "receipt" else Divergence.REFUSED
            self.findings.append((kind, str(exc)))
            self.aborted = True
        except LedgerError as exc:
            self.findings.append((Divergence.REFUSED, f"{type(exc).__name__}: {exc}"))
            self.aborted = True
        self.steps += 1
        if self.lines is not None:
            self.lines.append(f"{self.steps:>3}  {action[0]:<9} {label:<58} -> {self.state_text()}")

    def _perform(self, action: Action) -> None:
        actor, verb, arg = action
        if actor == "network":
            assert isinstance(arg, int)
            self._network(verb, arg)
        elif actor == "executor":
            if verb == "crash":
                self._crash()
            else:
                op = self.ledger.get(OP_ID)
                assert op is not None
                assert isinstance(arg, int)
                self.executors[arg].act(op, verb)
        elif actor == "server":
            assert isinstance(arg, str)
            if verb in ("lose-task", "delete-expired"):
                self.server.evict(TaskId(arg))
                if verb == "lose-task":
                    self.evicts -= 1
            else:
                self.server.do_work(verb, TaskId(arg))
        elif actor == "clock":
            task = self.server.main_task()
            assert task is not None
            self.now = task.expires_at + timedelta(seconds=1)
            self.passes -= 1
        elif actor == "caller":
            self._caller(verb, arg)
        elif actor == "person":
            op = self.ledger.get(OP_ID)
            assert op is not None
            self.commit(
                op, Reconciled("person", "found the task by key, digest and time window", self._findable(op))
            )
        elif actor == "operator":
            self._raise_epoch()
        else:
            raise ValueError(f"unknown actor {actor!r}")

    def _caller(self, verb: str, arg: object) -> None:
        if verb == "submit":
            fresh = _new_operation("node-1", OP_ID, self.protocol, self.scenario.side_effects)
            _, created = self.ledger.create_operation(fresh, {"report": "node-1"})
            if created:
                self.executors[self.active].mem.fresh_submit = True
            return
        op = self.ledger.get(OP_ID)
        assert op is not None
        if verb == "cancel":
            # ``Driver.request_cancel``: raise the generation by compare-and-swap first.
            self.cancels -= 1
            after = self.commit(op, CancelRequested(op.cancel_generation + 1, "caller", "cancel clicked"))
            self.max_generation = max(self.max_generation, after.cancel_generation)
        elif verb == "answer":
            # ``Driver.answer``: record the answer bound to its round, then send it.
            assert isinstance(arg, int)
            self.ledger.record_answer(OP_ID, arg, {"approved": True})
            after = self.commit(op, InputAnswered(arg, "caller"))
            if after.state is S.WORKING:
                self.executors[self.active].send_answer(after)
        else:
            raise ValueError(f"unknown caller step {verb!r}")

    def _crash(self) -> None:
        dead = self.executors[self.active]
        dead.alive = False
        self.crashes -= 1
        # Replies to a dead process go nowhere; its requests may still reach the server.
        self.net = [m for m in self.net if isinstance(m, Request) or m.owner != dead.incarnation]
        self._spawn(dead.epoch)

    def _spawn(self, epoch: Epoch) -> None:
        fresh = SimExecutor(self, len(self.executors), epoch, self.rules.reactions, self.scenario.pollers)
        self.executors.append(fresh)
        self.active = fresh.incarnation

    def _raise_epoch(self) -> None:
        self.raises -= 1
        op = self.ledger.get(OP_ID)
        assert op is not None
        after = self.commit(op, EpochRaised(Epoch(op.epoch + 1), "operator"))
        if after.epoch != op.epoch:
            # The new executor takes over; the old one keeps running until its replies are in.
            self._spawn(after.epoch)

    def _network(self, verb: str, i: int) -> None:
        msg = self.net[i]
        if verb == "deliver":
            del self.net[i]
            if isinstance(msg, Request):
                value = self.server.handle(msg, self.now)
                if value is not None and self._waiting(msg):
                    self.net.append(Reply(msg.rid, msg.kind, msg.owner, value))
                return
            owner = self.executors[msg.owner]
            if owner.alive and msg.rid in owner.pending:
                self._received(msg.value)
                # A duplicated request's other reply will find nobody waiting: drop it now.
                self.net = [m for m in self.net if not (isinstance(m, Reply) and m.rid == msg.rid)]
                owner.on_reply(msg)
        elif verb == "drop":
            del self.net[i]
            self.drops -= 1
            owner = self.executors[msg.owner]
            if owner.alive:
                owner.on_timeout(msg.rid)
        elif verb == "delay":
            self.delays -= 1
            self.executors[msg.owner].on_timeout(msg.rid)
        elif verb == "duplicate":
            self.dups -= 1
            self.net.insert(i + 1, msg)
        elif verb == "throttle":
            self.throttles -= 1
            self.net[i] = Reply(msg.rid, msg.kind, msg.owner, Failure.UNAVAILABLE)
        elif verb == "truncate":
            assert isinstance(msg, Reply)
            self.corrupts -= 1
            self.net[i] = replace(msg, value=Failure.CORRUPT)
        else:
            raise ValueError(f"unknown network step {verb!r}")

    def _received(self, value: ReplyValue) -> None:
        if isinstance(value, Outcome):
            self.received.add(value.digest)
        elif isinstance(value, ServerView) and value.outcome is not None:
            self.received.add(value.outcome.digest)
        elif isinstance(value, Created) and value.view.outcome is not None:
            self.received.add(value.view.outcome.digest)

    # ---------------------------------------------------------------------------------- checks

    def finish(self, *, unsettled: bool = False) -> list[Finding]:
        """Everything wrong with the run, judged against the server's truth once it settled.

        A run may end parked in UNKNOWN (with a reconciliation item open) or INPUT_REQUIRED (with
        an approval open): a person resolves those, and they are not divergences. Any other end
        without a receipt is LOST.
        """
        findings = list(self.findings)
        op = self.ledger.get(OP_ID)
        if op is None:
            return findings
        server = self.server
        task = server.main_task()
        if len(server.created) > 1:
            findings.append(
                (
                    Divergence.SECOND_OPERATION,
                    f"the server created {len(server.created)} operations: {', '.join(server.created)}",
                )
            )
        receipt = self.ledger.receipts.get(op.call_node_id)
        if self.aborted:
            pass  # the refused write is the finding; the run was cut short there
        elif op.state in RECEIPT_STATES:
            truth = task.first_terminal if task is not None else None
            if receipt is None:
                findings.append((Divergence.REFUSED, f"{op.state} without a receipt row"))
            elif truth is None:
                findings.append(
                    (Divergence.TERMINAL, f"accepted {receipt.status}; the server never ended the task")
                )
            elif receipt.status is not truth:
                findings.append(
                    (Divergence.TERMINAL, f"accepted {receipt.status}; the server's truth is {truth}")
                )
            elif (
                truth is not ServerStatus.CANCELLED
                and task is not None
                and receipt.result_digest != task.digest
            ):
                findings.append(
                    (Divergence.TERMINAL, f"accepted {truth} with a result digest the server never produced")
                )
        elif unsettled:
            findings.append((Divergence.UNSETTLED, f"still {op.state} after {self.steps} steps"))
        elif op.state is S.UNKNOWN:
            if not self.ledger.has_entry(OP_ID, "unknown"):
                findings.append((Divergence.LOST, "UNKNOWN without a reconciliation item"))
        elif op.state is S.INPUT_REQUIRED:
            if not self.ledger.has_entry(OP_ID, "approval", op.input_round):
                findings.append(
                    (Divergence.LOST, f"INPUT_REQUIRED round {op.input_round} without an approval item")
                )
        else:
            findings.append((Divergence.LOST, f"ended in {op.state} with nothing left to do"))
        if op.cancel_generation < self.max_generation:
            findings.append(
                (Divergence.LOST, f"cancel generation {self.max_generation} was recorded, then lost")
            )
        if self.other is not None and self.ledger.get(OTHER_ID) != self.other:
            findings.append((Divergence.FENCE, "another call node's operation was changed"))
        return findings

    @property
    def parked(self) -> bool:
        op = self.ledger.get(OP_ID)
        return op is not None and op.state in (S.UNKNOWN, S.INPUT_REQUIRED)

    # ------------------------------------------------------------------------- state identity

    def clone(self) -> World:
        """An independent copy of this run's state, to branch from (no trace)."""
        twin = object.__new__(World)
        twin.__dict__.update(self.__dict__)
        twin.ledger = self.ledger.clone()
        twin.server = self.server.clone()
        twin.net = list(self.net)
        twin.executors = [e.clone(twin) for e in self.executors]
        twin.findings = list(self.findings)
        twin.received = set(self.received)
        twin.lines = None
        return twin

    def state_key(self) -> tuple[object, ...]:
        """Everything that decides the rest of the run and how it is judged, as one hashable value.

        Two states with equal keys have the same future: the same enabled steps, the same outcomes
        and the same findings. Request ids are replaced by their rank among the ids still alive,
        and each poll mark by whether it is still current, so states reached along different
        interleavings compare equal.
        """
        rids = sorted({*(m.rid for m in self.net), *(rid for e in self.executors for rid in e.pending)})
        rank = {rid: i for i, rid in enumerate(rids)}
        op = self.ledger.get(OP_ID)
        mark = (self.server.version, op) if op is not None else None
        net = tuple(
            request_key(m, rank)
            if isinstance(m, Request)
            else (rank[m.rid], m.kind, m.owner, value_key(m.value))
            for m in self.net
        )
        return (
            self.now,
            self.active,
            self.drops,
            self.delays,
            self.dups,
            self.throttles,
            self.corrupts,
            self.crashes,
            self.raises,
            self.evicts,
            self.passes,
            self.cancels,
            self.max_generation,
            self.aborted,
            self.unknowns,
            tuple(self.findings),
            frozenset(self.received),
            net,
            tuple(e.state_key(rank, mark) for e in self.executors),
            self.ledger.state_key(),
            self.server.state_key(),
        )

    # ---------------------------------------------------------------------------------- traces

    def label(self, action: Action) -> str:
        """A readable name for a step, computed before it runs."""
        actor, verb, arg = action
        if actor == "network":
            assert isinstance(arg, int)
            msg = self.net[arg]
            if isinstance(msg, Request):
                what = f"{msg.kind}#{msg.rid} request (epoch {msg.epoch}"
                what += f", gen {msg.generation})" if msg.kind is Kind.CANCEL else ")"
            else:
                what = f"{msg.kind}#{msg.rid} reply: {_describe(msg.value)}"
            return f"{verb} {what}"
        if actor == "executor" and verb != "crash":
            assert isinstance(arg, int)
            return f"executor {arg} (epoch {self.executors[arg].epoch}): {verb}"
        if actor == "caller" and verb == "answer":
            return f"answer round {arg}"
        return verb if arg is None else f"{verb} {arg}"

    def state_text(self) -> str:
        op = self.ledger.get(OP_ID)
        local = "-" if op is None else f"{op.state} e{op.epoch} g{op.cancel_generation}"
        task = self.server.main_task()
        if task is None:
            remote = "no task"
        else:
            remote = f"{task.task_id} {task.status}" + (" (deleted)" if task.deleted else "")
        return f"{local} / {remote}"


__all__ = [
    "MAX_UNKNOWNS",
    "OP_ID",
    "OTHER_ID",
    "REUSED_TASK",
    "SERVER",
    "Action",
    "Divergence",
    "Finding",
    "Json",
    "S",
    "World",
]
