"""The console's view types and error tree: what the insights facade hands pages (gate views, rollout status, SQL results).

Values only: no I/O, no Streamlit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pandas as pd  # type: ignore[import-untyped]

from engine.errors import ActionRefused, ConsoleError, SourceUnavailable
from engine.model import GateRecord
from rollout.gates import gate_threshold, gate_value

Json = dict[str, Any]


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


def _float(value: object) -> float | None:
    if value is None:
        return None
    try:
        return float(str(value))
    except ValueError:
        return None


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


# How each gate's value and threshold read to a person: (format a number, comparison that passes).
# One place: the console's tables, its what-if and `finality gates` all print through ``gate_value``.
@dataclass(frozen=True, slots=True)
class AnswerField:
    """One field of an approval's requested schema, as a form shows it."""

    name: str
    kind: str
    """``boolean``, ``number``, ``integer``, ``enum`` or ``string``."""
    title: str
    required: bool
    options: tuple[str, ...] = ()


def answer_fields(schema_text: object) -> list[AnswerField]:
    """The fields a form asks for, from the round's requested JSON schema (an object schema; anything
    else yields no fields and the page falls back to a JSON answer)."""
    try:
        schema = json.loads(schema_text) if isinstance(schema_text, str) else schema_text
    except json.JSONDecodeError:
        return []
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    required = set(schema.get("required") or [])
    out: list[AnswerField] = []
    for name, spec in schema["properties"].items():
        spec = spec if isinstance(spec, dict) else {}
        kind = str(spec.get("type", "string"))
        options: tuple[str, ...] = ()
        if isinstance(spec.get("enum"), list):
            kind, options = "enum", tuple(str(v) for v in spec["enum"])
        if kind not in ("boolean", "number", "integer", "enum"):
            kind = "string"
        out.append(AnswerField(str(name), kind, str(spec.get("title") or name), name in required, options))
    return out


def decision_field(fields: list[AnswerField]) -> AnswerField | None:
    """The boolean field Approve / Reject set (one named like ``approve``, else the only boolean)."""
    booleans = [f for f in fields if f.kind == "boolean"]
    named = [f for f in booleans if f.name.lower().startswith(("approv", "accept", "confirm", "allow"))]
    if named:
        return named[0]
    return booleans[0] if len(booleans) == 1 else None


def build_answer(fields: list[AnswerField], values: dict[str, object]) -> dict[str, object]:
    """The answer object from a form's values: empty optional fields are left out; a required one
    left empty is refused here, naming it (the service checks the schema again)."""
    out: dict[str, object] = {}
    for f in fields:
        value = values.get(f.name)
        if value is None or (isinstance(value, str) and not value.strip()):
            if f.required:
                raise ActionRefused(422, f"'{f.title}' ({f.name}) is required")
            continue
        if f.kind == "integer":
            value = int(float(str(value)))
        elif f.kind == "number":
            value = float(str(value))
        out[f.name] = value
    return out


def candidate_ids(text: object) -> list[str]:
    """The candidate task ids an entry recorded (a JSON list; anything else reads as none or one)."""
    if text is None or (isinstance(text, float) and text != text):
        return []
    try:
        value = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError:
        return [str(text)] if str(text).strip() else []
    if isinstance(value, list):
        return [str(v.get("task_id", v) if isinstance(v, dict) else v) for v in value]
    return [] if value in (None, "") else [str(value)]


def candidates_summary(text: object, *, sample: int = 3) -> str:
    """``none`` or ``N: a, b, c (+N-3 more)``: a count and a few ids, never hundreds."""
    ids = candidate_ids(text)
    if not ids:
        return "none"
    shown = ", ".join(i if len(i) <= 14 else i[:13] + "…" for i in ids[:sample])
    return f"{len(ids)}: {shown}" + (f" (+{len(ids) - sample} more)" if len(ids) > sample else "")


def next_step(kind: str, task_id: object, candidates: object) -> str:
    """What a person should do next with an open entry (by its kind and what it already knows)."""
    if kind == "effects":
        return "Check what the cancelled work changed on the server; undo or accept it, then resolve saying which."
    known = "" if task_id is None or (isinstance(task_id, float) and task_id != task_id) else str(task_id)
    if known:
        return f"Ask the server for task {known}: bind it if it answers, declare it absent if the server says none."
    n = len(candidate_ids(candidates))
    if n:
        return (
            f"Check the {n} candidate task{'s' if n > 1 else ''} on the server: bind the one that ran this call "
            "(its arguments match), or declare it absent."
        )
    return (
        "Find the call on the server by its submission key or arguments: bind the task found, or declare it "
        "absent when the server proves it never ran."
    )


