"""The ledger's schema, written once for both dialects: the recorded migrations, column lists and Arrow schemas.

Data only: no connection is opened here; the backends run these statements.
"""

from __future__ import annotations

import re
from typing import Final

import pyarrow as pa

from engine.limits import IDENTIFIER_COLUMNS, Dialect, check_sql

EXPLORER_CODE_MIGRATION: Final[tuple[str, ...]] = (
    # Rows from before this migration did not say what ran: 'unrecorded', which no gate counts.
    "ALTER TABLE explorer_runs ADD COLUMN code VARCHAR DEFAULT 'unrecorded'",
    "ALTER TABLE explorer_runs ADD COLUMN revision VARCHAR",
)
"""Shared with the PostgreSQL ledger (its own migration number)."""

EXPLORER_SPACE_NAME: Final = (
    "explorer runs say the size of the pair's space and whether it is exact, a bound or an estimate"
)
EXPLORER_SPACE_MIGRATION: Final[tuple[str, ...]] = (
    # space_kind is 'exact' (the search exhausted the pair: space is its count of interleavings),
    # 'at_least' (it covered space distinct interleavings and stopped at its limit: a proven lower
    # bound) or 'estimate' (Knuth's random probes: neither). Rows from before say NULL: not recorded.
    "ALTER TABLE explorer_runs ADD COLUMN space DOUBLE",
    "ALTER TABLE explorer_runs ADD COLUMN space_kind VARCHAR",
)
"""Shared by both backends (DuckDB's migration 12, PostgreSQL's 14)."""

OUTBOX_DELIVERY_NAME: Final = (
    "the outbox delivered: entries numbered in acceptance order, consumers' acknowledgements"
)
OUTBOX_DELIVERY_MIGRATION: Final[tuple[str, ...]] = (
    "ALTER TABLE outbox ADD COLUMN seq BIGINT",
    # Entries written before this migration are numbered in the order they were accepted, at or
    # below 0; the sequence then counts on from 1, so every cursor stays in acceptance order.
    """UPDATE outbox SET seq = q.n
       FROM (SELECT call_node_id,
                    row_number() OVER (ORDER BY created_at, call_node_id) - (SELECT count(*) FROM outbox) AS n
             FROM outbox) AS q
       WHERE outbox.call_node_id = q.call_node_id""",
    "CREATE SEQUENCE outbox_seq START 1",
    # One row per (consumer, entry): the downstream advanced on that entry. What the consumer
    # said it saw is kept, so the traceability gate checks it against the receipt again.
    """CREATE TABLE outbox_acks (
        consumer VARCHAR NOT NULL,
        call_node_id VARCHAR NOT NULL,
        entry_seq BIGINT NOT NULL,
        status VARCHAR NOT NULL,
        result_digest VARCHAR,
        acked_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (consumer, call_node_id)
    )""",
    # An acknowledgement the ledger refused (no such entry, or not what the entry holds).
    """CREATE TABLE outbox_ack_refusals (
        consumer VARCHAR NOT NULL,
        call_node_id VARCHAR NOT NULL,
        status VARCHAR,
        result_digest VARCHAR,
        reason VARCHAR NOT NULL,
        refused_at TIMESTAMPTZ NOT NULL
    )""",
)
"""Shared by both backends (DuckDB's migration 9, PostgreSQL's 11, which also indexes ``seq``: DuckDB
cannot create an index in the transaction that numbered the existing rows)."""

OUTBOX_SEQ_INDEX: Final = "CREATE UNIQUE INDEX outbox_seq_order ON outbox (seq)"

OUTBOX_SEQUENCE: Final = "outbox_seq"
"""Numbers each new outbox row (its last column, ``seq``) as it is written: the consumers' cursor."""

ROUNDS_CLOSED_NAME: Final = "approvals record when and why a round stopped being answerable"
ROUNDS_CLOSED_MIGRATION: Final[tuple[str, ...]] = (
    # status is then 'pending', 'answered', 'expired' (its deadline passed) or 'closed' (its
    # operation moved past it); closed_at is when Finality recorded that, closed_reason says why.
    "ALTER TABLE approvals ADD COLUMN closed_at TIMESTAMPTZ",
    "ALTER TABLE approvals ADD COLUMN closed_reason VARCHAR",
)
"""Shared by both backends (DuckDB's migration 10, PostgreSQL's 12)."""

