"""Analyst SQL on a PostgreSQL ledger: one read-only query, READ ONLY transaction, read-only role, time and row caps.

Each layer is shown to refuse on its own: the statement check (clear messages), the role (no rights
but SELECT: files, sequences, catalogs of secrets), and the read-only transaction.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pg_kit import analyst_backends

from engine.errors import SqlRefused
from engine.ledger import open_ledger, pg_client
from engine.ledger.analyst import check_query, run_query
from engine.ledger.postgres import ANALYST_ROLE, PgLedger
from engine.testing import make_operation
from service.analysis import PgReads
from service.config import AnalystConfig
from service.readers import ReaderPool, ReadersBusy

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def ledger(pg_url: str) -> Iterator[PgLedger]:
    led = open_ledger(pg_url)
    assert isinstance(led, PgLedger)
    led.create_operation(make_operation("n1"), {"report": "n1"})
    led.put_setting("global_qps", "50", NOW)
    yield led
    led.close()


def settings_intact(ledger: PgLedger) -> bool:
    return ledger.setting("global_qps") == "50" and ledger.count("operations") == 1


def test_a_query_reads_the_ledger_under_the_analyst_role(ledger: PgLedger) -> None:
    """A SELECT runs as the read-only role, in a read-only transaction, and returns the sandbox's result shape."""
    result = ledger.analyst_query(
        "SELECT current_user AS who, current_setting('transaction_read_only') AS ro, "
        "(SELECT count(*) FROM operations) AS ops, (SELECT state FROM operations) AS state"
    )
    assert result.columns == ["who", "ro", "ops", "state"]
    assert result.rows == [[ANALYST_ROLE, "on", 1, "SUBMITTING"]]
    shape = result.as_json()
    assert shape["row_count"] == 1
    assert shape["truncated"] is False
    rows = run_query(
        ledger, "WITH o AS (SELECT created_at FROM operations) SELECT created_at FROM o"
    ).as_json()["rows"]
    assert rows == [[NOW.isoformat()]]


def test_rows_are_capped(ledger: PgLedger) -> None:
    """No more than max_rows rows come back, and the result says it was cut."""
    result = run_query(ledger, "SELECT g FROM generate_series(1, 100000) AS g", max_rows=100)
    assert len(result.rows) == 100
    assert result.truncated


def test_a_slow_query_is_stopped(ledger: PgLedger) -> None:
    """statement_timeout stops a query that runs past its time."""
    with pytest.raises(SqlRefused, match=r"stopped after 0\.2 s"):
        run_query(ledger, "SELECT pg_sleep(5)", timeout=timedelta(milliseconds=200))
    assert run_query(ledger, "SELECT 1").rows == [[1]]  # the connection is fine afterwards


def test_explain_runs(ledger: PgLedger) -> None:
    """EXPLAIN is allowed (it plans, and with ANALYZE runs, the same read-only query)."""
    result = run_query(ledger, "EXPLAIN SELECT * FROM operations")
    assert result.columns == ["QUERY PLAN"]
    assert result.rows


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("INSERT INTO settings VALUES ('k', 'v', now())", "writes (INSERT)"),
        ("update settings set value = '0'", "writes (UPDATE)"),
        ("  -- a comment first\n DELETE FROM settings", "writes (DELETE)"),
        ("TRUNCATE receipts", "writes (TRUNCATE)"),
        ("COPY settings TO '/tmp/stolen.csv'", "COPY"),
        ("COPY (SELECT * FROM settings) TO STDOUT", "COPY"),
        ("CREATE TABLE x (a int)", "creating objects"),
        ("DROP TABLE receipts", "dropping objects"),
        ("SET ROLE postgres", "changing settings"),
        ("RESET ROLE", "changing settings"),
        ("BEGIN", "transaction control"),
        ("DO $$ BEGIN PERFORM 1; END $$", "DO blocks"),
        ("GRANT ALL ON receipts TO PUBLIC", "granting rights"),
        ("", "empty query"),
    ],
)
def test_anything_but_a_read_is_refused_with_a_clear_message(
    ledger: PgLedger, query: str, message: str
) -> None:
    """The statement check names what was refused before anything runs."""
    with pytest.raises(SqlRefused, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_query(ledger, query)
    assert settings_intact(ledger)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT set_config('role', 'postgres', false)",
        "SELECT \"set_config\"('role', 'postgres', true)",
        "SELECT pg_catalog.SET_CONFIG('statement_timeout', '0', true)",
        "SELECT query_to_xml('DELETE FROM settings RETURNING *', true, false, '')",
        "SELECT * FROM ts_stat('SELECT to_tsvector(value) FROM settings')",
        "SELECT U&\"\\0073et_config\"('role', 'postgres', true)",
    ],
)
def test_ways_out_of_the_role_are_refused_by_name(ledger: PgLedger, query: str) -> None:
    """set_config could switch back to the login role, and a few functions run SQL held in a string: refused."""
    with pytest.raises(SqlRefused, match=r"not allowed"):
        run_query(ledger, query)


