"""Every statement both ledger backends run: one text each, with the few dialect fragments side by side.

Texts are written once, with ``?`` for a bound parameter and ``{name}`` for a fragment that DuckDB
and PostgreSQL spell differently (``FRAGMENTS``, side by side, as ``engine.ledger.gate_sql`` does for
the gate-inputs statement). ``render(text, dialect)`` fills the fragments and, for PostgreSQL, turns
``?`` into psycopg's ``%s`` (and a literal ``%`` into ``%%``). A driver renders a text once (cached).

Pure text: no database driver, no I/O. Statements only one backend runs (DuckDB's Arrow-registered
bulk writes, PostgreSQL's leases, fencing and send slots) stay in that backend's driver.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

from engine.ledger.schema import _STATE_COLUMNS, OUTBOX_SEQUENCE

__all__ = [
    "DIALECTS",
    "FRAGMENTS",
    "placeholders",
    "render",
]

DIALECTS: Final = ("duckdb", "postgres")

FRAGMENTS: Final[dict[str, dict[str, str]]] = {
    "duckdb": {
        # DuckDB compares text byte by byte already.
        "c": "",
        # One writing process: DuckDB's optimistic transactions refuse a conflicting commit instead.
        "for_update": "",
    },
    "postgres": {
        # Byte order, whatever the database's locale: both backends list rows in the same order.
        "c": ' COLLATE "C"',
        "for_update": " FOR UPDATE",
    },
}
"""What each dialect says its own way: text ordering, and row locks (PostgreSQL only)."""

_FRAGMENT: Final = re.compile(r"\{(\w+)\}")


@lru_cache(maxsize=4096)
def render(text: str, dialect: str) -> str:
    """``text`` in ``dialect``: fragments filled, and for PostgreSQL psycopg's placeholders."""
    fragments = FRAGMENTS[dialect]
    filled = _FRAGMENT.sub(lambda m: fragments[m.group(1)], text)
    if dialect == "postgres":
        return filled.replace("%", "%%").replace("?", "%s")
    return filled


def placeholders(n: int) -> str:
    """``?,?,...``: ``n`` bound parameters."""
    return ",".join("?" * n)


# ------------------------------------------------------------------------------------ schema
SCHEMA_VERSION: Final = "SELECT coalesce(max(version), 0) FROM schema_migrations"
TABLE_COLUMNS: Final = (
    "SELECT table_name, column_name FROM information_schema.columns "
    "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
)

# -------------------------------------------------------------------------------- operations
OPERATION_SELECT: Final = "SELECT * FROM operations"
BY_ID: Final = "operation_id = ?"
BY_CALL_NODE: Final = "call_node_id = ?"
BY_TASK: Final = "server = ? AND task_id = ?"
BY_KEY: Final = "idempotency_key = ?"
OPERATIONS_ORDER: Final = " ORDER BY created_at, operation_id{c}"
LIST_OPERATIONS_ORDER: Final = " ORDER BY created_at DESC, operation_id{c} LIMIT ?"
ARGUMENTS: Final = "SELECT arguments FROM op_identity WHERE operation_id = ?"
STATE_ASSIGNMENTS: Final = ", ".join(f"{c} = ?" for c in _STATE_COLUMNS[1:])
STATE_UPDATE: Final = f"UPDATE op_state SET {STATE_ASSIGNMENTS} WHERE operation_id = ? AND row_version = ? AND cancel_generation = ?"
"""Compare-and-swap of one operation's state on its row version and cancel generation."""
TASK_BINDING_INSERT: Final = "INSERT INTO task_bindings VALUES (?, ?, ?, ?)"
TRANSITION_INSERT: Final = f"INSERT INTO transitions VALUES (nextval('transition_seq'), {placeholders(11)})"
TRANSITIONS_OF: Final = (
    "SELECT seq, from_state, to_state, event, cause, accepted, epoch, row_version, recorded_at "
    "FROM transitions WHERE operation_id = ? ORDER BY seq"
)
FENCED_REPLIES: Final = "SELECT count(*) FROM transitions WHERE NOT accepted AND cause LIKE 'stale epoch%'"

