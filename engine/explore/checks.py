"""The checks of one run of the shipped code, and its readable timeline: what ``WireWorld`` judges.

Every rule of the seed a run can break is named in ``Kinds``; ``RunChecks.finish`` reads the
ledger's writes (``wire.Recording``'s log) and the reference server's own records, never what the
driver says about itself. ``label`` and ``state_text`` render a step and the state after it for
the printed timeline. Part of ``engine.explore.shipped.WireWorld`` (a mixin): it must not step the
run, only read it (the judge's own read of a result goes through a fresh adapter).
"""

from __future__ import annotations

from typing import Any

from engine.adapters import AdapterOptions, open_backend
from engine.errors import BackendError, NegotiationError
from engine.explore.scenario import Scenario
from engine.explore.wire import Kind, Message, Network, VirtualLoop, VirtualTime, Write
from engine.model import (
    RECEIPT_STATES,
    CancelAcknowledged,
    CancelConfirmed,
    CancelRefusedTerminal,
    EpochRaised,
    LocalState,
    Operation,
    OperationId,
    Principal,
    Protocol,
    ResultVerified,
    ServerStatus,
)
from refserver.task import Status as ServerTaskStatus

S = LocalState
Action = tuple[str, str, object]
Finding = tuple[str, str]
PRINCIPAL = Principal("anonymous")


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
    UNRECORDED = "unrecorded"
    """A create or a cancel sent before the ledger durably recorded it (record, then send)."""


class RunChecks:
    """The judging half of ``WireWorld``: what the run got wrong, from the ledger and the server."""

    scenario: Scenario
    protocol: Protocol
    ledger: Any
    store: Any
    app: Any
    loop: VirtualLoop
    vt: VirtualTime
    net: Network
    url: str
    options: AdapterOptions
    node: str
    op_id: OperationId
    writes: list[Write]
    findings: list[Finding]
    recorded_epoch: int | None
    raised_at: list[tuple[int, int]]
    max_generation: int
    faulted: bool
    aborted: bool
    steps: int
    executors: list[Any]
    active: int

    def _main_task(self) -> Any:
        raise NotImplementedError

    def _round_message(self, input_round: int) -> str | None:
        raise NotImplementedError

    def _run(self, coro: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

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
        if (
            self.recorded_epoch is not None
            and op.epoch < self.recorded_epoch
            and op.state not in RECEIPT_STATES
        ):
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
        for sent in self.net.fenced_sends:
            out.append(
                (Kinds.FENCE, f"{sent} sent for an operation another epoch owns: the fenced driver talked")
            )
        marks = iter(self.raised_at)
        mark = next(marks, None)
        ruling = 0
        """The execution epoch the ledger recorded when the write was made (0: none recorded)."""
        for index, w in enumerate(self.writes):
            while mark is not None and mark[0] <= index:
                ruling = mark[1]
                mark = next(marks, None)
            t = w.transition
            before, after = t.before, t.after
            if not t.accepted or after == before:
                continue
            if before.epoch < ruling and not isinstance(t.event, EpochRaised):
                out.append(
                    (
                        Kinds.FENCE,
                        f"{type(t.event).__name__} of epoch {before.epoch} moved {before.state} -> "
                        f"{after.state} after the rollback to epoch {ruling}: a write of the older "
                        "epoch was accepted",
                    )
                )
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
            # An adoption moves the operation to its writer's epoch; every other write keeps it there.
            adopted = isinstance(t.event, EpochRaised)
            owner = after.epoch if adopted else before.epoch
            if w.writer >= 0 and w.writer_epoch != owner:
                out.append(
                    (
                        Kinds.FENCE,
                        f"executor {w.writer} at epoch {w.writer_epoch} recorded {type(t.event).__name__} "
                        f"on an operation at epoch {before.epoch}"
                        + (f" (adopting it at {after.epoch})" if adopted else ""),
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
            async with judge_net.client(-1, int(op.epoch)) as client:
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


_JUDGED: dict[tuple[object, ...], str] = {}
"""Server result digests the judge read, by what decides them (``_server_digest``)."""


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


__all__ = ["PRINCIPAL", "Action", "Finding", "Kinds", "RunChecks", "S"]