def test_several_statements_are_refused(ledger: PgLedger) -> None:
    """Only one statement runs: a second one hidden after a semicolon is refused with the first."""
    with pytest.raises(SqlRefused, match="one statement at a time"):
        run_query(ledger, "SELECT 1; DELETE FROM settings")
    with pytest.raises(SqlRefused, match="one statement at a time"):
        run_query(ledger, "EXPLAIN SELECT 1; DELETE FROM settings")
    assert settings_intact(ledger)


def test_a_write_hidden_in_a_select_is_refused(ledger: PgLedger) -> None:
    """A data-modifying WITH, a row lock or nextval: refused by the database, nothing changes."""
    for query in (
        "WITH d AS (DELETE FROM settings RETURNING *) SELECT * FROM d",
        "EXPLAIN ANALYZE WITH d AS (DELETE FROM settings RETURNING *) SELECT * FROM d",
        "SELECT * FROM settings FOR UPDATE",
        "SELECT nextval('transition_seq')",
        "SELECT lo_import('/etc/hostname')",
    ):
        with pytest.raises(SqlRefused):
            run_query(ledger, query)
    assert settings_intact(ledger)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT pg_read_file('/etc/passwd')",
        "SELECT pg_read_binary_file('/etc/passwd')",
        "SELECT * FROM pg_ls_dir('.')",
        "SELECT * FROM pg_stat_file('postgresql.conf')",
        "SELECT rolpassword FROM pg_authid",
        "SELECT current_setting('data_directory')",
        "SELECT lo_export(1, '/tmp/x')",
    ],
)
def test_files_and_secrets_are_out_of_the_roles_reach(ledger: PgLedger, query: str) -> None:
    """Server files and password hashes: the query passes the check and the role's missing rights refuse it."""
    check_query(query)  # not refused by name: the database refuses it
    with pytest.raises(SqlRefused, match=r"permission denied|must be superuser|privileges of"):
        run_query(ledger, query)


def test_the_role_alone_refuses_writes(pg_url: str, ledger: PgLedger) -> None:
    """Without the check and outside a read-only transaction, the analyst role still cannot write or read files."""
    with pg_client.connect(pg_url) as con:
        for statement in (
            "INSERT INTO settings VALUES ('k', 'v', now())",
            "DELETE FROM receipts",
            "SELECT nextval('transition_seq')",
            "SELECT pg_read_file('/etc/passwd')",
            "CREATE TABLE public.planted (a int)",
        ):
            with con.transaction(force_rollback=True):
                con.execute(f"SET LOCAL ROLE {ANALYST_ROLE}")
                with pytest.raises(pg_client.errors.InsufficientPrivilege), con.transaction():
                    con.execute(statement)
    assert settings_intact(ledger)


def test_the_read_only_transaction_alone_refuses_writes(pg_url: str, ledger: PgLedger) -> None:
    """Even the ledger's own login cannot write inside the READ ONLY transaction analyst SQL runs in."""
    with pg_client.connect(pg_url) as con:
        for statement in ("INSERT INTO settings VALUES ('k', 'v', now())", "DELETE FROM receipts"):
            with con.transaction(force_rollback=True):
                con.execute("SET TRANSACTION READ ONLY")
                with pytest.raises(pg_client.errors.ReadOnlySqlTransaction), con.transaction():
                    con.execute(statement)
    assert settings_intact(ledger)