# ---------------------------------------------------------------------- receipts and outbox
RECEIPT_INSERT: Final = f"INSERT INTO receipts VALUES ({placeholders(12)})"
RESULT_INSERT: Final = f"INSERT INTO results VALUES ({placeholders(5)})"
OUTBOX_INSERT: Final = f"INSERT INTO outbox VALUES ({placeholders(7)}, nextval('{OUTBOX_SEQUENCE}'))"
"""One outbox row, numbered by ``outbox_seq`` as it is written (its ``seq``: the consumers' cursor)."""
OUTBOX_ORDER_LOCK: Final = "outbox order"
"""The key a transaction that writes outbox rows serialises on (PostgreSQL: several executors),
from numbering its rows to its commit: entries become visible in ``seq`` order, so a consumer's
cursor never passes an entry that commits later with a lower number."""
OUTBOX_READY: Final = (
    "SELECT o.seq, o.call_node_id, o.operation_id, o.terminal_status AS status, o.result_digest, "
    "o.payload, r.cancel_evidence, r.request_digest, r.task_id, r.accepted_at "
    "FROM outbox o JOIN receipts r USING (call_node_id) "
    "LEFT JOIN outbox_acks a ON a.call_node_id = o.call_node_id AND a.consumer = ? "
    "WHERE a.call_node_id IS NULL AND o.seq > ? ORDER BY o.seq LIMIT ?"
)
"""A consumer's entries after its cursor that it has not acknowledged, in acceptance order."""
OUTBOX_ENTRY: Final = (
    "SELECT o.seq, o.terminal_status, o.result_digest FROM outbox o WHERE o.call_node_id = ?"
)
OUTBOX_ACK_INSERT: Final = "INSERT INTO outbox_acks VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
OUTBOX_ACK_OF: Final = "SELECT acked_at FROM outbox_acks WHERE consumer = ? AND call_node_id = ?"
OUTBOX_ACK_REFUSAL_INSERT: Final = f"INSERT INTO outbox_ack_refusals VALUES ({placeholders(6)})"
OUTBOX_LAG: Final = (
    "WITH per AS (SELECT a.consumer, count(*) AS acknowledged, max(a.entry_seq) AS last_seq, "
    "max(a.acked_at) AS last_ack_at, (SELECT count(*) FROM outbox) - count(*) AS behind "
    "FROM outbox_acks a GROUP BY a.consumer) "
    "SELECT consumer, acknowledged, last_seq, last_ack_at, behind, "
    # Only a consumer behind has an oldest entry it has not acknowledged: the search (every entry
    # against every acknowledgement, the whole cost of this statement) is not made for the others.
    # An acknowledgement records its entry's seq, so the search compares integers.
    "(SELECT min(o.created_at) FROM outbox o WHERE per.behind > 0 AND NOT EXISTS (SELECT 1 FROM outbox_acks x "
    "WHERE x.consumer = per.consumer AND x.entry_seq = o.seq)) AS oldest_unacked_at "
    "FROM per ORDER BY consumer{c}"
)
"""Per consumer that has acknowledged anything: how many entries it acknowledged and how many it has not."""
AUDIT_INSERT: Final = f"INSERT INTO receipt_audit VALUES ({placeholders(6)})"
RECEIPT_OF_CALL_NODE: Final = (
    "SELECT call_node_id, operation_id, request_digest, task_id, tool_version, epoch, cancel_generation, "
    "status, result_digest, accepted_at, cancel_evidence FROM receipts WHERE call_node_id = ?"
)
RECEIPT_OF_OPERATION: Final = "SELECT * FROM receipts WHERE operation_id = ?"
RESULT_PAYLOAD: Final = "SELECT payload FROM results WHERE operation_id = ?"
HELD_OUTCOME: Final = (
    "SELECT status, digest, payload, task_id, epoch_echo, held_at FROM held_outcomes WHERE operation_id = ?"
)
HELD_REPLACE: Final = (
    " ON CONFLICT (operation_id) DO UPDATE SET status = EXCLUDED.status, digest = EXCLUDED.digest, "
    "payload = EXCLUDED.payload, task_id = EXCLUDED.task_id, epoch_echo = EXCLUDED.epoch_echo, "
    "held_at = EXCLUDED.held_at"
)
"""What ``held_outcomes`` rows end with: a later copy of an operation's outcome replaces the earlier one."""
IGNORE_DUPLICATE: Final = " ON CONFLICT DO NOTHING"