IDENTIFIER_CHECKS_NAME: Final = (
    "identifier rules as CHECK constraints (call node ids, principals, actors, reasons)"
)


def _constraints(table: str, dialect: Dialect) -> list[tuple[str, str]]:
    return [
        (f"{table}_{column}_rule", check_sql(rule, column, dialect, nullable=nullable))
        for t, column, rule, nullable in IDENTIFIER_COLUMNS
        if t == table
    ]


def identifier_checks_migration(dialect: Dialect, created: dict[str, str]) -> tuple[str, ...]:
    """The statements that put ``engine.limits``' rules on the ledger's identifier columns.

    PostgreSQL adds the constraints in place. DuckDB cannot add a CHECK to an existing table, so
    each table is rebuilt from its original definition (``created``: table -> CREATE statement)
    with the constraints, its rows copied over: a row that breaks a rule fails the migration
    (loudly) instead of staying behind unchecked.
    """
    tables = list(dict.fromkeys(table for table, _, _, _ in IDENTIFIER_COLUMNS))
    if dialect == "postgres":
        return tuple(
            f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({expression})"
            for table in tables
            for name, expression in _constraints(table, dialect)
        )
    statements: list[str] = []
    for table in tables:
        ddl = created[table].rstrip()
        assert ddl.endswith(")"), table
        checks = "".join(
            f",\n                CONSTRAINT {name} CHECK ({expression})"
            for name, expression in _constraints(table, dialect)
        )
        rebuilt = ddl[:-1].rstrip() + checks + "\n            )"
        statements += [
            rebuilt.replace(f"CREATE TABLE {table} (", f"CREATE TABLE {table}__checked (", 1),
            f"INSERT INTO {table}__checked SELECT * FROM {table}",
            f"DROP TABLE {table}",
            f"ALTER TABLE {table}__checked RENAME TO {table}",
        ]
    return tuple(statements)


def created_tables(statements: tuple[str, ...]) -> dict[str, str]:
    """Table name -> its CREATE TABLE statement, from one migration's statements."""
    found: dict[str, str] = {}
    for statement in statements:
        head = statement.lstrip()
        if head.startswith("CREATE TABLE "):
            found[head.split()[2]] = head
    return found


