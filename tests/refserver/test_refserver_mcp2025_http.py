"""MCP 2025-11-25 tasks over real HTTP: the core contract, then each fault, then auth and idempotency."""

from __future__ import annotations

import json

import http_kit
import jsonschema
import pytest
from mcp_types import _v2025_11_25 as wire
from refserver_clients import sse_messages, wait_until

from refserver.testing import RefServer

RELATED = "io.modelcontextprotocol/related-task"
EPOCH = "dev.finality/epoch"
LONG = {"_sim": {"duration_ms": 100_000}}  # 1 s at time scale 0.01


@pytest.fixture(scope="module")
def server():
    with RefServer("mcp-2025-11-25", time_scale=0.01, page_size=2) as running:
        yield running


@pytest.fixture(scope="module")
def secure_server():
    tokens = {"token-a": "alice", "token-b": "bob"}
    with RefServer("mcp-2025-11-25", time_scale=0.01, idempotency=True, tokens=tokens) as running:
        yield running


@pytest.fixture
def mcp(server, mcp25_factory):
    server.reset()
    return mcp25_factory(server)


def sim(**fields):
    return {"_sim": fields}


# -- core contract -----------------------------------------------------------------------------------


def test_initialize_declares_tasks_and_opens_a_session(mcp):
    """initialize answers 2025-11-25 with the tasks capabilities and an Mcp-Session-Id."""
    result = wire.InitializeResult.model_validate(mcp.initialize_result)
    assert result.protocol_version == "2025-11-25"
    assert mcp.initialize_result["capabilities"]["tasks"] == {
        "list": {},
        "cancel": {},
        "requests": {"tools": {"call": {}}},
    }
    assert "idempotency" not in mcp.initialize_result["capabilities"]["tools"]
    assert mcp.headers["mcp-session-id"]


def test_requests_need_a_known_session(server, mcp):
    """Without Mcp-Session-Id the answer is 400; with an unknown one, 404."""
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"accept": "application/json, text/event-stream"}
    assert http_kit.post(f"{server.url}/mcp", json=message, headers=headers).status_code == 400
    unknown = {**headers, "mcp-session-id": "nope"}
    assert http_kit.post(f"{server.url}/mcp", json=message, headers=unknown).status_code == 404


def test_tools_list_publishes_task_support_and_an_output_schema(mcp):
    """Each tool's taskSupport is as specified and quick_lookup has no execution field."""
    result = mcp.result("tools/list")
    wire.ListToolsResult.model_validate(result)
    support = {t["name"]: t.get("execution", {}).get("taskSupport") for t in result["tools"]}
    assert support == {
        "generate_report": "optional",
        "analyze_upload": "required",
        "apply_batch_change": "optional",
        "quick_lookup": None,
    }
    assert all("outputSchema" in t for t in result["tools"])


def test_task_completes_and_result_is_the_original_call_tool_result(mcp):
    """tools/call with a task returns CreateTaskResult; tasks/result returns the CallToolResult with epoch."""
    created = mcp.result(
        "tools/call",
        {
            "name": "generate_report",
            "arguments": {"report": "q3"},
            "task": {"ttl": 30_000},
            "_meta": {EPOCH: 5},
        },
    )
    task = wire.CreateTaskResult.model_validate(created).task
    assert task.ttl == 30_000
    mcp.wait_status(task.task_id, "completed")
    wire.GetTaskResult.model_validate(mcp.result("tasks/get", {"taskId": task.task_id}))
    result = mcp.result("tasks/result", {"taskId": task.task_id})
    wire.CallToolResult.model_validate(result)
    assert result["_meta"][RELATED] == {"taskId": task.task_id}
    assert result["_meta"][EPOCH] == 5
    assert result["structuredContent"]["echo"] == {"report": "q3"}
    schema = next(
        t["outputSchema"] for t in mcp.result("tools/list")["tools"] if t["name"] == "generate_report"
    )
    jsonschema.validate(result["structuredContent"], schema)


def test_tasks_result_blocks_until_the_task_is_terminal(mcp):
    """tasks/result on a working task answers only once the task has completed."""
    task_id = mcp.start("generate_report", sim(duration_ms=30_000))
    assert mcp.status(task_id) == "working"
    result = mcp.result("tasks/result", {"taskId": task_id})
    assert result["isError"] is False
    assert mcp.status(task_id) == "completed"


