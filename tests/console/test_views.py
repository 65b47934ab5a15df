"""What the console's values read like to a person: gate units, approval forms, reconciliation summaries."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest

from console.views import (
    MARK_LEVELS,
    action_marks,
    answer_fields,
    build_answer,
    candidates_summary,
    decision_field,
    fitting_bucket,
    fitting_window,
    gate_threshold,
    gate_value,
    next_step,
    seconds_ticks,
)
from engine.errors import ActionRefused

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {
            "approve": {"type": "boolean", "title": "Approve this step"},
            "note": {"type": "string", "title": "Note"},
            "region": {"type": "string", "enum": ["eu", "us"]},
            "copies": {"type": "integer"},
        },
        "required": ["approve", "region"],
    }
)


def test_gate_values_read_with_their_units_at_a_readable_precision() -> None:
    """Seconds, minutes, requests per second and shares read with units, not as bare floats."""
    assert gate_value("cancel_confirmation", 11.7934) == "11.8 s"
    assert gate_threshold("cancel_confirmation", 60.0) == "< 60.0 s"
    assert gate_value("unknown_reconciliation", 189.06) == "3.2 min"
    assert gate_threshold("unknown_reconciliation", 900.0) == "≤ 15.0 min"
    assert gate_value("poll_amplification", 18.0) == "18 req/s"
    assert gate_value("traceability", 0.3151) == "31.5%"
    assert gate_value("duplicate_operations", 0.0) == "0 duplicated"
    assert gate_value("cancel_confirmation", None) == "—"


def test_an_approval_schema_becomes_approve_reject_and_a_form_for_the_other_fields() -> None:
    """The boolean ``approve`` is what Approve / Reject set; the other fields are asked by the form."""
    fields = answer_fields(SCHEMA)
    assert [f.name for f in fields] == ["approve", "note", "region", "copies"]
    decision = decision_field(fields)
    assert decision is not None
    assert decision.name == "approve"
    region = next(f for f in fields if f.name == "region")
    assert region.kind == "enum"
    assert region.options == ("eu", "us")
    assert region.required
    others = [f for f in fields if f is not decision]
    assert build_answer(others, {"note": "", "region": "eu", "copies": "3"}) == {"region": "eu", "copies": 3}


def test_a_required_field_left_empty_is_refused_naming_it() -> None:
    """The form refuses before sending and says which field is missing."""
    others = [f for f in answer_fields(SCHEMA) if f.name != "approve"]
    with pytest.raises(ActionRefused, match="region"):
        build_answer(others, {"note": "fine"})


def test_a_schema_that_is_not_an_object_schema_gives_no_form() -> None:
    """No properties: the page falls back to a JSON answer."""
    assert answer_fields("not json") == []
    assert answer_fields(json.dumps({"type": "string"})) == []
    assert (
        decision_field(
            answer_fields(json.dumps({"properties": {"a": {"type": "boolean"}, "b": {"type": "boolean"}}}))
        )
        is None
    )


def test_hundreds_of_candidates_read_as_a_count_and_a_sample() -> None:
    """A person sees how many candidates there are and a few ids, never the whole list."""
    ids = [f"task-{n:04d}" for n in range(250)]
    text = candidates_summary(json.dumps(ids))
    assert text == "250: task-0000, task-0001, task-0002 (+247 more)"
    assert candidates_summary("[]") == "none"
    assert candidates_summary(None) == "none"


def test_the_next_step_depends_on_what_the_entry_already_knows() -> None:
    """A known task id, candidates, nothing, or leftover effects: each says what to do."""
    assert "task t-9" in next_step("unknown", "t-9", "[]")
    assert "2 candidate tasks" in next_step("unknown", None, json.dumps(["a", "b"]))
    assert "submission key" in next_step("unknown", None, "[]")
    assert "cancelled work" in next_step("effects", None, "[]")


def test_the_cancel_chart_window_fits_the_data_and_cuts_it_into_many_buckets() -> None:
    """Data minutes old: the last hour in minutes; a week of data: 7 days in 6-hour buckets; none: 7 days."""
    windows = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
    buckets = {
        "1m": timedelta(minutes=1),
        "10m": timedelta(minutes=10),
        "1h": timedelta(hours=1),
        "6h": timedelta(hours=6),
    }
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    assert fitting_window(now - timedelta(minutes=3), now, windows) == "1h"
    assert fitting_window(now - timedelta(hours=5), now, windows) == "24h"
    assert fitting_window(now - timedelta(days=6), now, windows) == "7d"
    assert fitting_window(None, now, windows) == "7d"
    assert fitting_bucket(windows["1h"], buckets) == "1m"
    assert fitting_bucket(windows["24h"], buckets) == "1h"
    assert fitting_bucket(windows["7d"], buckets) == "6h"


def test_rollout_actions_close_together_share_one_label_and_neighbours_take_other_rows() -> None:
    """Two actions 5 s apart on a 10-minute chart are one label ("shadow + canary"); successive labels
    alternate rows, so no two labels of a row are nearer than MARK_LEVELS groups apart."""
    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    actions = [
        (t0 + timedelta(seconds=60), "shadow", "mona"),
        (t0 + timedelta(seconds=65), "canary", "mona"),
        (t0 + timedelta(seconds=200), "rollback", "a-very-long-principal-name-indeed"),
        (t0 + timedelta(seconds=300), "shadow", "mona"),
        (t0 + timedelta(seconds=400), "canary", "mona"),
    ]
    marks = action_marks(actions, t0, t0 + timedelta(minutes=10))
    assert marks[0].label == "shadow + canary"
    assert len(marks) == 4
    assert all(len(m.label) <= 26 for m in marks)
    assert marks[1].label.endswith("…")
    assert "rollback by a-very-long-principal-name-indeed" in marks[1].hover
    assert "12:01:05 canary by mona" in marks[0].hover
    assert [m.level for m in marks] == [i % MARK_LEVELS for i in range(4)]


def test_reconciliation_rows_grow_to_show_a_long_reason_in_full() -> None:
    """A reason a living demo records (a result that failed verification, with its digest) wraps to five
    lines in the 330 px reason column at the grid's measured 6.2 px per character: the row is that
    tall, where the fixed three-line row cut it; rows of short texts stay three lines tall."""
    import textwrap

    from console.frame import WRAP_ROW_PX, wrapped_row_px

    reason = (
        "result failed verification: stale epoch 0 echoed by the result; it was fetched at epoch 1, the "
        "operation is at epoch 1; candidate result digest "
        "sha256:ccfd353d2340f3623d86f0e32f52d2868392e8a37fe8d4e64cca7b893e9da087"
    )
    lines_needed = len(textwrap.wrap(reason, width=int((330 - 16) / 6.2)))
    assert lines_needed >= 4, lines_needed
    step = next_step("unknown", None, None)
    assert wrapped_row_px({330: [reason, "short"], 400: [step]}) >= 8 + 20 * lines_needed
    assert wrapped_row_px({330: ["cancel won"], 400: [step]}) == WRAP_ROW_PX
    assert wrapped_row_px({330: ["x" * 10_000]}) == 8 + 20 * 16  # a bounded row, not a page-high one


def test_a_log_axis_of_seconds_labels_each_tick_with_its_unit_and_shows_the_gate() -> None:
    """From 20 ms to 90 s: 1-2-5 steps labelled "20 ms" ... "20 s", and the 60 s gate as its own tick in
    place of the 50 s step (plotly's own log ticks label 50 s as a bare "5", next to the gate line)."""
    ticks, labels = seconds_ticks([math.log10(0.02), math.log10(90)], marks=(60.0,))
    assert ticks == [0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60]
    assert labels[:3] == ["20 ms", "50 ms", "100 ms"]
    assert labels[-3:] == ["10 s", "20 s", "60 s"]
    assert all(label.endswith((" ms", " s")) for label in labels)
