"""Routing a new call: arm by sticky bucket, shadow beside the primary, and the protocol kill switch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import RolloutRefused
from rollout.assign import Arm, arm_for
from rollout.plan import RolloutState, Stage
from rollout.route import Router, ToolPaths

TOOLS = {
    "report": ToolPaths("report", "old", "new", side_effect_free=True),
    "batch": ToolPaths("batch", "old", "new", side_effect_free=False),
    "plain": ToolPaths("plain", "old", None, side_effect_free=True),
}
PROTOCOLS = {"old": "mcp-2025-11-25", "new": "mcp-2026-07-28"}


def router(**state: object) -> Router:
    return Router(RolloutState(salt="s", **state), TOOLS, PROTOCOLS)  # type: ignore[arg-type]


def test_off_sends_everything_to_the_old_path_without_shadow() -> None:
    """Off: old server, control arm, nothing shadowed."""
    r = router().route("n1", "report")
    assert (r.server, r.arm, r.shadow_server) == ("old", Arm.CONTROL, None)


def test_shadow_stage_shadows_only_the_chosen_side_effect_free_tools() -> None:
    """The primary stays on the old path; only shadowed, side-effect-free tools get a shadow on the new path."""
    rt = router(stage=Stage.SHADOW, shadow_tools=("report",))
    assert rt.route("n1", "report").shadow_server == "new"
    assert rt.route("n1", "report").server == "old"
    rt = router(stage=Stage.SHADOW, shadow_tools=("report", "batch"))
    assert rt.route("n1", "batch").shadow_server is None


@given(st.text(min_size=1, max_size=30), st.integers(1, 10_000))
def test_canary_routes_by_the_sticky_bucket(node: str, bp: int) -> None:
    """The canary arm goes to the new server, the control arm to the old one, as arm_for says."""
    r = router(stage=Stage.CANARY, canary_bp=bp).route(node, "batch")
    expected = arm_for(node, "s", bp)
    assert r.arm is expected
    assert r.server == ("new" if expected is Arm.CANARY else "old")


def test_full_sends_rollout_tools_to_the_new_path_and_others_stay_fixed() -> None:
    """Full: every rollout tool on the new server; a tool without a new path is 'fixed' on its own."""
    rt = router(stage=Stage.FULL, canary_bp=10_000)
    assert rt.route("n", "batch").server == "new"
    fixed = rt.route("n", "plain")
    assert (fixed.server, fixed.arm) == ("old", Arm.FIXED)


def test_a_disabled_new_protocol_sends_canary_calls_back_to_the_old_path() -> None:
    """Kill switch on the new adapter: canary-arm calls are rerouted to the old path and marked."""
    r = router(stage=Stage.FULL, canary_bp=10_000, disabled_protocols=("mcp-2026-07-28",)).route("n", "batch")
    assert (r.server, r.arm, r.rerouted_from) == ("old", Arm.CONTROL, "new")


def test_a_disabled_old_protocol_moves_calls_to_a_live_new_path_only() -> None:
    """During a canary the control arm may move to the new path; outside it the call is refused (409)."""
    canary = router(stage=Stage.CANARY, canary_bp=1, disabled_protocols=("mcp-2025-11-25",))
    node = next(f"k{i}" for i in range(1000) if arm_for(f"k{i}", "s", 1) is Arm.CONTROL)
    r = canary.route(node, "batch")
    assert (r.server, r.rerouted_from) == ("new", "old")
    with pytest.raises(RolloutRefused, match="disabled") as refused:
        router(disabled_protocols=("mcp-2025-11-25",)).route("n", "batch")
    assert refused.value.status == 409
    with pytest.raises(RolloutRefused, match="enable-protocol mcp-2025-11-25"):
        router(stage=Stage.FULL, disabled_protocols=("mcp-2025-11-25",)).route("n", "plain")


def test_a_disabled_new_protocol_stops_shadows() -> None:
    """No shadow is started on a disabled adapter; the primary is unaffected."""
    r = router(stage=Stage.SHADOW, shadow_tools=("report",), disabled_protocols=("mcp-2026-07-28",)).route(
        "n", "report"
    )
    assert (r.server, r.shadow_server) == ("old", None)


def test_unknown_tools_are_refused() -> None:
    """400 for a tool the configuration does not name."""
    with pytest.raises(RolloutRefused) as refused:
        router().route("n", "nope")
    assert refused.value.status == 400
