"""The AIP-151 adapter against handwritten Operation and google.rpc.Status payloads."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import http_kit
import pytest
from adapter_fakes import AIP_URL, FakeHttp, operation, options, reply_json

from engine.adapters.aip151 import Aip151Backend
from engine.adapters.base import CancelResult, Created, SubmitRequest
from engine.adapters.config import AipPaths
from engine.errors import (
    BackendRejected,
    BackendUnavailable,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
)
from engine.model import Principal, Protocol, ServerStatus, digest_of

NAME = "operations/op-1"
RESPONSE = {"@type": "type.googleapis.com/finality.ref.ToolResult", "tool": "generate_report", "epoch": 3}


def op_json(done: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": NAME, "metadata": {"requestId": "k"}}
    if done:
        body["done"] = True
    body.update(extra)
    return body


def aip_error(code: int, status: str, message: str = "nope") -> dict[str, Any]:
    return {"error": {"code": code, "status": status, "message": message, "details": []}}


def backend(fake: FakeHttp, **opts) -> Aip151Backend:
    return Aip151Backend(AIP_URL, client=fake.client(), token="tok", options=options(**opts))


def op_aip(**kw):
    return operation(protocol=Protocol.AIP_151, **kw)


async def test_negotiation_declares_cancel_and_list_and_lookup_only_where_dedupe_is_declared():
    """AIP-151 fixes CancelOperation and ListOperations; AIP-155 request_id is optional, so lookup by
    key only where the server's config declares request_id deduplication."""
    fake = FakeHttp()
    caps = await backend(fake).negotiate(Principal("alice"))
    assert (caps.tasks, caps.cancel, caps.list, caps.lookup_by_key) == (True, True, True, False)
    declared = await backend(fake, request_id_dedupe=True).negotiate(Principal("alice"))
    assert declared.lookup_by_key
    assert fake.sent == []


async def test_without_declared_dedupe_a_lookup_by_key_is_refused_and_nothing_is_sent():
    """A service that may ignore request_id is never asked to create again as a "lookup"."""
    fake = FakeHttp()
    with pytest.raises(NegotiationError, match="request_id_dedupe"):
        await backend(fake).look_up(op_aip(), {"report": "q3"})
    assert fake.sent == []


async def test_submit_posts_request_id_arguments_and_epoch_to_the_submit_template():
    """The body is ``{request_id, arguments, epoch}``; a running operation is ``Created``/WORKING."""
    fake = FakeHttp().on("POST", "/v1/tools/generate_report:run", reply_json(op_json()))
    op = op_aip()
    created = await backend(fake).submit(SubmitRequest(operation=op, arguments={"report": "q3"}))
    assert isinstance(created, Created)
    assert (created.view.task_id, created.view.status) == (NAME, ServerStatus.WORKING)
    sent = fake.sent[0]
    assert json.loads(sent.content) == {
        "request_id": op.idempotency_key,
        "arguments": {"report": "q3"},
        "epoch": 3,
    }
    assert sent.headers["authorization"] == "Bearer tok"


async def test_a_submission_that_is_already_done_carries_its_outcome():
    """done + response at once: ``Created`` whose view holds the verified outcome and epoch echo."""
    fake = FakeHttp().on(
        "POST", "/v1/tools/generate_report:run", reply_json(op_json(done=True, response=RESPONSE))
    )
    created = await backend(fake).submit(SubmitRequest(operation=op_aip(), arguments={}))
    assert isinstance(created, Created)
    outcome = created.view.outcome
    assert outcome is not None
    assert (outcome.status, outcome.payload, outcome.epoch_echo) == (ServerStatus.COMPLETED, RESPONSE, 3)
    assert outcome.digest == digest_of(RESPONSE)


