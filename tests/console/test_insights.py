"""console.insights: the named queries agree with the ledger's own definitions, quote every value, and refuse writes without a service."""

from __future__ import annotations

import io
import json
import zipfile
from datetime import timedelta
from pathlib import Path

import pytest

from console.insights import Insights
from console.queries import QUERIES, lit
from console.sources import FileSource
from console.views import parse_rollout_status
from engine.errors import NotConfigured, ReadOnlyConsole
from engine.ledger.duckdb import Ledger
from rollout.gates import evaluate


@pytest.fixture
def insights(seeded_ledger: Path) -> Insights:
    return Insights(FileSource(seeded_ledger), cache_s=0)


def test_gate_inputs_query_matches_the_ledgers_gate_inputs(insights: Insights, seeded_ledger: Path) -> None:
    """engine.ledger.gate_sql through the console yields what Ledger.gate_inputs reads, so verdicts agree (test_gate_sql.py checks the SQL against a plain reference)."""
    mine, now = insights.gate_inputs()
    with Ledger.open(seeded_ledger, read_only=True) as ledger:
        theirs = ledger.gate_inputs(now)
    for gate, values in theirs.items():
        for key, value in values.items():
            if key == "last_run_at":
                continue
            got = mine[gate][key]
            if isinstance(value, float) or isinstance(got, float):
                assert got == pytest.approx(value), (gate, key)
            else:
                assert got == value, (gate, key)
    assert [r.passed for r in evaluate(mine).results] == [r.passed for r in evaluate(theirs).results]


def test_values_become_quoted_literals_never_sql(insights: Insights) -> None:
    """A hostile id is a string literal: it finds nothing and runs nothing."""
    assert lit("x' OR 1=1 --") == "'x'' OR 1=1 --'"
    assert insights.operation("x' OR 1=1 --") is None
    with pytest.raises(ValueError, match="unknown values"):
        insights.operations(states=["WORKING'; DROP TABLE receipts; --"])


def test_every_named_query_runs_on_a_seeded_ledger(insights: Insights) -> None:
    """Each page's queries run and return frames; the SQL each ran is kept for the evidence bundle."""
    now = insights.now()
    since, until = now - timedelta(days=7), now + timedelta(seconds=1)
    assert len(insights.arms()) >= 3
    assert len(insights.cancel_latency_over_time(since=since, until=until, by="arm")) > 0
    assert len(insights.reconciliation_aging()) > 0
    assert len(insights.timeline("node-1")) > 0
    assert insights.operation("node-1") is not None
    assert "percentile_cont" in insights.last_sql["cancel_latency_over_time"]
    assert set(insights.last_sql) <= set(QUERIES)


def test_a_file_console_refuses_actions(insights: Insights) -> None:
    """Without a service nothing is written: resolve, answer, cancel and rollout actions are refused."""
    with pytest.raises(ReadOnlyConsole):
        insights.resolve(1, actor="a", reason="b")
    with pytest.raises(ReadOnlyConsole):
        insights.answer("op-1", 1, actor="a", answer={"approve": True})
    with pytest.raises(ReadOnlyConsole):
        insights.rollout_action("rollback", actor="a", reason="b")


def test_from_env_prefers_the_service_and_falls_back_to_the_file(seeded_ledger: Path) -> None:
    """An unreachable service with a ledger file set gives a read-only console that says why."""
    with pytest.raises(NotConfigured):
        Insights.from_env({})
    ins = Insights.from_env(
        {"FINALITY_SERVICE_URL": "http://127.0.0.1:9", "FINALITY_LEDGER": str(seeded_ledger)}
    )
    assert ins.info.kind == "file"
    assert "does not answer" in ins.info.note