# ------------------------------------------------------- polls, approvals and reconciliation
POLLS: Final = "SELECT * FROM polls ORDER BY sent_at"
POLLS_OF: Final = "SELECT * FROM polls WHERE operation_id = ? ORDER BY sent_at"
POLL_COUNT: Final = "SELECT count(*) FROM polls WHERE operation_id = ?"
POLL_COUNTS: Final = "SELECT outcome, count(*) FROM polls GROUP BY outcome ORDER BY outcome{c}"
APPROVAL_INSERT: Final = (
    "INSERT INTO approvals (operation_id, input_round, request_key, message, requested_schema, "
    "schema_digest, deadline, status, opened_at) VALUES (?,?,?,?,?,?,?,'pending',?) ON CONFLICT DO NOTHING"
)
ROUNDS_EXPIRE: Final = (
    "UPDATE approvals SET status = 'expired', closed_at = ?, closed_reason = 'its deadline passed' "
    "WHERE status = 'pending' AND deadline <= ?"
)
"""A pending round whose deadline has passed is no longer answerable (the instant is recorded)."""
ROUNDS_MOVED_PAST: Final = (
    "UPDATE approvals SET status = 'closed', closed_at = ?, closed_reason = CASE "
    "WHEN s.input_round > approvals.input_round "
    "THEN 'the server moved on to round ' || CAST(s.input_round AS VARCHAR) "
    "ELSE 'the operation moved on to ' || s.state END "
    "FROM op_state s WHERE s.operation_id = approvals.operation_id AND approvals.status = 'pending' "
    "AND (s.input_round > approvals.input_round OR (s.input_round = approvals.input_round "
    "AND s.state NOT IN ('INPUT_REQUIRED', 'UNKNOWN')))"
)
"""A pending round whose operation no longer waits on it: the server asked a newer question, or the
operation is working again, cancelled or ended at that round. UNKNOWN is left alone (nothing is
known yet), and so is a round the stored state has not reached: the executor that opened it may
not have committed its move into the round yet (its writes are group-committed)."""
APPROVAL_ANSWER: Final = (
    "UPDATE approvals SET status = 'answered', answer = ?, actor = ?, answered_at = ? "
    "WHERE operation_id = ? AND input_round = ? AND status = 'pending'"
)
ANSWER_OF: Final = (
    "SELECT answer FROM approvals WHERE operation_id = ? AND input_round = ? AND status = 'answered'"
)
APPROVAL_OF: Final = "SELECT * FROM approvals WHERE operation_id = ? AND input_round = ?"
APPROVALS: Final = "SELECT * FROM approvals"
APPROVALS_PENDING: Final = " WHERE status = 'pending'"
APPROVALS_ORDER: Final = " ORDER BY opened_at, operation_id{c}"
RECONCILIATION_OPEN_ENTRY: Final = (
    "SELECT entry_id FROM reconciliation WHERE operation_id = ? AND kind = ? AND status = 'open'"
)
RECONCILIATION_INSERT: Final = (
    f"INSERT INTO reconciliation VALUES (nextval('reconciliation_seq'),{placeholders(9)},"
    "'open',?,NULL,NULL,NULL) RETURNING entry_id"
)
RECONCILIATION_RESOLVE_ENTRY: Final = (
    "UPDATE reconciliation SET status = 'resolved', resolved_at = ?, actor = ?, resolution = ? "
    "WHERE entry_id = ? AND status = 'open'"
)
RECONCILIATION_RESOLVE_OPEN: Final = (
    "UPDATE reconciliation SET status = 'resolved', resolved_at = ?, actor = ?, resolution = ? "
    "WHERE operation_id = ? AND kind = ? AND status = 'open'"
)
RECONCILIATION: Final = "SELECT * FROM reconciliation"
RECONCILIATION_OPEN: Final = " WHERE status = 'open'"
RECONCILIATION_ORDER: Final = " ORDER BY opened_at, entry_id"
OPEN_RECONCILIATION_COUNTS: Final = (
    "SELECT kind, count(*) FROM reconciliation WHERE status = 'open' GROUP BY kind ORDER BY kind{c}"
)

# ------------------------------------------------------------------------------- counts
STATE_COUNTS: Final = (
    "SELECT s.state, i.protocol, count(*) FROM op_state s JOIN op_identity i USING (operation_id) "
    "GROUP BY s.state, i.protocol ORDER BY s.state{c}, i.protocol{c}"
)

