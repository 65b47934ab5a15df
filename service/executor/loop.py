"""The loop and the timer heap: start up, ticks, launching due operations, following finished advances.

Each tick flushes the previous tick's writes, pops every operation that is due, advances them
concurrently through their server's ``Driver`` (one action each), and flushes again. There is no
sleeping task per operation: an operation is a heap entry until it is due. Person actions are
applied between ticks, so no two actions on one operation overlap. On start the live operations
this process owns are loaded and resumed (all of them when it is alone; see ``leases``); none is
resubmitted. This module must not write to the ledger except through the drivers and ``_store``.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import random
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar

from engine.adapters import AdapterOptions, discover, open_backend, open_client
from engine.adapters.base import Backend, Capabilities
from engine.errors import EngineError, LeaseLost
from engine.ledger.port import LedgerPort
from engine.model import (
    RECEIPT_STATES,
    LocalState,
    Operation,
    Principal,
    Protocol,
)
from engine.runtime.driver import Driver, Wake
from engine.runtime.epochs import behind, is_behind, startup_epoch, to_advance, urgent
from engine.schedule import PollPolicy, wait_budget_end
from rollout.controller import RolloutController
from rollout.route import Router, ToolPaths
from service.config import ServerConfig
from service.executor.base import (
    FLUSH_BATCH,
    MAX_IN_FLIGHT_REQUESTS,
    MAX_RUNNING,
    ROUNDS_EVERY,
    ExecutorState,
    Server,
)
from service.executor.groups import commit_deadline

logger = logging.getLogger(__name__)
T = TypeVar("T")
S = LocalState


class Loop(ExecutorState):
    """The loop and its timer heap (start, tick, launch, follow each finished advance)."""

    async def start(self) -> None:
        """Negotiate with every configured server, then resume every non-terminal operation."""
        self.ledger.warm_up()
        now = self.clock.now()
        # The ledger's epoch is the truth: a rollback raised it and it survives restarts.
        started_at = startup_epoch(self.epoch, self.ledger.execution_epoch())
        if started_at != self.epoch:
            logger.info("execution epoch %d (from the ledger)", started_at)
            self.epoch = started_at
        self.ledger.put_setting("global_qps", repr(self.config.global_qps), now)
        self.ledger.put_setting("rollout_salt", self.config.rollout_salt, now)
        if self.client is None:
            # No more connections than requests the limiter lets out at once (more would sit idle).
            pool = MAX_IN_FLIGHT_REQUESTS + 16
            self.client = open_client(pool=pool)
        per_server = {s.url: s.qps for s in self.config.servers.values()}
        # Several processes: the budget is booked in the database, so it holds across them.
        self._limiter = self._tenancy.limiter(
            self.clock, global_qps=self.config.global_qps, per_server=per_server
        )
        self._refence()
        poll = self.config.poll
        self._policy = PollPolicy(
            default_interval=poll.default_interval,
            min_interval=poll.min_interval,
            max_interval=poll.max_interval,
            jitter=poll.jitter,
            retry_backoff=poll.retry_backoff,
        )
        for name, server in self.config.servers.items():
            options = AdapterOptions(clock=self.clock, request_id_dedupe=server.request_id_dedupe)
            if server.max_result_bytes is not None:
                options = replace(options, max_result_bytes=server.max_result_bytes)
            if server.protocol == "auto":
                protocol = await discover(server.url, self.client, server.token, options=options)
            else:
                protocol = Protocol(server.protocol)
            backend = open_backend(
                protocol, server.url, client=self.client, token=server.token, options=options
            )
            caps = await backend.negotiate(Principal(server.principal))
            self._servers[name] = Server(
                server, protocol, backend, caps, self._new_driver(server, backend, caps)
            )
        paths = {
            name: ToolPaths(name, tool.server, tool.shadow_server, tool.side_effect_free)
            for name, tool in self.config.tools.items()
        }
        self.rollout = RolloutController(
            self._tenancy.reads,
            self.clock,
            paths,
            salt=self.config.rollout_salt,
            epoch=int(self.epoch),
        )
        self.router = Router(
            self.rollout.state, paths, {name: s.protocol.value for name, s in self._servers.items()}
        )
        self._resume()

    def _new_driver(
        self, server: ServerConfig, backend: Backend, caps: Capabilities, *, ledger: LedgerPort | None = None
    ) -> Driver:
        """A driver at the executor's current epoch, with no memory of earlier actions."""
        return Driver(
            ledger=self._store if ledger is None else ledger,
            backend=backend,
            clock=self.clock,
            rng=random.Random(self.rng.random()),
            server=server.url,
            epoch=self.epoch,
            policy=self._policy,
            limiter=self._limiter,
            ttl=server.ttl,
            capabilities=caps,
            wait_budgets={name: tool.wait_budget for name, tool in self.config.tools.items()},
        )

    def _resume(self) -> None:
        """Resume what this process owns without claiming it, then claim (when shared) and compare.

        Alone, that is every live operation in the ledger; shared, nothing is loaded wholesale and
        the free and expired operations come through ``claim``. None is resubmitted.
        """
        now = self.clock.now()
        by_url = {s.config.url: s for s in self._servers.values()}
        resumed = 0
        left_behind = behind(self._tenancy.loaded_at_start(), self.epoch)
        if left_behind:
            # A rollback raised the epoch but stopped before adopting these: finish it now.
            self._adopt_operations(left_behind, actor="finality (restart after rollback)")
        for op in self._tenancy.loaded_at_start():
            if op.epoch > self.epoch:
                logger.warning(
                    "operation %s belongs to a newer epoch %d; left alone", op.operation_id, op.epoch
                )
                continue
            if op.server not in by_url:
                logger.warning(
                    "operation %s belongs to unconfigured server %s; left alone", op.operation_id, op.server
                )
                continue
            self._ops[op.operation_id] = op
            self._schedule(op.operation_id, now)
            resumed += 1
        logger.info("resumed %d operations", resumed)
        for primary, shadow in self.ledger.shadow_pairs(ready_only=False):
            self._shadow_of[primary] = shadow
            self._primary_of[shadow] = primary
        self._maintain_leases()
        self._compare_shadows()

    def request_stop(self) -> None:
        """Launch nothing more; ``run`` returns once the advances already running have finished."""
        self._stopping = True
        self._wake.set()

    async def aclose(self) -> None:
        self._stopping = True
        self._wake.set()
        await self._recorded()
        await self.settled()
        self._store.flush()
        self._tenancy.release()
        for server in self._servers.values():
            await server.backend.aclose()
        if self.client is not None:
            await self.client.aclose()

    def _schedule(self, op_id: str, at: datetime) -> None:
        op = self._ops.get(op_id)
        if op is not None:
            self._note_rounds(op)
        if op is not None and urgent(op):
            self._urgent.add(op_id)
        current = self._due_at.get(op_id)
        if current is not None and current <= at:
            return
        self._due_at[op_id] = at
        heapq.heappush(self._heap, (at, next(self._seq), op_id))
        self._wake.set()

    def _driver_for(self, op: Operation) -> Driver | None:
        for server in self._servers.values():
            if server.config.url == op.server:
                return server.driver
        return None

    async def run(self) -> None:
        """Loop until ``aclose``: commit, release finished operations, run person actions, launch due ones."""
        while not self._stopping:
            await self._tick()
            await self._idle()
        if self._running:
            await asyncio.wait(self._running.values(), timeout=30)
        await self._recorded()
        await self.settled()
        self._flush()

    def _exclusive_due(self) -> bool:
        """Whether work is waiting that runs only when no group commit is in flight (person
        actions, cancels, leases, the rollout's follow-up): each of them commits on the loop's
        thread or reads rows the running commit may still change. Submissions are not: they write
        only new rows, and are recorded as they arrive (``PersonActions._record_soon``)."""
        if self._actions or self._cancels:
            return True
        now = self.clock.now()
        if now >= self._tenancy.lease_due:
            return True
        return self._tenancy.follow_every is not None and now >= self._rollout_due

    async def _idle(self) -> None:
        # A commit in flight wakes the loop when it ends; until then only due operations matter.
        committing = self._commit_in_flight()
        if not committing and (self._exclusive_due() or self._commit_due()):
            return
        now = self.clock.now()
        if self._heap and self._heap[0][0] <= now and len(self._running) < MAX_RUNNING:
            return
        if self._urgent_due(now):
            return
        self._wake.clear()
        wake_at = now + timedelta(seconds=1)
        if self._heap:
            wake_at = min(wake_at, self._heap[0][0])
        if not committing:
            if self._finished:
                wake_at = min(wake_at, self._commit_by)
            wake_at = min(wake_at, self._tenancy.lease_due)
            if self._tenancy.follow_every is not None:
                wake_at = min(wake_at, self._rollout_due)
        sleeper = asyncio.ensure_future(self.clock.sleep(max(wake_at - now, timedelta(0))))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    async def tick(self) -> int:
        """One round as ``run`` makes it, then until the group commit it started is durable and its
        advances are back on the heap (for a caller that drives the loop by hand, as tests do);
        returns how many operations were launched."""
        launched = await self._tick()
        await self.settled()
        return launched

    async def _tick(self) -> int:
        """One round; returns how many operations were launched.

        1. when a person action waits, commit everything buffered first (waited for here), then
           run leases, rounds, cancels and person actions; none of this while a group commit is in
           flight or submissions are being recorded (those are recorded as they arrive, not here);
        2. when the finished advances' commit is due (``commit_deadline``, or much is buffered), start the
           group commit of everything buffered on the writer thread (``_start_commit``); it hands
           those finished advances back to the heap once durable: an operation's next request is
           only ever sent after its last change is durable. Advances still running keep
           buffering into the next group meanwhile;
        3. launch every due operation that is not already running, as its own task, whether or
           not a commit is in flight.
        """
        self.stats["ticks"] += 1
        if not self._commit_in_flight():
            if self._actions or self._cancels or (self._commit_due() and self._exclusive_due()):
                # Person actions (and leases) act on durable rows: this commit is waited for here.
                await self._commit()
            await self._exclusive_steps()
            if self._commit_due():
                self._start_commit()
        return self._launch_due()

    async def _exclusive_steps(self) -> None:
        """Tick steps 2-4 (leases, rounds, the rollout's follow-up, cancels, person actions): only
        while no group commit is in flight, and never beside a recording of submissions, which
        routes by the rollout state and writes at the epoch these steps may change (a rollback
        adopts only what is recorded)."""
        now = self.clock.now()
        if not (
            self._actions
            or self._cancels
            or now >= self._tenancy.lease_due
            or now >= self._rounds_due
            or (self._tenancy.follow_every is not None and now >= self._rollout_due)
        ):
            return
        self._exclusive = True
        try:
            await self._recorded()
            await self._exclusive_work()
        finally:
            self._exclusive = False
            self._record_soon()

    async def _exclusive_work(self) -> None:
        if self.clock.now() >= self._tenancy.lease_due:
            self._maintain_leases()
        if self.clock.now() >= self._rounds_due:
            self._close_rounds()
        if self._tenancy.follow_every is not None and self.clock.now() >= self._rollout_due:
            # Before routing this tick's submissions: another executor may have moved the rollout,
            # or recorded a person's action on an operation this one holds.
            self._follow_rollout()
            self._follow_person_actions()
        if self._cancels:
            self._cancel_queued()
        actions, self._actions = self._actions, []
        for action, future in actions:
            try:
                future.set_result(await action())
            except Exception as exc:  # handed to the waiting API request, which reports it
                future.set_exception(exc)
            self._flush()

    def _urgent_due(self, now: datetime) -> list[str]:
        return [o for o in self._urgent if (due := self._due_at.get(o)) is not None and due <= now]

    def _launch_due(self) -> int:
        """Launch every due operation not already running, each as its own task; how many."""
        now = self.clock.now()
        launched = 0
        # The cancel path is not held back by MAX_RUNNING: a person is waiting on it.
        for op_id in self._urgent_due(now):
            self._urgent.discard(op_id)
            del self._due_at[op_id]  # its heap entry is now superseded and skipped below
            launched += self._launch(op_id)
        while self._heap and self._heap[0][0] <= now and len(self._running) < MAX_RUNNING:
            at, _, op_id = heapq.heappop(self._heap)
            if self._due_at.get(op_id) != at:
                continue  # superseded by an earlier schedule
            del self._due_at[op_id]
            launched += self._launch(op_id)
        return launched

    def _launch(self, op_id: str) -> int:
        op = self._ops.get(op_id)
        if op is None:
            return 0
        if op_id in self._running or op_id in self._awaiting_group:
            # Its last advance has not ended, or its writes are not durable yet: launched again once
            # its group commit is (``_after``). An operation put back on the heap while its advance
            # ran (a rollback's adoption, a person's action) was launched as soon as that advance
            # ended, and the two advances' writes shared one group: refused together behind the
            # first one's stale row, the second's acceptance with them, and the executor dropped the
            # operation as accepted (found by the explorer's group-rollback scenario).
            self._rerun.add(op_id)
            return 0
        task = asyncio.ensure_future(self._advance(op))
        self._running[op_id] = task
        task.add_done_callback(functools.partial(self._done, op_id))
        return 1

    def _done(self, op_id: str, task: asyncio.Future[Wake]) -> None:
        self._running.pop(op_id, None)
        if not task.cancelled():
            wake = task.result()
            due = commit_deadline(wake, self.clock.now())
            if not self._finished or due < self._commit_by:
                self._commit_by = due
                self._wake.set()  # the loop's next wake-up moved earlier
            self._finished.append(wake)
            self._awaiting_group.add(op_id)
            if self._store.pending >= FLUSH_BATCH:
                self._wake.set()
        else:
            self._wake.set()

    async def _advance(self, op: Operation) -> Wake:
        # A value from before a rollback is replaced by the ledger's adopted one.
        op = to_advance(op, self.epoch, self.ledger.get)
        driver = self._driver_for(op)
        if driver is None:
            return Wake(op, None)
        self.stats["advances"] += 1
        try:
            wake = await driver.advance(op)
            # What follows a terminal status and sends nothing (starting the fetch, verifying an
            # outcome that came with the status) runs on in this advance: its writes join the same
            # group, where waiting for a group commit before each of them only delayed the receipt
            # (by two commits). A step that sends a request still waits for the commit before it.
            # Bounded by the two such steps there are, so a step the machine refused (leaving the
            # operation where it was) can never spin here without yielding the loop.
            for _ in range(2):
                if wake.at is None or wake.at > self.clock.now() or not driver.sends_nothing(wake.operation):
                    break
                wake = await driver.advance(wake.operation)
            return wake
        except LeaseLost as exc:
            # An epoch refusal adopts it (still leased here; ``_after`` restarts it from the adopted
            # row), a takeover drops it.
            self._write_refused(op.operation_id, exc)
            return Wake(op, None)
        except Exception:
            # One operation's unexpected failure must not stop the others; it is retried later.
            logger.exception("advancing operation %s failed", op.operation_id)
            return Wake(op, self.clock.now() + timedelta(seconds=5))

    def _after(self, wake: Wake) -> None:
        op = wake.operation
        self._awaiting_group.discard(op.operation_id)
        self._note_rounds(op)
        if op.operation_id in self._lost:
            # Its lease was lost while the advance ran: another executor drives it now.
            self._lost.discard(op.operation_id)
            self._dirty.discard(op.operation_id)
            self._rerun.discard(op.operation_id)
            return
        if is_behind(op, self.epoch):
            # Finished under an older epoch (a rollback happened meanwhile): what it ended with
            # is not the truth, the adopted row in the ledger is.
            self._dirty.add(op.operation_id)
        known = self._ops.get(op.operation_id)
        if known is not None and known.row_version > op.row_version:
            # A person's action (a cancel, an answer, a budget cancel) was recorded after this
            # advance had finished but before its group was committed, so ``_touched`` did not
            # see it running. Found by the demo: a cancel recorded in that gap was overwritten
            # here by the older value and never sent (cancel_confirmation failed, 237 s and rising).
            self._dirty.add(op.operation_id)
        if op.operation_id in self._dirty:
            # While this advance was in flight a person acted on the operation, or one of its
            # writes lost its compare-and-swap: what it ended with is not the truth. Start again
            # from the ledger.
            self._dirty.discard(op.operation_id)
            fresh = self.ledger.get(op.operation_id)
            if fresh is None:
                self._ops.pop(op.operation_id, None)
                return
            op = fresh
            wake = Wake(op, self.clock.now())
        if op.operation_id in self._rerun:
            self._rerun.discard(op.operation_id)
            wake = Wake(op, self.clock.now())
        self._ops[op.operation_id] = op
        if op.state in RECEIPT_STATES:
            self._ops.pop(op.operation_id, None)
            self._urgent.discard(op.operation_id)
            self._compare_shadows(op.operation_id)
            return
        budget_at = self._budget_deadline(op)
        if (
            budget_at is not None
            and self.clock.now() >= budget_at
            and op.state in (S.WORKING, S.INPUT_REQUIRED)
            and self._budget_exhausted(op)
        ):
            return
        if wake.at is not None:
            self._schedule(op.operation_id, wake.at)

    def _close_rounds(self) -> None:
        """Close the approval rounds no one can answer any more: their deadline passed, or their
        operation moved past them (cancelled, ended, or the server asked a newer question).

        Only while a round may be pending: the sweep commits everything buffered on the loop's
        thread first, which stalled every advance once a second for a ledger without any round
        (12 % of ``finality serve``'s CPU under bench/fastmcp_compare.py, plus two UPDATEs).
        """
        now = self.clock.now()
        self._rounds_due = now + ROUNDS_EVERY
        if not self._rounds_open and self._tenancy.follow_every is None:
            # Alone on the ledger, a round is only ever opened for an operation this loop holds,
            # and ``_note_rounds`` sets the flag when one passes through; a shared ledger's rounds
            # may be opened by any executor, so every sweep looks.
            return
        # Make this process's own moves into and out of rounds durable first (and handle any
        # refused write the usual way), so the rounds are judged against the stored states.
        self._flush()
        try:
            with self._store.immediate():
                closed = self._store.close_rounds(now)
        except EngineError as exc:  # a busy ledger: the next sweep tries again
            logger.warning("closing approval rounds failed: %s", exc)
            return
        if closed:
            logger.info("closed %d approval round(s) no longer answerable", closed)
        self._rounds_open = bool(self._store.approvals(pending_only=True))

    def _note_rounds(self, op: Operation) -> None:
        """An operation that has asked a person (or is asking) passes through: sweep rounds again."""
        if op.input_round > 0:
            self._rounds_open = True

    def _budget_deadline(self, op: Operation) -> datetime | None:
        tool = self.config.tools.get(op.tool.name)
        if tool is None or tool.on_budget_exhausted != "cancel":
            return None
        return wait_budget_end(op.created_at, tool.wait_budget)

    def _budget_exhausted(self, op: Operation) -> bool:
        """The wait budget ran out: cancel, or (no cancel capability) hand it to a person.

        Returns whether the operation was taken over by a cancel (``_touched`` reschedules it);
        False means it goes on being polled to its real terminal state.
        """
        driver = self._driver_for(op)
        if driver is None:
            return False
        if not driver.can_cancel():
            # A cancel that can never be sent must not be recorded: stop waiting, tell a person
            # once, and keep polling until the server says how it ended.
            if op.operation_id not in self._budget_flagged:
                self._budget_flagged.add(op.operation_id)
                capability = driver.capabilities.cancel_capability if driver.capabilities else "cancel"
                now = self.clock.now()
                with self._store.immediate():
                    self._store.open_reconciliation(
                        op,
                        kind="budget",
                        reason=(
                            "wait budget exhausted; not cancelled because the server does not declare "
                            f"{capability}; the operation is still polled to its terminal state"
                        ),
                        window_end=now,
                        at=now,
                    )
            return False
        try:
            with self._store.immediate():
                after = driver.request_cancel(op, actor="finality", reason="wait budget exhausted")
        except EngineError as exc:
            logger.warning("budget cancel of %s failed: %s", op.operation_id, exc)
            return True
        self._touched(after)
        return True

    def _touched(self, after: Operation) -> None:
        """A person's action just changed ``after`` in the ledger; make the loop follow it."""
        if after.operation_id in self._running:
            self._dirty.add(after.operation_id)
        self._ops[after.operation_id] = after
        self._schedule(after.operation_id, self.clock.now())


__all__ = ["Loop"]
