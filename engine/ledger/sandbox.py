"""The analysts' SQL sandbox: read-only queries on a ledger snapshot, never on the live ledger.

Each query runs in a fresh in-memory DuckDB that ATTACHes a snapshot file READ_ONLY, then turns
external access off and locks its configuration, so files, extensions, other databases and
settings are out of reach. Only a single SELECT (or EXPLAIN) statement is accepted; everything else
is refused with a clear message before it runs. Each query is bounded in time (``timeout``), in
memory (DuckDB ``memory_limit``, with spilling to disk off so the limit is the limit) and in
threads (``threads``), and its result in rows (``max_rows``); a query over a limit fails with
``SqlRefused`` naming the limit, and the process that runs it goes on.

Snapshots are made by the process that owns the ledger (``Ledger.snapshot``); readers with no
service running may point the sandbox at a ledger file directly, which it attaches read-only.

Attaching costs tens of milliseconds (more on a large ledger). For files only the sandbox reads
(the service's snapshots) ``keep_open=True`` lets each thread keep its last sandbox and reuse it
while the attached file is the same file, unchanged (inode, size and modification time); a
replaced snapshot gets a fresh sandbox. Reuse is safe because the sandbox accepts only single
read-only statements and its configuration is locked: no query can leave anything behind for the
next. It is off by default because DuckDB refuses to open a file in-process a second time while
a sandbox holds it. ``close_sandboxes`` drops the calling thread's sandbox.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pyarrow as pa

from engine.errors import SqlRefused
from engine.ledger import duckdb_client as duck

_ALLOWED = {"StatementType.SELECT", "StatementType.EXPLAIN"}
_WHAT = {
    "StatementType.INSERT": "writes (INSERT)",
    "StatementType.UPDATE": "writes (UPDATE)",
    "StatementType.DELETE": "writes (DELETE)",
    "StatementType.CREATE": "creating objects",
    "StatementType.DROP": "dropping objects",
    "StatementType.ALTER": "altering objects",
    "StatementType.COPY": "COPY (files are out of reach)",
    "StatementType.ATTACH": "ATTACH (other databases are out of reach)",
    "StatementType.DETACH": "DETACH",
    "StatementType.LOAD": "INSTALL/LOAD of extensions",
    "StatementType.SET": "changing settings",
    "StatementType.PRAGMA": "PRAGMA",
    "StatementType.EXPORT": "EXPORT",
    "StatementType.TRANSACTION": "transaction control",
    "StatementType.CALL": "CALL",
}
# Table functions that read files or reach outside; refused by name too, so the message is clear
# even before DuckDB's own external-access check refuses them.
_FILE_FUNCTIONS = re.compile(
    r"\b(read_\w+|glob|parquet_\w+|sniff_csv|iceberg_\w+|delta_scan|sqlite_\w+|postgres_\w+|mysql_\w+|"
    r"httpfs\w*|duckdb_secrets|getenv|current_setting|which_secret)\s*\(",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: list[str]
    rows: list[list[object]]
    truncated: bool
    elapsed_ms: float

    def as_json(self) -> dict[str, object]:
        return {
            "columns": self.columns,
            "rows": [[_plain(v) for v in row] for row in self.rows],
            "truncated": self.truncated,
            "row_count": len(self.rows),
            "elapsed_ms": round(self.elapsed_ms, 1),
        }

    def json_bytes(self, **extra: object) -> bytes:
        """The answer of ``POST /api/v1/sql``: ``as_json`` with ``extra`` keys, encoded."""
        return json.dumps({**self.as_json(), **extra}, default=str).encode()


def _plain(value: object) -> object:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def query_text(query: str) -> str:
    """The statement's text without surrounding blanks and a final ``;`` (both SQL read paths).

    Raises:
        SqlRefused: the query is empty or longer than 100,000 characters.
    """
    text = query.strip().rstrip(";").strip()
    if not text:
        raise SqlRefused("empty query")
    if len(text) > 100_000:
        raise SqlRefused("query longer than 100,000 characters")
    return text


def check_query(query: str) -> None:
    """Refuse anything but one read-only statement.

    Raises:
        SqlRefused: with what was refused and why.
    """
    text = query_text(query)
    try:
        statements = _parser().extract_statements(text)
    except duck.Error as exc:
        raise SqlRefused(f"cannot parse the query: {exc}") from exc
    if len(statements) != 1:
        raise SqlRefused(f"one statement at a time, got {len(statements)}")
    kind = str(statements[0].type)
    if kind not in _ALLOWED:
        what = _WHAT.get(kind, kind.removeprefix("StatementType."))
        raise SqlRefused(f"read-only sandbox: {what} is not allowed; only SELECT queries run here")
    match = _FILE_FUNCTIONS.search(text)
    if match:
        raise SqlRefused(
            f"read-only sandbox: {match.group(1)}() reaches outside the ledger and is not allowed"
        )


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """What one sandboxed query may use; the defaults are the service's unless its config says otherwise."""

    memory_limit_mb: int = 512
    threads: int = 1

    def __post_init__(self) -> None:
        if self.memory_limit_mb < 16 or self.threads < 1:
            raise ValueError("a sandbox needs memory_limit_mb >= 16 and threads >= 1")


