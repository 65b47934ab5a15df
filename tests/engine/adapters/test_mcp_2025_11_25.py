"""The MCP 2025-11-25 tasks adapter against handwritten wire payloads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from adapter_fakes import (
    T0,
    URL,
    FakeMcp,
    error,
    init_result,
    mcp_2025,
    operation,
    options,
    raw,
    result,
    sequence,
    sse,
    task_json,
    tool_result,
    tools_json,
)

from engine.adapters.base import CancelResult, Created, Inline, SubmitRequest, TaskSupport
from engine.adapters.elicitation import round_key, wire_id_of
from engine.adapters.mcp_2025_11_25 import Mcp2025Backend
from engine.errors import (
    BackendRejected,
    BackendUnavailable,
    ConfigError,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
)
from engine.model import Principal, ServerStatus, digest_of

ELICIT: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "approve step 1?",
        "requestedSchema": {"type": "object", "properties": {"approve": {"type": "boolean"}}},
        "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t-1"}},
    },
}


def backend(fake: FakeMcp, **opts) -> Mcp2025Backend:
    return Mcp2025Backend(URL, client=fake.client(), token="tok", options=options(**opts))


def submit_request(tool: str = "generate_report", **kw) -> SubmitRequest:
    return SubmitRequest(operation=operation(tool), arguments={"report": "q3"}, **kw)


# ---------------------------------------------------------------------------------- negotiation


async def test_negotiation_initializes_then_reads_every_tool_page():
    """initialize + notifications/initialized, tools/list across cursors, capabilities mapped."""
    fake = mcp_2025(idempotency=True)
    page1 = {"tools": tools_json(("generate_report", "optional")), "nextCursor": "c2"}
    page2 = {"tools": tools_json(("quick_lookup", None), ("analyze_upload", "required"))}
    fake.on("tools/list", sequence(result(page1), result(page2)))
    caps = await backend(fake).negotiate(Principal("alice"))
    assert [s.method for s in fake.sent] == [
        "initialize",
        "notifications/initialized",
        "tools/list",
        "tools/list",
    ]
    assert fake.calls("tools/list")[1].params == {"cursor": "c2"}
    assert (caps.tasks, caps.cancel, caps.list, caps.lookup_by_key) == (True, True, True, True)
    assert caps.tools["quick_lookup"].task_support is TaskSupport.FORBIDDEN
    assert caps.tools["analyze_upload"].task_support is TaskSupport.REQUIRED
    assert caps.tools["generate_report"].output_schema is not None
    assert fake.sent[2].request.headers["mcp-session-id"] == "s-1"
    assert fake.sent[2].request.headers["mcp-protocol-version"] == "2025-11-25"


async def test_a_server_without_task_capabilities_negotiates_no_tasks():
    """Absent ``tasks`` means no tasks, no cancel, no list."""
    caps = await backend(mcp_2025(tasks=False)).negotiate(Principal("alice"))
    assert (caps.tasks, caps.cancel, caps.list, caps.lookup_by_key) == (False, False, False, False)


async def test_a_server_answering_another_protocol_version_is_a_negotiation_error():
    """The adapter only speaks 2025-11-25."""
    fake = mcp_2025().on("initialize", result(init_result(version="2025-06-18")))
    with pytest.raises(NegotiationError, match="2025-06-18"):
        await backend(fake).negotiate(Principal("alice"))


async def test_a_tools_list_that_never_ends_is_a_violation():
    """A repeated cursor cannot loop the client."""
    fake = mcp_2025().on("tools/list", result({"tools": [], "nextCursor": "same"}))
    with pytest.raises(ProtocolViolation, match="repeated cursor"):
        await backend(fake).negotiate(Principal("alice"))


# --------------------------------------------------------------------------------------- submit


async def test_submit_sends_a_task_with_ttl_and_epoch_and_returns_the_created_task():
    """tools/call carries ``task.ttl`` and the epoch; the CreateTaskResult becomes ``Created``."""
    fake = mcp_2025().on("tools/call", result({"task": task_json()}))
    created = await backend(fake).submit(submit_request(ttl=timedelta(seconds=30)))
    assert isinstance(created, Created)
    params = fake.calls("tools/call")[0].params
    assert params["task"] == {"ttl": 30_000}
    assert params["_meta"] == {"dev.finality/epoch": 3}
    assert "idempotencyKey" not in params
    view = created.view
    assert (view.task_id, view.status) == ("t-1", ServerStatus.WORKING)
    assert view.poll_interval == timedelta(milliseconds=500)
    assert view.expires_at == T0 + timedelta(seconds=60)


async def test_a_creating_response_may_already_show_a_later_status():
    """The server may hand back its live record: ``completed`` right away is still ``Created``."""
    fake = mcp_2025().on("tools/call", result({"task": task_json(status="completed", ttl=None)}))
    created = await backend(fake).submit(submit_request())
    assert isinstance(created, Created)
    assert created.view.status is ServerStatus.COMPLETED
    assert created.view.expires_at is None


async def test_submit_sends_the_submission_key_when_the_server_declares_idempotency():
    """SEP-3182 servers get ``params.idempotencyKey`` = the operation's key."""
    fake = mcp_2025(idempotency=True).on("tools/call", result({"task": task_json()}))
    request = submit_request()
    await backend(fake).submit(request)
    assert fake.calls("tools/call")[0].params["idempotencyKey"] == request.operation.idempotency_key


