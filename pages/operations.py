"""Operations: filter by state, protocol, tool, arm and time; one call node's timeline of transitions, polls and receipt."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import plotly.graph_objects as go
import streamlit as st

from console.frame import console_insights, facts, live_section
from console.insights import Insights
from console.queries import ARMS, STATES

insights: Insights = console_insights()  # also makes the page work when its URL is opened first
RANGES = {
    "last 15 minutes": timedelta(minutes=15),
    "last hour": timedelta(hours=1),
    "last 24 hours": timedelta(days=1),
    "last 7 days": timedelta(days=7),
    "everything": None,
    "custom": None,
}

st.title("Operations")
# A link from a gate or an alert carries its filter (``?state=UNKNOWN``, ``?key=<call node>``,
# ``?duplicated=1``): applied once per link, then the widgets are the person's again.
_linked = (
    tuple(st.query_params.get_all("state")),
    st.query_params.get("key", ""),
    st.query_params.get("duplicated", "") == "1",
)
if any(_linked) and st.session_state.get("operations_link") != _linked:
    st.session_state["operations_link"] = _linked
    st.session_state["operations_states"] = [s for s in _linked[0] if s in STATES]
    st.session_state["operations_range"] = "everything"
    st.session_state["operations_duplicated"] = _linked[2]
    if _linked[1]:
        st.session_state["operations_key"] = _linked[1]
options = insights.filter_options()
c1, c2, c3, c4, c5 = st.columns(5)
c1.multiselect("State", STATES, key="operations_states")
c2.multiselect("Protocol", options["protocol"], key="operations_protocols")
c3.multiselect("Tool", options["tool"], key="operations_tools")
c4.multiselect("Arm", ARMS, key="operations_arms")
c5.selectbox("Created", list(RANGES), index=2, key="operations_range")
st.checkbox(
    "Only duplicated operations (bound to a second server task: what the duplicate_operations gate counts)",
    key="operations_duplicated",
)
if st.session_state["operations_range"] == "custom":
    d1, d2 = st.columns(2)
    d1.date_input("From (UTC)", key="operations_from")
    d2.date_input("To (UTC, inclusive)", key="operations_to")


def _window() -> tuple[datetime | None, datetime | None]:
    state = st.session_state
    choice = state["operations_range"]
    if choice == "custom":
        start, end = state.get("operations_from"), state.get("operations_to")
        since = datetime.combine(start, time(), UTC) if start else None
        until = datetime.combine(end, time(), UTC) + timedelta(days=1) if end else None
        return since, until
    span = RANGES[choice]
    return (insights.now() - span, None) if span is not None else (None, None)


@live_section
def live() -> None:
    state = st.session_state
    since, until = _window()
    filters = {
        "states": state["operations_states"],
        "protocols": state["operations_protocols"],
        "tools": state["operations_tools"],
        "arms": state["operations_arms"],
        "since": since,
        "until": until,
        "duplicated": bool(state.get("operations_duplicated")),
    }
    listing_soon = insights.soon(insights.operations, **filters, limit=200)  # read while the counts are drawn
    counts = insights.operations_by_state(**filters)
    total = int(counts["operations"].sum()) if not counts.empty else 0
    st.caption(f"{total:,} operations match; the newest 200 are listed. Select one to see its timeline.")
    if not counts.empty:
        fig = go.Figure(
            go.Bar(x=counts["state"], y=counts["operations"]),
            layout={"height": 220, "margin": {"t": 10, "b": 10}, "yaxis_title": "operations"},
        )
        st.plotly_chart(fig, key="operations_counts")
    listing = listing_soon.result()
    picked = st.dataframe(
        listing, hide_index=True, on_select="rerun", selection_mode="single-row", key="operations_table"
    )
    rows = picked.selection.rows if picked is not None else []
    if rows:
        state["operations_selected"] = str(listing.iloc[rows[0]]["call_node_id"])


live()

st.subheader("One call node")
selected = st.session_state.get("operations_selected")
if selected and selected != st.session_state.get("operations_applied"):
    st.session_state["operations_key"] = selected
    st.session_state["operations_applied"] = selected
key = st.text_input("Call node or operation id", key="operations_key")
if key.strip():
    op = insights.operation(key)
    if op is None:
        st.warning(f"No operation for {key!r}.")
    else:
        facts(
            [
                ("State", op["state"]),
                ("Protocol", op["protocol"]),
                ("Tool", op.get("tool_name")),
                ("Arm", op["arm"]),
                ("Epoch", op["epoch"]),
                ("Cancel generation", op["cancel_generation"]),
            ]
        )
        timeline = insights.timeline(key)
        if not timeline.empty:
            fig = go.Figure(
                [
                    go.Scatter(
                        x=part["occurred_at"],
                        y=part["kind"],
                        mode="markers",
                        name=str(what),
                        customdata=part[["detail", "note"]].astype(str).to_numpy(),
                        hovertemplate="%{x}<br>%{customdata[0]}<br>%{customdata[1]}",
                    )
                    for what, part in timeline.groupby("what", sort=False)
                ],
                layout={"height": 260, "margin": {"t": 10, "b": 10}},
            )
            st.plotly_chart(fig, key="operations_timeline_chart")
        st.dataframe(timeline, hide_index=True, key="operations_timeline")
        with st.expander("The toolOperation.v1 record"):
            st.json({k: str(v) if v is not None else None for k, v in op.items()})
