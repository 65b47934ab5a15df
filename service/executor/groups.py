"""Write groups: group commit on the writer thread, and following the writes the ledger refused.

An operation's next request is only sent after its last change is durable, so finished advances
are handed back to the heap only after the commit that carries their writes. A refused write
(lost compare-and-swap, lost lease, a reply fenced by a raised epoch) sends its operation back to
the ledger's row. This module must not decide routing or leases.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import TypeVar

from engine.clock import monotonic_seconds
from engine.errors import DuplicateOperation, LeaseLost
from engine.ledger.port import BatchOutcome
from engine.machine import step
from engine.model import (
    RECEIPT_STATES,
    LocalState,
    OpenReconciliation,
    Transition,
)
from engine.runtime.driver import Wake
from engine.runtime.epochs import Refusal, refusal
from service.executor.base import (
    FLUSH_BATCH,
    FLUSH_DELAY,
    FLUSH_PATIENCE,
    ExecutorState,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
S = LocalState


def commit_deadline(wake: Wake, now: datetime) -> datetime:
    """When the group commit holding the writes of an advance that finished ``now`` is due.

    A group's BEGIN/COMMIT, its fsync and its statements cost the same for 2 writes as for 200, so
    an advance waits for company as long as that delays nothing: ``FLUSH_DELAY`` when its operation
    is parked or done (someone may be waiting for its receipt) or its next request is due within
    twice ``FLUSH_PATIENCE``; ``FLUSH_PATIENCE`` when that request is further off (a status read a
    poll interval away), which leaves the commit at least ``FLUSH_PATIENCE`` before the request is
    due. Person actions, submissions and cancels never wait for any of it: the loop commits the
    buffer before them.
    """
    if wake.at is None or wake.at < now + 2 * FLUSH_PATIENCE:
        return now + FLUSH_DELAY
    return now + FLUSH_PATIENCE


class WriteGroups(ExecutorState):
    """Group commit and what follows a refused write."""

    @property
    def write_transactions(self) -> int:
        """Write transactions issued through the executor's store since start (group commits, the
        loop's flushes and immediate writes alike): with ``stats["commits"]``, what a group costs."""
        return self._store.flushes

    async def settled(self) -> None:
        """Until the group commit started by a tick (if any) is durable and its advances followed."""
        while self._commit_in_flight():
            assert self._committing is not None
            await asyncio.wait({self._committing})
        self._commit_in_flight()

    def _commit_in_flight(self) -> bool:
        """Whether the group commit a tick started still runs; a finished one is reaped here, and
        its failure raised (as it was from the tick that waited for it)."""
        if self._committing is None:
            return False
        if not self._committing.done():
            return True
        finished, self._committing = self._committing, None
        finished.result()
        return False

    def _start_commit(self) -> None:
        """Run the group commit as its own task: the loop keeps launching due operations meanwhile.

        Those operations' last changes are durable already (they were handed back to the heap by an
        earlier commit), so sending their next request while this group commits keeps the rule
        that a request only follows a durable change. A tick that waited for each commit sent
        nothing while it ran: 119 s of a 153 s bench/scale.py run at 10,000 in flight, and every
        poll due meanwhile went out late by up to a commit.
        """

        async def commit() -> None:
            try:
                await self._commit()
            finally:
                self._wake.set()

        self._committing = asyncio.ensure_future(commit())

    def _commit_due(self) -> bool:
        """Whether finished advances have waited long enough for company (``commit_deadline``; or
        there is a lot to write)."""
        if self._store.pending >= FLUSH_BATCH or self._stopping:
            return bool(self._finished or self._store.pending)
        return bool(self._finished) and self.clock.now() >= self._commit_by

    async def _commit(self) -> None:
        """Group commit on the writer thread, then release the advances that finished before it.

        The finished list is taken before the writes: an advance that finishes while the commit
        runs may have writes in the next group, so it waits for the next commit.
        """
        finished, self._finished = self._finished, []
        group = self._store.take()
        started = monotonic_seconds()
        try:
            refused = await asyncio.to_thread(self._store.commit, group)
        finally:
            self._store.settle()
        self.commit_seconds += monotonic_seconds() - started
        self.stats["commits"] += 1
        self.stats["committed_writes"] += group.size
        if group.acceptances:
            self.commit_signal.notify()
        self._refused(refused, finished)
        for wake in finished:
            self._after(wake)

    def _flush(self) -> None:
        """Commit what is buffered now, on the loop's thread (around person actions and at stop)."""
        finished, self._finished = self._finished, []
        self._refused(self._store.flush(), finished)
        self.commit_signal.notify()
        for wake in finished:
            self._after(wake)

    def _refused(self, refused: list[tuple[Transition, BatchOutcome]], finished: list[Wake]) -> None:
        if any(isinstance(o.error, LeaseLost) and refusal(o.error) is Refusal.ADOPT for _, o in refused):
            # A rollback elsewhere raised the epoch: the leases are still this executor's, so it
            # follows the epoch and adopts what it holds, once for the whole group (``_after`` then
            # restarts each from its adopted row). First, so that the replies the raise fenced are
            # judged against the adopted rows and logged: judged before, at the old epoch, none
            # looked stale, and an executor that learnt of a rollback from a refusal logged none.
            self._epoch_check()
        self._log_fenced([t for t, _ in refused])
        finishing = {wake.operation.operation_id for wake in finished} if refused else set()
        for transition, outcome in refused:
            self.stats["refused"] += 1
            op_id = transition.after.operation_id
            if isinstance(outcome.error, LeaseLost):
                if refusal(outcome.error) is Refusal.DROP:
                    self._lease_lost(op_id, str(outcome.error))
                continue
            if op_id in self._running:
                self._dirty.add(op_id)
                continue
            if op_id in finishing:
                # Its advance ended on a write the ledger refused: ``_after`` restarts it from the
                # ledger instead of from what the advance ended with.
                self._dirty.add(op_id)
            fresh = self.ledger.get(op_id)
            if fresh is None:
                continue
            if isinstance(outcome.error, DuplicateOperation) and transition.after.task_id is not None:
                driver = self._driver_for(fresh)
                if driver is not None:
                    fresh = driver.task_reused(fresh, transition.after.task_id, str(outcome.error))
                    self._store.flush()
            self._ops[op_id] = fresh
            if fresh.state not in RECEIPT_STATES:
                self._schedule(op_id, self.clock.now())

    def _log_fenced(self, refused: list[Transition]) -> None:
        """Group-committed writes refused because a rollback raised the epoch under them: say so.

        An old driver stepped its reply against the operation as it was when it sent the request;
        against the adopted row the same reply is stale, and ``step`` says why. Those refusals are
        what the transitions log keeps (the replies themselves change nothing).
        """
        now = self.clock.now()
        stale = [
            t
            for t in refused
            if t.accepted and t.before.epoch < self.epoch and t.after.operation_id not in self._lost
        ]
        current = self.ledger.get_many([t.after.operation_id for t in stale])
        fenced: list[tuple[Transition, Transition]] = []
        for transition in stale:
            fresh = current.get(transition.after.operation_id)
            if fresh is None or fresh.epoch <= transition.before.epoch:
                continue
            verdict = step(fresh, transition.event, now)
            if not verdict.accepted:
                fenced.append((transition, verdict))
        if not fenced:
            return
        outcomes = self.ledger.apply_many([verdict for _, verdict in fenced])
        for (transition, verdict), outcome in zip(fenced, outcomes, strict=True):
            if outcome.error is not None:
                logger.warning(
                    "fenced reply for %s not logged: %s", verdict.before.operation_id, outcome.error
                )
                continue
            self.stats["fenced"] += 1
            fresh = verdict.before
            if fresh.state is not S.UNKNOWN and any(
                isinstance(e, OpenReconciliation) for e in transition.effects
            ):
                # The old driver opened an entry for a person on the strength of that reply; the
                # adopted operation is not lost, so nobody has anything to find.
                self.ledger.resolve_open(
                    fresh.operation_id,
                    kind="unknown",
                    actor="finality",
                    resolution=f"opened on a reply fenced after the rollback to epoch {self.epoch}; "
                    f"the adopted operation continues in {fresh.state}",
                    at=now,
                )


__all__ = ["WriteGroups"]
