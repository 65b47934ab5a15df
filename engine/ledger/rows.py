"""Operation <-> row conversions both ledger backends share: the record codec and every row they write.

The operation record codec; the rows of ``op_identity``, ``op_state``, ``transitions``, receipts,
results, the outbox, held outcomes and the rollout's state; and the records read back (receipts,
held outcomes). Pure functions over model values and plain rows: no database driver, no I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import chain, repeat
from operator import attrgetter, is_
from typing import Any, Final

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import (
    InvalidRecord,
    LedgerCorrupt,
    LedgerError,
)
from engine.ledger.port import HeldOutcome, Json
from engine.ledger.schema import _STATE_COLUMNS, _STATE_SCHEMA, _TRANSITION_SCHEMA
from engine.model import (
    RECEIPT_STATES,
    SCHEMA_VERSION,
    AcceptTerminal,
    CallNodeId,
    Digest,
    Epoch,
    IdempotencyKey,
    LocalState,
    Operation,
    OperationId,
    Principal,
    Protocol,
    Receipt,
    Role,
    ServerStatus,
    TaskId,
    ToolRef,
    Transition,
    canonical_json,
    digest_of,
)


def _json_text(value: object) -> str:
    """Canonical JSON that also takes instants (as ISO 8601)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()


def event_detail(transition: Transition) -> str:
    """The event's fields as JSON, for the append-only log: orjson's spelling of the event dataclass
    (its fields in declaration order, nested objects' keys sorted). One transition's
    ``event_details``."""
    return event_details([transition])[0]


def event_details(transitions: Sequence[Transition]) -> list[str]:
    """Each transition's ``event_detail``, built for a whole group at once.

    orjson serialises a slotted dataclass about four times slower than a dict of the same fields
    (it reads each slot through the class), and this runs once per logged transition: an event
    whose fields are all scalars is serialised as the dict of its fields, which orjson writes
    byte for byte as it writes the dataclass (``tests/engine/ledger/test_rows.py`` holds it to that).
    The events of one class go through one pipeline of C-level maps (field getter, dict, dumps),
    not a Python call each: a group holds few event classes and thousands of events.
    """
    events = list(map(_EVENT, transitions))
    classes = list(map(type, events))
    kinds = set(classes)
    if len(kinds) == 1:
        return _details_of(kinds.pop(), events)
    out: list[str] = [""] * len(events)
    for cls in kinds:
        at = [i for i, c in enumerate(classes) if c is cls]
        for i, text in zip(at, _details_of(cls, [events[i] for i in at]), strict=True):
            out[i] = text
    return out


def _details_of(cls: type, events: Sequence[object]) -> list[str]:
    """``event_details`` of events that are all of class ``cls``."""
    fields = _scalar_fields(cls)
    if fields is None:
        return [orjson.dumps(e, option=orjson.OPT_SORT_KEYS).decode() for e in events]
    names, values = fields
    # (zip without strict: the getter gives exactly one value per name, by construction)
    texts = map(orjson.dumps, map(dict, map(zip, repeat(names), map(values, events))))
    return list(map(bytes.decode, texts))


def event_detail_array(transitions: Sequence[Transition]) -> pa.Array:
    """``event_details`` as an Arrow string column, for a group commit's log table.

    Each field of an event class with scalar fields is spelt on its own, a column at a time: once
    for the whole group where every event holds the very same object (a status, an epoch, None),
    else one orjson dump per value; Arrow then joins the spelt fields and their keys row by row in
    C. No dict and no Python step per event (the dict per event was the largest part of the log
    table). orjson spells a scalar alone as it spells it inside an object, so each text is
    ``event_details``' byte for byte (``tests/engine/ledger/test_rows.py`` holds it to that).
    """
    events = list(map(_EVENT, transitions))
    classes = list(map(type, events))
    kinds = set(classes)
    if len(kinds) == 1:
        return _detail_array_of(kinds.pop(), events)
    parts: list[pa.Array] = []
    where: list[int] = []
    for cls in kinds:
        at = [i for i, c in enumerate(classes) if c is cls]
        parts.append(_detail_array_of(cls, [events[i] for i in at]))
        where += at
    # The parts hold the events a class at a time: each goes back to its place in the group.
    return pa.concat_arrays(parts).take(pc.sort_indices(pa.array(where, pa.int64())))


