"""The one definition of the six gates' raw inputs: a single SQL statement and its row -> inputs conversion.

``GATE_INPUTS_TEMPLATE`` is one read-only SELECT over the ledger's tables (unqualified names),
returning one row, for both backends: written in SQL that DuckDB and PostgreSQL both run, except two
fragments each says its own way (``GATE_INPUTS_DIALECTS``, side by side). It runs on the ledger's own
connection (``Ledger.gate_inputs``, used by the rollout controller, ``finality gates`` and
``GET /api/v1/gates``), as a sandboxed query on a snapshot or a read-only ledger file (the console,
``console.insights``) and, on PostgreSQL, as analyst SQL (``PgLedger.analyst_query``). The one
parameters, ``{now}`` and ``{revision}``, are filled with a ``TIMESTAMPTZ`` literal and the running
code's git revision by ``gate_inputs_sql(now, dialect)`` (the sandbox takes no bound parameters, so
the text carries them itself).

``gate_inputs_from_row`` turns that row (column name -> value) into the nested shape
``rollout.gates.evaluate`` takes; the inputs are hashed into the rollout audit chain, so counts
come out as ``int``, measurements as ``float`` (or None) and ``last_run_at`` as an aware datetime,
whichever way the row travelled (DuckDB values, or JSON through the service).

Pure: no database access here (no duckdb import), no clock reads; the revision is read once per process.

Definitions (each a whole-ledger aggregate; a million operations read in about a second):

* terminal_divergence: explorer runs of the shipped code (``code = 'shipped'``: the real driver and
  adapters) with the engine's rules at the running revision; summed distinct interleavings and
  divergent ones; when the last finished. Runs of the explorer's model, of another revision, and
  rows the demo seeding made up (``code = 'seeded'``) never count.
* duplicate_operations: operations; operations bound to more than one distinct server task (task
  names are stored in their protocol's one spelling, ``Backend.canonical_task_id``); operations
  resubmitted after a proof of absence (``submit_attempts > 0``).
* poll_amplification: protocol requests; the busiest sliding one-second window (exact; only the
  seconds whose pair of whole-second buckets could beat the busiest single bucket are counted
  exactly, because any one-second window lies within two consecutive whole seconds); the
  configured global QPS (``settings.global_qps``).
* cancel_confirmation: cancels confirmed by a receipt, their p99 and max latency from the cancel
  request to acceptance; cancels still pending and the oldest one's age at ``now``. A cancel whose
  operation a person declared absent (NOT_FOUND_SAFE: the wait ended without a receipt, after the
  server lost the task) is no longer pending: nothing is left to confirm, and its time with a
  person counts in unknown_reconciliation. (Counted as pending, it failed the demo's gate for good.)
* unknown_reconciliation: UNKNOWN reconciliation entries; open ones; the oldest open one's age; the
  p99 age (open: at ``now``; resolved: time to resolution); the slowest resolution.
* traceability: outbox rows; downstream advances (consumers' acknowledgements, ``outbox_acks``) and
  those without a receipt of the same call node, status and result digest; acknowledgements the
  ledger refused (no such entry, or not what it holds); entries no consumer has acknowledged, those
  ready for longer than ``UNACKED_STALE_S`` and the oldest one's age at ``now``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from engine.revision import running_revision

DUPLICATED_OPERATION_IDS: Final = (
    "SELECT operation_id FROM task_bindings GROUP BY operation_id HAVING count(DISTINCT task_id) > 1"
)
"""The operations the duplicate_operations gate counts (bound to more than one distinct server task):
the gate's statement counts these rows and the console's Operations filter lists them, one text."""

CANCEL_PENDING: Final = "state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED', 'NOT_FOUND_SAFE')"
"""An op_state row with ``cancel_requested_at`` set whose cancel still awaits confirmation (see the
module docstring); the gate and the console's counts both use it."""

