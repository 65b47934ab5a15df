"""The six release gates, evaluated from raw ledger inputs against thresholds.

Pure: takes the inputs ``Ledger.gate_inputs`` read and a ``Thresholds`` value, returns verdicts that
carry their raw inputs. A gate without data fails with "no data"; it never passes silently. The
what-if in the console runs this same function with other thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.ledger.gate_sql import UNACKED_STALE_S
from engine.model import GateRecord

GATES = (
    "terminal_divergence",
    "duplicate_operations",
    "poll_amplification",
    "cancel_confirmation",
    "unknown_reconciliation",
    "traceability",
)


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_interleavings: int = 10_000
    max_divergent: int = 0
    max_duplicates: int = 0
    qps: float | None = None
    """Overrides the QPS the service recorded; None uses the recorded one."""
    cancel_p99_s: float = 60.0
    unknown_max_age_s: float = 15 * 60.0
    min_traceable_share: float = 1.0
    max_unacked_age_s: float = UNACKED_STALE_S
    """How long an outbox entry may wait for its first acknowledgement."""


@dataclass(frozen=True, slots=True)
class GateReport:
    results: list[GateRecord] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def failing(self) -> list[GateRecord]:
        return [r for r in self.results if not r.passed]


def _num(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


HOW_TO_EXPLORE = (
    "`finality serve --explore 10000` records one (`make demo` does; some minutes); "
    "without a service, `finality explore --ledger LEDGER`"
)
"""What a person does when no explorer run is recorded (the verdict and the console say it)."""


def _no_data(gate: str, threshold: float | None, inputs: dict[str, object], what: str) -> GateRecord:
    return GateRecord(gate, False, None, threshold, f"no data: {what}", inputs)


def evaluate(inputs: dict[str, dict[str, object]], thresholds: Thresholds = Thresholds()) -> GateReport:
    """Verdicts for all six gates."""
    out: list[GateRecord] = []

    d = inputs["terminal_divergence"]
    explored = _num(d["interleavings"]) or 0.0
    divergent = _num(d["divergent"]) or 0.0
    if not d["explorer_runs"]:
        out.append(_no_data("terminal_divergence", 0, d, f"no shipped-code explorer run; {HOW_TO_EXPLORE}"))
    elif explored < thresholds.min_interleavings:
        out.append(
            GateRecord(
                "terminal_divergence",
                False,
                divergent,
                thresholds.max_divergent,
                f"only {explored:.0f} of {thresholds.min_interleavings} interleavings explored",
                d,
            )
        )
    else:
        ok = divergent <= thresholds.max_divergent
        out.append(
            GateRecord(
                "terminal_divergence",
                ok,
                divergent,
                thresholds.max_divergent,
                f"{divergent:.0f} divergent of {explored:.0f} interleavings",
                d,
            )
        )

    d = inputs["duplicate_operations"]
    if not d["operations"]:
        out.append(_no_data("duplicate_operations", thresholds.max_duplicates, d, "no operations"))
    else:
        dup = _num(d["operations_with_second_server_task"]) or 0.0
        out.append(
            GateRecord(
                "duplicate_operations",
                dup <= thresholds.max_duplicates,
                dup,
                thresholds.max_duplicates,
                f"{dup:.0f} operations created a second server-side operation",
                d,
            )
        )

    d = inputs["poll_amplification"]
    cap = thresholds.qps if thresholds.qps is not None else _num(d["configured_qps"])
    if not d["requests"]:
        out.append(_no_data("poll_amplification", cap, d, "no protocol requests recorded"))
    elif cap is None:
        out.append(_no_data("poll_amplification", None, d, "no configured QPS recorded"))
    else:
        busiest = _num(d["busiest_1s_window"]) or 0.0
        out.append(
            GateRecord(
                "poll_amplification",
                busiest <= cap,
                busiest,
                cap,
                f"busiest 1 s window {busiest:.0f} requests, cap {cap:g}",
                d,
            )
        )

    d = inputs["cancel_confirmation"]
    p99 = _num(d["p99_s"])
    pending_age = _num(d["oldest_pending_s"]) or 0.0
    if not d["confirmed"] and not d["pending"]:
        out.append(_no_data("cancel_confirmation", thresholds.cancel_p99_s, d, "no cancels"))
    else:
        worst = max(p99 or 0.0, pending_age)
        ok = worst < thresholds.cancel_p99_s
        verdict = f"p99 {p99:.2f} s" if p99 is not None else "no confirmed cancel yet"
        if pending_age:
            verdict += f"; oldest unconfirmed {pending_age:.1f} s"
        out.append(GateRecord("cancel_confirmation", ok, worst, thresholds.cancel_p99_s, verdict, d))

    d = inputs["unknown_reconciliation"]
    if not d["operations"]:
        out.append(_no_data("unknown_reconciliation", thresholds.unknown_max_age_s, d, "no operations"))
    else:
        oldest = _num(d["oldest_open_s"]) or 0.0
        slowest = _num(d["slowest_resolution_s"]) or 0.0
        worst = max(oldest, slowest)
        out.append(
            GateRecord(
                "unknown_reconciliation",
                worst <= thresholds.unknown_max_age_s,
                worst,
                thresholds.unknown_max_age_s,
                f"{d['open']} open, oldest {oldest / 60:.1f} min; slowest resolution {slowest / 60:.1f} min",
                d,
            )
        )

    d = inputs["traceability"]
    advances = _num(d["advances"]) or 0.0
    refused = _num(d["refused_acks"]) or 0.0
    if not advances and not refused:
        what = "no downstream consumer has acknowledged an outbox entry"
        if _num(d["outbox_rows"]):
            what += f" ({d['outbox_rows']} entries ready)"
        out.append(_no_data("traceability", thresholds.min_traceable_share, d, what))
    else:
        # Every claimed advance: the acknowledgements recorded and the ones refused (they claim
        # an advance that no receipt backs). Traced: recorded ones that join a matching receipt.
        claimed = advances + refused
        share = (advances - (_num(d["untraceable"]) or 0.0)) / claimed
        oldest = _num(d["oldest_unacknowledged_s"]) or 0.0
        ok = share >= thresholds.min_traceable_share and oldest <= thresholds.max_unacked_age_s
        verdict = f"{share:.2%} of {claimed:.0f} downstream advances trace to a terminal receipt"
        if refused:
            verdict += f" ({refused:.0f} acknowledgements refused)"
        if d["unacknowledged"]:
            verdict += (
                f"; {d['unacknowledged']} entries unacknowledged, oldest {oldest:.0f} s"
                f" ({d['stale_unacknowledged']} older than {UNACKED_STALE_S:.0f} s)"
            )
            if oldest > thresholds.max_unacked_age_s:
                verdict += f", over the {thresholds.max_unacked_age_s:.0f} s limit"
        out.append(GateRecord("traceability", ok, share, thresholds.min_traceable_share, verdict, d))
    return GateReport(out)


# How each gate's value and threshold read to a person (one formatter for the console and the CLI).
def _count(noun: str) -> Any:
    return lambda v: f"{v:.0f} {noun}"


_GATE_FORMATS: dict[str, tuple[Any, str]] = {
    "terminal_divergence": (_count("divergent"), "≤"),
    "duplicate_operations": (_count("duplicated"), "≤"),
    "poll_amplification": (lambda v: f"{v:.0f} req/s", "≤"),
    "cancel_confirmation": (lambda v: f"{v:.1f} s" if v < 100 else f"{v:.0f} s", "<"),
    "unknown_reconciliation": (lambda v: f"{v / 60:.1f} min", "≤"),
    "traceability": (lambda v: f"{v:.1%}", "≥"),
}


def gate_value(gate: str, value: float | None) -> str:
    """A gate's value with its unit at a readable precision (``12.4 s``, ``3.2 min``, ``99.8%``); ``—`` for none."""
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    fmt = _GATE_FORMATS.get(gate)
    return fmt[0](float(value)) if fmt else f"{float(value):g}"


def gate_threshold(gate: str, threshold: float | None) -> str:
    """The passing side of a gate's threshold with its unit (``< 60.0 s``, ``≤ 15.0 min``)."""
    if threshold is None:
        return "—"
    fmt = _GATE_FORMATS.get(gate)
    return f"{fmt[1]} {gate_value(gate, threshold)}" if fmt else f"{float(threshold):g}"


__all__ = [
    "GATES",
    "HOW_TO_EXPLORE",
    "GateReport",
    "Thresholds",
    "evaluate",
    "gate_threshold",
    "gate_value",
]
