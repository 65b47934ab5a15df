"""The engine is the library the rest composes: no module of it imports a package above it."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "engine"
ABOVE = ("service", "console", "rollout", "demo", "pages", "app", "bench", "tests")


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_engine_module_imports_a_package_that_composes_the_engine() -> None:
    """Not even lazily inside a function: the service and the console compose the engine, never the other way round."""
    upward = sorted(
        f"{path.relative_to(ENGINE.parent)} imports {name}"
        for path in ENGINE.rglob("*.py")
        for name in _imported(path)
        if name.split(".")[0] in ABOVE
    )
    assert upward == []