def test_without_the_role_analyst_sql_is_refused_with_the_reason(pg_url: str, ledger: PgLedger) -> None:
    """A ledger whose login could not set up the role refuses analyst SQL and says why."""
    reader = PgLedger.open(pg_url, read_only=True, analyst_role="finality_nobody_made_this")
    try:
        with pytest.raises(SqlRefused, match="analyst SQL is unavailable"):
            reader.analyst_query("SELECT 1")
    finally:
        reader.close()


def test_a_read_only_ledger_handle_runs_analyst_sql(pg_url: str, ledger: PgLedger) -> None:
    """The console's read-only handle runs analyst queries too."""
    reader = PgLedger.open(pg_url, read_only=True)
    try:
        assert reader.analyst_query("SELECT count(*) FROM receipts").rows == [[0]]
    finally:
        reader.close()


def test_an_analyst_query_runs_on_one_backend_lowered_to_the_lowest_cpu_priority(
    pg_url: str, ledger: PgLedger
) -> None:
    """With backend_nice 19 the (local) backend and its autogroup run at niceness 19, in the idle
    scheduling class; no parallel workers."""
    analysts = PgLedger.open(pg_url, read_only=True, pool_size=1)
    try:
        result = run_query(
            analysts,
            "SELECT pg_backend_pid() AS pid, "
            "(SELECT setting FROM pg_settings WHERE name = 'max_parallel_workers_per_gather') AS parallel",
            backend_nice=19,
        )
        pid, parallel = result.rows[0]
        assert parallel == "0"
        backend = int(str(pid))
        assert os.getpriority(os.PRIO_PROCESS, backend) == 19
        # Idle class: any other wakeup preempts it at once, where a nice-19 task keeps its slice.
        assert os.sched_getscheduler(backend) == os.SCHED_IDLE
        # Under autogroup scheduling the backend's session is its group: the group is niced too.
        group = Path(f"/proc/{backend}/autogroup")
        if group.exists() and os.getsid(backend) == backend:
            assert group.read_text().split()[-1] == "19"
    finally:
        analysts.close()


def test_an_analyst_backend_lowered_to_a_niceness_above_the_lowest_stays_in_the_normal_class(
    pg_url: str, ledger: PgLedger
) -> None:
    """backend_nice 10: niceness 10, scheduled as any other process (the idle class is for 19 alone)."""
    analysts = PgLedger.open(pg_url, read_only=True, pool_size=1)
    try:
        result = run_query(analysts, "SELECT pg_backend_pid()", backend_nice=10)
        backend = int(str(result.rows[0][0]))
        assert os.getpriority(os.PRIO_PROCESS, backend) == 10
        assert os.sched_getscheduler(backend) == os.SCHED_OTHER
    finally:
        analysts.close()


def test_a_query_returning_millions_of_rows_fetches_only_max_rows_from_the_server(ledger: PgLedger) -> None:
    """Ten million rows are asked for; max_rows come back, marked truncated, and the next query runs."""
    result = run_query(ledger, "SELECT g FROM generate_series(1, 10000000) AS g", max_rows=1000)
    assert (len(result.rows), result.truncated) == (1000, True)
    assert run_query(ledger, "SELECT 1").rows == [[1]]


def test_a_query_over_the_servers_temporary_space_limit_fails_naming_work_mem_and_the_ledger_goes_on(
    pg_url: str, ledger: PgLedger
) -> None:
    """A sort past work_mem spills; past the server's temp_file_limit it is refused naming the limits."""
    with pg_client.connect(pg_url, autocommit=True) as admin:
        database = admin.info.dbname
        admin.execute(f"ALTER DATABASE \"{database}\" SET temp_file_limit = '1MB'")
    limited = PgLedger.open(pg_url, pool_size=1)
    try:
        with pytest.raises(SqlRefused, match=r"work_mem=1 MB per sort or hash.*temp_file_limit"):
            run_query(
                limited,
                "SELECT count(*) FROM (SELECT g FROM generate_series(1, 3000000) g ORDER BY g DESC OFFSET 0) s",
                work_mem_mb=1,
            )
        assert run_query(limited, "SELECT 41 + 1").rows == [[42]]
        assert settings_intact(limited)
    finally:
        limited.close()


