"""One run of the shipped code: the real ``Driver`` and the real protocol adapters against the reference
server, with the explorer choosing what happens at every point where the wire or the ledger is touched.

The executor is ``engine.runtime.driver.Driver`` (one ``advance`` at a time, as ``finality call`` and
the service run it) with the adapter ``engine.adapters.open_backend`` builds for the protocol; its
HTTP client's transport is the explorer's network (``engine.explore.wire``), and behind the network
is ``refserver``'s own app for that protocol on a virtual clock. Actors and their steps:

* executor: ``advance`` (or the first ``submit_new``); crash (its running coroutine is cancelled at
  whatever request it waits on, its memory is lost, a new ``Driver`` resumes from the ledger);
* caller: cancel clicks (``Driver.request_cancel``), answers to input rounds (``Driver.answer``);
* operator: raise the execution epoch (rollback); a new executor takes over while the old one's
  requests are still in flight;
* network: deliver any request or reply in flight (so they overtake each other); within the
  scenario's budgets lose a request or only its reply, time a request out and deliver it later,
  deliver it twice, answer 503 in the server's place, cut a reply short;
* server: its work moves on (the virtual clock jumps to the task's next event: completion, failure,
  an input round, a cancel taking effect), and its tasks expire.

The checks (``finish``) read the ledger's writes and the server's own records. Deterministic: the
same choices give the same run. Used by the explorer only.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from engine.adapters import AdapterOptions, open_backend
from engine.adapters.base import Backend
from engine.adapters.config import Timeouts
from engine.adapters.transport import HttpClient
from engine.errors import BackendError, EngineError, LedgerError, NegotiationError, ReceiptConflict
from engine.explore.scenario import Scenario
from engine.explore.wire import (
    EngineClock,
    Kind,
    Message,
    Network,
    Recording,
    Write,
    canon,
    message_key,
    ref_server,
    settle,
)
from engine.ledger.memory import MemoryPort
from engine.model import (
    RECEIPT_STATES,
    CallNodeId,
    CallRequest,
    CancelAcknowledged,
    CancelConfirmed,
    CancelRefusedTerminal,
    Epoch,
    EpochRaised,
    LocalState,
    Operation,
    OperationId,
    Principal,
    Protocol,
    ResultVerified,
    ServerStatus,
    new_operation,
)
from engine.runtime.driver import Driver, Wake
from engine.runtime.epochs import adoption, behind, startup_epoch
from engine.schedule import PollPolicy
from engine.testing import BATCH_TOOL, REPORT_TOOL
from refserver.context import Protocol as ServerProtocol
from refserver.task import Status as ServerTaskStatus

S = LocalState
Action = tuple[str, str, object]
Finding = tuple[str, str]

LEDGERS = ("memory", "duckdb")
PRINCIPAL = Principal("anonymous")
DURATION_MS = 10_000
"""The tool's work, in virtual milliseconds (long enough that no protocol answers synchronously)."""
MAX_UNKNOWNS = 3
CONFIGURED_EPOCH = Epoch(1)
"""The epoch an executor's configuration names (a restarted one runs at the ledger's, if recorded)."""
_PASSIVE = frozenset({S.WORKING, S.INPUT_REQUIRED, S.CANCEL_REQUESTED})
_EXCUSING = frozenset({Kind.SUBMIT, Kind.LOOKUP, Kind.RESULT})
_REQUEST_FAULTS = frozenset({Kind.GET, Kind.RESULT, Kind.CANCEL, Kind.SUBMIT, Kind.LOOKUP})
_PROTOCOLS = {
    Protocol.MCP_2025_11_25: ServerProtocol.MCP_2025_11_25,
    Protocol.MCP_2026_07_28: ServerProtocol.MCP_2026_07_28,
    Protocol.AIP_151: ServerProtocol.AIP_151,
}
_POLICY = PollPolicy(
    default_interval=timedelta(seconds=1),
    min_interval=timedelta(milliseconds=500),
    max_interval=timedelta(seconds=5),
    retry_backoff=timedelta(seconds=1),
)
_OPTIONS_TIMEOUTS = Timeouts(
    request=timedelta(seconds=30),
    result_wait=timedelta(seconds=30),
    input_probe=timedelta(seconds=1),
)


