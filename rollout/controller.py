"""The rollout's shell around its pure decisions: read the ledger, decide, append the audit chain.

Decisions are ``rollout.plan.decide`` (stages, gates, overrides), ``rollout.assign`` (arms and the
arm-flip report), ``rollout.shadow.compare`` and ``rollout.audit`` (chain links, verification).
This module only gathers their inputs from ``engine.ledger`` and writes their results back through
it; it talks to no server and moves no operation (the executor adopts operations after a rollback).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from engine.clock import Clock
from engine.errors import RolloutRefused, StaleWrite
from engine.model import RECEIPT_STATES, LocalState, Operation
from rollout.assign import Arm, Key, flip_report
from rollout.audit import GENESIS, Anchor, AuditEvent, AuditReport, canonical, next_event, verify
from rollout.gates import GateReport, Thresholds, evaluate
from rollout.plan import Decision, Request, RolloutState, Stage, decide, describe_gate
from rollout.route import Route, ToolPaths
from rollout.shadow import Side, compare, content_digest

FLIP_LIST_LIMIT = 1000
"""Keys listed per arm-flip report in the audit row (the counts are always exact)."""

_RECEIPT_VALUES = frozenset(s.value for s in RECEIPT_STATES)

if TYPE_CHECKING:  # both ledgers (DuckDB, PostgreSQL) offer this port
    from engine.ledger.port import LedgerPort


@dataclass(frozen=True, slots=True)
class ActionResult:
    """A recorded rollout action: the audit row, the decision, and the gates it saw."""

    event: AuditEvent
    decision: Decision
    detail: dict[str, object]
    gates: GateReport

    def as_json(self) -> dict[str, object]:
        return {
            "seq": self.event.seq,
            "action": self.event.action,
            "actor": self.event.actor,
            "reason": self.event.reason,
            "override": self.event.override,
            "before": self.decision.before.as_json(),
            "after": self.decision.after.as_json(),
            "detail": self.detail,
            "gates_passed": self.gates.passed,
            "hash": self.event.hash,
            "recorded_at": self.event.recorded_at,
        }


def gate_json(report: GateReport) -> list[dict[str, object]]:
    return [
        {
            "gate": r.gate,
            "passed": r.passed,
            "value": r.value,
            "threshold": r.threshold,
            "verdict": r.verdict,
            "inputs": r.inputs,
        }
        for r in report.results
    ]


def _event_row(event: AuditEvent) -> dict[str, object]:
    return {
        "seq": event.seq,
        "action": event.action,
        "actor": event.actor,
        "reason": event.reason,
        "override": event.override,
        "before_state": event.before_state,
        "after_state": event.after_state,
        "detail": event.detail,
        "gate_inputs": event.gate_inputs,
        "gate_inputs_digest": event.gate_inputs_digest,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
        "recorded_at": event.recorded_at,
    }


def _event_of(row: Mapping[str, object]) -> AuditEvent:
    recorded_at = row["recorded_at"]
    if not isinstance(recorded_at, datetime):
        raise ValueError(f"rollout event {row.get('seq')} has no instant")
    return AuditEvent(
        seq=int(str(row["seq"])),
        action=str(row["action"]),
        actor=str(row["actor"]),
        reason=str(row["reason"]),
        override=bool(row["override"]),
        before_state=str(row["before_state"]),
        after_state=str(row["after_state"]),
        detail=str(row["detail"]),
        gate_inputs=str(row["gate_inputs"]),
        gate_inputs_digest=str(row["gate_inputs_digest"]),
        prev_hash=str(row["prev_hash"]),
        hash=str(row["hash"]),
        recorded_at=recorded_at,
    )


def _state_of(row: Mapping[str, object]) -> RolloutState:
    return RolloutState.from_json(row)


def verify_ledger(ledger: LedgerPort) -> AuditReport:
    """Verify the ledger's rollout audit chain against its anchor (read-only)."""
    rows = [_event_of(r) for r in ledger.rollout_events()]
    state = ledger.rollout_state()
    anchor = None
    if state is not None:
        anchor = Anchor(
            head_seq=int(str(state["head_seq"])),
            head_hash=str(state["head_hash"]),
            state=canonical(_state_of(state).as_json()),
        )
    return verify(rows, anchor)


