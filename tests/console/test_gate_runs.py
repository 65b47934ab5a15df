"""The console shows the latest recorded gate run when it is current, and evaluates afresh otherwise.

File mode (no service): a run is current when nothing was written to the ledger after it. Service
mode: a run no older than the service's gate interval (plus the snapshot's slack) is current; "Re-
evaluate now" asks the service (POST /api/v1/gates), which evaluates and records a run.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import http_kit
import pytest
from streamlit.testing.v1 import AppTest

from console.insights import Insights
from console.sources import FileSource, ServiceSource
from engine.clock import SystemClock
from engine.ledger.duckdb import Ledger
from engine.ledger.gate_sql import gate_inputs_from_recorded
from engine.ledger.port import ExplorerRun
from engine.ledger.sandbox import run_query
from engine.revision import running_revision
from rollout.gates import Thresholds, evaluate, gate_threshold, gate_value
from service.client import ServiceClient

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "app.py"
Open = Callable[[str], AppTest]


@pytest.fixture
def ledger_copy(seeded_ledger: Path, tmp_path: Path) -> Path:
    """A private copy of the seeded ledger (its own path: a console of its own, nothing cached)."""
    path = tmp_path / "copy.duckdb"
    shutil.copyfile(seeded_ledger, path)
    return path


@pytest.fixture
def open_console(ledger_copy: Path, monkeypatch: pytest.MonkeyPatch) -> Open:
    monkeypatch.delenv("FINALITY_SERVICE_URL", raising=False)
    monkeypatch.setenv("FINALITY_LEDGER", str(ledger_copy))
    monkeypatch.setenv("FINALITY_ACTOR", "tester")

    def open_page(page: str) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=30)
        if page != "pages/overview.py":
            at.switch_page(page)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return open_page


def latest_run(path: Path) -> tuple[int, datetime, dict[str, dict[str, object]]]:
    rows = run_query(
        path,
        "SELECT run_id, gate, inputs, evaluated_at FROM gate_runs "
        "WHERE run_id = (SELECT max(run_id) FROM gate_runs)",
    ).rows
    inputs = gate_inputs_from_recorded({str(r[1]): r[2] for r in rows})
    at = rows[0][3]
    assert isinstance(at, datetime)
    return int(str(rows[0][0])), at.astimezone(UTC), inputs


def same_value(shown: object, gate: str, value: float | None) -> bool:
    """A gate's value as the table shows it: with its unit, through the one formatter the console and
    the CLI share ("—" for a gate without data: the seeded ledger has no explorer run of the shipped code)."""
    return shown == gate_value(gate, value)


def captions(at: AppTest) -> str:
    return "\n".join(str(c.value) for c in at.caption)


def insights_of(at: AppTest) -> Insights:
    found = at.session_state["app_insights"]
    assert isinstance(found, Insights)
    return found


def gate_table(at: AppTest) -> list[dict[str, object]]:
    """The gate table's rows, each with its "raw inputs" (drawn in a table of their own below it)."""
    gates = inputs = None
    for element in at.dataframe:
        columns = set(element.value.columns)
        if {"gate", "passes when"} <= columns:
            gates = element.value
        elif {"gate", "raw inputs"} <= columns:
            inputs = element.value
    if gates is None:
        raise AssertionError("no gate table")
    if inputs is not None:
        gates = gates.merge(inputs, on="gate", how="left")
    records: list[dict[str, object]] = gates.to_dict("records")
    return records


def test_seeded_ledger_ends_with_a_gate_run_on_its_own_data(ledger_copy: Path) -> None:
    """Its last act: the six gates evaluated on the seeded data, recorded with their raw inputs, after every write."""
    run_id, at, inputs = latest_run(ledger_copy)
    with Ledger.open(ledger_copy, read_only=True) as ledger:
        fresh = ledger.gate_inputs(at)
    assert inputs["duplicate_operations"] == fresh["duplicate_operations"]
    assert inputs["traceability"] == fresh["traceability"]
    assert inputs["poll_amplification"] == fresh["poll_amplification"]
    assert run_id == int(str(run_query(ledger_copy, "SELECT max(run_id) FROM gate_runs").rows[0][0]))