_RELEASED: Final[tuple[tuple[int, str, tuple[str, ...]], ...]] = (
    (
        1,
        "operations, transitions, receipts, outbox",
        (
            """CREATE TABLE op_identity (
                operation_id VARCHAR PRIMARY KEY,
                call_node_id VARCHAR NOT NULL UNIQUE,
                role VARCHAR NOT NULL,
                request_digest VARCHAR NOT NULL,
                tool_name VARCHAR NOT NULL,
                tool_version VARCHAR NOT NULL,
                descriptor_version VARCHAR NOT NULL,
                side_effects BOOLEAN NOT NULL,
                principal VARCHAR NOT NULL,
                protocol VARCHAR NOT NULL,
                adapter_version VARCHAR NOT NULL,
                server VARCHAR NOT NULL,
                idempotency_key VARCHAR NOT NULL UNIQUE,
                arguments VARCHAR NOT NULL,
                schema_version VARCHAR NOT NULL,
                created_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE op_state (
                operation_id VARCHAR PRIMARY KEY,
                state VARCHAR NOT NULL,
                server_status VARCHAR,
                task_id VARCHAR,
                poll_cursor VARCHAR,
                input_round INTEGER NOT NULL,
                answered_round INTEGER NOT NULL,
                input_request_key VARCHAR,
                cancel_generation INTEGER NOT NULL,
                cancel_requested_at TIMESTAMPTZ,
                expires_at TIMESTAMPTZ,
                result_digest VARCHAR,
                result_held BOOLEAN NOT NULL,
                effect_reconciliation_required BOOLEAN NOT NULL,
                submit_attempts INTEGER NOT NULL,
                epoch BIGINT NOT NULL,
                row_version BIGINT NOT NULL,
                updated_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE task_bindings (
                server VARCHAR NOT NULL,
                task_id VARCHAR NOT NULL,
                operation_id VARCHAR NOT NULL,
                bound_at TIMESTAMPTZ NOT NULL,
                PRIMARY KEY (server, task_id)
            )""",
            "CREATE SEQUENCE transition_seq START 1",
            """CREATE TABLE transitions (
                seq BIGINT NOT NULL,
                operation_id VARCHAR NOT NULL,
                call_node_id VARCHAR NOT NULL,
                from_state VARCHAR,
                to_state VARCHAR NOT NULL,
                event VARCHAR NOT NULL,
                detail VARCHAR NOT NULL,
                cause VARCHAR NOT NULL,
                accepted BOOLEAN NOT NULL,
                epoch BIGINT NOT NULL,
                row_version BIGINT NOT NULL,
                recorded_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE receipts (
                call_node_id VARCHAR PRIMARY KEY,
                operation_id VARCHAR NOT NULL UNIQUE,
                request_digest VARCHAR NOT NULL,
                task_id VARCHAR,
                tool_version VARCHAR NOT NULL,
                epoch BIGINT NOT NULL,
                cancel_generation INTEGER NOT NULL,
                status VARCHAR NOT NULL,
                result_digest VARCHAR,
                cancel_evidence VARCHAR,
                role VARCHAR NOT NULL,
                accepted_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE outbox (
                call_node_id VARCHAR PRIMARY KEY REFERENCES receipts (call_node_id),
                operation_id VARCHAR NOT NULL,
                status VARCHAR NOT NULL,
                terminal_status VARCHAR NOT NULL,
                result_digest VARCHAR,
                payload VARCHAR,
                created_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE results (
                operation_id VARCHAR PRIMARY KEY,
                digest VARCHAR NOT NULL,
                status VARCHAR NOT NULL,
                payload VARCHAR NOT NULL,
                stored_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE receipt_audit (
                call_node_id VARCHAR NOT NULL,
                operation_id VARCHAR NOT NULL,
                kind VARCHAR NOT NULL,
                digest VARCHAR,
                payload VARCHAR,
                recorded_at TIMESTAMPTZ NOT NULL
            )""",
        ),
    ),
    (
        2,
        "polls, approvals, reconciliation",
        (
            """CREATE TABLE polls (
                operation_id VARCHAR NOT NULL,
                server VARCHAR NOT NULL,
                method VARCHAR NOT NULL,
                epoch BIGINT NOT NULL,
                sent_at TIMESTAMPTZ NOT NULL,
                received_at TIMESTAMPTZ,
                outcome VARCHAR NOT NULL
            )""",
            """CREATE TABLE approvals (
                operation_id VARCHAR NOT NULL,
                input_round INTEGER NOT NULL,
                request_key VARCHAR,
                message VARCHAR NOT NULL,
                requested_schema VARCHAR NOT NULL,
                schema_digest VARCHAR NOT NULL,
                deadline TIMESTAMPTZ,
                status VARCHAR NOT NULL,
                answer VARCHAR,
                actor VARCHAR,
                opened_at TIMESTAMPTZ NOT NULL,
                answered_at TIMESTAMPTZ,
                PRIMARY KEY (operation_id, input_round)
            )""",
            "CREATE SEQUENCE reconciliation_seq START 1",
            """CREATE TABLE reconciliation (
                entry_id BIGINT PRIMARY KEY,
                operation_id VARCHAR NOT NULL,
                kind VARCHAR NOT NULL,
                reason VARCHAR NOT NULL,
                idempotency_key VARCHAR NOT NULL,
                task_id VARCHAR,
                request_digest VARCHAR NOT NULL,
                window_start TIMESTAMPTZ NOT NULL,
                window_end TIMESTAMPTZ NOT NULL,
                candidates VARCHAR NOT NULL,
                status VARCHAR NOT NULL,
                opened_at TIMESTAMPTZ NOT NULL,
                resolved_at TIMESTAMPTZ,
                actor VARCHAR,
                resolution VARCHAR
            )""",
            """CREATE VIEW operations AS
                SELECT i.operation_id, i.call_node_id, i.role, i.request_digest, i.tool_name, i.tool_version,
                       i.descriptor_version, i.side_effects, i.principal, i.protocol, i.adapter_version, i.server,
                       i.idempotency_key, s.task_id, s.poll_cursor, s.server_status, s.input_round,
                       s.answered_round, s.input_request_key, s.cancel_generation, s.cancel_requested_at,
                       s.expires_at, s.result_digest, s.result_held, s.effect_reconciliation_required,
                       s.submit_attempts, s.state, s.epoch, s.row_version, i.schema_version, i.created_at,
                       s.updated_at
                FROM op_identity i JOIN op_state s USING (operation_id)""",
        ),
    ),
    (
        3,
        "held outcomes",
        (
            """CREATE TABLE held_outcomes (
                operation_id VARCHAR PRIMARY KEY,
                status VARCHAR NOT NULL,
                digest VARCHAR NOT NULL,
                payload VARCHAR NOT NULL,
                task_id VARCHAR,
                epoch_echo BIGINT,
                held_at TIMESTAMPTZ NOT NULL
            )""",
        ),
    ),
    (
        4,
        "explorer runs and gate runs",
        (
            "CREATE SEQUENCE explorer_run_seq START 1",
            """CREATE TABLE explorer_runs (
                run_id BIGINT PRIMARY KEY,
                scenario VARCHAR NOT NULL,
                protocol VARCHAR NOT NULL,
                seed BIGINT NOT NULL,
                explored BIGINT NOT NULL,
                distinct_interleavings BIGINT NOT NULL,
                divergent BIGINT NOT NULL,
                exhaustive BOOLEAN NOT NULL,
                rules VARCHAR NOT NULL,
                shortest_trace VARCHAR,
                started_at TIMESTAMPTZ NOT NULL,
                finished_at TIMESTAMPTZ NOT NULL
            )""",
            "CREATE SEQUENCE gate_run_seq START 1",
            """CREATE TABLE gate_runs (
                run_id BIGINT NOT NULL,
                gate VARCHAR NOT NULL,
                passed BOOLEAN NOT NULL,
                value DOUBLE,
                threshold DOUBLE,
                verdict VARCHAR NOT NULL,
                inputs VARCHAR NOT NULL,
                evaluated_at TIMESTAMPTZ NOT NULL,
                PRIMARY KEY (run_id, gate)
            )""",
        ),
    ),
    (
        5,
        "settings",
        (
            """CREATE TABLE settings (
                key VARCHAR PRIMARY KEY,
                value VARCHAR NOT NULL,
                updated_at TIMESTAMPTZ NOT NULL
            )""",
        ),
    ),
    (
        6,
        "rollout: state, hash-chained events, arm assignments, shadow diffs",
        (
            """CREATE TABLE rollout_state (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                stage VARCHAR NOT NULL,
                canary_bp INTEGER NOT NULL,
                salt VARCHAR NOT NULL,
                shadow_tools VARCHAR NOT NULL,
                disabled_protocols VARCHAR NOT NULL,
                epoch BIGINT NOT NULL,
                head_seq BIGINT NOT NULL,
                head_hash VARCHAR NOT NULL,
                updated_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE rollout_events (
                seq BIGINT PRIMARY KEY,
                action VARCHAR NOT NULL,
                actor VARCHAR NOT NULL,
                reason VARCHAR NOT NULL,
                override BOOLEAN NOT NULL,
                before_state VARCHAR NOT NULL,
                after_state VARCHAR NOT NULL,
                detail VARCHAR NOT NULL,
                gate_inputs VARCHAR NOT NULL,
                gate_inputs_digest VARCHAR NOT NULL,
                prev_hash VARCHAR NOT NULL,
                hash VARCHAR NOT NULL,
                recorded_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE rollout_assignments (
                operation_id VARCHAR PRIMARY KEY,
                call_node_id VARCHAR NOT NULL,
                tool_name VARCHAR NOT NULL,
                role VARCHAR NOT NULL,
                arm VARCHAR NOT NULL,
                stage VARCHAR NOT NULL,
                bucket INTEGER NOT NULL,
                canary_bp INTEGER NOT NULL,
                server_name VARCHAR NOT NULL,
                rerouted_from VARCHAR,
                primary_operation_id VARCHAR,
                rollout_seq BIGINT NOT NULL,
                assigned_at TIMESTAMPTZ NOT NULL
            )""",
            """CREATE TABLE shadow_diffs (
                primary_operation_id VARCHAR PRIMARY KEY,
                shadow_operation_id VARCHAR NOT NULL UNIQUE,
                call_node_id VARCHAR NOT NULL,
                tool_name VARCHAR NOT NULL,
                primary_status VARCHAR NOT NULL,
                shadow_status VARCHAR NOT NULL,
                primary_result_digest VARCHAR,
                shadow_result_digest VARCHAR,
                primary_content_digest VARCHAR,
                shadow_content_digest VARCHAR,
                primary_latency_ms DOUBLE NOT NULL,
                shadow_latency_ms DOUBLE NOT NULL,
                primary_polls INTEGER NOT NULL,
                shadow_polls INTEGER NOT NULL,
                diverged BOOLEAN NOT NULL,
                differences VARCHAR NOT NULL,
                recorded_at TIMESTAMPTZ NOT NULL
            )""",
        ),
    ),
    (
        7,
        "explorer runs name the code that ran and its revision (the gate counts only the shipped code's)",
        EXPLORER_CODE_MIGRATION,
    ),
)
ACCESS_DENIALS_NAME: Final = "access denials: refused control-API attempts (who, what, when)"
ACCESS_DENIALS_MIGRATION: Final[tuple[str, ...]] = (
    # No key: several service processes record into one PostgreSQL ledger; order is recorded_at.
    """CREATE TABLE access_denials (
        recorded_at TIMESTAMPTZ NOT NULL,
        principal VARCHAR NOT NULL,
        token_id VARCHAR NOT NULL,
        method VARCHAR NOT NULL,
        path VARCHAR NOT NULL,
        permission VARCHAR NOT NULL,
        status INTEGER NOT NULL,
        needed_role VARCHAR NOT NULL,
        reason VARCHAR NOT NULL,
        client VARCHAR NOT NULL
    )""",
)
ACCESS_DENIAL_COLUMNS: Final[tuple[str, ...]] = (
    "recorded_at",
    "principal",
    "token_id",
    "method",
    "path",
    "permission",
    "status",
    "needed_role",
    "reason",
    "client",
)
"""``access_denials``' columns, in table order."""

