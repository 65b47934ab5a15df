"""The ledger's row codec: the columnar builders of the group commit write what the row builders write."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pyarrow as pa

from engine.ledger import rows
from engine.ledger.schema import _STATE_SCHEMA, _TRANSITION_SCHEMA
from engine.machine import step
from engine.model import (
    CancelRequested,
    Epoch,
    Event,
    ServerStatus,
    StatusObserved,
    Submitted,
    TaskId,
    Transition,
)
from engine.testing import EPOCH_START, make_operation

_AWKWARD = 'a "quoted" },{" \\ caf\u00e9 \u2603 \n tab\t end'
_ELSEWHERE = datetime(2026, 3, 4, 5, 6, 7, 891011, tzinfo=timezone(timedelta(hours=-5)))


def _sample(hint: object) -> object:
    """A value for a field annotated ``hint``: awkward strings, an instant off UTC, an enum member."""
    supertype = getattr(hint, "__supertype__", None)
    if supertype is not None:
        return _sample(supertype)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return _sample(next(a for a in typing.get_args(hint) if a is not type(None)))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return list(hint)[-1]
    if hint is bool:
        return True
    if hint is int:
        return 7
    if hint is float:
        return 0.25
    if hint is datetime:
        return _ELSEWHERE
    if hint is str:
        return _AWKWARD
    if typing.get_origin(hint) in (tuple, list):
        return (_AWKWARD, {"z": 1, "a": [{"y": 2, "b": 3}]})
    if typing.get_origin(hint) is dict or hint is dict:
        return {"z": 1, "a": {"y": _AWKWARD}}
    raise AssertionError(f"no sample for {hint!r}")


def _events() -> list[object]:
    out = []
    for cls in typing.get_args(Event):
        hints = typing.get_type_hints(cls)
        out.append(cls(**{f.name: _sample(hints[f.name]) for f in dataclasses.fields(cls)}))
    return out


def _transitions() -> list[Transition]:
    ops = [make_operation(f"rows-{i}") for i in range(3)]
    submitted = [step(op, Submitted(TaskId(f"t-{i}"), Epoch(1)), EPOCH_START) for i, op in enumerate(ops)]
    later = EPOCH_START + timedelta(seconds=3)
    polled = [
        step(
            t.after,
            StatusObserved(TaskId(f"t-{i}"), ServerStatus.WORKING, Epoch(1), poll_cursor=_AWKWARD),
            later,
        )
        for i, t in enumerate(submitted)
    ]
    cancelled = step(polled[0].after, CancelRequested(1, "ana", _AWKWARD), later)
    return [*submitted, *polled, cancelled]


def test_event_detail_is_orjsons_spelling_of_every_event_class() -> None:
    """Every event class's detail is byte for byte what orjson writes for the dataclass itself."""
    events = _events()
    assert len(events) == len(typing.get_args(Event))
    for event in events:
        t = dataclasses.replace(_transitions()[0], event=event)  # type: ignore[arg-type]
        assert rows.event_detail(t) == orjson.dumps(event, option=orjson.OPT_SORT_KEYS).decode(), type(event)


def test_instants_are_the_utc_microseconds_pyarrow_gives_aware_datetimes() -> None:
    """Shared, repeated, off-UTC, naive and missing instants convert as pyarrow converts them one by one."""
    now = datetime(2026, 12, 1, 17, 0, 0, 123456, tzinfo=UTC)
    values = [
        now,
        _ELSEWHERE,
        None,
        now,
        datetime(2001, 2, 3, 4, 5, 6, 7),  # noqa: DTZ001 (a naive value is taken as UTC)
        _ELSEWHERE,
    ]
    expected = pa.array(
        [v if v is None or v.tzinfo else v.replace(tzinfo=UTC) for v in values], pa.timestamp("us", tz="UTC")
    )
    assert rows.instants(values).equals(expected)


def test_state_and_transition_tables_hold_the_rows_the_row_builders_write() -> None:
    """The columnar group-commit tables equal the tables of the row-by-row builders."""
    ts = _transitions()
    expected = [(t.before.row_version, t.before.cancel_generation) for t in ts]
    by_rows = rows.arrow_rows(
        [rows._state_row(t.after, v, c) for t, (v, c) in zip(ts, expected, strict=True)], _STATE_SCHEMA
    )
    assert rows.state_table([t.after for t in ts], expected).equals(by_rows)
    log = rows.transition_table(ts)
    assert log.equals(rows.arrow_rows([rows._transition_row(t) for t in ts], _TRANSITION_SCHEMA))
    assert log.column("detail").to_pylist() == [
        orjson.dumps(t.event, option=orjson.OPT_SORT_KEYS).decode() for t in ts
    ]
    assert rows.transition_table([]).num_rows == 0


