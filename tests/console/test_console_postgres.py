"""The console on a PostgreSQL ledger: every page's data agrees with the same ledger on DuckDB.

Two ledgers are seeded alike (``demo.seed``, same seed, same instants): a DuckDB file and a
database on the throwaway PostgreSQL 15 the project's fixtures start (``engine.testing.postgres``). The
console reads the first through the DuckDB sandbox (``FileSource``) and the second as analyst SQL
(``PostgresSource``: a READ ONLY transaction under the read-only role). Every ``Insights`` data
function returns the same frame on both (floats to rounding), the gates agree, the one gate-inputs
statement (``engine.ledger.gate_sql``) reads on PostgreSQL what ``PgLedger.gate_inputs`` reads, and each
page renders on the PostgreSQL ledger.

Nothing is skipped: if PostgreSQL cannot start, these tests fail with the reason.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from console.insights import Insights
from console.queries import SQL_EXAMPLES
from console.sources import FileSource, PostgresSource, ServiceSource
from demo.seed import seed_ledger
from engine.errors import QueryFailed, ReadOnlyConsole
from engine.ledger import open_ledger
from engine.ledger.gate_sql import gate_inputs_from_values, gate_inputs_sql
from engine.ledger.postgres import PgLedger
from engine.testing.postgres import TemporaryPostgres, shared_cluster

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app.py"
HISTORY_ENDS = datetime(2026, 3, 2, 12, 0, 0, 250_000, tzinfo=UTC)
CLOSING_RUN = HISTORY_ENDS + timedelta(seconds=5)
READ_AT = HISTORY_ENDS + timedelta(minutes=1, seconds=0.5)
SINCE, UNTIL = HISTORY_ENDS - timedelta(days=7), HISTORY_ENDS + timedelta(seconds=1)


class FixedClock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


@pytest.fixture(scope="module")
def pg_cluster() -> TemporaryPostgres:
    return shared_cluster()


@pytest.fixture(scope="module")
def twins(pg_cluster: TemporaryPostgres, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The same seeded history in a DuckDB file and in a PostgreSQL database."""
    path = tmp_path_factory.mktemp("twins") / "seeded.duckdb"
    url = pg_cluster.create_database(f"console_{uuid.uuid4().hex[:12]}")
    for target in (str(path), url):
        seed_ledger(target, operations=3000, seed=7, now=HISTORY_ENDS, clock=FixedClock(CLOSING_RUN))
    return path, url


@pytest.fixture(scope="module")
def both(twins: tuple[Path, str]) -> Iterator[tuple[Insights, Insights]]:
    path, url = twins
    duck = Insights(FileSource(path), cache_s=0, clock=FixedClock(READ_AT))
    pg = Insights(PostgresSource(url), cache_s=0, clock=FixedClock(READ_AT))
    try:
        yield duck, pg
    finally:
        duck.close()
        pg.close()


def _normal(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.reset_index(drop=True).copy()
    for column in out.columns:
        series = out[column]
        if pd.api.types.is_datetime64_any_dtype(series):
            out[column] = series.dt.tz_convert("UTC")
        elif series.dtype == object and series.map(lambda v: isinstance(v, datetime)).any():
            out[column] = pd.to_datetime(series, utc=True)
        elif series.dtype == object and series.map(lambda v: type(v).__name__ == "Decimal").any():
            out[column] = series.astype(float)
    return out


def assert_same(duck: pd.DataFrame, pg: pd.DataFrame, *, ordered: bool = True) -> None:
    """The same columns and rows; numbers to rounding (each engine interpolates percentiles itself)."""
    a, b = _normal(duck), _normal(pg)
    assert list(a.columns) == list(b.columns)
    assert len(a) == len(b)
    if not ordered:
        keys = list(a.columns)
        a = a.sort_values(keys).reset_index(drop=True)
        b = b.sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False, rtol=1e-6, atol=1e-6)


