"""The rollout through the control API and the CLI of a running ``finality serve``, against two reference servers."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import http_kit
import pytest
from rollout_kit import TIME_SCALE, created, executions, rollout_config

from engine.clock import monotonic_seconds
from engine.errors import ServiceRefused
from engine.ledger import duckdb_client
from engine.ledger.duckdb import Ledger
from engine.model import Role
from refserver.testing import RefServer
from rollout.assign import arm_for
from service.cli import main
from service.client import ServiceClient
from service.testing import ServiceProcess, all_terminal, wait_until

SALT = "rollout-test"
SIM = {"duration_ms": 2000, "ttl_ms": 3_600_000}


@pytest.fixture
def service(
    tmp_path: Path, write_rollout_config: Callable[..., Path], paths: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    for server in paths.values():
        server.reset()
    with ServiceProcess(tmp_path / "ledger.duckdb", write_rollout_config()) as svc:
        yield svc


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory, paths: dict[str, RefServer]) -> Iterator[ServiceProcess]:
    """One service for the tests that record nothing (status reads and refused requests): its rollout
    stays off at epoch 1 with no events whatever order they run in."""
    folder = tmp_path_factory.mktemp("rollout-quiet")
    config = folder / "rollout.toml"
    config.write_text(rollout_config(paths))
    with ServiceProcess(folder / "ledger.duckdb", config) as svc:
        yield svc


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def act(service: ServiceProcess, capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    code, out, err = cli(
        capsys, "rollout", *argv, "--service", service.url, "--actor", "rm", "--reason", "test", "--json"
    )
    assert code == 0, err
    result: dict[str, object] = json.loads(out)
    return result


def test_status_needs_no_actor_and_starts_off(
    quiet: ServiceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh service is off at epoch 1 with an intact (empty) audit chain; status takes no actor."""
    code, out, _ = cli(capsys, "rollout", "status", "--service", quiet.url, "--json")
    assert code == 0
    status = json.loads(out)
    assert (status["stage"], status["percentage"], status["epoch"]) == ("off", 0, 1)
    assert status["audit"]["verified"] is True
    assert status["disabled_protocols"] == []
    code, out, _ = cli(capsys, "rollout", "status", "--service", quiet.url)
    assert "stage       off" in out


def test_shadowing_a_tool_with_side_effects_is_refused_with_a_clear_error(
    quiet: ServiceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """422 naming the rule; the CLI exits 2 with the same message; nothing is recorded."""
    code, _, err = cli(
        capsys,
        "rollout",
        "shadow",
        "--tool",
        "apply_batch_change",
        "--service",
        quiet.url,
        "--actor",
        "rm",
        "--reason",
        "try",
    )
    assert code == 2
    assert "side-effect-free" in err
    with quiet.client() as client, pytest.raises(ServiceRefused) as refused:
        client.rollout("shadow", {"actor": "rm", "reason": "try", "tools": ["apply_batch_change"]})
    assert refused.value.status == 422
    with quiet.client() as client:
        assert client.rollout_status()["audit"]["events"] == 0


def test_shadow_runs_beside_the_primary_is_never_delivered_and_is_compared(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str], paths: dict[str, RefServer], tmp_path: Path
) -> None:
    """Each call runs on the old path and, as its own shadow operation, on the new adapter; one diff per pair."""
    act(service, capsys, "shadow", "--tool", "generate_report")
    nodes = [f"s{i}" for i in range(4)]
    with service.client() as client:
        for i, node in enumerate(nodes):
            sim = {**SIM, "outcome": "failed"} if i == 3 else SIM
            client.submit(call_node=node, tool="generate_report", arguments={"n": node, "_sim": sim})
        client.submit(call_node="batch", tool="apply_batch_change", arguments={"n": "batch", "_sim": SIM})
        everything = [*nodes, *(f"{n}#shadow" for n in nodes), "batch"]
        wait_until(
            lambda: all_terminal(client, everything), timeout=60, what="primaries and shadows terminal"
        )
        wait_until(
            lambda: client.shadow_diffs()["summary"]["compared"] == len(nodes), timeout=30, what="comparisons"
        )
        diffs = client.shadow_diffs()
        status = client.rollout_status()
    service.stop()
    assert status["shadow"]["shadow_operations"] == len(nodes)
    assert diffs["summary"]["diverged"] == 0, diffs
    assert {d["call_node_id"] for d in diffs["diffs"]} == set(nodes)
    for d in diffs["diffs"]:
        assert d["primary_status"] == d["shadow_status"]
        assert d["primary_content_digest"] == d["shadow_content_digest"]
        assert d["primary_result_digest"] != d["shadow_result_digest"]  # envelopes differ, content does not
        assert d["primary_polls"] >= 2
        assert d["shadow_polls"] >= 2
    with Ledger.open(tmp_path / "ledger.duckdb", read_only=True) as ledger:
        ops = {op.call_node_id: op for op in ledger.operations()}
        outbox = ledger.count("outbox")
        receipts = ledger.count("receipts")
    for node in nodes:
        assert ops[node].role is Role.PRIMARY
        assert ops[node].server == paths["old"].endpoint
        assert ops[f"{node}#shadow"].role is Role.SHADOW
        assert ops[f"{node}#shadow"].server == paths["new"].endpoint
    assert "batch#shadow" not in ops, "a tool with side effects is never shadowed"
    assert receipts == 2 * len(nodes) + 1
    assert outbox == len(nodes) + 1, "shadow receipts never reach the outbox"
    assert created(paths["new"]) == len(nodes)
    assert max(executions(paths["new"]).values()) == 1