def _detail_array_of(cls: type, events: Sequence[object]) -> pa.Array:
    """``event_detail_array`` of events that are all of class ``cls``."""
    fields = _scalar_fields(cls)
    if fields is None:
        return pa.array(_details_of(cls, events), pa.string())
    pieces: list[pa.Array | pa.Scalar] = []
    text = "{"
    for k, name in enumerate(fields[0]):
        text += f'{"," if k else ""}"{name}":'
        column = list(map(attrgetter(name), events))  # (a getter per field: cheaper than transposing)
        first = column[0]
        if all(map(is_, column, repeat(first))):
            text += orjson.dumps(first).decode()
        else:
            # Each dump decoded at once: a bytes object kept alive a row each costs far more.
            spelt = pa.array(list(map(bytes.decode, map(orjson.dumps, column))), pa.string())
            pieces += [pa.scalar(text, pa.string()), spelt]
            text = ""
    text += "}"
    if not pieces:
        return pa.repeat(pa.scalar(text, pa.string()), len(events))
    pieces.append(pa.scalar(text, pa.string()))
    # Made here, not at import: a pyarrow scalar built at import would have pyarrow look for pandas
    # before the service's skip_pandas_probe (engine.arrow) runs, and import it.
    return pc.binary_join_element_wise(*pieces, pa.scalar("", pa.string()))


_EVENT: Final = attrgetter("event")


_SCALAR_TYPES: Final = (str, int, float, bool, datetime, type(None))
_FieldValues = Callable[[object], tuple[object, ...]]
_EVENT_FIELDS: dict[type, tuple[tuple[str, ...], _FieldValues] | None] = {}


def _scalar_fields(cls: type) -> tuple[tuple[str, ...], _FieldValues] | None:
    """An event class's field names and their getter if every field is a scalar (by its annotation:
    str, int, float, bool, an instant, an enum, None or a union of these), else None."""
    try:
        return _EVENT_FIELDS[cls]
    except KeyError:
        pass
    found: tuple[tuple[str, ...], _FieldValues] | None = None
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        names = tuple(f.name for f in dataclasses.fields(cls))
        if len(names) > 1 and all(_scalar_hint(hints[n]) for n in names):
            # (attrgetter of one name gives the value, not a 1-tuple: one-field events take the slow path)
            found = (names, attrgetter(*names))
    _EVENT_FIELDS[cls] = found
    return found


def _scalar_hint(hint: object) -> bool:
    supertype = getattr(hint, "__supertype__", None)  # a NewType (TaskId, Epoch, ...)
    if supertype is not None:
        return _scalar_hint(supertype)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return all(_scalar_hint(a) for a in typing.get_args(hint))
    return isinstance(hint, type) and (issubclass(hint, _SCALAR_TYPES) or issubclass(hint, enum.Enum))


def refuse_receipt_states(transitions: Sequence[Transition]) -> None:
    """Refuse a group of transitions if any of them writes a receipt (an ``AcceptTerminal`` effect,
    or a move into a receipt state): that goes through ``accept_terminal``, never ``apply``.

    Checked a group at a time with C-level maps: the effects' classes as one set, then the after
    states as one set; only a group that reaches a receipt state is looked at one by one.
    """
    effect_types = set(map(type, chain.from_iterable(map(_EFFECTS, transitions))))
    reaches = not RECEIPT_STATES.isdisjoint(map(_AFTER_STATE, transitions))
    if any(issubclass(c, AcceptTerminal) for c in effect_types) or (
        reaches
        and any(t.after.state in RECEIPT_STATES and t.before.state not in RECEIPT_STATES for t in transitions)
    ):
        raise LedgerError("a transition to a receipt state goes through accept_terminal, never apply")


_EFFECTS: Final = attrgetter("effects")
_AFTER_STATE: Final = attrgetter("after.state")


