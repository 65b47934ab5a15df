"""The console's view types and error tree: what the insights facade hands pages (gate views, rollout status, SQL results).

Values only: no I/O, no Streamlit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pandas as pd  # type: ignore[import-untyped]

from engine.model import GateRecord

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


__all__ = [
    "AuditCheck",
    "GateView",
    "Json",
    "RolloutStatus",
    "SourceInfo",
    "SqlResult",
    "parse_rollout_status",
]
