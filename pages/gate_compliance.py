"""Gate compliance: the history of gate runs, explorer coverage, and a what-if with other thresholds."""

from __future__ import annotations

import pandas as pd  # type: ignore[import-untyped]
import plotly.graph_objects as go
import streamlit as st

from console.frame import WRAP_ROW_PX, console_insights, gate_stamp, live_section, wrapped_height
from console.insights import Insights
from console.views import MARK_LEVELS, action_marks, gate_threshold, gate_value, space_summary
from rollout.gates import HOW_TO_EXPLORE, Thresholds


def _fail_red(value: object) -> str:
    return "color: white; background-color: #c62828" if value == "FAIL" else "color: #1b5e20"


insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("Gate compliance")
# The gates of the latest recorded run when it is current (else a whole-ledger scan), started first
# so the coverage and history below are drawn meanwhile; the what-if re-evaluates those same raw
# inputs (stored per gate with the run), with no second read of the ledger.
gates_soon = insights.soon(insights.gates)


@live_section
def live() -> None:
    st.subheader("Race explorer coverage")
    coverage = insights.explorer_coverage()
    # The gate counts only runs of the shipped code (the real driver and adapters) at the running
    # revision; rows of the explorer's model and rows the demo seeding made up are shown, not counted.
    engine_rows = coverage[(coverage["rules"] == "engine") & (coverage["code"] == "shipped")]
    if engine_rows.empty:
        st.warning(
            f"No explorer run of the shipped code recorded, so the divergence gate fails: {HOW_TO_EXPLORE}."
        )
    else:
        row = engine_rows.iloc[0]
        # With equal states merged, one run of the shipped code stands for every interleaving that
        # reaches a state already explored, so interleavings can outnumber the runs that covered them.
        st.metric(
            "Explored",
            f"{int(row['interleavings']):,} distinct interleavings, {int(row['divergent'])} divergent",
        )
        st.caption(
            f"covered by {int(row['explored']):,} runs of the shipped code in {int(row['runs'])} explorations "
            f"over {int(row['scenarios'])} scenarios and {int(row['protocols'])} protocols"
            + (", every one exhaustive" if bool(row["exhaustive"]) else "")
            + f"; {space_summary(row)}"
        )
    st.dataframe(
        coverage,
        hide_index=True,
        key="gates_coverage",
        # Short headings, so that the last run's time fits at 1440 px beside the pair counts.
        column_config={
            "pairs_exact": st.column_config.NumberColumn("exact", help="pairs exhausted: space exact"),
            "pairs_at_least": st.column_config.NumberColumn(
                "≥ limit", help="pairs proven at least their limit (not exhausted)"
            ),
            "exhaustive": st.column_config.CheckboxColumn("all exact", help="every run exhausted its pair"),
            "last_finished_at": st.column_config.DatetimeColumn(
                "last finished", format="YYYY-MM-DD HH:mm:ss"
            ),
        },
    )

    st.subheader("History of gate runs")
    history = insights.gate_history()
    if history.empty:
        st.info("No gate run recorded yet (`finality gates --ledger`, or POST /api/v1/gates).")
    else:
        fig = go.Figure(
            [
                go.Scatter(
                    x=part["evaluated_at"],
                    y=part["gate"],
                    mode="markers",
                    name=label,
                    marker={"color": color},
                    customdata=part[["verdict"]].astype(str).to_numpy(),
                    hovertemplate="%{x}<br>%{y}<br>%{customdata[0]}",
                )
                for label, color, part in (
                    ("pass", "green", history[history["passed"].astype(bool)]),
                    ("fail", "red", history[~history["passed"].astype(bool)]),
                )
                if not part.empty
            ],
            layout={"height": 340, "margin": {"t": 40}},
        )
        # Rollout actions as vertical marks within the runs' time span, labelled in rows that never
        # overlap (actions close together share one label; each one's time and actor is in its hover).
        audit = insights.audit_log(limit=200)
        if audit is not None and not audit.empty and "recorded_at" in audit.columns:
            first, last = history["evaluated_at"].min(), history["evaluated_at"].max()
            shown = audit[(audit["recorded_at"] >= first) & (audit["recorded_at"] <= last)]
            marks = action_marks(
                [
                    (at.to_pydatetime(), str(action), str(actor))
                    for at, action, actor in zip(
                        shown["recorded_at"], shown["action"], shown["actor"], strict=True
                    )
                ],
                first.to_pydatetime(),
                last.to_pydatetime(),
            )
            middle = first.to_pydatetime() + (last - first).to_pytimedelta() / 2
            fig.update_layout(
                margin={"t": 30 + 18 * MARK_LEVELS},
                shapes=[
                    {
                        "type": "line",
                        "yref": "paper",
                        "y0": 0,
                        "y1": 1,
                        "x0": at,
                        "x1": at,
                        "line": {"color": "#555555", "dash": "dot", "width": 1},
                    }
                    for at in shown["recorded_at"]
                ],
                annotations=[
                    {
                        "yref": "paper",
                        "y": 1.0,
                        "yanchor": "bottom",
                        "yshift": 2 + 18 * mark.level,
                        "x": mark.at,
                        # Toward the middle: a label at either end stays inside the chart.
                        "xanchor": "left" if mark.at <= middle else "right",
                        "text": mark.label,
                        "hovertext": mark.hover,
                        "showarrow": False,
                        "font": {"size": 11, "color": "#444444"},
                    }
                    for mark in marks
                ],
            )
            if marks:
                st.caption(
                    "Dotted lines: rollout actions from the audit log (action and actor; actions close "
                    "together share a label, hover it for each one's time and actor)."
                )
        st.plotly_chart(fig, key="gates_history_chart")
        table = history.sort_values(["run_id", "gate"], ascending=[False, True]).head(60)
        shown_table = pd.DataFrame(
            {
                "run": table["run_id"],
                "evaluated at": table["evaluated_at"].dt.strftime("%Y-%m-%d %H:%M:%S"),
                "result": table["passed"].map(lambda v: "PASS" if bool(v) else "FAIL"),
                "gate": table["gate"],
                "value": [gate_value(g, v) for g, v in zip(table["gate"], table["value"], strict=True)],
                "passes when": [
                    gate_threshold(g, t) for g, t in zip(table["gate"], table["threshold"], strict=True)
                ],
                "verdict": table["verdict"],
            }
        )
        st.caption("Newest run first.")
        st.dataframe(
            shown_table.style.map(_fail_red, subset=["result"]),
            hide_index=True,
            key="gates_history",
            width="stretch",
            height=520,
            row_height=WRAP_ROW_PX,
            column_config={
                "run": st.column_config.NumberColumn(width=50),
                "evaluated at": st.column_config.TextColumn(width=140),
                "result": st.column_config.TextColumn(width=56),
                "gate": st.column_config.TextColumn(width=165),
                "value": st.column_config.TextColumn(width=90),
                "passes when": st.column_config.TextColumn(width=100),
                # Explicit: a width-less last column sizes to its longest text and ran past the page.
                "verdict": st.column_config.TextColumn(width=380),
            },
        )