@pytest.mark.parametrize(
    ("fake", "tool", "message"),
    [
        (mcp_2025(tasks=False), "generate_report", r"tasks\.requests\.tools\.call"),
        (mcp_2025(), "quick_lookup", "forbids tasks"),
        (mcp_2025(), "no_such_tool", "does not offer"),
    ],
)
async def test_a_task_is_never_sent_where_the_server_or_tool_did_not_declare_it(fake, tool, message):
    """Without declared support the adapter refuses before sending anything."""
    with pytest.raises(NegotiationError, match=message):
        await backend(fake).submit(submit_request(tool))
    assert fake.calls("tools/call") == []


@pytest.mark.parametrize("code", [-32601, -32600, -32602])
async def test_a_refused_task_call_is_an_inline_failure_with_the_error(code):
    """-32601, -32600 or -32602 for taskSupport misuse: the call failed before any work."""
    fake = mcp_2025().on("tools/call", error(code, "task not supported"))
    inline = await backend(fake).submit(submit_request())
    assert isinstance(inline, Inline)
    assert inline.outcome.status is ServerStatus.FAILED
    assert inline.outcome.payload == {"code": code, "message": "task not supported"}


async def test_an_is_error_result_instead_of_a_task_is_an_inline_failure():
    """A server that ignores the task (or refuses with a tool error) answers the result itself."""
    fake = mcp_2025().on("tools/call", result(tool_result(is_error=True, epoch=3)))
    backend_ = backend(fake)
    inline = await backend_.submit(submit_request())
    assert isinstance(inline, Inline)
    assert inline.outcome.status is ServerStatus.FAILED
    assert inline.outcome.epoch_echo == 3
    assert await backend_.fetch_result(operation()) == inline.outcome


async def test_a_session_the_server_forgot_is_reopened_and_the_request_sent_again():
    """404 on a session: initialize again, then repeat the request once."""
    fake = mcp_2025().on("tools/call", sequence(raw(404, b"", "text/plain"), result({"task": task_json()})))
    created = await backend(fake).submit(submit_request())
    assert isinstance(created, Created)
    assert len(fake.calls("initialize")) == 2
    assert len(fake.calls("tools/call")) == 2


# ------------------------------------------------------------------------------------------ get


async def test_get_reads_the_task_status_and_sends_the_epoch():
    """tasks/get → the task's status; the request carries taskId and the epoch."""
    fake = mcp_2025().on("tasks/get", result(task_json(status="working", pollInterval=2000)))
    view = await backend(fake).get(operation(task_id="t-1"))
    assert view.status is ServerStatus.WORKING
    assert view.poll_interval == timedelta(seconds=2)
    assert fake.calls("tasks/get")[0].params == {"taskId": "t-1", "_meta": {"dev.finality/epoch": 3}}


