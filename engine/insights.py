"""The console's one data module: named, aggregated SQL behind every chart, plus the console's actions.

Pages read only through ``Insights``; they never build SQL. Every query is a named template here
(``QUERIES``) with its parameters turned into quoted literals, so the evidence bundle can show the
exact SQL behind each chart. Queries run on one of three sources:

* ``ServiceSource``: the running ``finality serve`` over its control API (``ServiceClient``):
  ``POST /api/v1/sql`` for the queries (sandboxed, on a snapshot; on a PostgreSQL ledger, analyst
  SQL), ``/api/v1/gates``, ``/api/v1/rollout/...`` and the approval/reconciliation/cancel routes for
  actions.
* ``FileSource``: no service running; the ledger file is read read-only through the SQL sandbox
  (``engine.sqlbox.run_query``). Actions are refused: only the process that owns the ledger may write it.
* ``PostgresSource``: no service running, a PostgreSQL ledger (``FINALITY_LEDGER=postgresql://...``);
  every query is analyst SQL (``PgLedger.analyst_query``: a READ ONLY transaction under the
  read-only analyst role), the rollout status is read through a read-only ledger handle. Actions
  are refused, as in file mode.

The named queries are one text for both backends' SQL (DuckDB and PostgreSQL); the few fragments
each dialect says its own way sit side by side in the query's entry (``NamedQuery.fragments``),
chosen by the source's ``dialect``. A service names its ledger's dialect in its health answer, or
is asked once with ``SELECT version()``.

The six gates come from the latest recorded gate run (``gate_runs``, with its raw inputs) when it
is current, and are evaluated afresh otherwise (``Insights.gates``):

* service: the running service records a run every ``gate_interval_s`` (default 10 s); a run no
  older than that interval plus ``SERVICE_RUN_SLACK_S`` is current, shown with its age.
* file (and PostgreSQL with no service): a run is current when nothing was written after it
  (``engine.gate_sql.RecordedRun.written_since``: the last recorded write instant and the counts,
  from statistics, no scan); the clock-dependent ages are advanced to now exactly
  (``engine.gate_sql.advance_clock``).

``Insights.from_env()`` picks the source from ``FINALITY_SERVICE_URL`` (preferred while the service
answers) and ``FINALITY_LEDGER`` (a DuckDB file, or a ``postgresql://`` URL). Queries aggregate in
SQL; no page ever pulls a million rows.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import pandas as pd  # type: ignore[import-untyped]

from engine.client import ServiceClient, ServiceRefused, ServiceUnavailable
from engine.clock import Clock, SystemClock, monotonic_seconds
from engine.errors import EngineError
from engine.gate_sql import (
    DIALECTS,
    GATE_INPUTS_FRAGMENTS,
    GATE_INPUTS_TEMPLATE,
    LATEST_RUN_SQL,
    advance_clock,
    gate_inputs_from_recorded,
    gate_inputs_from_values,
    recorded_run_from_rows,
)
from engine.gate_sql import seconds_between as secs
from engine.ledger import GateRecord
from engine.model import RECEIPT_STATES, LocalState
from engine.model import Protocol as WireProtocol
from engine.revision import running_revision
from engine.sqlbox import run_query

Json = dict[str, Any]
_T = TypeVar("_T")

ENV_SERVICE_URL: Final = "FINALITY_SERVICE_URL"
ENV_LEDGER: Final = "FINALITY_LEDGER"
ENV_CACHE_S: Final = "FINALITY_CONSOLE_CACHE_S"
ENV_GATE_CACHE_S: Final = "FINALITY_CONSOLE_GATE_CACHE_S"
ENV_GATE_INTERVAL_S: Final = "FINALITY_CONSOLE_GATE_INTERVAL_S"

SERVICE_GATE_INTERVAL_S: Final = 10.0
"""The service's default ``gate_interval_s``: it records a gate run this often."""
SERVICE_RUN_SLACK_S: Final = 10.0
"""What a recorded run may be older than the interval when the console reads it through the service:
the SQL snapshot is up to 5 s old, and evaluating and recording take a second or two at a million
operations. A run older than ``gate_interval + SERVICE_RUN_SLACK_S`` is not current."""

CANCEL_SLO_S: Final = 60.0
"""The cancel-confirmation line drawn on the latency charts (the gate's threshold)."""
UNKNOWN_SLO_S: Final = 15 * 60.0
"""The UNKNOWN reconciliation line drawn on the age charts (the gate's threshold)."""
CANARY_ADAPTER_VERSION: Final = "finality-0.2"

ARM_FALLBACK_SQL: Final = (
    "CASE WHEN i.role = 'shadow' THEN 'shadow' "
    f"WHEN i.adapter_version = '{CANARY_ADAPTER_VERSION}' THEN 'canary' ELSE 'control' END"
)
"""An operation's arm on a ledger without ``rollout_assignments``: shadow by role, canary by adapter version."""
ARM_SQL: Final = "coalesce(ra.arm, 'unassigned')"
"""An operation's arm as the rollout recorded it when routing it (``rollout_assignments``)."""
ARM_JOIN_SQL: Final = (
    "LEFT JOIN (SELECT operation_id AS assigned_operation_id, arm FROM rollout_assignments) ra "
    "ON ra.assigned_operation_id = i.operation_id"
)
ARMS: Final = ("canary", "control", "shadow", "fixed", "unassigned")
TERMINAL_SQL: Final = "('ACCEPTED', 'CANCELLED_ACCEPTED')"
STATES: Final = tuple(s.value for s in LocalState)
LIVE_STATES: Final = tuple(s.value for s in LocalState if s not in RECEIPT_STATES)
PROTOCOLS: Final = tuple(p.value for p in WireProtocol)
ROLLOUT_ACTIONS: Final = ("shadow", "canary", "promote", "rollback", "disable-protocol", "enable-protocol")


class ConsoleError(EngineError):
    """Root of the console's errors (shown to the user as a message, never a traceback)."""


class NotConfigured(ConsoleError):
    """Neither a service URL nor a ledger file was given."""


class ReadOnlyConsole(ConsoleError):
    """An action was asked of a console that reads a ledger file: only the running service writes."""


class ActionRefused(ConsoleError):
    """The service refused an action (its message says why)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class QueryFailed(ConsoleError):
    """A query was refused or failed (analyst SQL, or a source that went away)."""


# ------------------------------------------------------------------------------------ literals


def lit(value: object) -> str:
    """A SQL literal for a parameter value: the only way a value enters a named query's text."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite number: {value!r}")
        return repr(value)
    if isinstance(value, datetime):
        instant = value if value.tzinfo else value.replace(tzinfo=UTC)
        return f"TIMESTAMPTZ '{instant.astimezone(UTC).isoformat()}'"
    if isinstance(value, timedelta):
        return f"INTERVAL '{int(value.total_seconds() * 1_000_000)} microseconds'"
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("NUL in a parameter")
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def lit_list(values: Sequence[object]) -> str:
    return "(" + ", ".join(lit(v) for v in values) + ")" if values else "(NULL)"


# ----------------------------------------------------------------------------- named queries


@dataclass(frozen=True, slots=True)
class NamedQuery:
    """One chart's or table's SQL, with ``{placeholders}`` filled by ``Insights`` from literals only.

    ``template`` runs on both backends; ``fragments`` holds, per dialect (``duckdb``, ``postgres``),
    the placeholders each says its own way (a fragment may itself hold the query's placeholders).
    """

    name: str
    title: str
    template: str
    times: tuple[str, ...] = ()
    max_rows: int = 1000
    fragments: Mapping[str, Mapping[str, str]] | None = None

    def render(self, dialect: str = "duckdb", **params: str) -> str:
        if dialect not in DIALECTS:
            raise ValueError(f"unknown SQL dialect {dialect!r}; known: {list(DIALECTS)}")
        own = {k: v.format(**params) for k, v in (self.fragments or {}).get(dialect, {}).items()}
        return self.template.format(**params, **own).strip()


_OPS = "op_state s JOIN op_identity i USING (operation_id) {arm_join}"
_STATE_COLUMNS = (
    "state, server_status, task_id, poll_cursor, input_round, answered_round, input_request_key, "
    "cancel_generation, cancel_requested_at, expires_at, result_digest, result_held, "
    "effect_reconciliation_required, submit_attempts, epoch, row_version, updated_at"
)
"""``op_state``'s columns but its key, as the analysts' record has them (PostgreSQL's lease columns are left out)."""

_CANCEL_LATENCY = secs("r.accepted_at", "s.cancel_requested_at")
_OPEN_AGE = secs("{now}", "opened_at")


