"""MCP 2026-07-28 with the tasks extension over real HTTP: envelope, opt-in, tasks/get outcomes, faults."""

from __future__ import annotations

import json

import http_kit
import pytest
from refserver_clients import wait_until

from refserver.testing import RefServer

TASKS = "io.modelcontextprotocol/tasks"
EPOCH = "dev.finality/epoch"
LONG = {"_sim": {"duration_ms": 100_000}}
TIME_SCALE = 0.01


@pytest.fixture(scope="module")
def server():
    with RefServer("mcp-2026-07-28", time_scale=TIME_SCALE, idempotency=True) as running:
        yield running


@pytest.fixture
def mcp(server, mcp26_factory):
    server.reset()
    return mcp26_factory(server)


def sim(**fields):
    return {"_sim": fields}


def test_initialize_does_not_exist_and_discover_advertises_the_extension(mcp):
    """initialize is -32601; server/discover lists the tasks extension and the supported version."""
    assert mcp.error("initialize", {"protocolVersion": "2026-07-28"})["code"] == -32601
    result = mcp.result("server/discover")
    assert result["capabilities"]["extensions"] == {TASKS: {}}
    assert result["supportedVersions"] == ["2026-07-28"]
    assert result["resultType"] == "complete"
    assert result["capabilities"]["tools"]["idempotency"] == {}


def test_mismatched_or_missing_headers_are_refused_with_400(mcp):
    """Wrong Mcp-Method, missing Mcp-Name or a different MCP-Protocol-Version: HTTP 400, -32020."""
    task_id = mcp.start("generate_report", LONG)
    cases = [
        ("tools/list", {}, {"mcp-method": "tools/call"}),
        ("tasks/get", {"taskId": task_id}, {"mcp-name": None}),
        ("tasks/cancel", {"taskId": task_id}, {"mcp-name": "other-task"}),
        ("tools/list", {}, {"mcp-protocol-version": "2025-11-25"}),
    ]
    for method, params, headers in cases:
        response = mcp.rpc(method, params, headers=headers)
        assert response.status_code == 400, (method, headers)
        assert response.json()["error"]["code"] == -32020


def test_unsupported_version_is_32022_with_the_supported_list(mcp):
    """A request in an unknown version gets -32022 naming the supported versions."""
    response = mcp.rpc("tools/list", version="2099-01-01")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == -32022
    assert error["data"] == {"supported": ["2026-07-28"], "requested": "2099-01-01"}