def test_failed_outcome_is_returned_as_the_same_json_rpc_error(mcp):
    """A failed task's tasks/result is the JSON-RPC error of the original call, tagged with the task."""
    task_id = mcp.start("generate_report", sim(outcome="failed"))
    assert mcp.wait_status(task_id, "completed", "failed") == "failed"
    error = mcp.error("tasks/result", {"taskId": task_id})
    assert error["code"] == -32603
    assert error["data"]["_meta"][RELATED] == {"taskId": task_id}


def test_is_error_result_marks_the_task_failed(mcp):
    """On 2025-11-25 an isError result means status failed, and tasks/result returns that result."""
    task_id = mcp.start("analyze_upload", sim(outcome="is_error"))
    assert mcp.wait_status(task_id, "completed", "failed") == "failed"
    assert mcp.result("tasks/result", {"taskId": task_id})["isError"] is True


def test_task_support_is_enforced_per_tool(mcp):
    """Task on a forbidden tool and no task on a required one get -32601; others run synchronously."""
    assert mcp.error("tools/call", {"name": "quick_lookup", "arguments": {}, "task": {}})["code"] == -32601
    assert mcp.error("tools/call", {"name": "analyze_upload", "arguments": {}})["code"] == -32601
    quick = mcp.result("tools/call", {"name": "quick_lookup", "arguments": {"query": "x"}})
    wire.CallToolResult.model_validate(quick)
    assert quick["structuredContent"]["echo"] == {"query": "x"}
    sync = mcp.result("tools/call", {"name": "apply_batch_change", "arguments": {"batch_id": "b"}})
    assert sync["isError"] is False


def test_cancel_sets_cancelled_before_replying_and_keeps_it(server, mcp):
    """tasks/cancel answers a cancelled Task; the status stays cancelled; the execution stays logged."""
    task_id = mcp.start("apply_batch_change", {"batch_id": "b9", **LONG})
    cancelled = mcp.result("tasks/cancel", {"taskId": task_id})
    assert wire.CancelTaskResult.model_validate(cancelled).status == "cancelled"
    assert mcp.status(task_id) == "cancelled"
    assert mcp.error("tasks/cancel", {"taskId": task_id})["code"] == -32602
    assert mcp.error("tasks/result", {"taskId": task_id})["code"] == -32603
    executions = server.stats()["executions"]["apply_batch_change"]
    assert [e["arguments"] for e in executions] == [{"batch_id": "b9"}]


def test_cancel_of_a_completed_task_is_refused_with_32602(mcp):
    """A terminal task cannot be cancelled and keeps its status."""
    task_id = mcp.start("generate_report")
    mcp.wait_status(task_id, "completed")
    assert mcp.error("tasks/cancel", {"taskId": task_id})["code"] == -32602
    assert mcp.status(task_id) == "completed"