def operation_to_record(op: Operation) -> dict[str, object]:
    """The flat ``toolOperation.v1`` record (the shape the ``operations`` view has)."""
    return {
        "operation_id": op.operation_id,
        "call_node_id": op.call_node_id,
        "role": op.role.value,
        "request_digest": op.request_digest,
        "tool_name": op.tool.name,
        "tool_version": op.tool.version,
        "descriptor_version": op.tool.descriptor_version,
        "side_effects": op.tool.side_effects,
        "principal": op.principal,
        "protocol": op.protocol.value,
        "adapter_version": op.adapter_version,
        "server": op.server,
        "idempotency_key": op.idempotency_key,
        "task_id": op.task_id,
        "poll_cursor": op.poll_cursor,
        "server_status": op.server_status.value if op.server_status else None,
        "input_round": op.input_round,
        "answered_round": op.answered_round,
        "input_request_key": op.input_request_key,
        "cancel_generation": op.cancel_generation,
        "cancel_requested_at": op.cancel_requested_at,
        "expires_at": op.expires_at,
        "result_digest": op.result_digest,
        "result_held": op.result_held,
        "effect_reconciliation_required": op.effect_reconciliation_required,
        "submit_attempts": op.submit_attempts,
        "state": op.state.value,
        "epoch": op.epoch,
        "row_version": op.row_version,
        "schema_version": op.schema_version,
        "created_at": op.created_at,
        "updated_at": op.updated_at,
    }


REQUIRED_RECORD_FIELDS: Final[tuple[str, ...]] = (
    "operation_id",
    "call_node_id",
    "role",
    "request_digest",
    "tool_name",
    "tool_version",
    "descriptor_version",
    "side_effects",
    "principal",
    "protocol",
    "adapter_version",
    "server",
    "idempotency_key",
    "state",
    "epoch",
    "created_at",
    "updated_at",
    "row_version",
    "schema_version",
)
"""Fields a ``toolOperation.v1`` record cannot lack; the others default (counters 0, ids absent)."""


