"""The rollout's stage machine: ``decide(state, request, ...) -> Decision``, or a refusal that says why.

Pure: no I/O, no clock. Stages go ``off -> shadow -> canary N% (5 % at most first) -> full``; a
rollback from any live stage returns every new call to the old path and raises the execution
epoch by one. Any action that raises the new path's share of traffic (entering or growing the
canary, promoting to full) is a promotion and is refused while a gate fails, unless the request
carries an explicit override (and, as every action, an actor and a reason). The protocol kill
switch is independent of the stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Final, assert_never

from engine.errors import RolloutRefused
from engine.model import GateRecord, Protocol
from rollout.assign import BUCKETS, bp_to_percent
from rollout.gates import GateReport

FIRST_CANARY_BP: Final = 500
"""The first canary step routes at most 5 % of calls through the new adapter."""


class Stage(StrEnum):
    OFF = "off"
    SHADOW = "shadow"
    CANARY = "canary"
    FULL = "full"
    ROLLED_BACK = "rolled_back"
    """Like ``off`` (every new call takes the old path), after a rollback raised the epoch."""


LIVE_STAGES: Final = frozenset({Stage.SHADOW, Stage.CANARY, Stage.FULL})


class Action(StrEnum):
    SHADOW = "shadow"
    CANARY = "canary"
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    DISABLE_PROTOCOL = "disable-protocol"
    ENABLE_PROTOCOL = "enable-protocol"


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Everything routing needs, persisted in ``rollout_state`` and in every audit row."""

    stage: Stage = Stage.OFF
    canary_bp: int = 0
    """Canary size in basis points (only meaningful in ``canary``)."""
    salt: str = ""
    shadow_tools: tuple[str, ...] = ()
    disabled_protocols: tuple[str, ...] = ()
    epoch: int = 1
    """The execution epoch; a rollback raises it by compare-and-swap."""

    @property
    def exposure_bp(self) -> int:
        """The share of a rollout tool's new calls that go to the new path, in basis points."""
        match self.stage:
            case Stage.FULL:
                return BUCKETS
            case Stage.CANARY:
                return self.canary_bp
            case Stage.OFF | Stage.SHADOW | Stage.ROLLED_BACK:
                return 0
            case _:
                assert_never(self.stage)

    def as_json(self) -> dict[str, object]:
        return {
            "stage": self.stage.value,
            "canary_bp": self.canary_bp,
            "canary_percent": bp_to_percent(self.canary_bp),
            "salt": self.salt,
            "shadow_tools": list(self.shadow_tools),
            "disabled_protocols": list(self.disabled_protocols),
            "epoch": self.epoch,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, object]) -> RolloutState:
        def strings(key: str) -> tuple[str, ...]:
            raw = value.get(key) or []
            if not isinstance(raw, list):
                raise ValueError(f"rollout state {key!r} is not a list")
            return tuple(str(v) for v in raw)

        return cls(
            stage=Stage(str(value["stage"])),
            canary_bp=int(str(value["canary_bp"])),
            salt=str(value["salt"]),
            shadow_tools=strings("shadow_tools"),
            disabled_protocols=strings("disabled_protocols"),
            epoch=int(str(value["epoch"])),
        )


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """What the stage machine must know about a configured tool."""

    name: str
    side_effect_free: bool
    new_path: bool
    """The tool has a new-adapter server configured (``shadow_server``)."""


@dataclass(frozen=True, slots=True)
class Request:
    """A release manager's or on-call operator's action."""

    action: Action
    actor: str
    reason: str
    canary_bp: int | None = None
    tools: tuple[str, ...] = ()
    """``shadow`` only: which tools to shadow (empty: every eligible tool)."""
    protocol: str | None = None
    override: bool = False
    """Promote even though a gate fails (recorded as an override)."""


@dataclass(frozen=True, slots=True)
class Decision:
    before: RolloutState
    after: RolloutState
    promotion: bool
    """The action raised the new path's exposure, so the gates were consulted."""
    override_used: bool
    """A gate failed and the request's override let the promotion through."""
    failing: tuple[GateRecord, ...] = field(default_factory=tuple)
    notes: tuple[str, ...] = field(default_factory=tuple)


def describe_gate(record: GateRecord) -> str:
    """``gate: verdict (value V, threshold T; inputs {...})`` for a refusal message."""
    inputs = ", ".join(f"{k}={v}" for k, v in record.inputs.items())
    return f"{record.gate}: {record.verdict} (value {record.value}, threshold {record.threshold}; {inputs})"


def _refuse(status: int, message: str) -> RolloutRefused:
    return RolloutRefused(status, message)


def _shadow(state: RolloutState, request: Request, tools: Mapping[str, ToolInfo], salt: str) -> RolloutState:
    if state.stage in (Stage.CANARY, Stage.FULL):
        raise _refuse(409, f"the rollout is at {state.stage}; roll back before shadowing again")
    chosen: list[str] = []
    if request.tools:
        for name in request.tools:
            info = tools.get(name)
            if info is None:
                raise _refuse(422, f"cannot shadow {name!r}: no such tool is configured")
            if not info.side_effect_free:
                raise _refuse(
                    422,
                    f"cannot shadow {name!r}: only tools declared side-effect-free (side_effect_free = true) "
                    "may be shadowed, because a shadow runs the call a second time",
                )
            if not info.new_path:
                raise _refuse(
                    422, f"cannot shadow {name!r}: it has no new-adapter server (tools.{name}.shadow_server)"
                )
            if name not in chosen:
                chosen.append(name)
    else:
        chosen = sorted(n for n, info in tools.items() if info.side_effect_free and info.new_path)
        if not chosen:
            raise _refuse(
                422, "no tool can be shadowed: none is both side-effect-free and given a shadow_server"
            )
    fresh = state.stage in (Stage.OFF, Stage.ROLLED_BACK)
    return replace(
        state,
        stage=Stage.SHADOW,
        canary_bp=0,
        shadow_tools=tuple(sorted(chosen)),
        salt=salt if fresh else state.salt,
    )


