"""A person's "absent" ends the wait without a receipt and never resubmits by itself; resubmitting under
the same key is a separate person action, recorded with actor and reason before anything is sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import ServiceRefused
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, all_terminal, config_text, wait_until

TIME_SCALE = 0.05
"""As the other service tests' reference servers (``conftest.py``)."""
QUICK = {"duration_ms": 200, "ttl_ms": 10_000_000}


@pytest.fixture(scope="module")
def ignoring() -> Iterator[RefServer]:
    """An AIP-151 service that accepts request_id and ignores it: nothing can be looked up by key."""
    with RefServer("aip-151", time_scale=TIME_SCALE, ignore_request_id=True) as server:
        yield server


@pytest.fixture
def service(tmp_path: Path, ignoring: RefServer, servers: dict[str, RefServer]) -> Iterator[ServiceProcess]:
    ignoring.reset()
    path = tmp_path / "finality.toml"
    path.write_text(config_text({"mcp": servers["mcp"], "aip": ignoring, "ext": servers["ext"]}))
    with ServiceProcess(tmp_path / "ledger.duckdb", path) as svc:
        yield svc


def _open_unknown(client: ServiceClient, operation_id: str) -> int | None:
    for entry in client.reconciliation():
        if entry["operation_id"] == operation_id and entry["kind"] == "unknown":
            return int(entry["entry_id"])
    return None


def test_absent_waits_for_a_persons_resubmission_which_is_recorded_with_actor_and_reason(
    service: ServiceProcess, ignoring: RefServer
) -> None:
    """absent → NOT_FOUND_SAFE and nothing sent, however long the executor runs; resubmit → the same
    key goes out again, the transition names the person and their reason."""
    # Only the first creation's response is lost; the person's resubmission goes through.
    ignoring.set_faults([{"fault": "create_response_lost", "tool": "analyze_upload", "count": 1}])
    with service.client() as client:
        op = client.submit(call_node="lost", tool="analyze_upload", arguments={"_sim": QUICK})
        wait_until(lambda: _open_unknown(client, op["operation_id"]) is not None, what="an UNKNOWN entry")
        entry_id = _open_unknown(client, op["operation_id"])
        assert entry_id is not None
        client.resolve(
            entry_id, actor="ops", reason="not in the service's console", task_id=None, absent=True
        )
        assert client.show("lost")["state"] == "NOT_FOUND_SAFE"
        # Let the executor run a whole other call to its end meanwhile: "absent" still sends nothing.
        client.submit(call_node="other", tool="analyze_upload", arguments={"_sim": QUICK})
        wait_until(lambda: all_terminal(client, ["other"]), what="the other call terminal")
        assert client.show("lost")["state"] == "NOT_FOUND_SAFE"
        assert ignoring.stats()["requests"]["Run"] == 2
        client.resubmit("lost", actor="ops", reason="checked again: it never ran")
        wait_until(lambda: all_terminal(client, ["lost"]), what="the resubmitted call terminal")
        final = client.show("lost")
        with pytest.raises(ServiceRefused) as refused:
            client.resubmit("lost", actor="ops", reason="twice")
    assert refused.value.status == 409
    assert final["state"] == "ACCEPTED"
    events = [(t["event"], t["cause"]) for t in final["transitions"] if t["accepted"]]
    resubmitted = [cause for event, cause in events if event == "Resubmitted"]
    assert resubmitted == ["ops: checked again: it never ran (same key, resubmitted by a person)"]
    assert any(event == "Reconciled" and "absent" in cause for event, cause in events)
    assert ignoring.stats()["requests"]["Run"] == 3
