"""Approvals: the rounds a person can answer now, newest first, each with Approve / Reject (or a form
built from the requested schema). An answer is bound to its operation and input round.

Presentation only: the list comes from ``Insights.approvals_pending`` (answerable rounds only) and the
answer goes through ``Insights.answer``; the service refuses a round that is no longer open.
"""

from __future__ import annotations

import json
from datetime import datetime

import pandas as pd  # type: ignore[import-untyped]
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
)
from console.insights import Insights
from console.views import AnswerField, answer_fields, build_answer, decision_field
from engine.errors import ConsoleError

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("Approvals")
st.caption(
    "Rounds an operation is waiting on now, newest first. Polling pauses while a server asks for input; "
    "an answer is sent for one operation and one input round, and a round answered elsewhere (or whose "
    "operation moved on) leaves this list at the next refresh."
)


def countdown(deadline: object, now: datetime) -> str:
    """``in 4 min 12 s`` (or ``no deadline``): what is left before the round expires."""
    if deadline is None or pd.isna(deadline):
        return "no deadline"
    left = (pd.Timestamp(deadline).to_pydatetime() - now).total_seconds()
    if left <= 0:
        return "expired"
    minutes, seconds = divmod(int(left), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"in {hours} h {minutes} min"
    return f"in {minutes} min {seconds} s" if minutes else f"in {seconds} s"


def _send(row: dict[str, object], answer: dict[str, object], label: str) -> None:
    try:
        insights.answer(
            str(row["operation_id"]),
            int(str(row["input_round"])),
            actor=acting_name(),
            answer=answer,
            token=acting_token(),
        )
    except ConsoleError as exc:
        st.session_state["approvals_message"] = ("error", f"{label} refused: {exc}")
    else:
        st.session_state["approvals_message"] = (
            "success",
            f"{label}: {row['call_node_id']} round {row['input_round']} answered as {acting_name()}.",
        )


def _form_value(key: str, f: AnswerField) -> object:
    if f.kind == "boolean":
        return st.checkbox(f.title + (" *" if f.required else ""), key=key)
    if f.kind == "enum":
        return st.selectbox(f.title + (" *" if f.required else ""), ["", *f.options], key=key)
    return st.text_input(f.title + (" *" if f.required else ""), key=key)


def round_card(row: dict[str, object], now: datetime) -> None:
    """One answerable round: the question, where it comes from, its deadline, and the answers."""
    key = f"{row['operation_id']}-{row['input_round']}"
    with st.container(border=True, key=f"approval-{key}"):
        st.markdown(f"**{row['message']}**")
        left = countdown(row["deadline"], now)
        deadline = row["deadline"]
        when = "" if deadline is None or pd.isna(deadline) else f" ({pd.Timestamp(deadline):%H:%M:%S} UTC)"
        st.markdown(
            f"call node `{row['call_node_id']}` · tool `{row['tool_name']}` · {row['protocol']} · "
            f"round {row['input_round']} · deadline **{left}**{when}"
        )
        fields = answer_fields(row["requested_schema"])
        decision = decision_field(fields)
        others = [f for f in fields if f is not decision]
        values = {f.name: _form_value(f"approvals_{key}_{f.name}", f) for f in others}
        with st.expander("Requested schema"):
            st.code(str(row["requested_schema"]), language="json")
        if not may(Permission.ANSWER):
            not_allowed(Permission.ANSWER, "Answering")
            return
        if not acting_as("this answer"):
            return
        if decision is not None:
            approve, reject, _ = st.columns([1, 1, 8])
            for column, verdict, label, kind in (
                (approve, True, "Approve", "primary"),
                (reject, False, "Reject", "secondary"),
            ):
                if column.button(label, key=f"approvals_{key}_{label}", type=kind):  # type: ignore[arg-type]
                    try:
                        answer = build_answer(others, values)
                    except ConsoleError as exc:
                        st.session_state["approvals_message"] = ("error", str(exc))
                    else:
                        _send(row, {decision.name: verdict, **answer}, label)
                    st.rerun()
        elif fields:
            if st.button("Send answer", key=f"approvals_{key}_send", type="primary"):
                try:
                    _send(row, build_answer(fields, values), "Answer")
                except ConsoleError as exc:
                    st.session_state["approvals_message"] = ("error", str(exc))
                st.rerun()
        else:
            text = st.text_area("Answer (a JSON object)", value="{}", key=f"approvals_{key}_json")
            if st.button("Send answer", key=f"approvals_{key}_send", type="primary"):
                try:
                    answer = json.loads(text)
                except json.JSONDecodeError as exc:
                    st.session_state["approvals_message"] = ("error", f"The answer is not JSON: {exc}")
                else:
                    _send(row, answer, "Answer")
                st.rerun()


@live_section
def live() -> None:
    message = st.session_state.pop("approvals_message", None)
    if message:
        (st.success if message[0] == "success" else st.error)(message[1])
    pending = insights.approvals_pending()
    now = insights.now()
    st.metric("Waiting for an answer", len(pending))
    if pending.empty:
        st.info("No operation is waiting for an answer.")
        return
    rows = pending.to_dict("records")
    shown = rows[:20]
    for row in shown:
        round_card(row, now)
    if len(rows) > len(shown):
        st.caption(f"{len(rows) - len(shown)} older round(s) not shown; answer the newest first.")


live()

st.subheader("Recently answered")
answered = insights.approvals_answered()
st.dataframe(answered, hide_index=True, key="approvals_answered", width="stretch")
