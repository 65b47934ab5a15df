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
    code = "import sys, engine.machine; print(sorted(m for m in ('duckdb', 'httpx', 'psycopg') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_an_unknown_name_is_an_attribute_error():
    """A misspelt name fails like any missing attribute, naming it."""
    with pytest.raises(AttributeError, match="no_such_name"):
        engine.no_such_name  # noqa: B018