MIGRATIONS: Final[tuple[tuple[int, str, tuple[str, ...]], ...]] = (
    *_RELEASED,
    (
        8,
        IDENTIFIER_CHECKS_NAME,
        identifier_checks_migration(
            "duckdb", created_tables(tuple(s for _, _, group in _RELEASED for s in group))
        ),
    ),
    (9, OUTBOX_DELIVERY_NAME, OUTBOX_DELIVERY_MIGRATION),
    (10, ROUNDS_CLOSED_NAME, ROUNDS_CLOSED_MIGRATION),
    (11, ACCESS_DENIALS_NAME, ACCESS_DENIALS_MIGRATION),
    (12, EXPLORER_SPACE_NAME, EXPLORER_SPACE_MIGRATION),
)


SUPPORTED_SCHEMA: Final[int] = MIGRATIONS[-1][0]

# ------------------------------------------------------------------------ PostgreSQL migrations
SEND_SLOTS_TABLE: Final = "send_slots"
"""Coordination table of the shared QPS budget (migration 8); not part of the ledger's data."""

# Migrations 1-6 are DuckDB's own (``MIGRATIONS`` above), in PostgreSQL's spelling of DOUBLE;
# later ones are PostgreSQL's own. Numbers are this backend's: DuckDB's and PostgreSQL's schema
# versions are counted apart. Never edit a released migration: add a new one.