live()

st.subheader("What if")
now_view = gates_soon.result()
st.caption(
    "The raw inputs of the gates shown below"
    + (f" (recorded run #{now_view.run_id})" if now_view.run_id is not None else "")
    + ", evaluated by rollout.gates with other thresholds: no second read of the ledger."
)
gate_stamp(insights, now_view, "gates_reevaluate")
d = Thresholds()
c1, c2, c3 = st.columns(3)
c1.number_input("Min interleavings", value=d.min_interleavings, step=1000, key="gates_min_interleavings")
c1.number_input("Max divergent", value=d.max_divergent, step=1, key="gates_max_divergent")
c2.number_input("Max duplicates", value=d.max_duplicates, step=1, key="gates_max_duplicates")
c2.number_input("QPS cap (0 = as configured)", value=0.0, step=10.0, key="gates_qps")
c3.number_input("Cancel p99 (s)", value=d.cancel_p99_s, step=5.0, key="gates_cancel_p99")
c3.number_input("UNKNOWN max age (min)", value=d.unknown_max_age_s / 60, step=1.0, key="gates_unknown_min")
st.slider("Min traceable share", 0.0, 1.0, d.min_traceable_share, 0.001, key="gates_traceable")
state = st.session_state
what_if = Thresholds(
    min_interleavings=int(state["gates_min_interleavings"]),
    max_divergent=int(state["gates_max_divergent"]),
    max_duplicates=int(state["gates_max_duplicates"]),
    qps=float(state["gates_qps"]) or None,
    cancel_p99_s=float(state["gates_cancel_p99"]),
    unknown_max_age_s=float(state["gates_unknown_min"]) * 60,
    min_traceable_share=float(state["gates_traceable"]),
)
if_view = now_view.with_thresholds(what_if)
compare = pd.DataFrame(
    {
        "gate": [r.gate for r in now_view.results],
        "value": [gate_value(r.gate, r.value) for r in now_view.results],
        "now": ["PASS" if r.passed else "FAIL" for r in now_view.results],
        "passes when (now)": [gate_threshold(r.gate, r.threshold) for r in now_view.results],
        "what if": ["PASS" if r.passed else "FAIL" for r in if_view.results],
        "passes when (what if)": [gate_threshold(r.gate, r.threshold) for r in if_view.results],
        "verdict (what if)": [r.verdict for r in if_view.results],
    }
)
st.dataframe(
    compare.style.map(_fail_red, subset=["now", "what if"]),
    hide_index=True,
    key="gates_what_if",
    width="stretch",
    row_height=WRAP_ROW_PX,
    height=wrapped_height(len(compare)),
    column_config={
        "gate": st.column_config.TextColumn(width=165),
        "value": st.column_config.TextColumn(width=90),
        "now": st.column_config.TextColumn(width=56),
        "passes when (now)": st.column_config.TextColumn(width=120),
        "what if": st.column_config.TextColumn(width=60),
        "passes when (what if)": st.column_config.TextColumn(width=130),
        "verdict (what if)": st.column_config.TextColumn(width=360),
    },
)
st.write(
    "**All gates would pass.**"
    if if_view.passed
    else f"**{len(if_view.failing())} gate(s) would still fail.**"
)