DEFAULT_LIMITS = SandboxLimits()


def run_query(
    source: str | Path,
    query: str,
    *,
    max_rows: int = 1000,
    timeout: timedelta = timedelta(seconds=10),
    keep_open: bool = False,
    limits: SandboxLimits = DEFAULT_LIMITS,
) -> QueryResult:
    """Run one read-only query against a ledger snapshot (or file), attached as ``ledger`` and set as default.

    Raises:
        SqlRefused: the query is not a single read-only statement, reaches outside, runs over its
            time or memory limit (named), or fails.
    """
    check_query(query)
    con = _sandbox(Path(source), limits)
    try:
        return _run(con, query, max_rows, timeout, limits)
    finally:
        if not keep_open:
            close_sandboxes()


def run_arrow(
    source: str | Path,
    query: str,
    *,
    max_rows: int,
    timeout: timedelta = timedelta(seconds=10),
    keep_open: bool = False,
    limits: SandboxLimits = DEFAULT_LIMITS,
) -> pa.Table:
    """The same query as ``run_query``, its result as an Arrow table of at most ``max_rows`` rows.

    Raises:
        SqlRefused: as ``run_query``, and when the result has more than ``max_rows`` rows (named:
            a frame is never silently cut).
    """
    check_query(query)
    con = _sandbox(Path(source), limits)
    try:
        with _deadline(con, timeout, limits):
            relation = con.sql(query)
            if relation is None:
                raise SqlRefused("the statement returns no result")
            reader = relation.to_arrow_reader(min(max_rows + 1, 65_536))
            batches: list[pa.RecordBatch] = []
            seen = 0
            for batch in reader:
                seen += batch.num_rows
                if seen > max_rows:
                    raise SqlRefused(
                        f"the result has more than max_rows={max_rows:,} rows; raise max_rows (up to the "
                        "service's limit) or narrow the query"
                    )
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=reader.schema)
    finally:
        if not keep_open:
            close_sandboxes()


def arrow_stream_bytes(table: pa.Table) -> bytes:
    """A table as the bytes of one Arrow IPC stream (what ``POST /api/v1/sql/arrow`` answers)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


@contextmanager
def _deadline(con: duck.Connection, timeout: timedelta, limits: SandboxLimits) -> Iterator[None]:
    """Interrupt the query at ``timeout``; turn DuckDB's limit errors into refusals naming the limit."""
    timer = threading.Timer(timeout.total_seconds(), con.interrupt)
    timer.start()
    try:
        yield
    except duck.InterruptException as exc:
        close_sandboxes()
        raise SqlRefused(
            f"query stopped after {timeout.total_seconds():g} s (the time limit for one query)"
        ) from exc
    except duck.OutOfMemoryException as exc:
        close_sandboxes()
        raise SqlRefused(
            f"query needs more memory than the sandbox's memory_limit of {limits.memory_limit_mb} MB "
            f"(threads={limits.threads}); narrow it or aggregate first: {str(exc).splitlines()[0]}"
        ) from exc
    except duck.Error as exc:
        raise SqlRefused(f"query failed: {exc}") from exc
    finally:
        timer.cancel()
        _finish(con)


def _finish(con: duck.Connection) -> None:
    """Drop a result left part-read (rows past max_rows), so a reused sandbox takes the next query."""
    abort = getattr(con, "abort", None)  # DuckDB >= 2 insists; older versions drop it on the next execute
    if abort is not None:
        with suppress(duck.Error):
            abort()


def _run(
    con: duck.Connection, query: str, max_rows: int, timeout: timedelta, limits: SandboxLimits
) -> QueryResult:
    started = time.perf_counter()
    with _deadline(con, timeout, limits):
        cur = con.execute(query)
        columns = [d[0] for d in cur.description or ()]
        rows = cur.fetchmany(max_rows + 1)
    elapsed = (time.perf_counter() - started) * 1000
    truncated = len(rows) > max_rows
    return QueryResult(columns, [list(r) for r in rows[:max_rows]], truncated, elapsed)


_local = threading.local()


def _parser() -> duck.Connection:
    """A connection used only to split and classify statements (no data, reused per thread)."""
    con: duck.Connection | None = getattr(_local, "parser", None)
    if con is None:
        con = duck.connect(":memory:")
        _local.parser = con
    return con


def _identity(path: Path) -> tuple[str, int, int, int]:
    try:
        st = path.stat()
    except OSError as exc:
        raise SqlRefused(f"cannot open the ledger for reading: {exc.strerror}") from exc
    return (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)


