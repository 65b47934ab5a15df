"""Approvals: every round has a deadline, and an answer that does not fit the schema the server
requested is refused with 422 naming the failing field, recording and sending nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from refserver.testing import RefServer
from service.client import ServiceClient, ServiceRefused
from service.testing import ServiceProcess, all_terminal, wait_until

# One input round; kept on the server long after it ends (so this is never an expiry test).
ROUND = {"duration_ms": 2000, "input_rounds": 1, "ttl_ms": 10_000_000}


@pytest.fixture
def service(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    for server in servers.values():
        server.reset()
    # A generous start: on a shared, loaded machine the service's imports alone can take 25 s.
    with ServiceProcess(tmp_path / "ledger.duckdb", write_config(), startup_timeout=120) as svc:
        yield svc


def _pending(client: ServiceClient) -> list[dict[str, object]]:
    return [a for a in client.approvals() if a["status"] == "pending"]


def test_an_answer_missing_a_required_field_is_refused_with_422_naming_it(
    service: ServiceProcess, servers: dict[str, RefServer]
) -> None:
    """The reference schema requires ``approve``: {"note": ...} alone is 422 naming content.approve,
    the round stays pending and nothing reaches the server; a fitting answer then completes the call.
    The round carries a deadline (the task's expiry), never NULL."""
    with service.client() as client:
        client.submit(call_node="a1", tool="generate_report", arguments={"_sim": ROUND})
        wait_until(lambda: bool(_pending(client)), what="a pending approval")
        (approval,) = _pending(client)
        assert approval["deadline"] is not None
        assert datetime.fromisoformat(str(approval["deadline"])) > datetime.fromisoformat(
            str(approval["opened_at"])
        )
        operation_id, input_round = str(approval["operation_id"]), int(str(approval["input_round"]))
        with pytest.raises(ServiceRefused, match=r"content\.approve") as refused:
            client.answer(operation_id, input_round, actor="bob", answer={"note": "looks fine"})
        assert refused.value.status == 422
        assert [a["operation_id"] for a in _pending(client)] == [operation_id]
        assert "response" not in servers["mcp"].stats()["requests"]
        client.answer(operation_id, input_round, actor="bob", answer={"approve": True, "note": "ok"})
        wait_until(lambda: all_terminal(client, ["a1"]), what="terminal")
        assert client.show("a1")["state"] == "ACCEPTED"
