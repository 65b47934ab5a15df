"""The console's named SQL: every chart's and table's query, one text for both backends with dialect fragments side by side.

Text and literal quoting only: no connection is opened here; sources run these queries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from engine.ledger import sql as ledger_sql
from engine.ledger.gate_sql import (
    CANCEL_PENDING,
    DIALECTS,
    GATE_INPUTS_FRAGMENTS,
    GATE_INPUTS_TEMPLATE,
    LATEST_RUN_SQL,
)
from engine.ledger.gate_sql import seconds_between as secs
from engine.model import RECEIPT_STATES, LocalState
from engine.model import Protocol as WireProtocol

CANCEL_SLO_S: Final = 60.0
"""The cancel-confirmation line drawn on the latency charts (the gate's threshold)."""


UNKNOWN_SLO_S: Final = 15 * 60.0
"""The UNKNOWN reconciliation line drawn on the age charts (the gate's threshold)."""


APPROVAL_EXPIRING_S: Final = 5 * 60.0
"""An open approval whose deadline is this close is an alert: a person still has time to answer it.
(A round past its deadline is expired by the service's sweep within seconds, so "overdue" said 0.)"""


APPROVAL_EXPIRED_RECENT_S: Final = 60 * 60.0
"""Rounds expired unanswered within this long are an alert: their operations went on without an answer."""


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
            "Raw inputs of the six gates (engine.ledger.gate_sql: the one definition Ledger.gate_inputs shares)",
            GATE_INPUTS_TEMPLATE,
            times=("last_run_at",),
            fragments=GATE_INPUTS_FRAGMENTS,
        ),
        NamedQuery(
            "latest_gate_run",
            "The latest recorded gate run with the ledger's last write instant and counts (engine.ledger.gate_sql)",
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
  (SELECT count(*) FROM approvals WHERE status = 'pending' AND deadline > {{now}}
     AND {secs("deadline", "{now}")} <= {APPROVAL_EXPIRING_S}) AS approvals_expiring,
  (SELECT count(*) FROM approvals WHERE status = 'expired'
     AND {secs("{now}", "closed_at")} <= {APPROVAL_EXPIRED_RECENT_S}) AS approvals_expired_recently,
  (SELECT count(*) FROM op_state WHERE cancel_requested_at IS NOT NULL
     AND {CANCEL_PENDING}) AS cancels_pending,
  (SELECT count(*) FROM op_state WHERE cancel_requested_at IS NOT NULL AND {CANCEL_PENDING}
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
            "cancel_span",
            "When the confirmed cancels in a window begin and end (the chart's window fits them)",
            """
SELECT min(r.accepted_at) AS first_at, max(r.accepted_at) AS last_at, count(*) AS cancels
FROM op_state s JOIN receipts r USING (operation_id)
WHERE s.cancel_requested_at IS NOT NULL AND r.accepted_at >= {since} AND r.accepted_at < {until}""",
            times=("first_at", "last_at"),
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
       r.task_id, r.idempotency_key, r.reason, r.candidates, r.opened_at,
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
WITH pair AS (
    SELECT rules, code, scenario, protocol,
           bool_or(coalesce(space_kind = 'exact', false)) AS exact,
           bool_or(coalesce(space_kind = 'at_least', false)) AS at_least
    FROM explorer_runs GROUP BY rules, code, scenario, protocol
), pairs AS (
    -- a pair any run exhausted is exact; else proven large if any run reached its limit
    SELECT rules, code, count(*) AS pairs, count(*) FILTER (WHERE exact) AS pairs_exact,
           count(*) FILTER (WHERE at_least AND NOT exact) AS pairs_at_least
    FROM pair GROUP BY rules, code
)
SELECT r.rules, r.code, count(*) AS runs, count(DISTINCT scenario) AS scenarios,
       count(DISTINCT protocol) AS protocols,
       CAST(sum(explored) AS BIGINT) AS explored, CAST(sum(distinct_interleavings) AS BIGINT) AS interleavings,
       CAST(sum(divergent) AS BIGINT) AS divergent, bool_and(exhaustive) AS exhaustive,
       min(p.pairs) AS pairs, min(p.pairs_exact) AS pairs_exact, min(p.pairs_at_least) AS pairs_at_least,
       max(finished_at) AS last_finished_at
FROM explorer_runs r JOIN pairs p ON p.rules = r.rules AND p.code = r.code
GROUP BY r.rules, r.code ORDER BY r.rules <> 'engine', r.code <> 'shipped', r.rules, r.code""",
            times=("last_finished_at",),
        ),
        NamedQuery(
            "explorer_runs",
            "Race explorer runs",
            """
SELECT run_id, scenario, protocol, rules, code, revision, explored, distinct_interleavings, divergent,
       exhaustive, space, space_kind, shortest_trace, finished_at
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
            "Answerable approvals (the operation waits on this very round, before its deadline), newest first",
            """
SELECT a.operation_id, a.input_round, i.call_node_id, i.tool_name, i.protocol, s.state,
       s.input_round AS current_round, a.message, a.requested_schema, a.schema_digest, a.deadline, a.opened_at,
       a.request_key
FROM approvals a JOIN op_identity i USING (operation_id) JOIN op_state s USING (operation_id)
WHERE a.status = 'pending' AND s.state = 'INPUT_REQUIRED' AND s.input_round = a.input_round
  AND (a.deadline IS NULL OR a.deadline > {now})
ORDER BY a.opened_at DESC, a.operation_id, a.input_round LIMIT {limit}""",
            times=("deadline", "opened_at"),
        ),
        NamedQuery(
            "approvals_answered",
            "Recently answered approvals",
            f"""
SELECT i.call_node_id, i.tool_name, a.input_round, a.actor, a.answer, a.opened_at, a.answered_at,
       {secs("a.answered_at", "a.opened_at")} AS waited_s, a.operation_id
FROM approvals a JOIN op_identity i USING (operation_id)
WHERE a.status = 'answered' ORDER BY a.answered_at DESC, a.operation_id, a.input_round LIMIT {{limit}}""",
            times=("opened_at", "answered_at"),
        ),
        NamedQuery(
            "outbox_lag",
            "Outbox lag per downstream consumer: entries acknowledged, entries behind, the oldest waiting",
            # The ledger's own statement (``LedgerPort.outbox_lag`` runs the same text).
            ledger_sql.OUTBOX_LAG,
            times=("last_ack_at", "oldest_unacked_at"),
            fragments={d: {"c": ledger_sql.FRAGMENTS[d]["c"]} for d in DIALECTS},
        ),
        NamedQuery(
            "shadow_summary",
            "Shadow comparisons per tool: the old path and the new one, compared and diverged",
            """
SELECT d.tool_name, pi.protocol AS old_path, si.protocol AS new_path, pi.server AS old_server,
       si.server AS new_server, count(*) AS compared, count(*) FILTER (WHERE d.diverged) AS diverged,
       max(d.recorded_at) AS last_compared_at
FROM shadow_diffs d JOIN op_identity pi ON pi.operation_id = d.primary_operation_id
JOIN op_identity si ON si.operation_id = d.shadow_operation_id
GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3""",
            times=("last_compared_at",),
        ),
        NamedQuery(
            "shadow_diverged",
            "Diverged shadow pairs, newest first (status, result digest and latency on each side)",
            """
SELECT d.recorded_at, d.tool_name, pi.call_node_id AS old_call_node, si.call_node_id AS new_call_node,
       d.primary_status AS old_status, d.shadow_status AS new_status,
       d.primary_result_digest AS old_result_digest, d.shadow_result_digest AS new_result_digest,
       d.primary_latency_ms AS old_latency_ms, d.shadow_latency_ms AS new_latency_ms, d.differences
FROM shadow_diffs d JOIN op_identity pi ON pi.operation_id = d.primary_operation_id
JOIN op_identity si ON si.operation_id = d.shadow_operation_id
WHERE d.diverged ORDER BY d.recorded_at DESC, d.primary_operation_id LIMIT {limit}""",
            times=("recorded_at",),
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
        NamedQuery(
            "access_denials",
            "Refused control-API attempts (who, what, when)",
            """
SELECT recorded_at, principal, token_id, method, path, permission, status, needed_role, reason, client
FROM access_denials ORDER BY recorded_at DESC LIMIT {limit}""",
            max_rows=5000,
        ),
    )
}
"""Every chart's and table's SQL. One text for both backends (DuckDB and PostgreSQL run it alike), but
for a query's ``fragments``, which each dialect says its own way, side by side in the same entry."""


