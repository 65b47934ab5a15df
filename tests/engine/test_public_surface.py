"""engine's public surface: every name in ``engine.__all__`` resolves, lazily, to the object its module defines."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import engine


def test_every_public_name_resolves_to_its_modules_object():
    """Each exported name is the very object of the module the export table names."""
    assert sorted(engine.__all__) == sorted(engine._EXPORTS)
    for name, module in engine._EXPORTS.items():
        assert getattr(engine, name) is getattr(importlib.import_module(module), name), name


def test_importing_the_pure_core_loads_no_database_driver_or_http_stack():
    """``import engine.machine`` stays light: the exports load on first use only."""
    code = "import sys, engine.machine; print(sorted(m for m in ('aiohttp', 'duckdb', 'httpx', 'psycopg') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error():
    """A misspelt name fails like any missing attribute, naming it."""
    with pytest.raises(AttributeError, match="no_such_name"):
        engine.no_such_name  # noqa: B018


PACKAGES = ("engine", "service", "console", "rollout", "demo")
"""Finality's own packages (``refserver/`` is a separate program with exceptions of its own)."""


def _exception_classes() -> list[tuple[str, type[BaseException]]]:
    import ast
    import inspect
    from pathlib import Path

    root = Path(engine.__file__).parent.parent
    found: list[tuple[str, type[BaseException]]] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            classes = [n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]
            if not classes:
                continue
            loaded = importlib.import_module(module)
            for name in classes:
                value = getattr(loaded, name, None)
                if inspect.isclass(value) and issubclass(value, BaseException):
                    found.append((module, value))
    return found


def test_every_exception_class_is_rooted_in_the_one_tree_and_drawn_in_it():
    """Each public exception class of Finality's packages derives from EngineError and is named in engine.errors' drawing."""
    from engine import errors

    assert errors.__doc__ is not None
    classes = _exception_classes()
    assert len(classes) >= 40
    for module, cls in classes:
        if cls.__name__.startswith("_"):
            continue  # private control flow inside one module, never raised past it
        assert issubclass(cls, errors.EngineError), f"{module}.{cls.__name__}"
        assert cls.__name__ in errors.__doc__.split(), f"{module}.{cls.__name__} is not drawn"
        if module != "engine.errors":
            assert f"[{module}]" in errors.__doc__, f"{module}.{cls.__name__}: its module is not named"


def test_every_public_module_declares_its_names():
    """Each module of Finality's packages has an ``__all__`` (private modules, named _x, excepted)."""
    from pathlib import Path

    root = Path(engine.__file__).parent.parent
    missing = [
        str(path.relative_to(root))
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        if not path.name.startswith("_") and "__all__" not in path.read_text()
    ]
    assert missing == []