class Kinds:
    """The names of what a run can get wrong (the seed's invariants)."""

    TERMINAL = "terminal"
    DOUBLE_RECEIPT = "double-receipt"
    SECOND_OPERATION = "second-operation"
    UNFETCHED = "unfetched"
    AFTER_CANCEL = "after-cancel"
    WRONG_ROUND = "wrong-round"
    FENCE = "fence"
    LOST = "lost"
    REFUSED = "refused"
    UNVERSIONED = "unversioned"
    UNSETTLED = "unsettled"
    CRASHED = "crashed"
    STUCK = "stuck"


def _fault_kinds(scenario: Scenario) -> frozenset[Kind] | None:
    if scenario.fault_kinds is None:
        return None
    return frozenset(Kind(str(k)) for k in scenario.fault_kinds if str(k) in Kind.__members__.values())


class Incarnation:
    """One executor process: a ``Driver`` with its own adapter and HTTP client, at one epoch."""

    def __init__(self, world: WireWorld, index: int, epoch: Epoch) -> None:
        self.index = index
        self.epoch = epoch
        self.alive = True
        self.negotiated = False
        self.task: asyncio.Task[None] | None = None
        self.idle_at: object = None
        """The world's fingerprint when an advance last changed nothing (no use asking again until it moves)."""
        self.parked = False
        self.client = HttpClient(transport=world.net.gate(index, epoch), base_url="http://sim")
        self.backend: Backend = open_backend(
            world.protocol, world.url, client=self.client, token=None, options=world.options
        )
        self.driver = Driver(
            ledger=Recording(world.ledger, world.writes, index, epoch),
            backend=self.backend,
            clock=world.clock,
            rng=random.Random(index),
            server=world.server,
            epoch=epoch,
            policy=_POLICY,
        )

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()