def _canary(state: RolloutState, request: Request, tools: Mapping[str, ToolInfo]) -> RolloutState:
    bp = request.canary_bp
    if bp is None or not 0 < bp <= BUCKETS:
        raise _refuse(400, "a canary needs a percentage in (0, 100]")
    if not any(info.new_path for info in tools.values()):
        raise _refuse(422, "no tool has a new-adapter server (shadow_server); there is nothing to canary")
    match state.stage:
        case Stage.OFF | Stage.ROLLED_BACK:
            raise _refuse(409, "shadow first: the canary follows the shadow stage (off -> shadow -> canary)")
        case Stage.SHADOW:
            if bp > FIRST_CANARY_BP:
                raise _refuse(
                    409,
                    f"the first canary step is at most {bp_to_percent(FIRST_CANARY_BP):g}%; "
                    f"asked for {bp_to_percent(bp):g}%",
                )
        case Stage.CANARY:
            if bp == state.canary_bp:
                raise _refuse(409, f"the canary is already at {bp_to_percent(bp):g}%")
        case Stage.FULL:
            pass
        case _:
            assert_never(state.stage)
    return replace(state, stage=Stage.CANARY, canary_bp=bp, shadow_tools=())


def _promote(state: RolloutState) -> RolloutState:
    if state.stage is not Stage.CANARY:
        raise _refuse(409, f"only a canary can be promoted to full; the rollout is at {state.stage}")
    return replace(state, stage=Stage.FULL, canary_bp=BUCKETS)


def _rollback(state: RolloutState) -> RolloutState:
    if state.stage not in LIVE_STAGES:
        raise _refuse(409, f"nothing to roll back: the rollout is at {state.stage}")
    return replace(state, stage=Stage.ROLLED_BACK, canary_bp=0, shadow_tools=(), epoch=state.epoch + 1)


def _protocol(state: RolloutState, request: Request) -> RolloutState:
    known = {p.value for p in Protocol}
    version = request.protocol
    if version is None or version not in known:
        raise _refuse(422, f"unknown protocol version {version!r} (one of {', '.join(sorted(known))})")
    disabled = set(state.disabled_protocols)
    if request.action is Action.DISABLE_PROTOCOL:
        if version in disabled:
            raise _refuse(409, f"protocol {version} is already disabled")
        disabled.add(version)
    else:
        if version not in disabled:
            raise _refuse(409, f"protocol {version} is not disabled")
        disabled.discard(version)
    return replace(state, disabled_protocols=tuple(sorted(disabled)))


def decide(
    state: RolloutState,
    request: Request,
    *,
    tools: Mapping[str, ToolInfo],
    salt: str,
    gates: GateReport,
) -> Decision:
    """The state after ``request``, or why it is refused.

    Args:
        state: the rollout as persisted.
        request: the action, with actor and reason.
        tools: the configured tools.
        salt: the configured rollout salt (taken when a rollout starts from off).
        gates: the gates evaluated now; consulted only when the action is a promotion.

    Raises:
        RolloutRefused: the action is not allowed in this stage, names a tool or protocol it may
            not, or is a promotion while a gate fails without an override (``failing`` says which).
    """
    if not request.actor.strip() or not request.reason.strip():
        raise _refuse(400, "every rollout action needs an actor and a reason")
    match request.action:
        case Action.SHADOW:
            after = _shadow(state, request, tools, salt)
        case Action.CANARY:
            after = _canary(state, request, tools)
        case Action.PROMOTE:
            after = _promote(state)
        case Action.ROLLBACK:
            after = _rollback(state)
        case Action.DISABLE_PROTOCOL | Action.ENABLE_PROTOCOL:
            after = _protocol(state, request)
        case _:
            assert_never(request.action)
    promotion = after.exposure_bp > state.exposure_bp
    blocked = promotion and not gates.passed
    failing = tuple(gates.failing()) if promotion else ()
    notes: list[str] = []
    if blocked and not request.override:
        listed = "; ".join(describe_gate(g) for g in failing) or "no gate was evaluated"
        raise RolloutRefused(
            409,
            f"promotion blocked: {len(failing)} gate(s) fail: {listed}. "
            "Pass --override with a reason to promote anyway (recorded as an override).",
            failing,
        )
    if request.override and not blocked:
        notes.append(
            "override requested but not needed: every gate passed" if promotion else "no gates apply"
        )
    return Decision(state, after, promotion, blocked, failing, tuple(notes))


__all__ = [
    "FIRST_CANARY_BP",
    "LIVE_STAGES",
    "Action",
    "Decision",
    "Request",
    "RolloutState",
    "Stage",
    "ToolInfo",
    "decide",
    "describe_gate",
]