def test_evidence_bundle_holds_gates_inputs_audit_and_the_sql_behind_each_chart(insights: Insights) -> None:
    """The zip has a manifest with digests, the gates with raw inputs, and one .sql per named query."""
    data = insights.evidence_bundle(decision="promote to 25 %", actor="tester")
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        names = set(bundle.namelist())
        manifest = json.loads(bundle.read("manifest.json"))
        gates = json.loads(bundle.read("gates.json"))
    assert {f"queries/{name}.sql" for name in QUERIES} <= names
    assert {"gates.json", "gate_history.csv", "audit_verification.json", "queries/README.md"} <= names
    assert set(manifest["files"]) == names - {"manifest.json"}
    assert manifest["decision"] == "promote to 25 %"
    assert len(gates["gates"]) == 6
    assert "unknown_reconciliation" in gates["inputs"]


def test_rollout_status_is_read_whatever_names_the_route_settles_on() -> None:
    """Stage, percentage, epoch, disabled protocols with remaining operations and the chain check are read."""
    status = parse_rollout_status(
        {
            "stage": "canary",
            "canary_bp": 500,
            "epoch": 3,
            "disabled": [{"protocol": "mcp-2026-07-28", "remaining": 4}],
            "audit": {"ok": True, "checked": 7, "problems": []},
        }
    )
    assert (status.stage, status.percentage, status.epoch) == ("canary", 5.0, 3)
    assert status.disabled_protocols == ("mcp-2026-07-28",)
    assert status.remaining == {"mcp-2026-07-28": 4}
    assert status.audit.verified is True


def test_approvals_list_only_answerable_rounds_newest_first(seeded_ledger: Path, tmp_path: Path) -> None:
    """A pending round whose operation moved on (here: accepted) or whose deadline passed is not offered."""
    import shutil

    from engine.ledger import duckdb_client

    path = tmp_path / "approvals.duckdb"
    shutil.copy(seeded_ledger, path)
    with duckdb_client.connect(str(path)) as con:
        pending = con.execute(
            "SELECT operation_id FROM approvals WHERE status = 'pending' ORDER BY operation_id LIMIT 2"
        ).fetchall()
        moved_on, expired = pending[0][0], pending[1][0]
        con.execute("UPDATE op_state SET state = 'ACCEPTED' WHERE operation_id = ?", [moved_on])
        con.execute(
            "UPDATE approvals SET deadline = now() - INTERVAL 1 MINUTE WHERE operation_id = ?", [expired]
        )
    listed = Insights(FileSource(path), cache_s=0).approvals_pending()
    assert len(listed) > 0
    assert moved_on not in set(listed["operation_id"])
    assert expired not in set(listed["operation_id"])
    assert set(listed["state"]) == {"INPUT_REQUIRED"}
    assert (listed["input_round"] == listed["current_round"]).all()
    assert listed["opened_at"].is_monotonic_decreasing


def test_the_evidence_manifest_keeps_the_decision_and_the_actor(insights: Insights) -> None:
    """Both typed values are in manifest.json, with the shadow comparison files listed."""
    data = insights.evidence_bundle(decision="promote canary 5 % -> 25 %", actor="rosa")
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        manifest = json.loads(bundle.read("manifest.json"))
    assert manifest["decision"] == "promote canary 5 % -> 25 %"
    assert manifest["actor"] == "rosa"
    assert "queries/shadow_diverged.csv" in manifest["files"]