class WireWorld:
    """The state of one run of the shipped code, and the steps that may change it."""

    def __init__(
        self, scenario: Scenario, protocol: Protocol, *, trace: bool = False, ledger: str = "memory"
    ) -> None:
        if ledger not in LEDGERS:
            raise ValueError(f"unknown ledger {ledger!r}; choose one of {', '.join(LEDGERS)}")
        self.scenario = scenario
        self.protocol = protocol
        self.ledger_kind = ledger
        if ledger == "duckdb":
            # One DuckDB ledger per process (opening and migrating one costs ~0.4 s); each run has a
            # server name, operation and call node of its own in it.
            run = next(_DUCK_RUNS)
            self.server, self.op_id, self.node = f"sim-{run}", OperationId(f"op-{run}"), f"node-{run}"
        else:
            self.server, self.op_id, self.node = "sim", OperationId("op-1"), "node-1"
        # The reference server (its app, event loop and virtual clock) is built once per protocol and
        # option set and reset for each run (``wire.RefServer``).
        self.ref = ref_server(_PROTOCOLS[protocol], idempotency=scenario.lookup_by_key)
        self.vt = self.ref.vt
        self.loop = self.ref.loop
        self.clock = EngineClock(self.vt)
        self.app = self.ref.app
        self.store = self.app.state.ctx.store
        self.url = "http://sim" if protocol is Protocol.AIP_151 else "http://sim/mcp"
        self.options = AdapterOptions(timeouts=_OPTIONS_TIMEOUTS, clock=self.clock)
        self.net = Network(
            self.loop, self.app, passthrough=frozenset({Kind.HANDSHAKE}), handshakes=self.ref.handshakes
        )
        self.ledger: Any = MemoryPort(self.server) if ledger == "memory" else _duck_ledger()
        self.writes: list[Write] = []
        self.recorded_epoch: int | None = None
        """The execution epoch the ledger records (set by a rollback; what a restart runs at)."""
        self.executors = [Incarnation(self, 0, CONFIGURED_EPOCH)]
        self.active = 0
        self.fault_kinds = _fault_kinds(scenario)
        self.drops = scenario.drops
        self.delays = scenario.delays
        self.dups = scenario.dups
        self.throttles = scenario.throttles
        self.corrupts = scenario.corrupts
        self.crashes = scenario.crashes
        self.raises = scenario.epoch_raises
        self.passes = 1 if scenario.expire else 0
        self.cancels = scenario.cancels
        self.max_generation = 0
        self.answering: asyncio.Task[None] | None = None
        self.findings: list[Finding] = []
        self.faulted = scenario.evict or scenario.flip or scenario.cancel_not_found
        """Whether something happened that may leave the outcome unknown (a create, lookup or result
        exchange that failed, a crash, a rollback, an expiry, a server losing tasks): a run without
        one must end with a receipt, never parked in UNKNOWN. A lost status read or cancel is retried
        and excuses nothing."""
        self.aborted = False
        self.submitted = False
        self.steps = 0
        self.lines: list[str] | None = [] if trace else None
        self.closed = False
        self.request = self._request()

    def _request(self) -> CallRequest:
        scenario = self.scenario
        sim: dict[str, Any] = {"duration_ms": DURATION_MS, "poll_interval_ms": 1000}
        script = scenario.script_for(self.protocol)
        if "input" in script:
            sim["input_rounds"] = script.count("input")
        if "fail" in script:
            sim["outcome"] = "failed"
        elif scenario.tool_error:
            sim["outcome"] = "is_error"
        if scenario.expire:
            sim["ttl_ms"] = 2 * DURATION_MS
        faults = []
        if scenario.evict:
            faults.append("not_found_before_expiry")
        if scenario.flip:
            faults.append("complete_on_cancel")
        if scenario.cancel_not_found:
            faults.append("not_found_on_cancel")
        if faults:
            sim["faults"] = faults
        return CallRequest(
            call_node_id=CallNodeId(self.node),
            tool=BATCH_TOOL if scenario.side_effects else REPORT_TOOL,
            arguments={"node": self.node, "_sim": sim},
            principal=PRINCIPAL,
        )

    # ------------------------------------------------------------------------------ running

    def _run(self, coro: Any) -> None:
        """Run ``coro`` on the loop, then every coroutine until all of them wait on the explorer."""

        async def body() -> None:
            await coro
            await settle(self.loop)

        self.loop.run_until_complete(body())

    def _spawn(self, inc: Incarnation, work: Callable[[], Any]) -> None:
        async def guarded() -> None:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except ReceiptConflict as exc:
                kind = Kinds.DOUBLE_RECEIPT if exc.field == "receipt" else Kinds.REFUSED
                self.findings.append((kind, str(exc)))
                self.aborted = True
            except LedgerError as exc:
                self.findings.append((Kinds.REFUSED, f"{type(exc).__name__}: {exc}"))
                self.aborted = True
            except (EngineError, BackendError, NegotiationError) as exc:
                # The shipped code let an engine error escape ``advance``: the operation is stuck.
                self.findings.append((Kinds.CRASHED, f"{type(exc).__name__} escaped the driver: {exc}"))
                self.aborted = True
            except Exception as exc:
                self.findings.append((Kinds.CRASHED, f"{type(exc).__name__}: {exc}"))
                self.aborted = True

        inc.task = self.loop.create_task(guarded())

    def fingerprint(self, op: Operation | None = None) -> tuple[object, ...]:
        """What an advance could see change; ``op`` is the row as just read (a DuckDB read is a
        query: the explorer's own reads of it were most of a DuckDB run's cost)."""
        if op is None:
            op = self.ledger.get(self.op_id)
        tasks = tuple(
            (t.task_id, t.status, t.rounds_answered, t.deleted_at is not None, t.cancel_at)
            for t in self.store._tasks.values()
        )
        # The executor's memory (what ``Driver`` keeps between actions: a refetch due, an answer to
        # re-send) decides its next action as much as the ledger does. Not the server's advised poll
        # interval: it only says when to wake, and the explorer decides that (a 2026-07-28 server
        # jitters it on every read, which made every poll look new and a run poll for ever).
        memory = canon(self.executors[self.active].driver._memory, _WAKE_ONLY)
        net = self.net
        return (op, tasks, self.vt.seconds, len(net.inflight), net.failures, memory)

    def state_key(self) -> tuple[object, ...] | None:
        """Everything the run's future depends on, at a quiet point; ``None`` elsewhere.

        Quiet: no coroutine of the driver or of the server is running (every exchange in flight has
        been given up by its sender), so what the next steps do is a function of data alone: the
        ledger (rows, receipts, held outcomes, answers, open items), the server's task records,
        keys and seeded generator, the messages still in flight, the virtual time, what the active
        executor's ``Driver`` keeps in memory (and its adapter's negotiated state and request
        numbering), the fault budgets left and what was found so far. Two runs with equal keys have
        the same futures (``engine.explore.prune`` merges them). Mid-exchange a coroutine's place in
        the code is not data, so those states are never merged. In-memory ledger only.
        """
        if self.ledger_kind != "memory":
            return None
        if any(inc.busy for inc in self.executors) or (
            self.answering is not None and not self.answering.done()
        ):
            return None
        net = self.net
        if net.busy or any(m.waiting for m in net.inflight):
            return None
        found = list(self.findings)
        self._check_writes(found)
        inc = self.executors[self.active]
        fingerprint = self.fingerprint()
        memory = fingerprint[-1]
        idle = None if inc.idle_at is None else (True if inc.idle_at == fingerprint else inc.idle_at)
        ledger = self.ledger
        return (
            canon(ledger.mem, _LEDGER_HISTORY),
            canon(
                [
                    {k: v for k, v in a.items() if k not in _ROUND_HISTORY}
                    for a in ledger.approvals(pending_only=False)
                ]
            ),
            canon(self.store, _SERVER_HISTORY),
            self.ref.protocol_state(),
            tuple(message_key(m) for m in net.inflight),
            self.vt.seconds,
            self.active,
            tuple((i.alive, i.epoch) for i in self.executors),
            (inc.negotiated, inc.parked, idle),
            memory,
            canon(inc.backend, _ADAPTER_CONNECTION),
            (self.drops, self.delays, self.dups, self.throttles, self.corrupts),
            (self.crashes, self.raises, self.passes, self.cancels, self.max_generation),
            tuple(found),
            (self.faulted, self.aborted, self.submitted, self._unknowns(), self.recorded_epoch),
        )

    # ----------------------------------------------------------------------------- stepping

    def enabled(self) -> list[Action]:
        """Every step that may run next, in a fixed order (the explorer chooses among them)."""
        if self.aborted:
            return []
        op = self.ledger.get(self.op_id)
        inc = self.executors[self.active]
        if op is None:
            return [] if self.submitted else [("executor", "submit", 0)]
        out: list[Action] = []
        if (
            inc.alive
            and not inc.busy
            and op.epoch == inc.epoch
            and op.state not in RECEIPT_STATES
            and inc.idle_at != self.fingerprint(op)
        ):
            out.append(("executor", "advance", self.active))
        kinds = self.fault_kinds
        faults = self.drops or self.delays or self.dups or self.throttles or self.corrupts
        for i, msg in enumerate(self.net.inflight):
            out.append(("network", "deliver", i))
            if not faults or (kinds is not None and msg.kind not in kinds):
                continue
            if msg.reply is None:
                if self.drops and (msg.waiting or msg.kind is Kind.INPUT):
                    out.append(("network", "drop", i))
                if self.delays and msg.waiting:
                    out.append(("network", "delay", i))
                if self.dups and (msg.kind is not Kind.SUBMIT or self.scenario.lookup_by_key):
                    out.append(("network", "duplicate", i))
                if self.throttles and msg.waiting and msg.kind in _REQUEST_FAULTS:
                    out.append(("network", "throttle", i))
            elif msg.waiting:
                if self.drops:
                    out.append(("network", "drop-reply", i))
                if self.corrupts and msg.kind in (Kind.RESULT, Kind.GET):
                    out.append(("network", "truncate", i))
        task = self._main_task()
        if task is not None:
            task.advance(self.store.now())
            nxt = task.next_event_at()
            if nxt is not None:
                out.append(("server", "work", task.task_id))
            expires = task.expires_at()
            if self.passes and expires is not None and not task.deleted:
                out.append(("clock", "pass-expiry", task.task_id))
        state = op.state
        if self.cancels and state in _PASSIVE and inc.alive:
            out.append(("caller", "cancel", None))
        if (
            state is S.INPUT_REQUIRED
            and self.ledger.answer_of(self.op_id, op.input_round) is None
            and self._round_message(op.input_round) is not None
            and (self.answering is None or self.answering.done())
        ):
            out.append(("caller", "answer", op.input_round))
        if state not in RECEIPT_STATES:
            if self.raises:
                out.append(("operator", "raise-epoch", None))
            crash_in = self.scenario.crash_in
            if self.crashes and (crash_in is None or state.value in crash_in):
                out.append(("executor", "crash", self.active))
        return out

    def _round_message(self, input_round: int) -> str | None:
        """The question a person was asked for the round (its approval row), if one was opened."""
        row = self.ledger.approval(self.op_id, input_round)
        return None if row is None else str(row["message"])

    def _main_task(self) -> Any:
        for task in self.store._tasks.values():
            if task.echo.get("node") == self.node:
                return task
        return None

    def perform(self, action: Action) -> None:
        """Run one step, then every coroutine it woke until all wait on the explorer again."""
        label = self.label(action) if self.lines is not None else ""
        self._perform(action)
        self.steps += 1
        if self.lines is not None:
            self.lines.append(f"{self.steps:>3}  {action[0]:<9} {label:<62} -> {self.state_text()}")

    def _perform(self, action: Action) -> None:
        actor, verb, arg = action
        if actor == "executor":
            if verb == "crash":
                self._crash()
            else:
                inc = self.executors[self.active]
                self._run(self._start_advance(inc, submit=verb == "submit"))
        elif actor == "network":
            assert isinstance(arg, int)
            msg = self.net.inflight[arg]
            self._run(self._network(verb, msg))
        elif actor == "server":
            task = self._main_task()
            nxt = task.next_event_at()
            self.vt.seconds = max(self.vt.seconds, nxt - 1000.0)
            self._run(self._wake_server())
        elif actor == "clock":
            task = self._main_task()
            self.passes -= 1
            self.faulted = True
            task.advance(self.store.now())
            expires = task.expires_at()
            self.vt.seconds = max(self.vt.seconds, expires - 1000.0 + 0.001)
            self._run(self._wake_server())
        elif actor == "caller":
            self._caller(verb)
        elif actor == "operator":
            self._raise_epoch()
        else:
            raise ValueError(f"unknown actor {actor!r}")

    async def _wake_server(self) -> None:
        self.app.state.ctx.notify()

    async def _start_advance(self, inc: Incarnation, *, submit: bool) -> None:
        before = self.fingerprint()

        async def work() -> None:
            if not inc.negotiated:
                await inc.backend.negotiate(PRINCIPAL)
                inc.negotiated = True
            if submit:
                self.submitted = True
                op = new_operation(
                    self.request,
                    operation_id=self.op_id,
                    protocol=self.protocol,
                    adapter_version="explorer",
                    server=self.server,
                    epoch=inc.epoch,
                    now=self.clock.now(),
                )
                wake = await inc.driver.submit_new(op, self.request.arguments)
            else:
                current = self.ledger.get(self.op_id)
                assert current is not None
                wake = await inc.driver.advance(current)
            self._after_advance(inc, before, wake)

        self._spawn(inc, work)

    def _after_advance(self, inc: Incarnation, before: object, wake: Wake) -> None:
        op = self.ledger.get(self.op_id)
        inc.parked = wake.at is None
        after = self.fingerprint(op)
        inc.idle_at = after if after == before or inc.parked else None
        if op is not None and self._unknowns() > MAX_UNKNOWNS:
            self.findings.append((Kinds.UNSETTLED, f"UNKNOWN entered {self._unknowns()} times: it cycles"))
            self.aborted = True

    def _unknowns(self) -> int:
        return sum(
            1
            for w in self.writes
            if w.transition.after.state is S.UNKNOWN and w.transition.before.state is not S.UNKNOWN
        )

    async def _network(self, verb: str, msg: Message) -> None:
        net = self.net
        if verb != "deliver" and msg.kind in _EXCUSING:
            self.faulted = True
        if verb == "deliver":
            if msg.reply is None:
                net.deliver(msg)
            else:
                net.deliver_reply(msg)
        elif verb == "drop":
            self.drops -= 1
            net.lose(msg, "request lost")
        elif verb == "drop-reply":
            self.drops -= 1
            net.lose(msg, "reply lost")
        elif verb == "delay":
            self.delays -= 1
            net.time_out(msg)
        elif verb == "duplicate":
            self.dups -= 1
            net.duplicate(msg)
        elif verb == "throttle":
            self.throttles -= 1
            net.throttle(msg)
        elif verb == "truncate":
            self.corrupts -= 1
            net.deliver_reply(msg, truncate=True)
        else:
            raise ValueError(f"unknown network step {verb!r}")

    def _caller(self, verb: str) -> None:
        op = self.ledger.get(self.op_id)
        assert op is not None
        inc = self.executors[self.active]
        if verb == "cancel":
            self.cancels -= 1
            try:
                after = inc.driver.request_cancel(op, actor="caller", reason="cancel clicked")
            except EngineError:
                return
            self.max_generation = max(self.max_generation, after.cancel_generation)
            return
        if verb == "answer":
            message = self._round_message(op.input_round) or ""
            round_ = op.input_round

            async def work() -> None:
                await inc.driver.answer(
                    op, input_round=round_, answer={"approve": True, "note": message}, actor="caller"
                )

            async def start() -> None:
                self.answering = self.loop.create_task(self._guard(work))

            self._run(start())
            return
        raise ValueError(f"unknown caller step {verb!r}")

    async def _guard(self, work: Callable[[], Any]) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except EngineError as exc:
            # A refused answer (the round moved on) is the caller's problem, not a divergence.
            if isinstance(exc, LedgerError):
                self.findings.append((Kinds.REFUSED, f"{type(exc).__name__}: {exc}"))
                self.aborted = True
        except (BackendError, NegotiationError):
            pass  # the answer did not get through; the driver re-sends it when the round shows again

    def _crash(self) -> None:
        dead = self.executors[self.active]
        self.crashes -= 1
        self.faulted = True
        dead.alive = False

        async def kill() -> None:
            for task in (dead.task, self.answering):
                if task is not None and not task.done():
                    task.cancel()
            self.net.orphan(dead.index)

        self._run(kill())
        self._start_executor()

    def _start_executor(self) -> None:
        """A new executor process, deciding as ``service/executor`` does (``engine.runtime.epochs``):
        it runs at the epoch the ledger recorded, not the configured one, and first adopts what a
        rollback left behind that epoch."""
        epoch = startup_epoch(CONFIGURED_EPOCH, self.recorded_epoch)
        fresh = Incarnation(self, len(self.executors), epoch)
        self.executors.append(fresh)
        self.active = fresh.index
        op = self.ledger.get(self.op_id)
        for left in behind([] if op is None else [op], epoch):
            t = adoption(left, epoch, "executor taking over", self.clock.now())
            try:
                self.ledger.apply(t)
            except LedgerError:
                continue
            self.writes.append(Write(-1, int(epoch), t, None, False))

    def _raise_epoch(self) -> None:
        """A rollback: the raised execution epoch is recorded in the ledger (the rollout state's
        compare-and-swap), and an executor at that epoch takes over while the old one's requests
        are still in flight."""
        self.raises -= 1
        self.faulted = True
        self.recorded_epoch = (self.recorded_epoch or CONFIGURED_EPOCH) + 1
        self._start_executor()

    # -------------------------------------------------------------------------------- checks

    def finish(self, *, unsettled: bool = False) -> list[Finding]:
        """Everything wrong with the run, from the ledger's writes and the server's own records."""
        findings = list(self.findings)
        try:
            findings.extend(self._judge(unsettled))
        finally:
            self.close()
        return findings

    def _judge(self, unsettled: bool) -> list[Finding]:
        out: list[Finding] = []
        op = self.ledger.get(self.op_id)
        if op is None:
            return out
        ours = [t for t in self.store._tasks.values() if t.echo.get("node") == self.node]
        if len(ours) > 1:
            names = ", ".join(t.task_id for t in ours)
            out.append((Kinds.SECOND_OPERATION, f"the server created {len(ours)} operations: {names}"))
        task = ours[0] if ours else None
        if task is not None:
            task.advance(self.store.now())
        self._check_writes(out)
        self._check_rounds(ours, out)
        receipt = self.ledger.receipt(self.node)
        if self.aborted:
            pass
        elif op.state in RECEIPT_STATES:
            truth = _truth(task)
            if receipt is None:
                out.append((Kinds.REFUSED, f"{op.state} without a receipt row"))
            elif truth is None:
                out.append((Kinds.TERMINAL, f"accepted {receipt.status}; the server never ended the task"))
            elif receipt.status is not truth:
                out.append((Kinds.TERMINAL, f"accepted {receipt.status}; the server's truth is {truth}"))
            elif truth is not ServerStatus.CANCELLED:
                expected = self._server_digest(op)
                if expected is not None and receipt.result_digest != expected:
                    out.append(
                        (
                            Kinds.UNFETCHED,
                            f"accepted {truth} with result digest {receipt.result_digest}; the server's "
                            f"result has digest {expected}",
                        )
                    )
        elif unsettled:
            out.append((Kinds.UNSETTLED, f"still {op.state} after {self.steps} steps"))
        elif op.state is S.UNKNOWN:
            if not self.faulted:
                out.append((Kinds.STUCK, "parked in UNKNOWN though nothing went wrong in the run"))
            if not any(
                r["operation_id"] == self.op_id and r["kind"] == "unknown"
                for r in self.ledger.reconciliation(open_only=True)
            ):
                out.append((Kinds.LOST, "UNKNOWN without a reconciliation item"))
            if op.task_id is None and not op.idempotency_key:
                out.append((Kinds.LOST, "UNKNOWN with neither task id nor key to find it by"))
        elif op.state is S.INPUT_REQUIRED:
            if self._round_message(op.input_round) is None:
                out.append((Kinds.LOST, f"INPUT_REQUIRED round {op.input_round} without an approval item"))
        else:
            out.append((Kinds.LOST, f"ended in {op.state} with nothing left to do"))
        if self.recorded_epoch is not None and op.epoch < self.recorded_epoch:
            out.append(
                (
                    Kinds.FENCE,
                    f"the ledger recorded epoch {self.recorded_epoch} (a rollback), yet the operation is "
                    f"still driven at epoch {op.epoch}: replies of the older epoch are accepted",
                )
            )
        if op.cancel_generation < self.max_generation:
            out.append((Kinds.LOST, f"cancel generation {self.max_generation} was recorded, then lost"))
        return out

    def _check_writes(self, out: list[Finding]) -> None:
        for w in self.writes:
            t = w.transition
            before, after = t.before, t.after
            if not t.accepted or after == before:
                continue
            if after.row_version != before.row_version + 1:
                out.append(
                    (
                        Kinds.UNVERSIONED,
                        f"{type(t.event).__name__} moved {before.state} -> {after.state} at row version "
                        f"{before.row_version} -> {after.row_version}",
                    )
                )
            if before.state in RECEIPT_STATES and after.state is not before.state:
                out.append((Kinds.AFTER_CANCEL, f"a receipt was moved on: {before.state} -> {after.state}"))
            if w.writer >= 0 and w.writer_epoch != before.epoch:
                out.append(
                    (
                        Kinds.FENCE,
                        f"executor {w.writer} at epoch {w.writer_epoch} recorded {type(t.event).__name__} "
                        f"on an operation at epoch {before.epoch}",
                    )
                )
            stamped = None if isinstance(t.event, EpochRaised) else getattr(t.event, "epoch", None)
            if isinstance(stamped, int) and stamped != before.epoch:
                out.append(
                    (
                        Kinds.FENCE,
                        f"{type(t.event).__name__} stamped epoch {stamped} changed an operation at epoch {before.epoch}",
                    )
                )
            generation = getattr(t.event, "generation", None)
            if (
                isinstance(t.event, CancelConfirmed | CancelAcknowledged | CancelRefusedTerminal)
                and generation != before.cancel_generation
            ):
                out.append(
                    (
                        Kinds.FENCE,
                        f"a reply to cancel generation {generation} changed an operation at generation "
                        f"{before.cancel_generation}",
                    )
                )
            if (
                w.receipt
                and after.state is S.ACCEPTED
                and (not isinstance(t.event, ResultVerified) or w.payload is None)
            ):
                out.append(
                    (
                        Kinds.UNFETCHED,
                        f"{after.server_status} accepted by {type(t.event).__name__} without a fetched result",
                    )
                )

    def _check_rounds(self, tasks: list[Any], out: list[Finding]) -> None:
        """Every answer the server took must have been given for the question of that round."""
        for task in tasks:
            for number in range(1, task.sim.input_rounds + 1):
                question = task._round(number)
                answer = task.answers.get(question.key)
                if answer is None:
                    continue
                content = answer.get("content") if isinstance(answer, dict) else None
                note = content.get("note") if isinstance(content, dict) else None
                if note != question.message:
                    out.append(
                        (
                            Kinds.WRONG_ROUND,
                            f"round {number} ({question.message!r}) got the answer given for {note!r}",
                        )
                    )

    def _server_digest(self, op: Operation) -> str | None:
        """The digest of the result the server holds, read by a fresh adapter (the judge).

        Kept per protocol, scenario, call node (the arguments), task and epochs: the server's result is
        planned from the arguments alone, so every run that ends the same task the same way reads the
        same result.
        """
        task = self._main_task()
        memo = (
            self.protocol,
            self.scenario,
            self.node,
            task.task_id,
            task.status,
            task.result_epoch,
            op.epoch,
        )
        if memo in _JUDGED:
            return _JUDGED[memo]
        found = self._read_digest(op)
        if found is not None:
            _JUDGED[memo] = found
        return found

    def _read_digest(self, op: Operation) -> str | None:
        judge_net = Network(self.loop, self.app, passthrough=frozenset(Kind))
        digest: list[str] = []

        async def read() -> None:
            async with HttpClient(transport=judge_net.gate(-1, int(op.epoch))) as client:
                backend = open_backend(
                    self.protocol, self.url, client=client, token=None, options=self.options
                )
                try:
                    await backend.negotiate(PRINCIPAL)
                    outcome = await backend.fetch_result(op)
                except (BackendError, NegotiationError):
                    return
                digest.append(outcome.digest)
            await judge_net.close()

        self._run(read())
        return digest[0] if digest else None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True

        async def shut() -> None:
            current = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not current:
                    task.cancel()
            await self.net.close()
            for inc in self.executors:
                await inc.client.aclose()
            await asyncio.gather(
                *(t for t in asyncio.all_tasks() if t is not current), return_exceptions=True
            )

        self.loop.run_until_complete(shut())
        self.ref.release()

    @property
    def parked(self) -> bool:
        op = self.ledger.get(self.op_id)
        return op is not None and op.state in (S.UNKNOWN, S.INPUT_REQUIRED)

    # ------------------------------------------------------------------------------- traces

    def label(self, action: Action) -> str:
        actor, verb, arg = action
        if actor == "network":
            assert isinstance(arg, int)
            msg = self.net.inflight[arg]
            what = f"{msg.kind}#{msg.rid} from executor {msg.owner} (epoch {msg.epoch})"
            if msg.reply is not None:
                what = f"{msg.kind}#{msg.rid} reply HTTP {msg.reply.status}: {_peek(msg)}"
            return f"{verb} {what}"
        if actor == "executor" and verb != "crash":
            inc = self.executors[self.active]
            return f"executor {inc.index} (epoch {inc.epoch}): {verb}"
        if actor == "server":
            return "server work moves on (clock to its next event)"
        return verb if arg is None else f"{verb} {arg}"

    def state_text(self) -> str:
        op = self.ledger.get(self.op_id)
        local = "-" if op is None else f"{op.state} e{op.epoch} g{op.cancel_generation}"
        task = self._main_task()
        remote = (
            "no task"
            if task is None
            else f"{task.task_id} {task.status}" + (" (deleted)" if task.deleted else "")
        )
        return f"{local} / {remote} @{self.vt.seconds:.1f}s"