FRAMES: dict[str, Callable[[Insights], pd.DataFrame]] = {
    # overview
    "arms": lambda i: i.arms(),
    "in_flight": lambda i: i.in_flight(),
    "alerts": lambda i: pd.DataFrame([i.alerts()]),
    "outbox_lag": lambda i: i.outbox_lag(),
    # cancel latency
    "cancel_latency_over_time": lambda i: i.cancel_latency_over_time(since=SINCE, until=UNTIL),
    "cancel_latency_over_time by arm": lambda i: i.cancel_latency_over_time(
        since=SINCE, until=UNTIL, by="arm", bucket=timedelta(minutes=30)
    ),
    "cancel_latency_over_time all, one arm": lambda i: i.cancel_latency_over_time(
        since=SINCE, until=UNTIL, by="all", arms=["control"], bucket=timedelta(days=1)
    ),
    "cancel_latency_summary": lambda i: i.cancel_latency_summary(since=SINCE, until=UNTIL),
    "slowest_cancels": lambda i: i.slowest_cancels(since=SINCE, until=UNTIL),
    "slowest_cancels filtered": lambda i: i.slowest_cancels(
        since=SINCE, until=UNTIL, protocols=["aip-151"], arms=["control", "canary"]
    ),
    # reconciliation
    "unknown_age_histogram": lambda i: i.unknown_age_histogram(kinds=("unknown", "effects")),
    "reconciliation_aging": lambda i: i.reconciliation_aging(),
    "reconciliation_resolved": lambda i: i.reconciliation_resolved(),
    # gate compliance
    "gate_history": lambda i: i.gate_history(),
    "explorer_coverage": lambda i: i.explorer_coverage(),
    "explorer_runs": lambda i: i.explorer_runs(),
    # operations
    "filter_options": lambda i: pd.DataFrame(
        [(k, v) for k, vs in i.filter_options().items() for v in vs], columns=["field", "value"]
    ),
    "operations": lambda i: i.operations(),
    "operations filtered": lambda i: i.operations(
        states=["WORKING", "UNKNOWN"], protocols=["mcp-2025-11-25"], arms=["control", "canary"]
    ),
    "operations_by_state": lambda i: i.operations_by_state(),
    "operations_by_state filtered": lambda i: i.operations_by_state(
        tools=["generate_report"], arms=["shadow"]
    ),
    "operation": lambda i: pd.DataFrame([i.operation("node-1")]),
    "timeline": lambda i: i.timeline("node-1"),
    # approvals
    "approvals_pending": lambda i: i.approvals_pending(),
    "approvals_answered": lambda i: i.approvals_answered(),
    # the cancel chart's window
    "cancel_span": lambda i: pd.DataFrame([{"first_at": i.cancel_span(since=SINCE, until=UNTIL)}]),
}


@pytest.mark.parametrize("name", list(FRAMES))
def test_every_data_function_agrees_on_duckdb_and_postgres(
    name: str, both: tuple[Insights, Insights]
) -> None:
    duck, pg = both
    mine, theirs = FRAMES[name](duck), FRAMES[name](pg)
    assert len(mine) > 0, f"{name}: the seeded ledger should give rows"
    assert_same(mine, theirs)


def test_the_sql_differs_only_where_a_dialect_says_it_its_own_way(both: tuple[Insights, Insights]) -> None:
    duck, pg = both
    assert (duck.dialect, pg.dialect) == ("duckdb", "postgres")
    assert duck.sql_of("arms") == pg.sql_of("arms")
    assert "time_bucket(" in duck.sql_of("cancel_latency_over_time", **_bucket_params())
    assert "date_bin(" in pg.sql_of("cancel_latency_over_time", **_bucket_params())


def _bucket_params() -> dict[str, object]:
    from console.insights import _Raw

    return {
        "since": SINCE,
        "until": UNTIL,
        "bucket": timedelta(hours=1),
        "group": _Raw("protocol"),
        "protocols": _Raw("('aip-151')"),
        "arm_filter": _Raw("TRUE"),
    }


def test_gate_inputs_and_verdicts_agree(both: tuple[Insights, Insights]) -> None:
    duck, pg = both
    mine, _ = duck.gate_inputs()
    theirs, _ = pg.gate_inputs()
    assert mine.keys() == theirs.keys()
    for gate, values in mine.items():
        for key, value in values.items():
            if isinstance(value, float):
                assert theirs[gate][key] == pytest.approx(value, rel=1e-6), (gate, key)
            else:
                assert theirs[gate][key] == value, (gate, key)
    for view_d, view_p in ((duck.gates(), pg.gates()), (duck.reevaluate(), pg.reevaluate())):
        assert [(r.gate, r.passed) for r in view_d.results] == [(r.gate, r.passed) for r in view_p.results]
        assert [r.value for r in view_p.results] == pytest.approx([r.value for r in view_d.results])
        assert view_d.run_id == view_p.run_id
    assert pg.recorded_gates() is not None, "nothing was written after the closing run: it is current"


