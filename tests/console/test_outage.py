"""A console whose service stops answering: each page says so in one line and keeps the rest (issue 17).

One real service for the module (a small seeded ledger). "Does not answer" is the service process
stopped with SIGSTOP: its socket still accepts connections, no request is answered, so every read
runs into the console's timeout (``FINALITY_CONSOLE_TIMEOUT_S``, 2 s here) exactly as with a hung or
overloaded service; SIGCONT resumes it. "Busy": the service has one reader worker and no queue, and a
slow query holds the worker: the console's reads get 503. The pages are run by AppTest (a whole-page
run) and once in Chromium (a live section's own refresh, where the traceback showed).
"""

from __future__ import annotations

import ast
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import streamlit as st
from browser_support import ARTIFACTS, CHROMIUM, FLAGS, streamlit_console
from streamlit.testing.v1 import AppTest

from console.insights import Insights
from demo.seed import seed_ledger
from engine.errors import ServiceRefused, ServiceUnavailable
from refserver.testing import RefServer
from service.testing import ServiceProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 2
SILENT = f"The service did not answer in {TIMEOUT_S:g} s; retrying at the next refresh"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """One reader worker, no queue, no gate runs of its own: one running read makes others a 503."""
    folder = tmp_path_factory.mktemp("outage")
    seed_ledger(folder / "ledger.duckdb", operations=300, seed=5)
    with RefServer("mcp-2025-11-25", time_scale=0.05) as server:
        config = folder / "finality.toml"
        config.write_text(
            f'global_qps = 100\nrollout_salt = "outage"\ngate_interval_s = 0\n\n[analyst]\nworkers = 1\n'
            f'queue = 0\ntimeout_s = 4\n\n[servers.mcp]\nurl = "{server.endpoint}"\n'
            'protocol = "mcp-2025-11-25"\n\n[tools.generate_report]\nserver = "mcp"\nside_effect_free = true\n'
        )
        with ServiceProcess(folder / "ledger.duckdb", config, startup_timeout=120) as svc:
            yield svc


@contextmanager
def silent(service: ServiceProcess) -> Iterator[None]:
    """The service process stopped (SIGSTOP): connections are accepted, nothing is answered."""
    assert service.pid is not None
    os.kill(service.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(service.pid, signal.SIGCONT)


Open = Callable[[str], AppTest]


@pytest.fixture
def console(service: ServiceProcess, monkeypatch: pytest.MonkeyPatch) -> Iterator[Open]:
    """AppTests of the console on the service (each page run once while it answers, to meet it)."""
    monkeypatch.delenv("FINALITY_LEDGER", raising=False)
    monkeypatch.setenv("FINALITY_SERVICE_URL", service.url)
    monkeypatch.setenv("FINALITY_ACTOR", "outage-test")
    monkeypatch.setenv("FINALITY_CONSOLE_TIMEOUT_S", str(TIMEOUT_S))
    monkeypatch.setenv("FINALITY_CONSOLE_CACHE_S", "0")  # every run reads the service
    st.cache_resource.clear()
    met: list[Insights] = []

    def open_page(page: str) -> AppTest:
        at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
        if page != "pages/overview.py":
            at.switch_page(page)
        at.run()
        met.append(at.session_state["app_insights"])
        return at

    yield open_page
    for insights in met:
        insights.close()  # its HTTP client's connections (a cleared cache does not close them)
    st.cache_resource.clear()


def _texts(at: AppTest) -> str:
    parts = [str(e.value) for kind in ("warning", "error", "info", "success") for e in getattr(at, kind)]
    parts += [str(h.value) for h in at.subheader] + [str(t.value) for t in at.title]
    return "\n".join(parts)


# A page with a live section, and what it draws below that section (kept when the section fails).
BELOW = {
    "pages/overview.py": None,
    "pages/rollout_control.py": "Actions",
    "pages/reconciliation.py": "Resolve an entry",
}


@pytest.mark.parametrize("page", sorted(BELOW))
def test_a_page_says_in_one_line_that_the_service_did_not_answer_and_keeps_the_rest(
    page: str, service: ServiceProcess, console: Open
) -> None:
    """With the service silent, the live section shows "did not answer in 2 s; retrying", no traceback,
    and what the page draws below the section is still there."""
    at = console(page)  # the console meets the service while it answers
    with silent(service):
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = _texts(at)
    assert SILENT in shown, shown
    assert "Traceback" not in shown, shown
    if BELOW[page] is not None:
        assert BELOW[page] in [h.value for h in at.subheader], shown


def test_every_page_draws_its_live_section_through_the_one_wrapper() -> None:
    """No page builds its own fragment: each refreshing section is a ``live_section`` (so each says why
    it could not read instead of showing a traceback)."""
    for path in sorted((ROOT / "pages").glob("*.py")):
        tree = ast.parse(path.read_text())
        decorators = [
            ast.unparse(d)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef)
            for d in node.decorator_list
        ]
        assert not [d for d in decorators if "fragment" in d], path.name


# Runs until the readers' time limit stops it: a cross product no plan shortens.
SLOW = "SELECT count(*) FROM range(200000) a, range(200000) b WHERE a.range + b.range < 0"


def test_a_page_says_the_service_is_too_busy_when_its_readers_are_all_taken(
    service: ServiceProcess, console: Open
) -> None:
    """While the only reader runs a slow query, the overview says the service is too busy (503) in one
    line and that it retries, with no traceback."""
    at = console("pages/overview.py")
    client = service.client()

    def hold() -> None:
        # Stopped at the readers' time limit: it only has to hold the worker meanwhile.
        with suppress(ServiceRefused, ServiceUnavailable):
            client.sql(SLOW)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        wait_until(
            lambda: holder.is_alive() and client.health()["readers"]["running"] >= 1,
            timeout=30,
            what="the slow read to hold the reader",
        )
        at.run()
    finally:
        holder.join(timeout=30)
        client.close()
    assert not at.exception, [e.value for e in at.exception]
    shown = _texts(at)
    assert "The service is too busy to answer (" in shown, shown
    assert "retrying at the next refresh" in shown, shown


@pytest.mark.skipif(not CHROMIUM.exists(), reason="chromium is absent (scripts/install-browser.sh)")
def test_a_live_sections_own_refresh_says_the_service_did_not_answer_and_recovers(
    service: ServiceProcess, tmp_path: Path
) -> None:
    """In Chromium, the overview's live section refreshing while the service is silent shows the one
    line (no traceback, the page heading kept); once the service answers again the line goes."""
    sync_api = pytest.importorskip("playwright.sync_api")
    env = {"FINALITY_SERVICE_URL": service.url, "FINALITY_CONSOLE_TIMEOUT_S": str(TIMEOUT_S)}
    ARTIFACTS.mkdir(exist_ok=True)
    with streamlit_console(env, tmp_path / "streamlit.log") as url, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        try:
            page.goto(url, timeout=60_000)
            page.get_by_role("heading", name="Overview").wait_for(timeout=60_000)
            page.get_by_role("heading", name="Gates").wait_for(timeout=60_000)
            with silent(service):
                page.get_by_text(SILENT).first.wait_for(timeout=30_000)
                assert page.get_by_test_id("stException").count() == 0
                assert page.get_by_role("heading", name="Overview").is_visible()
                page.screenshot(path=str(ARTIFACTS / "console-service-silent.png"), full_page=True)
            sync_api.expect(page.get_by_text(SILENT)).to_have_count(0, timeout=60_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "console-service-silent-failed.png"), full_page=True)
            raise
        finally:
            browser.close()