def _percentiles(value: str, *fractions: tuple[float, str]) -> str:
    return ", ".join(
        f"percentile_cont({f}) WITHIN GROUP (ORDER BY {value}) AS {name}" for f, name in fractions
    )


_LATENCY_PERCENTILES = _percentiles("latency_s", (0.5, "p50_s"), (0.95, "p95_s"), (0.99, "p99_s"))

QUERIES: Final[dict[str, NamedQuery]] = {
    q.name: q
    for q in (
        NamedQuery(
            "gate_inputs",
            "Raw inputs of the six gates (engine.gate_sql: the one definition Ledger.gate_inputs shares)",
            GATE_INPUTS_TEMPLATE,
            times=("last_run_at",),
            fragments=GATE_INPUTS_FRAGMENTS,
        ),
        NamedQuery(
            "latest_gate_run",
            "The latest recorded gate run with the ledger's last write instant and counts (engine.gate_sql)",
            LATEST_RUN_SQL,
        ),
        NamedQuery(
            "arms",
            "Operations per rollout arm, as the rollout recorded them (rollout_assignments)",
            # The service records an arm only for an operation it has just created, so the operations
            # with no recorded arm are all operations less the assignments (no million-row join).
            f"""
WITH assigned AS (
  SELECT arm, count(*) AS operations, max(assigned_at) AS last_assigned_at FROM rollout_assignments GROUP BY 1
),
unassigned AS (
  SELECT 'unassigned' AS arm,
         (SELECT count(*) FROM op_identity) - (SELECT count(*) FROM rollout_assignments) AS operations,
         CAST(NULL AS TIMESTAMPTZ) AS last_assigned_at
),
totals AS (SELECT * FROM assigned UNION ALL SELECT * FROM unassigned WHERE operations > 0),
live AS (
  SELECT coalesce(ra.arm, 'unassigned') AS arm, count(*) AS in_flight
  FROM (SELECT operation_id FROM op_state WHERE state NOT IN {TERMINAL_SQL}) s
  LEFT JOIN rollout_assignments ra USING (operation_id) GROUP BY 1
)
SELECT arm, operations, coalesce(in_flight, 0) AS in_flight, last_assigned_at
FROM totals LEFT JOIN live USING (arm)
ORDER BY arm""",
            times=("last_assigned_at",),
        ),
        NamedQuery(
            "arms_by_adapter",
            "Operations per arm on a ledger without rollout_assignments (shadow by role, canary by adapter version)",
            f"""
WITH totals AS (
  SELECT {{arm}} AS arm, count(*) AS operations, max(i.created_at) AS last_assigned_at
  FROM op_identity i GROUP BY 1
),
live AS (
  SELECT {{arm}} AS arm, count(*) AS in_flight
  FROM (SELECT operation_id FROM op_state WHERE state NOT IN {TERMINAL_SQL}) s
  JOIN op_identity i USING (operation_id) GROUP BY 1
)
SELECT arm, operations, coalesce(in_flight, 0) AS in_flight, last_assigned_at
FROM totals LEFT JOIN live USING (arm)
ORDER BY arm""",
            times=("last_assigned_at",),
        ),
        NamedQuery(
            "in_flight",
            "In-flight operations by state and protocol",
            f"""
SELECT s.state, i.protocol, count(*) AS operations,
       min(i.created_at) AS oldest_created_at
FROM op_state s JOIN op_identity i USING (operation_id)
WHERE s.state NOT IN {TERMINAL_SQL}
GROUP BY 1, 2 ORDER BY s.state, i.protocol""",
            times=("oldest_created_at",),
        ),
        NamedQuery(
            "alerts",
            "Alerts",
            f"""
SELECT
  (SELECT count(*) FROM reconciliation WHERE kind = 'unknown' AND status = 'open') AS unknown_open,
  (SELECT max({_OPEN_AGE}) FROM reconciliation
     WHERE kind = 'unknown' AND status = 'open') AS unknown_oldest_s,
  (SELECT count(*) FROM reconciliation WHERE kind = 'unknown' AND status = 'open'
     AND {_OPEN_AGE} > {UNKNOWN_SLO_S}) AS unknown_over_slo,
  (SELECT count(*) FROM reconciliation WHERE kind = 'effects' AND status = 'open') AS effects_open,
  (SELECT count(*) FROM approvals WHERE status = 'pending') AS approvals_pending,
  (SELECT count(*) FROM approvals WHERE status = 'pending' AND deadline < {{now}}) AS approvals_overdue,
  (SELECT count(*) FROM op_state WHERE cancel_requested_at IS NOT NULL
     AND state NOT IN {TERMINAL_SQL}) AS cancels_pending,
  (SELECT count(*) FROM op_state WHERE cancel_requested_at IS NOT NULL AND state NOT IN {TERMINAL_SQL}
     AND {secs("{now}", "cancel_requested_at")} > {CANCEL_SLO_S}) AS cancels_over_slo""",
        ),
        NamedQuery(
            "cancel_latency_over_time",
            "Cancel confirmation latency (p50/p95/p99) over time",
            f"""
WITH c AS (
  SELECT {{bucket_start}} AS bucket, i.protocol, {{arm}} AS arm, {_CANCEL_LATENCY} AS latency_s
  FROM op_state s JOIN receipts r USING (operation_id) JOIN op_identity i USING (operation_id) {{arm_join}}
  WHERE s.cancel_requested_at IS NOT NULL
    AND r.accepted_at >= {{since}} AND r.accepted_at < {{until}}
)
SELECT bucket, {{group}} AS series, count(*) AS cancels, {_LATENCY_PERCENTILES}, max(latency_s) AS max_s
FROM c WHERE protocol IN {{protocols}} AND {{arm_filter}}
GROUP BY 1, 2 ORDER BY bucket, series""",
            times=("bucket",),
            max_rows=20_000,
            fragments={
                # DuckDB's time_bucket counts from 2000-01-03 (a Monday); date_bin from the same origin
                "duckdb": {"bucket_start": "time_bucket({bucket}, r.accepted_at)"},
                "postgres": {
                    "bucket_start": "date_bin({bucket}, r.accepted_at, TIMESTAMPTZ '2000-01-03 00:00:00+00')"
                },
            },
        ),
        NamedQuery(
            "cancel_latency_summary",
            "Cancel confirmation latency per protocol and arm",
            f"""
WITH c AS (
  SELECT i.protocol, {{arm}} AS arm, {_CANCEL_LATENCY} AS latency_s
  FROM op_state s JOIN receipts r USING (operation_id) JOIN op_identity i USING (operation_id) {{arm_join}}
  WHERE s.cancel_requested_at IS NOT NULL
    AND r.accepted_at >= {{since}} AND r.accepted_at < {{until}}
)
SELECT protocol, arm, count(*) AS cancels, {_LATENCY_PERCENTILES}, max(latency_s) AS max_s,
       count(*) FILTER (WHERE latency_s >= {CANCEL_SLO_S}) AS over_60s
FROM c WHERE protocol IN {{protocols}} AND arm IN {{arms}}
GROUP BY 1, 2 ORDER BY protocol, arm""",
        ),
        NamedQuery(
            "slowest_cancels",
            "Slowest cancel confirmations (and unconfirmed cancels)",
            # The slowest are picked from op_state and receipts alone (joined to the protocol and arm
            # only to filter on them); the picked few are then joined to their identity and arm.
            f"""
WITH picked AS (
  SELECT s.operation_id, s.state, s.cancel_requested_at, r.accepted_at,
         {secs("coalesce(r.accepted_at, {now})", "s.cancel_requested_at")} AS latency_s
  FROM op_state s LEFT JOIN receipts r USING (operation_id) {{filter_join}}
  WHERE s.cancel_requested_at IS NOT NULL
    AND (r.accepted_at IS NULL OR (r.accepted_at >= {{since}} AND r.accepted_at < {{until}}))
    AND {{filter}}
  ORDER BY latency_s DESC, s.operation_id LIMIT {{limit}}
)
SELECT i.call_node_id, p.operation_id, i.protocol, {{arm}} AS arm, i.tool_name, p.state,
       p.cancel_requested_at, p.accepted_at, p.latency_s, p.accepted_at IS NULL AS unconfirmed
FROM picked p JOIN op_identity i USING (operation_id) {{arm_join}}
ORDER BY p.latency_s DESC, p.operation_id""",
            times=("cancel_requested_at", "accepted_at"),
        ),
        NamedQuery(
            "unknown_age_histogram",
            "Open reconciliation entries by age",
            f"""
WITH a AS (
  SELECT kind, {_OPEN_AGE} / 60.0 AS age_min
  FROM reconciliation WHERE status = 'open' AND kind IN {{kinds}}
)
SELECT kind, least(floor(age_min / {{bin_min}}) * {{bin_min}}, {{cap_min}}) AS age_bin_min, count(*) AS entries
FROM a GROUP BY 1, 2 ORDER BY kind, age_bin_min""",
        ),
        NamedQuery(
            "reconciliation_aging",
            "Open reconciliation entries, oldest first",
            f"""
SELECT r.entry_id, r.kind, r.operation_id, i.call_node_id, i.protocol, i.tool_name, s.state,
       r.task_id, r.idempotency_key, r.reason, r.opened_at,
       {secs("{now}", "r.opened_at")} AS age_s,
       {secs("{now}", "r.opened_at")} > {UNKNOWN_SLO_S} AS over_15_min
FROM reconciliation r JOIN op_identity i USING (operation_id) JOIN op_state s USING (operation_id)
WHERE r.status = 'open' AND r.kind IN {{kinds}}
ORDER BY r.opened_at, r.entry_id LIMIT {{limit}}""",
            times=("opened_at",),
        ),
        NamedQuery(
            "reconciliation_resolved",
            "Recently resolved reconciliation entries",
            f"""
SELECT entry_id, kind, operation_id, actor, resolution, opened_at, resolved_at,
       {secs("resolved_at", "opened_at")} AS took_s
FROM reconciliation WHERE status = 'resolved'
ORDER BY resolved_at DESC, entry_id LIMIT {{limit}}""",
            times=("opened_at", "resolved_at"),
        ),
        NamedQuery(
            "gate_history",
            "Gate runs",
            """
SELECT run_id, gate, passed, value, threshold, verdict, evaluated_at
FROM gate_runs WHERE run_id IN (SELECT DISTINCT run_id FROM gate_runs ORDER BY run_id DESC LIMIT {runs})
ORDER BY run_id, gate""",
            times=("evaluated_at",),
            max_rows=10_000,
        ),
        NamedQuery(
            "explorer_coverage",
            "Race explorer coverage",
            """
SELECT rules, code, count(*) AS runs, count(DISTINCT scenario) AS scenarios, count(DISTINCT protocol) AS protocols,
       CAST(sum(explored) AS BIGINT) AS explored, CAST(sum(distinct_interleavings) AS BIGINT) AS interleavings,
       CAST(sum(divergent) AS BIGINT) AS divergent, bool_and(exhaustive) AS exhaustive,
       max(finished_at) AS last_finished_at
FROM explorer_runs GROUP BY rules, code ORDER BY rules <> 'engine', code <> 'shipped', rules, code""",
            times=("last_finished_at",),
        ),
        NamedQuery(
            "explorer_runs",
            "Race explorer runs",
            """
SELECT run_id, scenario, protocol, rules, code, revision, explored, distinct_interleavings, divergent,
       exhaustive, shortest_trace, finished_at
FROM explorer_runs ORDER BY run_id DESC LIMIT {limit}""",
            times=("finished_at",),
        ),
        NamedQuery(
            "filter_options",
            "Values to filter operations by",
            """
SELECT 'protocol' AS field, protocol AS value FROM (SELECT DISTINCT protocol FROM op_identity) AS p
UNION ALL SELECT 'tool', tool_name FROM (SELECT DISTINCT tool_name FROM op_identity) AS t
UNION ALL SELECT 'bounds', CAST(min(created_at) AS VARCHAR) FROM op_identity
UNION ALL SELECT 'bounds', CAST(max(created_at) AS VARCHAR) FROM op_identity
ORDER BY 1, 2""",
        ),
        NamedQuery(
            "operations",
            "Operations (filtered), newest first",
            """
WITH picked AS (
  SELECT i.operation_id FROM {candidates}
  WHERE {where}
  ORDER BY i.created_at DESC, i.operation_id LIMIT {limit}
)
SELECT i.call_node_id, s.operation_id, s.state, i.protocol, i.tool_name, {arm} AS arm, i.role,
       s.server_status, s.epoch, s.cancel_generation, s.input_round, i.created_at, s.updated_at, s.task_id
FROM picked JOIN op_identity i USING (operation_id) JOIN op_state s USING (operation_id) {arm_join}
ORDER BY i.created_at DESC, s.operation_id""",
            times=("created_at", "updated_at"),
        ),
        NamedQuery(
            "operations_by_state",
            "Operations (filtered) per state",
            """
SELECT s.state, count(*) AS operations FROM {source}
WHERE {where} GROUP BY 1 ORDER BY operations DESC, s.state""",
        ),
        NamedQuery(
            "operation",
            "One operation",
            f"""
SELECT i.*, {", ".join("s." + c for c in _STATE_COLUMNS.split(", "))}, {{arm}} AS arm FROM {_OPS}
WHERE s.operation_id = (
  SELECT operation_id FROM op_identity WHERE call_node_id = {{key}} OR operation_id = {{key}} LIMIT 1
)""",
            times=("created_at", "updated_at", "cancel_requested_at", "expires_at"),
        ),
        NamedQuery(
            "operation_timeline",
            "One call node's timeline: transitions, protocol requests, receipt",
            f"""
WITH op AS (SELECT operation_id FROM op_identity WHERE call_node_id = {{key}} OR operation_id = {{key}} LIMIT 1)
SELECT 'transition' AS kind, recorded_at AS occurred_at, event AS what,
       coalesce(from_state, '') || ' -> ' || to_state AS detail, cause AS note, accepted AS ok, seq AS ord
FROM transitions WHERE operation_id = (SELECT operation_id FROM op)
UNION ALL
SELECT 'request', sent_at, method, outcome,
       CASE WHEN received_at IS NULL THEN 'no reply'
            ELSE CAST(round(CAST({secs("received_at", "sent_at")} * 1000 AS DECIMAL(18, 3)), 1) AS VARCHAR)
                 || ' ms' END,
       outcome = 'ok', NULL
FROM polls WHERE operation_id = (SELECT operation_id FROM op)
UNION ALL
SELECT 'receipt', accepted_at, status, coalesce(result_digest, cancel_evidence, ''),
       'epoch ' || epoch || ', cancel generation ' || cancel_generation, TRUE, NULL
FROM receipts WHERE operation_id = (SELECT operation_id FROM op)
ORDER BY occurred_at, ord NULLS LAST, kind, what""",
            times=("occurred_at",),
            max_rows=5000,
        ),
        NamedQuery(
            "approvals_pending",
            "Pending input_required approvals",
            """
SELECT a.operation_id, a.input_round, i.call_node_id, i.tool_name, i.protocol, s.state,
       s.input_round AS current_round, a.message, a.requested_schema, a.schema_digest, a.deadline, a.opened_at,
       a.request_key
FROM approvals a JOIN op_identity i USING (operation_id) JOIN op_state s USING (operation_id)
WHERE a.status = 'pending' ORDER BY a.opened_at, a.operation_id, a.input_round LIMIT {limit}""",
            times=("deadline", "opened_at"),
        ),
        NamedQuery(
            "approvals_answered",
            "Recently answered approvals",
            f"""
SELECT operation_id, input_round, actor, answer, opened_at, answered_at,
       {secs("answered_at", "opened_at")} AS waited_s
FROM approvals WHERE status = 'answered' ORDER BY answered_at DESC, operation_id, input_round LIMIT {{limit}}""",
            times=("opened_at", "answered_at"),
        ),
        NamedQuery(
            "tables",
            "The ledger's tables",
            """
SELECT table_name FROM information_schema.tables
WHERE table_catalog = current_database() AND table_schema = current_schema() ORDER BY 1""",
        ),
        NamedQuery(
            "audit_log",
            "Rollout audit log (hash-chained)",
            """
SELECT * FROM rollout_events ORDER BY 1 DESC LIMIT {limit}""",
            max_rows=5000,
        ),
    )
}
"""Every chart's and table's SQL. One text for both backends (DuckDB and PostgreSQL run it alike), but
for a query's ``fragments``, which each dialect says its own way, side by side in the same entry."""