def test_missing_envelope_is_32602(server):
    """A request without the _meta envelope is invalid params."""
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"}
    response = http_kit.post(f"{server.url}/mcp", json=message, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32602


def test_long_tool_without_opt_in_is_32021_with_required_capabilities(mcp):
    """Without the extension in clientCapabilities a long call is refused with -32021."""
    error = mcp.error("tools/call", {"name": "generate_report", "arguments": {}}, opt_in=False)
    assert error["code"] == -32021
    assert error["data"]["requiredCapabilities"] == {"extensions": {TASKS: {}}}


def test_short_calls_return_a_plain_result_even_with_opt_in(mcp):
    """quick_lookup and calls under 50 ms (unscaled) answer synchronously with resultType complete."""
    quick = mcp.result("tools/call", {"name": "quick_lookup", "arguments": {"query": "q"}})
    assert quick["resultType"] == "complete"
    short = mcp.result(
        "tools/call", {"name": "generate_report", "arguments": sim(duration_ms=10)}, opt_in=False
    )
    assert short["resultType"] == "complete"
    assert short["structuredContent"]["tool"] == "generate_report"
    assert "execution" not in mcp.result("tools/list")["tools"][0]


def test_opted_in_long_call_returns_a_flat_task_and_get_returns_the_result(mcp):
    """The create result is a flat Task; tasks/get of the completed task carries the result and epoch."""
    created = mcp.result(
        "tools/call", {"name": "generate_report", "arguments": {"report": "r"}, "_meta": {EPOCH: 4}}
    )
    assert created["resultType"] == "task"
    assert set(created) >= {"taskId", "status", "createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"}
    done = mcp.wait_status(created["taskId"], "completed")
    assert done["result"]["structuredContent"]["echo"] == {"report": "r"}
    assert done["result"]["_meta"][EPOCH] == 4
    assert done["resultType"] == "complete"


def test_is_error_completes_and_failed_is_for_json_rpc_errors(mcp):
    """isError is status completed with that result; outcome failed is status failed with an error."""
    is_error = mcp.wait_status(mcp.start("generate_report", sim(outcome="is_error")), "completed", "failed")
    assert is_error["status"] == "completed"
    assert is_error["result"]["isError"] is True
    failed = mcp.wait_status(mcp.start("generate_report", sim(outcome="failed")), "completed", "failed")
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == -32603


def test_input_requests_are_answered_with_tasks_update(mcp):
    """input_required carries inputRequests; tasks/update with the key resumes; stale keys are ignored."""
    task_id = mcp.start("generate_report", sim(input_rounds=1))
    waiting = mcp.wait_status(task_id, "input_required")
    ((key, request),) = waiting["inputRequests"].items()
    assert request["method"] == "elicitation/create"
    answer = {"action": "accept", "content": {"approve": True}}
    assert mcp.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}}) == {
        "resultType": "complete"
    }
    assert mcp.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer, "nope": answer}})
    assert mcp.wait_status(task_id, "completed")["result"]["isError"] is False


def test_cancel_is_an_ack_and_the_task_becomes_cancelled(mcp):
    """tasks/cancel acknowledges at once; the task is cancelled shortly after."""
    task_id = mcp.start("apply_batch_change", LONG)
    assert mcp.result("tasks/cancel", {"taskId": task_id}) == {"resultType": "complete"}
    assert mcp.wait_status(task_id, "cancelled", "completed")["status"] == "cancelled"


def test_cancel_of_a_finished_task_is_acknowledged_and_changes_nothing(mcp):
    """Cancelling a completed task is acked and the task stays completed."""
    task_id = mcp.start("generate_report")
    mcp.wait_status(task_id, "completed")
    assert mcp.result("tasks/cancel", {"taskId": task_id}) == {"resultType": "complete"}
    assert mcp.get(task_id)["status"] == "completed"


def test_not_found_on_cancel_answers_32602_for_a_task_that_exists_and_cancels_nothing(mcp):
    """not_found_on_cancel: tasks/cancel answers -32602 once, the task works on, a second cancel is acked."""
    task_id = mcp.start(
        "apply_batch_change", {"_sim": {"duration_ms": 100_000, "faults": ["not_found_on_cancel"]}}
    )
    assert mcp.error("tasks/cancel", {"taskId": task_id})["code"] == -32602
    assert mcp.get(task_id)["status"] == "working"
    assert mcp.result("tasks/cancel", {"taskId": task_id}) == {"resultType": "complete"}


def test_complete_on_cancel_acks_and_leaves_the_task_completed(mcp):
    """With complete_on_cancel the work finishes as the cancel arrives."""
    task_id = mcp.start(
        "generate_report", {"_sim": {"duration_ms": 100_000, "faults": ["complete_on_cancel"]}}
    )
    mcp.result("tasks/cancel", {"taskId": task_id})
    assert mcp.get(task_id)["status"] == "completed"


def test_tasks_result_and_tasks_list_do_not_exist(mcp):
    """Both methods were removed by the extension: -32601."""
    task_id = mcp.start("generate_report", LONG)
    assert mcp.error("tasks/result", {"taskId": task_id})["code"] == -32601
    assert mcp.error("tasks/list")["code"] == -32601