def _postgres_spelling(statement: str) -> str:
    return re.sub(r"\bDOUBLE\b", "DOUBLE PRECISION", statement)


PG_MIGRATIONS: Final[tuple[tuple[int, str, tuple[str, ...]], ...]] = (
    *(
        (version, name, tuple(_postgres_spelling(s) for s in statements))
        for version, name, statements in MIGRATIONS
        if version <= 6
    ),
    (
        7,
        "leases (several executors share the ledger) and indexes for the executors' lookups",
        (
            "ALTER TABLE op_state ADD COLUMN lease_owner VARCHAR",
            "ALTER TABLE op_state ADD COLUMN lease_token VARCHAR",
            "ALTER TABLE op_state ADD COLUMN lease_epoch BIGINT",
            "ALTER TABLE op_state ADD COLUMN lease_expires_at TIMESTAMPTZ",
            # What claim scans: operations without a receipt, free or expired leases first.
            "CREATE INDEX op_state_claimable ON op_state (lease_expires_at NULLS FIRST, updated_at) "
            "WHERE state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED')",
            "CREATE INDEX op_state_lease_token ON op_state (lease_token) WHERE lease_token IS NOT NULL",
            "CREATE INDEX op_state_task ON op_state (task_id)",
            "CREATE INDEX op_state_state ON op_state (state)",
            "CREATE INDEX op_identity_created ON op_identity (created_at, operation_id)",
            "CREATE INDEX transitions_operation ON transitions (operation_id, seq)",
            "CREATE INDEX polls_operation ON polls (operation_id)",
            "CREATE INDEX polls_sent_at ON polls (sent_at)",
            "CREATE INDEX reconciliation_operation ON reconciliation (operation_id, kind)",
            "CREATE INDEX rollout_assignments_primary ON rollout_assignments (primary_operation_id)",
        ),
    ),
    (
        8,
        "send slots: the global QPS budget shared by every executor",
        (
            # One row per (scope, slot): how many requests were booked into that slot. Scope '*' is
            # the global cap, a server URL that server's cap. Coordination state, not ledger data:
            # ``table_columns`` leaves the table out.
            f"""CREATE TABLE {SEND_SLOTS_TABLE} (
                scope VARCHAR NOT NULL,
                slot BIGINT NOT NULL,
                used INTEGER NOT NULL,
                PRIMARY KEY (scope, slot)
            )""",
            # Books ``p_n`` sends into the earliest slots from ``p_from`` on that have room in every
            # scope; returns the slot of each. Rows are locked in (slot, scope) order, so two
            # bookers never deadlock; a booker waits only for another booking of the same slot.
            f"""CREATE FUNCTION {SEND_SLOTS_TABLE}_book(p_scopes VARCHAR[], p_caps INTEGER[], p_from BIGINT, p_n INTEGER)
            RETURNS BIGINT[] LANGUAGE plpgsql AS $$
            DECLARE
                k BIGINT := p_from;
                got BIGINT[] := '{{}}';
                room INTEGER;
                u INTEGER;
                i INTEGER;
            BEGIN
                WHILE coalesce(array_length(got, 1), 0) < p_n LOOP
                    room := p_n - coalesce(array_length(got, 1), 0);
                    FOR i IN 1 .. array_length(p_scopes, 1) LOOP
                        INSERT INTO {SEND_SLOTS_TABLE} (scope, slot, used) VALUES (p_scopes[i], k, 0)
                            ON CONFLICT DO NOTHING;
                        SELECT used INTO u FROM {SEND_SLOTS_TABLE}
                            WHERE scope = p_scopes[i] AND slot = k FOR UPDATE;
                        room := least(room, p_caps[i] - u);
                    END LOOP;
                    IF room > 0 THEN
                        UPDATE {SEND_SLOTS_TABLE} SET used = used + room
                            WHERE scope = ANY(p_scopes) AND slot = k;
                        got := got || array_fill(k, ARRAY[room]);
                    END IF;
                    k := k + 1;
                END LOOP;
                RETURN got;
            END $$""",
        ),
    ),
    (
        9,
        "explorer runs name the code that ran and its revision (the gate counts only the shipped code's)",
        EXPLORER_CODE_MIGRATION,
    ),
    (10, IDENTIFIER_CHECKS_NAME, identifier_checks_migration("postgres", {})),
    (11, OUTBOX_DELIVERY_NAME, (*OUTBOX_DELIVERY_MIGRATION, OUTBOX_SEQ_INDEX)),
    (12, ROUNDS_CLOSED_NAME, ROUNDS_CLOSED_MIGRATION),
    (13, ACCESS_DENIALS_NAME, ACCESS_DENIALS_MIGRATION),
    (14, EXPLORER_SPACE_NAME, tuple(_postgres_spelling(s) for s in EXPLORER_SPACE_MIGRATION)),
)
PG_SUPPORTED_SCHEMA: Final[int] = PG_MIGRATIONS[-1][0]

