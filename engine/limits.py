"""Identifier rules: what a call node id, a principal, an actor and a reason may be, in one place.

The control API refuses a value that breaks a rule (422 naming the rule), ``finality call`` refuses
it before opening the ledger, and the ledger holds the same rules as CHECK constraints (the SQL
below is generated from the same constants), so a writer that bypasses both stores nothing either.

Pure: no I/O, no clock. Size limits on request bodies live in the service (``service.guard``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final, Literal

from engine.errors import IdentifierRefused

CALL_NODE_MAX_BYTES: Final = 256
"""A submitted call node id: at most 256 bytes of UTF-8."""
STORED_CALL_NODE_MAX_BYTES: Final = CALL_NODE_MAX_BYTES + len("#shadow")
"""What the ledger stores: the service records a shadow twin under ``<call node>#shadow``."""
PRINCIPAL_MAX_CHARS: Final = 128
PRINCIPAL_CHARS: Final = "A-Za-z0-9._@:/+-"
"""Letters, digits and ``. _ @ : / + -``: a principal names an account, never a sentence."""
ACTOR_MAX_CHARS: Final = 128
REASON_MAX_CHARS: Final = 2000

# C0 controls (NUL included), DEL and the C1 controls: never inside an identifier, whatever the field.
_CONTROL: Final = "\x00-\x1f\x7f-\x9f"
_CONTROL_RE: Final = re.compile(f"[{_CONTROL}]")
_PRINCIPAL_RE: Final = re.compile(f"[{PRINCIPAL_CHARS}]{{1,{PRINCIPAL_MAX_CHARS}}}")

Field = Literal["call_node", "principal", "actor", "reason"]


@dataclass(frozen=True, slots=True)
class Rule:
    field: Field
    text: str
    """The rule as a person reads it (quoted verbatim in refusals and in the README's Limits table)."""


RULES: Final[dict[Field, Rule]] = {
    "call_node": Rule(
        "call_node",
        f"a call node id is 1 to {CALL_NODE_MAX_BYTES} bytes of UTF-8, printable "
        "(no control characters, not blank)",
    ),
    "principal": Rule(
        "principal", f"a principal is 1 to {PRINCIPAL_MAX_CHARS} characters from [{PRINCIPAL_CHARS}]"
    ),
    "actor": Rule(
        "actor", f"an actor is 1 to {ACTOR_MAX_CHARS} characters, no control characters, not blank"
    ),
    "reason": Rule(
        "reason", f"a reason is 1 to {REASON_MAX_CHARS} characters, no control characters, not blank"
    ),
}


def _refuse(field: Field, detail: str) -> IdentifierRefused:
    return IdentifierRefused(field, RULES[field].text, detail)


def _text(field: Field, value: object, max_chars: int) -> str:
    if not isinstance(value, str):
        raise _refuse(field, f"not a string: {type(value).__name__}")
    if not value.strip():
        raise _refuse(field, "blank")
    if len(value) > max_chars:
        raise _refuse(field, f"{len(value)} characters")
    found = _CONTROL_RE.search(value)
    if found is not None:
        raise _refuse(field, f"control character U+{ord(found.group()):04X} at {found.start()}")
    return value


def check_call_node(value: object) -> str:
    """The call node id, or IdentifierRefused naming the rule."""
    text = _text("call_node", value, CALL_NODE_MAX_BYTES)
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > CALL_NODE_MAX_BYTES:
        raise _refuse("call_node", f"{size} bytes")
    if not text.isprintable():
        bad = next(c for c in text if not c.isprintable())
        raise _refuse("call_node", f"unprintable character U+{ord(bad):04X}")
    return text


def check_principal(value: object) -> str:
    """The principal, or IdentifierRefused naming the rule."""
    if not isinstance(value, str) or _PRINCIPAL_RE.fullmatch(value) is None:
        shown = value[:40] if isinstance(value, str) else type(value).__name__
        raise _refuse("principal", f"got {shown!r}")
    return value


def check_actor(value: object) -> str:
    """The actor, or IdentifierRefused naming the rule."""
    return _text("actor", value, ACTOR_MAX_CHARS)


def check_reason(value: object) -> str:
    """The reason, or IdentifierRefused naming the rule."""
    return _text("reason", value, REASON_MAX_CHARS)


def encoded_size(value: object) -> int:
    """Bytes of ``value`` as the ledger stores arguments and answers (compact JSON, UTF-8)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


# ------------------------------------------------------------------------ the same rules, in SQL

Dialect = Literal["duckdb", "postgres"]


def _bytes(column: str, dialect: Dialect) -> str:
    # DuckDB's strlen counts bytes; PostgreSQL's octet_length does.
    return f"strlen({column})" if dialect == "duckdb" else f"octet_length({column})"


def _no_control(column: str, dialect: Dialect) -> str:
    # Both regex engines (RE2, PostgreSQL's ARE) read \xNN escapes inside a bracket expression.
    pattern = r"[\x00-\x1f\x7f-\x9f]" if dialect == "duckdb" else r"[\x01-\x1f\x7f-\x9f]"
    if dialect == "duckdb":
        return f"NOT regexp_matches({column}, '{pattern}')"
    return f"{column} !~ '{pattern}'"


def _not_blank(column: str) -> str:
    return f"trim({column}) <> ''"


def check_sql(field: Field, column: str, dialect: Dialect, *, nullable: bool = False) -> str:
    """The CHECK expression holding ``field``'s rule over ``column`` (NULL passes when ``nullable``)."""
    if field == "call_node":
        parts = [
            f"{_bytes(column, dialect)} BETWEEN 1 AND {STORED_CALL_NODE_MAX_BYTES}",
            _not_blank(column),
            _no_control(column, dialect),
        ]
    elif field == "principal":
        regex = f"^[{PRINCIPAL_CHARS}]{{1,{PRINCIPAL_MAX_CHARS}}}$"
        parts = [
            f"regexp_full_match({column}, '{regex[1:-1]}')"
            if dialect == "duckdb"
            else f"{column} ~ '{regex}'"
        ]
    else:
        limit = ACTOR_MAX_CHARS if field == "actor" else REASON_MAX_CHARS
        parts = [f"length({column}) BETWEEN 1 AND {limit}", _not_blank(column), _no_control(column, dialect)]
    expression = " AND ".join(f"({p})" for p in parts)
    return f"{column} IS NULL OR ({expression})" if nullable else expression


IDENTIFIER_COLUMNS: Final[tuple[tuple[str, str, Field, bool], ...]] = (
    # (table, column, rule, nullable): the columns a person or a caller names.
    ("op_identity", "call_node_id", "call_node", False),
    ("op_identity", "principal", "principal", False),
    ("approvals", "actor", "actor", True),
    ("reconciliation", "actor", "actor", True),
    ("rollout_events", "actor", "actor", False),
    ("rollout_events", "reason", "reason", False),
)

__all__ = [
    "ACTOR_MAX_CHARS",
    "CALL_NODE_MAX_BYTES",
    "IDENTIFIER_COLUMNS",
    "PRINCIPAL_CHARS",
    "PRINCIPAL_MAX_CHARS",
    "REASON_MAX_CHARS",
    "RULES",
    "STORED_CALL_NODE_MAX_BYTES",
    "Dialect",
    "Field",
    "Rule",
    "check_actor",
    "check_call_node",
    "check_principal",
    "check_reason",
    "check_sql",
    "encoded_size",
]