def _sandbox(path: Path, limits: SandboxLimits) -> duck.Connection:
    """This thread's sandbox on ``path``: reused while the file (and the limits) are unchanged."""
    identity = (*_identity(path), limits.memory_limit_mb, limits.threads)
    cached: tuple[tuple[object, ...], duck.Connection] | None = getattr(_local, "sandbox", None)
    if cached is not None and cached[0] == identity:
        return cached[1]
    close_sandboxes()
    con = _attach(path, limits)
    _local.sandbox = (identity, con)
    return con


def _attach(path: Path, limits: SandboxLimits) -> duck.Connection:
    """A fresh in-memory DuckDB with ``path`` attached read-only as ``ledger``, its limits set and locked."""
    _identity(path)  # a missing file is refused in the sandbox's words
    con = duck.connect(":memory:")
    try:
        quoted = str(path).replace("'", "''")
        con.execute(f"ATTACH '{quoted}' AS ledger (READ_ONLY)")
        con.execute("USE ledger")
        con.execute(f"SET memory_limit = '{int(limits.memory_limit_mb)}MB'")
        con.execute(f"SET threads = {int(limits.threads)}")
        # No spilling: a query over the memory limit fails naming it instead of filling the disk.
        con.execute("SET max_temp_directory_size = '0KiB'")
        # No progress bar: it prints from the query's thread into the service's own output.
        # In a Jupyter kernel (the analysts' notebook) DuckDB refuses to change the setting without
        # ipywidgets; nothing prints into a service there, so the default stands.
        with suppress(duck.InvalidInputException):
            con.execute("SET enable_progress_bar = false")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except duck.Error as exc:
        con.close()
        raise SqlRefused(f"cannot open the ledger for reading: {exc}") from exc
    return con


class SharedSandbox:
    """One sandbox on a ledger file shared by the reads that overlap in time (a console page's reads).

    The file is attached by the first read of a burst, and detached as soon as no read runs and
    nobody holds it (``held``): a page opened on a ledger file pays one attach instead of one per
    query, and between bursts the file is free for a writer (``finality serve``) to open, as with a
    fresh attach per query. Each read runs on a connection of its own to that one database
    (concurrent reads run side by side); the limits are the sandbox's, so the memory limit is shared
    by the reads running at once. The file cannot change while it is attached (a writer cannot open
    it); a file replaced between bursts is attached afresh.
    """

    def __init__(self, path: str | Path, limits: SandboxLimits = DEFAULT_LIMITS) -> None:
        self.path = Path(path)
        self.limits = limits
        self._lock = threading.Lock()
        self._con: duck.Connection | None = None
        self._users = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        """Keep the file attached for the reads made meanwhile (by any thread)."""
        self._enter()
        try:
            yield
        finally:
            self._leave()

    def query(
        self, query: str, *, max_rows: int = 1000, timeout: timedelta = timedelta(seconds=10)
    ) -> QueryResult:
        """``run_query``'s rules and limits, on the shared attach.

        Raises:
            SqlRefused: as ``run_query``.
        """
        check_query(query)
        with self.held():
            con = self._attached().cursor()
            try:
                con.execute("USE ledger")
                return _run(con, query, max_rows, timeout, self.limits)
            finally:
                con.close()

    def _attached(self) -> duck.Connection:
        # Attached by the first read, not by ``held``: a render whose reads all come from a cache
        # attaches nothing.
        with self._lock:
            if self._con is None:
                self._con = _attach(self.path, self.limits)
            return self._con

    def _enter(self) -> None:
        with self._lock:
            self._users += 1

    def _leave(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._con is not None:
                self._con.close()
                self._con = None


def close_sandboxes() -> None:
    """Close the calling thread's cached sandbox (the next query attaches afresh)."""
    cached = getattr(_local, "sandbox", None)
    _local.sandbox = None
    if cached is not None:
        cached[1].close()


SNAPSHOT_INFO_TABLE = "snapshot_info"


def stamp_snapshot(path: str | Path, as_of: datetime, source: str) -> None:
    """Record a snapshot file's as-of instant inside it (table ``snapshot_info``), before it is published."""
    con = duck.connect(str(path))
    try:
        con.execute(
            f"CREATE OR REPLACE TABLE {SNAPSHOT_INFO_TABLE} (as_of TIMESTAMPTZ NOT NULL, source VARCHAR)"
        )
        con.execute(f"INSERT INTO {SNAPSHOT_INFO_TABLE} VALUES (?, ?)", [as_of, source])
        con.execute("CHECKPOINT")
    finally:
        con.close()


__all__ = [
    "DEFAULT_LIMITS",
    "SNAPSHOT_INFO_TABLE",
    "QueryResult",
    "SandboxLimits",
    "SharedSandbox",
    "arrow_stream_bytes",
    "check_query",
    "close_sandboxes",
    "run_arrow",
    "run_query",
    "stamp_snapshot",
]
