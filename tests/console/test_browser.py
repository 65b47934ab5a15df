"""One real Chromium run: open the console on a running service, roll back with a typed reason, see the epoch raised.

Uses Debian's chromium (scripts/install-browser.sh) driven by the playwright package; no browser
is downloaded. Skips only when chromium (or playwright) is absent. Saves a screenshot under
test-artifacts/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo.seed import seed_ledger
from refserver.testing import RefServer
from service.testing import ServiceProcess, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="chromium is absent (scripts/install-browser.sh installs Debian's chromium)"
)


DIVERGED_NODE = "report-diverged-7"


def add_diverged_shadow_pair(ledger: Path) -> None:
    """One diverged shadow pair between two seeded operations (the service records these as it runs;
    here the ledger has one before the service opens it, so the panel has a pair to show)."""
    import duckdb

    with duckdb.connect(str(ledger)) as con:
        (old, new) = (
            r[0]
            for r in con.execute(
                "SELECT operation_id FROM op_identity ORDER BY operation_id LIMIT 2"
            ).fetchall()
        )
        con.execute("UPDATE op_identity SET call_node_id = ? WHERE operation_id = ?", [DIVERGED_NODE, old])
        con.execute(
            "UPDATE op_identity SET call_node_id = ? WHERE operation_id = ?", [DIVERGED_NODE + "#shadow", new]
        )
        con.execute(
            "INSERT INTO shadow_diffs VALUES (?, ?, ?, 'generate_report', 'completed', 'failed', 'sha256:aa', "
            "'sha256:bb', NULL, NULL, 1200.0, 3400.0, 3, 5, TRUE, 'status differs', now())",
            [old, new, DIVERGED_NODE],
        )


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    ledger = tmp_path / "browser.duckdb"
    seed_ledger(ledger, operations=500, seed=3)
    add_diverged_shadow_pair(ledger)
    with RefServer("mcp-2025-11-25", time_scale=0.05) as server:
        config = tmp_path / "finality.toml"
        config.write_text(
            f'global_qps = 100\nrollout_salt = "browser"\n\n[servers.mcp]\nurl = "{server.endpoint}"\n'
            'protocol = "mcp-2025-11-25"\n\n[servers.mcp_new]\nurl = "' + server.endpoint + '"\n'
            'protocol = "mcp-2025-11-25"\n\n[tools.generate_report]\nserver = "mcp"\nside_effect_free = true\n'
            'shadow_server = "mcp_new"\n'
        )
        with ServiceProcess(ledger, config) as svc:
            yield svc


@contextmanager
def streamlit_console(
    env_extra: dict[str, str], log_path: Path, *, port: int | None = None, args: tuple[str, ...] = ()
) -> Iterator[str]:
    """``streamlit run app.py`` on ``port`` (a free one if None; a new server process) with more
    ``args`` for Streamlit; yields its URL."""
    port = port or free_port()
    env = dict(os.environ)
    env.pop("FINALITY_LEDGER", None)
    env.pop("FINALITY_SERVICE_URL", None)
    env.update(
        FINALITY_CONSOLE_REFRESH_S="2",
        FINALITY_ACTOR="browser-test",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        **env_extra,
    )
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "app.py"),
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
            "--server.fileWatcherType",
            "none",
            "--browser.gatherUsageStats",
            "false",
            *args,
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, timeout=60, what="streamlit to serve")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


@pytest.fixture
def console(service: ServiceProcess, tmp_path: Path) -> Iterator[str]:
    with streamlit_console({"FINALITY_SERVICE_URL": service.url}, tmp_path / "streamlit.log") as url:
        yield url


def _epoch(page: object) -> int:
    metric = page.get_by_test_id("stMetric").filter(has_text="Execution epoch")  # type: ignore[attr-defined]
    text = metric.get_by_test_id("stMetricValue").inner_text(timeout=30_000)
    return int(re.sub(r"\D", "", text))


def test_rollback_from_the_browser_raises_the_epoch(console: str, service: ServiceProcess) -> None:
    """Rollout control at stage off; a shadow started elsewhere enables Roll back… by the page's own
    refresh; Roll back… -> type a reason -> Roll back now: the page shows the epoch raised."""
    sync_api = pytest.importorskip("playwright.sync_api")
    status = httpx.get(f"{service.url}/api/v1/rollout/status", timeout=30)
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
            before = _epoch(page)
            dialog = _open_dialog(page, "Roll back…", lambda d: d.get_by_label("Reason (required, typed)"))
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
    after = httpx.get(f"{service.url}/api/v1/rollout/status", timeout=30).json()
    assert after["epoch"] == before + 1


def _open_dialog(page: Any, button: str, ready: Callable[[Any], Any], attempts: int = 4) -> Any:
    """Click ``button`` until its dialog shows ``ready`` (bounded): a click that lands while the app
    is still in a full rerun opens a dialog that the rerun's end closes again (Streamlit drops dialogs
    left over from an earlier run), so a person, and this test, clicks once more."""
    dialog = page.get_by_role("dialog")
    for attempt in range(attempts):
        page.get_by_role("button", name=button).click(timeout=90_000)
        try:
            ready(dialog).wait_for(timeout=15_000)
            return dialog
        except Exception:
            if attempt == attempts - 1:
                raise
            page.keyboard.press("Escape")  # close a half-open dialog before clicking again
    return dialog


def _download(page: Any, button: str, attempts: int = 3) -> Any:
    """Click ``button`` until a download starts (bounded): a click that lands while the page is still
    in the rerun its last input started goes to a button that rerun replaces, and nothing comes."""
    for attempt in range(attempts):
        try:
            with page.expect_download(timeout=60_000) as info:
                page.get_by_role("button", name=button).click(timeout=90_000)
            return info.value
        except Exception:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# Each page's URL (its file's name) and the heading it draws. The overview is the default page, at "/".
PAGE_URLS = {
    "": "Overview",
    "cancel_latency": "Cancel latency",
    "reconciliation": "UNKNOWN and reconciliation",
    "gate_compliance": "Gate compliance",
    "operations": "Operations",
    "approvals": "Approvals",
    "rollout_control": "Rollout control",
    "sql": "SQL",
    "evidence_bundle": "Evidence bundle",
}


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


TRUNCATED_METRICS = """() => [...document.querySelectorAll('[data-testid="stMetricValue"] *, [data-testid="stMetricValue"]')]
    .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)"""


def _bundle_manifest(download: object) -> dict[str, object]:
    import zipfile

    path = download.path()  # type: ignore[attr-defined]
    with zipfile.ZipFile(path) as bundle:
        return dict(json.loads(bundle.read("manifest.json")))


# The task's retention is an approval round's deadline (the earliest moment the server may drop the
# task). The reference server scales ttl by its time_scale (0.05 here: the 60 s default becomes 3 s),
# so the rounds this test answers ask for ten real minutes, longer than the test's walk of every page.
ROUND_TTL_MS = 12_000_000  # 600 s of real time at time_scale 0.05


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
            epoch = _epoch(page)
            dialog = _open_dialog(page, "Roll back…", lambda d: d.get_by_text("Acting as"))
            dialog.get_by_text(f"Execution epoch {epoch} → {epoch + 1}").wait_for(timeout=30_000)
            dialog.get_by_text("Acting as").wait_for(timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "console-1440-rollback-dialog.png"), full_page=True)

            shot = "evidence"
            page.goto(f"{console}/evidence_bundle", timeout=60_000)
            decision = page.get_by_label("Decision this evidence is for")
            decision.fill("promote canary 5 % -> 25 %")
            decision.press("Enter")
            page.wait_for_timeout(1500)
            manifest = _bundle_manifest(_download(page, "Download evidence bundle (zip)"))
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


# ------------------------------------------------------------------------------ who may act (issue 20)

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