_LEDGER_HISTORY = frozenset({"writes", "rejected"})
"""MemLedger counters of writes made: history, not state (the row versions say what changed). The
port's transition log, poll records and the instants its entries were opened at are history too:
the key reads the operations and entries from ``MemoryPort.mem``, the approval rounds without
``_ROUND_HISTORY``."""
_ROUND_HISTORY = frozenset({"opened_at", "answered_at", "closed_at"})
"""When an approval round was opened, answered or closed: recorded, never read by the driver."""
_SERVER_HISTORY = frozenset({"_log", "anchor", "clock", "config", "_new_id"})
"""The task store's request counters and its fixed wiring."""
_WAKE_ONLY = frozenset({"advised"})
"""What a ``Driver`` keeps only to say when to wake (the server's advised poll interval): the explorer
decides when an executor advances, so it changes no outcome (its generator, which only jitters the
wake time, is left out of the key for the same reason)."""
_ADAPTER_CONNECTION = frozenset({"session_id", "_client", "_options", "_token", "_ids", "_lock"})
"""An adapter's connection: the session id is the server's name for a connection (one per process,
reused by every run), the client and options are the same in every run, and the JSON-RPC request
numbering is a renaming (``wire.without_rpc_ids``)."""
_JUDGED: dict[tuple[object, ...], str] = {}
_DUCK_RUNS = itertools.count(1)
_DUCK: list[Any] = []


def _duck_ledger() -> Any:
    if not _DUCK:
        from engine.ledger import Ledger  # imported here: most runs use the in-memory ledger

        _DUCK.append(Ledger.open(":memory:"))
    return _DUCK[0]


def _truth(task: Any) -> ServerStatus | None:
    if task is None or task.status not in (
        ServerTaskStatus.COMPLETED,
        ServerTaskStatus.FAILED,
        ServerTaskStatus.CANCELLED,
    ):
        return None
    return ServerStatus(task.status.value)


def _peek(msg: Message) -> str:
    assert msg.reply is not None
    text = msg.reply.body().decode("utf-8", "replace")
    return (text[:60] + "...") if len(text) > 60 else text


__all__ = [
    "DURATION_MS",
    "LEDGERS",
    "MAX_UNKNOWNS",
    "PRINCIPAL",
    "Action",
    "Finding",
    "Incarnation",
    "Kinds",
    "S",
    "WireWorld",
]