def test_the_one_gate_statement_reads_what_pg_ledger_gate_inputs_reads(twins: tuple[Path, str]) -> None:
    """engine.ledger.gate_sql in PostgreSQL's dialect (as analyst SQL) equals PgLedger.gate_inputs: one definition can serve both."""
    _, url = twins
    ledger = open_ledger(url, read_only=True)
    assert isinstance(ledger, PgLedger)
    try:
        result = ledger.analyst_query(gate_inputs_sql(READ_AT, "postgres"), max_rows=1)
        from_sql = gate_inputs_from_values(result.columns, result.rows[0])
        own = ledger.gate_inputs(READ_AT)
    finally:
        ledger.close()
    for gate, values in own.items():
        for key, value in values.items():
            got = from_sql[gate][key]
            if isinstance(got, float) or isinstance(value, float):
                assert got == pytest.approx(float(str(value)), rel=1e-6), (gate, key)
            else:
                assert got == value, (gate, key)
    with pytest.raises(ValueError, match="unknown SQL dialect"):
        gate_inputs_sql(READ_AT, "sqlite")


def test_the_evidence_bundle_builds_on_postgres(both: tuple[Insights, Insights]) -> None:
    _, pg = both
    bundle = pg.evidence_bundle(decision="test", actor="tester")
    assert len(bundle) > 1000


def test_a_postgres_console_refuses_actions(both: tuple[Insights, Insights]) -> None:
    _, pg = both
    with pytest.raises(ReadOnlyConsole):
        pg.resolve(1, actor="a", reason="b")
    with pytest.raises(ReadOnlyConsole):
        pg.cancel("node-1", actor="a", reason="b")
    with pytest.raises(ReadOnlyConsole):
        pg.rollout_action("rollback", actor="a", reason="b")
    assert pg.info.kind == "postgres"
    assert not pg.info.writable
    assert pg_cluster_password(pg) not in pg.info.location  # the URL is shown without its password


def pg_cluster_password(insights: Insights) -> str:
    return shared_cluster().password


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("DELETE FROM receipts", "writes (DELETE)"),
        ("SELECT pg_read_file('postgresql.conf')", "read-only role"),
        ("COPY receipts TO STDOUT", "COPY"),
        ("WITH x AS (DELETE FROM receipts RETURNING 1) SELECT * FROM x", "query failed"),
    ],
)
def test_analyst_sql_on_postgres_refuses_writes_and_files(
    query: str, says: str, both: tuple[Insights, Insights]
) -> None:
    _, pg = both
    with pytest.raises(QueryFailed, match=re.escape(says)):
        pg.run_sql(query)


def test_a_service_names_its_dialect_or_is_asked() -> None:
    """The health answer's backend when it names one; otherwise SELECT version() through /api/v1/sql."""

    class Client:
        base_url = "http://service.invalid"

        def __init__(self) -> None:
            self.asked: list[str] = []

        def sql(self, query: str, *, max_rows: int) -> dict[str, object]:
            self.asked.append(query)
            return {"columns": ["version"], "rows": [["PostgreSQL 15.8 on x86_64-pc-linux-gnu"]]}

        def close(self) -> None:
            pass

    client = Client()
    assert ServiceSource(client, {"status": "ok", "ledger": {"backend": "duckdb"}}).dialect == "duckdb"  # type: ignore[arg-type]
    assert ServiceSource(client, {"dialect": "postgres"}).dialect == "postgres"  # type: ignore[arg-type]
    assert client.asked == []
    source = ServiceSource(client, {"status": "ok"})  # type: ignore[arg-type]
    assert source.dialect == "postgres"
    assert source.dialect == "postgres"  # asked once
    assert client.asked == ["SELECT version() AS version"]


# ----------------------------------------------------------------------------------------- pages

PAGES = (
    "pages/overview.py",
    "pages/cancel_latency.py",
    "pages/reconciliation.py",
    "pages/gate_compliance.py",
    "pages/operations.py",
    "pages/approvals.py",
    "pages/rollout_control.py",
    "pages/sql.py",
    "pages/evidence_bundle.py",
)


@pytest.fixture
def pg_console(twins: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> Callable[[str], AppTest]:
    _, url = twins
    monkeypatch.delenv("FINALITY_SERVICE_URL", raising=False)
    monkeypatch.setenv("FINALITY_LEDGER", url)
    monkeypatch.setenv("FINALITY_ACTOR", "tester")

    def open_page(page: str) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=60)
        if page != "pages/overview.py":
            at.switch_page(page)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return open_page


