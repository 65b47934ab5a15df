"""The one definition of the six gates' raw inputs: a single SQL statement and its row -> inputs conversion.

``GATE_INPUTS_SQL`` is one read-only SELECT over the ledger's tables (unqualified names), returning
one row. It runs unchanged in two places: on the ledger's own connection (``Ledger.gate_inputs``,
used by the rollout controller, ``finality gates`` and ``GET /api/v1/gates``) and as a sandboxed
query on a snapshot or a read-only ledger file (the console, ``engine.insights``). The only
parameter, ``{now}``, is filled with a ``TIMESTAMPTZ`` literal by ``gate_inputs_sql`` (the sandbox
takes no bound parameters, so the text carries the instant itself).

``gate_inputs_from_row`` turns that row (column name -> value) into the nested shape
``rollout.gates.evaluate`` takes; the inputs are hashed into the rollout audit chain, so counts
come out as ``int``, measurements as ``float`` (or None) and ``last_run_at`` as an aware datetime,
whichever way the row travelled (DuckDB values, or JSON through the service).

Pure: no database access here (no duckdb import), no clock reads.

Definitions (each a whole-ledger aggregate; a million operations read in about a second):

* terminal_divergence: explorer runs with the engine's rules; summed distinct interleavings and
  divergent ones; when the last finished.
* duplicate_operations: operations; operations bound to more than one server task; operations
  resubmitted after a proof of absence (``submit_attempts > 0``).
* poll_amplification: protocol requests; the busiest sliding one-second window (exact; only the
  seconds whose pair of whole-second buckets could beat the busiest single bucket are counted
  exactly, because any one-second window lies within two consecutive whole seconds); the
  configured global QPS (``settings.global_qps``).
* cancel_confirmation: cancels confirmed by a receipt, their p99 and max latency from the cancel
  request to acceptance; cancels still pending and the oldest one's age at ``now``.
* unknown_reconciliation: UNKNOWN reconciliation entries; open ones; the oldest open one's age; the
  p99 age (open: at ``now``; resolved: time to resolution); the slowest resolution.
* traceability: outbox rows; those without a receipt of the same call node, status and digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final

GATE_INPUTS_TEMPLATE: Final = """
WITH
explorer AS (
  SELECT count(*) AS runs, coalesce(sum(distinct_interleavings), 0) AS interleavings,
         coalesce(sum(divergent), 0) AS divergent, max(finished_at) AS last_run_at
  FROM explorer_runs WHERE rules = 'engine'
),
ops AS (SELECT count(*) AS n, count(*) FILTER (WHERE submit_attempts > 0) AS resubmitted FROM op_state),
dups AS (
  SELECT count(*) AS n FROM (SELECT operation_id FROM task_bindings GROUP BY operation_id HAVING count(*) > 1)
),
b AS (SELECT epoch_us(sent_at) // 1000000 AS sec, count(*) AS n FROM polls GROUP BY ALL),
best AS (SELECT coalesce(max(n), 0) AS n FROM b),
cand AS (
  SELECT b.sec FROM b LEFT JOIN b AS nxt ON nxt.sec = b.sec + 1
  WHERE b.n + coalesce(nxt.n, 0) > (SELECT n FROM best)
),
near AS (SELECT sec FROM cand UNION SELECT sec + 1 FROM cand),
w AS (
  SELECT count(*) OVER (ORDER BY sent_at RANGE BETWEEN CURRENT ROW AND INTERVAL 999999 MICROSECONDS FOLLOWING) AS n
  FROM polls WHERE epoch_us(sent_at) // 1000000 IN (SELECT sec FROM near)
),
cancels AS (
  SELECT count(*) AS confirmed,
         quantile_cont(epoch(r.accepted_at) - epoch(s.cancel_requested_at), 0.99) AS p99_s,
         max(epoch(r.accepted_at) - epoch(s.cancel_requested_at)) AS max_s
  FROM op_state s JOIN receipts r USING (operation_id) WHERE s.cancel_requested_at IS NOT NULL
),
pending AS (
  SELECT count(*) AS n, max(epoch({now}) - epoch(cancel_requested_at)) AS oldest_s FROM op_state
  WHERE cancel_requested_at IS NOT NULL AND state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED')
),
unknown AS (
  SELECT count(*) AS entries, count(*) FILTER (WHERE status = 'open') AS open,
         max(CASE WHEN status = 'open' THEN epoch({now}) - epoch(opened_at) END) AS oldest_open_s,
         quantile_cont(CASE WHEN status = 'open' THEN epoch({now}) - epoch(opened_at)
                       ELSE epoch(resolved_at) - epoch(opened_at) END, 0.99) AS p99_age_s,
         max(CASE WHEN status = 'resolved' THEN epoch(resolved_at) - epoch(opened_at) END) AS slowest_resolution_s
  FROM reconciliation WHERE kind = 'unknown'
),
trace AS (
  SELECT count(*) AS outbox_rows,
         count(*) FILTER (WHERE r.call_node_id IS NULL OR r.status <> o.terminal_status
                          OR r.result_digest IS DISTINCT FROM o.result_digest) AS untraceable
  FROM outbox o LEFT JOIN receipts r USING (call_node_id)
)
SELECT explorer.runs AS explorer_runs, explorer.interleavings, explorer.divergent, explorer.last_run_at,
       ops.n AS operations, dups.n AS operations_with_second_server_task, ops.resubmitted,
       (SELECT count(*) FROM polls) AS requests,
       greatest((SELECT n FROM best), coalesce((SELECT max(n) FROM w), 0)) AS busiest_1s_window,
       (SELECT TRY_CAST(value AS DOUBLE) FROM settings WHERE key = 'global_qps') AS configured_qps,
       cancels.confirmed, cancels.p99_s, cancels.max_s, pending.n AS pending, pending.oldest_s AS oldest_pending_s,
       unknown.entries, unknown.open, unknown.oldest_open_s, unknown.p99_age_s, unknown.slowest_resolution_s,
       trace.outbox_rows, trace.untraceable
FROM explorer, ops, dups, cancels, pending, unknown, trace
"""
"""The statement with a ``{now}`` placeholder (the only one); fill it with ``gate_inputs_sql``."""

COLUMNS: Final = (
    "explorer_runs",
    "interleavings",
    "divergent",
    "last_run_at",
    "operations",
    "operations_with_second_server_task",
    "resubmitted",
    "requests",
    "busiest_1s_window",
    "configured_qps",
    "confirmed",
    "p99_s",
    "max_s",
    "pending",
    "oldest_pending_s",
    "entries",
    "open",
    "oldest_open_s",
    "p99_age_s",
    "slowest_resolution_s",
    "outbox_rows",
    "untraceable",
)
"""The statement's columns, in order."""

_COUNTS: Final = frozenset(
    {
        "explorer_runs",
        "interleavings",
        "divergent",
        "operations",
        "operations_with_second_server_task",
        "resubmitted",
        "requests",
        "busiest_1s_window",
        "confirmed",
        "pending",
        "entries",
        "open",
        "outbox_rows",
        "untraceable",
    }
)
_MEASURES: Final = frozenset(set(COLUMNS) - _COUNTS - {"last_run_at"})


def timestamp_literal(now: datetime) -> str:
    """``now`` as a ``TIMESTAMPTZ`` literal in UTC (a naive datetime is taken to be UTC)."""
    instant = now if now.tzinfo else now.replace(tzinfo=UTC)
    return f"TIMESTAMPTZ '{instant.astimezone(UTC).isoformat()}'"


def gate_inputs_sql(now: datetime) -> str:
    """The gate-inputs statement with ``now`` filled in, ready to run on a ledger connection or the sandbox."""
    return GATE_INPUTS_TEMPLATE.format(now=timestamp_literal(now)).strip()


def gate_inputs_from_row(row: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """The statement's one row (column -> value) in the shape ``rollout.gates.evaluate`` takes.

    Raises:
        ValueError: a column is missing, or a count is not a whole number.
    """
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise ValueError(f"gate-inputs row lacks {missing}")
    v = {c: _value(c, row[c]) for c in COLUMNS}
    return {
        "terminal_divergence": {
            "explorer_runs": v["explorer_runs"],
            "interleavings": v["interleavings"],
            "divergent": v["divergent"],
            "last_run_at": v["last_run_at"],
        },
        "duplicate_operations": {
            "operations": v["operations"],
            "operations_with_second_server_task": v["operations_with_second_server_task"],
            "resubmitted_after_proof_of_absence": v["resubmitted"],
        },
        "poll_amplification": {
            "requests": v["requests"],
            "busiest_1s_window": v["busiest_1s_window"],
            "configured_qps": v["configured_qps"],
        },
        "cancel_confirmation": {
            "confirmed": v["confirmed"],
            "p99_s": v["p99_s"],
            "max_s": v["max_s"],
            "pending": v["pending"],
            "oldest_pending_s": v["oldest_pending_s"],
        },
        "unknown_reconciliation": {
            "operations": v["operations"],
            "entries": v["entries"],
            "open": v["open"],
            "oldest_open_s": v["oldest_open_s"],
            "p99_age_s": v["p99_age_s"],
            "slowest_resolution_s": v["slowest_resolution_s"],
        },
        "traceability": {"outbox_rows": v["outbox_rows"], "untraceable": v["untraceable"]},
    }


def gate_inputs_from_values(
    columns: list[str], values: list[object] | tuple[object, ...]
) -> dict[str, dict[str, object]]:
    """``gate_inputs_from_row`` for a positional row and its column names (a cursor's ``description``)."""
    return gate_inputs_from_row(dict(zip(columns, values, strict=True)))


def _value(column: str, value: object) -> object:
    if value is None or _is_nan(value):
        return None
    if column in _COUNTS:
        if isinstance(value, bool):
            raise ValueError(f"{column} is not a count: {value!r}")
        if hasattr(value, "__index__"):  # int, and numpy's integers
            return int(value.__index__())
        number = float(str(value))
        if not number.is_integer():
            raise ValueError(f"{column} is not a whole number: {value!r}")
        return int(number)
    if column in _MEASURES:
        return float(str(value))
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        parsed = datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise ValueError(f"{column}: not a timestamp: {value!r}")


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and value != value


__all__ = [
    "COLUMNS",
    "GATE_INPUTS_TEMPLATE",
    "gate_inputs_from_row",
    "gate_inputs_from_values",
    "gate_inputs_sql",
    "timestamp_literal",
]
