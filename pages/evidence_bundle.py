"""Evidence bundle: a zip for a rollout decision (gate verdicts and raw inputs, audit chain, the SQL behind each chart)."""

from __future__ import annotations

import streamlit as st

from console.frame import acting_as, acting_name, console_insights
from console.insights import Insights
from console.queries import CHARTS, QUERIES

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("Evidence bundle")
st.write(
    "Everything a reviewer needs to check a rollout decision offline: the six gates with their raw "
    "inputs and thresholds, the gate history, explorer coverage, the rollout status and the hash-chained "
    "audit log with its verification, and the SQL behind each chart with the rows it returned. "
    "`manifest.json` lists the sha256 of every file."
)
st.text_input(
    "Decision this evidence is for", placeholder="e.g. promote canary 5 % -> 25 %", key="evidence_decision"
)
decision = str(st.session_state.get("evidence_decision", "")).strip()
actor = acting_name()
acting_as("this bundle")


def _bundle() -> bytes:
    # Built from the values of this run, bound here: Streamlit may call a download's producer outside
    # the page's run, where the session's widgets read as empty (the bundle said decision '' then).
    return insights.evidence_bundle(decision=decision, actor=actor)


stamp = insights.now().strftime("%Y%m%dT%H%M%SZ")
st.download_button(
    "Download evidence bundle (zip)",
    _bundle,
    file_name=f"finality-evidence-{stamp}.zip",
    mime="application/zip",
    type="primary",
    key="evidence_download",
)

st.subheader("The SQL behind each chart")
for page, names in CHARTS.items():
    with st.expander(page):
        for name in names:
            st.markdown(f"**{QUERIES[name].title}** (`{name}`)")
            st.code(insights.last_sql.get(name) or QUERIES[name].template.strip(), language="sql")
