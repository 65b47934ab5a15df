"""Finality console: sets the page config, builds one ``Insights`` per configuration, and runs the chosen page.

Presentation only. Every page reads through ``engine.insights`` (the running service over HTTP, or
a ledger file read-only when no service runs: ``FINALITY_SERVICE_URL`` / ``FINALITY_LEDGER``).

    streamlit run app.py
"""

from __future__ import annotations

import logging
import os

import streamlit as st

from engine.insights import ConsoleError, Insights

logger = logging.getLogger("finality.console")

st.set_page_config(page_title="Finality console", page_icon=":material/verified:", layout="wide")


@st.cache_resource(show_spinner=False)
def _insights(service_url: str, ledger: str) -> Insights:
    return Insights.from_env({"FINALITY_SERVICE_URL": service_url, "FINALITY_LEDGER": ledger, **_tuning()})


def _tuning() -> dict[str, str]:
    keys = ("FINALITY_CONSOLE_CACHE_S", "FINALITY_CONSOLE_GATE_CACHE_S")
    return {k: os.environ[k] for k in keys if k in os.environ}


PAGES = [
    st.Page("pages/overview.py", title="Overview", icon=":material/dashboard:", default=True),
    st.Page("pages/cancel_latency.py", title="Cancel latency", icon=":material/timer:"),
    st.Page("pages/reconciliation.py", title="UNKNOWN and reconciliation", icon=":material/help:"),
    st.Page("pages/gates.py", title="Gate compliance", icon=":material/rule:"),
    st.Page("pages/operations.py", title="Operations", icon=":material/list:"),
    st.Page("pages/approvals.py", title="Approvals", icon=":material/approval:"),
    st.Page("pages/rollout.py", title="Rollout control", icon=":material/rocket_launch:"),
    st.Page("pages/sql.py", title="SQL", icon=":material/database:"),
    st.Page("pages/evidence.py", title="Evidence bundle", icon=":material/folder_zip:"),
]

navigation = st.navigation(PAGES)

try:
    insights = _insights(
        os.environ.get("FINALITY_SERVICE_URL", "").strip(), os.environ.get("FINALITY_LEDGER", "").strip()
    )
except ConsoleError as exc:
    st.title("Finality console")
    st.error(str(exc))
    st.stop()

st.session_state["app_insights"] = insights
st.session_state["app_refresh_s"] = float(os.environ.get("FINALITY_CONSOLE_REFRESH_S", "10"))
# The actor lives under a plain key (widget keys are dropped on pages where the widget is not drawn).
st.session_state.setdefault("app_actor", os.environ.get("FINALITY_ACTOR", ""))
st.session_state.setdefault("app_actor_input", st.session_state["app_actor"])


def _set_actor() -> None:
    st.session_state["app_actor"] = st.session_state["app_actor_input"].strip()


with st.sidebar:
    info = insights.info
    if info.kind == "service":
        st.caption(f"Live: service at {info.location}")
    else:
        st.caption(f"Read-only: ledger file {info.location}")
        if info.note:
            st.warning(info.note)
    st.text_input(
        "Your name (recorded as the actor of every action)", key="app_actor_input", on_change=_set_actor
    )

try:
    navigation.run()
except ConsoleError as exc:
    st.error(str(exc))
except Exception:
    logger.exception("console page %s failed", navigation.title)
    st.error("This page failed; the error is in the console's log.")
