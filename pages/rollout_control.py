"""Rollout control: stage, promote (only when the gates pass), rollback behind a typed-reason dialog, protocol kill switch, audit log."""

from __future__ import annotations

import streamlit as st

from console.frame import (
    Permission,
    acting_as,
    acting_name,
    acting_token,
    console_insights,
    gate_stamp,
    gate_table,
    link,
    live_section,
    may,
    not_allowed,
)
from console.insights import Insights
from console.queries import PROTOCOLS
from console.views import RolloutStatus
from engine.errors import ConsoleError
from rollout.plan import LIVE_STAGES, Stage

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("Rollout control")


# What a person can do next at each stage (display only: the service decides, by rollout.plan.decide,
# and its refusal is shown as it comes). Rollback is offered exactly in rollout.plan.LIVE_STAGES.
_NEXT = {
    Stage.OFF: "next: Shadow (the new path runs beside the old one; nobody sees its results)",
    Stage.SHADOW: "next: Set canary (a share of new calls takes the new path), or Roll back",
    Stage.CANARY: "next: grow the canary or Promote to full (both need every gate to pass), or Roll back",
    Stage.FULL: "every new call takes the new path; Roll back returns them to the old one",
    Stage.ROLLED_BACK: "every new call takes the old path; Shadow starts again",
}


def pipeline(status: RolloutStatus) -> str:
    """``off → shadow → **canary 5 %** → full`` with the current stage in bold (and ``rolled back``)."""
    parts = []
    for stage in (Stage.OFF, Stage.SHADOW, Stage.CANARY, Stage.FULL):
        label = stage.value
        if stage is Stage.CANARY and status.stage == Stage.CANARY and status.percentage is not None:
            label = f"canary {status.percentage:g} %"
        parts.append(f":blue-background[**{label}**]" if status.stage == stage.value else label)
    back = "rolled back"
    tail = f":red-background[**{back}**]" if status.stage == Stage.ROLLED_BACK.value else back
    return " → ".join(parts) + " · " + tail


def _act(action: str, reason: str, *, percentage: float | None = None, protocol: str | None = None) -> None:
    try:
        result = insights.rollout_action(
            action,
            actor=acting_name(),
            reason=reason,
            percentage=percentage,
            protocol=protocol,
            token=acting_token(),
        )
    except ConsoleError as exc:
        st.session_state["rollout_message"] = ("error", f"{action} refused: {exc}")
    else:
        st.session_state["rollout_message"] = ("success", f"{action} recorded")
        st.session_state["rollout_last_result"] = result


@st.dialog("Roll back")
def rollback_dialog() -> None:
    status: RolloutStatus | None = st.session_state.get("rollout_status")
    epoch = status.epoch if status is not None else None
    st.write(
        "Rollback stops creating new operations on the new path and hands in-flight operations to the "
        "old executor in the same ledger. It is recorded in the audit chain."
    )
    if epoch is not None:
        st.markdown(
            f"**Execution epoch {epoch} → {epoch + 1}**: a write fenced by epoch {epoch} is refused after it."
        )
    try:
        arms = insights.arms()
    except ConsoleError as exc:
        st.caption(f"in-flight operations unavailable: {exc}")
    else:
        flying = ", ".join(f"{r.arm}: {int(r.in_flight)}" for r in arms.itertuples(index=False))
        st.markdown(f"**Operations in flight per arm**: {flying or 'none'} (they finish on the old executor)")
    st.markdown(f"**Stage** {status.stage if status else '?'} → rolled_back")
    if not acting_as("this rollback"):
        return
    reason = st.text_input("Reason (required, typed)", key="rollout_rollback_reason")
    confirm = st.button(
        "Roll back now", type="primary", disabled=not reason.strip(), key="rollout_rollback_confirm"
    )
    if confirm:
        _act("rollback", reason)
        st.rerun()