LEASE_COLUMNS: Final[tuple[str, ...]] = ("lease_owner", "lease_token", "lease_epoch", "lease_expires_at")
"""Columns only the PostgreSQL ``op_state`` has (migration 7); the ``operations`` view leaves them out."""


_STATE_COLUMNS: Final[tuple[str, ...]] = (
    "operation_id",
    "state",
    "server_status",
    "task_id",
    "poll_cursor",
    "input_round",
    "answered_round",
    "input_request_key",
    "cancel_generation",
    "cancel_requested_at",
    "expires_at",
    "result_digest",
    "result_held",
    "effect_reconciliation_required",
    "submit_attempts",
    "epoch",
    "row_version",
    "updated_at",
)


_TS = pa.timestamp("us", tz="UTC")


_STATE_SCHEMA: Final = pa.schema(
    [
        ("operation_id", pa.string()),
        ("state", pa.string()),
        ("server_status", pa.string()),
        ("task_id", pa.string()),
        ("poll_cursor", pa.string()),
        ("input_round", pa.int32()),
        ("answered_round", pa.int32()),
        ("input_request_key", pa.string()),
        ("cancel_generation", pa.int32()),
        ("cancel_requested_at", _TS),
        ("expires_at", _TS),
        ("result_digest", pa.string()),
        ("result_held", pa.bool_()),
        ("effect_reconciliation_required", pa.bool_()),
        ("submit_attempts", pa.int32()),
        ("epoch", pa.int64()),
        ("row_version", pa.int64()),
        ("updated_at", _TS),
        ("expected_version", pa.int64()),
        ("expected_cancel_generation", pa.int32()),
    ]
)