async def test_an_unknown_or_expired_task_id_is_not_found_on_server():
    """-32602 on tasks/get means the server does not know the task."""
    fake = mcp_2025().on("tasks/get", error(-32602, "task not found"))
    with pytest.raises(NotFoundOnServer):
        await backend(fake).get(operation(task_id="t-1"))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (task_json(status="paused"), "status"),
        (task_json(task_id="t-2"), "about task 't-2'"),
        (task_json(createdAt="yesterday"), "ISO 8601"),
        ({"taskId": "t-1"}, "GetTaskResult"),
    ],
)
async def test_a_malformed_or_foreign_status_is_a_violation(body, message):
    """Unknown status strings, another task's record, bad timestamps and missing fields are refused."""
    fake = mcp_2025().on("tasks/get", result(body))
    with pytest.raises(ProtocolViolation, match=message):
        await backend(fake).get(operation(task_id="t-1"))


async def test_input_required_collects_the_elicitation_from_a_short_result_stream():
    """While input_required, a short tasks/result stream delivers the request (JSON-RPC id 0)."""
    fake = mcp_2025()
    fake.on("tasks/get", result(task_json(status="input_required")))
    fake.on("tasks/result", sse(ELICIT))
    view = await backend(fake).get(operation(task_id="t-1"))
    assert view.status is ServerStatus.INPUT_REQUIRED
    request = view.input_request
    assert request is not None
    assert request.key == round_key("0", "elicitation/create", ELICIT["params"])
    assert wire_id_of(request.key) == "0"
    assert request.message == "approve step 1?"
    assert request.schema_digest == digest_of(ELICIT["params"]["requestedSchema"])


async def test_input_required_without_a_request_in_time_still_reports_the_status():
    """A probe that finds nothing is not an error; the next poll tries again."""
    fake = mcp_2025()
    fake.on("tasks/get", result(task_json(status="input_required")))
    fake.on("tasks/result", sse())
    view = await backend(fake).get(operation(task_id="t-1"))
    assert view.status is ServerStatus.INPUT_REQUIRED
    assert view.input_request is None


async def test_an_answer_goes_back_with_the_original_request_id_and_related_task():
    """The JSON-RPC response reuses id 0 as an integer and names the task."""
    fake = mcp_2025()
    fake.on("tasks/get", result(task_json(status="input_required")))
    fake.on("tasks/result", sse(ELICIT))
    adapter = backend(fake)
    op = operation(task_id="t-1")
    view = await adapter.get(op)
    assert view.input_request is not None
    await adapter.answer_input(op, view.input_request.key, {"action": "accept", "content": {"approve": True}})
    answer = fake.responses()[0].body
    assert answer["id"] == 0
    assert answer["result"]["action"] == "accept"
    assert answer["result"]["_meta"] == {"io.modelcontextprotocol/related-task": {"taskId": "t-1"}}


async def test_an_answer_after_a_restart_asks_the_server_for_the_request_again():
    """Without the pending request in memory, the adapter re-reads it to learn the raw id."""
    fake = mcp_2025().on("tasks/result", sse({**ELICIT, "id": "round-7"}))
    op = operation(task_id="t-1")
    key = round_key("round-7", "elicitation/create", ELICIT["params"])
    await backend(fake).answer_input(op, key, {"action": "decline"})
    assert fake.responses()[0].body["id"] == "round-7"


async def test_an_answer_is_never_sent_to_another_question_under_the_same_id():
    """After a restart the server asks a different question under the answered round's id 0: the
    answer is refused, not sent to the question it was not given for."""
    other = {**ELICIT, "params": {**ELICIT["params"], "message": "approve step 2?"}}
    fake = mcp_2025().on("tasks/result", sse(other))
    op = operation(task_id="t-1")
    first_round = round_key("0", "elicitation/create", ELICIT["params"])
    with pytest.raises(BackendRejected, match="no longer asks"):
        await backend(fake).answer_input(op, first_round, {"action": "accept", "content": {"approve": True}})
    assert fake.responses() == []


async def test_an_answer_that_is_not_an_elicitation_result_is_refused_before_sending():
    """A malformed answer is the caller's mistake and never reaches the server."""
    fake = mcp_2025()
    fake.on("tasks/get", result(task_json(status="input_required")))
    fake.on("tasks/result", sse(ELICIT))
    adapter = backend(fake)
    op = operation(task_id="t-1")
    view = await adapter.get(op)
    assert view.input_request is not None
    with pytest.raises(ConfigError):
        await adapter.answer_input(op, view.input_request.key, {"action": "maybe"})
    assert fake.responses() == []


