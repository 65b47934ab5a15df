"""The stage machine: off -> shadow -> canary (5 % first) -> full, rollback, kill switch, gated promotion."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import RolloutRefused
from engine.model import GateRecord
from rollout.gates import GateReport
from rollout.plan import FIRST_CANARY_BP, Action, Request, RolloutState, Stage, ToolInfo, decide

TOOLS = {
    "generate_report": ToolInfo("generate_report", side_effect_free=True, new_path=True),
    "apply_batch_change": ToolInfo("apply_batch_change", side_effect_free=False, new_path=True),
    "analyze_upload": ToolInfo("analyze_upload", side_effect_free=True, new_path=False),
}
PASS = GateReport([GateRecord(g, True, 0, 0, "ok", {}) for g in ("a", "b")])
FAIL = GateReport(
    [
        GateRecord("a", True, 0, 0, "ok", {}),
        GateRecord("cancel_confirmation", False, 75.0, 60.0, "p99 75 s", {"p99_s": 75.0}),
    ]
)


def req(action: Action, **kw: object) -> Request:
    return Request(action, actor=str(kw.pop("actor", "rm")), reason=str(kw.pop("reason", "why")), **kw)  # type: ignore[arg-type]


def run(state: RolloutState, request: Request, gates: GateReport = PASS) -> RolloutState:
    return decide(state, request, tools=TOOLS, salt="salt-1", gates=gates).after


def test_the_happy_path_goes_off_shadow_canary_full() -> None:
    """Every stage in order, with gates passing."""
    s = run(RolloutState(), req(Action.SHADOW))
    assert s.stage is Stage.SHADOW
    assert s.shadow_tools == ("generate_report",)
    assert s.salt == "salt-1"
    s = run(s, req(Action.CANARY, canary_bp=500))
    assert (s.stage, s.canary_bp, s.shadow_tools) == (Stage.CANARY, 500, ())
    s = run(s, req(Action.CANARY, canary_bp=2500))
    assert s.canary_bp == 2500
    s = run(s, req(Action.PROMOTE))
    assert s.stage is Stage.FULL
    assert s.exposure_bp == 10_000


def test_shadowing_a_tool_with_side_effects_is_refused_with_a_clear_error() -> None:
    """A shadow runs the call twice, so only side-effect-free tools may be shadowed."""
    with pytest.raises(RolloutRefused, match="side-effect-free") as refused:
        run(RolloutState(), req(Action.SHADOW, tools=("apply_batch_change",)))
    assert refused.value.status == 422


@pytest.mark.parametrize(
    ("tool", "message"), [("analyze_upload", "no new-adapter server"), ("nope", "no such tool")]
)
def test_shadowing_a_tool_without_a_new_path_or_unknown_is_refused(tool: str, message: str) -> None:
    """The tool must exist and have a shadow_server."""
    with pytest.raises(RolloutRefused, match=message):
        run(RolloutState(), req(Action.SHADOW, tools=(tool,)))


def test_the_first_canary_step_is_at_most_five_percent() -> None:
    """From shadow, 6 % is refused and 5 % accepted."""
    shadow = run(RolloutState(), req(Action.SHADOW))
    with pytest.raises(RolloutRefused, match="at most 5%"):
        run(shadow, req(Action.CANARY, canary_bp=FIRST_CANARY_BP + 100))
    assert run(shadow, req(Action.CANARY, canary_bp=FIRST_CANARY_BP)).canary_bp == 500


@pytest.mark.parametrize("stage", [Stage.OFF, Stage.ROLLED_BACK])
def test_a_canary_needs_a_shadow_first(stage: Stage) -> None:
    """off -> canary skips the shadow stage and is refused."""
    with pytest.raises(RolloutRefused, match="shadow first"):
        run(RolloutState(stage=stage), req(Action.CANARY, canary_bp=100))


def test_promotion_is_blocked_while_a_gate_fails_and_names_the_gate_with_raw_values() -> None:
    """The refusal carries the failing gate, its value, threshold and raw inputs."""
    canary = RolloutState(stage=Stage.CANARY, canary_bp=500, salt="s")
    with pytest.raises(RolloutRefused) as refused:
        run(canary, req(Action.PROMOTE), FAIL)
    assert refused.value.status == 409
    assert "cancel_confirmation" in str(refused.value)
    assert "p99_s=75.0" in str(refused.value)
    assert [g.gate for g in refused.value.failing] == ["cancel_confirmation"]


def test_an_override_lets_a_promotion_through_and_is_marked() -> None:
    """--override with a reason promotes despite a failing gate; the decision says it was overridden."""
    canary = RolloutState(stage=Stage.CANARY, canary_bp=500, salt="s")
    d = decide(canary, req(Action.PROMOTE, override=True), tools=TOOLS, salt="s", gates=FAIL)
    assert d.after.stage is Stage.FULL
    assert d.override_used
    assert [g.gate for g in d.failing] == ["cancel_confirmation"]


def test_growing_the_canary_is_gated_but_shrinking_it_is_not() -> None:
    """More exposure needs passing gates; less exposure never does."""
    canary = RolloutState(stage=Stage.CANARY, canary_bp=1000, salt="s")
    with pytest.raises(RolloutRefused, match="promotion blocked"):
        run(canary, req(Action.CANARY, canary_bp=2000), FAIL)
    assert run(canary, req(Action.CANARY, canary_bp=500), FAIL).canary_bp == 500


@pytest.mark.parametrize("stage", [Stage.SHADOW, Stage.CANARY, Stage.FULL])
def test_rollback_returns_to_the_old_path_and_raises_the_epoch_even_with_failing_gates(stage: Stage) -> None:
    """One action from any live stage: exposure 0, epoch + 1, never gated."""
    before = RolloutState(stage=stage, canary_bp=500 if stage is Stage.CANARY else 0, salt="s", epoch=3)
    after = run(before, req(Action.ROLLBACK), FAIL)
    assert after.stage is Stage.ROLLED_BACK
    assert after.epoch == 4
    assert after.exposure_bp == 0


@pytest.mark.parametrize("stage", [Stage.OFF, Stage.ROLLED_BACK])
def test_rollback_with_nothing_rolled_out_is_refused(stage: Stage) -> None:
    """Nothing to roll back; the epoch stays."""
    with pytest.raises(RolloutRefused, match="nothing to roll back"):
        run(RolloutState(stage=stage), req(Action.ROLLBACK))


def test_protocols_are_disabled_and_enabled_by_version() -> None:
    """The kill switch takes known protocol versions only and refuses no-op changes."""
    s = run(RolloutState(), req(Action.DISABLE_PROTOCOL, protocol="mcp-2025-11-25"))
    assert s.disabled_protocols == ("mcp-2025-11-25",)
    with pytest.raises(RolloutRefused, match="already disabled"):
        run(s, req(Action.DISABLE_PROTOCOL, protocol="mcp-2025-11-25"))
    with pytest.raises(RolloutRefused, match="unknown protocol") as unknown:
        run(s, req(Action.DISABLE_PROTOCOL, protocol="mcp-1999"))
    assert unknown.value.status == 422
    assert run(s, req(Action.ENABLE_PROTOCOL, protocol="mcp-2025-11-25")).disabled_protocols == ()


@pytest.mark.parametrize(("actor", "reason"), [("", "r"), ("a", " "), (" ", "")])
def test_every_action_needs_an_actor_and_a_reason(actor: str, reason: str) -> None:
    """Nothing is decided without who and why."""
    with pytest.raises(RolloutRefused, match="actor and a reason") as refused:
        decide(RolloutState(), Request(Action.SHADOW, actor, reason), tools=TOOLS, salt="s", gates=PASS)
    assert refused.value.status == 400


actions = st.builds(
    Request,
    st.sampled_from(list(Action)),
    st.just("a"),
    st.just("r"),
    canary_bp=st.integers(1, 10_000),
    tools=st.just(()),
    protocol=st.sampled_from(["mcp-2025-11-25", "aip-151"]),
    override=st.booleans(),
)


@given(st.lists(actions, max_size=25))
def test_any_sequence_of_actions_keeps_the_invariants(requests: list[Request]) -> None:
    """The epoch only rises by rollbacks, never falls; a failing gate is never passed without an override."""
    state = RolloutState(salt="s")
    for request in requests:
        try:
            d = decide(state, request, tools=TOOLS, salt="s", gates=FAIL)
        except RolloutRefused:
            continue
        assert d.after.epoch == state.epoch + (1 if request.action is Action.ROLLBACK else 0)
        if d.after.exposure_bp > state.exposure_bp:
            assert request.override
            assert d.override_used
        if d.after.stage is Stage.CANARY and state.stage is Stage.SHADOW:
            assert d.after.canary_bp <= FIRST_CANARY_BP
        state = d.after
    assert RolloutState.from_json(state.as_json()) == state


def test_state_survives_a_json_round_trip() -> None:
    """What the ledger stores is what routing reads back."""
    s = RolloutState(Stage.CANARY, 750, "salt", ("t",), ("aip-151",), 7)
    assert RolloutState.from_json(s.as_json()) == s
    assert replace(s, epoch=8) != s
