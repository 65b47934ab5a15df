"""Analyst SQL on a PostgreSQL ledger: one query, in a READ ONLY transaction, under a read-only role.

Three layers, each enough on its own for writes: a statement check refuses anything but one
SELECT / WITH / VALUES / TABLE / EXPLAIN with a clear message (and the few functions that could
leave the role or run SQL held in a string); the query then runs in a ``READ ONLY`` transaction
after ``SET LOCAL ROLE`` to a NOLOGIN role that holds USAGE on the ledger's schema and SELECT on
its tables and nothing else, so writes, sequences, ``COPY`` to or from files and server-file
functions (``pg_read_file``, ``pg_ls_dir``, ``lo_import``) fail on permissions. ``statement_timeout``
bounds the time, ``work_mem`` each sort or hash's memory (beyond it PostgreSQL spills to its own
temporary files, bounded by ``temp_file_limit`` where the server sets one) and a server-side cursor
the rows fetched; a query over a limit fails with ``SqlRefused`` naming it. Writes nothing; the transaction is
always rolled back.

CPU: a query runs on its own backend only (``max_parallel_workers_per_gather = 0``: parallel workers
would be more processes taking cores from the executor and its backends), and with ``backend_nice``
that backend, when it is a local PostgreSQL process this user may renice, is lowered to that niceness, so
an analyst's slow query runs on the CPU the executor's backends leave (its autogroup's niceness too,
as PostgreSQL gives each backend a session of its own). At 19, the lowest niceness, the backend also
goes into Linux's idle scheduling class (``SCHED_IDLE``): a niced task that holds a core keeps it
until its time slice ends, and on PostgreSQL every write of the executor wakes a backend of its own,
each of which would wait that long behind the analyst; an idle-class task is preempted by any other
wakeup at once (issue 22: health p99 2.1x with the analyst at nice 19, quiet machine). The price: on
a machine whose cores are all busy, an analyst query gets next to no CPU and stops at its time limit.
Only for connections kept for analysts: an unprivileged process cannot raise a priority back.
"""

from __future__ import annotations

import ipaddress
import os
import re
import time
from contextlib import AbstractContextManager, suppress
from datetime import timedelta
from typing import Final, Protocol

from engine.errors import SqlRefused
from engine.ledger import pg_client as pg
from engine.ledger.pg_client import TupleRow, sql
from engine.ledger.pg_client import errors as pg_errors
from engine.ledger.sandbox import QueryResult, query_text
from engine.priority import lower


class AnalystSource(Protocol):
    """What analyst SQL needs of a PostgreSQL ledger (``PgLedger`` is one): the role it runs under
    and a pooled connection. Declared here so that this module does not import the driver."""

    @property
    def analyst_role(self) -> str: ...

    def connection(self) -> AbstractContextManager[pg.Connection[TupleRow]]: ...