# ------------------------------------------------------------------------------------ the result


async def test_fetching_a_completed_result_verifies_it_and_reports_the_epoch_echo():
    """tasks/result → the original CallToolResult, bound to the task, schema-checked, digested."""
    payload = tool_result(related="t-1", epoch=3)
    fake = mcp_2025().on("tasks/result", result(payload))
    outcome = await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.COMPLETED))
    assert outcome.status is ServerStatus.COMPLETED
    assert outcome.digest == digest_of(payload)
    assert (outcome.task_id, outcome.epoch_echo) == ("t-1", 3)


async def test_an_is_error_result_is_a_failure_on_this_version():
    """2025-11-25: ``isError: true`` is ``failed``."""
    fake = mcp_2025().on("tasks/result", result(tool_result(is_error=True, related="t-1")))
    outcome = await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.FAILED))
    assert outcome.status is ServerStatus.FAILED


async def test_a_json_rpc_error_result_is_a_failure_with_the_error_as_payload():
    """The original call's JSON-RPC error is the failed outcome."""
    data = {"_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t-1"}, "dev.finality/epoch": 3}}
    fake = mcp_2025().on("tasks/result", error(-32603, "tool crashed", data))
    outcome = await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.FAILED))
    assert outcome.status is ServerStatus.FAILED
    assert outcome.payload["code"] == -32603
    assert outcome.epoch_echo == 3


async def test_a_cancelled_task_without_a_stored_result_keeps_the_error_as_its_cancelled_outcome():
    """-32603 "no result" from a cancelled task is tolerated: CANCELLED, never success."""
    fake = mcp_2025().on("tasks/result", error(-32603, "task was cancelled; no result stored"))
    outcome = await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.CANCELLED))
    assert outcome.status is ServerStatus.CANCELLED
    assert outcome.payload["code"] == -32603


async def test_a_result_read_after_cancel_is_attached_as_cancelled_not_as_success():
    """Work that finished after the cancel is still a cancelled outcome."""
    fake = mcp_2025().on("tasks/result", result(tool_result(related="t-1")))
    outcome = await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.CANCELLED))
    assert outcome.status is ServerStatus.CANCELLED


async def test_a_result_for_another_task_is_a_violation():
    """Related-task metadata naming another task is refused."""
    fake = mcp_2025().on("tasks/result", result(tool_result(related="t-2")))
    with pytest.raises(ProtocolViolation, match="another task"):
        await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.COMPLETED))


async def test_a_result_that_breaks_the_output_schema_is_a_violation():
    """structuredContent must match the tool's declared outputSchema."""
    fake = mcp_2025().on("tasks/result", result(tool_result(structuredContent={"tool": 1})))
    with pytest.raises(ProtocolViolation, match="outputSchema"):
        await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.COMPLETED))


async def test_a_result_too_large_for_the_cap_is_a_violation():
    """A result over ``max_result_bytes`` is refused."""
    big = tool_result(content=[{"type": "text", "text": "x" * 5000}])
    fake = mcp_2025().on("tasks/result", result(big))
    with pytest.raises(ProtocolViolation, match="byte limit"):
        await backend(fake, max_result_bytes=1000).fetch_result(
            operation(task_id="t-1", status=ServerStatus.COMPLETED)
        )


async def test_a_result_for_an_expired_task_is_not_found():
    """-32602 from tasks/result, confirmed by tasks/get, means the task is gone."""
    fake = mcp_2025()
    fake.on("tasks/result", error(-32602, "task not found"))
    fake.on("tasks/get", error(-32602, "task not found"))
    with pytest.raises(NotFoundOnServer):
        await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.FAILED))


async def test_the_original_calls_own_invalid_params_error_stays_a_failure():
    """-32602 from tasks/result while tasks/get still knows the task is the call's own error."""
    fake = mcp_2025()
    fake.on("tasks/result", error(-32602, "bad arguments"))
    fake.on("tasks/get", result(task_json(status="failed")))
    outcome = await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.FAILED))
    assert outcome.status is ServerStatus.FAILED


