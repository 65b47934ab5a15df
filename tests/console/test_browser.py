"""The console in real Chromium: a rollback with a typed reason raises the epoch; every page URL works opened first.

Uses Debian's chromium (scripts/install-browser.sh) driven by the playwright package; no browser is
downloaded. Skips only when chromium (or playwright) is absent. Screenshots go under test-artifacts/.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import http_kit
import pytest
from browser_support import (
    ARTIFACTS,
    CHROMIUM,
    FLAGS,
    PAGE_URLS,
    epoch_of,
    open_dialog,
    shadowed_service,
    streamlit_console,
)

from demo.seed import seed_ledger
from service.testing import ServiceProcess

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="chromium is absent (scripts/install-browser.sh installs Debian's chromium)"
)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    with shadowed_service(tmp_path) as svc:
        yield svc


@pytest.fixture
def console(service: ServiceProcess, tmp_path: Path) -> Iterator[str]:
    with streamlit_console({"FINALITY_SERVICE_URL": service.url}, tmp_path / "streamlit.log") as url:
        yield url


def test_rollback_from_the_browser_raises_the_epoch(console: str, service: ServiceProcess) -> None:
    """Rollout control at stage off; a shadow started elsewhere enables Roll back… by the page's own
    refresh; Roll back… -> type a reason -> Roll back now: the page shows the epoch raised."""
    sync_api = pytest.importorskip("playwright.sync_api")
    status = http_kit.get(f"{service.url}/api/v1/rollout/status", timeout=30)
    if status.status_code == 404:
        pytest.skip("this service has no rollout routes yet")
    assert status.json()["stage"] == "off"
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # Start at the app (it builds the navigation), then follow the sidebar link.
            page.goto(console, timeout=60_000)
            page.get_by_role("heading", name="Overview").wait_for(timeout=60_000)
            page.get_by_role("link", name="Rollout control").click()
            page.get_by_role("heading", name="Rollout control").wait_for(timeout=60_000)
            page.get_by_text("Nothing to roll back at stage off").wait_for(timeout=60_000)
            rollback = page.get_by_role("button", name="Roll back…")
            sync_api.expect(rollback).to_be_disabled(timeout=30_000)
            # Something to roll back, started by someone else: the open page follows without a click.
            with service.client() as client:
                client.rollout(
                    "shadow", {"actor": "browser-test", "reason": "start shadowing before the rollback"}
                )
            sync_api.expect(rollback).to_be_enabled(timeout=60_000)
            before = epoch_of(page)
            dialog = open_dialog(page, "Roll back…", lambda d: d.get_by_label("Reason (required, typed)"))
            reason = dialog.get_by_label("Reason (required, typed)")
            reason.fill("canary p99 regression seen in the browser test")
            reason.press("Enter")
            confirm = dialog.get_by_role("button", name="Roll back now")
            sync_api.expect(confirm).to_be_enabled(timeout=30_000)
            confirm.click()
            page.get_by_text("rollback recorded").wait_for(timeout=60_000)
            sync_api.expect(
                page.get_by_test_id("stMetric")
                .filter(has_text="Execution epoch")
                .get_by_test_id("stMetricValue")
            ).to_have_text(str(before + 1), timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "console-rollback.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "console-rollback-failed.png"), full_page=True)
            (ARTIFACTS / "console-rollback-failed.txt").write_text(page.inner_text("body"))
            raise
        finally:
            browser.close()
    after = http_kit.get(f"{service.url}/api/v1/rollout/status", timeout=30).json()
    assert after["epoch"] == before + 1


def test_every_page_url_works_when_opened_first(tmp_path: Path) -> None:
    """A fresh console server: /rollout_control opened before / draws that page in the console; so does every page URL."""
    sync_api = pytest.importorskip("playwright.sync_api")
    ledger = tmp_path / "urls.duckdb"
    seed_ledger(ledger, operations=300, seed=5)
    ARTIFACTS.mkdir(exist_ok=True)
    # Rollout control first: before any session has run app.py, Streamlit would run a page's file alone.
    order = ["rollout_control", *(p for p in PAGE_URLS if p != "rollout_control")]
    with (
        streamlit_console({"FINALITY_LEDGER": str(ledger)}, tmp_path / "streamlit.log") as url,
        sync_api.sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            for path in order:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                try:
                    page.goto(f"{url}/{path}", timeout=60_000)
                    page.get_by_role("heading", name=PAGE_URLS[path], exact=True).wait_for(timeout=60_000)
                    # Inside the console: its sidebar (drawn by app.py) and no error or traceback.
                    page.get_by_text("Your name (recorded as the actor of every action)").wait_for(
                        timeout=30_000
                    )
                    assert page.get_by_test_id("stException").count() == 0, path
                    assert "Page not found" not in page.inner_text("body"), path
                    assert page.url.split("?")[0].rstrip("/") == f"{url}/{path}".rstrip("/")
                    if path == "rollout_control":
                        page.screenshot(path=str(ARTIFACTS / "console-opened-first.png"), full_page=True)
                except Exception:
                    page.screenshot(
                        path=str(ARTIFACTS / f"console-url-{path or 'root'}-failed.png"), full_page=True
                    )
                    raise
                finally:
                    page.close()
        finally:
            browser.close()
