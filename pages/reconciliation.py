"""UNKNOWN and reconciliation: open entries by age against the 15-minute line; resolve with actor and reason."""

from __future__ import annotations

import pandas as pd  # type: ignore[import-untyped]
import plotly.graph_objects as go
import streamlit as st

from console.frame import (
    Permission,
    acting_as,
    acting_name,
    acting_token,
    console_insights,
    live_section,
    may,
    not_allowed,
    wrapped_row_px,
)
from console.insights import Insights
from console.queries import UNKNOWN_SLO_S
from console.views import candidates_summary, next_step
from engine.errors import ConsoleError

BIN_MIN = 5
CAP_MIN = 240

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("UNKNOWN and reconciliation")
st.caption(
    f"Every UNKNOWN must be resolved or escalated within {UNKNOWN_SLO_S / 60:.0f} minutes. Each entry "
    "carries what is needed to find the operation on the server: submission key, task id, request digest."
)
st.multiselect("Kinds", ["unknown", "effects"], default=["unknown", "effects"], key="reconciliation_kinds")


@live_section
def live() -> None:
    kinds = st.session_state["reconciliation_kinds"] or ["unknown"]
    hist = insights.unknown_age_histogram(kinds=kinds, bin_min=BIN_MIN, cap_min=CAP_MIN)
    if hist.empty:
        st.success("No open entries.")
    else:
        line_at = UNKNOWN_SLO_S / 60
        fig = go.Figure(
            [
                # A bar spans its bin (a bar is drawn centred on x): [start, start + bin).
                go.Bar(
                    x=part["age_bin_min"].astype(float) + BIN_MIN / 2,
                    y=part["entries"],
                    width=BIN_MIN * 0.95,
                    name=str(kind),
                )
                for kind, part in hist.groupby("kind")
            ],
            layout={
                "barmode": "stack",
                "height": 300,
                # Plotly's default top margin (100 px) was an empty band under the Kinds filter.
                "margin": {"t": 24, "b": 40},
                "xaxis": {
                    "title": f"age (minutes, {BIN_MIN}-minute bins; last bin {CAP_MIN}+)",
                    "range": [
                        0,
                        max(float(hist["age_bin_min"].max()) + BIN_MIN, UNKNOWN_SLO_S / 60 + BIN_MIN),
                    ],
                    "dtick": BIN_MIN if float(hist["age_bin_min"].max()) <= 60 else 30,
                },
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
    st.subheader("Open entries, oldest first")
    aging = insights.reconciliation_aging(kinds=kinds)
    st.session_state["reconciliation_open_ids"] = [int(x) for x in aging["entry_id"].tolist()]
    # What the resolve section shows of the picked entry in full (a table cell cuts the next step).
    st.session_state["reconciliation_open"] = {
        int(r["entry_id"]): {
            "age": f"{float(r['age_s']) / 60:.1f} min",
            "kind": str(r["kind"]),
            "reason": str(r["reason"]),
            "call_node": str(r["call_node_id"]),
            "next": next_step(str(r["kind"]), r["task_id"], r["candidates"]),
            "candidates": candidates_summary(r["candidates"]),
        }
        for r in aging.to_dict("records")
    }
    if aging.empty:
        return
    table = pd.DataFrame(
        {
            "age (min)": (aging["age_s"].astype(float) / 60).round(1),
            "over 15 min": aging["over_15_min"].map(lambda v: "OVER" if v else ""),
            "kind": aging["kind"],
            "reason": aging["reason"],
            "next step": [
                next_step(str(k), t, c)
                for k, t, c in zip(aging["kind"], aging["task_id"], aging["candidates"], strict=True)
            ],
            "candidates": aging["candidates"].map(candidates_summary),
            "entry": aging["entry_id"],
            "call node": aging["call_node_id"],
            "tool": aging["tool_name"],
            "protocol": aging["protocol"],
            "state": aging["state"],
            "task id": aging["task_id"],
            "submission key": aging["idempotency_key"],
        }
    )
    # The reason and the next step are what a person reads first: rows as tall as the longest of them
    # needs, so neither is cut (three-line rows cut a long reason or a next step naming a task id).
    widths = {"reason": 330, "next step": 400}
    st.dataframe(
        table,
        hide_index=True,
        key="reconciliation_aging",
        width="stretch",
        row_height=wrapped_row_px({widths[c]: table[c].astype(str).tolist() for c in widths}),
        column_config={
            "age (min)": st.column_config.NumberColumn(width=70),
            "over 15 min": st.column_config.TextColumn(width=80),
            "kind": st.column_config.TextColumn(width=90),  # "unknown" unbroken
            "reason": st.column_config.TextColumn(width=widths["reason"]),
            "next step": st.column_config.TextColumn(width=widths["next step"]),
            "candidates": st.column_config.TextColumn(width=220),
        },
    )


live()

st.subheader("Resolve an entry")
_open: dict[int, dict[str, str]] = st.session_state.get("reconciliation_open", {})


def _entry_label(entry_id: int) -> str:
    found = _open.get(entry_id)
    if found is None:
        return f"entry {entry_id}"
    return f"entry {entry_id} · {found['age']} · {found['kind']} · {found['call_node']}"


def resolve_form() -> None:
    """Pick an entry, see why it is open, resolve it (offered only to a role that may resolve)."""
    acting_as("this resolution")
    # Outside the form: picking an entry shows its reason and next step at once (a form defers that).
    entry = st.selectbox(
        "Entry (oldest first)",
        st.session_state.get("reconciliation_open_ids", []),
        key="reconciliation_entry",
        format_func=_entry_label,
    )
    if entry is not None and int(entry) in _open:
        picked = _open[int(entry)]
        st.markdown(
            f"**Why it is open:** {picked['reason']}  \n**Next step:** {picked['next']}  \n"
            f"**Candidates:** {picked['candidates']}"
        )
    with st.form("reconciliation_form", clear_on_submit=False):
        task_id = st.text_input("Task id found on the server (optional)", key="reconciliation_task")
        absent = st.checkbox(
            "The server proved by submission key that it was never created", key="reconciliation_absent"
        )
        reason = st.text_area("Reason (required)", key="reconciliation_reason")
        submitted = st.form_submit_button("Resolve", type="primary", key="reconciliation_submit")
    if submitted:
        actor = acting_name()
        if entry is None:
            st.error("Pick an entry.")
        elif not actor.strip() or not reason.strip():
            st.error("An actor (your name, in the sidebar) and a reason are required.")
        else:
            try:
                insights.resolve(
                    int(entry),
                    actor=actor,
                    reason=reason,
                    task_id=task_id or None,
                    absent=absent,
                    token=acting_token(),
                )
            except ConsoleError as exc:
                st.error(str(exc))
            else:
                st.success(f"Entry {entry} resolved.")


if may(Permission.OPERATE):
    resolve_form()
else:
    not_allowed(Permission.OPERATE, "Resolving an entry")

st.subheader("Recently resolved")
st.dataframe(insights.reconciliation_resolved(), hide_index=True, key="reconciliation_resolved")
