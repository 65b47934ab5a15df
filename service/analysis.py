"""The analysts' reads of a running service: SQL (JSON rows or Arrow), and snapshots they can open.

Two implementations of one shape, chosen by the ledger:

* ``DuckDbReads``: the service owns the ledger file (one writing process), so analyst SQL runs in
  the sandbox (``engine.ledger.sandbox``) over a private snapshot no older than ``max_age`` or
  ``SNAPSHOT_DUTY`` times the CPU time the last one took to make, whichever is longer (a copy of the
  whole ledger costs CPU that grows with the ledger: so readers spend at most about a tenth of
  their time making snapshots however large it grows; each answer says its snapshot's age), and
  ``publish`` writes a snapshot an analyst can open with plain ``duckdb.connect(FILE, read_only=True)``:
  copied in one read transaction, its as-of instant recorded inside (table ``snapshot_info``),
  made under a temporary name and renamed into place, the last ``keep`` kept.
* ``PgReads``: analyst SQL in place on PostgreSQL (read-only transaction, read-only role), on a
  pool of its own so a slow query never holds a connection the executor needs; there is no file
  to publish (analysts read the same data through the read-only role).

On DuckDB the queries themselves run in reader processes (``service.reader_process``) when the
service gives ``processes``: this process makes the snapshot (it alone may open the ledger file),
the child runs the query on it and encodes the answer, and ``query_json`` / ``arrow_ipc`` hand its
bytes on unread. Without ``processes`` (a library caller) the query runs on the calling thread.
On PostgreSQL the query runs in the cluster's (niced) analyst backend and the calling thread only
waits for its rows (psycopg releases the interpreter's lock meanwhile) and encodes at most
``max_rows`` of them: no process of its own is needed to keep it off the loop.

Every method blocks: callers run them on the readers' pool (``service.readers``), never on the
executor's loop. Holds no limits of its own: they come from ``AnalystConfig``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from engine.clock import Clock, monotonic_seconds, thread_cpu_seconds
from engine.errors import SqlRefused
from engine.ledger.port import SnapshotSource
from engine.ledger.sandbox import (
    QueryResult,
    SandboxLimits,
    arrow_stream_bytes,
    run_arrow,
    run_query,
    stamp_snapshot,
)
from service.config import AnalystConfig
from service.reader_process import MB, ReaderProcesses, capped

if TYPE_CHECKING:  # only a PostgreSQL service builds PgReads: a DuckDB one never loads psycopg
    from engine.ledger.postgres import PgLedger

SNAPSHOT_MAX_AGE = timedelta(seconds=5)
SNAPSHOT_DUTY = 10
"""A private snapshot is kept at least this many times as long as it took to make."""
SNAPSHOT_PREFIX = "finality-snapshot-"


class AnalystReads(Protocol):
    snapshotting: bool
    """Whether the reads are over published snapshot files (which the service refreshes now and then)."""

    def query(self, query: str, max_rows: int) -> dict[str, object]: ...

    def query_json(self, query: str, max_rows: int) -> bytes:
        """The answer of ``POST /api/v1/sql``, encoded."""
        ...

    def arrow(self, query: str, max_rows: int) -> pa.Table: ...

    def arrow_ipc(self, query: str, max_rows: int) -> bytes:
        """The answer of ``POST /api/v1/sql/arrow``: one Arrow IPC stream."""
        ...

    def reader_processes(self) -> list[dict[str, int]]:
        """The reader processes running the queries now (pid and niceness); none on PostgreSQL."""
        ...

    def publish(self) -> dict[str, object]: ...

    def snapshots(self) -> list[dict[str, object]]: ...

    def snapshot_path(self, name: str) -> Path: ...


def _arrow_from_rows(columns: list[str], rows: list[list[object]]) -> pa.Table:
    return pa.table({name: [row[i] for row in rows] for i, name in enumerate(columns)})


@dataclass
class DuckDbReads:
    """Analyst reads over snapshots of a DuckDB ledger this process owns."""

    ledger: SnapshotSource
    folder: Path
    clock: Clock
    config: AnalystConfig = field(default_factory=AnalystConfig)
    published: Path | None = None
    max_age: timedelta = SNAPSHOT_MAX_AGE
    snapshotting: bool = True
    monotonic: Callable[[], float] = monotonic_seconds
    cpu: Callable[[], float] = thread_cpu_seconds
    """The making thread's CPU time (DuckDB runs a snapshot on its caller's thread: one thread)."""
    processes: ReaderProcesses | None = None
    """Where the queries run; None: on the calling thread."""
    _made_at: float | None = None
    _making_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _publish_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def limits(self) -> SandboxLimits:
        return SandboxLimits(memory_limit_mb=self.config.memory_limit_mb, threads=self.config.threads)

    def _fresh(self) -> Path:
        """The private SQL snapshot, remade when older than ``max_age`` and than ``SNAPSHOT_DUTY``
        times its own making's CPU time (one maker at a time).

        CPU, not wall time: the readers' threads are niced, and on a busy machine a snapshot that
        costs 0.1 CPU-s can take 10 s to get its CPU; counted in wall time, that kept the snapshot
        for 100 s, and every chart of a console showed nothing newer (found by the living demo's
        chart test under load: operations stayed empty past 30 s)."""
        path = self.folder / "analyst-snapshot.duckdb"
        with self._lock:
            now = self.monotonic()
            keep = max(self.max_age.total_seconds(), SNAPSHOT_DUTY * self._making_s)
            if self._made_at is None or now - self._made_at > keep:
                spent = self.cpu()
                self.ledger.snapshot(path)
                self._made_at = self.monotonic()
                self._making_s = self.cpu() - spent
        return path

    def _age(self) -> float:
        now = self.monotonic()
        return round(now - (self._made_at or now), 3)

    def _in_process(self, op: str, query: str, max_rows: int) -> bytes:
        """The query run by a reader process on a fresh snapshot: the answer's bytes, unread."""
        assert self.processes is not None
        path = self._fresh()
        most = self.config.max_result_mb * MB
        request: dict[str, object] = {
            "op": op,
            "path": str(path),
            "query": query,
            "max_rows": max_rows,
            "timeout_s": self.config.timeout.total_seconds(),
            "memory_limit_mb": self.config.memory_limit_mb,
            "threads": self.config.threads,
            "max_bytes": most,
            "extra": {"snapshot_age_s": self._age()},
        }
        kind, body = self.processes.call(request, self.config.timeout.total_seconds(), most)
        if kind == "E":
            raise SqlRefused(str(json.loads(body)["message"]))
        return body

    def query_json(self, query: str, max_rows: int) -> bytes:
        if self.processes is not None:
            return self._in_process("query", query, max_rows)
        path = self._fresh()
        age = self._age()
        # The snapshot is ours alone and replaced by rename, so the sandbox may stay attached to it.
        result = run_query(
            path,
            query,
            max_rows=max_rows,
            timeout=self.config.timeout,
            keep_open=True,
            limits=self.limits,
        )
        return capped(result.json_bytes(snapshot_age_s=age), self.config.max_result_mb * MB)

    def query(self, query: str, max_rows: int) -> dict[str, object]:
        answer: dict[str, object] = json.loads(self.query_json(query, max_rows))
        return answer

    def arrow_ipc(self, query: str, max_rows: int) -> bytes:
        if self.processes is not None:
            return self._in_process("arrow", query, max_rows)
        return capped(arrow_stream_bytes(self.arrow(query, max_rows)), self.config.max_result_mb * MB)

    def arrow(self, query: str, max_rows: int) -> pa.Table:
        if self.processes is not None:
            return pa.ipc.open_stream(self.arrow_ipc(query, max_rows)).read_all()
        path = self._fresh()
        return run_arrow(
            path, query, max_rows=max_rows, timeout=self.config.timeout, keep_open=True, limits=self.limits
        )

    def reader_processes(self) -> list[dict[str, int]]:
        return self.processes.processes() if self.processes is not None else []

    # ------------------------------------------------------------------------------- snapshots

    @property
    def snapshot_dir(self) -> Path:
        return self.published or self.folder / "snapshots"

    def publish(self) -> dict[str, object]:
        """Write a snapshot analysts can open; return its name, path, as-of instant and size."""
        folder = self.snapshot_dir
        folder.mkdir(parents=True, exist_ok=True)
        with self._publish_lock:
            # Taken before the copy's read transaction starts: everything committed by then is in.
            as_of = self.clock.now()
            name = f"{SNAPSHOT_PREFIX}{as_of.strftime('%Y%m%dT%H%M%S%fZ')}.duckdb"
            work = folder / f".{name}.making"
            final = folder / name
            self.ledger.snapshot(work)
            stamp_snapshot(work, as_of, self.ledger.path)
            os.replace(work, final)
            self._prune(folder)
        return {"name": name, "path": str(final), "as_of": as_of.isoformat(), "bytes": final.stat().st_size}

    def _prune(self, folder: Path) -> None:
        kept = sorted(folder.glob(f"{SNAPSHOT_PREFIX}*.duckdb"))
        for old in kept[: max(0, len(kept) - self.config.snapshot_keep)]:
            old.unlink(missing_ok=True)

    def snapshots(self) -> list[dict[str, object]]:
        folder = self.snapshot_dir
        if not folder.exists():
            return []
        return [
            {"name": p.name, "path": str(p), "bytes": p.stat().st_size}
            for p in sorted(folder.glob(f"{SNAPSHOT_PREFIX}*.duckdb"), reverse=True)
        ]

    def snapshot_path(self, name: str) -> Path:
        if "/" in name or not name.startswith(SNAPSHOT_PREFIX) or not name.endswith(".duckdb"):
            raise SqlRefused(f"no snapshot named {name!r}")
        path = self.snapshot_dir / name
        if not path.exists():
            raise SqlRefused(
                f"no snapshot named {name!r} (only the last {self.config.snapshot_keep} are kept)"
            )
        return path