async def test_configured_path_templates_are_used_instead_of_the_defaults():
    """Paths are configuration: python-api-core and the proto disagree on them."""
    paths = AipPaths(submit="/v2/run/{tool}", get="/v2/ops/{name}", cancel="/v2/ops/{name}/cancel")
    fake = FakeHttp()
    fake.on("POST", "/v2/run/generate_report", reply_json(op_json()))
    fake.on("GET", "/v2/ops/operations/op-1", reply_json(op_json()))
    fake.on("POST", "/v2/ops/operations/op-1/cancel", reply_json({}))
    adapter = backend(fake, aip_paths=paths)
    await adapter.submit(SubmitRequest(operation=op_aip(), arguments={}))
    await adapter.get(op_aip(task_id=NAME))
    await adapter.cancel(op_aip(task_id=NAME))
    assert [r.url.path for r in fake.sent] == [
        "/v2/run/generate_report",
        "/v2/ops/operations/op-1",
        "/v2/ops/operations/op-1/cancel",
    ]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (op_json(), ServerStatus.WORKING),
        (op_json(done=True, response=RESPONSE), ServerStatus.COMPLETED),
        (op_json(done=True, error={"code": 1, "message": "operation cancelled"}), ServerStatus.CANCELLED),
        (op_json(done=True, error={"code": 13, "message": "tool crashed"}), ServerStatus.FAILED),
    ],
)
async def test_get_maps_done_response_and_error_codes_to_statuses(body, status):
    """not done → working; response → completed; error code 1 → cancelled; other error → failed."""
    fake = FakeHttp().on("GET", "/v1/operations/op-1", reply_json(body))
    view = await backend(fake).get(op_aip(task_id=NAME))
    assert view.status is status
    assert (view.outcome is None) == (status is ServerStatus.WORKING)


async def test_a_failed_operation_echoes_the_epoch_in_its_error_info():
    """The epoch echo of a failure sits in ErrorInfo metadata (as a string)."""
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "X", "metadata": {"epoch": "3"}}
    err = {"code": 13, "message": "boom", "details": [info]}
    fake = FakeHttp().on("GET", "/v1/operations/op-1", reply_json(op_json(done=True, error=err)))
    outcome = await backend(fake).fetch_result(op_aip(task_id=NAME, status=ServerStatus.FAILED))
    assert (outcome.status, outcome.payload, outcome.epoch_echo) == (ServerStatus.FAILED, err, 3)


@pytest.mark.parametrize(
    ("status", "body", "headers", "error_type"),
    [
        (404, aip_error(404, "NOT_FOUND"), {}, NotFoundOnServer),
        (429, aip_error(429, "RESOURCE_EXHAUSTED"), {"retry-after": "4"}, BackendUnavailable),
        (503, aip_error(503, "UNAVAILABLE"), {}, BackendUnavailable),
        (504, aip_error(504, "DEADLINE_EXCEEDED"), {}, BackendUnavailable),
        (403, aip_error(403, "PERMISSION_DENIED"), {}, BackendRejected),
        (500, aip_error(500, "INTERNAL"), {}, BackendRejected),
        (500, {"oops": True}, {}, BackendUnavailable),
    ],
)
async def test_aip_193_errors_become_engine_errors(status, body, headers, error_type):
    """NOT_FOUND → not found; 429/503/UNAVAILABLE → unavailable; others → rejected with the status."""
    fake = FakeHttp().on("GET", "/v1/operations/op-1", reply_json(body, status, **headers))
    with pytest.raises(error_type) as caught:
        await backend(fake).get(op_aip(task_id=NAME))
    if status == 429:
        assert caught.value.retry_after == timedelta(seconds=4)
    if error_type is BackendRejected:
        assert caught.value.code == body["error"]["status"]


@pytest.mark.parametrize(
    "body",
    [
        op_json(done=True),
        op_json(done=True, response=RESPONSE, error={"code": 13}),
        op_json(response=RESPONSE),
        op_json(done=True, error={"code": 0}),
        {"done": False},
        {**op_json(), "name": "operations/other"},
        {**op_json(response=RESPONSE), "done": "yes"},
        op_json(done=True, error={"code": "13", "message": "m"}),
    ],
)
async def test_inconsistent_or_foreign_operations_are_violations(body):
    """done without a result, both results, a result while running, OK as an error, no name, wrong name."""
    fake = FakeHttp().on("GET", "/v1/operations/op-1", reply_json(body))
    with pytest.raises(ProtocolViolation):
        await backend(fake).get(op_aip(task_id=NAME))


async def test_non_json_and_wrong_content_type_replies_are_violations():
    """A 200 that is not a JSON object is the peer's violation."""

    def html(request: http_kit.Request) -> http_kit.Response:
        return http_kit.Response(200, content=b"<html></html>", headers={"content-type": "text/html"})

    fake = FakeHttp().on("GET", "/v1/operations/op-1", html)
    with pytest.raises(ProtocolViolation, match="content type"):
        await backend(fake).get(op_aip(task_id=NAME))


async def test_an_oversized_response_is_refused_at_fetch():
    """get leaves a too-large outcome off the view; fetch_result refuses it."""
    big = {**RESPONSE, "blob": "x" * 5000}
    fake = FakeHttp().on("GET", "/v1/operations/op-1", reply_json(op_json(done=True, response=big)))
    adapter = backend(fake, max_result_bytes=1000)
    view = await adapter.get(op_aip(task_id=NAME))
    assert (view.status, view.outcome) == (ServerStatus.COMPLETED, None)
    with pytest.raises(ProtocolViolation, match="byte limit"):
        await adapter.fetch_result(op_aip(task_id=NAME, status=ServerStatus.COMPLETED))


