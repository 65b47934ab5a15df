"""The house's shape: the engine, the library the rest composes, imports no package above it, and
no class of the product outgrows the 500-line rule."""

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


def test_no_class_of_the_product_is_over_500_lines() -> None:
    """The house rule for every package that ships (a class that grows past it is split by concern)."""
    root = ENGINE.parent
    packages = ("engine", "service", "console", "rollout", "demo", "refserver", "pages")
    over = sorted(
        f"{path.relative_to(root)}: {node.name} {node.end_lineno - node.lineno + 1} lines"
        for package in packages
        for path in (root / package).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 500
    )
    assert over == []
