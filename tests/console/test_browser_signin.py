"""The console in real Chromium with service tokens: sign-in first, a viewer without Roll back, a release manager whose rollback records them.

Uses Debian's chromium (scripts/install-browser.sh) driven by the playwright package; no browser is
downloaded. Skips only when chromium (or playwright) is absent. Screenshots go under test-artifacts/.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import ARTIFACTS, CHROMIUM, FLAGS, streamlit_console

from demo.seed import seed_ledger
from refserver.testing import RefServer
from service.testing import ServiceProcess

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="chromium is absent (scripts/install-browser.sh installs Debian's chromium)"
)


SIGN_IN_TOKENS = {
    "console-reads-token": ("console-reader", ["analyst"]),
    "viewer-browser-token": ("vera-viewer", ["viewer"]),
    "manager-browser-token": ("mona-manager", ["release-manager"]),
}


@pytest.fixture
def signed_service(tmp_path: Path) -> Iterator[ServiceProcess]:
    """A service with an [auth] table: the console's own token (analyst), a viewer's and a release manager's."""
    from service.auth import token_hash

    ledger = tmp_path / "signed.duckdb"
    seed_ledger(ledger, operations=200, seed=4)
    auth = ["[auth]"]
    for secret, (principal, roles) in SIGN_IN_TOKENS.items():
        auth += [
            f"[auth.tokens.{principal}]",
            f'sha256 = "{token_hash(secret)}"',
            f'principal = "{principal}"',
            f"roles = {json.dumps(roles)}",
        ]
    with RefServer("mcp-2025-11-25", time_scale=0.05) as server:
        config = tmp_path / "finality.toml"
        config.write_text(
            f'global_qps = 100\nrollout_salt = "signed"\n\n[servers.mcp]\nurl = "{server.endpoint}"\n'
            'protocol = "mcp-2025-11-25"\n\n[servers.mcp_new]\nurl = "' + server.endpoint + '"\n'
            'protocol = "mcp-2025-11-25"\n\n[tools.generate_report]\nserver = "mcp"\nside_effect_free = true\n'
            'shadow_server = "mcp_new"\n\n' + "\n".join(auth) + "\n"
        )
        with ServiceProcess(ledger, config, startup_timeout=120) as svc:
            yield svc


def _sign_in(page: object, console: str, token: str) -> None:
    page.goto(f"{console}/rollout_control", timeout=60_000)  # type: ignore[attr-defined]
    page.get_by_role("heading", name="Sign in to the Finality console").wait_for(timeout=60_000)  # type: ignore[attr-defined]
    page.get_by_label("Token").fill(token)  # type: ignore[attr-defined]
    page.get_by_role("button", name="Sign in").click()  # type: ignore[attr-defined]
    page.get_by_role("heading", name="Rollout control").wait_for(timeout=60_000)  # type: ignore[attr-defined]


def test_the_console_signs_in_a_viewer_without_rollback_and_a_release_manager_whose_rollback_records_them(
    signed_service: ServiceProcess, tmp_path: Path
) -> None:
    """With tokens configured the console asks for one first; a viewer sees no Roll back control; a release
    manager's dialog names them and their rollback is recorded under their principal, not a typed name."""
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    with signed_service.client(token="manager-browser-token") as manager:
        manager.rollout("shadow", {"reason": "something to roll back"})
    env = {"FINALITY_SERVICE_URL": signed_service.url, "FINALITY_TOKEN": "console-reads-token"}
    with (
        streamlit_console(env, tmp_path / "streamlit.log") as console,
        sync_api.sync_playwright() as p,
    ):
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        shot = "sign-in"
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(console, timeout=60_000)
            page.get_by_role("heading", name="Sign in to the Finality console").wait_for(timeout=60_000)
            assert page.get_by_role("heading", name="Overview").count() == 0
            page.get_by_label("Token").fill("not-a-token")
            page.get_by_role("button", name="Sign in").click()
            page.get_by_text("Sign-in refused").wait_for(timeout=60_000)
            page.close()

            shot = "viewer"
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _sign_in(page, console, "viewer-browser-token")
            page.get_by_text("Signed in as vera-viewer").wait_for(timeout=30_000)
            page.get_by_text("needs the role release-manager").wait_for(timeout=60_000)
            page.get_by_role("heading", name="Audit log").wait_for(timeout=60_000)
            assert page.get_by_role("button", name="Roll back…").count() == 0
            assert page.get_by_role("button", name="Promote").count() == 0
            page.screenshot(path=str(ARTIFACTS / "console-signed-in-viewer.png"), full_page=True)
            page.close()

            shot = "release-manager"
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            _sign_in(page, console, "manager-browser-token")
            page.get_by_role("button", name="Roll back…").click(timeout=90_000)
            dialog = page.get_by_role("dialog")
            dialog.get_by_text("Acting as mona-manager").wait_for(timeout=30_000)
            reason = dialog.get_by_label("Reason (required, typed)")
            reason.fill("signed-in rollback in the browser test")
            reason.press("Enter")
            confirm = dialog.get_by_role("button", name="Roll back now")
            sync_api.expect(confirm).to_be_enabled(timeout=30_000)
            confirm.click()
            page.get_by_text("rollback recorded").wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "console-signed-in-rollback.png"), full_page=True)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / f"console-signed-{shot}-failed.png"), full_page=True)
            (ARTIFACTS / f"console-signed-{shot}-failed.txt").write_text(page.inner_text("body"))
            raise
        finally:
            browser.close()
    with signed_service.client(token="viewer-browser-token") as viewer:
        newest = viewer.rollout_events(limit=1)[0]
        refused = viewer.denials(limit=50)
    assert newest["action"] == "rollback"
    assert newest["actor"] == "mona-manager"
    assert any(d["status"] == 401 and d["path"] == "/api/v1/whoami" for d in refused)
