"""The MCP 2026-07-28 tasks-extension adapter against handwritten wire payloads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from adapter_fakes import URL, FakeMcp, error, operation, options, result, sequence, tool_result, tools_json

from engine.adapters.base import CancelResult, Created, Inline, SubmitRequest, TaskSupport
from engine.adapters.elicitation import round_key
from engine.adapters.mcp_2026_07_28 import Mcp2026Backend
from engine.errors import BackendRejected, NegotiationError, NotFoundOnServer, ProtocolViolation
from engine.model import Principal, Protocol, ServerStatus, digest_of

EXT = "io.modelcontextprotocol/tasks"
ELICIT = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "approve?",
        "requestedSchema": {"type": "object", "properties": {"approve": {"type": "boolean"}}},
    },
}


def discover_result(*, extension: bool = True, versions: tuple[str, ...] = ("2026-07-28",)) -> dict[str, Any]:
    caps: dict[str, Any] = {"tools": {"listChanged": False}}
    if extension:
        caps["extensions"] = {EXT: {}}
    return {
        "resultType": "complete",
        "supportedVersions": list(versions),
        "capabilities": caps,
        "cacheScope": "public",
        "ttlMs": 0,
    }


def flat_task(task_id: str = "t-1", status: str = "working", **extra: Any) -> dict[str, Any]:
    return {
        "taskId": task_id,
        "status": status,
        "createdAt": "2026-01-01T00:00:00Z",
        "lastUpdatedAt": "2026-01-01T00:00:01Z",
        "ttlMs": 60_000,
        "pollIntervalMs": 500,
        **extra,
    }


def detailed(status: str, **extra: Any) -> dict[str, Any]:
    return {**flat_task(status=status), "resultType": "complete", **extra}


def fake_2026(*, extension: bool = True) -> FakeMcp:
    fake = FakeMcp()
    fake.on("server/discover", result(discover_result(extension=extension)))
    fake.on("tools/list", result({"tools": tools_json(("generate_report", None)), "resultType": "complete"}))
    return fake


def backend(fake: FakeMcp, **opts) -> Mcp2026Backend:
    return Mcp2026Backend(URL, client=fake.client(), token="tok", options=options(**opts))


def op26(**kw):
    return operation(protocol=Protocol.MCP_2026_07_28, **kw)


def submit_request() -> SubmitRequest:
    return SubmitRequest(operation=op26(), arguments={"report": "q3"})


async def test_negotiation_discovers_without_initialize_and_every_tool_is_optional():
    """server/discover then tools/list; no initialize; the extension makes tools task-capable."""
    fake = fake_2026()
    caps = await backend(fake).negotiate(Principal("alice"))
    assert [s.method for s in fake.sent] == ["server/discover", "tools/list"]
    assert (caps.tasks, caps.cancel, caps.list, caps.lookup_by_key) == (True, True, False, False)
    assert caps.tools["generate_report"].task_support is TaskSupport.OPTIONAL


async def test_every_request_carries_version_capabilities_and_routing_headers():
    """``_meta`` declares the tasks extension; MCP-Protocol-Version and Mcp-Method mirror the body."""
    fake = fake_2026()
    await backend(fake).negotiate(Principal("alice"))
    sent = fake.sent[0]
    meta = sent.params["_meta"]
    assert meta["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    assert meta["io.modelcontextprotocol/clientCapabilities"]["extensions"] == {EXT: {}}
    assert sent.request.headers["mcp-protocol-version"] == "2026-07-28"
    assert sent.request.headers["mcp-method"] == "server/discover"
    assert sent.request.headers["authorization"] == "Bearer tok"


async def test_a_server_without_2026_07_28_is_a_negotiation_error():
    """supportedVersions must list the version this adapter speaks."""
    fake = fake_2026().on("server/discover", result(discover_result(versions=("2027-01-01",))))
    with pytest.raises(NegotiationError, match="2027-01-01"):
        await backend(fake).negotiate(Principal("alice"))


async def test_a_server_without_the_extension_negotiates_no_tasks():
    """Without the extension every call is synchronous."""
    caps = await backend(fake_2026(extension=False)).negotiate(Principal("alice"))
    assert caps.tasks is False
    assert caps.tools["generate_report"].task_support is TaskSupport.FORBIDDEN


async def test_submit_returns_created_for_a_flat_task_and_names_the_tool_in_the_header():
    """A ``resultType: "task"`` answer is ``Created``; Mcp-Name carries the tool name."""
    fake = fake_2026().on("tools/call", result({**flat_task(), "resultType": "task"}))
    created = await backend(fake).submit(submit_request())
    assert isinstance(created, Created)
    assert created.view.status is ServerStatus.WORKING
    assert created.view.poll_interval == timedelta(milliseconds=500)
    sent = fake.calls("tools/call")[0]
    assert sent.request.headers["mcp-name"] == "generate_report"
    assert sent.params["_meta"]["dev.finality/epoch"] == 3
    assert "task" not in sent.params


async def test_a_plain_result_is_inline_and_is_error_still_completes():
    """The server may answer synchronously; on this version ``isError`` is ``completed``."""
    fake = fake_2026().on(
        "tools/call", result({**tool_result(is_error=True, epoch=3), "resultType": "complete"})
    )
    inline = await backend(fake).submit(submit_request())
    assert isinstance(inline, Inline)
    assert inline.outcome.status is ServerStatus.COMPLETED
    assert inline.outcome.epoch_echo == 3


@pytest.mark.parametrize("code", [-32021, -32003])
async def test_a_missing_client_capability_is_a_negotiation_error(code):
    """-32021 (and the drafts' -32003) mean the server wants a capability we did not declare."""
    data: dict[str, Any] = {"requiredCapabilities": {"extensions": {EXT: {}}}}
    fake = fake_2026().on("tools/call", error(code, "missing capability", data, status=400))
    with pytest.raises(NegotiationError, match="requires client capabilities"):
        await backend(fake).submit(submit_request())


async def test_a_synchronous_input_request_is_refused_and_an_unknown_result_type_is_a_violation():
    """Input outside a task is not supported; an unknown resultType is malformed."""
    fake = fake_2026().on("tools/call", result({"resultType": "input_required", "inputRequests": {}}))
    with pytest.raises(NegotiationError, match="input_required"):
        await backend(fake).submit(submit_request())
    fake.on("tools/call", result({"resultType": "mystery"}))
    with pytest.raises(ProtocolViolation, match="mystery"):
        await backend(fake).submit(submit_request())


async def test_get_of_a_completed_task_carries_the_verified_outcome():
    """A DetailedTask's ``result`` becomes the view's outcome; Mcp-Name is the task id."""
    payload = {**tool_result(epoch=3), "resultType": "complete"}
    fake = fake_2026().on("tasks/get", result(detailed("completed", result=payload)))
    view = await backend(fake).get(op26(task_id="t-1"))
    assert view.status is ServerStatus.COMPLETED
    assert view.outcome is not None
    assert view.outcome.digest == digest_of(payload)
    assert view.outcome.epoch_echo == 3
    assert fake.calls("tasks/get")[0].request.headers["mcp-name"] == "t-1"


async def test_get_of_a_failed_task_carries_the_error_as_a_failed_outcome():
    """``error`` on a failed DetailedTask is the failed outcome's payload."""
    err = {"code": -32603, "message": "boom", "data": {"_meta": {"dev.finality/epoch": 3}}}
    fake = fake_2026().on("tasks/get", result(detailed("failed", error=err)))
    view = await backend(fake).get(op26(task_id="t-1"))
    assert view.outcome is not None
    assert (view.outcome.status, view.outcome.payload, view.outcome.epoch_echo) == (
        ServerStatus.FAILED,
        err,
        3,
    )


async def test_a_cancelled_task_keeps_its_own_record_as_the_outcome():
    """A cancelled DetailedTask has no result; its record is what is held."""
    fake = fake_2026().on("tasks/get", result(detailed("cancelled", statusMessage="stopped")))
    view = await backend(fake).get(op26(task_id="t-1"))
    assert view.outcome is not None
    assert view.outcome.payload == {"taskId": "t-1", "status": "cancelled", "statusMessage": "stopped"}


async def test_input_required_hands_over_one_input_request_and_skips_the_one_already_answered():
    """``inputRequests`` become an InputRequest; an answered key still listed is skipped."""
    from dataclasses import replace

    fake = fake_2026().on(
        "tasks/get", result(detailed("input_required", inputRequests={"k1": ELICIT, "k2": ELICIT}))
    )
    adapter = backend(fake)
    view = await adapter.get(op26(task_id="t-1"))
    k1, k2 = (round_key(k, "elicitation/create", ELICIT["params"]) for k in ("k1", "k2"))
    assert view.input_request is not None
    assert view.input_request.key == k1
    answered = replace(op26(task_id="t-1"), input_round=1, answered_round=1, input_request_key=k1)
    view = await adapter.get(answered)
    assert view.input_request is not None
    assert view.input_request.key == k2


async def test_answering_input_sends_tasks_update_with_the_key():
    """tasks/update carries ``{taskId, inputResponses: {key: response}}`` and Mcp-Name."""
    fake = fake_2026().on("tasks/update", result({"resultType": "complete"}))
    fake.on("tasks/get", result(detailed("input_required", inputRequests={"k1": ELICIT})))
    adapter = backend(fake)
    view = await adapter.get(op26(task_id="t-1"))
    assert view.input_request is not None
    await adapter.answer_input(
        op26(task_id="t-1"), view.input_request.key, {"action": "accept", "content": {"approve": True}}
    )
    sent = fake.calls("tasks/update")[0]
    assert sent.params["inputResponses"] == {"k1": {"action": "accept", "content": {"approve": True}}}
    assert sent.request.headers["mcp-name"] == "t-1"


async def test_an_answer_after_a_restart_is_sent_only_while_its_question_is_still_open():
    """Without memory of the round, tasks/get is read again: the same question under its key gets the
    answer; a different question under the same key does not."""
    key = round_key("k1", "elicitation/create", ELICIT["params"])
    answer = {"action": "accept", "content": {"approve": True}}
    same = fake_2026().on("tasks/get", result(detailed("input_required", inputRequests={"k1": ELICIT})))
    same.on("tasks/update", result({"resultType": "complete"}))
    await backend(same).answer_input(op26(task_id="t-1"), key, answer)
    assert same.calls("tasks/update")[0].params["inputResponses"] == {"k1": answer}
    other = {**ELICIT, "params": {**ELICIT["params"], "message": "approve the second step?"}}
    moved = fake_2026().on("tasks/get", result(detailed("input_required", inputRequests={"k1": other})))
    with pytest.raises(BackendRejected, match="no longer asks"):
        await backend(moved).answer_input(op26(task_id="t-1"), key, answer)
    assert moved.calls("tasks/update") == []


@pytest.mark.parametrize("method", ["tasks/get", "tasks/cancel", "tasks/update"])
async def test_an_unknown_task_id_is_not_found_on_server(method):
    """-32602 for an unknown task id on get, cancel or update."""
    fake = fake_2026()
    if method == "tasks/update":
        # The round is still open when read; the task is gone by the time the answer arrives.
        fake.on("tasks/get", result(detailed("input_required", inputRequests={"k": ELICIT})))
    fake.on(method, error(-32602, "task not found"))
    adapter = backend(fake)
    op = op26(task_id="t-1")
    calls = {
        "tasks/get": lambda: adapter.get(op),
        "tasks/cancel": lambda: adapter.cancel(op),
        "tasks/update": lambda: adapter.answer_input(
            op, round_key("k", "elicitation/create", ELICIT["params"]), {"action": "cancel"}
        ),
    }
    with pytest.raises(NotFoundOnServer):
        await calls[method]()


@pytest.mark.parametrize(
    "body",
    [
        detailed("paused"),
        detailed("completed"),
        detailed("failed"),
        detailed("input_required"),
        {**detailed("working"), "taskId": "t-9"},
        {**detailed("working"), "ttlMs": "60000"},
    ],
)
async def test_malformed_or_foreign_detailed_tasks_are_violations(body):
    """Unknown status, a terminal task without its payload, or another task's record."""
    fake = fake_2026().on("tasks/get", result(body))
    with pytest.raises(ProtocolViolation):
        await backend(fake).get(op26(task_id="t-1"))


async def test_a_completed_result_that_fails_verification_is_reported_at_fetch_time():
    """get still reports the status; fetch_result raises the violation."""
    bad = {**tool_result(related="t-2"), "resultType": "complete"}
    fake = fake_2026().on("tasks/get", result(detailed("completed", result=bad)))
    adapter = backend(fake)
    op = op26(task_id="t-1", status=ServerStatus.COMPLETED)
    view = await adapter.get(op)
    assert (view.status, view.outcome) == (ServerStatus.COMPLETED, None)
    with pytest.raises(ProtocolViolation, match="another task"):
        await adapter.fetch_result(op)


async def test_fetching_re_reads_tasks_get_and_never_calls_tasks_result():
    """tasks/result answers -32601 on this version; the outcome comes from tasks/get."""
    payload = {**tool_result(), "resultType": "complete"}
    fake = fake_2026().on("tasks/get", result(detailed("completed", result=payload)))
    outcome = await backend(fake).fetch_result(op26(task_id="t-1", status=ServerStatus.COMPLETED))
    assert outcome.status is ServerStatus.COMPLETED
    assert fake.calls("tasks/result") == []


async def test_fetching_a_task_that_is_not_terminal_is_a_violation():
    """A terminal task must not change back."""
    fake = fake_2026().on("tasks/get", result(detailed("working")))
    with pytest.raises(ProtocolViolation, match="no outcome"):
        await backend(fake).fetch_result(op26(task_id="t-1", status=ServerStatus.COMPLETED))


async def test_cancel_is_only_ever_acknowledged_even_for_a_finished_task():
    """The extension's cancel is an empty ack; the final state shows in tasks/get."""
    fake = fake_2026().on("tasks/cancel", result({"resultType": "complete"}))
    assert (
        await backend(fake).cancel(op26(task_id="t-1", status=ServerStatus.COMPLETED))
        is CancelResult.ACKNOWLEDGED
    )


async def test_a_changing_poll_interval_and_moving_last_updated_are_reported_per_read():
    """pollIntervalMs may change between reads; each view carries the latest."""
    fake = fake_2026().on(
        "tasks/get",
        sequence(
            result(detailed("working", pollIntervalMs=400)), result(detailed("working", pollIntervalMs=900))
        ),
    )
    adapter = backend(fake)
    first = await adapter.get(op26(task_id="t-1"))
    second = await adapter.get(op26(task_id="t-1"))
    assert (first.poll_interval, second.poll_interval) == (
        timedelta(milliseconds=400),
        timedelta(milliseconds=900),
    )


async def test_no_listing_and_no_lookup_without_idempotency():
    """The extension removed tasks/list and has no idempotency key of its own."""
    adapter = backend(fake_2026())
    assert await adapter.candidates(op26()) == []
    with pytest.raises(NegotiationError, match="no lookup"):
        await adapter.look_up(op26(), {})


async def test_lookup_with_idempotency_repeats_the_call_under_the_same_key():
    """A SEP-3182 server replays the task for the same key."""
    found = discover_result()
    found["capabilities"]["tools"]["idempotency"] = {}
    fake = fake_2026().on("server/discover", result(found))
    fake.on("tools/call", result({**flat_task(task_id="t-5"), "resultType": "task"}))
    op = op26()
    view = await backend(fake).look_up(op, {"report": "q3"})
    assert view is not None
    assert view.task_id == "t-5"
    assert fake.calls("tools/call")[0].params["idempotencyKey"] == op.idempotency_key