_ALLOWED: Final = frozenset({"select", "with", "values", "table", "explain"})
_WHAT: Final = {
    "insert": "writes (INSERT)",
    "update": "writes (UPDATE)",
    "delete": "writes (DELETE)",
    "merge": "writes (MERGE)",
    "truncate": "writes (TRUNCATE)",
    "copy": "COPY (files and the copy protocol are out of reach)",
    "create": "creating objects",
    "drop": "dropping objects",
    "alter": "altering objects",
    "grant": "granting rights",
    "revoke": "revoking rights",
    "set": "changing settings",
    "reset": "changing settings",
    "begin": "transaction control",
    "start": "transaction control",
    "commit": "transaction control",
    "end": "transaction control",
    "rollback": "transaction control",
    "abort": "transaction control",
    "savepoint": "transaction control",
    "release": "transaction control",
    "do": "DO blocks",
    "call": "CALL",
    "prepare": "prepared statements",
    "execute": "prepared statements",
    "deallocate": "prepared statements",
    "declare": "cursors",
    "fetch": "cursors",
    "move": "cursors",
    "close": "cursors",
    "lock": "LOCK",
    "listen": "LISTEN/NOTIFY",
    "notify": "LISTEN/NOTIFY",
    "unlisten": "LISTEN/NOTIFY",
    "vacuum": "maintenance commands",
    "analyze": "maintenance commands",
    "cluster": "maintenance commands",
    "reindex": "maintenance commands",
    "checkpoint": "maintenance commands",
    "load": "LOAD of libraries",
    "security": "security labels",
    "import": "IMPORT FOREIGN SCHEMA",
    "refresh": "REFRESH MATERIALIZED VIEW",
    "discard": "DISCARD",
    "comment": "COMMENT",
    "reassign": "REASSIGN OWNED",
}
# The role is the real fence, but the login that runs the query may switch back to itself with
# set_config('role', ...) (SET ROLE checks the session user), and these functions run SQL held in a
# string, where a name check cannot see. Refused by name, quotes and case ignored.
_ESCAPES: Final = re.compile(
    r"\b(set_config|query_to_xml\w*|cursor_to_xml\w*|ts_stat|ts_rewrite|dblink\w*)\b", re.IGNORECASE
)
_LEADING: Final = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/|\()*", re.DOTALL)


def first_keyword(query: str) -> str:
    """The statement's first word, lower case, after leading comments and parentheses."""
    rest = query[_LEADING.match(query).end() :]  # type: ignore[union-attr]
    match = re.match(r"[A-Za-z_]+", rest)
    return match.group(0).lower() if match else ""


def check_query(query: str) -> str:
    """Refuse anything but one read-only statement; return the statement to run.

    Raises:
        SqlRefused: with what was refused and why.
    """
    text = query_text(query)
    keyword = first_keyword(text)
    if keyword not in _ALLOWED:
        what = _WHAT.get(keyword, keyword.upper() or "this statement")
        raise SqlRefused(f"read-only sandbox: {what} is not allowed; only SELECT queries run here")
    if re.search(r"\bu&['\"]", text, re.IGNORECASE):
        raise SqlRefused("read-only sandbox: Unicode-escaped names and strings (U&) are not allowed")
    match = _ESCAPES.search(text.replace('"', ""))
    if match:
        raise SqlRefused(
            f"read-only sandbox: {match.group(1).lower()}() is not allowed (it could change the role "
            "or run SQL held in a string)"
        )
    return text


def run_query(
    ledger: AnalystSource,
    query: str,
    *,
    max_rows: int = 1000,
    timeout: timedelta = timedelta(seconds=10),
    work_mem_mb: int = 64,
    backend_nice: int | None = None,
) -> QueryResult:
    """Run one read-only query on the ledger under its analyst role; the same result shape as ``engine.ledger.sandbox``.

    ``backend_nice`` (0-19): lower a local backend's CPU priority to it first; pass it only with a
    ledger whose connections serve analysts alone (the priority cannot be raised back).

    Raises:
        SqlRefused: the query is not a single read-only statement, lacks the rights it needs (writes,
            sequences, server files), times out or fails.
    """
    text = check_query(query)
    role = ledger.analyst_role
    try:
        with ledger.connection() as conn, conn.transaction(force_rollback=True):
            if backend_nice is not None:
                lower_backend_priority(conn, backend_nice)
            return _run(conn, text, role, max_rows, timeout, work_mem_mb)
    except SqlRefused:
        raise
    except pg_errors.QueryCanceled as exc:
        raise SqlRefused(
            f"query stopped after {timeout.total_seconds():g} s (statement_timeout, the time limit for "
            "one query)"
        ) from exc
    except (pg_errors.OutOfMemory, pg_errors.ConfigurationLimitExceeded) as exc:
        raise SqlRefused(
            f"query needs more memory or temporary space than the analyst limits allow "
            f"(work_mem={work_mem_mb} MB per sort or hash): {_first_line(exc)}"
        ) from exc
    except pg_errors.InsufficientPrivilege as exc:
        raise SqlRefused(f"refused by the read-only role {role}: {_first_line(exc)}") from exc
    except pg_errors.ReadOnlySqlTransaction as exc:
        raise SqlRefused(f"refused by the read-only transaction: {_first_line(exc)}") from exc
    except pg_errors.SyntaxError as exc:
        if "multiple commands" in str(exc):
            raise SqlRefused("one statement at a time") from exc
        raise SqlRefused(f"query failed: {_first_line(exc)}") from exc
    except pg.Error as exc:
        raise SqlRefused(f"query failed: {_first_line(exc)}") from exc


