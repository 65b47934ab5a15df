"""AIP-151 operations over real HTTP: run, get, list, cancel, delete, request ids, errors and faults."""

from __future__ import annotations

from typing import Any

import http_kit
import pytest
from refserver_clients import wait_until

from refserver.testing import RefServer

LONG = {"_sim": {"duration_ms": 100_000}}
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


@pytest.fixture(scope="module")
def server():
    with RefServer("aip-151", time_scale=0.01, page_size=2) as running:
        yield running


@pytest.fixture
def aip(server, aip_factory):
    server.reset()
    return aip_factory(server)


def sim(**fields):
    return {"_sim": fields}


def assert_aip_error(response: http_kit.Response, http_status: int, status: str) -> dict[str, Any]:
    assert response.status_code == http_status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == http_status
    assert error["status"] == status
    info = error["details"][0]
    assert info["@type"] == ERROR_INFO
    assert info["domain"] == "refserver.finality.dev"
    assert info["reason"]
    return error


def test_run_returns_an_operation_that_finishes_with_a_typed_response(aip):
    """The run answers a not-done Operation; polling ends done with the ToolResult and the epoch."""
    response = aip.run("generate_report", {"report": "r"}, request_id="req-1", epoch=12)
    op = response.json()
    assert op["name"].startswith("operations/")
    assert op["done"] is False
    assert op["metadata"]["@type"] == "type.googleapis.com/finality.ref.RunMetadata"
    assert op["metadata"]["requestId"] == "req-1"
    done = aip.wait_done(op["name"])
    assert done["response"]["@type"] == "type.googleapis.com/finality.ref.ToolResult"
    assert done["response"]["structuredContent"]["echo"] == {"report": "r"}
    assert done["response"]["epoch"] == 12
    assert "error" not in done


def test_failed_operation_carries_a_status_error(aip):
    """outcome=failed ends done with google.rpc.Status code 13 and an ErrorInfo."""
    done = aip.wait_done(aip.start("generate_report", sim(outcome="failed")))
    assert done["error"]["code"] == 13
    assert done["error"]["details"][0]["@type"] == ERROR_INFO
    assert "response" not in done


def test_same_request_id_and_body_returns_the_same_operation(server, aip):
    """AIP-155: a retried run with the same request_id creates nothing and runs nothing new."""
    arguments = {"batch_id": "b", **LONG}
    first = aip.start("apply_batch_change", arguments, request_id="r-1")
    assert aip.start("apply_batch_change", arguments, request_id="r-1") == first
    stats = server.stats()
    assert stats["operations_created"]["total"] == 1
    assert len(stats["executions"]["apply_batch_change"]) == 1


def test_counts_report_creations_and_requests_as_stats_does_without_the_tasks(server, aip):
    """/admin/counts answers stats' creation and request counters, and no task list."""
    aip.start("apply_batch_change", {"batch_id": "c", **LONG}, request_id="r-c")
    aip.start("generate_report", {"report": "c", **LONG})
    counts, stats = server.counts(), server.stats()
    assert counts["operations_created"] == stats["operations_created"]
    assert counts["operations_created"]["total"] == 2
    assert counts["requests"] == stats["requests"]
    assert "tasks" not in counts


def test_same_request_id_with_another_body_is_409(aip):
    """Reusing a request_id for a different request is ALREADY_EXISTS."""
    aip.start("apply_batch_change", {"batch_id": "a", **LONG}, request_id="r-2")
    response = aip.run("apply_batch_change", {"batch_id": "b"}, request_id="r-2")
    assert_aip_error(response, 409, "ALREADY_EXISTS")


def test_list_filters_by_request_id_and_pages(aip):
    """ListOperations finds an operation by request_id and pages with nextPageToken."""
    names = [aip.start("generate_report", LONG, request_id=f"rq-{i}") for i in range(3)]
    found = aip.http.get("/v1/operations", params={"filter": 'request_id = "rq-1"'}).json()
    assert [op["name"] for op in found["operations"]] == [names[1]]
    assert aip.http.get("/v1/operations", params={"filter": "request_id=never"}).json() == {"operations": []}
    first = aip.http.get("/v1/operations").json()
    second = aip.http.get("/v1/operations", params={"page_token": first["nextPageToken"]}).json()
    assert [op["name"] for op in first["operations"] + second["operations"]] == names
    assert "nextPageToken" not in second
    bad = aip.http.get("/v1/operations", params={"filter": "owner = me"})
    assert_aip_error(bad, 400, "INVALID_ARGUMENT")


def test_cancel_is_best_effort_and_ends_with_code_1(aip):
    """CancelOperation answers {}; the operation later is done with error.code 1 (CANCELLED)."""
    name = aip.start("apply_batch_change", LONG)
    assert aip.http.post(f"/v1/{name}:cancel").json() == {}
    done = aip.wait_done(name)
    assert done["error"]["code"] == 1