GATE_INPUTS_TEMPLATE: Final = (
    """
WITH
explorer AS (
  SELECT count(*) AS runs, CAST(coalesce(sum(distinct_interleavings), 0) AS BIGINT) AS interleavings,
         CAST(coalesce(sum(divergent), 0) AS BIGINT) AS divergent, max(finished_at) AS last_run_at
  FROM explorer_runs WHERE rules = 'engine' AND code = 'shipped' AND revision = {revision}
),
ops AS (SELECT count(*) AS n, count(*) FILTER (WHERE submit_attempts > 0) AS resubmitted FROM op_state),
dups AS (
  SELECT count(*) AS n
  FROM ("""
    + DUPLICATED_OPERATION_IDS
    + """) AS d
),
b AS (SELECT {sent_second} AS sec, count(*) AS n FROM polls GROUP BY 1),
best AS (SELECT coalesce(max(n), 0) AS n FROM b),
cand AS (
  SELECT b.sec FROM b LEFT JOIN b AS nxt ON nxt.sec = b.sec + 1
  WHERE b.n + coalesce(nxt.n, 0) > (SELECT n FROM best)
),
near AS (SELECT sec FROM cand UNION SELECT sec + 1 FROM cand),
w AS (
  SELECT count(*) OVER (ORDER BY sent_at RANGE BETWEEN CURRENT ROW AND INTERVAL '999999 microseconds' FOLLOWING) AS n
  FROM polls WHERE {sent_second} IN (SELECT sec FROM near)
),
cancels AS (
  SELECT count(*) AS confirmed,
         percentile_cont(0.99) WITHIN GROUP (ORDER BY {latency}) AS p99_s,
         max({latency}) AS max_s
  FROM op_state s JOIN receipts r USING (operation_id) WHERE s.cancel_requested_at IS NOT NULL
),
pending AS (
  SELECT count(*) AS n, max({pending_age}) AS oldest_s FROM op_state
  WHERE cancel_requested_at IS NOT NULL AND {cancel_pending}
),
unknown AS (
  SELECT count(*) AS entries, count(*) FILTER (WHERE status = 'open') AS open,
         max(CASE WHEN status = 'open' THEN {open_age} END) AS oldest_open_s,
         percentile_cont(0.99) WITHIN GROUP (ORDER BY CASE WHEN status = 'open' THEN {open_age}
                                             ELSE {resolution} END) AS p99_age_s,
         max(CASE WHEN status = 'resolved' THEN {resolution} END) AS slowest_resolution_s
  FROM reconciliation WHERE kind = 'unknown'
),
trace AS (
  SELECT count(*) AS advances,
         count(*) FILTER (WHERE r.call_node_id IS NULL OR r.status <> a.status
                          OR r.result_digest IS DISTINCT FROM a.result_digest) AS untraceable
  FROM outbox_acks a LEFT JOIN receipts r USING (call_node_id)
),
unacked AS (
  SELECT count(*) AS n, max({entry_age}) AS oldest_s,
         count(*) FILTER (WHERE {entry_age} > {stale_s}) AS stale
  FROM outbox o WHERE NOT EXISTS (SELECT 1 FROM outbox_acks a WHERE a.call_node_id = o.call_node_id)
)
SELECT explorer.runs AS explorer_runs, explorer.interleavings, explorer.divergent, explorer.last_run_at,
       ops.n AS operations, dups.n AS operations_with_second_server_task, ops.resubmitted,
       (SELECT count(*) FROM polls) AS requests,
       greatest((SELECT n FROM best), coalesce((SELECT max(n) FROM w), 0)) AS busiest_1s_window,
       (SELECT {qps} FROM settings WHERE key = 'global_qps') AS configured_qps,
       cancels.confirmed, cancels.p99_s, cancels.max_s, pending.n AS pending, pending.oldest_s AS oldest_pending_s,
       unknown.entries, unknown.open, unknown.oldest_open_s, unknown.p99_age_s, unknown.slowest_resolution_s,
       (SELECT count(*) FROM outbox) AS outbox_rows, trace.advances, trace.untraceable,
       (SELECT count(*) FROM outbox_ack_refusals) AS refused_acks,
       unacked.n AS unacknowledged, unacked.stale AS stale_unacknowledged,
       unacked.oldest_s AS oldest_unacknowledged_s
FROM explorer, ops, dups, cancels, pending, unknown, trace, unacked
"""
)
"""The statement, in SQL both DuckDB and PostgreSQL run, with ``{now}`` and the dialect's fragments
(``GATE_INPUTS_DIALECTS``) as placeholders; fill them with ``gate_inputs_sql``."""

