"""Leases: how an executor shares its ledger, chosen once from what the ledger's port says it can do.

``Tenancy`` is the one place that knows whether other executors share the ledger. ``SoleOwner``
(the port's ``leasing`` is None, or no ``lease_s``): everything in the ledger is this process's,
it is loaded at start, writes go straight to the ledger and the QPS budget is counted in memory.
``SharedLeases`` (``leasing`` offered and ``lease_s`` set): each process has an owner name and a
fresh lease token and writes only through ``leasing.fenced(Fence(owner, token, epoch, lease_s))``;
it drives only what it creates and what ``claim`` hands it (free, or expired because its holder
died); every ``lease_s / 3`` it renews, drops what ``renew`` no longer returns and claims more;
the QPS budget is booked in the database (``SharedLimiter``); a clean stop releases every lease.
The executor's code never asks which one it has. This module must not know any backend's type.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from engine.clock import Clock
from engine.errors import EngineError, LeaseLost
from engine.ledger.port import Fence, LeasingLedgerPort, LedgerPort
from engine.model import RECEIPT_STATES, Epoch, LocalState, Operation
from engine.runtime.epochs import Refusal, behind, is_behind, refusal
from engine.runtime.limiter import Limiter, SharedLimiter
from service.executor.base import (
    CLAIM_BATCH,
    MAX_IN_FLIGHT_REQUESTS,
    MAX_RUNNING,
    ROLLOUT_FOLLOW,
    ExecutorState,
    Tenancy,
)

logger = logging.getLogger(__name__)

_LATER = datetime.max.replace(tzinfo=UTC)
_LIVE = [s for s in LocalState if s not in RECEIPT_STATES]


class SoleOwner(Tenancy):
    """One process owns the ledger: no leases, no fence, an in-memory QPS budget."""

    def __init__(self, ledger: LedgerPort) -> None:
        self._ledger = ledger
        self.lease_due = _LATER
        self.follow_every = None
        self.shared = False

    @property
    def reads(self) -> LedgerPort:
        return self._ledger

    def handle(self, epoch: Epoch) -> LedgerPort:
        return self._ledger

    def limiter(self, clock: Clock, *, global_qps: float, per_server: dict[str, float]) -> Limiter:
        return Limiter(
            clock, max_in_flight=MAX_IN_FLIGHT_REQUESTS, global_qps=global_qps, per_server=per_server
        )

    def loaded_at_start(self) -> list[Operation]:
        return self._ledger.operations(states=_LIVE)

    def drives(self, op_id: str, *, tracked: bool) -> bool:
        return True

    def adoption_candidates(self, held: list[str], epoch: Epoch) -> list[Operation]:
        return behind(self._ledger.operations(states=_LIVE), epoch)

    def renew(self, now: datetime) -> set[str] | None:
        return None

    def claim(self, now: datetime, *, room: int, epoch: Epoch, servers: list[str]) -> list[Operation]:
        return []

    def release(self) -> None:
        return None


class SharedLeases(Tenancy):
    """Several processes share the ledger: leased work, fenced writes, a QPS budget in the database."""

    def __init__(self, leasing: LeasingLedgerPort, *, owner: str, token: str, lease_s: float) -> None:
        if lease_s <= 0:
            raise ValueError("lease_s must be positive")
        self._leasing = leasing
        self.owner = owner
        self.token = token
        self.lease_s = lease_s
        self.lease_due = datetime.min.replace(tzinfo=UTC)
        self.follow_every = ROLLOUT_FOLLOW
        self.shared = True

    @property
    def reads(self) -> LedgerPort:
        return self._leasing

    def handle(self, epoch: Epoch) -> LedgerPort:
        return self._leasing.fenced(Fence(self.owner, self.token, int(epoch), self.lease_s))

    def limiter(self, clock: Clock, *, global_qps: float, per_server: dict[str, float]) -> Limiter:
        return SharedLimiter(
            clock,
            self._leasing.book_send_slots,
            global_qps=global_qps,
            per_server=per_server,
            max_in_flight=MAX_IN_FLIGHT_REQUESTS,
            prune=self._leasing.prune_send_slots,
        )

    def loaded_at_start(self) -> list[Operation]:
        # Nothing is loaded wholesale: what other executors lease is theirs. Free and expired
        # operations come through ``claim`` (now, and every lease_s / 3).
        return []

    def drives(self, op_id: str, *, tracked: bool) -> bool:
        # Another executor's (or free): its holder, or a later claim, drives it.
        return tracked

    def adoption_candidates(self, held: list[str], epoch: Epoch) -> list[Operation]:
        # Only what this executor leases; the others adopt theirs when their fence refuses them,
        # and behind-epoch operations nobody holds are adopted as ``claim`` hands them out.
        found = self._leasing.get_many(held)
        return behind(found.values(), epoch)

    def renew(self, now: datetime) -> set[str] | None:
        self.lease_due = now + timedelta(seconds=self.lease_s / 3)
        return set(self._leasing.renew(self.owner, self.token, self.lease_s, now))

    def claim(self, now: datetime, *, room: int, epoch: Epoch, servers: list[str]) -> list[Operation]:
        return self._leasing.claim(
            self.owner,
            self.token,
            min(CLAIM_BATCH, room),
            self.lease_s,
            now,
            epoch=int(epoch),
            servers=servers,
        )

    def release(self) -> None:
        # A clean stop: others may claim these at once instead of after expiry.
        try:
            released = self._leasing.release(self.owner, self.token)
            logger.info("released %d leases", released)
        except EngineError as exc:
            logger.warning("leases not released (they expire on their own): %s", exc)


def tenancy_for(ledger: LedgerPort, *, owner: str, token: str, lease_s: float | None) -> Tenancy:
    """The tenancy the ledger's port allows: shared when it offers leasing and leases were asked for."""
    if lease_s is None:
        return SoleOwner(ledger)
    leasing = ledger.leasing
    if leasing is None:
        raise ValueError("leases (several executors) need a ledger that offers leasing (PostgreSQL)")
    return SharedLeases(leasing, owner=owner, token=token, lease_s=lease_s)


