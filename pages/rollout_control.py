"""Rollout control: stage, promote (only when the gates pass), rollback behind a typed-reason dialog, protocol kill switch, audit log."""

from __future__ import annotations

import streamlit as st

from console.frame import console_insights, gate_stamp
from console.insights import Insights
from console.queries import PROTOCOLS
from engine.errors import ConsoleError

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("Rollout control")


def _actor() -> str:
    return str(st.session_state.get("app_actor", "")).strip() or "console"


def _act(action: str, reason: str, *, percentage: float | None = None, protocol: str | None = None) -> None:
    try:
        result = insights.rollout_action(
            action, actor=_actor(), reason=reason, percentage=percentage, protocol=protocol
        )
    except ConsoleError as exc:
        st.session_state["rollout_message"] = ("error", f"{action} refused: {exc}")
    else:
        st.session_state["rollout_message"] = ("success", f"{action} recorded")
        st.session_state["rollout_last_result"] = result


@st.dialog("Roll back")
def rollback_dialog() -> None:
    st.write(
        "Rollback stops creating new operations on the new path, raises the execution epoch, and hands "
        "in-flight operations to the old executor in the same ledger. It is recorded in the audit chain."
    )
    reason = st.text_input("Reason (required, typed)", key="rollout_rollback_reason")
    confirm = st.button(
        "Roll back now", type="primary", disabled=not reason.strip(), key="rollout_rollback_confirm"
    )
    if confirm:
        _act("rollback", reason)
        st.rerun()


message = st.session_state.pop("rollout_message", None)
if message is not None:
    kind, text = message
    (st.success if kind == "success" else st.error)(text)


@st.fragment(run_every=st.session_state["app_refresh_s"])
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
    if status is None:
        st.info(
            "No rollout status: no rollout action is recorded yet, the service has no rollout API yet, "
            "or this console reads a ledger file."
        )
    else:
        c1, c2, c3, c4 = st.columns(4)
        c1.metric("Stage", status.stage)
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
    gate_stamp(insights, gates, "rollout_reevaluate")

    st.subheader("Audit log")
    log = audit_soon.result()
    if log is None:
        st.caption("This ledger has no rollout audit log yet.")
    else:
        st.dataframe(log, hide_index=True, key="rollout_audit")


live()

can_act = insights.info.writable and st.session_state.get("rollout_available", False)
if not insights.info.writable:
    what = "PostgreSQL ledger" if insights.info.kind == "postgres" else "ledger file"
    st.warning(f"Read-only console ({what}): actions need the running service.")

st.subheader("Actions")
a1, a2, a3 = st.columns(3)
with a1:
    st.markdown("**Promote**")
    failing = st.session_state.get("rollout_failing", [])
    st.text_input("Reason", key="rollout_promote_reason")
    if failing:
        st.error("Promotion is disabled while gates fail:\n\n" + "\n".join(f"- {f}" for f in failing))
    if st.button(
        "Promote",
        disabled=bool(failing) or not can_act or not st.session_state["rollout_promote_reason"].strip(),
        key="rollout_promote",
    ):
        _act("promote", st.session_state["rollout_promote_reason"])
        st.rerun()
with a2:
    st.markdown("**Shadow / canary**")
    st.number_input(
        "Canary percentage", min_value=0.0, max_value=100.0, value=5.0, step=1.0, key="rollout_pct"
    )
    st.text_input("Reason", key="rollout_stage_reason")
    reason = st.session_state["rollout_stage_reason"].strip()
    b1, b2 = st.columns(2)
    if b1.button("Shadow", disabled=not can_act or not reason, key="rollout_shadow"):
        _act("shadow", reason)
        st.rerun()
    if b2.button("Set canary", disabled=not can_act or not reason, key="rollout_canary"):
        _act("canary", reason, percentage=float(st.session_state["rollout_pct"]))
        st.rerun()
with a3:
    st.markdown("**Rollback**")
    st.caption("Stops new operations on the new path and raises the execution epoch.")
    if st.button("Roll back…", type="primary", disabled=not can_act, key="rollout_rollback"):
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