_TRANSITION_SCHEMA: Final = pa.schema(
    [
        ("operation_id", pa.string()),
        ("call_node_id", pa.string()),
        ("from_state", pa.string()),
        ("to_state", pa.string()),
        ("event", pa.string()),
        ("detail", pa.string()),
        ("cause", pa.string()),
        ("accepted", pa.bool_()),
        ("epoch", pa.int64()),
        ("row_version", pa.int64()),
        ("recorded_at", _TS),
    ]
)


_RECEIPT_SCHEMA: Final = pa.schema(
    [
        ("call_node_id", pa.string()),
        ("operation_id", pa.string()),
        ("request_digest", pa.string()),
        ("task_id", pa.string()),
        ("tool_version", pa.string()),
        ("epoch", pa.int64()),
        ("cancel_generation", pa.int32()),
        ("status", pa.string()),
        ("result_digest", pa.string()),
        ("cancel_evidence", pa.string()),
        ("role", pa.string()),
        ("accepted_at", _TS),
    ]
)


_RESULT_SCHEMA: Final = pa.schema(
    [
        ("operation_id", pa.string()),
        ("digest", pa.string()),
        ("status", pa.string()),
        ("payload", pa.string()),
        ("stored_at", _TS),
    ]
)


_OUTBOX_SCHEMA: Final = pa.schema(
    [
        ("call_node_id", pa.string()),
        ("operation_id", pa.string()),
        ("status", pa.string()),
        ("terminal_status", pa.string()),
        ("result_digest", pa.string()),
        ("payload", pa.string()),
        ("created_at", _TS),
    ]
)


_HELD_SCHEMA: Final = pa.schema(
    [
        ("operation_id", pa.string()),
        ("status", pa.string()),
        ("digest", pa.string()),
        ("payload", pa.string()),
        ("task_id", pa.string()),
        ("epoch_echo", pa.int64()),
        ("held_at", _TS),
    ]
)


_EXPECT_SCHEMA: Final = pa.schema(
    [
        ("operation_id", pa.string()),
        ("expected_version", pa.int64()),
        ("expected_cancel_generation", pa.int32()),
    ]
)


_BINDING_SCHEMA: Final = pa.schema(
    [("server", pa.string()), ("task_id", pa.string()), ("operation_id", pa.string()), ("bound_at", _TS)]
)


_POLL_SCHEMA: Final = pa.schema(
    [
        ("operation_id", pa.string()),
        ("server", pa.string()),
        ("method", pa.string()),
        ("epoch", pa.int64()),
        ("sent_at", _TS),
        ("received_at", _TS),
        ("outcome", pa.string()),
    ]
)


_IDENTITY_SCHEMA: Final = pa.schema(
    [
        ("operation_id", pa.string()),
        ("call_node_id", pa.string()),
        ("role", pa.string()),
        ("request_digest", pa.string()),
        ("tool_name", pa.string()),
        ("tool_version", pa.string()),
        ("descriptor_version", pa.string()),
        ("side_effects", pa.bool_()),
        ("principal", pa.string()),
        ("protocol", pa.string()),
        ("adapter_version", pa.string()),
        ("server", pa.string()),
        ("idempotency_key", pa.string()),
        ("arguments", pa.string()),
        ("schema_version", pa.string()),
        ("created_at", _TS),
    ]
)


