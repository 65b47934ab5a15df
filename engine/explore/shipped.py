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
from engine.adapters.base import Backend, Capabilities
from engine.adapters.config import Timeouts
from engine.errors import (
    BackendError,
    ConfigError,
    EngineError,
    LedgerError,
    NegotiationError,
    ReceiptConflict,
)
from engine.explore.actors import ActorSteps
from engine.explore.checks import PRINCIPAL, Action, Finding, Kinds, S
from engine.explore.keys import StateKeys, track_tasks
from engine.explore.scenario import Scenario
from engine.explore.wire import (
    EngineClock,
    Kind,
    Message,
    Network,
    Recording,
    SeenRows,
    Write,
    WriterJob,
    ref_server,
    settle,
)
from engine.ledger.memory import MemoryPort
from engine.model import (
    RECEIPT_STATES,
    CallNodeId,
    CallRequest,
    Epoch,
    Operation,
    OperationId,
    Protocol,
    new_operation,
)
from engine.runtime.driver import Driver, Wake
from engine.runtime.epochs import adoption, behind, startup_epoch
from engine.schedule import PollPolicy
from engine.testing import BATCH_TOOL, REPORT_TOOL
from refserver.context import Protocol as ServerProtocol

LEDGERS = ("memory", "duckdb")
DURATION_MS = 10_000
"""The tool's work, in virtual milliseconds (long enough that no protocol answers synchronously)."""
MAX_UNKNOWNS = 3
CONFIGURED_EPOCH = Epoch(1)
"""The epoch an executor's configuration names (a restarted one runs at the ledger's, if recorded)."""
_PASSIVE = frozenset({S.WORKING, S.INPUT_REQUIRED, S.CANCEL_REQUESTED})
_RECORDED_BEFORE = {
    Kind.SUBMIT: frozenset({S.SUBMITTING, S.SUBMISSION_UNKNOWN}),
    Kind.CANCEL: frozenset({S.CANCEL_REQUESTED}),
}
"""What the ledger must durably hold when a request that changes the server goes out (``_sent``)."""
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
        self.client = world.net.gate(index, epoch)
        self.backend: Backend = open_backend(
            world.protocol, world.url, client=self.client, token=None, options=world.options
        )
        recording = Recording(world.ledger_for_drivers, world.writes, index, epoch)
        self.seat: Any = None
        """The service executor this incarnation runs in (``service.explore_seat.Seat``): group
        scenarios only; otherwise the ``Driver`` writes straight to the ledger."""
        if world.scenario.groups:
            Seat = _seat_for(world.scenario)
            # The service negotiates with every server before its loop starts (``Loop.start``).
            caps = world.negotiate(self.backend)
            self.negotiated = True
            self.seat = Seat(
                recording,
                clock=world.clock,
                index=index,
                epoch=epoch,
                protocol=world.protocol,
                server=world.server,
                backend=self.backend,
                caps=caps,
                policy=_POLICY,
            )
            self.driver: Driver = self.seat.driver
            return
        self.driver = Driver(
            ledger=recording,
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


SeatFactory = Callable[..., Any]
"""Builds one service executor incarnation for a group scenario (``service.explore_seat.Seat``)."""

_service_seat: list[SeatFactory] = []


def use_service_executor(seat: SeatFactory) -> None:
    """Run the scenarios with ``groups`` on ``seat``: the service executor's own write groups.

    The service composes the engine, never the other way round, so the engine cannot import the
    executor it explores; a composition root hands it in (``service.explore_seat.plug_into_the_explorer``:
    ``finality explore``, the benchmarks and the tests do).
    """
    _service_seat[:] = [seat]


def _seat_for(scenario: Scenario) -> SeatFactory:
    """The service executor's seat for ``scenario``.

    Raises:
        ConfigError: no composition root plugged the service executor in.
    """
    if not _service_seat:
        raise ConfigError(
            f"scenario {scenario.name}",
            "runs the service executor's write groups: plug it in first "
            "(service.explore_seat.plug_into_the_explorer(); `finality explore` does)",
        )
    return _service_seat[0]


class WireWorld(ActorSteps, StateKeys):
    """The state of one run of the shipped code, and the steps that may change it (its checks are
    ``checks.RunChecks``, its state key ``keys.StateKeys``, the network's and the caller's steps
    ``actors.ActorSteps``)."""

    def __init__(
        self, scenario: Scenario, protocol: Protocol, *, trace: bool = False, ledger: str = "memory"
    ) -> None:
        if ledger not in LEDGERS:
            raise ValueError(f"unknown ledger {ledger!r}; choose one of {', '.join(LEDGERS)}")
        if scenario.groups:
            _seat_for(scenario)  # refused before the first run, not inside one
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
        track_tasks(self.loop)  # every coroutine of the run keyed by its label (``keys.Tracked``)
        self.clock = EngineClock(self.vt)
        self.app = self.ref.app
        self.store = self.app.state.ctx.store
        self.url = "http://sim" if protocol is Protocol.AIP_151 else "http://sim/mcp"
        self.options = AdapterOptions(
            timeouts=_OPTIONS_TIMEOUTS, clock=self.clock, request_id_dedupe=scenario.request_id_dedupe
        )
        self.net = Network(
            self.loop, self.app, passthrough=frozenset({Kind.HANDSHAKE}), handshakes=self.ref.handshakes
        )
        self.net.on_send = self._sent
        self.jobs: list[WriterJob] = []
        """Group commits handed to the writer thread, not landed yet (group scenarios)."""
        self.loop.held = self.jobs if scenario.groups else None
        seen = None if ledger == "memory" else SeenRows(_duck_ledger())
        self.ledger: Any = MemoryPort(self.server) if seen is None else seen
        self.ledger_for_drivers: Any = self.ledger if seen is None else seen.writer
        """What the drivers write through (on DuckDB: the ledger itself, telling the explorer's
        ``SeenRows`` of every write)."""
        self.writes: list[Write] = []
        self.recorded_epoch: int | None = None
        """The execution epoch the ledger records (set by a rollback; what a restart runs at)."""
        self.raised_at: list[tuple[int, int]] = []
        """Each rollback: how many writes the ledger had logged when it recorded the raised epoch, and that epoch."""
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
        self.stale_advances = scenario.stale_advances
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

    def negotiate(self, backend: Backend) -> Capabilities:
        """Negotiate now (handshakes pass straight through the network)."""
        out: list[Capabilities] = []

        async def body() -> None:
            out.append(await backend.negotiate(PRINCIPAL))

        self._run(body())
        return out[0]

    def _sent(self, msg: Message) -> None:
        """Record, then send: a create goes out only while the ledger durably holds the operation with
        its submission open under its key (SUBMITTING; SUBMISSION_UNKNOWN, where MCP looks the key up
        by sending the create again), a cancel only while it durably holds CANCEL_REQUESTED (the
        raised generation recorded). The ledger is read as it is, not as an executor's buffer shows it."""
        if msg.kind not in (Kind.SUBMIT, Kind.CANCEL):
            return
        durable = self.ledger.get(self.op_id)
        needed = _RECORDED_BEFORE[msg.kind]
        if durable is None or durable.state not in needed:
            held = "no operation" if durable is None else str(durable.state)
            self.findings.append(
                (
                    Kinds.UNRECORDED,
                    f"{msg.kind} sent by executor {msg.owner} while the ledger durably held {held}, "
                    f"not {' or '.join(sorted(needed))}",
                )
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
        seat = inc.seat
        if (
            inc.alive
            and not inc.busy
            and op.epoch == inc.epoch
            and op.state not in RECEIPT_STATES
            and (seat is None or seat.due(self.op_id))
            # Keyed only against a mark: with none (most steps) the advance is offered whatever
            # the fingerprint says, and rendering the driver's memory for it was a share of a step.
            and (inc.idle_at is None or inc.idle_at != self.fingerprint(op))
        ):
            out.append(("executor", "advance", self.active))
        if seat is not None and inc.alive:
            if not inc.busy and seat.can_commit():
                out.append(("executor", "commit", self.active))
            if any(not job.future.done() for job in self.jobs):
                out.append(("executor", "write", self.active))
        if self.stale_advances and op.state not in RECEIPT_STATES:
            for old in self.executors:
                if old.alive and not old.busy and old.index != self.active and old.negotiated:
                    out.append(("executor", "advance-stale", old.index))
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
            if self.raises and (seat is None or (inc.alive and seat.can_roll_back())):
                out.append(("operator", "raise-epoch", None))
                if seat is not None and self.crashes:  # the raise recorded, the process dead before it adopts
                    out.append(("operator", "raise-epoch-crash", None))
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
        mark = self.before_step(action)
        self._perform(action)
        self.steps += 1
        self.after_step(mark)
        if self.lines is not None:
            self.lines.append(f"{self.steps:>3}  {action[0]:<9} {label:<62} -> {self.state_text()}")

    def _perform(self, action: Action) -> None:
        actor, verb, arg = action
        if actor == "executor":
            if verb == "crash":
                self._crash()
            elif verb == "commit":
                self._run(_on_loop(self.executors[self.active].seat.start_commit))
            elif verb == "write":
                seat = self.executors[self.active].seat
                refused = seat.refused()
                self._run(self._land())
                if seat.refused() != refused:
                    # The executor put what the ledger refused back on its heap: its own decision.
                    self.executors[self.active].idle_at = None
            elif verb == "advance-stale":
                assert isinstance(arg, int)
                self.stale_advances -= 1
                self._run(self._start_advance(self.executors[arg], submit=False))
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
            self._raise_epoch(crash=verb == "raise-epoch-crash")
        else:
            raise ValueError(f"unknown actor {actor!r}")

    async def _wake_server(self) -> None:
        self.app.state.ctx.notify()

    async def _land(self) -> None:
        """The group commit handed to the writer thread lands (it runs, on the explorer's thread)."""
        jobs = [job for job in self.jobs if not job.future.done()]
        self.jobs.clear()
        for job in jobs:
            job.run()

    def _new_operation(self, inc: Incarnation) -> Operation:
        return new_operation(
            self.request,
            operation_id=self.op_id,
            protocol=self.protocol,
            adapter_version="explorer",
            server=self.server,
            epoch=inc.epoch,
            now=self.clock.now(),
        )

    def _submit_grouped(self, inc: Incarnation) -> None:
        """A submission as the service records it: the operation is created in the ledger (durable
        before the caller is answered), then held and scheduled; its advance sends the create."""
        self.submitted = True
        stored, created = self.ledger.create_operation(self._new_operation(inc), self.request.arguments)
        inc.seat.track(stored, created=created, arguments=self.request.arguments)

    async def _start_advance(self, inc: Incarnation, *, submit: bool) -> None:
        if inc.seat is not None:
            if submit:
                self._submit_grouped(inc)
                return
            self._spawn(inc, self._grouped_advance(inc))
            return
        before = self.fingerprint()

        async def work() -> None:
            if not inc.negotiated:
                await inc.backend.negotiate(PRINCIPAL)
                inc.negotiated = True
            if submit:
                self.submitted = True
                wake = await inc.driver.submit_new(self._new_operation(inc), self.request.arguments)
            else:
                current = self.ledger.get(self.op_id)
                assert current is not None
                # An advance begun on an operation another epoch owns must send nothing (FENCED):
                # the network reports any request it sends while this mark is set.
                fenced = current.epoch != inc.epoch
                if fenced:
                    self.net.fenced.add(inc.index)
                try:
                    wake = await inc.driver.advance(current)
                finally:
                    self.net.fenced.discard(inc.index)
            self._after_advance(inc, before, wake)

        self._spawn(inc, work)

    def _grouped_advance(self, inc: Incarnation) -> Callable[[], Any]:
        """The executor launches the advance (``_launch``); it ends in ``_finished``, waiting for its group."""
        before = self.fingerprint()

        async def work() -> None:
            running = inc.seat.launch(self.op_id)
            if running is None:
                return
            wake = await running
            self._after_advance(inc, before, wake)

        return work

    def _after_advance(self, inc: Incarnation, before: object, wake: Wake) -> None:
        op = self.ledger.get(self.op_id)
        inc.parked = wake.at is None
        after = self.fingerprint(op)
        # A parked driver is not asked again until something moves; under the service executor it
        # is not on the heap then (``Seat.due``), unless the executor itself put it back (a person
        # acted meanwhile, or a write was refused): its own decision, not the explorer's.
        parked = inc.parked and inc.seat is None
        inc.idle_at = after if after == before or parked else None
        if op is not None and self._unknowns() > MAX_UNKNOWNS:
            self.findings.append((Kinds.UNSETTLED, f"UNKNOWN entered {self._unknowns()} times: it cycles"))
            self.aborted = True

    def _unknowns(self) -> int:
        return sum(
            1
            for w in self.writes
            if w.transition.after.state is S.UNKNOWN and w.transition.before.state is not S.UNKNOWN
        )

    def _crash(self) -> None:
        dead = self.executors[self.active]
        self.crashes -= 1
        self.faulted = True
        dead.alive = False

        async def kill() -> None:
            for task in (dead.task, self.answering):
                if task is not None and not task.done():
                    task.cancel()
            if dead.seat is not None:
                # What it buffered and the group it was committing die with it: never durable.
                dead.seat.kill()
                for job in self.jobs:
                    job.future.cancel()
                self.jobs.clear()
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
        if fresh.seat is not None:
            # The service's own start (``Loop._resume``): adopt what a rollback left behind, hold the rest.
            fresh.seat.resume()
            return
        op = self.ledger.get(self.op_id)
        for left in behind([] if op is None else [op], epoch):
            t = adoption(left, epoch, "executor taking over", self.clock.now())
            try:
                self.ledger.apply(t)
            except LedgerError:
                continue
            self.writes.append(Write(-1, int(epoch), t, None, False))

    def _raise_epoch(self, *, crash: bool = False) -> None:
        """A rollback: the raised epoch is recorded (the rollout state's compare-and-swap) and an executor
        at it takes over; a service executor raises its own (``Seat.rollback``) or dies first (``crash``)."""
        self.raises -= 1
        self.faulted = True
        inc = self.executors[self.active]
        if inc.seat is not None:
            self._run(_on_loop(inc.seat.flush))
        self.recorded_epoch = (self.recorded_epoch or CONFIGURED_EPOCH) + 1
        self.raised_at.append((len(self.writes), self.recorded_epoch))
        if crash:
            self._crash()
        elif inc.seat is not None:
            inc.epoch = Epoch(self.recorded_epoch)
            self._run(_on_loop(lambda: inc.seat.rollback(inc.epoch)))
            inc.client.epoch = inc.epoch  # what the process sends from now on is sent at the raised epoch
            inc.driver, inc.idle_at = inc.seat.driver, None
        else:
            self._start_executor()

    # -------------------------------------------------------------------------------- checks

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


async def _on_loop(call: Callable[[], object]) -> None:
    call()  # a seat's call that may create tasks or futures: made on the running loop


_DUCK_RUNS = itertools.count(1)
_DUCK: list[Any] = []


def _duck_ledger() -> Any:
    if not _DUCK:
        from engine.ledger import Ledger  # imported here: most runs use the in-memory ledger

        # One DuckDB worker thread: the explorer's queries touch a few rows each, and handing
        # every one to a second thread and back cost more CPU than it ran (measured: 5% of the
        # DuckDB share's CPU).
        _DUCK.append(Ledger.open(":memory:", threads=1))
    return _DUCK[0]


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
    "SeatFactory",
    "WireWorld",
    "use_service_executor",
]