def shadow_panel() -> None:
    """Shadow and canary: per tool which path is old and which new, pairs compared and diverged, the
    diverged pairs with both operations, and the operations per arm."""
    st.subheader("Shadow and canary")
    summary = insights.shadow_summary()
    if summary is None or summary.empty:
        st.caption("No shadow comparison recorded yet.")
    else:
        st.dataframe(
            summary.rename(
                columns={
                    "tool_name": "tool",
                    "old_path": "old path",
                    "new_path": "new path",
                    "old_server": "old server",
                    "new_server": "new server",
                    "last_compared_at": "last compared",
                }
            ),
            hide_index=True,
            key="rollout_shadow_summary",
            width="stretch",
        )
    diverged = insights.shadow_diverged(limit=50)
    if diverged is not None and not diverged.empty:
        st.markdown(f"**Diverged pairs** ({len(diverged)} newest)")
        table = diverged.assign(
            old_operation="/operations?key=" + diverged["old_call_node"].astype(str),
            new_operation="/operations?key=" + diverged["new_call_node"].astype(str),
        )[
            [
                "recorded_at",
                "tool_name",
                "old_operation",
                "new_operation",
                "old_status",
                "new_status",
                "old_result_digest",
                "new_result_digest",
                "old_latency_ms",
                "new_latency_ms",
                "differences",
            ]
        ]
        st.dataframe(
            table,
            hide_index=True,
            key="rollout_shadow_diverged",
            width="stretch",
            column_config={
                "old_operation": st.column_config.LinkColumn("old operation", display_text=r"key=(.*)$"),
                "new_operation": st.column_config.LinkColumn("new operation", display_text=r"key=(.*)$"),
                "old_latency_ms": st.column_config.NumberColumn("old latency (ms)", format="%.0f"),
                "new_latency_ms": st.column_config.NumberColumn("new latency (ms)", format="%.0f"),
            },
        )
        for pair in diverged.head(5).itertuples(index=False):
            a, b, c = st.columns([3, 3, 4])
            with a:
                link(
                    "pages/operations.py",
                    f"{pair.old_call_node} (old path)",
                    {"key": str(pair.old_call_node)},
                )
            with b:
                link(
                    "pages/operations.py",
                    f"{pair.new_call_node} (new path)",
                    {"key": str(pair.new_call_node)},
                )
            c.caption(f"{pair.tool_name}: {pair.old_status} vs {pair.new_status} · {pair.differences}")
    elif summary is not None and not summary.empty:
        st.caption("No pair diverged.")
    arms = insights.arms()
    st.markdown("**Operations per arm**")
    st.dataframe(arms, hide_index=True, key="rollout_arms")


message = st.session_state.pop("rollout_message", None)
if message is not None:
    kind, text = message
    (st.success if kind == "success" else st.error)(text)


@live_section
def live() -> None:
    # The latest recorded run when current (else a whole-ledger scan): overlap it with the rest.
    # Display only: on promote, the service evaluates the gates afresh itself and decides.
    gates_soon = insights.soon(insights.gates)
    audit_soon = insights.soon(insights.audit_log)
    try:
        status = insights.rollout_status()
    except ConsoleError as exc:
        status = None
        st.error(f"rollout status unavailable: {exc}")
    st.session_state["rollout_available"] = status is not None
    st.session_state["rollout_status"] = status
    # The actions below the fragment were drawn for the status of the last whole-page run; a refresh
    # alone would leave them there (Roll back disabled after a shadow started elsewhere, or after one
    # status read failed). When the stage they were drawn for has moved, redraw the whole page.
    drawn = st.session_state.get("rollout_actions_drawn_for")
    seen = (status is not None, status.stage if status is not None else "")
    if not st.session_state.get("rollout_page_run", False) and drawn is not None and drawn != seen:
        st.rerun(scope="app")
    if status is None:
        st.info(
            "No rollout status: no rollout action is recorded yet, the service has no rollout API yet, "
            "or this console reads a ledger file."
        )
    else:
        st.markdown(pipeline(status))
        hint = _NEXT.get(Stage(status.stage)) if status.stage in set(Stage) else None
        if hint:
            st.caption(hint)
        c1, c2, c3, c4 = st.columns(4)
        c1.metric("Stage", status.stage.replace("_", " "))
        c2.metric("Canary", f"{status.percentage:g} %" if status.percentage is not None else "-")
        c3.metric("Execution epoch", status.epoch if status.epoch is not None else "-")
        chain = status.audit
        c4.metric(
            "Audit chain",
            "verified" if chain.verified else ("BROKEN" if chain.verified is False else "not checked"),
        )
        if chain.detail:
            st.caption(chain.detail)
        if status.disabled_protocols:
            st.subheader("Disabled protocols")
            st.dataframe(
                [
                    {"protocol": p, "operations still in flight": status.remaining.get(p, 0)}
                    for p in status.disabled_protocols
                ],
                hide_index=True,
                key="rollout_disabled",
            )
    gates = gates_soon.result()
    st.session_state["rollout_gates_pass"] = gates.passed
    st.session_state["rollout_failing"] = [f"{g.gate}: {g.verdict}" for g in gates.failing()]
    st.subheader("Gates")
    st.markdown(
        f"**{sum(r.passed for r in gates.results)} of {len(gates.results)} pass** · "
        "a promotion is decided by the service on its own fresh evaluation, not on this view"
    )
    gate_table(gates, "rollout_gate_table")
    gate_stamp(insights, gates, "rollout_reevaluate")

    shadow_panel()

    st.subheader("Audit log")
    log = audit_soon.result()
    if log is None:
        st.caption("This ledger has no rollout audit log yet.")
    else:
        st.dataframe(log, hide_index=True, key="rollout_audit")
    denials = insights.access_denials(limit=100)
    if denials is not None:
        st.subheader("Refused attempts")
        st.caption("Requests the service refused (401: no valid token; 403: a role that does not allow it).")
        if denials.empty:
            st.caption("None recorded.")
        else:
            st.dataframe(denials, hide_index=True, key="rollout_denials", width="stretch")


