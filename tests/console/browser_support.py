"""What the console's browser tests share: Debian's Chromium and its flags, a Streamlit console server,
a service on a seeded ledger with a diverged shadow pair, and the few page gestures that need a retry.

Not a test module: the test_browser*.py files import it (pytest puts this folder on the path).
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
from typing import IO, Any

import http_kit

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


DIVERGED_NODE = "report-diverged-7"


def add_diverged_shadow_pair(ledger: Path) -> None:
    """One diverged shadow pair between two seeded operations (the service records these as it runs;
    here the ledger has one before the service opens it, so the panel has a pair to show)."""
    from engine.ledger import duckdb_client

    with duckdb_client.connect(str(ledger)) as con:
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


@contextmanager
def shadowed_service(tmp_path: Path) -> Iterator[ServiceProcess]:
    """A service on a seeded ledger (500 operations, one diverged shadow pair) with a side-effect-free tool
    shadowed onto a second server entry of one fast 2025-11-25 reference server."""
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
    ``args`` for Streamlit; yields its URL. A probed free port that another process takes before
    Streamlit binds it (Streamlit cannot bind port 0 and say which) costs a retry on another one."""
    for attempt in range(3):
        chosen = port or free_port()
        log = log_path.open("wb")
        process = _start_streamlit(env_extra, chosen, args, log)
        url = f"http://127.0.0.1:{chosen}"

        def up(process: subprocess.Popen[bytes] = process, url: str = url) -> bool:
            if process.poll() is not None:
                return True
            try:
                return http_kit.get(f"{url}/_stcore/health", timeout=2).status_code == 200
            except http_kit.HTTPError:
                return False

        try:
            wait_until(up, timeout=60, what="streamlit to serve")
            if process.poll() is None:
                yield url
                return
        finally:
            _stop(process)
            log.close()
        said = log_path.read_text(errors="replace")
        if port is not None or "already in use" not in said or attempt == 2:
            raise AssertionError(f"streamlit exited with {process.returncode}:\n{said[-4000:]}")
    raise AssertionError("unreachable")


def _start_streamlit(
    env_extra: dict[str, str], port: int, args: tuple[str, ...], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.pop("FINALITY_LEDGER", None)
    env.pop("FINALITY_SERVICE_URL", None)
    env.update(
        FINALITY_CONSOLE_REFRESH_S="2",
        FINALITY_ACTOR="browser-test",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p),
        **env_extra,
    )
    return subprocess.Popen(
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


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


def epoch_of(page: object) -> int:
    metric = page.get_by_test_id("stMetric").filter(has_text="Execution epoch")  # type: ignore[attr-defined]
    text = metric.get_by_test_id("stMetricValue").inner_text(timeout=30_000)
    return int(re.sub(r"\D", "", text))


def open_dialog(page: Any, button: str, ready: Callable[[Any], Any], attempts: int = 4) -> Any:
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


def download(page: Any, button: str, attempts: int = 3) -> Any:
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


TRUNCATED_METRICS = """() => [...document.querySelectorAll('[data-testid="stMetricValue"] *, [data-testid="stMetricValue"]')]
    .filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.innerText)"""


def bundle_manifest(download: object) -> dict[str, object]:
    import zipfile

    path = download.path()  # type: ignore[attr-defined]
    with zipfile.ZipFile(path) as bundle:
        return dict(json.loads(bundle.read("manifest.json")))


# The task's retention is an approval round's deadline (the earliest moment the server may drop the
# task). The reference server scales ttl by its time_scale (0.05 here: the 60 s default becomes 3 s),
# so the rounds this test answers ask for ten real minutes, longer than the test's walk of every page.
ROUND_TTL_MS = 12_000_000  # 600 s of real time at time_scale 0.05