SQL_EXAMPLES: Final[dict[str, str]] = {
    "Operations per state and protocol": (
        "SELECT state, protocol, count(*) AS n FROM operations GROUP BY 1, 2 ORDER BY n DESC, 1, 2"
    ),
    "Cancel latency percentiles per protocol": (
        "SELECT i.protocol, count(*) AS cancels,\n"
        + "".join(
            f"       percentile_cont({f}) WITHIN GROUP (ORDER BY {_CANCEL_LATENCY}) AS {name},\n"
            for f, name in ((0.5, "p50_s"), (0.95, "p95_s"))
        )
        + f"       percentile_cont(0.99) WITHIN GROUP (ORDER BY {_CANCEL_LATENCY}) AS p99_s\n"
        "FROM op_state s JOIN receipts r USING (operation_id) JOIN op_identity i USING (operation_id)\n"
        "WHERE s.cancel_requested_at IS NOT NULL GROUP BY 1 ORDER BY 1"
    ),
    "Open UNKNOWN entries, oldest first": (
        "SELECT entry_id, operation_id, idempotency_key, task_id, opened_at, reason\n"
        "FROM reconciliation WHERE kind = 'unknown' AND status = 'open' ORDER BY opened_at"
    ),
    "Protocol requests per second, busiest windows": (
        "SELECT date_trunc('second', sent_at) AS second, count(*) AS requests\n"
        "FROM polls GROUP BY 1 ORDER BY requests DESC LIMIT 20"
    ),
    "Outbox rows without a receipt (must be none)": (
        "SELECT o.* FROM outbox o LEFT JOIN receipts r USING (call_node_id) WHERE r.call_node_id IS NULL"
    ),
    "Polls per accepted operation": (
        "SELECT o.protocol, avg(p.n) AS polls_per_operation FROM operations o\n"
        "JOIN (SELECT operation_id, count(*) AS n FROM polls GROUP BY 1) p USING (operation_id)\n"
        "WHERE o.state = 'ACCEPTED' GROUP BY 1 ORDER BY 1"
    ),
}
"""Examples for the SQL page, in SQL both backends run."""

