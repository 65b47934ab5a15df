"""The simulated tools (the same set for every protocol) and the outcomes they produce. Pure.

Outcomes are protocol-neutral values; each protocol module renders them on its own wire.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from refserver.sim import SimOutcome, SimSpec


class TaskSupport(StrEnum):
    """MCP 2025-11-25 ``execution.taskSupport``; ``FORBIDDEN`` is published by leaving the field out."""

    FORBIDDEN = "forbidden"
    OPTIONAL = "optional"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """A tool result (``isError`` results included): rendered as a CallToolResult or ToolResult."""

    text: str
    structured: Mapping[str, Any]
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ToolFailure:
    """A failure that is not a tool result: a JSON-RPC error, or ``Operation.error`` on AIP-151."""

    message: str
    reason: str


Outcome = ToolOutput | ToolFailure

OUTPUT_SCHEMA: Mapping[str, Any] = MappingProxyType(
    {
        "type": "object",
        "properties": {
            "tool": {"type": "string"},
            "echo": {"type": "object"},
            "digest": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"},
            "error": {"type": "string"},
        },
        "required": ["tool", "echo", "digest"],
    }
)

_SIM_SCHEMA = {
    "type": "object",
    "description": "Simulation controls (duration_ms, outcome, input_rounds, poll_interval_ms, "
    "ttl_ms, result_bytes, faults); see the refserver docs.",
}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    task_support: TaskSupport
    side_effecting: bool
    default_duration_ms: float
    properties: Mapping[str, Any]

    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {**self.properties, "_sim": dict(_SIM_SCHEMA)},
            "additionalProperties": True,
        }

    def output_schema(self) -> dict[str, Any]:
        return json.loads(json.dumps(dict(OUTPUT_SCHEMA)))  # type: ignore[no-any-return]


CATALOG: Mapping[str, ToolSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            ToolSpec(
                name="generate_report",
                title="Generate report",
                description="Builds a report. Side-effect free; long-running.",
                task_support=TaskSupport.OPTIONAL,
                side_effecting=False,
                default_duration_ms=2000.0,
                properties={"report": {"type": "string"}, "period": {"type": "string"}},
            ),
            ToolSpec(
                name="analyze_upload",
                title="Analyze upload",
                description="Analyses an uploaded file. Side-effect free; must run as a task.",
                task_support=TaskSupport.REQUIRED,
                side_effecting=False,
                default_duration_ms=2000.0,
                properties={"upload_id": {"type": "string"}},
            ),
            ToolSpec(
                name="apply_batch_change",
                title="Apply batch change",
                description="Applies a batch of changes. Side-effecting: every execution is logged.",
                task_support=TaskSupport.OPTIONAL,
                side_effecting=True,
                default_duration_ms=2000.0,
                properties={"batch_id": {"type": "string"}, "changes": {"type": "array"}},
            ),
            ToolSpec(
                name="quick_lookup",
                title="Quick lookup",
                description="A short synchronous lookup; never runs as a task.",
                task_support=TaskSupport.FORBIDDEN,
                side_effecting=False,
                default_duration_ms=20.0,
                properties={"query": {"type": "string"}},
            ),
        )
    }
)


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest_of(value: object) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value).encode()).hexdigest()


def _pad(text: str, result_bytes: int | None) -> str:
    if result_bytes is None:
        return text
    size = len(text.encode())
    return text + "." * (result_bytes - size) if size < result_bytes else text


def planned_outcome(tool: str, echo: Mapping[str, Any], sim: SimSpec) -> Outcome:
    """What the call ends with if nothing interrupts it."""
    structured = {"tool": tool, "echo": dict(echo), "digest": digest_of({"tool": tool, "echo": echo})}
    if sim.outcome is SimOutcome.FAILED:
        return ToolFailure(message=f"simulated failure of {tool}", reason="SIMULATED_FAILURE")
    if sim.outcome is SimOutcome.IS_ERROR:
        structured["error"] = "simulated tool error"
        return ToolOutput(_pad(f"{tool} reported an error", sim.result_bytes), structured, is_error=True)
    return ToolOutput(_pad(f"{tool} finished; digest {structured['digest']}", sim.result_bytes), structured)


def declined_outcome(tool: str, echo: Mapping[str, Any], round_number: int, action: str) -> ToolOutput:
    """The result when the user declines or cancels an input round: the tool reports an error."""
    structured = {
        "tool": tool,
        "echo": dict(echo),
        "digest": digest_of({"tool": tool, "echo": echo}),
        "error": f"input round {round_number}: {action}",
    }
    return ToolOutput(
        f"{tool} stopped: input round {round_number} was answered with {action!r}", structured, True
    )


__all__ = [
    "CATALOG",
    "OUTPUT_SCHEMA",
    "Outcome",
    "TaskSupport",
    "ToolFailure",
    "ToolOutput",
    "ToolSpec",
    "canonical_json",
    "declined_outcome",
    "digest_of",
    "planned_outcome",
]
