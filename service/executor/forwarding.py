"""Where a person's action is carried out: cancels queued together, and actions on operations
another executor holds (recorded here, carried out by the holder).

Any executor of a shared ledger takes any person action (``actions``). When the operation is not
this executor's (another holds it, or nobody does because its holder died), the action is recorded
through the unfenced ledger by the same compare-and-swap the holder would make (a cancel raises the
cancel generation, the seed's own rule; an answer is bound to its round; a resolution records its
binding) with a driver that sends nothing. The holder carries it out: ``_follow_person_actions``
re-reads what it holds that waits on a person; anything it is polling loses its next write's
compare-and-swap against the action and resumes from the ledger. This module must not send a
protocol request nor write an operation this executor holds through the unfenced ledger.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from engine.errors import EngineError, LeaseLost, ServiceError
from engine.model import LocalState, Operation, Role
from engine.runtime.driver import Driver
from engine.runtime.epochs import Refusal, refusal
from rollout.shadow import shadow_call_node
from service.executor.base import ExecutorState

logger = logging.getLogger(__name__)
S = LocalState

WAITING_ON_A_PERSON = frozenset({S.INPUT_REQUIRED, S.UNKNOWN, S.NOT_FOUND_SAFE})
"""States an operation leaves only through a person's action (which any executor may record)."""
HOLDER_ATTEMPTS = 3
"""Times a holder takes a person's action again after its write was refused for a raised epoch
(each time adopted first); beyond that the rollout is moving faster than anyone can act on it."""