def test_overview_shows_the_recorded_run_with_its_time_and_values(
    open_console: Open, ledger_copy: Path
) -> None:
    """Nothing was written after the run: the page shows it (time, age, values) and never scans for the inputs."""
    run_id, at, inputs = latest_run(ledger_copy)
    page = open_console("pages/overview.py")
    text = captions(page)
    assert f"evaluated at {at:%H:%M:%S} UTC (" in text
    assert f"run #{run_id}; nothing written to the ledger since" in text
    rows = {str(r["gate"]): r for r in gate_table(page)}
    expected = evaluate(inputs).results
    for record in expected:
        if record.gate in (
            "duplicate_operations",
            "traceability",
            "poll_amplification",
            "terminal_divergence",
        ):
            assert same_value(rows[record.gate]["value"], record.gate, record.value)
            assert json.loads(str(rows[record.gate]["raw inputs"])) == json.loads(
                json.dumps(record.inputs, default=str, sort_keys=True)
            )
    # the UNKNOWN ages are the run's, advanced by the time since (only the clock moved)
    shown = json.loads(str(rows["unknown_reconciliation"]["raw inputs"]))
    recorded = inputs["unknown_reconciliation"]["oldest_open_s"]
    assert isinstance(recorded, float)
    assert shown["oldest_open_s"] >= recorded
    assert "gate_inputs" not in insights_of(page).last_sql  # the whole-ledger statement never ran


def test_recorded_run_aged_to_now_agrees_with_a_fresh_evaluation(ledger_copy: Path) -> None:
    """In file mode the recorded run, its ages advanced, is what a full rescan reads now."""
    insights = Insights(FileSource(ledger_copy), cache_s=0)
    recorded = insights.recorded_gates()
    assert recorded is not None
    assert recorded.run_id is not None
    fresh_inputs, _ = insights.gate_inputs()
    fresh = evaluate(fresh_inputs).results
    for mine, theirs in zip(recorded.results, fresh, strict=True):
        assert mine.gate == theirs.gate
        assert mine.passed == theirs.passed
        assert mine.value == pytest.approx(theirs.value, abs=5.0)  # seconds of clock between the two reads


@pytest.mark.parametrize("write", ["a setting changed now", "an explorer run stamped before the run"])
def test_a_write_after_the_run_makes_the_page_evaluate_afresh(
    open_console: Open, ledger_copy: Path, write: str
) -> None:
    """A later instant, or a count the run recorded that changed, and the page rescans instead."""
    run_id, at, _ = latest_run(ledger_copy)
    with Ledger.open(ledger_copy) as ledger:
        if write.startswith("a setting"):
            ledger.put_setting("note", "written after the gate run", SystemClock().now())
        else:  # stamped an hour before the run, so only the count gives it away
            earlier = at - timedelta(hours=1)
            ledger.record_explorer_run(
                ExplorerRun(
                    "late",
                    "mcp-2025-11-25",
                    1,
                    10,
                    10,
                    0,
                    True,
                    "engine",
                    None,
                    earlier,
                    earlier,
                    code="shipped",
                    revision=running_revision(),
                )
            )
    page = open_console("pages/overview.py")
    text = captions(page)
    assert "evaluated now by this console (no current recorded run)" in text
    assert f"run #{run_id}" not in text
    assert "gate_inputs" in insights_of(page).last_sql


def test_reevaluate_now_computes_afresh_in_file_mode(open_console: Open) -> None:
    """The button reads the ledger file now (read-only: nothing recorded) and the page shows that."""
    page = open_console("pages/rollout_control.py")
    assert "nothing written to the ledger since" in captions(page)
    assert "gate_inputs" not in insights_of(page).last_sql
    page.button(key="rollout_reevaluate").click().run()
    assert not page.exception
    assert "re-evaluated now by this console (read-only: not recorded)" in captions(page)
    assert "gate_inputs" in insights_of(page).last_sql
    assert any("Promotion is disabled while gates fail" in e.value for e in page.error)


