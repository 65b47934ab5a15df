"""The service executor's seat in the race explorer: the shipped ``service.executor`` code that
buffers an advance's writes, commits them as a group and only then hands the advance back, run by
``engine.explore`` for the scenarios with ``groups``.

A scenario with ``groups`` runs each executor incarnation as the service does: its ``Driver`` writes
into the executor's ``BatchingLedger``; an advance is launched by the executor's own ``_launch``
(``_advance``: the stale-value refresh and the steps that send nothing run on in it) and, when it
ends, sits in ``_finished``; the group commit is the executor's own ``_start_commit`` / ``_commit``
(``_refused``, ``_after``, ``_schedule``), whose hop to the writer thread (``asyncio.to_thread``) is
held by the virtual loop until the explorer lets it land (``wire.WriterJob``). So the explorer
chooses when a group commit starts, when it lands, and whether the process dies first: buffered
writes and a group in the middle of its commit are then lost, and the restarted executor resumes
from the ledger (``_track``, as ``start`` does). Cancel clicks go through the executor's own person
action (``_cancel_now``, committed at once).

A rollback is the executor's own epoch raise (``RolloutAdoption._raise_epoch``, what
``rollout_act`` runs once the rollout state's compare-and-swap recorded the raised epoch: fresh
drivers at the new epoch, every live operation adopted through ``_adopt_operations``); advances
still running keep their old driver, so their replies arrive after the raise. A restarted executor
starts as the service's does (``Loop._resume``: what a rollback left behind the epoch is adopted
first, every live operation held and due, none resubmitted).

The explorer lives in the engine and the executor in the service, which composes the engine: so
the engine never imports this module. A composition root (``finality explore``, the benchmarks, the
tests) plugs it in with ``plug_into_the_explorer()``; a group scenario run without it is refused,
naming that. It decides nothing itself and must not copy any of the executor's decisions.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from engine.adapters.base import Backend, Capabilities
from engine.clock import Clock
from engine.explore.shipped import use_service_executor
from engine.explore.wire import Recording
from engine.model import Epoch, LocalState, Operation, OperationId, Protocol
from engine.runtime.driver import Driver
from engine.schedule import PollPolicy
from service.config import ServerConfig, ServiceConfig
from service.executor.base import Server
from service.executor.core import Executor

ROLLBACK_ACTOR = "operator (rollback)"


class RunLedger:
    """The ledger as one run's executor sees it: the run's own slice of the explorer's ledger.

    The explorer keeps one DuckDB ledger per process (opening one costs ~0.4 s), each run with a
    server of its own in it; a service owns its ledger alone, so its start and its rollback read
    "every live operation" (``SoleOwner``): here, those of this run's server. Everything else is the
    wrapped ledger's own (the explorer's ``Recording``).
    """

    def __init__(self, inner: Recording, server: str) -> None:
        self._inner = inner
        self._server = server

    def operations(
        self, *, states: Sequence[LocalState] | None = None, limit: int | None = None
    ) -> list[Operation]:
        found = [op for op in self._inner.operations(states=states) if op.server == self._server]
        return found if limit is None else found[:limit]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Seat:
    """One service executor process as the explorer drives it: the shipped ``Executor`` with one server."""

    def __init__(
        self,
        ledger: Recording,
        *,
        clock: Clock,
        index: int,
        epoch: Epoch,
        protocol: Protocol,
        server: str,
        backend: Backend,
        caps: Capabilities,
        policy: PollPolicy,
    ) -> None:
        self._recording = ledger
        self.executor = Executor(
            ledger=RunLedger(ledger, server),
            config=ServiceConfig(servers={}, tools={}),
            clock=clock,
            rng=random.Random(index),
            epoch=epoch,
        )
        ex = self.executor
        ex._policy = policy
        config = ServerConfig(name=server, url=server, protocol=protocol.value)
        ex._servers[server] = Server(config, protocol, backend, caps, ex._new_driver(config, backend, caps))
        self._server = ex._servers[server]

    @property
    def driver(self) -> Driver:
        """The server's current driver (a rollback replaces it; advances running keep the old one)."""
        return self._server.driver

    @property
    def epoch(self) -> Epoch:
        return self.executor.epoch

    # ------------------------------------------------------------------------- what the loop does

    def track(self, op: Operation, *, created: bool, arguments: Any) -> None:
        """Hold ``op`` and schedule it now: a new submission (``created``) or one found at start."""
        self.executor._track(self._server, op, created, arguments)

    def due(self, op_id: OperationId) -> bool:
        """Whether ``op_id`` is on the heap (handed back after its last group commit, not running)."""
        ex = self.executor
        return op_id in ex._due_at and op_id not in ex._running

    def launch(self, op_id: OperationId) -> Any:
        """Launch the advance the heap holds for ``op_id`` now (the explorer decides when it is due);
        the future of its ``_advance``."""
        ex = self.executor
        del ex._due_at[op_id]  # its heap entry is superseded and skipped, as ``_launch_due`` does
        ex._launch(op_id)
        return ex._running.get(op_id)

    def can_commit(self) -> bool:
        """Whether a group commit may start: something is buffered or an advance waits for one, and
        no commit is in flight."""
        ex = self.executor
        return not ex._commit_in_flight() and bool(ex._finished or ex._store.pending)

    def start_commit(self) -> None:
        self.executor._start_commit()

    def committing(self) -> bool:
        return self.executor._commit_in_flight()

    def holds_writes(self) -> bool:
        """Whether anything written is not durable yet, or an advance waits for its group."""
        ex = self.executor
        return bool(ex._finished or ex._store.pending) or ex._commit_in_flight()

    def resume(self) -> None:
        """The executor starts from the ledger as the service's does (``Loop._resume``)."""
        self.executor._resume()

    def flush(self) -> None:
        """What ``rollout_act`` does first: commit everything buffered, on the loop's thread (the
        finished advances go back to the heap), before the rollout state is read and written."""
        self.executor._flush()

    def rollback(self, epoch: Epoch) -> None:
        """The rollback recorded ``epoch`` in the ledger: the executor raises its own epoch and
        adopts (``_raise_epoch``, as ``rollout_act`` does next). Between ticks, as ``rollout_act``
        runs: never while a group commit is in flight (``can_roll_back``)."""
        self._recording.moved_to(int(epoch))
        self.executor._raise_epoch(epoch, ROLLBACK_ACTOR)

    def can_roll_back(self) -> bool:
        """Whether a rollout action may run now: between ticks, no group commit in flight."""
        return not self.executor._commit_in_flight()

    def refused(self) -> int:
        """How many buffered writes the ledger has refused so far (``_refused`` followed each)."""
        return self.executor.stats["refused"]

    def cancel(self, op: Operation, *, actor: str, reason: str) -> Operation:
        """A person's cancel, recorded at once through the executor (``_cancel_now``)."""
        return self.executor._cancel_now(op, actor=actor, reason=reason)

    def kill(self) -> None:
        """The process dies: every advance and the commit in flight stop where they are."""
        ex = self.executor
        for future in list(ex._running.values()):
            future.cancel()
        if ex._committing is not None:
            ex._committing.cancel()

    def key(self, op_id: OperationId) -> tuple[object, ...]:
        """What of the executor's own state a later step reads (at a quiet point, nothing buffered)."""
        ex = self.executor
        held = ex._ops.get(op_id)
        return (
            held,
            ex.epoch,
            op_id in ex._due_at,
            op_id in ex._urgent,
            op_id in ex._dirty,
            op_id in ex._rerun,
            op_id in ex._lost,
            op_id in ex._budget_flagged,
        )


def plug_into_the_explorer() -> None:
    """Let the explorer run its group scenarios on this seat (``engine.explore.use_service_executor``)."""
    use_service_executor(Seat)


__all__ = ["Seat", "plug_into_the_explorer"]