UNACKED_STALE_S: Final = 300.0
"""How long an outbox entry may stay ready without any consumer's acknowledgement before the
traceability gate counts it as stale (``stale_unacknowledged``; ``rollout.gates`` fails on the oldest's age)."""

DIALECTS: Final = ("duckdb", "postgres")
"""The SQL dialects of the ledger's backends: DuckDB (``engine.ledger``) and PostgreSQL (``engine.ledger.postgres``)."""


def seconds_between(later: str, earlier: str) -> str:
    """``later - earlier`` in seconds, a DOUBLE on either backend (DuckDB's ``extract(epoch ...)`` is
    already one, so its cast costs nothing there; PostgreSQL's is NUMERIC)."""
    return f"(CAST(extract(epoch FROM {later}) AS FLOAT8) - CAST(extract(epoch FROM {earlier}) AS FLOAT8))"


GATE_INPUTS_DIALECTS: Final[dict[str, dict[str, str]]] = {
    "duckdb": {
        # integer arithmetic on the stored microseconds: the busiest-window scan reads every poll
        "sent_second": "epoch_us(sent_at) // 1000000",
        "qps": "TRY_CAST(value AS DOUBLE)",
    },
    "postgres": {
        "sent_second": "CAST(floor(extract(epoch FROM sent_at)) AS BIGINT)",
        # TRY_CAST's NULL for a value that is not a number
        "qps": (
            "CASE WHEN value ~ '^\\s*[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]+)?\\s*$' "
            "THEN CAST(value AS FLOAT8) END"
        ),
    },
}
"""What each dialect says its own way, side by side: the second a poll was sent in, and the configured
QPS read from its text (NULL when it is not a number)."""

_COMMON_FRAGMENTS: Final = {
    "latency": seconds_between("r.accepted_at", "s.cancel_requested_at"),
    "pending_age": seconds_between("{now}", "cancel_requested_at"),
    "cancel_pending": CANCEL_PENDING,
    "open_age": seconds_between("{now}", "opened_at"),
    "resolution": seconds_between("resolved_at", "opened_at"),
    "entry_age": seconds_between("{now}", "o.created_at"),
    "stale_s": repr(UNACKED_STALE_S),
}

GATE_INPUTS_FRAGMENTS: Final[dict[str, dict[str, str]]] = {
    dialect: {**_COMMON_FRAGMENTS, **GATE_INPUTS_DIALECTS[dialect]} for dialect in DIALECTS
}
"""Per dialect, every placeholder of ``GATE_INPUTS_TEMPLATE`` but ``{now}`` (they may hold ``{now}``)."""


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
    "advances",
    "untraceable",
    "refused_acks",
    "unacknowledged",
    "stale_unacknowledged",
    "oldest_unacknowledged_s",
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
        "advances",
        "untraceable",
        "refused_acks",
        "unacknowledged",
        "stale_unacknowledged",
    }
)
_MEASURES: Final = frozenset(set(COLUMNS) - _COUNTS - {"last_run_at"})


WRITE_SETTLE_S: Final = 2.0
"""How long after the instant it records a write may be committed (the service's group commit
flushes every 50 ms). A recorded run is taken as unwritten-since only when every recorded instant
in the gate-input tables is at least this much older than the run: a write committed after the run
read the ledger, but stamped just before it, would otherwise go unseen."""