def test_unknown_task_is_32602(mcp):
    """tasks/get, update and cancel of an unknown id are -32602."""
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        assert mcp.error(method, {"taskId": "missing", "inputResponses": {}})["code"] == -32602


def test_poll_interval_varies_between_reads(mcp):
    """pollIntervalMs drifts a little between reads, as the extension allows."""
    task_id = mcp.start("generate_report", sim(duration_ms=100_000, poll_interval_ms=50_000))
    intervals = {mcp.get(task_id)["pollIntervalMs"] for _ in range(8)}
    assert len(intervals) > 1
    assert all(450 <= i <= 550 for i in intervals)


def test_idempotency_key_repeat_returns_the_same_task(server, mcp):
    """With --idempotency a repeated key returns the original task and nothing runs again."""
    arguments = {"batch_id": "b", **LONG}
    first = mcp.start("apply_batch_change", arguments, idempotencyKey="k")
    assert mcp.start("apply_batch_change", arguments, idempotencyKey="k") == first
    assert len(server.stats()["executions"]["apply_batch_change"]) == 1


def test_result_lost_breaks_the_get_that_carries_the_result(mcp):
    """Polls are fine while working; the first get of the completed task breaks; the next delivers."""
    task_id = mcp.start("generate_report", sim(faults=["result_lost"]))

    def broke():
        try:
            mcp.get(task_id)
        except http_kit.RemoteProtocolError:
            return True
        return False

    wait_until(broke)
    assert mcp.get(task_id)["result"]["isError"] is False


def test_result_truncated_gets_a_200_with_cut_json(mcp):
    """The get carrying the result is a 200 whose body is cut JSON."""
    task_id = mcp.start("generate_report", sim(faults=["result_truncated"]))

    def truncated():
        response = mcp.rpc("tasks/get", {"taskId": task_id})
        try:
            response.json()
        except json.JSONDecodeError:
            return response.status_code == 200
        return False

    wait_until(truncated)


def test_input_replayed_presents_the_answered_key_once_more(server, mcp):
    """After answering, one tasks/get shows the same key again; re-answering it is ignored."""
    # The replay shows only while the work after the answer is still running, so that work must
    # outlast the answer-then-get pair: sized from round trips measured now (a loaded machine gets a
    # longer segment), never shorter than 0.3 s.
    segment_s = max(0.3, 20 * mcp.round_trip_s())
    duration_ms = 2 * segment_s / TIME_SCALE * 1000  # two equal segments
    wait_s = 5 + 2 * segment_s
    task_id = mcp.start(
        "generate_report",
        sim(duration_ms=duration_ms, ttl_ms=10 * duration_ms, input_rounds=1, faults=["input_replayed"]),
    )
    key = next(iter(mcp.wait_status(task_id, "input_required", timeout_s=wait_s)["inputRequests"]))
    answer = {"action": "accept", "content": {"approve": True}}
    mcp.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}})
    replay = mcp.get(task_id)
    assert replay["status"] == "input_required"
    assert list(replay["inputRequests"]) == [key]
    mcp.result("tasks/update", {"taskId": task_id, "inputResponses": {key: answer}})
    assert mcp.wait_status(task_id, "completed", timeout_s=wait_s)
    assert server.stats()["stale_answers"] == 1


def test_bearer_tokens_bind_tasks_to_their_principal(mcp26_factory):
    """With tokens, another principal's tasks/get is -32602 and no token is 401."""
    with RefServer("mcp-2026-07-28", time_scale=0.01, tokens={"ta": "alice", "tb": "bob"}) as secure:
        alice, bob, anonymous = (
            mcp26_factory(secure, token="ta"),
            mcp26_factory(secure, token="tb"),
            mcp26_factory(secure),
        )
        task_id = alice.start("generate_report", LONG)
        assert bob.error("tasks/get", {"taskId": task_id})["code"] == -32602
        assert alice.get(task_id)["status"] == "working"
        assert anonymous.rpc("server/discover").status_code == 401