async def test_an_error_for_a_completed_task_is_a_violation():
    """tasks/get said completed; an error from tasks/result contradicts it."""
    fake = mcp_2025().on("tasks/result", error(-32603, "oops"))
    with pytest.raises(ProtocolViolation, match="completed"):
        await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.COMPLETED))


async def test_a_blocking_result_that_times_out_is_unavailable_and_polling_goes_on():
    """The bounded tasks/result wait ends in ``BackendUnavailable``."""
    import http_kit
    from adapter_fakes import raises

    fake = mcp_2025().on("tasks/result", raises(http_kit.ReadTimeout("waited too long")))
    with pytest.raises(BackendUnavailable):
        await backend(fake).fetch_result(operation(task_id="t-1", status=ServerStatus.COMPLETED))


# --------------------------------------------------------------------------------------- cancel


async def test_a_successful_cancel_confirms_the_cancelled_state():
    """The server sets cancelled before replying: the reply is the evidence."""
    fake = mcp_2025().on("tasks/cancel", result(task_json(status="cancelled")))
    assert await backend(fake).cancel(operation(task_id="t-1")) is CancelResult.CONFIRMED


async def test_cancel_after_terminal_is_already_terminal_never_cancelled():
    """-32602 for a finished task: read its state, do not rewrite it."""
    fake = mcp_2025().on("tasks/cancel", error(-32602, "task already completed"))
    assert await backend(fake).cancel(operation(task_id="t-1")) is CancelResult.ALREADY_TERMINAL


async def test_a_cancel_reply_showing_another_terminal_state_is_not_a_confirmation():
    """A cancel answered with ``completed`` proves the task ended otherwise."""
    fake = mcp_2025().on("tasks/cancel", result(task_json(status="completed")))
    assert await backend(fake).cancel(operation(task_id="t-1")) is CancelResult.ALREADY_TERMINAL


async def test_cancel_is_refused_when_the_server_does_not_declare_it():
    """No ``tasks.cancel``, no tasks/cancel."""
    fake = mcp_2025()
    fake.on(
        "initialize",
        result({**init_result(), "capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}}}),
    )
    with pytest.raises(NegotiationError, match=r"tasks\.cancel"):
        await backend(fake).cancel(operation(task_id="t-1"))
    assert fake.calls("tasks/cancel") == []


# ---------------------------------------------------------------------------- lookup and listing


async def test_lookup_repeats_the_call_under_the_same_key_and_binds_the_task():
    """With idempotency, the repeat returns the same task (or creates the one task now)."""
    fake = mcp_2025(idempotency=True).on("tools/call", result({"task": task_json(task_id="t-7")}))
    op = operation()
    view = await backend(fake).look_up(op, {"report": "q3"})
    assert view is not None
    assert view.task_id == "t-7"
    assert fake.calls("tools/call")[0].params["idempotencyKey"] == op.idempotency_key


async def test_lookup_without_idempotency_is_a_negotiation_error():
    """No key lookup: a person must reconcile."""
    with pytest.raises(NegotiationError, match="no lookup"):
        await backend(mcp_2025()).look_up(operation(), {})


async def test_candidates_list_tasks_created_around_the_submission():
    """tasks/list pages are followed; tasks created long before the submission are left out."""
    fake = mcp_2025()
    old = task_json(task_id="t-old", createdAt="2025-12-31T00:00:00Z")
    page1 = {"tasks": [old, task_json(task_id="t-1")], "nextCursor": "n"}
    page2 = {"tasks": [task_json(task_id="t-2")]}
    fake.on("tasks/list", sequence(result(page1), result(page2)))
    assert await backend(fake).candidates(operation()) == ["t-1", "t-2"]


async def test_candidates_are_empty_without_task_listing():
    """No ``tasks.list``: nothing to offer."""
    fake = mcp_2025()
    fake.on(
        "initialize",
        result({**init_result(), "capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}}}),
    )
    assert await backend(fake).candidates(operation()) == []


async def test_closing_ends_the_session_but_not_the_shared_client():
    """aclose sends DELETE with the session id; the caller's client stays usable."""
    fake = mcp_2025()
    adapter = backend(fake)
    await adapter.negotiate(Principal("alice"))
    await adapter.aclose()
    assert fake.sent[-1].request.method == "DELETE"
    assert fake.sent[-1].request.headers["mcp-session-id"] == "s-1"