def test_what_if_evaluates_the_recorded_runs_inputs(open_console: Open, ledger_copy: Path) -> None:
    """Other thresholds re-evaluate the stored raw inputs of the shown run; the ledger is not rescanned."""
    run_id, _, inputs = latest_run(ledger_copy)
    page = open_console("pages/gate_compliance.py")
    assert any(f"recorded run #{run_id}" in str(c.value) for c in page.caption)
    page.number_input(key="gates_max_duplicates").set_value(7)
    page.slider(key="gates_traceable").set_value(0.5).run()
    table = next(e.value for e in page.dataframe if "passes when (what if)" in e.value.columns)
    expected = {
        r.gate: r for r in evaluate(inputs, Thresholds(max_duplicates=7, min_traceable_share=0.5)).results
    }
    by_gate = {str(r["gate"]): r for r in table.to_dict("records")}
    assert by_gate["duplicate_operations"]["passes when (what if)"] == gate_threshold(
        "duplicate_operations", 7
    )
    assert by_gate["traceability"]["passes when (what if)"] == gate_threshold("traceability", 0.5)
    for gate in ("duplicate_operations", "traceability", "poll_amplification", "terminal_divergence"):
        assert by_gate[gate]["what if"] == ("PASS" if expected[gate].passed else "FAIL")
        assert same_value(by_gate[gate]["value"], gate, expected[gate].value)
    assert "gate_inputs" not in insights_of(page).last_sql


# ------------------------------------------------------------------------------- service mode


class FakeService:
    """The two routes the console's gates use, answered as the service answers them, on a ledger file:
    POST /api/v1/sql (read-only, sandboxed) and POST /api/v1/gates (evaluate now and record a run)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls: list[str] = []

    def __call__(self, request: http_kit.Request) -> http_kit.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        if request.url.path == "/api/v1/sql":
            body = json.loads(request.content)
            result = run_query(self.path, body["query"], max_rows=body["max_rows"]).as_json()
            return http_kit.Response(200, content=json.dumps(result, default=str))
        if request.url.path == "/api/v1/gates" and request.method == "POST":
            now = SystemClock().now()
            with Ledger.open(self.path) as ledger:
                report = evaluate(ledger.gate_inputs(now), Thresholds())
                run_id = ledger.record_gate_run(report.results, now)
            gates = [
                {"gate": r.gate, "passed": r.passed, "value": r.value, "threshold": r.threshold,
                 "verdict": r.verdict, "inputs": r.inputs}
                for r in report.results
            ]  # fmt: skip
            body = {"run_id": run_id, "passed": report.passed, "gates": gates}
            return http_kit.Response(200, content=json.dumps(body, default=str))
        return http_kit.Response(404, json={"error": "not here"})


@pytest.fixture
def service(ledger_copy: Path) -> Iterator[tuple[Insights, FakeService]]:
    fake = FakeService(ledger_copy)
    client = ServiceClient("http://service.test", transport=http_kit.MockTransport(fake))
    insights = Insights(ServiceSource(client), cache_s=0, gate_interval_s=10)
    yield insights, fake
    client.close()


def test_service_mode_uses_a_run_no_older_than_the_interval(service: tuple[Insights, FakeService]) -> None:
    """A run the service recorded seconds ago is shown as is; a stale one (its recorder stopped) is not."""
    insights, fake = service
    view = insights.reevaluate()  # the service records a run now
    assert fake.calls == ["POST /api/v1/gates"]
    assert view.run_id is not None
    assert f"recorded as run #{view.run_id}" in view.basis
    insights.clear_cache()
    shown = insights.gates()
    assert shown.run_id == view.run_id
    assert "recorded by the service every 10 s" in shown.basis
    assert "gate_inputs" not in insights.last_sql
    # eleven-plus minutes later, with no newer run: not current, so the console evaluates afresh
    later = Insights(insights.source, cache_s=0, gate_interval_s=10, clock=_Later(timedelta(minutes=11)))
    stale = later.gates()
    assert stale.run_id is None
    assert "evaluated now by this console" in stale.basis
    assert "gate_inputs" in later.last_sql


class _Later:
    """A clock ahead of the real one by ``ahead``."""

    def __init__(self, ahead: timedelta) -> None:
        self.ahead = ahead

    def now(self) -> datetime:
        return SystemClock().now() + self.ahead

    async def sleep(self, delay: timedelta) -> None:  # pragma: no cover - not used by the console
        raise NotImplementedError