CHARTS: Final[dict[str, tuple[str, ...]]] = {
    "Overview": ("arms", "in_flight", "alerts"),
    "Cancel latency": ("cancel_latency_over_time", "cancel_latency_summary", "slowest_cancels"),
    "UNKNOWN and reconciliation": (
        "unknown_age_histogram",
        "reconciliation_aging",
        "reconciliation_resolved",
    ),
    "Gate compliance": ("gate_history", "explorer_coverage", "explorer_runs"),
    "Operations": ("filter_options", "operations", "operations_by_state", "operation", "operation_timeline"),
    "Approvals": ("approvals_pending", "approvals_answered"),
    "Rollout control": ("audit_log",),
}
"""Which named queries each page's charts and tables come from (the evidence bundle's index)."""


# ---------------------------------------------------------------------------------- value types


@dataclass(frozen=True, slots=True)
class GateView:
    """All six gates as evaluated, with the raw inputs they were evaluated from."""

    results: list[GateRecord]
    inputs: dict[str, dict[str, object]]
    evaluated_at: datetime
    """When the inputs were read from the ledger."""
    source: str
    run_id: int | None = None
    """The recorded gate run these verdicts come from (None: evaluated by this console, not recorded)."""
    basis: str = ""
    """Why these verdicts are current (shown next to the gates)."""
    aged_s: float = 0.0
    """Seconds the clock-dependent ages were advanced past ``evaluated_at`` (file mode, nothing written since)."""

    @classmethod
    def evaluate(
        cls, inputs: dict[str, dict[str, object]], at: datetime, source: str, thresholds: object | None = None
    ) -> GateView:
        """Evaluate ``inputs`` (read at ``at``) with ``thresholds`` (a ``rollout.gates.Thresholds``; default ones if None)."""
        # Imported here: rollout sits above the engine, which only presents its verdicts.
        from rollout.gates import Thresholds, evaluate

        chosen = thresholds if isinstance(thresholds, Thresholds) else Thresholds()
        return cls(evaluate(inputs, chosen).results, inputs, at, source)

    def with_thresholds(self, thresholds: object) -> GateView:
        """The what-if: the same raw inputs (no second read of the ledger) under other thresholds."""
        return replace(
            self, results=GateView.evaluate(self.inputs, self.evaluated_at, self.source, thresholds).results
        )

    def age_s(self, now: datetime) -> float:
        """Seconds since the inputs were read (0 for a run stamped ahead of this console's clock)."""
        return max(0.0, (now - self.evaluated_at).total_seconds())

    def stamp(self, now: datetime) -> str:
        """``evaluated at HH:MM:SS UTC (N s ago)`` and why that is current, for the caption next to the gates."""
        at = self.evaluated_at.astimezone(UTC)
        text = f"evaluated at {at:%H:%M:%S} UTC ({self.age_s(now):.0f} s ago)"
        if at.date() != now.astimezone(UTC).date():
            text = f"evaluated at {at:%Y-%m-%d %H:%M:%S} UTC ({self.age_s(now):.0f} s ago)"
        return text + (f" · {self.basis}" if self.basis else "")

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def failing(self) -> list[GateRecord]:
        return [r for r in self.results if not r.passed]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {
                    "gate": r.gate,
                    "passed": r.passed,
                    "value": r.value,
                    "threshold": r.threshold,
                    "verdict": r.verdict,
                    "inputs": json.dumps(r.inputs, default=str, sort_keys=True),
                }
                for r in self.results
            ]
        )


@dataclass(frozen=True, slots=True)
class AuditCheck:
    verified: bool | None
    """True when the hash chain verified, False when it broke, None when it could not be checked."""
    events: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    """The rollout as the service reports it (``GET /api/v1/rollout/status``)."""

    stage: str
    percentage: float | None
    epoch: int | None
    disabled_protocols: tuple[str, ...]
    remaining: dict[str, int]
    """Operations still in flight per disabled protocol (query and reconciliation keep working for them)."""
    audit: AuditCheck
    raw: Json = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SourceInfo:
    kind: str
    """``service``, ``file`` (a DuckDB ledger file) or ``postgres`` (a PostgreSQL ledger, no service)."""
    location: str
    writable: bool
    note: str = ""


@dataclass(frozen=True, slots=True)
class SqlResult:
    frame: pd.DataFrame
    truncated: bool
    elapsed_ms: float
    sql: str


# -------------------------------------------------------------------------------------- sources


class Source(Protocol):
    info: SourceInfo

    @property
    def dialect(self) -> str:
        """The ledger's SQL dialect (``engine.gate_sql.DIALECTS``): which fragments the named queries use."""
        ...

    def close(self) -> None: ...

    def query(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]: ...

    def rollout_status(self) -> Json | None: ...

    def resolve(self, entry_id: int, body: Json) -> Json: ...

    def answer(self, operation_id: str, input_round: int, body: Json) -> Json: ...

    def cancel(self, call_node: str, body: Json) -> Json: ...

    def rollout(self, action: str, body: Json) -> Json: ...

    def evaluate_gates(self) -> Json | None:
        """The service's fresh evaluation, recorded as a run (``POST /api/v1/gates``); None without a service."""
        ...


class ServiceSource:
    """Reads and acts through the running service's control API."""

    def __init__(self, client: ServiceClient, health: Json | None = None) -> None:
        self.client = client
        self.info = SourceInfo("service", client.base_url, writable=True)
        self._dialect = _dialect_of_health(health or {})
        self._dialect_lock = threading.Lock()

    @property
    def dialect(self) -> str:
        """What the service's health answer says its ledger is; else asked once with ``SELECT version()``
        (DuckDB answers ``v1.x``, PostgreSQL ``PostgreSQL 15...``)."""
        with self._dialect_lock:
            if self._dialect is None:
                _, rows, _, _ = self.query("SELECT version() AS version", 1)
                text = str(rows[0][0]) if rows and rows[0] else ""
                self._dialect = "postgres" if text.lower().startswith("postgresql") else "duckdb"
            return self._dialect

    def close(self) -> None:
        self.client.close()

    def query(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]:
        try:
            body = self.client.sql(sql, max_rows=max_rows)
        except ServiceRefused as exc:
            raise QueryFailed(exc.message) from exc
        except ServiceUnavailable as exc:
            raise QueryFailed(str(exc)) from exc
        return (
            list(body["columns"]),
            [list(r) for r in body["rows"]],
            bool(body.get("truncated")),
            float(body.get("elapsed_ms", 0.0)),
        )

    def rollout_status(self) -> Json | None:
        try:
            return self.client.rollout_status()
        except ServiceRefused as exc:
            if exc.status in (404, 405, 501):
                return None
            raise ActionRefused(exc.status, exc.message) from exc
        except ServiceUnavailable as exc:
            raise ActionRefused(503, str(exc)) from exc

    def _do(self, call: Callable[[], Json]) -> Json:
        try:
            return call()
        except ServiceRefused as exc:
            raise ActionRefused(exc.status, exc.message) from exc
        except ServiceUnavailable as exc:
            raise ActionRefused(503, str(exc)) from exc

    def resolve(self, entry_id: int, body: Json) -> Json:
        return self._do(lambda: self.client.resolve(entry_id, **body))

    def answer(self, operation_id: str, input_round: int, body: Json) -> Json:
        return self._do(lambda: self.client.answer(operation_id, input_round, **body))

    def cancel(self, call_node: str, body: Json) -> Json:
        return self._do(lambda: self.client.cancel(call_node, **body))

    def rollout(self, action: str, body: Json) -> Json:
        return self._do(lambda: self.client.rollout(action, body))

    def evaluate_gates(self) -> Json | None:
        return self._do(lambda: self.client.gates(record=True))