LATEST_RUN_SQL: Final = """
WITH
latest AS (SELECT * FROM gate_runs WHERE run_id = (SELECT max(run_id) FROM gate_runs)),
writes AS (
  SELECT greatest(
           (SELECT max(finished_at) FROM explorer_runs),
           (SELECT max(updated_at) FROM op_state),
           (SELECT max(bound_at) FROM task_bindings),
           (SELECT max(recorded_at) FROM transitions),
           (SELECT greatest(max(sent_at), max(received_at)) FROM polls),
           (SELECT max(accepted_at) FROM receipts),
           (SELECT max(created_at) FROM outbox),
           (SELECT max(acked_at) FROM outbox_acks),
           (SELECT max(refused_at) FROM outbox_ack_refusals),
           (SELECT greatest(max(opened_at), max(resolved_at)) FROM reconciliation),
           (SELECT max(updated_at) FROM settings)
         ) AS last_write_at,
         (SELECT count(*) FROM explorer_runs WHERE rules = 'engine' AND code = 'shipped') AS now_explorer_runs,
         (SELECT count(*) FROM op_state) AS now_operations,
         (SELECT count(*) FROM polls) AS now_requests,
         (SELECT count(*) FROM reconciliation WHERE kind = 'unknown') AS now_entries,
         (SELECT count(*) FROM outbox) AS now_outbox_rows,
         (SELECT count(*) FROM outbox_acks) AS now_advances
)
SELECT latest.run_id, latest.gate, latest.inputs, latest.evaluated_at, writes.*
FROM latest, writes ORDER BY latest.gate
""".strip()
"""The latest recorded gate run (one row per gate) with, on each row, the ledger's last recorded
write instant over every table the gate inputs read and the row counts a late write would change.
Answered from min/max statistics and table counts: no scan of the ledger's rows."""

_RUN_COUNTS: Final = (
    ("now_explorer_runs", "terminal_divergence", "explorer_runs"),
    ("now_operations", "duplicate_operations", "operations"),
    ("now_requests", "poll_amplification", "requests"),
    ("now_entries", "unknown_reconciliation", "entries"),
    ("now_outbox_rows", "traceability", "outbox_rows"),
    ("now_advances", "traceability", "advances"),
)


@dataclass(frozen=True, slots=True)
class RecordedRun:
    """The latest recorded gate run, as ``LATEST_RUN_SQL`` read it."""

    run_id: int
    evaluated_at: datetime
    inputs: dict[str, dict[str, object]] | None
    """The raw inputs per gate; None when the run did not record them (``problem`` says why)."""
    last_write_at: datetime | None
    """The latest instant recorded in the gate-input tables when read (None: they are empty)."""
    counts: dict[str, int]
    problem: str = ""

    def written_since(self) -> str | None:
        """Why the ledger may have changed since this run read it, or None when it cannot have.

        Exact for a ledger nobody writes while it is read (file mode): a write after the run
        either records a later instant (checked with ``WRITE_SETTLE_S`` of margin) or changes a
        count the run recorded.
        """
        if self.inputs is None:
            return self.problem or "the run recorded no raw inputs"
        if self.last_write_at is not None:
            settled = self.evaluated_at - timedelta(seconds=WRITE_SETTLE_S)
            if self.last_write_at > settled:
                return (
                    f"the ledger records a write at {self.last_write_at:%Y-%m-%d %H:%M:%S} UTC, "
                    f"less than {WRITE_SETTLE_S:g} s before or after the run"
                )
        for column, gate, name in _RUN_COUNTS:
            if self.counts.get(column) != self.inputs[gate][name]:
                return (
                    f"{gate}.{name} was {self.inputs[gate][name]} at the run, {self.counts.get(column)} now"
                )
        return None


