"""Approvals: the input_required queue. An answer is bound to its operation and input round."""

from __future__ import annotations

import json

import streamlit as st

from console.frame import console_insights
from console.insights import Insights
from engine.errors import ConsoleError

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("Approvals")
st.caption(
    "Polling pauses while a server asks for input. An answer is sent for one operation and one input "
    "round; an answer to a round that is no longer open is refused."
)


@st.fragment(run_every=st.session_state["app_refresh_s"])
def live() -> None:
    pending = insights.approvals_pending()
    st.session_state["approvals_rounds"] = [
        f"{r.operation_id} · round {int(r.input_round)}" for r in pending.itertuples(index=False)
    ]
    st.session_state["approvals_pending_rows"] = {
        f"{r.operation_id} · round {int(r.input_round)}": {
            "operation_id": r.operation_id,
            "input_round": int(r.input_round),
            "current_round": int(r.current_round),
            "message": r.message,
            "requested_schema": r.requested_schema,
            "deadline": str(r.deadline),
            "call_node_id": r.call_node_id,
        }
        for r in pending.itertuples(index=False)
    }
    st.metric("Waiting", len(pending))
    st.dataframe(pending.drop(columns=["requested_schema"]), hide_index=True, key="approvals_table")


live()

st.subheader("Answer")
choices = st.session_state.get("approvals_rounds", [])
choice = st.selectbox("Operation and round", choices, key="approvals_choice")
if choice:
    row = st.session_state["approvals_pending_rows"][choice]
    st.markdown(f"**{row['message']}**  \ncall node `{row['call_node_id']}`, deadline {row['deadline']}")
    if row["current_round"] != row["input_round"]:
        st.warning(
            f"The operation is at round {row['current_round']}; this round ({row['input_round']}) is stale."
        )
    with st.expander("Requested schema"):
        st.code(row["requested_schema"], language="json")
    st.text_area("Answer (a JSON object)", value='{"approve": true}', key="approvals_answer")
    if st.button("Send answer", type="primary", key="approvals_send"):
        actor = st.session_state.get("app_actor", "")
        try:
            answer = json.loads(st.session_state["approvals_answer"])
        except json.JSONDecodeError as exc:
            st.error(f"The answer is not JSON: {exc}")
        else:
            if not actor.strip():
                st.error("Your name (sidebar) is required: it is recorded as the approver.")
            else:
                try:
                    insights.answer(row["operation_id"], row["input_round"], actor=actor, answer=answer)
                except ConsoleError as exc:
                    st.error(str(exc))
                else:
                    st.success(f"Answered {choice}.")

st.subheader("Recently answered")
st.dataframe(insights.approvals_answered(), hide_index=True, key="approvals_answered")
