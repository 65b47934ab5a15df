"""The console in real Chromium at 1440x900: a person walks every page, answers an approval, reads the charts and the shadow panel, opens the rollback dialog and downloads the evidence.

Uses Debian's chromium (scripts/install-browser.sh) driven by the playwright package; no browser is
downloaded. Skips only when chromium (or playwright) is absent. Screenshots go under test-artifacts/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import (
    ARTIFACTS,
    CHROMIUM,
    DIVERGED_NODE,
    FLAGS,
    PAGE_URLS,
    ROUND_TTL_MS,
    TRUNCATED_METRICS,
    bundle_manifest,
    download,
    epoch_of,
    open_dialog,
    shadowed_service,
    streamlit_console,
)

from service.testing import ServiceProcess, wait_until

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


def test_a_person_answers_sees_and_acts_on_every_page_at_1440x900(
    console: str, service: ServiceProcess
) -> None:
    """Approve makes the round disappear (recorded with the actor); the cancel chart draws points; the
    shadow panel lists the diverged pair; the rollback dialog names the epoch change; the evidence
    bundle keeps decision and actor; no page shows a truncated metric. Screenshots of each page."""
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    with service.client() as client:
        client.rollout("shadow", {"actor": "browser-test", "reason": "shadow before the dialog"})
        client.submit(
            call_node="browser-approval",
            tool="generate_report",
            arguments={"_sim": {"input_rounds": 1, "duration_ms": 2000, "ttl_ms": ROUND_TTL_MS}},
        )
        client.submit(
            call_node="browser-approval-elsewhere",
            tool="generate_report",
            arguments={"_sim": {"input_rounds": 1, "duration_ms": 2000, "ttl_ms": ROUND_TTL_MS}},
        )
        for node in ("browser-approval", "browser-approval-elsewhere"):
            wait_until(
                lambda node=node: client.show(node)["state"] == "INPUT_REQUIRED",
                timeout=60,
                what=f"{node} to ask for input",
            )
        operation_id = str(client.show("browser-approval")["operation_id"])
        elsewhere_id = str(client.show("browser-approval-elsewhere")["operation_id"])
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900}, accept_downloads=True)
        shot = "start"
        try:
            for path, heading in PAGE_URLS.items():
                shot = path or "overview"
                page.goto(f"{console}/{path}", timeout=60_000)
                page.get_by_role("heading", name=heading, exact=True).wait_for(timeout=60_000)
                page.wait_for_timeout(2500)  # let the live fragments draw (a page settles, not a test wait)
                assert page.get_by_test_id("stException").count() == 0, path
                assert page.evaluate(TRUNCATED_METRICS) == [], path
                page.screenshot(path=str(ARTIFACTS / f"console-1440-{shot}.png"), full_page=True)

            shot = "approvals-action"
            page.goto(f"{console}/approvals", timeout=60_000)
            card = page.locator(f".st-key-approval-{operation_id}-1")
            elsewhere = page.locator(f".st-key-approval-{elsewhere_id}-1")
            elsewhere.wait_for(timeout=60_000)
            card.get_by_role("button", name="Approve").click(timeout=60_000)
            page.get_by_text("browser-approval round 1 answered as browser-test").wait_for(timeout=60_000)
            # Gone from the page, not merely answered: the card (found by its round's key) is not drawn.
            sync_api.expect(card).to_have_count(0, timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "console-1440-approved.png"), full_page=True)
            # A round answered elsewhere (here through the API) leaves the open page at its next refresh.
            sync_api.expect(elsewhere).to_have_count(1)
            with service.client() as client:
                client.answer(elsewhere_id, 1, actor="someone-else", answer={"approve": False})
            sync_api.expect(elsewhere).to_have_count(0, timeout=30_000)
            sync_api.expect(page.get_by_text("call node browser-approval")).to_have_count(0)

            shot = "cancel-chart"
            page.goto(f"{console}/cancel_latency", timeout=60_000)
            chart = page.locator(".js-plotly-plot").first
            chart.wait_for(timeout=60_000)
            assert chart.locator(".scatterlayer .trace").count() >= 1
            assert chart.locator(".scatterlayer path.point").count() >= 1

            shot = "shadow-panel"
            page.goto(f"{console}/rollout_control", timeout=60_000)
            page.get_by_role("heading", name="Shadow and canary").wait_for(timeout=60_000)
            page.get_by_text("Diverged pairs").wait_for(timeout=60_000)
            page.get_by_role("link", name=f"{DIVERGED_NODE} (old path)").wait_for(timeout=30_000)
            page.get_by_role("link", name=f"{DIVERGED_NODE}#shadow (new path)").wait_for(timeout=30_000)
            epoch = epoch_of(page)
            dialog = open_dialog(page, "Roll back…", lambda d: d.get_by_text("Acting as"))
            dialog.get_by_text(f"Execution epoch {epoch} → {epoch + 1}").wait_for(timeout=30_000)
            dialog.get_by_text("Acting as").wait_for(timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "console-1440-rollback-dialog.png"), full_page=True)

            shot = "evidence"
            page.goto(f"{console}/evidence_bundle", timeout=60_000)
            decision = page.get_by_label("Decision this evidence is for")
            decision.fill("promote canary 5 % -> 25 %")
            decision.press("Enter")
            page.wait_for_timeout(1500)
            manifest = bundle_manifest(download(page, "Download evidence bundle (zip)"))
            assert manifest["decision"] == "promote canary 5 % -> 25 %"
            assert manifest["actor"] == "browser-test"
        except Exception:
            page.screenshot(path=str(ARTIFACTS / f"console-1440-{shot}-failed.png"), full_page=True)
            (ARTIFACTS / f"console-1440-{shot}-failed.txt").write_text(page.inner_text("body"))
            raise
        finally:
            browser.close()
    with service.client() as client:
        rows = client.sql(
            f"SELECT status, actor, answer FROM approvals WHERE operation_id = '{operation_id}'"
        )["rows"]
    assert rows
    assert rows[0][0] == "answered"
    assert rows[0][1] == "browser-test"
    assert json.loads(rows[0][2]) == {"approve": True}