def test_complete_on_cancel_accepts_the_cancel_but_the_operation_completes(aip):
    """The cancel is accepted and the operation is done with a response, not CANCELLED."""
    name = aip.start("generate_report", {"_sim": {"duration_ms": 100_000, "faults": ["complete_on_cancel"]}})
    assert aip.http.post(f"/v1/{name}:cancel").status_code == 200
    done = aip.get(name).json()
    assert done["done"] is True
    assert "response" in done


def test_unknown_deleted_and_expired_operations_are_404(aip):
    """A made-up name, a deleted operation and one past its ttl after completion are NOT_FOUND."""
    assert_aip_error(aip.get("operations/nope"), 404, "NOT_FOUND")
    deleted = aip.start("generate_report", LONG)
    assert aip.http.delete(f"/v1/{deleted}").json() == {}
    assert_aip_error(aip.get(deleted), 404, "NOT_FOUND")
    expiring = aip.start("generate_report", sim(ttl_ms=20_000))
    aip.wait_done(expiring)
    wait_until(lambda: aip.get(expiring).status_code == 404)


def test_repeat_after_deletion_still_returns_the_original_operation(server, aip):
    """AIP-155 'stale success': a retried run after DeleteOperation returns the original, runs nothing."""
    name = aip.start("generate_report", {"report": "r"}, request_id="gone")
    aip.http.delete(f"/v1/{name}")
    assert aip.start("generate_report", {"report": "r"}, request_id="gone") == name
    assert server.stats()["operations_created"]["total"] == 1


def test_bad_requests_get_aip_193_errors(aip):
    """Non-JSON bodies, bad fields and unknown tools get structured errors."""
    not_json = aip.http.post("/v1/tools/generate_report:run", content=b"{oops")
    assert_aip_error(not_json, 400, "INVALID_ARGUMENT")
    assert_aip_error(
        aip.http.post("/v1/tools/generate_report:run", json={"bogus": 1}), 400, "INVALID_ARGUMENT"
    )
    assert_aip_error(aip.run("generate_report", sim(outcome="?")), 400, "INVALID_ARGUMENT")
    assert_aip_error(aip.run("no_such_tool"), 404, "NOT_FOUND")
    assert_aip_error(aip.http.get("/v1/nothing/here"), 404, "NOT_FOUND")


def test_poll_503_answers_with_retry_after(aip):
    """poll_503 answers GetOperation with 503 UNAVAILABLE and Retry-After."""
    name = aip.start("generate_report", sim(faults=[{"name": "poll_503", "retry_after_s": 3}]))
    response = aip.get(name)
    assert_aip_error(response, 503, "UNAVAILABLE")
    assert response.headers["retry-after"] == "3"
    assert aip.get(name).status_code == 200


def test_create_response_lost_still_creates_the_operation_found_by_request_id(server, aip):
    """The run's response breaks, but ListOperations by request_id finds the operation it created."""
    with pytest.raises(http_kit.RemoteProtocolError):
        aip.run("apply_batch_change", sim(faults=["create_response_lost"]), request_id="lost-1")
    found = aip.http.get("/v1/operations", params={"filter": 'request_id="lost-1"'}).json()["operations"]
    assert len(found) == 1
    assert len(server.stats()["executions"]["apply_batch_change"]) == 1


def test_result_lost_breaks_the_done_get_once(aip):
    """The first GET of the done operation breaks; the next returns it."""
    name = aip.start("generate_report", sim(faults=["result_lost"]))

    def broke():
        try:
            aip.get(name)
        except http_kit.RemoteProtocolError:
            return True
        return False

    wait_until(broke)
    assert aip.get(name).json()["done"] is True


def test_stale_epoch_and_out_of_order_poll(aip):
    """The result carries epoch - 1, and one GET after completion shows done false."""
    name = aip.start(
        "generate_report",
        sim(duration_ms=30_000, faults=["stale_epoch_result", "poll_out_of_order"]),
        epoch=3,
    )
    assert aip.get(name).json()["done"] is False
    wait_until(lambda: aip.http.get("/v1/operations", params={"filter": "done=true"}).json()["operations"])
    assert aip.get(name).json()["done"] is False
    done = aip.get(name).json()
    assert done["done"] is True
    assert done["response"]["epoch"] == 2


def test_operations_are_scoped_to_their_principal(aip_factory):
    """Another principal sees NOT_FOUND and an empty list; no token is UNAUTHENTICATED."""
    with RefServer("aip-151", time_scale=0.01, tokens={"ta": "alice", "tb": "bob"}) as secure:
        alice, bob, anonymous = (
            aip_factory(secure, token="ta"),
            aip_factory(secure, token="tb"),
            aip_factory(secure),
        )
        name = alice.start("generate_report", LONG, request_id="mine")
        assert_aip_error(bob.get(name), 404, "NOT_FOUND")
        assert_aip_error(bob.http.post(f"/v1/{name}:cancel"), 404, "NOT_FOUND")
        assert bob.http.get("/v1/operations").json() == {"operations": []}
        assert_aip_error(anonymous.get(name), 401, "UNAUTHENTICATED")
        assert alice.get(name).status_code == 200
