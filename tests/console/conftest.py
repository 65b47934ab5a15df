"""Console fixtures: one seeded ledger per session, and an AppTest of app.py reading it read-only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from demo.seed import seed_ledger

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app.py"


@pytest.fixture(scope="session")
def seeded_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("console") / "seeded.duckdb"
    seed_ledger(path, operations=3000, seed=7)
    return path


@pytest.fixture
def console(seeded_ledger: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], AppTest]:
    """Open a page of the console on the seeded ledger (no service: read-only file mode)."""
    monkeypatch.delenv("FINALITY_SERVICE_URL", raising=False)
    monkeypatch.setenv("FINALITY_LEDGER", str(seeded_ledger))
    monkeypatch.setenv("FINALITY_ACTOR", "tester")

    def open_page(page: str) -> AppTest:
        """The page opened first, as by its URL (each page's URL path is its file's name)."""
        at = AppTest.from_file(str(APP), default_timeout=30)
        if page != "pages/overview.py":
            at.switch_page(page)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return open_page