def test_twenty_concurrent_slow_queries_end_at_statement_timeout_or_are_refused_and_the_ledger_goes_on(
    pg_url: str, ledger: PgLedger
) -> None:
    """Two reader workers and a queue of two: four slow queries stop at the time limit, sixteen get 503; writes go on."""
    analysts = PgLedger.open(pg_url, read_only=True, pool_size=2)
    pool = ReaderPool(workers=2, queue_limit=2)
    reads = PgReads(analysts, AnalystConfig(timeout=timedelta(milliseconds=500)))

    async def ask() -> str:
        try:
            await pool.run("analyst SQL", lambda: reads.query("SELECT pg_sleep(30)", 10))
        except SqlRefused as exc:
            return str(exc)
        except ReadersBusy as exc:
            return f"busy {exc.status} {exc.retry_after_s}"
        return "answered"

    async def crowd() -> list[str]:
        return list(await asyncio.gather(*(ask() for _ in range(20))))

    try:
        answers = asyncio.run(crowd())
        stopped = [a for a in answers if "statement_timeout" in a]
        busy = [a for a in answers if a.startswith("busy 503 ")]
        assert (len(stopped), len(busy)) == (4, 16), answers
        assert all("stopped after 0.5 s" in a for a in stopped)
        # The executor's ledger (its own pool) wrote and read all along; the analysts' pool is free again.
        ledger.put_setting("global_qps", "60", NOW)
        assert ledger.setting("global_qps") == "60"
        assert reads.query("SELECT 1 AS one", 10)["rows"] == [[1]]
    finally:
        pool.close()
        analysts.close()


def test_the_services_analyst_queries_hold_no_connection_of_the_executors_pool(
    pg_url: str, ledger: PgLedger, tmp_path: Path
) -> None:
    """Two slow analyst queries run while an executor with a one-connection pool still reads and writes."""
    from engine.testing import FakeClock
    from service.serve import analyst_reads
    from service.testing import wait_until

    executor_side = PgLedger.open(pg_url, pool_size=1)
    reads, reader = analyst_reads(
        executor_side,
        pg_url,
        AnalystConfig(workers=2, timeout=timedelta(seconds=60), nice=0),
        tmp_path,
        FakeClock(),
    )
    assert reader is not None
    refused: list[str] = []

    def slow() -> None:
        try:
            reads.query("SELECT pg_sleep(60)", 1)
        except SqlRefused as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=slow) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        wait_until(
            lambda: len(analyst_backends(pg_url)) == 2 or bool(refused),
            timeout=60,
            every=0.1,
            what="both analyst queries running",
        )
        assert not refused, refused
        # The executor's only connection is free: it writes and reads while both queries still run.
        executor_side.put_setting("probe", "written", NOW)
        assert executor_side.setting("probe") == "written"
        assert len(analyst_backends(pg_url)) == 2
    finally:
        with pg_client.connect(pg_url, autocommit=True) as conn:
            for pid in analyst_backends(pg_url):
                conn.execute("SELECT pg_cancel_backend(%s)", [pid])
        for t in threads:
            t.join(timeout=60)
        reader.close()
        executor_side.close()
    assert len(refused) == 2, refused


def test_an_answer_over_the_result_size_limit_is_refused_naming_it_and_the_next_query_runs(
    pg_url: str, ledger: PgLedger
) -> None:
    """100,000 rows of 100 characters (about 11 MB) are refused under max_result_mb = 1, as JSON and as Arrow."""
    analysts = PgLedger.open(pg_url, read_only=True, pool_size=1)
    # At nice 19 on a loaded machine the 100,000 rows may take longer than the 10-s default to read.
    reads = PgReads(analysts, AnalystConfig(max_result_mb=1, timeout=timedelta(seconds=120)))
    wide = "SELECT repeat('x', 100) AS s FROM generate_series(1, 100000) g"
    try:
        with pytest.raises(SqlRefused, match=r"over the service's result-size limit of 1 MB"):
            reads.query_json(wide, 100_000)
        with pytest.raises(SqlRefused, match=r"result-size limit of 1 MB \(\[analyst\] max_result_mb\)"):
            reads.arrow_ipc(wide, 100_000)
        assert b'"rows": [[42]]' in reads.query_json("SELECT 41 + 1 AS n", 10)
    finally:
        analysts.close()