class Leases(ExecutorState):
    """The executor's side of its tenancy: the write handle, lease maintenance, losing an operation."""

    @property
    def shared(self) -> bool:
        """Whether this executor shares the ledger with others (leases, fencing, shared QPS)."""
        return self._tenancy.shared

    def _refence(self) -> None:
        """Write through the handle the tenancy gives at the current epoch (fenced when shared)."""
        self._store.flush()
        self.ledger = self._tenancy.handle(self.epoch)
        self._store.inner = self.ledger

    def _maintain_leases(self) -> None:
        """Renew this process's leases, drop what ``renew`` no longer returns, claim more.

        Runs between ticks every ``lease_s / 3`` (never when alone). A claimed operation behind the
        epoch (its holder died before adopting it) is adopted; the others are resumed exactly as
        after a restart (the drivers have no memory of them).
        """
        now = self.clock.now()
        try:
            held = self._tenancy.renew(now)
            if held is None:
                return
            for op_id in [o for o in self._ops if o not in held]:
                self._lease_lost(op_id, "not renewed")
            claimed = self._tenancy.claim(
                now,
                room=MAX_RUNNING * 4 - len(self._ops),
                epoch=self.epoch,
                servers=[s.config.url for s in self._servers.values()],
            )
        except LeaseLost:
            self._epoch_check()
            return
        except EngineError as exc:
            logger.warning("lease maintenance failed (retried at %s): %s", self._tenancy.lease_due, exc)
            return
        if not claimed:
            return
        self.stats["claimed"] += len(claimed)
        logger.info("claimed %d operations", len(claimed))
        taken_behind = behind(claimed, self.epoch)
        for op in claimed:
            # Claimed back while an advance from before its lease was lost still runs: that advance
            # ends on the row as claimed (or adopted), not as a lost one. Behind the epoch too: left
            # in ``_lost``, its advance's end dropped the adopted operation's schedule (``_after``),
            # leaving it leased and renewed here but never advanced again, the 3-executor rollback
            # test's operations that never reached a receipt.
            self._lost.discard(op.operation_id)
            if op.operation_id in self._running:
                self._dirty.add(op.operation_id)
            if is_behind(op, self.epoch):
                continue
            self._ops[op.operation_id] = op
            self._schedule(op.operation_id, now)
        if taken_behind:
            self._adopt_operations(taken_behind, actor="finality (taken over behind the epoch)")

    def _lease_lost(self, op_id: str, why: str) -> None:
        """Another executor owns ``op_id`` now: stop driving it.

        Not for a write refused because only the epoch moved on (``EpochMoved``): that operation is
        still leased here, and dropping it would leave it leased (and renewed) by this executor but
        driven by nobody, never adopted; ``_epoch_check`` adopts it instead.
        """
        op = self._ops.pop(op_id, None)
        if op is not None:
            self.stats["lease_lost"] += 1
            logger.info("operation %s dropped: %s", op_id, why)
            driver = self._driver_for(op)
            if driver is not None:
                driver.forget(op)
        self._due_at.pop(op_id, None)
        if op_id in self._running:
            self._lost.add(op_id)

    def _write_refused(self, op_id: str, error: LeaseLost) -> Operation | None:
        """A fenced write of ``op_id`` was refused: what ``refusal`` decides, carried out.

        An epoch refusal follows the ledger's epoch and adopts what this executor holds, ``op_id``
        included; a takeover drops ``op_id``. Returns the operation as this executor now holds it
        (adopted at the new epoch), or None when it no longer holds it.
        """
        if refusal(error) is Refusal.ADOPT:
            self._epoch_check()
            return self._ops.get(op_id)
        self._lease_lost(op_id, str(error))
        return None

    def _epoch_check(self) -> None:
        """If another executor raised the execution epoch, restart the drivers at it and adopt."""
        self._follow_rollout()


__all__ = ["Leases", "SharedLeases", "SoleOwner", "Tenancy", "tenancy_for"]