class _ReadOnlyActions:
    """The actions of a source that only reads: each is refused with ``refusal``; gates are never recorded."""

    refusal: str = "this console is read-only"

    def _refuse(self) -> Json:
        raise ReadOnlyConsole(self.refusal)

    def resolve(self, entry_id: int, body: Json) -> Json:
        return self._refuse()

    def answer(self, operation_id: str, input_round: int, body: Json) -> Json:
        return self._refuse()

    def cancel(self, call_node: str, body: Json) -> Json:
        return self._refuse()

    def rollout(self, action: str, body: Json) -> Json:
        return self._refuse()

    def evaluate_gates(self) -> Json | None:
        return None  # read-only: the console evaluates itself and records nothing


class FileSource(_ReadOnlyActions):
    """Reads a ledger file read-only (no service running); refuses every action."""

    dialect = "duckdb"

    def __init__(self, path: str | Path, note: str = "") -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise NotConfigured(f"ledger file {self.path} does not exist")
        self.info = SourceInfo("file", str(self.path), writable=False, note=note)

    def close(self) -> None:
        pass

    def query(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]:
        try:
            result = run_query(self.path, sql, max_rows=max_rows)
        except EngineError as exc:
            raise QueryFailed(str(exc)) from exc
        return result.columns, result.rows, result.truncated, result.elapsed_ms

    def rollout_status(self) -> Json | None:
        return None

    refusal = (
        "this console reads a ledger file read-only; start `finality serve` and set "
        f"{ENV_SERVICE_URL} to act (only the service writes the ledger)"
    )


class PostgresSource(_ReadOnlyActions):
    """Reads a PostgreSQL ledger with no service: every query is analyst SQL (``PgLedger.analyst_query``:
    one statement, in a READ ONLY transaction under the read-only analyst role), the rollout status is
    read through a read-only ledger handle; every action is refused (the executors own the writes).

    The ledger must have been opened (migrated) once by a writer, which also creates the analyst role.
    """

    dialect = "postgres"

    def __init__(self, url: str, note: str = "", *, pool_size: int = 4) -> None:
        # Imported here: a console on DuckDB needs no PostgreSQL driver.
        from engine.pg_ledger import PgLedger

        try:
            self.ledger = PgLedger.open(url, read_only=True, pool_size=pool_size)
        except EngineError as exc:
            raise NotConfigured(str(exc)) from exc
        self.info = SourceInfo("postgres", self.ledger.path, writable=False, note=note)

    def close(self) -> None:
        self.ledger.close()

    def query(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]:
        try:
            result = self.ledger.analyst_query(sql, max_rows=max_rows)
        except EngineError as exc:
            raise QueryFailed(str(exc)) from exc
        return result.columns, result.rows, result.truncated, result.elapsed_ms

    def rollout_status(self) -> Json | None:
        """The rollout as recorded (stage, exposure, epoch, kill switch with what remains in flight) and
        the audit chain verified against its anchor; None before the first rollout action."""
        # Imported here: rollout sits above the engine, which only presents what it recorded.
        from rollout.controller import verify_ledger
        from rollout.plan import RolloutState

        try:
            row = self.ledger.rollout_state()
            if row is None:
                return None
            state = RolloutState.from_json(row)
            live = self.ledger.live_by_protocol()
            audit = verify_ledger(self.ledger)
        except (EngineError, ValueError) as exc:
            raise ActionRefused(503, f"rollout status unavailable: {exc}") from exc
        remaining = {p: sum(live.get(p, {}).values()) for p in state.disabled_protocols}
        return {
            **state.as_json(),
            "percentage": state.exposure_bp / 100,
            "remaining": remaining,
            "audit": {"verified": audit.ok, "events": audit.checked, "detail": "; ".join(audit.problems)},
        }

    refusal = (
        "this console reads a PostgreSQL ledger read-only; start `finality serve` on it and set "
        f"{ENV_SERVICE_URL} to act (only the executors write the ledger)"
    )


def _dialect_of_health(health: Mapping[str, object]) -> str | None:
    """The ledger's dialect if the service's health answer names it (``dialect``, or a ``ledger``
    backend name or URL); None when it does not say."""
    for key in ("dialect", "ledger_dialect", "ledger_backend", "backend", "ledger"):
        value = health.get(key)
        if isinstance(value, Mapping):
            found = _dialect_of_health(value)
            if found is not None:
                return found
            continue
        text = str(value or "").strip().lower()
        if text.startswith("postgres"):
            return "postgres"
        if text.startswith("duckdb"):
            return "duckdb"
    return None


def _float(value: object) -> float | None:
    if value is None:
        return None
    try:
        return float(str(value))
    except ValueError:
        return None


# -------------------------------------------------------------------------------------- insights


@dataclass
class _Cached:
    at: float
    value: object


