"""The one shape every benchmark reports in, so `make bench` can gather them into bench/results/latest.md.

A benchmark run with ``--json`` prints exactly one JSON object on its last stdout line::

    {"benchmark": "ledger_commit", "command": "python bench/ledger_commit.py --runs 5",
     "figures": [{"name": "group commit", "unit": "transitions/s", "runs": [..],
                  "median": .., "min": .., "max": .., "baseline": "per-transition commit"}],
     "notes": ["..."]}

Each figure carries every run's value; ``median``/``min``/``max`` are computed here, never typed in.
``baseline`` names the figure in the same report it is compared against (measured in the same run).
This module only shapes numbers; it measures nothing and must not import the engine.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    runs: tuple[float, ...]
    baseline: str | None = None
    better: str = "higher"  # or "lower": which direction is an improvement

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError(f"figure {self.name!r} has no runs")

    @property
    def median(self) -> float:
        return float(statistics.median(self.runs))

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "unit": self.unit,
            "runs": list(self.runs),
            "median": self.median,
            "min": min(self.runs),
            "max": max(self.runs),
            "baseline": self.baseline,
            "better": self.better,
        }


@dataclass
class Report:
    benchmark: str
    command: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(
        self,
        name: str,
        unit: str,
        runs: Sequence[float],
        *,
        baseline: str | None = None,
        better: str = "higher",
    ) -> Figure:
        figure = Figure(name, unit, tuple(float(r) for r in runs), baseline, better)
        self.figures.append(figure)
        return figure

    def as_dict(self) -> dict[str, object]:
        return {
            "benchmark": self.benchmark,
            "command": self.command,
            "figures": [f.as_dict() for f in self.figures],
            "notes": list(self.notes),
        }

    def emit(self) -> None:
        """Print the report as the last stdout line (what the `make bench` harness reads)."""
        print(json.dumps(self.as_dict(), sort_keys=True), flush=True)