# --------------------------------------------------------------- settings, explorer, gates
SETTING: Final = "SELECT value FROM settings WHERE key = ?"
SETTING_PUT: Final = (
    "INSERT INTO settings VALUES (?, ?, ?) "
    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at"
)
EXPLORER_RUN_INSERT: Final = (
    f"INSERT INTO explorer_runs VALUES (nextval('explorer_run_seq'),{placeholders(15)}) RETURNING run_id"
)
EXPLORER_RUNS: Final = "SELECT * FROM explorer_runs ORDER BY run_id"
DENIAL_INSERT: Final = f"INSERT INTO access_denials VALUES ({placeholders(10)})"
DENIALS: Final = "SELECT * FROM access_denials ORDER BY recorded_at DESC LIMIT ?"
GATE_RUN_ID: Final = "SELECT nextval('gate_run_seq')"
GATE_RUN_INSERT: Final = f"INSERT INTO gate_runs VALUES ({placeholders(8)})"
GATE_RUNS: Final = "SELECT * FROM gate_runs ORDER BY run_id DESC, gate{c} LIMIT ?"

# -------------------------------------------------------------------------------- rollout
ROLLOUT_STATE: Final = "SELECT * FROM rollout_state WHERE id = 1"
EXECUTION_EPOCH: Final = "SELECT epoch FROM rollout_state WHERE id = 1"
ROLLOUT_HEAD: Final = "SELECT head_seq, epoch FROM rollout_state WHERE id = 1{for_update}"
ROLLOUT_STATE_INSERT: Final = f"INSERT INTO rollout_state VALUES (1, {placeholders(9)})"
ROLLOUT_STATE_UPDATE: Final = (
    "UPDATE rollout_state SET stage = ?, canary_bp = ?, salt = ?, shadow_tools = ?, "
    "disabled_protocols = ?, epoch = ?, head_seq = ?, head_hash = ?, updated_at = ? "
    "WHERE id = 1 AND head_seq = ? AND epoch = ?"
)
ROLLOUT_EVENTS: Final = "SELECT * FROM rollout_events ORDER BY seq"
ASSIGNMENTS: Final = "SELECT * FROM rollout_assignments ORDER BY assigned_at DESC LIMIT ?"
ROLLOUT_KEYS: Final = (
    "SELECT a.call_node_id, a.operation_id, s.state FROM rollout_assignments a "
    "JOIN op_state s USING (operation_id) WHERE a.role = 'primary' AND a.arm IN ('control', 'canary') "
    "ORDER BY a.call_node_id{c}"
)
ARM_COUNTS: Final = (
    "SELECT a.arm, a.server_name, i.protocol, "
    "s.state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED') AS in_flight, count(*) AS operations "
    "FROM rollout_assignments a JOIN op_state s USING (operation_id) "
    "JOIN op_identity i USING (operation_id) GROUP BY 1, 2, 3, 4 "
    "ORDER BY a.arm{c}, a.server_name{c}, i.protocol{c}, 4, 5"
)
LIVE_BY_PROTOCOL: Final = (
    "SELECT i.protocol, s.state, count(*) FROM op_state s JOIN op_identity i USING (operation_id) "
    "WHERE s.state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED') GROUP BY 1, 2 "
    "ORDER BY i.protocol{c}, s.state{c}"
)
SHADOW_PAIRS: Final = (
    "SELECT a.primary_operation_id, a.operation_id FROM rollout_assignments a "
    "LEFT JOIN shadow_diffs d ON d.shadow_operation_id = a.operation_id "
    "WHERE a.role = 'shadow' AND a.primary_operation_id IS NOT NULL AND d.shadow_operation_id IS NULL"
)
SHADOW_PAIRS_READY: Final = (
    " AND a.operation_id IN (SELECT operation_id FROM receipts)"
    " AND a.primary_operation_id IN (SELECT operation_id FROM receipts)"
)
SHADOW_PAIRS_ORDER: Final = " ORDER BY a.assigned_at"
SHADOW_DIFFS: Final = "SELECT * FROM shadow_diffs"
SHADOW_DIFFS_ORDER: Final = " ORDER BY recorded_at DESC LIMIT ?"
SHADOW_SUMMARY: Final = (
    "SELECT (SELECT count(*) FROM rollout_assignments WHERE role = 'shadow'), count(*), "
    "count(*) FILTER (WHERE diverged), count(*) FILTER (WHERE differences LIKE '%status%'), "
    "count(*) FILTER (WHERE differences LIKE '%result%'), "
    "CAST(avg(shadow_latency_ms - primary_latency_ms) AS FLOAT8), "
    "CAST(avg(shadow_polls - primary_polls) AS FLOAT8) FROM shadow_diffs"
)