EXPIRED_APPROVALS: Final = "Approvals expired unanswered, newest first"
"""The SQL example the Overview's expired-approvals alert links to."""


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
    EXPIRED_APPROVALS: (
        "SELECT operation_id, input_round, message, deadline, closed_at, closed_reason\n"
        "FROM approvals WHERE status = 'expired' ORDER BY closed_at DESC LIMIT 100"
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
    "Overview": ("arms", "in_flight", "alerts", "outbox_lag"),
    "Cancel latency": (
        "cancel_span",
        "cancel_latency_over_time",
        "cancel_latency_summary",
        "slowest_cancels",
    ),
    "UNKNOWN and reconciliation": (
        "unknown_age_histogram",
        "reconciliation_aging",
        "reconciliation_resolved",
    ),
    "Gate compliance": ("gate_history", "explorer_coverage", "explorer_runs"),
    "Operations": ("filter_options", "operations", "operations_by_state", "operation", "operation_timeline"),
    "Approvals": ("approvals_pending", "approvals_answered"),
    "Rollout control": ("audit_log", "shadow_summary", "shadow_diverged"),
}
"""Which named queries each page's charts and tables come from (the evidence bundle's index)."""


__all__ = [
    "APPROVAL_EXPIRED_RECENT_S",
    "APPROVAL_EXPIRING_S",
    "ARMS",
    "ARM_FALLBACK_SQL",
    "ARM_JOIN_SQL",
    "ARM_SQL",
    "CANARY_ADAPTER_VERSION",
    "CANCEL_SLO_S",
    "CHARTS",
    "EXPIRED_APPROVALS",
    "LIVE_STATES",
    "PROTOCOLS",
    "QUERIES",
    "ROLLOUT_ACTIONS",
    "SQL_EXAMPLES",
    "STATES",
    "TERMINAL_SQL",
    "UNKNOWN_SLO_S",
    "NamedQuery",
    "lit",
    "lit_list",
]