def recorded_run_from_rows(columns: list[str], rows: list[list[object]]) -> RecordedRun | None:
    """``LATEST_RUN_SQL``'s rows as a ``RecordedRun``; None when no gate run is recorded."""
    if not rows:
        return None
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    first = records[0]
    evaluated_at = _timestamp(first["evaluated_at"])
    last_write = first["last_write_at"]
    problem = ""
    inputs: dict[str, dict[str, object]] | None
    try:
        inputs = gate_inputs_from_recorded({str(r["gate"]): r["inputs"] for r in records})
    except ValueError as exc:
        inputs, problem = None, str(exc)
    counts = {c: int(str(first[c])) for c, _, _ in _RUN_COUNTS}
    return RecordedRun(
        run_id=int(str(first["run_id"])),
        evaluated_at=evaluated_at,
        inputs=inputs,
        last_write_at=None if last_write is None else _timestamp(last_write),
        counts=counts,
        problem=problem,
    )


def _timestamp(value: object) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def timestamp_literal(now: datetime) -> str:
    """``now`` as a ``TIMESTAMPTZ`` literal in UTC (a naive datetime is taken to be UTC)."""
    instant = now if now.tzinfo else now.replace(tzinfo=UTC)
    return f"TIMESTAMPTZ '{instant.astimezone(UTC).isoformat()}'"


def gate_inputs_sql(now: datetime, dialect: str = "duckdb") -> str:
    """The gate-inputs statement in ``dialect`` (``duckdb`` or ``postgres``) with ``now`` filled in,
    ready to run on a ledger connection, in the DuckDB sandbox or as PostgreSQL analyst SQL.

    Raises:
        ValueError: an unknown dialect.
    """
    return fill_gate_inputs(
        GATE_INPUTS_TEMPLATE, dialect, now=timestamp_literal(now), revision=string_literal(running_revision())
    )


def string_literal(text: str) -> str:
    """``text`` as a SQL string literal (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def fill_gate_inputs(template: str, dialect: str, **params: str) -> str:
    """``template`` (``GATE_INPUTS_TEMPLATE``) with ``dialect``'s fragments and ``params`` filled in."""
    if dialect not in GATE_INPUTS_FRAGMENTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}; known: {list(DIALECTS)}")
    fragments = {k: v.format(**params) for k, v in GATE_INPUTS_FRAGMENTS[dialect].items()}
    return template.format(**params, **fragments).strip()


_LAYOUT: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "terminal_divergence": (
        ("explorer_runs", "explorer_runs"),
        ("interleavings", "interleavings"),
        ("divergent", "divergent"),
        ("last_run_at", "last_run_at"),
    ),
    "duplicate_operations": (
        ("operations", "operations"),
        ("operations_with_second_server_task", "operations_with_second_server_task"),
        ("resubmitted_after_proof_of_absence", "resubmitted"),
    ),
    "poll_amplification": (
        ("requests", "requests"),
        ("busiest_1s_window", "busiest_1s_window"),
        ("configured_qps", "configured_qps"),
    ),
    "cancel_confirmation": (
        ("confirmed", "confirmed"),
        ("p99_s", "p99_s"),
        ("max_s", "max_s"),
        ("pending", "pending"),
        ("oldest_pending_s", "oldest_pending_s"),
    ),
    "unknown_reconciliation": (
        ("operations", "operations"),
        ("entries", "entries"),
        ("open", "open"),
        ("oldest_open_s", "oldest_open_s"),
        ("p99_age_s", "p99_age_s"),
        ("slowest_resolution_s", "slowest_resolution_s"),
    ),
    "traceability": (
        ("outbox_rows", "outbox_rows"),
        ("advances", "advances"),
        ("untraceable", "untraceable"),
        ("refused_acks", "refused_acks"),
        ("unacknowledged", "unacknowledged"),
        ("stale_unacknowledged", "stale_unacknowledged"),
        ("oldest_unacknowledged_s", "oldest_unacknowledged_s"),
    ),
}
"""Per gate: (input name, statement column) for each raw input, in the order ``rollout.gates`` reads them."""