_ASSIGNMENT_SCHEMA: Final = pa.schema(
    [
        ("operation_id", pa.string()),
        ("call_node_id", pa.string()),
        ("tool_name", pa.string()),
        ("role", pa.string()),
        ("arm", pa.string()),
        ("stage", pa.string()),
        ("bucket", pa.int32()),
        ("canary_bp", pa.int32()),
        ("server_name", pa.string()),
        ("rerouted_from", pa.string()),
        ("primary_operation_id", pa.string()),
        ("rollout_seq", pa.int64()),
        ("assigned_at", _TS),
    ]
)


_TABLES: Final = frozenset(
    {
        "op_identity",
        "op_state",
        "operations",
        "task_bindings",
        "transitions",
        "receipts",
        "outbox",
        "outbox_acks",
        "outbox_ack_refusals",
        "results",
        "receipt_audit",
        "polls",
        "approvals",
        "reconciliation",
        "held_outcomes",
        "explorer_runs",
        "gate_runs",
        "settings",
        "rollout_state",
        "rollout_events",
        "rollout_assignments",
        "shadow_diffs",
        "access_denials",
    }
)


ROLLOUT_EVENT_COLUMNS: Final[tuple[str, ...]] = (
    "seq",
    "action",
    "actor",
    "reason",
    "override",
    "before_state",
    "after_state",
    "detail",
    "gate_inputs",
    "gate_inputs_digest",
    "prev_hash",
    "hash",
    "recorded_at",
)
"""``rollout_events``' columns, in table order (the rollout's hash-chained audit log)."""

ASSIGNMENT_COLUMNS: Final[tuple[str, ...]] = tuple(_ASSIGNMENT_SCHEMA.names)
"""``rollout_assignments``' columns, in table order."""

SHADOW_DIFF_COLUMNS: Final[tuple[str, ...]] = (
    "primary_operation_id",
    "shadow_operation_id",
    "call_node_id",
    "tool_name",
    "primary_status",
    "shadow_status",
    "primary_result_digest",
    "shadow_result_digest",
    "primary_content_digest",
    "shadow_content_digest",
    "primary_latency_ms",
    "shadow_latency_ms",
    "primary_polls",
    "shadow_polls",
    "diverged",
    "differences",
    "recorded_at",
)
"""``shadow_diffs``' columns, in table order."""

ROW_SCHEMAS: Final[dict[str, pa.Schema]] = {
    "op_identity": _IDENTITY_SCHEMA,
    "task_bindings": _BINDING_SCHEMA,
    "transitions": _TRANSITION_SCHEMA,
    "receipts": _RECEIPT_SCHEMA,
    "results": _RESULT_SCHEMA,
    "outbox": _OUTBOX_SCHEMA,
    "held_outcomes": _HELD_SCHEMA,
    "polls": _POLL_SCHEMA,
    "rollout_assignments": _ASSIGNMENT_SCHEMA,
}
"""The Arrow schema of the rows a batch appends to each table (``transitions`` without its ``seq``)."""


__all__ = [
    "ACCESS_DENIALS_MIGRATION",
    "ACCESS_DENIALS_NAME",
    "ACCESS_DENIAL_COLUMNS",
    "ASSIGNMENT_COLUMNS",
    "EXPLORER_CODE_MIGRATION",
    "EXPLORER_SPACE_MIGRATION",
    "EXPLORER_SPACE_NAME",
    "IDENTIFIER_CHECKS_NAME",
    "LEASE_COLUMNS",
    "MIGRATIONS",
    "OUTBOX_DELIVERY_MIGRATION",
    "OUTBOX_DELIVERY_NAME",
    "OUTBOX_SEQUENCE",
    "PG_MIGRATIONS",
    "PG_SUPPORTED_SCHEMA",
    "ROLLOUT_EVENT_COLUMNS",
    "ROUNDS_CLOSED_MIGRATION",
    "ROUNDS_CLOSED_NAME",
    "ROW_SCHEMAS",
    "SEND_SLOTS_TABLE",
    "SHADOW_DIFF_COLUMNS",
    "SUPPORTED_SCHEMA",
    "created_tables",
    "identifier_checks_migration",
]
