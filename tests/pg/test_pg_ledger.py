"""What only the PostgreSQL ledger has: URL selection, connection errors, migrations shared by several
processes, the analyst role, losing connections, bulk import, and the throwaway test server itself."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from engine.errors import ClusterError, LedgerCorrupt, LedgerError, LedgerUnavailable
from engine.ledger import is_postgres, open_ledger, pg_client
from engine.ledger import postgres as pg_ledger
from engine.ledger.duckdb import Ledger
from engine.ledger.port import Fence
from engine.ledger.postgres import ANALYST_ROLE, SUPPORTED_SCHEMA, PgLedger
from engine.testing import make_operation
from engine.testing.postgres import TemporaryPostgres, free_port

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def pg_open(url: str, **kw: object) -> PgLedger:
    led = open_ledger(url, **kw)  # type: ignore[arg-type]
    assert isinstance(led, PgLedger)
    return led


def test_open_ledger_picks_the_backend_from_the_target(tmp_path: Path, pg_url: str) -> None:
    """A path opens DuckDB; a postgresql:// (or postgres://) URL opens PostgreSQL."""
    with open_ledger(str(tmp_path / "l.duckdb")) as duck:
        assert isinstance(duck, Ledger)
    with open_ledger(pg_url) as pg:
        assert isinstance(pg, PgLedger)
    with open_ledger(pg_url.replace("postgresql://", "postgres://", 1)) as pg:
        assert isinstance(pg, PgLedger)
    assert is_postgres(" PostgreSQL://h/db")
    assert not is_postgres("data/ledger.duckdb")


def test_an_unreachable_server_is_named_without_the_password() -> None:
    """Nothing listens there: LedgerUnavailable names host and port, never the password."""
    url = f"postgresql://finality:s3cret-pw@127.0.0.1:{free_port()}/ledger"
    with pytest.raises(LedgerUnavailable, match=r"127\.0\.0\.1") as refused:
        open_ledger(url)
    assert "s3cret-pw" not in str(refused.value)


def test_a_wrong_password_is_refused_without_echoing_it(pg_cluster: TemporaryPostgres) -> None:
    """The server refuses the login: LedgerUnavailable, and the message does not carry the password tried."""
    url = f"postgresql://postgres:not-the-password@127.0.0.1:{pg_cluster.port}/postgres"
    with pytest.raises(LedgerUnavailable, match="password") as refused:
        open_ledger(url)
    assert "not-the-password" not in str(refused.value)


def test_read_only_open_of_an_empty_database_is_refused(pg_url: str) -> None:
    """A reader never creates a ledger: a database without one is named as such."""
    with pytest.raises(LedgerCorrupt, match="not a Finality ledger"):
        open_ledger(pg_url, read_only=True)


def test_read_only_open_of_a_ledger_needing_a_migration_is_refused(pg_url: str) -> None:
    """A reader never migrates: it names the migration that is missing."""
    pg_open(pg_url).close()
    with pg_client.connect(pg_url, autocommit=True) as con:
        con.execute("DELETE FROM schema_migrations WHERE version = %s", [SUPPORTED_SCHEMA])
    with pytest.raises(LedgerUnavailable, match=f"needs migration {SUPPORTED_SCHEMA}"):
        open_ledger(pg_url, read_only=True)


def test_a_read_only_handle_refuses_writes_at_once(pg_url: str) -> None:
    """Writes through a read-only handle fail immediately with LedgerUnavailable; reads work."""
    with pg_open(pg_url) as led:
        led.create_operation(make_operation("n1"), {})
    with pg_open(pg_url, read_only=True) as ro:
        assert ro.by_call_node("n1") is not None
        with pytest.raises(LedgerUnavailable, match="read-only"):
            ro.create_operation(make_operation("n2"), {})
        with pytest.raises(LedgerUnavailable, match="read-only"):
            ro.put_setting("k", "v", NOW)
        assert ro.count("operations") == 1