def _page_errors(at: AppTest) -> list[str]:
    # Errors a page shows by design on the seeded ledger (failing gates, old UNKNOWNs) are fine;
    # a failed page or query is not.
    return [
        str(e.value)
        for e in at.error
        if "page failed" in str(e.value) or "query failed" in str(e.value) or "refused" in str(e.value)
    ]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_on_a_postgres_ledger(page: str, pg_console: Callable[[str], AppTest]) -> None:
    at = pg_console(page)
    assert not _page_errors(at), _page_errors(at)
    assert any("PostgreSQL ledger" in str(c.value) for c in at.sidebar.caption)


def test_sql_page_on_postgres_runs_examples_and_refuses_write_file_and_copy(
    pg_console: Callable[[str], AppTest],
) -> None:
    at = pg_console("pages/sql.py")
    assert any("analyst role" in str(c.value) for c in at.caption)
    at.button(key="sql_run").click().run()
    assert not at.error, [e.value for e in at.error]
    assert len(at.dataframe[0].value) > 0
    for query, says in (
        ("INSERT INTO settings VALUES ('k', 'v', now())", "writes (INSERT)"),
        ("SELECT pg_read_file('postgresql.conf')", "read-only role"),
        ("COPY (SELECT 1) TO '/tmp/finality-copy-test'", "COPY"),
    ):
        at.text_area(key="sql_query").set_value(query).run()
        at.button(key="sql_run").click().run()
        errors = [str(e.value) for e in at.error]
        assert any(says in e for e in errors), (query, errors)


@pytest.mark.parametrize("example", list(SQL_EXAMPLES))
def test_every_sql_example_runs_alike_on_both(example: str, both: tuple[Insights, Insights]) -> None:
    duck, pg = both
    mine, theirs = duck.run_sql(SQL_EXAMPLES[example]), pg.run_sql(SQL_EXAMPLES[example])
    ordered = "ORDER BY" in SQL_EXAMPLES[example] and "LIMIT" not in SQL_EXAMPLES[example]
    if "LIMIT" in SQL_EXAMPLES[example]:  # ties at the limit may pick different rows: compare the counts
        assert list(mine.frame.columns) == list(theirs.frame.columns)
        assert len(mine.frame) == len(theirs.frame)
        if "requests" in mine.frame:
            assert list(mine.frame["requests"]) == list(theirs.frame["requests"])
    else:
        assert_same(mine.frame, theirs.frame, ordered=ordered)


def test_rollout_status_and_its_audit_chain_are_read_from_a_postgres_ledger(
    pg_cluster: TemporaryPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no service, the rollout page shows the recorded stage, exposure, epoch, kill switch and the
    verified audit chain, read through a read-only handle; the actions stay refused."""
    from engine.testing import FakeClock
    from rollout.controller import RolloutController
    from rollout.plan import Action, Request
    from rollout.route import ToolPaths

    url = pg_cluster.create_database(f"rollout_{uuid.uuid4().hex[:12]}")
    tools = {"generate_report": ToolPaths("generate_report", "old", "new", side_effect_free=True)}
    writer = open_ledger(url)
    try:
        controller = RolloutController(writer, FakeClock(), tools, salt="s1")  # type: ignore[arg-type]
        controller.act(Request(Action.SHADOW, actor="rm", reason="start"))
        controller.act(Request(Action.CANARY, actor="rm", reason="five", canary_bp=500, override=True))
        controller.act(Request(Action.DISABLE_PROTOCOL, actor="oncall", reason="bad", protocol="aip-151"))
    finally:
        writer.close()
    insights = Insights(PostgresSource(url), cache_s=0)
    try:
        status = insights.rollout_status()
        assert status is not None
        assert (status.stage, status.percentage, status.disabled_protocols) == ("canary", 5.0, ("aip-151",))
        assert status.remaining == {"aip-151": 0}
        assert (status.audit.verified, status.audit.events) == (True, 3)
        audit = insights.audit_log()
        assert audit is not None
        assert list(audit["seq"]) == [3, 2, 1]
    finally:
        insights.close()

    monkeypatch.delenv("FINALITY_SERVICE_URL", raising=False)
    monkeypatch.setenv("FINALITY_LEDGER", url)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.switch_page("pages/rollout_control.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Stage"] == "canary"
    assert metrics["Audit chain"] == "verified"