@dataclass
class PgReads:
    """Analyst reads in place on PostgreSQL, on ``reader``: a pool apart from the executor's."""

    reader: PgLedger
    config: AnalystConfig = field(default_factory=AnalystConfig)
    snapshotting: bool = False

    def _run(self, query: str, max_rows: int) -> QueryResult:
        from engine.ledger.analyst import run_query as run_pg_query

        # The reader pool's connections serve analysts alone, so their backends may be niced.
        return run_pg_query(
            self.reader,
            query,
            max_rows=max_rows,
            timeout=self.config.timeout,
            work_mem_mb=self.config.work_mem_mb,
            backend_nice=self.config.nice,
        )

    def query(self, query: str, max_rows: int) -> dict[str, object]:
        result = self._run(query, max_rows).as_json()
        result["snapshot_age_s"] = 0.0
        return result

    def query_json(self, query: str, max_rows: int) -> bytes:
        answer = self._run(query, max_rows).json_bytes(snapshot_age_s=0.0)
        return capped(answer, self.config.max_result_mb * MB)

    def arrow_ipc(self, query: str, max_rows: int) -> bytes:
        return capped(arrow_stream_bytes(self.arrow(query, max_rows)), self.config.max_result_mb * MB)

    def reader_processes(self) -> list[dict[str, int]]:
        return []

    def arrow(self, query: str, max_rows: int) -> pa.Table:
        result = self._run(query, max_rows)
        if result.truncated:
            raise SqlRefused(
                f"the result has more than max_rows={max_rows:,} rows; raise max_rows (up to the "
                "service's limit) or narrow the query"
            )
        return _arrow_from_rows(result.columns, result.rows)

    def publish(self) -> dict[str, object]:
        raise SqlRefused(
            "a PostgreSQL ledger has no snapshot file: analysts read it in place through the read-only "
            f"role {self.reader.analyst_role} (POST /api/v1/sql, or finality export --parquet)"
        )

    def snapshots(self) -> list[dict[str, object]]:
        return []

    def snapshot_path(self, name: str) -> Path:
        raise SqlRefused("a PostgreSQL ledger has no snapshot files")


__all__ = [
    "SNAPSHOT_DUTY",
    "SNAPSHOT_MAX_AGE",
    "SNAPSHOT_PREFIX",
    "AnalystReads",
    "DuckDbReads",
    "PgReads",
]