def unanswered(exc: ConsoleError, refresh_s: float | None) -> str:
    """The one line a page shows instead of what it could not read (never a traceback): what went
    wrong, and when it is read again (a live section's next refresh; None: when the page is opened again)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if not isinstance(exc, SourceUnavailable):
        text = f"this section could not be read: {text}"
    then = (
        f"retrying at the next refresh (every {refresh_s:g} s)"
        if refresh_s is not None
        else "open the page again to retry"
    )
    return f"{text[:1].upper()}{text[1:]}; {then}."


def fitting_window(first_at: datetime | None, now: datetime, windows: dict[str, Any]) -> str:
    """The shortest of ``windows`` (name -> timedelta, shortest first) that holds data since ``first_at``:
    a demo minutes old gets the last hour, a week-old ledger the last 7 days."""
    names = list(windows)
    if first_at is None:
        return names[-1]
    for name in names:
        if now - windows[name] <= first_at:
            return name
    return names[-1]


def fitting_bucket(window: Any, buckets: dict[str, Any], *, min_buckets: int = 24) -> str:
    """The widest of ``buckets`` (shortest first) that still cuts ``window`` into ``min_buckets`` or more
    (one bucket per window draws a point, not a line)."""
    names = list(buckets)
    fitting = [n for n in names if window / buckets[n] >= min_buckets]
    return fitting[-1] if fitting else names[0]


@dataclass(frozen=True, slots=True)
class ActionMark:
    """One label over a time chart for one or more rollout actions close together in time."""

    at: datetime
    """Where the label and its line stand (the first action of the group)."""
    label: str
    """What the chart prints (short: one action with its actor, or the group's actions)."""
    hover: str
    """Every action of the group in full: when, what, who."""
    level: int
    """Which row of labels (0 lowest): neighbouring groups alternate rows, so labels never overlap."""


MARK_LABEL_CHARS = 26
MARK_LEVELS = 3


def action_marks(
    actions: list[tuple[datetime, str, str]], start: datetime, end: datetime, *, min_gap_share: float = 0.1
) -> list[ActionMark]:
    """Labels for rollout actions ``(at, action, actor)`` on a chart spanning ``start``..``end``.

    Actions closer than ``min_gap_share`` of the span to the group before them join it (one label,
    every action in its hover), and successive groups take successive label rows: with labels of at
    most ``MARK_LABEL_CHARS`` characters, two labels in one row are then ``MARK_LEVELS`` gaps apart,
    wider than a label on a chart of ordinary width (the gate history's labels overlapped before).
    """
    span = max((end - start).total_seconds(), 1e-9)
    groups: list[list[tuple[datetime, str, str]]] = []
    for item in sorted(actions, key=lambda a: a[0]):
        if groups and (item[0] - groups[-1][-1][0]).total_seconds() < min_gap_share * span:
            groups[-1].append(item)
        else:
            groups.append([item])
    marks = []
    for index, group in enumerate(groups):
        if len(group) == 1:
            label = f"{group[0][1]} ({group[0][2]})"
        else:
            label = " + ".join(dict.fromkeys(a for _, a, _ in group))
        if len(label) > MARK_LABEL_CHARS:
            label = label[: MARK_LABEL_CHARS - 1] + "…"
        hover = "<br>".join(f"{at:%H:%M:%S} {action} by {actor}" for at, action, actor in group)
        marks.append(ActionMark(group[0][0], label, hover, index % MARK_LEVELS))
    return marks


def seconds_ticks(log_range: list[float], marks: tuple[float, ...] = ()) -> tuple[list[float], list[str]]:
    """Ticks for a log axis of seconds (``log_range`` in log10 units, as plotly takes it): the 1, 2, 5
    steps of every decade in range, and ``marks`` (a gate's threshold) in place of the steps beside
    them, each labelled with its unit.
    Plotly's own log ticks label 20 and 50 as "2" and "5", so a 60 s gate line sat beside a "5"."""
    # A hair of slack: 10 ** log10(0.02) comes back as 0.020000000000000004.
    low, high = 10 ** log_range[0] * (1 - 1e-9), 10 ** log_range[1] * (1 + 1e-9)
    values = {
        round(step * 10.0**decade, 12)
        for decade in range(math.floor(log_range[0]), math.ceil(log_range[1]) + 1)
        for step in (1, 2, 5)
        if low <= step * 10.0**decade <= high
    }
    shown = [m for m in marks if low <= m <= high]
    # A step within a factor 1.5 of a mark would print over it ("50 s" on "60 s"): the mark wins.
    values = {v for v in values if all(max(v, m) / min(v, m) >= 1.5 for m in shown)} | set(shown)
    ticks = sorted(values)
    return ticks, [_seconds_label(v) for v in ticks]


def _seconds_label(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s"


def space_summary(coverage: Any) -> str:
    """How well the explored pairs' spaces are known, from an ``explorer_coverage`` row: exhausted
    (space exact), proven at least their limit, or only sampled (an estimate, or not recorded)."""
    pairs = int(coverage.get("pairs", 0) or 0)
    exact = int(coverage.get("pairs_exact", 0) or 0)
    at_least = int(coverage.get("pairs_at_least", 0) or 0)
    sampled = max(pairs - exact - at_least, 0)
    return (
        f"{exact:,} of {pairs:,} pairs exhausted (space exact), {at_least:,} proven at least their limit, "
        f"{sampled:,} sampled only"
    )


__all__ = [
    "ActionMark",
    "AnswerField",
    "AuditCheck",
    "GateView",
    "Json",
    "RolloutStatus",
    "SourceInfo",
    "SqlResult",
    "action_marks",
    "answer_fields",
    "build_answer",
    "candidate_ids",
    "candidates_summary",
    "decision_field",
    "fitting_bucket",
    "fitting_window",
    "gate_threshold",
    "gate_value",
    "next_step",
    "parse_rollout_status",
    "seconds_ticks",
    "space_summary",
]
