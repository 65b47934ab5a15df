"""Rollout adoption: rollout actions between ticks, raising the execution epoch, adopting in-flight work.

A rollback stops sending new calls to the new adapter, raises the execution epoch by
compare-and-swap in the ledger, gives every server a fresh driver at the new epoch (no memory, so
an operation found in SUBMITTING is looked up by key exactly as after a restart), and adopts every
live operation this process owns with ``EpochRaised`` through ``step``. Replies to requests old
drivers sent before the raise carry the old epoch: ``step`` refuses them (see ``groups``). The
service is the composition root, so it may import ``rollout``; the engine below it never does.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import timedelta
from typing import TypeVar

from engine.errors import EngineError, LeaseLost
from engine.model import (
    RECEIPT_STATES,
    Epoch,
    LocalState,
    Operation,
    Protocol,
)
from engine.runtime.epochs import Refusal, adoption, is_behind, refusal
from rollout.assign import Arm
from rollout.plan import Action, Request
from service.executor.base import (
    ExecutorState,
)

logger = logging.getLogger(__name__)

FOLLOW_SLACK = timedelta(milliseconds=750)
"""Beyond ``follow_every``: the longest a busy executor's tick takes to come round to the read."""
T = TypeVar("T")
S = LocalState


class RolloutAdoption(ExecutorState):
    """Rollout actions, the epoch raise, adoption and shadow comparisons."""

    @property
    def in_flight(self) -> int:
        return len(self._ops)

    def in_flight_of(self, principal: str) -> int:
        """Operations without a receipt that ``principal`` submitted (the API's per-principal limit)."""
        return self._ops.by_principal[principal]

    def in_flight_by_principal(self) -> dict[str, int]:
        return {principal: n for principal, n in self._ops.by_principal.items() if n}

    def servers(self) -> dict[str, Protocol]:
        return {name: s.protocol for name, s in self._servers.items()}

    async def rollout_act(self, request: Request) -> dict[str, object]:
        """Carry out one rollout action between ticks; a rollback also adopts every in-flight operation.

        Raises:
            RolloutRefused: the stage machine refuses it (``status`` and, for a blocked promotion,
                the failing gates say why).
        """

        async def do() -> dict[str, object]:
            self._flush()
            context: dict[str, object] | None = None
            if request.action is Action.ROLLBACK:
                context = {"in_flight_at_rollback": self._in_flight_summary()}
            result = self.rollout.act(request, context=context)
            # From here on no new call is routed to the new adapter.
            self.router.state = result.decision.after
            out = result.as_json()
            raised = result.decision.after.epoch > self.epoch
            if raised:
                out["adoption"] = self._raise_epoch(Epoch(result.decision.after.epoch), request.actor)
            out["cluster"] = self._cluster_effect(raised)
            return out

        return await self._between_ticks(do)

    def _cluster_effect(self, raised: bool) -> dict[str, object]:
        """When the action holds for every executor of the ledger (the API's answer says so)."""
        every = self._tenancy.follow_every
        if every is None:
            return {"effective_everywhere": True, "why": "this executor is the ledger's only one"}
        by = self.clock.now() + every + FOLLOW_SLACK
        if raised:
            # A creation at the old epoch is refused by the ledger (the fence share-locks the epoch
            # row), so no executor records a call routed by the state before this rollback.
            return {
                "effective_everywhere": True,
                "why": "new calls recorded at the old epoch are refused by the ledger; every executor "
                "routes again by this state",
                "others_adopt_in_flight_by": by.isoformat(),
            }
        return {
            "effective_everywhere": False,
            "why": f"other executors re-read the rollout state every {every.total_seconds():g} s",
            "effective_everywhere_by": by.isoformat(),
        }

    def _follow_rollout(self) -> None:
        """Route by the ledger's rollout state (any executor may have acted); adopt a raised epoch.

        Read every ``follow_every`` between ticks, and at once when the ledger refused a write or a
        creation for its epoch. What this executor holds behind the new epoch is adopted here; what
        nobody holds is adopted by whoever claims it.
        """
        every = self._tenancy.follow_every
        if every is not None:
            self._rollout_due = self.clock.now() + every
        try:
            moved = self.rollout.refresh()
        except EngineError as exc:
            logger.warning("rollout state not read: %s", exc)
            return
        if moved:
            self.router.state = self.rollout.state
            logger.info(
                "rollout moved by another executor: %s (seq %d, epoch %d)",
                self.rollout.state.stage.value,
                self.rollout.head_seq,
                self.rollout.state.epoch,
            )
        if self.rollout.state.epoch > self.epoch:
            logger.info("execution epoch raised to %d by another executor", self.rollout.state.epoch)
            self._raise_epoch(Epoch(self.rollout.state.epoch), "finality (epoch raised by another executor)")

    def _in_flight_summary(self) -> dict[str, object]:
        live = self.ledger.live_by_protocol()
        on_new_path = sum(
            int(str(row["operations"]))
            for row in self.ledger.arm_counts()
            if row["in_flight"] and row["arm"] in (Arm.CANARY.value, Arm.SHADOW.value)
        )
        return {
            "operations": sum(sum(states.values()) for states in live.values()),
            "on_new_adapter": on_new_path,
            "by_protocol": live,
            "advances_in_flight": len(self._running),
        }

    def _raise_epoch(self, epoch: Epoch, actor: str) -> dict[str, object]:
        """Switch to ``epoch`` (already compare-and-swapped into the ledger) and adopt the in-flight work.

        Old drivers are dropped, not changed: an advance still awaiting a reply keeps its driver,
        whose replies carry the old epoch and are fenced. The new drivers start without memory,
        exactly as after a restart.
        """
        previous = self.epoch
        self.epoch = epoch
        self._refence()
        for server in self._servers.values():
            server.driver = self._new_driver(server.config, server.backend, server.caps)
        behind = self._tenancy.adoption_candidates(list(self._ops), epoch)
        adopted = self._adopt_operations(behind, actor=actor)
        return {"from_epoch": previous, "to_epoch": epoch, **adopted}

    def _adopt_operations(self, ops: list[Operation], *, actor: str) -> dict[str, object]:
        """``EpochRaised`` for each operation through ``step``, group-committed; state carries over."""
        now = self.clock.now()
        by_state: Counter[str] = Counter()
        failed: list[str] = []
        pending = ops
        for _ in range(3):
            retry: list[Operation] = []
            for start in range(0, len(pending), 1000):
                chunk = [adoption(op, self.epoch, actor, now) for op in pending[start : start + 1000]]
                for t, outcome in zip(chunk, self.ledger.apply_many(chunk), strict=True):
                    if isinstance(outcome.error, LeaseLost):
                        if refusal(outcome.error) is Refusal.DROP:
                            self._lease_lost(t.before.operation_id, str(outcome.error))
                        # Else raised again meanwhile: still held here, adopted at the next follow.
                        continue
                    if outcome.error is not None or outcome.operation is None:
                        fresh = self.ledger.get(t.before.operation_id)
                        if (
                            fresh is not None
                            and is_behind(fresh, self.epoch)
                            and fresh.state not in RECEIPT_STATES
                        ):
                            retry.append(fresh)
                        continue
                    after = outcome.operation
                    by_state[after.state.value] += 1
                    self.stats["adopted"] += 1
                    if after.operation_id in self._running:
                        self._dirty.add(after.operation_id)
                    self._ops[after.operation_id] = after
                    self._schedule(after.operation_id, now)
            pending = retry
            if not pending:
                break
        failed = [op.operation_id for op in pending]
        if failed:
            logger.error(
                "%d operations could not be adopted at epoch %d: %s", len(failed), self.epoch, failed[:20]
            )
        return {"adopted": sum(by_state.values()), "adopted_by_state": dict(by_state), "not_adopted": failed}

    def _compare_shadows(self, operation_id: str | None = None) -> None:
        """Record the shadow comparison of a pair once both of its operations hold a receipt."""
        if operation_id is None:
            pairs = list(self._shadow_of.items())
        elif operation_id in self._shadow_of:
            pairs = [(operation_id, self._shadow_of[operation_id])]
        elif operation_id in self._primary_of:
            pairs = [(self._primary_of[operation_id], operation_id)]
        else:
            return
        for primary_id, shadow_id in pairs:
            try:
                done = self.rollout.compare_pair(primary_id, shadow_id)
            except EngineError as exc:
                logger.warning("shadow comparison of %s failed: %s", primary_id, exc)
                continue
            if done is not None:
                self._shadow_of.pop(primary_id, None)
                self._primary_of.pop(shadow_id, None)

    def rollout_status(self) -> dict[str, object]:
        """The rollout as the status route shows it."""
        status = self.rollout.status(protocols={name: s.protocol.value for name, s in self._servers.items()})
        status["executor"] = {
            "epoch": int(self.epoch),
            "in_flight": self.in_flight,
            "fenced_since_start": self.stats["fenced"],
            "adopted_since_start": self.stats["adopted"],
        }
        return status


__all__ = ["RolloutAdoption"]