def test_the_duplicated_filter_lists_exactly_the_operations_the_duplicate_gate_counts(
    seeded_ledger: Path, tmp_path: Path
) -> None:
    """Two operations bound to a second server task: the gate counts 2 and the Operations filter lists those two."""
    import shutil

    from engine.ledger import duckdb_client

    path = tmp_path / "duplicated.duckdb"
    shutil.copy(seeded_ledger, path)
    with duckdb_client.connect(str(path)) as con:
        bound = con.execute(
            "SELECT server, task_id, operation_id FROM task_bindings ORDER BY operation_id LIMIT 2"
        ).fetchall()
        for server, task_id, operation_id in bound:
            con.execute(
                "INSERT INTO task_bindings (server, task_id, operation_id, bound_at) VALUES (?, ?, ?, now())",
                [server, f"{task_id}-second", operation_id],
            )
    insights = Insights(FileSource(path), cache_s=0)
    gate = {r.gate: r for r in insights.gates().results}["duplicate_operations"]
    listed = insights.operations(duplicated=True)
    counted = insights.operations_by_state(duplicated=True)
    assert gate.value == 2
    assert not gate.passed
    assert sorted(listed["operation_id"]) == sorted(op for _, _, op in bound)
    assert int(counted["operations"].sum()) == 2
    assert len(insights.operations()) > 2  # without the filter, the page lists everything


def test_outbox_lag_shows_each_consumers_acknowledged_and_waiting_entries(
    insights: Insights, seeded_ledger: Path
) -> None:
    """Per consumer: acknowledged plus behind is every outbox entry; the oldest waiting entry has an age."""
    lag = insights.outbox_lag()
    assert lag is not None
    with Ledger.open(seeded_ledger, read_only=True) as ledger:
        entries = ledger.count("outbox")
        acks = ledger.count("outbox_acks")
    (row,) = lag.to_dict("records")
    assert row["consumer"] == "workflow"
    assert row["acknowledged"] == acks
    assert row["acknowledged"] + row["behind"] == entries
    assert row["behind"] == 0 or row["oldest_waiting_s"] >= 0


def test_alerts_count_approvals_about_to_expire_and_expired_in_the_last_hour(
    seeded_ledger: Path, tmp_path: Path
) -> None:
    """A round due in 2 minutes is "expiring"; one expired 10 minutes ago counts, one expired 3 hours ago does not."""
    import shutil

    from engine.ledger import duckdb_client

    path = tmp_path / "expiring.duckdb"
    shutil.copy(seeded_ledger, path)
    with duckdb_client.connect(str(path)) as con:
        con.execute("UPDATE approvals SET deadline = now() + INTERVAL 1 DAY WHERE status = 'pending'")
        con.execute("UPDATE approvals SET status = 'answered' WHERE status = 'expired'")
        ids = [
            r[0]
            for r in con.execute(
                "SELECT operation_id FROM approvals WHERE status = 'pending' ORDER BY operation_id LIMIT 3"
            ).fetchall()
        ]
        con.execute(
            "UPDATE approvals SET deadline = now() + INTERVAL 2 MINUTE WHERE operation_id = ?", [ids[0]]
        )
        for operation_id, ago in ((ids[1], "10 MINUTE"), (ids[2], "3 HOUR")):
            con.execute(
                f"UPDATE approvals SET status = 'expired', deadline = now() - INTERVAL {ago}, "
                f"closed_at = now() - INTERVAL {ago} WHERE operation_id = ?",
                [operation_id],
            )
    alerts = Insights(FileSource(path), cache_s=0).alerts()
    assert alerts["approvals_expiring"] == 1
    assert alerts["approvals_expired_recently"] == 1
    assert "approvals_overdue" not in alerts


def test_a_console_newer_than_its_service_refuses_it_with_a_clear_message() -> None:
    """A service whose health answer predates the control API version (no api_version, or a lower
    one) is refused at connect time, naming both versions, instead of failing later on a KeyError."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from service.client import API_VERSION

    answers = [{"status": "ok", "in_flight": 0}, {"status": "ok", "api_version": API_VERSION - 1}]

    class OldService(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(answers[0]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), OldService)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(NotConfigured, match="older than this console: it speaks an older control API"):
            Insights.from_env({"FINALITY_SERVICE_URL": url})
        answers.pop(0)
        with pytest.raises(
            NotConfigured,
            match=f"speaks control API version {API_VERSION - 1}, this console needs version {API_VERSION}",
        ):
            Insights.from_env({"FINALITY_SERVICE_URL": url})
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