def test_canary_routes_by_sticky_bucket_and_reports_arm_flips(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str], paths: dict[str, RefServer]
) -> None:
    """5 % first, then 50 %: every call's arm is the sticky bucket's, and the flip report names the movers."""
    act(service, capsys, "shadow")
    code, _, err = cli(
        capsys,
        "rollout",
        "canary",
        "20",
        "--override",
        "--service",
        service.url,
        "--actor",
        "rm",
        "--reason",
        "too big a first step",
    )
    assert code == 2
    assert "at most 5%" in err
    act(service, capsys, "canary", "5", "--override")
    nodes = [f"c{i}" for i in range(40)]
    with service.client() as client:
        for node in nodes:
            client.submit(call_node=node, tool="apply_batch_change", arguments={"n": node, "_sim": SIM})
        arms = {a["call_node_id"]: a for a in client.rollout_assignments()}
        grown = act(service, capsys, "canary", "50", "--override")
        wait_until(lambda: all_terminal(client, nodes), timeout=60, what="canary calls terminal")
        reports = {node: client.show(node) for node in nodes}
    for node in nodes:
        expected = arm_for(node, SALT, 500).value
        assert arms[node]["arm"] == expected
        assert arms[node]["server_name"] == ("new" if expected == "canary" else "old")
        assert reports[node]["server"] == paths["new" if expected == "canary" else "old"].endpoint
    flips = grown["detail"]["arm_flips"]  # type: ignore[index]
    moved = {n for n in nodes if arm_for(n, SALT, 500) is not arm_for(n, SALT, 5000)}
    assert {f["call_node"] for f in flips["flipped"]} == moved
    assert flips["to_control"] == 0, "growing the canary never moves a key back"
    assert flips["in_flight_affected"] == len(flips["in_flight"])