def _as_dt(value: object, name: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as exc:
            raise InvalidRecord(f"field {name!r} is not an ISO 8601 instant: {value!r}") from exc
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise InvalidRecord(f"field {name!r} is not an instant: {value!r}")


def operation_from_record(record: dict[str, object]) -> Operation:
    """Rebuild an ``Operation`` from its flat record.

    Raises:
        InvalidRecord: a required field is missing or malformed (all missing fields are named),
            or the record is of another schema version.
    """
    missing = [n for n in REQUIRED_RECORD_FIELDS if record.get(n) is None]
    if missing:
        raise InvalidRecord(f"operation record is missing required fields: {', '.join(missing)}")
    if record["schema_version"] != SCHEMA_VERSION:
        raise InvalidRecord(
            f"operation record has schema {record['schema_version']!r}, expected {SCHEMA_VERSION!r}"
        )
    try:
        created_at = _as_dt(record["created_at"], "created_at")
        updated_at = _as_dt(record["updated_at"], "updated_at")
        assert created_at is not None
        assert updated_at is not None
        server_status = record.get("server_status")
        return Operation(
            operation_id=OperationId(str(record["operation_id"])),
            call_node_id=CallNodeId(str(record["call_node_id"])),
            request_digest=Digest(str(record["request_digest"])),
            tool=ToolRef(
                name=str(record["tool_name"]),
                version=str(record["tool_version"]),
                descriptor_version=str(record["descriptor_version"]),
                side_effects=bool(record["side_effects"]),
            ),
            principal=Principal(str(record["principal"])),
            protocol=Protocol(str(record["protocol"])),
            adapter_version=str(record["adapter_version"]),
            server=str(record["server"]),
            idempotency_key=IdempotencyKey(str(record["idempotency_key"])),
            state=LocalState(str(record["state"])),
            epoch=Epoch(int(str(record["epoch"]))),
            created_at=created_at,
            updated_at=updated_at,
            role=Role(str(record["role"])),
            task_id=TaskId(str(record["task_id"])) if record.get("task_id") is not None else None,
            poll_cursor=str(record["poll_cursor"]) if record.get("poll_cursor") is not None else None,
            server_status=ServerStatus(str(server_status)) if server_status is not None else None,
            input_round=int(str(record.get("input_round") or 0)),
            answered_round=int(str(record.get("answered_round") or 0)),
            input_request_key=(
                str(record["input_request_key"]) if record.get("input_request_key") is not None else None
            ),
            cancel_generation=int(str(record.get("cancel_generation") or 0)),
            cancel_requested_at=_as_dt(record.get("cancel_requested_at"), "cancel_requested_at"),
            expires_at=_as_dt(record.get("expires_at"), "expires_at"),
            result_digest=Digest(str(record["result_digest"]))
            if record.get("result_digest") is not None
            else None,
            result_held=bool(record.get("result_held") or False),
            effect_reconciliation_required=bool(record.get("effect_reconciliation_required") or False),
            submit_attempts=int(str(record.get("submit_attempts") or 0)),
            row_version=int(str(record["row_version"])),
            schema_version=str(record["schema_version"]),
        )
    except ValueError as exc:
        raise InvalidRecord(f"operation record has a malformed field: {exc}") from exc


_STATE_VALUES: Final = attrgetter(*_STATE_COLUMNS)
"""An operation's ``op_state`` columns, in table order (the column names are ``Operation``'s fields)."""

_TRANSITION_VALUES: Final = attrgetter(
    "after.operation_id",
    "after.call_node_id",
    "before.state",
    "after.state",
    "event.__class__.__name__",
    "reason",
    "accepted",
    "after.epoch",
    "after.row_version",
    "at",
)
"""A transition's ``transitions`` columns (without ``seq``), less ``detail`` (``event_detail``), which
goes sixth: ``_DETAIL_AT``."""
_DETAIL_AT: Final = 5

_UNIX: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final = timedelta(microseconds=1)


def _plain(value: object) -> object:
    # A driver's parameter binding is not trusted with enum members: their value is the column.
    return value.value if isinstance(value, LocalState | ServerStatus) else value


def _state_row(op: Operation, expected_version: int, expected_cancel: int) -> list[object]:
    return [*map(_plain, _STATE_VALUES(op)), expected_version, expected_cancel]


def _transition_row(t: Transition) -> list[object]:
    row = list(map(_plain, _TRANSITION_VALUES(t)))
    row.insert(_DETAIL_AT, event_detail(t))
    return row


def instants(values: Sequence[datetime | None]) -> pa.Array:
    """Instants as an Arrow timestamp column (UTC microseconds; a naive value is taken as UTC).

    pyarrow converts an aware datetime with a Python-level ``utcoffset()`` call each, the largest
    single cost of a group commit's columns; the values of one batch share few instants (a tick's
    ``now``), so each distinct object is converted once, and each value is then looked up by its
    identity through C-level maps (no Python step per value). ``values`` must hold its items (a
    sequence, not a generator): they are told apart by identity.
    """
    ids = list(map(id, values))
    micros: dict[int, int | None] = {
        key: None if value is None else _micros(value)
        for key, value in dict(zip(ids, values, strict=True)).items()
    }
    return pa.array(list(map(micros.__getitem__, ids)), pa.int64()).cast(pa.timestamp("us", tz="UTC"))


def _micros(value: datetime) -> int:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return (aware - _UNIX) // _MICROSECOND


def arrow_columns(
    columns: Sequence[Sequence[object] | pa.Array | pa.ChunkedArray], schema: pa.Schema
) -> pa.Table:
    """An Arrow table of ``schema`` from its columns (timestamps through ``instants``; a column that is
    Arrow already is taken as it is)."""
    return pa.Table.from_arrays(
        [
            c if isinstance(c, pa.Array | pa.ChunkedArray) else _arrow_column(c, f.type)
            for c, f in zip(columns, schema, strict=True)
        ],
        schema=schema,
    )


def _arrow_column(values: Sequence[object], type_: pa.DataType) -> pa.Array:
    """One column as Arrow. A group's columns often hold one object throughout (its instant, its
    event's name, the state all its polls stay in): such a column is converted once and repeated in
    C rather than converted value by value (a column of other values stops the check at once)."""
    convert = _instants if pa.types.is_timestamp(type_) else partial(pa.array, type=type_)
    if len(values) > 1 and all(map(is_, values, repeat(values[0]))):
        return pa.repeat(convert(values[:1])[0], len(values))
    return convert(values)


def _instants(values: Sequence[object]) -> pa.Array:
    return instants(values)  # type: ignore[arg-type]  # (a timestamp column holds instants or None)


def arrow_rows(rows: Sequence[Sequence[object]], schema: pa.Schema) -> pa.Table:
    """An Arrow table of ``schema`` from rows in its column order."""
    columns: list[Sequence[object]] = list(zip(*rows, strict=True)) if rows else [() for _ in schema.names]
    return arrow_columns(columns, schema)


def state_table(ops: Sequence[Operation], expected: Sequence[tuple[int, int]]) -> pa.Table:
    """``_state_row``'s rows as an Arrow table, built by column: ``expected`` holds each operation's
    expected row version and cancel generation (the compare-and-swap's condition)."""
    if not ops:
        return arrow_rows([], _STATE_SCHEMA)
    return arrow_columns(
        [*zip(*map(_STATE_VALUES, ops), strict=True), *zip(*expected, strict=True)], _STATE_SCHEMA
    )


_VERSION_AT: Final = _STATE_COLUMNS.index("row_version")
_CANCEL_AT: Final = _STATE_COLUMNS.index("cancel_generation")
_EXPECTED_FIELDS: Final = [
    _STATE_SCHEMA.field("expected_version"),
    _STATE_SCHEMA.field("expected_cancel_generation"),
]


def state_changes(befores: Sequence[Operation], afters: Sequence[Operation]) -> pa.Table:
    """The compare-and-swap table of a group's changed operations (``befores[i]`` -> ``afters[i]``):
    ``operation_id``, the state columns in which some of them moved, and the expected row version and
    cancel generation of each.

    A column in which none moved is left out: the row a compare-and-swap matches holds the
    ``before`` values (every write moves the row version, see ``Operation``), so writing them again
    would change nothing and cost the UPDATE a column and its WAL record. A poll moves three or
    four of the seventeen.

    Built column by column with C-level maps (one attribute getter per column, no per-operation
    tuple): a column whose values all stay the very same objects compares at C speed, and one that
    moved stops comparing at its first difference.
    """
    fields = [_STATE_SCHEMA.field(0)]
    columns: list[Sequence[object]] = [list(map(_STATE_GETTERS[0], afters))]
    old_version = list(map(_STATE_GETTERS[_VERSION_AT], befores))
    old_cancel = list(map(_STATE_GETTERS[_CANCEL_AT], befores))
    known = {_VERSION_AT: old_version, _CANCEL_AT: old_cancel}
    for i in range(1, len(_STATE_COLUMNS)):
        get = _STATE_GETTERS[i]
        new = list(map(get, afters))
        old = known.get(i) or list(map(get, befores))
        if new != old:
            fields.append(_STATE_SCHEMA.field(i))
            columns.append(new)
    if len(fields) == 1:
        fields.append(_STATE_SCHEMA.field(_VERSION_AT))
        columns.append(list(map(_STATE_GETTERS[_VERSION_AT], afters)))
    columns += [old_version, old_cancel]
    return arrow_columns(columns, pa.schema([*fields, *_EXPECTED_FIELDS]))


_STATE_GETTERS: Final = tuple(attrgetter(c) for c in _STATE_COLUMNS)
_CALL_NODE: Final = attrgetter("call_node_id")
_BEFORE: Final = attrgetter("before")
_AFTER: Final = attrgetter("after")
_TRANSITION_GETTERS: Final = (
    attrgetter("event.__class__.__name__"),
    attrgetter("reason"),
    attrgetter("accepted"),
    attrgetter("at"),
)


def transition_table(transitions: Sequence[Transition], state: pa.Table | None = None) -> pa.Table:
    """``_transition_row``'s rows as an Arrow table, built by column (C-level maps, as ``state_changes``).

    ``state``: the group's compare-and-swap table (``state_changes``) when its rows are these very
    transitions' operations in the same order (one transition per operation, each moving its row).
    The columns both tables hold (operation ids, row versions, and the new states and epochs where
    some moved) are then taken from it rather than read from every operation and converted again;
    where no state moved, the log's old and new states are one column.
    """
    if not transitions:
        return arrow_rows([], _TRANSITION_SCHEMA)
    afters = list(map(_AFTER, transitions))
    shared = set(state.column_names) if state is not None else set()

    def column(name: str, get: Callable[[object], object]) -> Sequence[object] | pa.ChunkedArray:
        return state.column(name) if state is not None and name in shared else list(map(get, afters))

    from_state = list(map(_STATE_GETTERS[1], map(_BEFORE, transitions)))
    to_state = column("state", _STATE_GETTERS[1]) if state is None or "state" in shared else from_state
    event, reason, accepted, at = (list(map(g, transitions)) for g in _TRANSITION_GETTERS)
    columns: list[Sequence[object] | pa.Array | pa.ChunkedArray] = [
        column("operation_id", _STATE_GETTERS[0]),
        list(map(_CALL_NODE, afters)),
        from_state,
        to_state,
        event,
        event_detail_array(transitions),
        reason,
        accepted,
        column("epoch", _STATE_GETTERS[_STATE_COLUMNS.index("epoch")]),
        column("row_version", _STATE_GETTERS[_VERSION_AT]),
        at,
    ]
    return arrow_columns(columns, _TRANSITION_SCHEMA)


def _string_list(value: object) -> list[str]:
    if not isinstance(value, list | tuple):
        raise InvalidRecord(f"expected a list of strings, got {value!r}")
    return [str(v) for v in value]


def warm_up_operation() -> Operation:
    """A throwaway operation a backend writes and rolls back to warm its statements up."""
    now = datetime(2000, 1, 1, tzinfo=UTC)
    return Operation(
        operation_id=OperationId("warm-up"),
        call_node_id=CallNodeId("warm-up"),
        request_digest=Digest("sha256:0"),
        tool=ToolRef("warm-up", "0", "0"),
        principal=Principal("warm-up"),
        protocol=Protocol.LEGACY_SYNC,
        adapter_version="0",
        server="warm-up",
        idempotency_key=IdempotencyKey("warm-up"),
        state=LocalState.WORKING,
        epoch=Epoch(0),
        created_at=now,
        updated_at=now,
    )


def require_resolution(actor: str, resolution: str) -> None:
    """Refuse resolving a reconciliation entry without an actor and a reason."""
    if not actor.strip() or not resolution.strip():
        raise InvalidRecord("resolving a reconciliation entry needs an actor and a reason")


def require_new(op: Operation) -> None:
    """Refuse an operation that is not new (SUBMITTING at row version 0)."""
    if op.state is not LocalState.SUBMITTING or op.row_version != 0:
        raise InvalidRecord("a new operation starts in SUBMITTING at row version 0")


def identity_row(op: Operation, arguments: Json) -> list[object]:
    """The operation's ``op_identity`` row (written once)."""
    return [
        op.operation_id,
        op.call_node_id,
        op.role.value,
        op.request_digest,
        op.tool.name,
        op.tool.version,
        op.tool.descriptor_version,
        op.tool.side_effects,
        op.principal,
        op.protocol.value,
        op.adapter_version,
        op.server,
        op.idempotency_key,
        canonical_json(arguments),
        op.schema_version,
        op.created_at,
    ]


def created_row(op: Operation) -> list[object]:
    """The ``transitions`` row (without ``seq``) that records a new operation before its submission."""
    return [
        op.operation_id,
        op.call_node_id,
        None,
        op.state.value,
        "Created",
        canonical_json({"idempotency_key": op.idempotency_key}),
        "operation recorded before submission",
        True,
        op.epoch,
        op.row_version,
        op.created_at,
    ]


@dataclass(frozen=True, slots=True)
class AcceptanceRows:
    """Every row one acceptance writes: the operation's state, its transition, the receipt, and
    (for an accepted result) the stored result and (for a primary operation) one ready outbox row."""

    state: list[object]
    transition: list[object]
    receipt: list[object]
    result: list[object] | None
    outbox: list[object] | None


def acceptance_rows(
    current: Operation, t: Transition, payload: Json | None, receipt: Receipt
) -> AcceptanceRows:
    """The rows of an acceptance ``engine.acceptance.check_acceptance`` allowed against ``current``.

    A shadow operation's receipt never reaches the outbox; a payload is stored (and sent on) only
    for an ACCEPTED result.
    """
    body = canonical_json(payload) if payload is not None else None
    accepted = t.after.state is LocalState.ACCEPTED
    return AcceptanceRows(
        state=_state_row(t.after, current.row_version, current.cancel_generation),
        transition=_transition_row(t),
        receipt=[
            receipt.call_node_id,
            receipt.operation_id,
            receipt.request_digest,
            receipt.task_id,
            receipt.tool_version,
            receipt.epoch,
            receipt.cancel_generation,
            receipt.status.value,
            receipt.result_digest,
            receipt.cancel_evidence,
            current.role.value,
            receipt.accepted_at,
        ],
        result=(
            [current.operation_id, receipt.result_digest, receipt.status.value, body, receipt.accepted_at]
            if body is not None and accepted
            else None
        ),
        outbox=(
            [
                receipt.call_node_id,
                receipt.operation_id,
                "ready",
                receipt.status.value,
                receipt.result_digest,
                body if accepted else None,
                receipt.accepted_at,
            ]
            if current.role is Role.PRIMARY
            else None
        ),
    )


def audit_row(op: Operation, kind: str, payload: Json | None, at: datetime) -> list[object]:
    """A ``receipt_audit`` row: something read after the terminal, beside the receipt."""
    return [
        op.call_node_id,
        op.operation_id,
        kind,
        digest_of(payload) if payload is not None else None,
        canonical_json(payload) if payload is not None else None,
        at,
    ]


def held_rows(items: Sequence[tuple[str, HeldOutcome]]) -> list[list[object]]:
    """``held_outcomes`` rows, one per operation: a later copy replaces an earlier one."""
    latest = dict(items)
    return [
        [
            operation_id,
            held.status,
            held.digest,
            canonical_json(held.payload),
            held.task_id,
            held.epoch_echo,
            held.held_at,
        ]
        for operation_id, held in latest.items()
    ]


def held_from_row(operation_id: str, row: Sequence[Any]) -> HeldOutcome:
    """A held outcome from its ``status, digest, payload, task_id, epoch_echo, held_at`` row."""
    payload = json.loads(str(row[2]))
    if not isinstance(payload, dict):
        raise LedgerCorrupt(f"held outcome of {operation_id} is not a JSON object")
    return HeldOutcome(
        status=str(row[0]),
        digest=str(row[1]),
        payload=payload,
        task_id=row[3],
        epoch_echo=int(row[4]) if row[4] is not None else None,
        held_at=_as_dt(row[5], "held_at") or datetime.min.replace(tzinfo=UTC),
    )


def receipt_from_row(row: Sequence[Any]) -> Receipt:
    """A receipt from its row in ``engine.ledger.sql.RECEIPT_OF_CALL_NODE``'s column order."""
    return Receipt(
        call_node_id=CallNodeId(row[0]),
        operation_id=OperationId(row[1]),
        request_digest=Digest(row[2]),
        task_id=TaskId(row[3]) if row[3] is not None else None,
        tool_version=str(row[4]),
        epoch=Epoch(int(row[5])),
        cancel_generation=int(row[6]),
        status=ServerStatus(row[7]),
        result_digest=Digest(row[8]) if row[8] is not None else None,
        accepted_at=_as_dt(row[9], "accepted_at") or datetime.min.replace(tzinfo=UTC),
        cancel_evidence=row[10],
    )


def rollout_state_row(event: dict[str, object], state: dict[str, object]) -> list[object]:
    """The ``rollout_state`` columns after ``id``: the new state, with the event as the chain head."""
    return [
        state["stage"],
        state["canary_bp"],
        state["salt"],
        _json_text(_string_list(state["shadow_tools"])),
        _json_text(_string_list(state["disabled_protocols"])),
        state["epoch"],
        event["seq"],
        event["hash"],
        event["recorded_at"],
    ]


__all__ = [
    "REQUIRED_RECORD_FIELDS",
    "AcceptanceRows",
    "acceptance_rows",
    "arrow_columns",
    "arrow_rows",
    "audit_row",
    "created_row",
    "event_detail",
    "event_details",
    "held_from_row",
    "held_rows",
    "identity_row",
    "instants",
    "operation_from_record",
    "operation_to_record",
    "receipt_from_row",
    "require_new",
    "require_resolution",
    "rollout_state_row",
    "state_changes",
    "state_table",
    "transition_table",
    "warm_up_operation",
]
