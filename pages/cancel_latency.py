"""Cancel latency: p50/p95/p99 of CANCEL_REQUESTED -> terminal accepted over time, by protocol and arm."""

from __future__ import annotations

from datetime import timedelta

import plotly.graph_objects as go
import streamlit as st

from console.frame import console_insights
from console.insights import Insights
from console.queries import ARMS, CANCEL_SLO_S, PROTOCOLS

insights: Insights = console_insights()  # also makes the page work when its URL is opened first
WINDOWS = {
    "last hour": timedelta(hours=1),
    "last 24 hours": timedelta(days=1),
    "last 7 days": timedelta(days=7),
}
BUCKETS = {"1 minute": timedelta(minutes=1), "1 hour": timedelta(hours=1), "6 hours": timedelta(hours=6)}

st.title("Cancel latency")
st.caption(f"From the cancel request to the accepted terminal state. The gate: p99 < {CANCEL_SLO_S:.0f} s.")

c1, c2, c3, c4, c5 = st.columns(5)
c1.selectbox("Window", list(WINDOWS), index=2, key="cancel_latency_window")
c2.selectbox("Bucket", list(BUCKETS), index=1, key="cancel_latency_bucket")
c3.selectbox("Series by", ["protocol", "arm", "all"], key="cancel_latency_by")
c4.multiselect("Protocols", PROTOCOLS, default=list(PROTOCOLS), key="cancel_latency_protocols")
c5.multiselect("Arms", ARMS, default=list(ARMS), key="cancel_latency_arms")


def _line(*, y: float) -> dict[str, object]:
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": y, "y1": y, "line": {"color": "red"}}


def _label(text: str, *, y: float) -> dict[str, object]:
    return {
        "xref": "paper",
        "x": 1,
        "xanchor": "right",
        "y": y,
        "yanchor": "bottom",
        "text": text,
        "showarrow": False,
    }


@st.fragment(run_every=st.session_state["app_refresh_s"])
def live() -> None:
    state = st.session_state
    until = insights.now() + timedelta(seconds=1)
    since = until - WINDOWS[state["cancel_latency_window"]]
    protocols = state["cancel_latency_protocols"]
    arms = state["cancel_latency_arms"]
    # The three reads are independent: the table and the slowest list are read while the chart is drawn.
    filters = {"since": since, "until": until, "protocols": protocols, "arms": arms}
    summary_soon = insights.soon(insights.cancel_latency_summary, **filters)
    slowest_soon = insights.soon(insights.slowest_cancels, **filters)
    series = insights.cancel_latency_over_time(
        since=since,
        until=until,
        bucket=BUCKETS[state["cancel_latency_bucket"]],
        by=state["cancel_latency_by"],
        protocols=protocols,
        arms=arms,
    )
    if series.empty:
        st.info("No confirmed cancels in this window.")
    else:
        fig = go.Figure()
        for name, part in series.groupby("series"):
            for quantile, dash in (("p50_s", "dot"), ("p95_s", "dash"), ("p99_s", "solid")):
                fig.add_trace(
                    go.Scatter(
                        x=part["bucket"],
                        y=part[quantile],
                        mode="lines",
                        name=f"{name} {quantile[:-2]}",
                        line={"dash": dash},
                    )
                )
        # The gate's line as a plain layout shape (add_hline costs more than the whole chart).
        fig.update_layout(
            height=380,
            yaxis_title="seconds",
            margin={"t": 20, "b": 10},
            shapes=[_line(y=CANCEL_SLO_S)],
            annotations=[_label(f"{CANCEL_SLO_S:.0f} s gate", y=CANCEL_SLO_S)],
        )
        st.plotly_chart(fig, key="cancel_latency_chart")
    with st.expander("The SQL behind this chart"):
        st.code(insights.last_sql.get("cancel_latency_over_time", ""), language="sql")

    st.subheader("Per protocol and arm")
    summary = summary_soon.result()
    st.dataframe(summary, hide_index=True, key="cancel_latency_summary")

    st.subheader("Slowest operations")
    st.caption("Select a row to see its timeline.")
    slowest = slowest_soon.result()
    picked = st.dataframe(
        slowest,
        hide_index=True,
        on_select="rerun",
        selection_mode="single-row",
        key="cancel_latency_slowest",
    )
    rows = picked.selection.rows if picked is not None else []
    if rows:
        node = str(slowest.iloc[rows[0]]["call_node_id"])
        st.markdown(f"**Timeline of `{node}`**")
        st.dataframe(insights.timeline(node), hide_index=True, key="cancel_latency_timeline")
        if st.button("Open in Operations", key="cancel_latency_open"):
            st.session_state["operations_key"] = node
            st.switch_page("pages/operations.py")


live()