def test_promotion_is_blocked_while_a_gate_fails_and_an_override_is_recorded(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """409 with the failing gates and their raw values; --override with a reason goes ahead and says so."""
    act(service, capsys, "shadow")
    response = http_kit.post(
        f"{service.url}/api/v1/rollout/canary",
        json={"actor": "rm", "reason": "go", "percentage": 5},
        timeout=30,
    )
    assert response.status_code == 409
    body = response.json()
    gates = {g["gate"] for g in body["failing_gates"]}
    assert "terminal_divergence" in gates
    assert all("inputs" in g and "value" in g for g in body["failing_gates"])
    assert "promotion blocked" in body["error"]
    code, _, err = cli(
        capsys, "rollout", "canary", "5", "--service", service.url, "--actor", "rm", "--reason", "go"
    )
    assert code == 2
    assert "terminal_divergence" in err
    result = act(service, capsys, "canary", "5", "--override")
    assert result["override"] is True
    overridden = {g["gate"] for g in result["detail"]["overridden_gates"]}  # type: ignore[index]
    assert overridden == gates
    with service.client() as client:
        events = client.rollout_events()
        assert [e["action"] for e in events] == ["canary", "shadow"]
        assert events[0]["override"] is True
        assert client.rollout_status()["audit"]["verified"] is True


def test_kill_switch_refuses_new_calls_and_lets_existing_ones_finish(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """Disabled by protocol version: new submissions 409, the old operation can still be read and cancelled."""
    with service.client() as client:
        client.submit(
            call_node="long",
            tool="analyze_upload",
            arguments={"n": "long", "_sim": {"duration_ms": 600_000, "ttl_ms": 3_600_000}},
        )
        wait_until(lambda: client.show("long")["state"] == "WORKING", what="working")
        act(service, capsys, "disable-protocol", "mcp-2025-11-25")
        with pytest.raises(ServiceRefused, match="disabled") as refused:
            client.submit(call_node="new-call", tool="analyze_upload", arguments={"n": "x"})
        assert refused.value.status == 409
        status = client.rollout_status()
        assert status["disabled_protocols"] == ["mcp-2025-11-25"]
        assert status["remaining"] == {"mcp-2025-11-25": 1}
        assert client.show("long")["state"] == "WORKING"
        client.cancel("long", actor="oncall", reason="contract changed")
        wait_until(lambda: all_terminal(client, ["long"]), what="cancel confirmed on the disabled adapter")
        assert client.show("long")["state"] == "CANCELLED_ACCEPTED"
        assert client.rollout_status()["remaining"] == {"mcp-2025-11-25": 0}
        act(service, capsys, "enable-protocol", "mcp-2025-11-25")
        client.submit(call_node="new-call", tool="analyze_upload", arguments={"n": "x", "_sim": SIM})
        wait_until(lambda: all_terminal(client, ["new-call"]), what="a call after re-enabling")


def test_rollout_state_and_epoch_survive_a_restart(
    tmp_path: Path, write_rollout_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Stage, canary size, kill switch and the raised epoch are read back from the ledger at start."""
    config = write_rollout_config()
    ledger = tmp_path / "restart.duckdb"
    with ServiceProcess(ledger, config) as svc:
        act(svc, capsys, "shadow")
        act(svc, capsys, "canary", "5", "--override")
        act(svc, capsys, "disable-protocol", "aip-151")
    with ServiceProcess(ledger, config) as svc, svc.client() as client:
        status = client.rollout_status()
        assert (status["stage"], status["percentage"], status["disabled_protocols"]) == (
            "canary",
            5,
            ["aip-151"],
        )
        rolled = act(svc, capsys, "rollback")
        assert rolled["adoption"]["to_epoch"] == 2  # type: ignore[index]
    with ServiceProcess(ledger, config) as svc, svc.client() as client:
        status = client.rollout_status()
        assert (status["stage"], status["epoch"]) == ("rolled_back", 2)
        assert client.health()["epoch"] == 2
        assert status["audit"] == {**status["audit"], "verified": True, "events": 4}


def test_rollback_through_the_cli_adopts_in_flight_calls_and_sends_new_ones_to_the_old_path(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str], paths: dict[str, RefServer]
) -> None:
    """One command: epoch raised, in-flight calls finish where they are, nothing runs twice, new calls go old."""
    started = monotonic_seconds()
    act(service, capsys, "shadow")
    act(service, capsys, "canary", "5", "--override")
    act(service, capsys, "canary", "50", "--override")
    per_request_s = (monotonic_seconds() - started) / 3
    nodes = [f"r{i}" for i in range(30)]
    # Every call must still be in flight when the rollback lands: the work outlasts the ~70 requests
    # before it (30 submits, a round of 30 shows, the rollback) at twice the pace just measured, and
    # never less than 5 s; the tasks are kept ten times as long as they work.
    work_s = max(5.0, 2 * 70 * per_request_s)
    duration_ms = work_s / TIME_SCALE * 1000
    long_sim = {"duration_ms": duration_ms, "ttl_ms": max(3_600_000, 10 * duration_ms)}
    with service.client() as client:
        for node in nodes:
            client.submit(call_node=node, tool="apply_batch_change", arguments={"n": node, "_sim": long_sim})
        wait_until(
            lambda: all(client.show(n)["state"] == "WORKING" for n in nodes),
            timeout=30 + work_s,
            what="all working",
        )
        code, out, err = cli(
            capsys, "rollout", "rollback", "--service", service.url, "--actor", "oncall", "--reason", "errors"
        )
        assert code == 0, err
        assert "epoch 1 -> 2: adopted 30" in out
        client.submit(call_node="after", tool="apply_batch_change", arguments={"n": "after", "_sim": SIM})
        wait_until(lambda: all_terminal(client, [*nodes, "after"]), timeout=60 + work_s, what="all terminal")
        reports = {n: client.show(n) for n in [*nodes, "after"]}
        arms = {a["call_node_id"]: a["arm"] for a in client.rollout_assignments()}
    assert all(r["epoch"] == 2 and r["receipt"]["epoch"] == 2 for r in reports.values())
    assert arms["after"] == "control"
    assert reports["after"]["server"] == paths["old"].endpoint
    on_new = [n for n in nodes if arms[n] == "canary"]
    assert on_new, "some calls were on the new adapter when it was rolled back"
    assert all(reports[n]["server"] == paths["new"].endpoint for n in on_new)
    assert created(paths["old"]) + created(paths["new"]) == len(nodes) + 1
    for server in paths.values():
        assert all(count == 1 for count in executions(server).values())


def tamper(source: Path, target: Path, *statements: str) -> Path:
    shutil.copy(source, target)
    con = duckdb_client.connect(str(target))
    try:
        for sql in statements:
            con.execute(sql)
    finally:
        con.close()
    return target


def test_audit_verify_detects_edited_deleted_and_reordered_rows(
    tmp_path: Path, write_rollout_config: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """``finality audit verify`` passes an intact chain and names the row of each kind of tampering."""
    ledger = tmp_path / "audit.duckdb"
    with ServiceProcess(ledger, write_rollout_config()) as svc:
        act(svc, capsys, "shadow")
        act(svc, capsys, "canary", "5", "--override")
        act(svc, capsys, "disable-protocol", "aip-151")
        act(svc, capsys, "rollback")
        code, out, _ = cli(capsys, "audit", "verify", "--service", svc.url)
        assert code == 0
        assert "4 rollout event(s) checked: chain intact" in out
    assert cli(capsys, "audit", "verify", "--ledger", str(ledger))[0] == 0
    cases = {
        "edited": ("UPDATE rollout_events SET reason = 'nothing happened' WHERE seq = 2", "seq=2"),
        "edited-override": ("UPDATE rollout_events SET override = false WHERE seq = 2", "seq=2"),
        "deleted": ("DELETE FROM rollout_events WHERE seq = 2", "seq=3"),
        "deleted-last": ("DELETE FROM rollout_events WHERE seq = 4", "ends at seq 3"),
        "reordered": (
            "UPDATE rollout_events SET seq = CASE seq WHEN 2 THEN 3 WHEN 3 THEN 2 ELSE seq END WHERE seq IN (2, 3)",
            "seq=2",
        ),
        "state-edited": ("UPDATE rollout_state SET epoch = 1", "rollout_state differs"),
    }
    for name, (sql, named) in cases.items():
        broken = tamper(ledger, tmp_path / f"{name}.duckdb", sql)
        code, out, _ = cli(capsys, "audit", "verify", "--ledger", str(broken), "--json")
        report = json.loads(out)
        assert code == 1, name
        assert not report["ok"], name
        assert any(named in p for p in report["problems"]), (name, report["problems"])


def test_unknown_rollout_actions_and_bad_bodies_are_refused(quiet: ServiceProcess) -> None:
    """404 for an unknown action, 400 for a missing actor or a bad percentage."""
    with quiet.client() as client:
        for action, body, status in (
            ("jump", {"actor": "a", "reason": "r"}, 404),
            ("shadow", {"reason": "r"}, 400),
            ("canary", {"actor": "a", "reason": "r", "percentage": "lots"}, 400),
            ("canary", {"actor": "a", "reason": "r", "percentage": 0}, 400),
        ):
            with pytest.raises(ServiceRefused) as refused:
                client.rollout(action, body)
            assert refused.value.status == status, (action, body)


def test_a_client_cannot_claim_a_shadow_call_node(quiet: ServiceProcess) -> None:
    """Call node ids ending in #shadow belong to shadow operations."""
    with ServiceClient(quiet.url) as client, pytest.raises(ServiceRefused) as refused:
        client.submit(call_node="x#shadow", tool="generate_report", arguments={})
    assert refused.value.status == 400
