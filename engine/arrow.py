"""pyarrow without its pandas probe: for processes that never hold a pandas object (the service, the CLI).

pyarrow's first ``pa.array`` (or ``pa.table``, ``Table.from_pylist``) asks whether its argument is a
pandas object, and to know that it imports pandas: 0.4-0.7 CPU-s in every ``finality serve`` start
(a restart after a crash included) and every ``finality`` command, for a library they never use.
``skip_pandas_probe`` lets pyarrow record once that pandas is absent, so its conversions skip the
question. Conversions *to* pandas (``Table.to_pandas``) still import it when asked: pyarrow retries
its import there. Must not be called in a process that hands pandas objects to pyarrow (the console,
notebooks, Streamlit pages): pyarrow would no longer recognise a ``Series`` as an array.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

import pyarrow as pa


class _PandasAbsent:
    """A meta path finder that refuses pandas: its import fails at once (not a None in
    ``sys.modules``, which pyarrow's compiled import would take for the module)."""

    @staticmethod
    def find_spec(
        name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError(f"{name} is not loaded in this process (engine.arrow)")
        return None


def skip_pandas_probe() -> None:
    """Make pyarrow's one pandas probe answer "absent" without importing pandas (a no-op if pandas
    is already loaded; a second call costs one two-element conversion)."""
    if "pandas" in sys.modules:
        return
    finder = _PandasAbsent()
    sys.meta_path.insert(0, finder)
    try:
        # The probe: pyarrow (its Python shim, and its C++ sequence converter) tries the import once.
        pa.array([0, None])
    finally:
        sys.meta_path.remove(finder)


__all__ = ["skip_pandas_probe"]
