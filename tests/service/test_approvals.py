"""Approvals over the service's HTTP API: every round has a deadline, an answer that does not fit the
schema the server requested is refused with 422 naming the failing field (recording and sending
nothing), and a round whose operation moves past it is closed and no longer listed as answerable."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from refserver.testing import RefServer
from service.client import ServiceClient, ServiceRefused
from service.testing import ServiceProcess, all_terminal, service_in, wait_until

# One input round; kept on the server long after it ends (so this is never an expiry test).
ROUND = {"duration_ms": 2000, "input_rounds": 1, "ttl_ms": 10_000_000}


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    """One service for the module (each test uses its own call nodes)."""
    for server in servers.values():
        server.reset()
    # A generous start: on a shared, loaded machine the service's imports alone can take 25 s.
    with service_in(tmp_path_factory.mktemp("approvals"), servers, startup_timeout=120) as svc:
        yield svc


def _pending(client: ServiceClient, operation_id: str | None = None) -> list[dict[str, object]]:
    return [
        a
        for a in client.approvals()
        if a["status"] == "pending" and operation_id in (None, a["operation_id"])
    ]


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
        assert [a["operation_id"] for a in _pending(client, operation_id)] == [operation_id]
        assert "response" not in servers["mcp"].stats()["requests"]
        client.answer(operation_id, input_round, actor="bob", answer={"approve": True, "note": "ok"})
        wait_until(lambda: all_terminal(client, ["a1"]), what="terminal")
        assert client.show("a1")["state"] == "ACCEPTED"


def test_a_round_whose_operation_is_cancelled_is_closed_and_no_longer_listed(service: ServiceProcess) -> None:
    """Cancelling an operation that waits on a person closes its round (status, instant and reason
    recorded); GET approvals no longer lists it, and an answer to it is refused with 409."""
    with service.client() as client:
        created = client.submit(call_node="a2", tool="generate_report", arguments={"_sim": ROUND})
        operation_id = str(created["operation_id"])
        wait_until(lambda: bool(_pending(client, operation_id)), what="a pending approval")
        client.cancel("a2", actor="ops", reason="not needed any more")
        wait_until(lambda: not _pending(client, operation_id), what="the round closed", timeout=30)
        (closed,) = [a for a in client.approvals(include_closed=True) if a["operation_id"] == operation_id]
        assert closed["status"] == "closed"
        assert str(closed["closed_reason"]).startswith("the operation moved on to ")
        assert datetime.fromisoformat(str(closed["closed_at"])) >= datetime.fromisoformat(
            str(closed["opened_at"])
        )
        with pytest.raises(ServiceRefused) as refused:
            client.answer(operation_id, 1, actor="bob", answer={"approve": True})
        assert refused.value.status == 409
