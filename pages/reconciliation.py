"""UNKNOWN and reconciliation: open entries by age against the 15-minute line; resolve with actor and reason."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from console.frame import console_insights
from console.insights import Insights
from console.queries import UNKNOWN_SLO_S
from engine.errors import ConsoleError

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("UNKNOWN and reconciliation")
st.caption(
    f"Every UNKNOWN must be resolved or escalated within {UNKNOWN_SLO_S / 60:.0f} minutes. Each entry "
    "carries what is needed to find the operation on the server: submission key, task id, request digest."
)
st.multiselect("Kinds", ["unknown", "effects"], default=["unknown", "effects"], key="reconciliation_kinds")


@st.fragment(run_every=st.session_state["app_refresh_s"])
def live() -> None:
    kinds = st.session_state["reconciliation_kinds"] or ["unknown"]
    hist = insights.unknown_age_histogram(kinds=kinds)
    if hist.empty:
        st.success("No open entries.")
    else:
        line_at = UNKNOWN_SLO_S / 60
        fig = go.Figure(
            [
                go.Bar(x=part["age_bin_min"], y=part["entries"], name=str(kind))
                for kind, part in hist.groupby("kind")
            ],
            layout={
                "barmode": "stack",
                "height": 300,
                "xaxis_title": "age (minutes, 5-minute bins; last bin 240+)",
                "yaxis_title": "entries",
                # The 15-minute line as a plain layout shape (add_vline costs more than the chart).
                "shapes": [
                    {
                        "type": "line",
                        "yref": "paper",
                        "y0": 0,
                        "y1": 1,
                        "x0": line_at,
                        "x1": line_at,
                        "line": {"color": "red"},
                    }
                ],
                "annotations": [
                    {"yref": "paper", "y": 1, "x": line_at, "text": "15 min", "showarrow": False}
                ],
            },
        )
        st.plotly_chart(fig, key="reconciliation_histogram")
    st.subheader("Aging (oldest first)")
    aging = insights.reconciliation_aging(kinds=kinds)
    st.dataframe(aging, hide_index=True, key="reconciliation_aging")
    st.session_state["reconciliation_open_ids"] = [int(x) for x in aging["entry_id"].tolist()]


live()

st.subheader("Resolve an entry")
with st.form("reconciliation_form", clear_on_submit=False):
    ids = st.session_state.get("reconciliation_open_ids", [])
    entry = st.selectbox("Entry", ids, key="reconciliation_entry")
    task_id = st.text_input("Task id found on the server (optional)", key="reconciliation_task")
    absent = st.checkbox(
        "The server proved by submission key that it was never created", key="reconciliation_absent"
    )
    reason = st.text_area("Reason (required)", key="reconciliation_reason")
    submitted = st.form_submit_button("Resolve", type="primary", key="reconciliation_submit")
if submitted:
    actor = st.session_state.get("app_actor", "")
    if entry is None:
        st.error("Pick an entry.")
    elif not actor.strip() or not reason.strip():
        st.error("An actor (your name, in the sidebar) and a reason are required.")
    else:
        try:
            insights.resolve(int(entry), actor=actor, reason=reason, task_id=task_id or None, absent=absent)
        except ConsoleError as exc:
            st.error(str(exc))
        else:
            st.success(f"Entry {entry} resolved.")

st.subheader("Recently resolved")
st.dataframe(insights.reconciliation_resolved(), hide_index=True, key="reconciliation_resolved")