def gate_inputs_from_row(row: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """The statement's one row (column -> value) in the shape ``rollout.gates.evaluate`` takes.

    Raises:
        ValueError: a column is missing, or a count is not a whole number.
    """
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise ValueError(f"gate-inputs row lacks {missing}")
    v = {c: _value(c, row[c]) for c in COLUMNS}
    return {gate: {name: v[column] for name, column in pairs} for gate, pairs in _LAYOUT.items()}


def gate_inputs_from_recorded(per_gate: Mapping[str, object]) -> dict[str, dict[str, object]]:
    """The raw inputs of a recorded run (``gate_runs.inputs`` per gate, JSON text or a mapping) in the
    shape ``gate_inputs_from_row`` returns, with the same value types whichever way they travelled.

    Raises:
        ValueError: a gate is missing, or its inputs are not exactly the raw inputs this module
            defines (a run recorded with another shape, such as a seeded history's summary).
    """
    out: dict[str, dict[str, object]] = {}
    for gate, pairs in _LAYOUT.items():
        raw = per_gate.get(gate)
        if isinstance(raw, str | bytes):
            raw = json.loads(raw)
        if not isinstance(raw, Mapping):
            raise ValueError(f"recorded run lacks the raw inputs of {gate}")
        names = {name for name, _ in pairs}
        if set(raw) != names:
            raise ValueError(f"recorded inputs of {gate} are {sorted(raw)}, not {sorted(names)}")
        out[gate] = {name: _value(column, raw[name]) for name, column in pairs}
    return out


def advance_clock(inputs: Mapping[str, Mapping[str, object]], seconds: float) -> dict[str, dict[str, object]]:
    """The inputs read at some instant, as they read ``seconds`` later when nothing was written meanwhile.

    Only the clock moved, so the pending cancels and the open UNKNOWN entries are the same ones,
    each ``seconds`` older: ``oldest_pending_s`` and ``oldest_open_s`` (the ages a verdict reads)
    advance exactly. ``p99_age_s`` (shown, read by no verdict) advances exactly when every entry is
    open, stays when none is; when open and resolved entries mix it is kept as read (the true value
    lies between it and it plus ``seconds``). The oldest unacknowledged outbox entry ages exactly.
    Every other input does not depend on the clock.
    """
    if seconds < 0:
        raise ValueError(f"the clock does not move backwards ({seconds} s)")
    out = {gate: dict(values) for gate, values in inputs.items()}
    cancel = out["cancel_confirmation"]
    if cancel["pending"] and cancel["oldest_pending_s"] is not None:
        cancel["oldest_pending_s"] = _float(cancel["oldest_pending_s"]) + seconds
    unknown = out["unknown_reconciliation"]
    if unknown["open"] and unknown["oldest_open_s"] is not None:
        unknown["oldest_open_s"] = _float(unknown["oldest_open_s"]) + seconds
        if unknown["open"] == unknown["entries"] and unknown["p99_age_s"] is not None:
            unknown["p99_age_s"] = _float(unknown["p99_age_s"]) + seconds
    trace = out["traceability"]
    if trace["unacknowledged"] and trace["oldest_unacknowledged_s"] is not None:
        # ``stale_unacknowledged`` (shown, read by no verdict) is kept as read: a lower bound.
        trace["oldest_unacknowledged_s"] = _float(trace["oldest_unacknowledged_s"]) + seconds
    return out


def _float(value: object) -> float:
    return float(str(value))


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
    if isinstance(value, datetime | str):
        return _timestamp(value)
    raise ValueError(f"{column}: not a timestamp: {value!r}")


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and value != value


__all__ = [
    "COLUMNS",
    "DIALECTS",
    "DUPLICATED_OPERATION_IDS",
    "GATE_INPUTS_DIALECTS",
    "GATE_INPUTS_FRAGMENTS",
    "GATE_INPUTS_TEMPLATE",
    "LATEST_RUN_SQL",
    "UNACKED_STALE_S",
    "WRITE_SETTLE_S",
    "RecordedRun",
    "advance_clock",
    "fill_gate_inputs",
    "gate_inputs_from_recorded",
    "gate_inputs_from_row",
    "gate_inputs_from_values",
    "gate_inputs_sql",
    "recorded_run_from_rows",
    "seconds_between",
    "timestamp_literal",
]