st.session_state["rollout_page_run"] = True  # live() below runs inside this whole-page run
live()
st.session_state["rollout_page_run"] = False

can_act = insights.info.writable and st.session_state.get("rollout_available", False) and bool(acting_name())
current: RolloutStatus | None = st.session_state.get("rollout_status")
stage = current.stage if current is not None else ""
if not insights.info.writable:
    what = "PostgreSQL ledger" if insights.info.kind == "postgres" else "ledger file"
    st.warning(f"Read-only console ({what}): actions need the running service.")

st.subheader("Actions")
if not may(Permission.ROLLOUT):
    # The controls are absent, not disabled: this role may not move the rollout at all.
    not_allowed(Permission.ROLLOUT, "Moving the rollout (shadow, canary, promote, rollback, kill switch)")
    st.stop()
acting_as("every action below")
st.session_state["rollout_actions_drawn_for"] = (current is not None, stage)
a1, a2, a3 = st.columns(3)
with a1:
    st.markdown("**Promote**")
    failing = st.session_state.get("rollout_failing", [])
    st.text_input("Reason", key="rollout_promote_reason")
    if failing:
        st.error("Promotion is disabled while gates fail:\n\n" + "\n".join(f"- {f}" for f in failing))
    if st.button(
        "Promote",
        disabled=bool(failing)
        or not can_act
        or stage != Stage.CANARY
        or not st.session_state["rollout_promote_reason"].strip(),
        key="rollout_promote",
    ):
        _act("promote", st.session_state["rollout_promote_reason"])
        st.rerun()
with a2:
    st.markdown("**Shadow / canary**")
    # The field follows the stage: the current canary share, else the usual first step (5 %).
    shown_pct = (
        current.percentage if current is not None and stage == Stage.CANARY and current.percentage else 5.0
    )
    if st.session_state.get("rollout_pct_stage") != stage:
        st.session_state["rollout_pct"] = float(shown_pct)
        st.session_state["rollout_pct_stage"] = stage
    st.number_input("Canary percentage", min_value=0.0, max_value=100.0, step=1.0, key="rollout_pct")
    st.text_input("Reason", key="rollout_stage_reason")
    reason = st.session_state["rollout_stage_reason"].strip()
    b1, b2 = st.columns(2)
    shadow_ok = stage in ("", Stage.OFF, Stage.SHADOW, Stage.ROLLED_BACK)
    canary_ok = stage in ("", Stage.SHADOW, Stage.CANARY)
    if b1.button("Shadow", disabled=not can_act or not reason or not shadow_ok, key="rollout_shadow"):
        _act("shadow", reason)
        st.rerun()
    if b2.button("Set canary", disabled=not can_act or not reason or not canary_ok, key="rollout_canary"):
        _act("canary", reason, percentage=float(st.session_state["rollout_pct"]))
        st.rerun()
with a3:
    st.markdown("**Rollback**")
    st.caption("Stops new operations on the new path and raises the execution epoch.")
    live_stage = stage in {s.value for s in LIVE_STAGES}
    if not live_stage and current is not None:
        st.caption(f"Nothing to roll back at stage {stage.replace('_', ' ')}.")
    if st.button(
        "Roll back…", type="primary", disabled=not can_act or not live_stage, key="rollout_rollback"
    ):
        rollback_dialog()

st.subheader("Protocol kill switch")
k1, k2, k3, k4 = st.columns([2, 3, 1, 1])
k1.selectbox("Protocol version", PROTOCOLS, key="rollout_protocol")
k2.text_input("Reason", key="rollout_protocol_reason")
kill_reason = st.session_state["rollout_protocol_reason"].strip()
if k3.button("Disable", disabled=not can_act or not kill_reason, key="rollout_disable"):
    _act("disable-protocol", kill_reason, protocol=st.session_state["rollout_protocol"])
    st.rerun()
if k4.button("Enable", disabled=not can_act or not kill_reason, key="rollout_enable"):
    _act("enable-protocol", kill_reason, protocol=st.session_state["rollout_protocol"])
    st.rerun()