def test_a_groups_compare_and_swap_table_holds_only_the_state_columns_it_moves() -> None:
    """Polls move the cursor, status, version and instant: the other state columns stay out of the UPDATE."""
    ts = _transitions()[3:6]  # the three polls
    table = rows.state_changes([t.before for t in ts], [t.after for t in ts])
    assert table.column_names == [
        "operation_id",
        "server_status",
        "poll_cursor",
        "row_version",
        "updated_at",
        "expected_version",
        "expected_cancel_generation",
    ]
    full = rows.state_table(
        [t.after for t in ts], [(t.before.row_version, t.before.cancel_generation) for t in ts]
    )
    assert table.equals(full.select(table.column_names))


def test_a_groups_event_details_keep_each_events_class_and_order_when_classes_interleave() -> None:
    """A group's details, built a class at a time, are each event's own orjson spelling, in the group's order."""
    base = _transitions()
    mixed = [dataclasses.replace(base[i % len(base)], event=e) for i, e in enumerate(_events() * 3)]  # type: ignore[arg-type]
    assert len({type(t.event) for t in mixed}) > 1
    assert rows.event_details(mixed) == [
        orjson.dumps(t.event, option=orjson.OPT_SORT_KEYS).decode() for t in mixed
    ]
    assert rows.event_details([]) == []


def test_equal_values_of_other_types_or_offsets_keep_their_own_spelling_in_a_group() -> None:
    """Events whose fields are equal but spelled apart (one instant in two zones, an empty and a set
    cursor, a value shared by many events) each keep orjson's spelling of themselves."""
    base = _transitions()[0]
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    other_zone = at.astimezone(timezone(timedelta(hours=1)))
    assert at == other_zone
    events = [
        StatusObserved(TaskId("t-1"), ServerStatus.WORKING, Epoch(1), poll_cursor="c", expires_at=at),
        StatusObserved(TaskId("t-2"), ServerStatus.WORKING, Epoch(1), poll_cursor="c", expires_at=other_zone),
        StatusObserved(
            TaskId('t-"3"'), ServerStatus.INPUT_REQUIRED, Epoch(2), poll_cursor=None, expires_at=at
        ),
    ]
    group = [dataclasses.replace(base, event=e) for e in events * 2]
    texts = rows.event_details(group)
    assert texts == [orjson.dumps(t.event, option=orjson.OPT_SORT_KEYS).decode() for t in group]
    assert texts[0] != texts[1]


def test_a_groups_event_detail_column_is_each_events_orjson_spelling_in_the_groups_order() -> None:
    """The log table's detail column, spelt a field column at a time, holds each event's own orjson
    text: for every event class alone, for interleaved classes, for values shared by the whole
    group or equal but spelt apart, and for awkward strings."""
    base = _transitions()
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    alike = [
        StatusObserved(TaskId("t-1"), ServerStatus.WORKING, Epoch(1), poll_cursor="c", expires_at=at),
        StatusObserved(
            TaskId("t-2"),
            ServerStatus.WORKING,
            Epoch(1),
            expires_at=at.astimezone(timezone(timedelta(hours=1))),
        ),
        StatusObserved(TaskId(_AWKWARD), ServerStatus.INPUT_REQUIRED, Epoch(2), poll_cursor=_AWKWARD),
    ]
    groups = [
        *([dataclasses.replace(base[0], event=e)] * 3 for e in _events()),  # type: ignore[arg-type]
        [dataclasses.replace(base[i % len(base)], event=e) for i, e in enumerate(_events() * 3)],  # type: ignore[arg-type]
        [dataclasses.replace(base[0], event=e) for e in alike * 2],
        base,
    ]
    for group in groups:
        column = rows.event_detail_array(group)
        assert column.type == pa.string()
        assert column.to_pylist() == [
            orjson.dumps(t.event, option=orjson.OPT_SORT_KEYS).decode() for t in group
        ]


def test_a_log_table_built_beside_its_groups_compare_and_swap_table_holds_the_same_rows() -> None:
    """Where the log takes its shared columns from the group's compare-and-swap table, it holds what
    it holds built alone: for polls (no state moves) and for submissions (states and task ids move)."""
    ts = _transitions()
    for group in (ts[:3], ts[3:6]):
        state = rows.state_changes([t.before for t in group], [t.after for t in group])
        assert rows.transition_table(group, state).equals(rows.transition_table(group))
    assert "state" in rows.state_changes([t.before for t in ts[:3]], [t.after for t in ts[:3]]).column_names