class Insights:
    """What the console pages read and do. Thread-safe; results of identical queries are cached briefly."""

    def __init__(
        self,
        source: Source,
        *,
        clock: Clock | None = None,
        cache_s: float = 2.0,
        gate_cache_s: float = 15.0,
        gate_interval_s: float = SERVICE_GATE_INTERVAL_S,
        prefetch: bool = False,
    ) -> None:
        self.source = source
        self.gate_cache_s = gate_cache_s
        self.gate_interval_s = gate_interval_s
        """How often the service records a gate run (its ``gate_interval_s``; 0: only on request)."""
        self._gate_view: tuple[float, GateView] | None = None
        """The last evaluation this console made itself (fresh or by ``reevaluate``), with when."""
        self.clock: Clock = clock or SystemClock()
        self.cache_s = cache_s
        self._cache: dict[tuple[str, int], _Cached] = {}
        self._lock = threading.Lock()
        self._tables: tuple[float, frozenset[str]] | None = None
        self._tables_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="finality-console")
        self.last_sql: dict[str, str] = {}
        """The SQL each named query last ran with (the evidence bundle's 'SQL behind each chart')."""
        if prefetch:
            # Every page's first query needs the table list (which arm join, whether gate runs
            # exist); read it while the page is still laying itself out.
            self._pool.submit(self.has_table, "gate_runs")

    # ------------------------------------------------------------------------------ building

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, clock: Clock | None = None) -> Insights:
        """The service at ``FINALITY_SERVICE_URL`` if it answers, else the file at ``FINALITY_LEDGER``.

        Raises:
            NotConfigured: neither is usable (the message says what to set).
        """
        env = os.environ if env is None else env
        url = env.get(ENV_SERVICE_URL, "").strip()
        ledger = env.get(ENV_LEDGER, "").strip()
        cache_s = float(env.get(ENV_CACHE_S, "2") or 0)
        gate_cache_s = float(env.get(ENV_GATE_CACHE_S, "15") or 0)
        interval_s = float(env.get(ENV_GATE_INTERVAL_S, str(SERVICE_GATE_INTERVAL_S)) or 0)
        note = ""
        if url:
            client = ServiceClient(url, timeout=30.0)
            try:
                health = client.health()
            except (ServiceUnavailable, ServiceRefused) as exc:
                client.close()
                if not ledger:
                    raise NotConfigured(f"the Finality service at {url} does not answer: {exc}") from exc
                note = f"service at {url} does not answer; reading the ledger file read-only"
            else:
                return cls(
                    ServiceSource(client, health if isinstance(health, dict) else None),
                    clock=clock,
                    cache_s=cache_s,
                    gate_cache_s=gate_cache_s,
                    gate_interval_s=interval_s,
                    prefetch=True,
                )
        if ledger:
            source: Source
            if ledger.lower().startswith(("postgresql://", "postgres://")):
                source = PostgresSource(ledger, note.replace("the ledger file", "the PostgreSQL ledger"))
            else:
                source = FileSource(ledger, note)
            return cls(
                source,
                clock=clock,
                cache_s=cache_s,
                gate_cache_s=gate_cache_s,
                gate_interval_s=interval_s,
                prefetch=True,
            )
        raise NotConfigured(
            f"set {ENV_SERVICE_URL} (a running `finality serve`) or {ENV_LEDGER} (a ledger file or a "
            "postgresql:// URL, read-only)"
        )

    @property
    def info(self) -> SourceInfo:
        return self.source.info

    @property
    def dialect(self) -> str:
        """The SQL dialect of the ledger the queries run on: ``duckdb`` or ``postgres``."""
        return self.source.dialect

    def now(self) -> datetime:
        return self.clock.now()

    # ------------------------------------------------------------------------------- queries

    def sql_of(self, name: str, **params: object) -> str:
        """The SQL a named query runs with these parameters (what the pages show under each chart)."""
        arm, join = self._arm() if "{arm" in QUERIES[name].template else ("", "")
        values = {"arm": arm, "arm_join": join, **{k: _param(v) for k, v in params.items()}}
        return QUERIES[name].render(self.dialect, **values)

    def _arm(self) -> tuple[str, str]:
        """How this ledger tells an operation's arm: from ``rollout_assignments`` once the ledger has it."""
        if self.has_table("rollout_assignments"):
            return ARM_SQL, ARM_JOIN_SQL
        return ARM_FALLBACK_SQL, ""

    def has_table(self, table: str) -> bool:
        """Whether the ledger has ``table`` (the list of tables is read once a minute: one query, not one per check)."""
        with self._tables_lock:  # pages read in parallel (``soon``): one of them reads the list
            now = monotonic_seconds()
            cached = self._tables
            if cached is None or now - cached[0] > 60:
                frame = self._named("tables")
                cached = (now, frozenset(str(t) for t in frame["table_name"]))
                self._tables = cached
        return table in cached[1]

    def _named(self, name: str, **params: object) -> pd.DataFrame:
        query = QUERIES[name]
        sql = self.sql_of(name, **params)
        self.last_sql[name] = sql
        columns, rows, _, _ = self._run(sql, query.max_rows)
        frame = pd.DataFrame(rows, columns=columns)
        for column in query.times:
            if column in frame.columns:
                frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
        return frame

    def _run(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]:
        key = (sql, max_rows)
        now = monotonic_seconds()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit.at <= self.cache_s:
                return hit.value  # type: ignore[return-value]
        value = self.source.query(sql, max_rows)
        if self.cache_s > 0:
            with self._lock:
                if len(self._cache) > 256:
                    self._cache.clear()
                self._cache[key] = _Cached(now, value)
        return value

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
        self._gate_view = None
        self._tables = None

    def close(self) -> None:
        """Stop the background readers (``soon``) and close the source (a PostgreSQL source's pool)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.source.close()

    # overview -------------------------------------------------------------------------------

    def arms(self) -> pd.DataFrame:
        """Operations and in-flight operations per arm (``last_assigned_at``: creation time on old ledgers)."""
        return self._named("arms" if self.has_table("rollout_assignments") else "arms_by_adapter")

    def in_flight(self) -> pd.DataFrame:
        return self._named("in_flight")

    def alerts(self) -> dict[str, float]:
        frame = self._named("alerts", now=self.now())
        row = frame.iloc[0].to_dict() if len(frame) else {}
        return {k: float(v) if v is not None and not pd.isna(v) else 0.0 for k, v in row.items()}

    def gate_inputs(self) -> tuple[dict[str, dict[str, object]], datetime]:
        """The six gates' raw inputs, read from the ledger now (``engine.gate_sql``, the ``Ledger.gate_inputs`` shape)."""
        now = self.now()
        sql = self.sql_of("gate_inputs", now=now, revision=running_revision())
        self.last_sql["gate_inputs"] = sql
        columns, rows, _, _ = self._run(sql, 1)
        if not rows:
            raise QueryFailed("the gate-inputs query returned no row")
        return gate_inputs_from_values(columns, rows[0]), now

    def recorded_gates(self) -> GateView | None:
        """The six gates from the latest recorded run when it is current, else None (with no scan).

        Service: the service records a run every ``gate_interval_s``; a run read through its SQL
        snapshot is current while no older than that interval plus ``SERVICE_RUN_SLACK_S``. File:
        nobody writes the ledger, so a run is current when nothing was written after it (the last
        recorded write instant and the row counts, ``RecordedRun.written_since``); its clock-dependent
        ages are then advanced to now, which is exactly what a fresh evaluation would read.
        """
        if not self.has_table("gate_runs"):
            return None
        columns, rows, _, _ = self._run(self.sql_of("latest_gate_run"), 100)
        run = recorded_run_from_rows(columns, rows)
        if run is None or run.inputs is None:
            return None
        now = self.now()
        age = max(0.0, (now - run.evaluated_at).total_seconds())
        if self.info.kind == "service":
            bound = self.gate_interval_s + SERVICE_RUN_SLACK_S
            if self.gate_interval_s <= 0 or age > bound:
                return None
            inputs, aged, basis = (
                run.inputs,
                0.0,
                (
                    f"run #{run.run_id}, recorded by the service every {self.gate_interval_s:g} s "
                    f"(a run older than {bound:g} s is not used)"
                ),
            )
        else:
            if run.written_since() is not None:
                return None
            inputs, aged = advance_clock(run.inputs, age), age
            basis = f"run #{run.run_id}; nothing written to the ledger since" + (
                f", ages advanced {age:.0f} s to now" if age >= 1 else ""
            )
        view = GateView.evaluate(inputs, run.evaluated_at, self.info.kind)
        return replace(view, run_id=run.run_id, basis=basis, aged_s=aged)

    def gates(self, thresholds: object | None = None, *, max_age_s: float | None = None) -> GateView:
        """The six gates, by ``rollout.gates.evaluate``; with other ``Thresholds``, the what-if on the same inputs.

        From the latest recorded run when it is current (``recorded_gates``), or this console's own
        last evaluation when newer and no older than ``max_age_s`` (default ``gate_cache_s``);
        otherwise evaluated afresh (a whole-ledger scan, about a second at a million operations).
        ``evaluated_at`` says when the inputs were read and ``basis`` why they are current. To
        evaluate other thresholds on the inputs a view was built from, use ``GateView.with_thresholds``.
        """
        limit = self.gate_cache_s if max_age_s is None else max_age_s
        candidates: list[GateView] = []
        own = self._gate_view
        if own is not None and monotonic_seconds() - own[0] <= limit:
            candidates.append(own[1])
        recorded = self.recorded_gates()
        if recorded is not None:
            candidates.append(recorded)
        view = max(candidates, key=lambda v: v.evaluated_at) if candidates else self._evaluate_here()
        return view if thresholds is None else view.with_thresholds(thresholds)

    def _evaluate_here(self) -> GateView:
        inputs, now = self.gate_inputs()
        view = replace(
            GateView.evaluate(inputs, now, self.info.kind),
            basis="evaluated now by this console (no current recorded run)",
        )
        self._gate_view = (monotonic_seconds(), view)
        return view

    def reevaluate(self) -> GateView:
        """Evaluate the gates afresh now ("Re-evaluate now").

        Service: ``POST /api/v1/gates`` (the service reads its live ledger and records the run).
        File: this console reads the ledger file itself (read-only: nothing is recorded).
        """
        at = self.now()
        body = self.source.evaluate_gates()
        if body is None:
            view = self._evaluate_here()
            view = replace(view, basis="re-evaluated now by this console (read-only: not recorded)")
        else:
            try:
                inputs = gate_inputs_from_recorded({str(g["gate"]): g["inputs"] for g in body["gates"]})
            except (KeyError, TypeError, ValueError) as exc:
                raise QueryFailed(f"the service's gate evaluation could not be read: {exc}") from exc
            run_id = body.get("run_id")
            view = replace(
                GateView.evaluate(inputs, at, self.info.kind),
                run_id=int(run_id) if isinstance(run_id, int) else None,
                basis=f"re-evaluated now by the service (POST /api/v1/gates), recorded as run #{run_id}",
            )
        self._gate_view = (monotonic_seconds(), view)
        with self._lock:
            self._cache.clear()  # the gate history shows the new run as soon as the snapshot has it
        return view

    def soon(self, read: Callable[..., _T], /, *args: object, **kwargs: object) -> Future[_T]:
        """Start a read in the background and return its future, so a page overlaps its independent reads.

        Only reads belong here (no Streamlit calls: the work runs outside the page's script thread).
        The gate inputs, for instance, are a whole-ledger scan a page can start before drawing the rest.
        """
        return self._pool.submit(read, *args, **kwargs)

    # cancel latency -------------------------------------------------------------------------

    def cancel_latency_over_time(
        self,
        *,
        since: datetime,
        until: datetime,
        bucket: timedelta = timedelta(hours=1),
        by: str = "protocol",
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
    ) -> pd.DataFrame:
        group = {"protocol": "protocol", "arm": "arm", "all": "'all'"}[by]
        chosen = _choices(arms, ARMS)
        if by != "arm" and _all_arms(chosen):
            # Every operation's arm is one of ARMS, so all of them selected filters nothing: the
            # arm (a join with a million-row table) is not read at all.
            arm_parts: dict[str, object] = {
                "arm": _Raw("NULL"),
                "arm_join": _Raw(""),
                "arm_filter": _Raw("TRUE"),
            }
        else:
            arm_parts = {"arm_filter": _Raw(f"arm IN {lit_list(list(chosen))}")}
        return self._named(
            "cancel_latency_over_time",
            since=since,
            until=until,
            bucket=bucket,
            group=_Raw(group),
            protocols=_choices(protocols, PROTOCOLS),
            **arm_parts,
        )

    def cancel_latency_summary(
        self,
        *,
        since: datetime,
        until: datetime,
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
    ) -> pd.DataFrame:
        return self._named(
            "cancel_latency_summary",
            since=since,
            until=until,
            protocols=_choices(protocols, PROTOCOLS),
            arms=_choices(arms, ARMS),
        )

    def slowest_cancels(
        self,
        *,
        since: datetime,
        until: datetime,
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
        limit: int = 25,
    ) -> pd.DataFrame:
        chosen_protocols = _choices(protocols, PROTOCOLS)
        chosen_arms = _choices(arms, ARMS)
        if set(chosen_protocols) == set(PROTOCOLS) and _all_arms(chosen_arms):
            # Every operation's protocol is one of PROTOCOLS and its arm one of ARMS: nothing to filter.
            filter_join, where = "", "TRUE"
        else:
            arm, join = self._arm()
            filter_join = f"JOIN op_identity i USING (operation_id) {join}"
            where = (
                f"i.protocol IN {lit_list(list(chosen_protocols))} AND {arm} IN {lit_list(list(chosen_arms))}"
            )
        return self._named(
            "slowest_cancels",
            now=self.now(),
            since=since,
            until=until,
            filter_join=_Raw(filter_join),
            filter=_Raw(where),
            limit=_limit(limit),
        )

    # reconciliation -------------------------------------------------------------------------

    def unknown_age_histogram(
        self, *, kinds: Sequence[str] = ("unknown",), bin_min: int = 5, cap_min: int = 240
    ) -> pd.DataFrame:
        return self._named(
            "unknown_age_histogram",
            now=self.now(),
            kinds=_choices(kinds, ("unknown", "effects")),
            bin_min=max(1, int(bin_min)),
            cap_min=max(1, int(cap_min)),
        )

    def reconciliation_aging(
        self, *, kinds: Sequence[str] = ("unknown", "effects"), limit: int = 500
    ) -> pd.DataFrame:
        return self._named(
            "reconciliation_aging",
            now=self.now(),
            kinds=_choices(kinds, ("unknown", "effects")),
            limit=_limit(limit),
        )

    def reconciliation_resolved(self, *, limit: int = 50) -> pd.DataFrame:
        return self._named("reconciliation_resolved", limit=_limit(limit))

    def resolve(
        self, entry_id: int, *, actor: str, reason: str, task_id: str | None = None, absent: bool = False
    ) -> Json:
        """Resolve a reconciliation entry (through the service: a person's decision, with actor and reason)."""
        actor, reason = _required(actor, "actor"), _required(reason, "reason")
        body: Json = {
            "actor": actor,
            "reason": reason,
            "absent": absent,
            "task_id": (task_id or "").strip() or None,
        }
        result = self.source.resolve(int(entry_id), body)
        self.clear_cache()
        return result

    # gates ----------------------------------------------------------------------------------

    def gate_history(self, *, runs: int = 200) -> pd.DataFrame:
        return self._named("gate_history", runs=_limit(runs))

    def explorer_coverage(self) -> pd.DataFrame:
        return self._named("explorer_coverage")

    def explorer_runs(self, *, limit: int = 200) -> pd.DataFrame:
        return self._named("explorer_runs", limit=_limit(limit))

    # operations -----------------------------------------------------------------------------

    def filter_options(self) -> dict[str, list[str]]:
        frame = self._named("filter_options")
        out: dict[str, list[str]] = {"protocol": [], "tool": [], "bounds": []}
        for field_name, value in frame.itertuples(index=False):
            if value is not None:
                out.setdefault(str(field_name), []).append(str(value))
        out["state"] = list(STATES)
        out["arm"] = list(ARMS)
        return out

    def operations(
        self,
        *,
        states: Sequence[str] = (),
        protocols: Sequence[str] = (),
        tools: Sequence[str] = (),
        arms: Sequence[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 200,
    ) -> pd.DataFrame:
        arm, join = self._arm()
        where = _op_filter(arm, states, protocols, tools, arms, since, until)
        picking_join = join if arms else ""  # the arm is joined to the picked rows only, unless filtered on
        # Pick the newest ids first and join the rest to those only: a top-N over a million-row
        # join is what makes this slow, not the filters.
        candidates = f"op_identity i {picking_join}" + (
            " JOIN op_state s USING (operation_id)" if states else ""
        )
        return self._named("operations", where=_Raw(where), candidates=_Raw(candidates), limit=_limit(limit))

    def operations_by_state(
        self,
        *,
        states: Sequence[str] = (),
        protocols: Sequence[str] = (),
        tools: Sequence[str] = (),
        arms: Sequence[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> pd.DataFrame:
        arm, join = self._arm() if arms else ("", "")
        where = _op_filter(arm, states, protocols, tools, arms, since, until)
        # Join only what the filter reads: op_state alone answers "per state" for everything.
        needs_identity = bool(protocols or tools or arms or since or until)
        source = "op_state s" + (f" JOIN op_identity i USING (operation_id) {join}" if needs_identity else "")
        return self._named("operations_by_state", where=_Raw(where), source=_Raw(source))

    def operation(self, key: str) -> dict[str, object] | None:
        """One operation by call node id or operation id (None if there is none)."""
        frame = self._named("operation", key=key.strip())
        if frame.empty:
            return None
        return {k: (None if _missing(v) else v) for k, v in frame.iloc[0].to_dict().items()}

    def timeline(self, key: str) -> pd.DataFrame:
        """Transitions, protocol requests and the receipt of one call node, in time order."""
        return self._named("operation_timeline", key=key.strip())

    def cancel(self, call_node: str, *, actor: str, reason: str) -> Json:
        body = {"actor": _required(actor, "actor"), "reason": _required(reason, "reason")}
        result = self.source.cancel(_path_part(call_node), body)
        self.clear_cache()
        return result

    # approvals ------------------------------------------------------------------------------

    def approvals_pending(self, *, limit: int = 200) -> pd.DataFrame:
        return self._named("approvals_pending", limit=_limit(limit))

    def approvals_answered(self, *, limit: int = 50) -> pd.DataFrame:
        return self._named("approvals_answered", limit=_limit(limit))

    def answer(self, operation_id: str, input_round: int, *, actor: str, answer: Json) -> Json:
        """Answer one input round; the service refuses (409) an answer to a round that is no longer open."""
        if not isinstance(answer, dict):
            raise ActionRefused(400, "an answer must be a JSON object")
        body = {"actor": _required(actor, "actor"), "answer": answer}
        result = self.source.answer(_path_part(operation_id), int(input_round), body)
        self.clear_cache()
        return result

    # rollout --------------------------------------------------------------------------------

    def rollout_status(self) -> RolloutStatus | None:
        """The rollout as the service reports it; None when no service runs or it has no rollout API yet."""
        raw = self.source.rollout_status()
        return parse_rollout_status(raw) if raw is not None else None

    def rollout_action(
        self,
        action: str,
        *,
        actor: str,
        reason: str,
        percentage: float | None = None,
        protocol: str | None = None,
    ) -> Json:
        """Ask the service for a rollout action (``shadow``, ``canary``, ``promote``, ``rollback``, ...)."""
        if action not in ROLLOUT_ACTIONS:
            raise ActionRefused(400, f"unknown rollout action {action!r}")
        body: Json = {"actor": _required(actor, "actor"), "reason": _required(reason, "reason")}
        if percentage is not None:
            body["percentage"] = percentage
        if protocol is not None:
            body["protocol"] = _choices([protocol], PROTOCOLS)[0]
        result = self.source.rollout(action, body)
        self.clear_cache()
        return result

    def audit_log(self, *, limit: int = 200) -> pd.DataFrame | None:
        """The rollout audit log (newest first), or None while the ledger has no ``rollout_events`` table."""
        if not self.has_table("rollout_events"):
            return None
        frame = self._named("audit_log", limit=_limit(limit))
        for column in frame.columns:
            if column.endswith("_at"):
                frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
        return frame

    # SQL ------------------------------------------------------------------------------------

    def run_sql(self, sql: str, *, max_rows: int = 1000) -> SqlResult:
        """An analyst's own read-only query, through the sandbox (never cached)."""
        columns, rows, truncated, elapsed = self.source.query(sql, max(1, min(int(max_rows), 100_000)))
        return SqlResult(pd.DataFrame(rows, columns=columns), truncated, elapsed, sql)

    # evidence -------------------------------------------------------------------------------

    def evidence_bundle(self, *, decision: str = "", actor: str = "") -> bytes:
        """A zip for a rollout decision: gate verdicts and raw inputs, gate history, explorer coverage,
        the audit chain and its verification, and the SQL behind each chart (with its result)."""
        now = self.now()
        files: dict[str, bytes] = {}
        gates = self.gates()
        files["gates.json"] = _json_bytes(
            {
                "evaluated_at": gates.evaluated_at,
                "run_id": gates.run_id,
                "basis": gates.basis,
                "aged_s": gates.aged_s,
                "passed": gates.passed,
                "gates": [asdict(r) for r in gates.results],
                "inputs": gates.inputs,
            }
        )
        files["gate_history.csv"] = _csv_bytes(self.gate_history(runs=500))
        files["explorer_coverage.csv"] = _csv_bytes(self.explorer_coverage())
        status = None
        try:
            status = self.rollout_status()
        except ConsoleError as exc:
            files["rollout_status_error.txt"] = str(exc).encode()
        files["rollout_status.json"] = _json_bytes(asdict(status) if status else None)
        audit = self.audit_log(limit=5000)
        files["audit_log.csv"] = _csv_bytes(audit) if audit is not None else b""
        files["audit_verification.json"] = _json_bytes(
            asdict(status.audit) if status else {"verified": None, "detail": "no rollout status available"}
        )
        since, until = now - timedelta(days=7), now + timedelta(seconds=1)
        produced: dict[str, Callable[[], pd.DataFrame]] = {
            "arms": self.arms,
            "in_flight": self.in_flight,
            "cancel_latency_over_time": lambda: self.cancel_latency_over_time(since=since, until=until),
            "cancel_latency_summary": lambda: self.cancel_latency_summary(since=since, until=until),
            "slowest_cancels": lambda: self.slowest_cancels(since=since, until=until),
            "unknown_age_histogram": self.unknown_age_histogram,
            "reconciliation_aging": self.reconciliation_aging,
            "explorer_runs": self.explorer_runs,
            "approvals_pending": self.approvals_pending,
        }
        index_lines = ["# The SQL behind each chart", ""]
        for page, names in CHARTS.items():
            index_lines.append(f"## {page}")
            for name in names:
                index_lines.append(f"- `{name}`: {QUERIES[name].title} -> queries/{name}.sql")
            index_lines.append("")
        for name, run in produced.items():
            frame = run()
            files[f"queries/{name}.csv"] = _csv_bytes(frame)
        for name in QUERIES:
            sql = self.last_sql.get(name)
            if sql is None:
                sql = (
                    "-- template (parameters in braces are filled with SQL literals at run time)\n"
                    + QUERIES[name].template.strip()
                )
            files[f"queries/{name}.sql"] = (sql + "\n").encode()
        files["queries/README.md"] = "\n".join(index_lines).encode()
        manifest = {
            "kind": "finality evidence bundle",
            "generated_at": now,
            "decision": decision,
            "actor": actor,
            "source": asdict(self.info),
            "gates_passed": gates.passed,
            "failing_gates": [r.gate for r in gates.failing()],
            "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
        }
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
            bundle.writestr("manifest.json", _json_bytes(manifest))
            for name, data in sorted(files.items()):
                bundle.writestr(name, data)
        return buffer.getvalue()


# ------------------------------------------------------------------------------------ helpers


class _Raw(str):
    """A fragment this module composed itself from validated pieces (never user text)."""


def _param(value: object) -> str:
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, _Choices):
        return lit_list(list(value))
    return lit(value)


class _Choices(tuple[str, ...]):
    pass


def _choices(values: Sequence[str], allowed: Sequence[str]) -> _Choices:
    chosen = [v for v in values if v in allowed]
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f"unknown values {unknown}; allowed: {list(allowed)}")
    return _Choices(chosen)


def _all_arms(chosen: Sequence[str]) -> bool:
    """Whether every arm is chosen (an operation's arm is always one of ``ARMS``: ``rollout.assign.Arm``
    or, with no recorded arm, ``unassigned``), so filtering on the arm would keep every row."""
    return set(chosen) == set(ARMS)


def _limit(value: int) -> int:
    return max(1, min(int(value), 10_000))


def _required(value: str, what: str) -> str:
    text = (value or "").strip()
    if not text:
        raise ActionRefused(400, f"{what} is required")
    return text


_SAFE_PATH = re.compile(r"^[A-Za-z0-9._:@\-]+$")


def _path_part(value: str) -> str:
    text = value.strip()
    if not _SAFE_PATH.match(text):
        raise ActionRefused(400, f"not a valid id: {value!r}")
    return text


def _op_filter(
    arm_sql: str,
    states: Sequence[str],
    protocols: Sequence[str],
    tools: Sequence[str],
    arms: Sequence[str],
    since: datetime | None,
    until: datetime | None,
) -> str:
    parts = ["TRUE"]
    if states:
        parts.append(f"s.state IN {lit_list(_choices(states, STATES))}")
    if protocols:
        parts.append(f"i.protocol IN {lit_list(list(protocols))}")
    if tools:
        parts.append(f"i.tool_name IN {lit_list(list(tools))}")
    if arms:
        parts.append(f"{arm_sql} IN {lit_list(_choices(arms, ARMS))}")
    if since is not None:
        parts.append(f"i.created_at >= {lit(since)}")
    if until is not None:
        parts.append(f"i.created_at < {lit(until)}")
    return " AND ".join(parts)


def _missing(value: object) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def parse_rollout_status(raw: Json) -> RolloutStatus:
    """Read the service's rollout status, tolerating the field names either side may settle on."""
    audit_raw = raw.get("audit_verification") or raw.get("audit") or raw.get("chain") or {}
    if isinstance(audit_raw, bool):
        audit = AuditCheck(audit_raw)
    elif isinstance(audit_raw, dict):
        verified = audit_raw.get("verified", audit_raw.get("ok", audit_raw.get("valid")))
        checked = audit_raw.get("checked", audit_raw.get("events"))
        problems = audit_raw.get("problems") or []
        detail = "; ".join(str(p) for p in problems) if isinstance(problems, list) else str(problems)
        audit = AuditCheck(
            None if verified is None else bool(verified),
            int(checked) if isinstance(checked, int) else None,
            detail or str(audit_raw.get("detail") or audit_raw.get("error") or ""),
        )
    else:
        audit = AuditCheck(None, None, str(audit_raw))
    disabled: list[str] = []
    remaining: dict[str, int] = {}
    for item in raw.get("disabled") or raw.get("disabled_protocols") or []:
        if isinstance(item, dict):
            name = str(item.get("protocol"))
            disabled.append(name)
            if isinstance(item.get("remaining"), int):
                remaining[name] = int(item["remaining"])
        else:
            disabled.append(str(item))
    extra = raw.get("remaining") or raw.get("remaining_ops") or {}
    if isinstance(extra, dict):
        remaining.update({str(k): int(v) for k, v in extra.items() if isinstance(v, int)})
    percentage = _float(raw.get("percentage", raw.get("exposure_percent")))
    if percentage is None and isinstance(raw.get("canary_bp"), int | float):
        percentage = float(raw["canary_bp"]) / 100
    epoch = raw.get("epoch", raw.get("execution_epoch"))
    return RolloutStatus(
        stage=str(raw.get("stage", "unknown")),
        percentage=percentage,
        epoch=int(epoch) if isinstance(epoch, int | float) else None,
        disabled_protocols=tuple(disabled),
        remaining=remaining,
        audit=audit,
        raw=raw,
    )


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, default=_json_default, indent=2, sort_keys=True).encode()


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


def _csv_bytes(frame: pd.DataFrame) -> bytes:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, quoting=csv.QUOTE_MINIMAL)
    return buffer.getvalue().encode()


def frame_to_parquet(frame: pd.DataFrame) -> bytes:
    """A result as Parquet bytes (for downloads)."""
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False)
    return buffer.getvalue()


def frame_to_csv(frame: pd.DataFrame) -> bytes:
    return _csv_bytes(frame)


__all__ = [
    "ARMS",
    "CANCEL_SLO_S",
    "CHARTS",
    "LIVE_STATES",
    "PROTOCOLS",
    "QUERIES",
    "SQL_EXAMPLES",
    "STATES",
    "UNKNOWN_SLO_S",
    "ActionRefused",
    "ConsoleError",
    "GateView",
    "Insights",
    "NotConfigured",
    "QueryFailed",
    "ReadOnlyConsole",
    "RolloutStatus",
    "frame_to_csv",
    "frame_to_parquet",
]