def test_input_round_is_asked_on_the_result_stream_and_answered_by_a_response(mcp):
    """input_required sends elicitation/create on tasks/result's stream; the POSTed answer resumes the task."""
    task_id = mcp.start("generate_report", sim(input_rounds=1))
    mcp.wait_status(task_id, "input_required")
    with mcp.stream("tasks/result", {"taskId": task_id}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        messages = sse_messages(response)
        ask = next(messages)
        wire.ElicitRequest.model_validate(ask)
        assert ask["id"] == f"round-{task_id}-1"
        assert ask["params"]["_meta"][RELATED] == {"taskId": task_id}
        assert mcp.answer(ask["id"]).status_code == 202
        final = next(messages)
    assert final["result"]["_meta"][RELATED] == {"taskId": task_id}
    assert mcp.status(task_id) == "completed"


def test_unanswered_round_is_resent_on_each_new_result_stream(mcp):
    """A second tasks/result stream presents the same unanswered round again."""
    task_id = mcp.start("generate_report", sim(input_rounds=1))
    mcp.wait_status(task_id, "input_required")
    ids = []
    for _ in range(2):
        with mcp.stream("tasks/result", {"taskId": task_id}) as response:
            ids.append(next(sse_messages(response))["id"])
    assert ids == [f"round-{task_id}-1"] * 2


def test_declined_input_ends_the_task_with_an_error_result(mcp):
    """Declining the elicitation makes the tool report an error: failed with an isError result."""
    task_id = mcp.start("generate_report", sim(input_rounds=1))
    mcp.wait_status(task_id, "input_required")
    assert mcp.answer(f"round-{task_id}-1", action="decline").status_code == 202
    assert mcp.status(task_id) == "failed"
    assert mcp.result("tasks/result", {"taskId": task_id})["isError"] is True


def test_unknown_and_expired_task_ids_get_32602(mcp):
    """A task id never issued, or one whose ttl ran out after completion, is -32602."""
    assert mcp.error("tasks/get", {"taskId": "no-such-task"})["code"] == -32602
    task_id = mcp.start("generate_report", sim(ttl_ms=100))
    wait_until(lambda: mcp.rpc("tasks/get", {"taskId": task_id}).json().get("error"))
    assert mcp.error("tasks/result", {"taskId": task_id})["code"] == -32602


def test_tasks_list_pages_with_an_opaque_cursor(mcp):
    """tasks/list returns pages of the configured size and a nextCursor while more remain."""
    ids = [mcp.start("generate_report", LONG) for _ in range(3)]
    first = wire.ListTasksResult.model_validate(mcp.result("tasks/list"))
    assert first.next_cursor
    second = mcp.result("tasks/list", {"cursor": first.next_cursor})
    assert "nextCursor" not in second
    assert [t.task_id for t in first.tasks] + [t["taskId"] for t in second["tasks"]] == ids
    assert mcp.error("tasks/list", {"cursor": "garbage!"})["code"] == -32602


def test_bad_input_gets_clear_json_rpc_errors(mcp):
    """Non-JSON is -32700 (HTTP 400); unknown methods -32601; bad params -32602."""
    broken = mcp.http.post("/mcp", content=b"{nope", headers=mcp.headers)
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == -32700
    assert mcp.error("tasks/frobnicate")["code"] == -32601
    assert mcp.error("tools/call", {"arguments": {}})["code"] == -32602
    assert mcp.error("tools/call", {"name": "nope"})["code"] == -32602
    assert (
        mcp.error("tools/call", {"name": "generate_report", "arguments": {"_sim": {"outcome": "?"}}})["code"]
        == -32602
    )
    assert mcp.error("tasks/get", {})["code"] == -32602


def test_sse_is_used_when_the_client_prefers_it(mcp):
    """A client that ranks text/event-stream first gets one-event SSE replies."""
    message = {"jsonrpc": "2.0", "id": 99, "method": "tools/list"}
    response = mcp.post(message, headers={"accept": "text/event-stream, application/json;q=0.1"})
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "tools" in next(sse_messages(response))["result"]


# -- faults ------------------------------------------------------------------------------------------


def test_create_response_lost_breaks_the_reply_but_creates_the_task(server, mcp):
    """The creating response is cut mid-body, yet the task exists and its work ran once."""
    with pytest.raises(http_kit.RemoteProtocolError):
        mcp.rpc(
            "tools/call",
            {"name": "apply_batch_change", "arguments": sim(faults=["create_response_lost"]), "task": {}},
        )
    stats = server.stats()
    assert stats["operations_created"]["total"] == 1
    assert len(stats["executions"]["apply_batch_change"]) == 1
    assert len(mcp.result("tasks/list")["tasks"]) == 1


def test_poll_429_answers_with_retry_after(mcp):
    """poll_429 answers tasks/get with HTTP 429 and Retry-After, then polls succeed again."""
    task_id = mcp.start("generate_report", sim(faults=[{"name": "poll_429", "retry_after_s": 2}]))
    limited = mcp.rpc("tasks/get", {"taskId": task_id})
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "2"
    assert mcp.rpc("tasks/get", {"taskId": task_id}).status_code == 200


def test_poll_503_answers_with_retry_after_as_often_as_asked(mcp):
    """poll_503 with times=2 refuses two polls."""
    task_id = mcp.start("generate_report", sim(faults=[{"name": "poll_503", "times": 2, "retry_after_s": 0}]))
    codes = [mcp.rpc("tasks/get", {"taskId": task_id}).status_code for _ in range(3)]
    assert codes == [503, 503, 200]


def test_result_lost_breaks_tasks_result_then_recovers(mcp):
    """tasks/get says completed but tasks/result breaks `times` times before it delivers."""
    task_id = mcp.start("generate_report", sim(faults=[{"name": "result_lost", "times": 2}]))
    mcp.wait_status(task_id, "completed")
    for _ in range(2):
        with pytest.raises(http_kit.RemoteProtocolError):
            mcp.rpc("tasks/result", {"taskId": task_id})
    assert mcp.result("tasks/result", {"taskId": task_id})["isError"] is False


def test_result_truncated_is_a_200_with_cut_json(mcp):
    """result_truncated sends status 200 and a body that is not complete JSON."""
    task_id = mcp.start("generate_report", sim(faults=["result_truncated"]))
    mcp.wait_status(task_id, "completed")
    response = mcp.rpc("tasks/result", {"taskId": task_id})
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        response.json()


def test_complete_on_cancel_makes_the_cancel_fail_with_32602(mcp):
    """The work completes as the cancel arrives, so the cancel is refused and the result is there."""
    task_id = mcp.start(
        "generate_report", {"_sim": {"duration_ms": 100_000, "faults": ["complete_on_cancel"]}}
    )
    assert mcp.error("tasks/cancel", {"taskId": task_id})["code"] == -32602
    assert mcp.status(task_id) == "completed"


def test_cancel_ack_lost_cancels_but_breaks_the_reply(mcp):
    """The cancel takes effect; only its response is lost."""
    task_id = mcp.start("generate_report", {"_sim": {"duration_ms": 100_000, "faults": ["cancel_ack_lost"]}})
    with pytest.raises(http_kit.RemoteProtocolError):
        mcp.rpc("tasks/cancel", {"taskId": task_id})
    assert mcp.status(task_id) == "cancelled"


def test_poll_out_of_order_serves_one_stale_working_snapshot(mcp):
    """After completion, one tasks/get answers the earlier working snapshot, the next is current."""
    task_id = mcp.start("generate_report", sim(duration_ms=30_000, faults=["poll_out_of_order"]))
    assert mcp.status(task_id) == "working"
    wait_until(lambda: not any(t["status"] == "working" for t in mcp.result("tasks/list")["tasks"]))
    assert [mcp.status(task_id) for _ in range(2)] == ["working", "completed"]


def test_task_id_reused_answers_with_an_earlier_task_id(server, mcp):
    """The second create names the first task; the server really holds two tasks."""
    first = mcp.start("generate_report", LONG)
    second = mcp.start("generate_report", {"_sim": {"duration_ms": 100_000, "faults": ["task_id_reused"]}})
    assert second == first
    assert server.stats()["operations_created"]["total"] == 2


def test_input_replayed_resends_the_answered_round_once(server, mcp):
    """After the answer the same round id is sent once more; answering it again changes nothing."""
    task_id = mcp.start("generate_report", sim(duration_ms=40_000, input_rounds=1, faults=["input_replayed"]))
    mcp.wait_status(task_id, "input_required")
    with mcp.stream("tasks/result", {"taskId": task_id}) as response:
        messages = sse_messages(response)
        ask = next(messages)
        mcp.answer(ask["id"])
        replay = next(messages)
        assert replay["method"] == "elicitation/create"
        assert replay["id"] == ask["id"]
        mcp.answer(replay["id"])
        assert "result" in next(messages)
    assert server.stats()["stale_answers"] == 1


def test_not_found_before_expiry_then_found(mcp):
    """not_found_before_expiry answers -32602 for a task that exists, then finds it."""
    task_id = mcp.start("generate_report", sim(faults=[{"name": "not_found_before_expiry", "times": 1}]))
    assert mcp.error("tasks/get", {"taskId": task_id})["code"] == -32602
    assert mcp.status(task_id) in ("working", "completed")


def test_not_found_on_cancel_answers_32602_for_a_task_that_exists_and_cancels_nothing(mcp):
    """not_found_on_cancel: tasks/cancel answers -32602 once, the task works on, a second cancel takes."""
    task_id = mcp.start(
        "apply_batch_change", {"batch_id": "b10", **sim(faults=["not_found_on_cancel"], duration_ms=100_000)}
    )
    assert mcp.error("tasks/cancel", {"taskId": task_id})["code"] == -32602
    assert mcp.status(task_id) == "working"
    assert mcp.result("tasks/cancel", {"taskId": task_id})["status"] == "cancelled"


def test_expire_early_deletes_the_task_when_it_becomes_terminal(mcp):
    """expire_early: gets after completion are not found."""
    task_id = mcp.start("generate_report", sim(faults=["expire_early"]))
    wait_until(lambda: mcp.rpc("tasks/get", {"taskId": task_id}).json().get("error"))


def test_malformed_body_and_connection_reset_hit_one_later_response_each(mcp):
    """The first poll gets a reset, the second garbage JSON with a 200, the third is fine."""
    task_id = mcp.start(
        "generate_report",
        {"_sim": {"duration_ms": 100_000, "faults": ["connection_reset", "malformed_body"]}},
    )
    with pytest.raises(http_kit.RemoteProtocolError):
        mcp.rpc("tasks/get", {"taskId": task_id})
    garbage = mcp.rpc("tasks/get", {"taskId": task_id})
    assert garbage.status_code == 200
    assert garbage.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        garbage.json()
    assert mcp.status(task_id) == "working"


def test_stale_epoch_result_carries_the_previous_epoch(mcp):
    """The result of a stale_epoch_result call reports epoch - 1."""
    task_id = mcp.start("generate_report", sim(faults=["stale_epoch_result"]), _meta={EPOCH: 9})
    assert mcp.result("tasks/result", {"taskId": task_id})["_meta"][EPOCH] == 8


def test_admin_fault_plan_applies_to_new_tasks(server, mcp):
    """POST /admin/faults installs rules that arm faults on matching new tasks only."""
    server.set_faults(
        [{"fault": "poll_503", "tool": "generate_report", "count": 1, "params": {"retry_after_s": 0}}]
    )
    faulty = mcp.start("generate_report", LONG)
    clean = mcp.start("generate_report", LONG)
    assert mcp.rpc("tasks/get", {"taskId": faulty}).status_code == 503
    assert mcp.rpc("tasks/get", {"taskId": clean}).status_code == 200
    assert [f["fault"] for f in server.stats()["faults_fired"]] == ["poll_503"]


# -- auth and idempotency ----------------------------------------------------------------------------


def test_requests_without_a_valid_token_get_401(secure_server):
    """With --token configured, a request without a bearer token is 401 with WWW-Authenticate."""
    response = http_kit.post(
        f"{secure_server.url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    )
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_tasks_are_invisible_to_another_principal(secure_server, mcp25_factory):
    """Bob cannot get, fetch, cancel or list Alice's task."""
    secure_server.reset()
    alice = mcp25_factory(secure_server, token="token-a")
    bob = mcp25_factory(secure_server, token="token-b")
    task_id = alice.start("generate_report", LONG)
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        assert bob.error(method, {"taskId": task_id})["code"] == -32602
    assert bob.result("tasks/list")["tasks"] == []
    assert [t["taskId"] for t in alice.result("tasks/list")["tasks"]] == [task_id]
    assert secure_server.stats()["tasks"][0]["principal"] == "alice"


def test_idempotency_key_returns_the_original_task(secure_server, mcp25_factory):
    """A repeated idempotencyKey with the same arguments returns the same task and runs nothing new."""
    secure_server.reset()
    client = mcp25_factory(secure_server, token="token-a")
    assert client.initialize_result["capabilities"]["tools"]["idempotency"] == {}
    arguments = {"batch_id": "b1", **LONG}
    first = client.start("apply_batch_change", arguments, idempotencyKey="key-1")
    again = client.start("apply_batch_change", arguments, idempotencyKey="key-1")
    assert again == first
    error = client.error(
        "tools/call",
        {
            "name": "apply_batch_change",
            "arguments": {"batch_id": "b2"},
            "task": {},
            "idempotencyKey": "key-1",
        },
    )
    assert error["code"] == -32602
    stats = secure_server.stats()
    assert stats["operations_created"]["total"] == 1
    assert len(stats["executions"]["apply_batch_change"]) == 1