async def test_cancel_is_best_effort_and_only_acknowledged():
    """CancelOperation returns Empty; the final state shows in GetOperation."""
    fake = FakeHttp().on("POST", "/v1/operations/op-1:cancel", reply_json({}))
    assert await backend(fake).cancel(op_aip(task_id=NAME)) is CancelResult.ACKNOWLEDGED


async def test_lookup_lists_by_request_id_and_an_empty_answer_is_the_proof_of_absence():
    """Declared dedupe: ListOperations filtered by request_id; ours found, or none (None: proved absent)."""
    op = op_aip()
    ours = {**op_json(), "metadata": {"requestId": op.idempotency_key}}
    found = FakeHttp().on("GET", "/v1/operations", reply_json({"operations": [ours]}))
    view = await backend(found, request_id_dedupe=True).look_up(op, {"report": "q3"})
    assert view is not None
    assert view.task_id == NAME
    assert f'request_id = "{op.idempotency_key}"' in str(found.sent[0].url.params["filter"])
    empty = FakeHttp().on("GET", "/v1/operations", reply_json({"operations": []}))
    assert await backend(empty, request_id_dedupe=True).look_up(op, {"report": "q3"}) is None
    assert [r.method for r in empty.sent] == ["GET"]


async def test_lookup_repeats_the_submission_when_the_filter_is_refused():
    """A service that refuses the filter proves nothing: the same request_id is posted again (AIP-155)."""
    fake = FakeHttp().on("POST", "/v1/tools/generate_report:run", reply_json(op_json()))
    fake.on("GET", "/v1/operations", reply_json(aip_error(400, "INVALID_ARGUMENT"), status=400))
    op = op_aip()
    view = await backend(fake, request_id_dedupe=True).look_up(op, {"report": "q3"})
    assert view is not None
    assert view.task_id == NAME
    assert json.loads(fake.sent[-1].content)["request_id"] == op.idempotency_key


async def test_candidates_filter_by_request_id_and_follow_page_tokens():
    """ListOperations with the request_id filter, every page; another key's operation is dropped."""
    op = op_aip()
    ours = {**op_json(), "metadata": {"requestId": op.idempotency_key}}
    pages = iter(
        [
            {"operations": [ours, op_json()], "nextPageToken": "p2"},
            {"operations": [{"name": "operations/op-2"}]},
        ]
    )

    def listing(request: http_kit.Request) -> http_kit.Response:
        return http_kit.Response(200, json=next(pages))

    fake = FakeHttp().on("GET", "/v1/operations", listing)
    assert await backend(fake).candidates(op) == ["operations/op-1", "operations/op-2"]
    assert fake.sent[0].url.params["filter"] == f'request_id = "{op.idempotency_key}"'
    assert fake.sent[1].url.params["page_token"] == "p2"


async def test_candidates_fall_back_to_local_filtering_when_the_filter_is_refused():
    """INVALID_ARGUMENT for the filter: list everything, keep operations naming this key."""
    op = op_aip()
    ours = {"name": "operations/a", "metadata": {"requestId": op.idempotency_key}}
    theirs = {"name": "operations/b", "metadata": {"requestId": "someone-else"}}

    def listing(request: http_kit.Request) -> http_kit.Response:
        if "filter" in request.url.params:
            return http_kit.Response(400, json=aip_error(400, "INVALID_ARGUMENT"))
        return http_kit.Response(200, json={"operations": [ours, theirs]})

    fake = FakeHttp().on("GET", "/v1/operations", listing)
    assert await backend(fake).candidates(op) == ["operations/a"]


async def test_there_is_no_input_on_aip_151():
    """Operations cannot ask for input."""
    with pytest.raises(NegotiationError):
        await backend(FakeHttp()).answer_input(op_aip(task_id=NAME), "k", {})


def test_an_operation_has_one_spelling_its_full_resource_name():
    """A bare id and ``operations/{id}`` are the same operation; other collection paths are kept."""
    adapter = backend(FakeHttp())
    assert adapter.canonical_task_id("AuLeh1") == "operations/AuLeh1"
    assert adapter.canonical_task_id(" operations/AuLeh1 ") == "operations/AuLeh1"
    assert adapter.canonical_task_id("projects/p/operations/x") == "projects/p/operations/x"
