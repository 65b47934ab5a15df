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

The explorer lives in the engine and the executor in the service, which composes the engine: so
the engine never imports this module. A composition root (``finality explore``, the benchmarks, the
tests) plugs it in with ``plug_into_the_explorer()``; a group scenario run without it is refused,
naming that. It decides nothing itself and must not copy any of the executor's decisions.
"""

from __future__ import annotations

import random
from typing import Any

from engine.adapters.base import Backend, Capabilities
from engine.clock import Clock
from engine.explore.shipped import use_service_executor
from engine.explore.wire import Recording
from engine.model import Epoch, Operation, OperationId, Protocol
from engine.runtime.driver import Driver
from engine.schedule import PollPolicy
from service.config import ServerConfig, ServiceConfig
from service.executor.base import Server
from service.executor.core import Executor


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
        self.executor = Executor(
            ledger=ledger,
            config=ServiceConfig(servers={}, tools={}),
            clock=clock,
            rng=random.Random(index),
            epoch=epoch,
        )
        ex = self.executor
        ex._policy = policy
        config = ServerConfig(name=server, url=server, protocol=protocol.value)
        self.driver: Driver = ex._new_driver(config, backend, caps)
        ex._servers[server] = Server(config, protocol, backend, caps, self.driver)
        self._server = ex._servers[server]

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