def test_executors_opening_a_new_ledger_at_once_migrate_it_once(pg_url: str) -> None:
    """Six processes' worth of first opens at the same moment: every one succeeds, each migration runs once."""
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []
    opened: list[PgLedger] = []

    def first_open() -> None:
        barrier.wait(timeout=30)
        try:
            opened.append(pg_open(pg_url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_open) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for led in opened:
        led.close()
    assert not errors, errors
    with pg_client.connect(pg_url) as con:
        versions = [r[0] for r in con.execute("SELECT version FROM schema_migrations ORDER BY version")]
    assert versions == list(range(1, SUPPORTED_SCHEMA + 1))


def test_a_failing_migration_leaves_nothing_half_applied(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each migration is one transaction: if a statement fails, its earlier statements are rolled back too."""
    pg_open(pg_url).close()
    bad = (
        SUPPORTED_SCHEMA + 1,
        "broken",
        ("CREATE TABLE half_done (a INTEGER)", "SELECT * FROM no_such_table"),
    )
    monkeypatch.setattr(pg_ledger, "MIGRATIONS", (*pg_ledger.MIGRATIONS, bad))
    monkeypatch.setattr(pg_ledger, "SUPPORTED_SCHEMA", SUPPORTED_SCHEMA + 1)
    with pytest.raises(LedgerUnavailable, match="no_such_table"):
        open_ledger(pg_url)
    with pg_client.connect(pg_url) as con:
        assert con.execute("SELECT to_regclass('half_done')").fetchone() == (None,)
        assert con.execute("SELECT max(version) FROM schema_migrations").fetchone() == (SUPPORTED_SCHEMA,)


def test_the_analyst_role_can_only_read_the_ledger(pg_url: str) -> None:
    """Opening creates a NOLOGIN role with SELECT on the ledger's tables and no other right."""
    pg_open(pg_url).close()
    with pg_client.connect(pg_url) as con:
        role = con.execute(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles WHERE rolname = %s",
            [ANALYST_ROLE],
        ).fetchone()
        assert role == (False, False, False, False, False)
        for table in ("operations", "receipts", "outbox", "op_state", "rollout_events", "settings"):
            rights = con.execute(
                "SELECT has_table_privilege(%s, %s, 'SELECT'), has_table_privilege(%s, %s, 'INSERT'), "
                "has_table_privilege(%s, %s, 'UPDATE'), has_table_privilege(%s, %s, 'DELETE'), "
                "has_table_privilege(%s, %s, 'TRUNCATE')",
                [ANALYST_ROLE, table] * 5,
            ).fetchone()
            assert rights == (True, False, False, False, False), table
        assert con.execute(
            "SELECT has_sequence_privilege(%s, 'transition_seq', 'USAGE')", [ANALYST_ROLE]
        ).fetchone() == (False,)
        assert con.execute(
            "SELECT has_function_privilege(%s, 'pg_read_file(text)', 'EXECUTE')", [ANALYST_ROLE]
        ).fetchone() == (False,)
        assert con.execute(
            "SELECT has_schema_privilege(%s, 'public', 'CREATE')", [ANALYST_ROLE]
        ).fetchone() == (False,)


def test_lost_connections_are_replaced(pg_url: str, pg_cluster: TemporaryPostgres) -> None:
    """The server drops every ledger connection: at most one call fails (LedgerUnavailable), then the pool reconnects."""
    with pg_open(pg_url) as led:
        led.create_operation(make_operation("n1"), {})
        with pg_client.connect(pg_cluster.url(), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [pg_url.rsplit("/", 1)[1]],
            )
        failures = 0
        for _ in range(led._pool.max_size + 2):
            try:
                assert led.by_call_node("n1") is not None
            except LedgerUnavailable:
                failures += 1
        assert failures <= led._pool.max_size
        assert led.by_call_node("n1") is not None


def test_bulk_import_numbers_sequenced_rows_and_leaves_leases_free(pg_url: str) -> None:
    """Seeded rows land in one transaction: transition seqs numbered in order, lease columns empty, keys enforced."""
    op = make_operation("seeded")
    ts = pa.timestamp("us", tz="UTC")
    identity = pa.table(
        {
            "operation_id": [op.operation_id],
            "call_node_id": [op.call_node_id],
            "role": ["primary"],
            "request_digest": [op.request_digest],
            "tool_name": [op.tool.name],
            "tool_version": [op.tool.version],
            "descriptor_version": ["1"],
            "side_effects": [False],
            "principal": ["alice"],
            "protocol": [op.protocol.value],
            "adapter_version": ["test"],
            "server": [op.server],
            "idempotency_key": [op.idempotency_key],
            "arguments": ["{}"],
            "schema_version": [op.schema_version],
            "created_at": pa.array([NOW], ts),
        }
    )
    state = pa.table(
        {
            "operation_id": [op.operation_id],
            "state": ["WORKING"],
            "server_status": ["working"],
            "task_id": ["t-seeded"],
            "poll_cursor": pa.array([None], pa.string()),
            "input_round": pa.array([0], pa.int32()),
            "answered_round": pa.array([0], pa.int32()),
            "input_request_key": pa.array([None], pa.string()),
            "cancel_generation": pa.array([0], pa.int32()),
            "cancel_requested_at": pa.array([None], ts),
            "expires_at": pa.array([None], ts),
            "result_digest": pa.array([None], pa.string()),
            "result_held": [False],
            "effect_reconciliation_required": [False],
            "submit_attempts": pa.array([0], pa.int32()),
            "epoch": [1],
            "row_version": [2],
            "updated_at": pa.array([NOW], ts),
        }
    )
    log = pa.table(
        {
            "operation_id": [op.operation_id] * 2,
            "call_node_id": [op.call_node_id] * 2,
            "from_state": [None, "SUBMITTING"],
            "to_state": ["SUBMITTING", "WORKING"],
            "event": ["Created", "Submitted"],
            "detail": ["{}", "{}"],
            "cause": ["", ""],
            "accepted": [True, True],
            "epoch": [1, 1],
            "row_version": [0, 1],
            "recorded_at": pa.array([NOW, NOW], ts),
        }
    )
    with pg_open(pg_url) as led:
        counts = led.import_rows({"op_identity": identity, "op_state": state, "transitions": log})
        assert counts == {"op_identity": 1, "op_state": 1, "transitions": 2}
        stored = led.get(op.operation_id)
        assert stored is not None
        assert stored.state.value == "WORKING"
        assert [r["seq"] for r in led.transitions(op.operation_id)] == [1, 2]
        lease = led.lease_of(op.operation_id)
        assert lease is not None
        assert lease.token is None
        assert len(led.claim("a", "tok", 10, 30, NOW)) == 1
        created = led.create_operation(make_operation("after"), {})[0]
        assert [r["seq"] for r in led.transitions(created.operation_id)] == [3]
        with pytest.raises(LedgerError, match="cannot be bulk-imported"):
            led.import_rows({"rollout_events": log})
        with pytest.raises(LedgerError, match="missing"):
            led.import_rows({"op_state": state.drop_columns(["state"])})
        with pytest.raises(pg_client.errors.UniqueViolation):
            led.import_rows({"op_identity": identity})
        assert led.count("op_identity") == 2  # the seeded one and "after"; the failed import left nothing


def test_a_fenced_handle_shares_the_pool_and_closing_it_leaves_the_ledger_open(pg_url: str) -> None:
    """``fenced`` is a view on the same connections; only the ledger it came from closes them."""
    with pg_open(pg_url) as led:
        view = led.fenced(Fence("a", "tok", epoch=1))
        view.create_operation(make_operation("n1"), {})
        view.close()
        assert led.count("operations") == 1
        lease = led.lease_of("op-n1")
        assert lease is not None
        assert lease.owner == "a"


# --------------------------------------------------------------------------- the test server itself


def test_the_test_server_listens_on_loopback_only_and_not_as_root(pg_cluster: TemporaryPostgres) -> None:
    """initdb refuses root: under root the server runs as an unprivileged user; it listens on 127.0.0.1 only."""
    with pg_client.connect(pg_cluster.url()) as con:
        assert con.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert con.execute("SHOW unix_socket_directories").fetchone() == ("",)
        version = con.execute("SHOW server_version_num").fetchone()
    assert version is not None
    assert int(version[0]) // 10000 == 15
    pid = int((pg_cluster.data / "postmaster.pid").read_text().splitlines()[0])
    uid = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Uid:")
    )
    assert uid != 0
    if os.geteuid() != 0:
        assert uid == os.geteuid()


def test_a_server_that_cannot_start_fails_loudly(tmp_path: Path) -> None:
    """Missing binaries are an error naming the folder, never a skipped test."""
    with pytest.raises(ClusterError, match="initdb"):
        TemporaryPostgres(bindir=tmp_path).start()


def test_two_throwaway_servers_run_side_by_side() -> None:
    """Each server gets its own folder and free port (tests and benchmarks may start more than one)."""
    with TemporaryPostgres() as other:
        url = other.create_database(f"t_{uuid.uuid4().hex[:8]}")
        with pg_open(url) as led:
            assert led.schema_version() == SUPPORTED_SCHEMA
        root = other.root
        assert root is not None
    assert not root.exists()


def test_docs_name_the_lease_columns_and_primitives(pg_url: str) -> None:
    """docs/postgres.md lists the columns only PostgreSQL's op_state has, and every lease primitive."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "postgres.md").read_text()
    section = text.split("### op_state: lease columns", 1)[1].split("\n## ", 1)[0]
    documented = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| lease_")]
    with pg_open(pg_url) as led:
        columns = led.table_columns()["op_state"]
    assert documented == list(pg_ledger.LEASE_COLUMNS) == columns[-len(documented) :]
    for name in ("claim", "renew", "release", "lease_of", "leases", "fenced", "analyst_query"):
        assert f"{name}(" in text, name
