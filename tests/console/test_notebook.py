"""notebooks/ledger_analysis.ipynb runs top to bottom against a generated ledger (path passed in FINALITY_LEDGER)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_analysis_notebook_executes_on_a_seeded_ledger(
    seeded_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every cell runs; the cancel-latency and UNKNOWN-age charts are produced."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("FINALITY_LEDGER", str(seeded_ledger))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    )
    notebook = nbformat.read(ROOT / "notebooks" / "ledger_analysis.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 2
