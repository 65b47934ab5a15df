"""SQL: the read-only query page (a snapshot of a DuckDB ledger, or analyst SQL on PostgreSQL), with examples and CSV/Parquet download."""

from __future__ import annotations

import streamlit as st

from console.export import frame_to_csv, frame_to_parquet
from console.frame import console_insights
from console.insights import Insights
from console.queries import SQL_EXAMPLES
from engine.errors import ConsoleError

insights: Insights = console_insights()  # also makes the page work when its URL is opened first

st.title("SQL")
if insights.dialect == "postgres":
    st.caption(
        "One read-only SELECT at a time, in PostgreSQL's dialect, in a READ ONLY transaction under the "
        "ledger's read-only analyst role. Writes, COPY, settings and server-file functions are refused. "
        "Tables and columns: docs/ledger.md."
    )
else:
    st.caption(
        "One read-only SELECT at a time, on a snapshot of the ledger. Writes, COPY, ATTACH, INSTALL and "
        "file-reading functions are refused. Tables and columns: docs/ledger.md."
    )


def _load_example() -> None:
    st.session_state["sql_query"] = SQL_EXAMPLES[st.session_state["sql_example"]]


# A link from another page names its example (``?example=``): open with that one loaded.
_linked = st.query_params.get("example")
if _linked in SQL_EXAMPLES and st.session_state.get("sql_linked") != _linked:
    st.session_state["sql_linked"] = _linked
    st.session_state["sql_example"] = _linked
    st.session_state["sql_query"] = SQL_EXAMPLES[_linked]
st.selectbox("Examples", list(SQL_EXAMPLES), key="sql_example", on_change=_load_example)
st.session_state.setdefault("sql_query", next(iter(SQL_EXAMPLES.values())))
st.text_area("Query", height=160, key="sql_query")
st.number_input("Max rows", min_value=1, max_value=100_000, value=1000, step=100, key="sql_max_rows")
if st.button("Run", type="primary", key="sql_run"):
    try:
        st.session_state["sql_result"] = insights.run_sql(
            st.session_state["sql_query"], max_rows=int(st.session_state["sql_max_rows"])
        )
        st.session_state.pop("sql_error", None)
    except ConsoleError as exc:
        st.session_state["sql_error"] = str(exc)
        st.session_state.pop("sql_result", None)

if "sql_error" in st.session_state:
    st.error(st.session_state["sql_error"])
result = st.session_state.get("sql_result")
if result is not None:
    st.caption(
        f"{len(result.frame):,} rows in {result.elapsed_ms:.0f} ms"
        + (" (truncated at the row limit)" if result.truncated else "")
    )
    st.dataframe(result.frame, hide_index=True, key="sql_table")
    d1, d2 = st.columns(2)
    d1.download_button("Download CSV", frame_to_csv(result.frame), "query.csv", "text/csv", key="sql_csv")
    d2.download_button(
        "Download Parquet",
        frame_to_parquet(result.frame),
        "query.parquet",
        "application/vnd.apache.parquet",
        key="sql_parquet",
    )
