"""Cancel latency: p50/p95/p99 of CANCEL_REQUESTED -> terminal accepted over time, by protocol and arm."""

from __future__ import annotations

import math
from datetime import timedelta

import plotly.graph_objects as go
import streamlit as st

from console.frame import console_insights, live_section
from console.insights import Insights
from console.queries import ARMS, CANCEL_SLO_S, PROTOCOLS
from console.views import fitting_bucket, fitting_window, seconds_ticks

insights: Insights = console_insights()  # also makes the page work when its URL is opened first
WINDOWS = {
    "last hour": timedelta(hours=1),
    "last 24 hours": timedelta(days=1),
    "last 7 days": timedelta(days=7),
}
BUCKETS = {
    "1 minute": timedelta(minutes=1),
    "10 minutes": timedelta(minutes=10),
    "1 hour": timedelta(hours=1),
    "6 hours": timedelta(hours=6),
}

st.title("Cancel latency")
st.caption(f"From the cancel request to the accepted terminal state. The gate: p99 < {CANCEL_SLO_S:.0f} s.")

c1, c2, c3, c4, c5 = st.columns(5)
# Defaults that draw lines: the shortest window that holds the data (a demo minutes old: the last
# hour, in minutes; a week-old ledger: 7 days, in 6 hours). A fixed week in hour buckets put all of a
# new demo in one bucket, a single point that draws no line.
FIT = "fits the data"
c1.selectbox("Window", [FIT, *WINDOWS], index=0, key="cancel_latency_window")
c2.selectbox("Bucket", [FIT, *BUCKETS], index=0, key="cancel_latency_bucket")
c3.selectbox("Series by", ["protocol", "arm", "all"], key="cancel_latency_by")
# Nothing chosen means all (a full list of chips would not fit the column and reads as cut off).
c4.multiselect("Protocols", PROTOCOLS, placeholder="all protocols", key="cancel_latency_protocols")
c5.multiselect("Arms", ARMS, placeholder="all arms", key="cancel_latency_arms")


# The gate line has its own style (dark, dash-dot), unlike any series colour of the plotly palette.
GATE_LINE = {"color": "#222222", "width": 2, "dash": "dashdot"}


def _line(*, y: float) -> dict[str, object]:
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": y, "y1": y, "line": GATE_LINE}


def y_range(values: list[float], gate: float) -> list[float]:
    """A log axis (log10 bounds) from the smallest latency to above the gate: the data keep their
    shape (seconds next to a 60 s line would lie flat on a linear axis) and the gate line shows."""
    positive = [v for v in values if v > 0]
    low = min(positive) if positive else gate / 100
    high = max([*positive, gate])
    return [math.log10(low / 1.5), math.log10(high * 1.5)]


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


@live_section
def live() -> None:
    state = st.session_state
    until = insights.now() + timedelta(seconds=1)
    window_name = state["cancel_latency_window"]
    if window_name == FIT:
        first = insights.cancel_span(since=until - WINDOWS["last 7 days"], until=until)
        window_name = fitting_window(first, until, WINDOWS)
    window = WINDOWS[window_name]
    bucket_name = state["cancel_latency_bucket"]
    if bucket_name == FIT:
        bucket_name = fitting_bucket(window, BUCKETS)
    since = until - window
    st.caption(f"Showing the {window_name} in {bucket_name} buckets.")
    protocols = state["cancel_latency_protocols"] or list(PROTOCOLS)
    arms = state["cancel_latency_arms"] or list(ARMS)
    # The three reads are independent: the table and the slowest list are read while the chart is drawn.
    filters = {"since": since, "until": until, "protocols": protocols, "arms": arms}
    summary_soon = insights.soon(insights.cancel_latency_summary, **filters)
    slowest_soon = insights.soon(insights.slowest_cancels, **filters)
    series = insights.cancel_latency_over_time(
        since=since,
        until=until,
        bucket=BUCKETS[bucket_name],
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
                        mode="lines+markers",
                        name=f"{name} {quantile[:-2]}",
                        line={"dash": dash},
                    )
                )
        # The gate's line as a plain layout shape (add_hline costs more than the whole chart).
        values = [float(v) for q in ("p50_s", "p95_s", "p99_s") for v in series[q].dropna()]
        y_span = y_range(values, CANCEL_SLO_S)
        tickvals, ticktext = seconds_ticks(y_span, marks=(CANCEL_SLO_S,))
        fig.update_layout(
            height=380,
            yaxis={
                "title": "latency (log scale)",
                "type": "log",
                "range": y_span,
                "tickvals": tickvals,
                "ticktext": ticktext,
            },
            xaxis={"range": [since, until]},
            margin={"t": 20, "b": 10},
            shapes=[_line(y=CANCEL_SLO_S)],
            # An annotation on a log axis is placed by log10 of its value (a shape by the value itself).
            annotations=[_label(f"{CANCEL_SLO_S:.0f} s gate", y=math.log10(CANCEL_SLO_S))],
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