class RolloutController:
    """Holds the rollout state in force (the ledger's copy is the truth) and records every action."""

    def __init__(
        self,
        ledger: LedgerPort,
        clock: Clock,
        tools: Mapping[str, ToolPaths],
        *,
        salt: str,
        epoch: int = 1,
        thresholds: Thresholds | None = None,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self.tools = dict(tools)
        self._salt = salt
        self._initial_epoch = epoch
        self._thresholds = thresholds or Thresholds()
        self.state, self._head = self._load()

    def _load(self) -> tuple[RolloutState, tuple[int, str]]:
        row = self._ledger.rollout_state()
        if row is None:
            return RolloutState(salt=self._salt, epoch=self._initial_epoch), (0, GENESIS)
        return _state_of(row), (int(str(row["head_seq"])), str(row["head_hash"]))

    def refresh(self) -> bool:
        """Take the ledger's rollout state if another process moved it; returns whether it had moved.

        The ledger's row is the truth for every executor of one ledger: an action recorded through
        any of them moves the chain head, which this read compares (one row, cheap to poll).
        """
        state, head = self._load()
        if head == self._head and state == self.state:
            return False
        self.state, self._head = state, head
        return True

    @property
    def head_seq(self) -> int:
        """The audit chain's head this state comes from (0 before the first action)."""
        return self._head[0]

    # ---------------------------------------------------------------------------------- actions

    def act(self, request: Request, *, context: Mapping[str, object] | None = None) -> ActionResult:
        """Decide ``request`` and record it (audit row and state, one transaction).

        Args:
            request: the action.
            context: facts the caller gathered for the audit row (a rollback's in-flight counts).

        Raises:
            RolloutRefused: the plan refuses it (stage, tool, protocol, failing gates), or another
                action moved the rollout first.
        """
        # Decided on the ledger's state, not this process's copy: another executor may have acted.
        self.refresh()
        now = self._clock.now()
        inputs = self._ledger.gate_inputs(now)
        report = evaluate(inputs, self._thresholds)
        infos = {name: paths.info for name, paths in self.tools.items()}
        try:
            decision = decide(self.state, request, tools=infos, salt=self._salt, gates=report)
        except RolloutRefused as exc:
            if exc.failing:
                self._ledger.record_gate_run(report.results, now)
            raise
        if decision.promotion:
            self._ledger.record_gate_run(report.results, now)
        detail = self._detail(decision, report, context)
        event = next_event(
            prev_seq=self._head[0],
            prev_hash=self._head[1],
            action=request.action.value,
            actor=request.actor,
            reason=request.reason,
            override=decision.override_used,
            before_state=decision.before.as_json(),
            after_state=decision.after.as_json(),
            detail=detail,
            gate_inputs=inputs,
            at=now,
        )
        try:
            self._ledger.append_rollout_event(
                _event_row(event),
                decision.after.as_json(),
                expected_seq=self._head[0],
                expected_epoch=decision.before.epoch,
            )
        except StaleWrite as exc:
            self.state, self._head = self._load()
            raise RolloutRefused(
                409, f"the rollout changed while this action was decided; check the status and retry ({exc})"
            ) from exc
        self.state = decision.after
        self._head = (event.seq, event.hash)
        return ActionResult(event, decision, json.loads(event.detail), report)

    def _detail(
        self, decision: Decision, report: GateReport, context: Mapping[str, object] | None
    ) -> dict[str, object]:
        detail: dict[str, object] = {"gates_passed": report.passed}
        if decision.override_used:
            detail["overridden_gates"] = [
                {
                    "gate": g.gate,
                    "verdict": g.verdict,
                    "value": g.value,
                    "threshold": g.threshold,
                    "inputs": g.inputs,
                    "summary": describe_gate(g),
                }
                for g in decision.failing
            ]
        if decision.notes:
            detail["notes"] = list(decision.notes)
        before, after = decision.before, decision.after
        if before.exposure_bp != after.exposure_bp:
            keys = [
                Key(node, op_id, state, state not in _RECEIPT_VALUES)
                for node, op_id, state in self._ledger.rollout_keys()
            ]
            report_ = flip_report(keys, after.salt, before.exposure_bp, after.exposure_bp)
            flips = report_.as_json(limit=FLIP_LIST_LIMIT)
            flips["truncated"] = len(report_.flips) > FLIP_LIST_LIMIT
            detail["arm_flips"] = flips
        if before.epoch != after.epoch:
            detail["epoch"] = {"from": before.epoch, "to": after.epoch}
        if context:
            detail.update(context)
        return detail

    # --------------------------------------------------------------------------------- routing

    def assignment(
        self,
        op: Operation,
        route: Route,
        *,
        tool: str,
        server_name: str,
        primary_operation_id: str | None = None,
    ) -> dict[str, object]:
        """The ``rollout_assignments`` row for an operation just created on ``route``."""
        shadow = primary_operation_id is not None
        return {
            "operation_id": op.operation_id,
            "call_node_id": op.call_node_id,
            "tool_name": tool,
            "role": op.role.value,
            "arm": Arm.SHADOW.value if shadow else route.arm.value,
            "stage": self.state.stage.value,
            "bucket": route.bucket,
            "canary_bp": self.state.exposure_bp,
            "server_name": server_name,
            "rerouted_from": None if shadow else route.rerouted_from,
            "primary_operation_id": primary_operation_id,
            "rollout_seq": self._head[0],
            "assigned_at": op.created_at,
        }

    # ---------------------------------------------------------------------------------- shadow

    def _side(self, operation_id: str) -> Side | None:
        op = self._ledger.get(operation_id)
        receipt = self._ledger.receipt_of_operation(operation_id)
        if op is None or receipt is None:
            return None
        accepted_at = receipt["accepted_at"]
        if not isinstance(accepted_at, datetime):
            return None
        payload = self._ledger.result_payload(operation_id) if op.state is LocalState.ACCEPTED else None
        return Side(
            operation_id=operation_id,
            status=str(receipt["status"]),
            result_digest=str(receipt["result_digest"]) if receipt["result_digest"] is not None else None,
            content_digest=content_digest(payload),
            latency=accepted_at - op.created_at,
            polls=self._ledger.poll_count(operation_id),
        )

    def compare_pair(self, primary_id: str, shadow_id: str) -> bool | None:
        """Record the comparison of a pair once both hold a receipt.

        Returns:
            True if recorded now, False if it had been recorded before, None while one of the
            two has no receipt yet.
        """
        primary, shadow = self._side(primary_id), self._side(shadow_id)
        if primary is None or shadow is None:
            return None
        op = self._ledger.get(primary_id)
        assert op is not None
        diff = compare(primary, shadow)
        return self._ledger.record_shadow_diff(
            {
                "primary_operation_id": primary_id,
                "shadow_operation_id": shadow_id,
                "call_node_id": op.call_node_id,
                "tool_name": op.tool.name,
                "primary_status": primary.status,
                "shadow_status": shadow.status,
                "primary_result_digest": primary.result_digest,
                "shadow_result_digest": shadow.result_digest,
                "primary_content_digest": primary.content_digest,
                "shadow_content_digest": shadow.content_digest,
                "primary_latency_ms": primary.latency.total_seconds() * 1000,
                "shadow_latency_ms": shadow.latency.total_seconds() * 1000,
                "primary_polls": primary.polls,
                "shadow_polls": shadow.polls,
                "diverged": diff.diverged,
                "differences": canonical(list(diff.differences)),
                "recorded_at": self._clock.now(),
            }
        )

    def compare_ready(self) -> int:
        """Compare every pair whose two operations hold receipts; returns how many were recorded."""
        return sum(
            1 for p, s in self._ledger.shadow_pairs(ready_only=True) if self.compare_pair(p, s) is True
        )

    # ---------------------------------------------------------------------------------- reading

    def verify(self) -> AuditReport:
        return verify_ledger(self._ledger)

    def status(self, *, protocols: Mapping[str, str]) -> dict[str, object]:
        """Everything a release manager needs on one page (no thresholds applied but the defaults)."""
        state = self.state
        now = self._clock.now()
        report = evaluate(self._ledger.gate_inputs(now), self._thresholds)
        live = self._ledger.live_by_protocol()
        disabled = [
            {
                "protocol": version,
                "remaining": sum(live.get(version, {}).values()),
                "remaining_by_state": live.get(version, {}),
            }
            for version in state.disabled_protocols
        ]
        tools = [
            {
                "tool": name,
                "old_server": paths.old_server,
                "old_protocol": protocols.get(paths.old_server),
                "new_server": paths.new_server,
                "new_protocol": protocols.get(paths.new_server) if paths.new_server else None,
                "side_effect_free": paths.side_effect_free,
                "shadowed": name in state.shadow_tools and state.stage is Stage.SHADOW,
            }
            for name, paths in sorted(self.tools.items())
        ]
        events = [
            {k: r[k] for k in ("seq", "action", "actor", "reason", "override", "recorded_at")}
            for r in self._ledger.rollout_events(limit=10, newest_first=True)
        ]
        audit = self.verify()
        return {
            **state.as_json(),
            "percentage": state.exposure_bp / 100,
            "remaining": {d["protocol"]: d["remaining"] for d in disabled},
            "kill_switch": disabled,
            "tools": tools,
            "live_by_protocol": live,
            "arms": self._ledger.arm_counts(),
            "shadow": self._ledger.shadow_summary(),
            "fenced_replies": self._ledger.fenced_replies(),
            "gates": {
                "passed": report.passed,
                "failing": [describe_gate(g) for g in report.failing()],
            },
            "audit": {
                "verified": audit.ok,
                "events": audit.checked,
                "head_seq": self._head[0],
                "head_hash": self._head[1],
                "detail": "; ".join(audit.problems),
            },
            "recent_events": events,
        }


__all__ = [
    "FLIP_LIST_LIMIT",
    "ActionResult",
    "RolloutController",
    "gate_json",
    "verify_ledger",
]