class ForwardedActions(ExecutorState):
    """Which executor carries out a person's action, and recording it for another one."""

    def _cancel_queued(self) -> None:
        queued, self._cancels = self._cancels, []
        done: list[tuple[asyncio.Future[Operation], Operation | Exception]] = []
        elsewhere: list[tuple[str, str, str, asyncio.Future[Operation]]] = []
        with self._store.grouped() as refused:
            # One read for the whole queue, taken after the group's first flush so they are the
            # rows each compare-and-swap starts from: the queued call nodes and their shadows'
            # (a shadow's call node follows from its primary's). Three point reads per cancel
            # (its row by call node, again by id, its shadow's by call node) were a fifth of the
            # executor's time in bench/scale.py (bench/results/profiles/scale-s6-before.md); on
            # a 10,000-operation ledger one such read costs about 1.7 point reads (7.0 ms of CPU
            # against 4.1 ms each at load 30), 9 ms for ten call nodes.
            nodes = list(dict.fromkeys(c for c, _, _, _ in queued))
            found = self.ledger.by_call_nodes(nodes + [shadow_call_node(c) for c in nodes])
            written: set[str] = set()
            for call_node, actor, reason, future in queued:
                try:
                    op = self._current(call_node, found)
                    if not self._holds(op.operation_id):
                        elsewhere.append((call_node, actor, reason, future))
                        continue
                    # A second cancel of one operation in this queue starts from the first one's
                    # write (the group's buffer), not from the row read before it.
                    row = None if op.operation_id in written else found[call_node]
                    written.add(op.operation_id)
                    after = self._cancel_now(op, actor=actor, reason=reason, row=row, shadows=found)
                    done.append((future, after))
                except Exception as exc:  # handed to the waiting API request, which reports it
                    done.append((future, exc))
        fenced = {t.after.operation_id: o.error for t, o in refused if isinstance(o.error, LeaseLost)}
        lost = {t.after.operation_id for t, _ in refused} - set(fenced)
        # A refusal for the epoch adopts the operation here (it is still this executor's) and a
        # takeover drops it: the same decision as for every other refused write.
        self._refused(refused, [])
        by_id = {call_node: (a, r) for call_node, a, r, _ in queued}
        for future, result in done:
            if future.done():  # the caller stopped waiting; the record stands all the same
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            elif (error := fenced.get(result.operation_id)) is not None:
                actor, reason = by_id[result.call_node_id]
                if refusal(error) is Refusal.ADOPT:
                    # Adopted at the new epoch and still held: cancelled again here, on the adopted
                    # row, by the new epoch's driver.
                    try:
                        future.set_result(
                            self._cancel_now(self._current(result.call_node_id), actor=actor, reason=reason)
                        )
                    except Exception as exc:  # handed to the waiting API request, which reports it
                        future.set_exception(exc)
                else:
                    # Another executor took it over meanwhile: record it for that one to send.
                    elsewhere.append((result.call_node_id, actor, reason, future))
            elif result.operation_id in lost:
                future.set_exception(
                    ServiceError(409, "the operation moved while the cancel was recorded; ask again")
                )
            else:
                future.set_result(result)
        for call_node, actor, reason, future in elsewhere:
            try:
                after = self._cancel_elsewhere(self._current(call_node), actor=actor, reason=reason)
            except Exception as exc:  # handed to the waiting API request, which reports it
                if not future.done():
                    future.set_exception(exc)
                continue
            if not future.done():
                future.set_result(after)

    def _cancel_now(
        self,
        op: Operation,
        *,
        actor: str,
        reason: str,
        row: Operation | None = None,
        shadows: dict[str, Operation] | None = None,
    ) -> Operation:
        """Record the cancel of ``op`` as its holder (or for whoever holds it).

        ``row`` is its stored row when the caller has just read it (only the first attempt starts
        from it: a retry acts on the adopted row); ``shadows`` the rows of the queue's possible
        shadows by call node, read with the queue's own.
        """

        def cancel(driver: Driver, target: Operation) -> Operation:
            given = row if target is op else None
            return driver.request_cancel(target, actor=actor, reason=reason, current=given)

        try:
            after = self._as_holder(op, cancel)
        except EngineError as exc:
            raise ServiceError(409, str(exc)) from exc
        if after is None:
            return self._cancel_elsewhere(op, actor=actor, reason=reason)
        self._cancel_shadow(after, actor=actor, reason=reason, shadows=shadows)
        return after

    def _as_holder(self, op: Operation, act: Callable[[Driver, Operation], Operation]) -> Operation | None:
        """Record a person's action on ``op`` as its holder: ``act`` with the operation's driver,
        written at once (or into the group of cancels that arrived together). Returns None when
        this executor does not hold ``op`` (any more): the caller records it for whoever does.

        A write refused because a rollback (through any executor) raised the epoch is not a
        takeover (``engine.runtime.epochs.refusal``): the operation is adopted at the new epoch,
        still held here, and the action is taken again on the adopted row by the new epoch's
        driver. A refusal for a takeover drops it, and the action is recorded for the taker.

        Raises:
            ServiceError: 409 the server is not configured; 503 the epoch kept moving.
            EngineError: the action itself was refused (as ``act`` raises it).
        """
        for _ in range(HOLDER_ATTEMPTS):
            if not self._holds(op.operation_id):
                return None
            driver = self._driver_for(op)
            if driver is None:
                raise ServiceError(409, f"operation's server {op.server} is not configured")
            try:
                with self._store.immediate():
                    after = act(driver, op)
            except LeaseLost as exc:
                held = self._write_refused(op.operation_id, exc)
                if held is None:
                    return None
                op = held
                continue
            self._touched(after)
            return after
        raise ServiceError(503, "the rollout kept moving while this action was recorded; ask again")

    def _holds(self, op_id: str) -> bool:
        """Whether this executor drives ``op_id`` (always when alone; when shared, what it leases)."""
        return self._tenancy.drives(op_id, tracked=op_id in self._ops)

    def _recorder(self, op: Operation) -> Driver:
        """A driver that writes straight to the ledger and sends nothing, for an operation another
        executor holds (or nobody does): a person's action is a compare-and-swap on the row, so any
        executor may record it, and the holder (or the next claimer) carries it out."""
        for server in self._servers.values():
            if server.config.url == op.server:
                # The holder's own driver, but writing straight to the ledger (not this process's
                # group commits): the same settings, so both record an action the same way.
                return self._new_driver(
                    server.config, server.backend, server.caps, ledger=self._tenancy.reads
                )
        raise ServiceError(409, f"operation's server {op.server} is not configured")

    def _cancel_elsewhere(self, op: Operation, *, actor: str, reason: str) -> Operation:
        """Record the cancel of an operation another executor holds; its holder sends it."""
        try:
            after = self._recorder(op).request_cancel(op, actor=actor, reason=reason)
        except EngineError as exc:
            raise ServiceError(409, str(exc)) from exc
        self._cancel_shadow(after, actor=actor, reason=reason)
        return after

    def _cancel_shadow(
        self, primary: Operation, *, actor: str, reason: str, shadows: dict[str, Operation] | None = None
    ) -> None:
        """Mirror a primary's cancel on its shadow (``shadows``: rows by call node read already)."""
        shadow_id = self._shadow_of.get(primary.operation_id)
        if shadow_id is not None:
            shadow = self.ledger.get(shadow_id)
        elif primary.role is Role.PRIMARY:
            # Its creator (and so its pairing) may be another executor: the shadow's call node says.
            name = shadow_call_node(primary.call_node_id)
            shadow = shadows.get(name) if shadows is not None else self.ledger.by_call_node(name)
        else:
            shadow = None
        if shadow is None or shadow.state not in (S.WORKING, S.INPUT_REQUIRED):
            return
        mirrored = f"mirrors its primary's cancel: {reason}"
        try:
            if self._holds(shadow.operation_id) and (driver := self._driver_for(shadow)) is not None:
                with self._store.immediate():
                    after = driver.request_cancel(shadow, actor=actor, reason=mirrored)
                self._touched(after)
            else:
                self._recorder(shadow).request_cancel(shadow, actor=actor, reason=mirrored)
        except (EngineError, ServiceError) as exc:
            logger.warning("shadow %s not cancelled with its primary: %s", shadow.operation_id, exc)

    def _follow_person_actions(self) -> None:
        """Operations this executor holds that wait on a person: another executor may have recorded
        the person's action (an answer, a resolution, a resubmission); carry it out now.

        Operations being polled need no re-read: their next write loses its compare-and-swap
        against the recorded action and they resume from the ledger (a cancel is sent then).
        """
        waiting = [
            op_id
            for op_id, op in self._ops.items()
            if op.state in WAITING_ON_A_PERSON and op_id not in self._running
        ]
        if not waiting:
            return
        try:
            fresh = self._tenancy.reads.get_many(waiting)
        except EngineError as exc:
            logger.warning("operations waiting on a person not re-read: %s", exc)
            return
        for op_id, after in fresh.items():
            known = self._ops.get(op_id)
            if known is None or after.row_version <= known.row_version:
                continue
            driver = self._driver_for(after)
            if driver is not None and after.answered_round > known.answered_round:
                driver.answered_elsewhere(after)
            if driver is not None and after.state is S.SUBMITTING:
                driver.mark_fresh(after)  # resubmitted by a person elsewhere: submit, do not look up
            logger.info("operation %s: a person's action recorded elsewhere; carried out here", op_id)
            self._touched(after)


__all__ = ["WAITING_ON_A_PERSON", "ForwardedActions"]
