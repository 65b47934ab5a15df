"""The console's data layer is split by concern behind one facade (issue 16: no class over 500 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

from console.core import InsightsCore
from console.gate_reads import GateReads
from console.insights import Insights
from console.operation_reads import OperationReads
from console.rollout_reads import RolloutReads

PACKAGE = Path(__file__).resolve().parents[2] / "console"


def test_no_class_of_the_console_is_over_500_lines() -> None:
    """Every class in console/ (the Insights facade and each concern) is at most 500 lines."""
    sizes = {
        f"{path.name}:{node.name}": (node.end_lineno or node.lineno) - node.lineno + 1
        for path in sorted(PACKAGE.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    assert "insights.py:Insights" in sizes, sizes
    assert max(sizes.values()) <= 500, sizes


def test_the_pages_facade_is_every_concern_over_one_core() -> None:
    """Pages read through Insights alone; it is the gates, operations and rollout reads over one core."""
    assert issubclass(Insights, GateReads)
    assert issubclass(Insights, OperationReads)
    assert issubclass(Insights, RolloutReads)
    for concern in (GateReads, OperationReads, RolloutReads):
        assert issubclass(concern, InsightsCore)
    assert Insights.gates is GateReads.gates
    assert Insights.operations is OperationReads.operations