def _run(
    conn: pg.Connection[TupleRow],
    text: str,
    role: str,
    max_rows: int,
    timeout: timedelta,
    work_mem_mb: int,
) -> QueryResult:
    conn.execute("SET TRANSACTION READ ONLY")
    conn.execute(
        "SELECT set_config('statement_timeout', %s, true)",
        [f"{max(1, int(timeout.total_seconds() * 1000))}ms"],
    )
    conn.execute("SELECT set_config('work_mem', %s, true)", [f"{max(1, int(work_mem_mb))}MB"])
    conn.execute("SELECT set_config('max_parallel_workers_per_gather', '0', true)")
    try:
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
    except pg.Error as exc:
        raise SqlRefused(
            f"analyst SQL is unavailable: cannot switch to the read-only role {role} "
            f"(the ledger's login must be able to create it, or be granted it): {_first_line(exc)}"
        ) from exc
    started = time.perf_counter()
    if first_keyword(text) == "explain":
        # Binary results force the extended protocol, which runs exactly one statement.
        with conn.cursor() as cur:
            cur.execute(text, binary=True)
            columns = [d.name for d in cur.description or ()]
            rows = cur.fetchmany(max_rows + 1)
    else:
        # A server-side cursor: DECLARE takes one SELECT (no data-modifying WITH) and only the
        # rows fetched leave the server.
        with conn.cursor(name="finality_analyst_query") as cur:
            cur.execute(text)
            columns = [d.name for d in cur.description or ()]
            rows = cur.fetchmany(max_rows + 1)
    elapsed = (time.perf_counter() - started) * 1000
    truncated = len(rows) > max_rows
    return QueryResult(columns, [list(r) for r in rows[:max_rows]], truncated, elapsed)


def _local(host: str) -> bool:
    if not host or host.startswith("/") or host == "localhost":
        return True  # a Unix socket (or the default one)
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def lower_backend_priority(conn: pg.Connection[TupleRow], nice: int) -> int | None:
    """Lower the connection's backend process by ``engine.priority.lower`` (niceness ``nice``, at the
    lowest also the idle scheduling class) if it is a local PostgreSQL process, and its autogroup with
    it; return its niceness then, or None when it is not ours to change (a remote server, or the
    platform refuses: another user's process without the privilege). Never raises a priority."""
    if not _local(conn.info.host):
        return None
    pid = conn.info.backend_pid
    proc = f"/proc/{pid}"
    try:
        # The pid is the server's: on this machine only if it names a postgres process.
        with open(f"{proc}/comm") as comm:
            if not comm.read().startswith("postgres"):
                return None
    except OSError:
        return None
    reached = lower(pid, nice)
    if reached is None:
        return None
    with suppress(OSError):
        # PostgreSQL starts every backend in a session of its own, and with Linux's autogroup
        # scheduling a session is a group of its own, weighed against the other groups by the
        # group's niceness: the process's alone would change nothing. Only for a backend that
        # leads its session, so the rest of the server is never touched.
        if os.getsid(pid) == pid:
            with open(f"{proc}/autogroup") as group:
                current = int(group.read().split()[-1])
            if current < nice:
                with open(f"{proc}/autogroup", "w") as group:
                    group.write(str(nice))
    return reached


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


__all__ = [
    "AnalystSource",
    "check_query",
    "first_keyword",
    "lower_backend_priority",
    "run_query",
]
