"""Overview: rollout stage and arms, the six gates with raw values and thresholds, in-flight work, alerts."""

from __future__ import annotations

import json

import pandas as pd  # type: ignore[import-untyped]
import plotly.graph_objects as go
import streamlit as st

from console.frame import GATE_LINKS, console_insights, facts, gate_stamp, gate_table, link, live_section
from console.insights import Insights
from console.queries import (
    APPROVAL_EXPIRED_RECENT_S,
    APPROVAL_EXPIRING_S,
    CANCEL_SLO_S,
    EXPIRED_APPROVALS,
    UNKNOWN_SLO_S,
)
from engine.errors import ConsoleError

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("Overview")


@live_section
def live() -> None:
    # The gates come from the latest recorded run when it is current (else a whole-ledger scan):
    # start them (and the other independent reads) first, draw what is ready, and wait for each
    # only where it is shown.
    gates_soon = insights.soon(insights.gates)
    alerts_soon = insights.soon(insights.alerts)
    flight_soon = insights.soon(insights.in_flight)
    # Rollout and arms side by side, then the gates across the whole width: at 1440x900 a gate
    # table in two thirds of the page cut its "detail" column (the answer) to a few words.
    left, right = st.columns([2, 3])
    with left:
        st.subheader("Rollout")
        try:
            status = insights.rollout_status()
        except ConsoleError as exc:
            status = None
            st.warning(f"rollout status unavailable: {exc}")
        if status is None:
            st.caption("No rollout status (the service has no rollout API, or this console reads a file).")
        else:
            facts(
                [
                    ("Stage", status.stage.replace("_", " ")),
                    ("Canary", f"{status.percentage:g} %" if status.percentage is not None else "-"),
                    ("Epoch", status.epoch if status.epoch is not None else "-"),
                ]
            )
            if status.disabled_protocols:
                st.error("Disabled protocols: " + ", ".join(status.disabled_protocols))
    with right:
        st.subheader("Arms")
        arms = insights.arms()
        st.dataframe(arms, hide_index=True, key="overview_arms", width="stretch")

    st.subheader("Gates")
    gates = gates_soon.result()
    passed = sum(r.passed for r in gates.results)
    st.markdown(f"**{passed} of {len(gates.results)} pass**")
    gate_stamp(insights, gates, "overview_reevaluate")
    gate_table(gates, "overview_gates")  # a failing gate's verdict is also in full under Alerts
    with st.expander("Raw inputs of each gate"):
        st.dataframe(
            pd.DataFrame(
                [
                    {"gate": r.gate, "raw inputs": json.dumps(r.inputs, default=str, sort_keys=True)}
                    for r in gates.results
                ]
            ),
            hide_index=True,
            key="overview_gate_inputs",
            width="stretch",
        )

    st.subheader("Alerts")
    alerts = alerts_soon.result()
    found = False
    if alerts.get("unknown_over_slo"):
        found = True
        st.error(
            f"{alerts['unknown_over_slo']:.0f} UNKNOWN operation(s) open longer than {UNKNOWN_SLO_S / 60:.0f} min "
            f"(oldest {alerts['unknown_oldest_s'] / 60:.1f} min)"
        )
        link("pages/reconciliation.py", "Open entries, oldest first →")
    if alerts.get("cancels_over_slo"):
        found = True
        st.error(f"{alerts['cancels_over_slo']:.0f} cancel(s) unconfirmed after {CANCEL_SLO_S:.0f} s")
        link("pages/operations.py", "Operations waiting on a cancel →", {"state": "CANCEL_REQUESTED"})
    if alerts.get("approvals_expiring"):
        found = True
        st.warning(
            f"{alerts['approvals_expiring']:.0f} approval(s) expire within {APPROVAL_EXPIRING_S / 60:.0f} min "
            "unless someone answers"
        )
        link("pages/approvals.py", "Answer them before they expire →")
    if alerts.get("approvals_expired_recently"):
        found = True
        st.warning(
            f"{alerts['approvals_expired_recently']:.0f} approval(s) expired unanswered in the last "
            f"{APPROVAL_EXPIRED_RECENT_S / 3600:.0f} h (their operations went on without an answer)"
        )
        link("pages/sql.py", "See them in SQL →", {"example": EXPIRED_APPROVALS})
    if alerts.get("approvals_pending"):
        found = True
        st.info(f"{alerts['approvals_pending']:.0f} approval(s) waiting for an answer")
        link("pages/approvals.py", "Answer them →")
    if alerts.get("effects_open"):
        found = True
        st.info(f"{alerts['effects_open']:.0f} leftover-effect check(s) open")
        link("pages/reconciliation.py", "Check them →")
    for gate in gates.failing():
        found = True
        st.warning(f"Gate {gate.gate} fails: {gate.verdict}")
        if gate.gate in GATE_LINKS:
            page, params = GATE_LINKS[gate.gate]
            link(page, f"What is behind {gate.gate} →", params)
    if not found:
        st.success("No alerts")

    st.subheader("In flight")
    flight = flight_soon.result()
    if flight.empty:
        st.caption("Nothing in flight.")
    else:
        # graph_objects, not plotly.express: the same bars for a tenth of the building time.
        fig = go.Figure(
            [
                go.Bar(x=part["state"], y=part["operations"], name=str(name))
                for name, part in flight.groupby("protocol")
            ],
            layout={
                "barmode": "stack",
                "height": 320,
                "margin": {"t": 10, "b": 10},
                "legend_title_text": "protocol",
            },
        )
        st.plotly_chart(fig, key="overview_in_flight")

    st.subheader("Downstream")
    lag = insights.outbox_lag()
    if lag is None or lag.empty:
        st.caption("No downstream consumer has acknowledged an outbox entry yet.")
    else:
        st.dataframe(
            lag[["consumer", "acknowledged", "behind", "oldest_waiting_s", "last_ack_at"]],
            hide_index=True,
            key="overview_outbox_lag",
            column_config={
                "behind": st.column_config.NumberColumn("behind (entries)"),
                "oldest_waiting_s": st.column_config.NumberColumn("oldest waiting (s)", format="%.0f"),
            },
        )


live()
