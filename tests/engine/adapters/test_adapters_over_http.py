"""Every adapter over real HTTP against the reference servers (subprocesses, time scale 0.01).

Waits are bounded: polling sleeps 10 ms between reads and gives up after a few seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from adapter_fakes import operation

from engine.adapters import AdapterOptions, HttpClient, Timeouts, discover, open_backend, open_client
from engine.adapters.base import Backend, CancelResult, Created, Inline, ServerView, SubmitRequest
from engine.clock import SystemClock
from engine.errors import (
    BackendRejected,
    BackendUnavailable,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
)
from engine.model import Operation, Principal, Protocol, ServerStatus
from refserver.testing import RefServer

SCALE = 0.01
DEADLINE = timedelta(seconds=5)
CLOCK = SystemClock()  # the pauses between reads of a real server, each loop bounded by DEADLINE
LONG = 100_000  # unscaled ms: 1 s of real time at SCALE
ACCEPT: dict[str, object] = {"action": "accept", "content": {"approve": True}}
OPTIONS = AdapterOptions(timeouts=Timeouts(result_wait=timedelta(seconds=5)))


# At SCALE the server's default retention is 0.6 s of real time, which a loaded machine can spend
# between two polls; tasks here are kept 60 s unless a test asks for a short ttl to see expiry.
KEEP_MS = 60_000 / SCALE


def sim(**fields: Any) -> dict[str, Any]:
    return {"report": "q3", "_sim": {"ttl_ms": KEEP_MS, **fields}}


@pytest.fixture(scope="module")
def mcp25():
    with RefServer("mcp-2025-11-25", time_scale=SCALE) as server:
        yield server


@pytest.fixture(scope="module")
def mcp25_keyed():
    with RefServer("mcp-2025-11-25", time_scale=SCALE, idempotency=True, tokens={"tok-a": "alice"}) as server:
        yield server


@pytest.fixture(scope="module")
def mcp26():
    with RefServer("mcp-2026-07-28", time_scale=SCALE) as server:
        yield server


@pytest.fixture(scope="module")
def aip():
    with RefServer("aip-151", time_scale=SCALE) as server:
        yield server


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    async with open_client() as shared:
        yield shared


def url_of(server: RefServer) -> str:
    return server.url if server.protocol == "aip-151" else server.endpoint


async def opened(
    server: RefServer, client: HttpClient, protocol: Protocol, token: str | None = None
) -> Backend:
    server.reset()
    options = replace(OPTIONS, request_id_dedupe=server.dedupes_request_id)
    backend = open_backend(protocol, url_of(server), client=client, token=token, options=options)
    await backend.negotiate(Principal("alice"))
    return backend


async def start(backend: Backend, tool: str, arguments: dict[str, Any]) -> Operation:
    op = operation(tool, protocol=backend.protocol)
    created = await backend.submit(SubmitRequest(operation=op, arguments=arguments))
    assert isinstance(created, Created), created
    return replace(op, task_id=created.view.task_id, server_status=created.view.status)


async def poll(backend: Backend, op: Operation, until: Callable[[ServerView], bool]) -> ServerView:
    """Read the status every 10 ms until ``until`` holds, within DEADLINE."""
    async with asyncio.timeout(DEADLINE.total_seconds()):
        while True:
            view = await backend.get(op)
            if until(view):
                return view
            await CLOCK.sleep(timedelta(milliseconds=10))


async def finish(backend: Backend, op: Operation) -> tuple[Operation, ServerView]:
    view = await poll(backend, op, lambda v: v.status.terminal)
    return replace(op, server_status=view.status), view


async def eventually(call: Callable[[], Awaitable[Any]]) -> Any:
    """Retry a call that raised BackendUnavailable (an injected fault), within DEADLINE."""
    async with asyncio.timeout(DEADLINE.total_seconds()):
        while True:
            try:
                return await call()
            except BackendUnavailable:
                await CLOCK.sleep(timedelta(milliseconds=10))


# ------------------------------------------------------------------------------------ discovery


async def test_discovery_names_each_reference_servers_protocol(mcp25, mcp26, aip, client):
    """2026 with the extension, 2025 with tasks, AIP-151 by its listing."""
    assert await discover(url_of(mcp26), client, None) is Protocol.MCP_2026_07_28
    assert await discover(url_of(mcp25), client, None) is Protocol.MCP_2025_11_25
    assert await discover(url_of(aip), client, None) is Protocol.AIP_151


# ---------------------------------------------------------------------------------- 2025-11-25


async def test_2025_a_task_completes_and_its_verified_result_echoes_the_epoch(mcp25, client):
    """submit → poll → tasks/result: schema-checked, bound to the task, epoch echoed."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    op, _ = await finish(backend, await start(backend, "generate_report", sim(duration_ms=500)))
    outcome = await backend.fetch_result(op)
    assert outcome.status is ServerStatus.COMPLETED
    assert (outcome.task_id, outcome.epoch_echo) == (op.task_id, op.epoch)
    structured: Any = outcome.payload["structuredContent"]
    assert structured["echo"] == {"report": "q3"}
    await backend.aclose()


async def test_2025_an_input_round_is_collected_answered_and_the_task_completes(mcp25, client):
    """input_required → the elicitation from the result stream → answer → completed."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    op = await start(backend, "generate_report", sim(duration_ms=500, input_rounds=1))
    view = await poll(backend, op, lambda v: v.input_request is not None)
    assert view.status is ServerStatus.INPUT_REQUIRED
    assert view.input_request is not None
    await backend.answer_input(op, view.input_request.key, ACCEPT)
    op, view = await finish(backend, op)
    assert view.status is ServerStatus.COMPLETED
    assert mcp25.stats()["tasks"][0]["input_rounds_answered"] == 1


@pytest.mark.parametrize(("outcome", "payload_key"), [("failed", "code"), ("is_error", "isError")])
async def test_2025_failures_and_is_error_results_are_failed(mcp25, client, outcome, payload_key):
    """A JSON-RPC error and an isError result both end failed on 2025-11-25."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    op, view = await finish(
        backend, await start(backend, "generate_report", sim(duration_ms=200, outcome=outcome))
    )
    assert view.status is ServerStatus.FAILED
    result = await backend.fetch_result(op)
    assert result.status is ServerStatus.FAILED
    assert payload_key in result.payload
    assert result.epoch_echo == op.epoch


async def test_2025_cancel_confirms_then_a_second_cancel_finds_it_terminal(mcp25, client):
    """tasks/cancel success is CONFIRMED; after that -32602 is ALREADY_TERMINAL; the result is cancelled."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    op = await start(backend, "apply_batch_change", sim(duration_ms=LONG))
    assert await backend.cancel(op) is CancelResult.CONFIRMED
    assert await backend.cancel(op) is CancelResult.ALREADY_TERMINAL
    op, view = await finish(backend, op)
    assert view.status is ServerStatus.CANCELLED
    outcome = await backend.fetch_result(op)
    assert outcome.status is ServerStatus.CANCELLED


async def test_2025_an_unknown_task_id_is_not_found(mcp25, client):
    """-32602 from the real server becomes NotFoundOnServer."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    with pytest.raises(NotFoundOnServer):
        await backend.get(operation(task_id="no-such-task"))


async def test_2025_a_task_past_its_ttl_is_not_found(mcp25, client):
    """After the retention the server deletes the task; tasks/get answers -32602."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    op = await start(backend, "generate_report", sim(duration_ms=10, ttl_ms=1000))
    with pytest.raises(NotFoundOnServer):
        await poll(backend, op, lambda v: False)


async def test_2025_a_forbidden_tool_gets_no_task_and_runs_through_the_legacy_adapter(mcp25, client):
    """quick_lookup forbids tasks: the task adapter refuses, the legacy adapter answers inline."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    with pytest.raises(NegotiationError, match="forbids tasks"):
        await backend.submit(SubmitRequest(operation=operation("quick_lookup"), arguments={}))
    legacy = await opened(mcp25, client, Protocol.LEGACY_SYNC)
    op = operation("quick_lookup", protocol=Protocol.LEGACY_SYNC)
    inline = await legacy.submit(
        SubmitRequest(operation=op, arguments={"query": "x", "_sim": {"duration_ms": 10}})
    )
    assert isinstance(inline, Inline)
    assert inline.outcome.status is ServerStatus.COMPLETED
    assert inline.outcome.epoch_echo == op.epoch


@pytest.mark.parametrize(
    ("fault", "where", "error"),
    [
        ("poll_429", "get", BackendUnavailable),
        ("poll_503", "get", BackendUnavailable),
        ("connection_reset", "get", BackendUnavailable),
        ("malformed_body", "get", ProtocolViolation),
        ("result_truncated", "fetch", BackendUnavailable),
        ("result_lost", "fetch", BackendUnavailable),
    ],
)
async def test_2025_injected_faults_end_in_the_right_engine_error_and_the_next_try_works(
    mcp25, client, fault, where, error
):
    """Each fault fires once; its error is the documented one; the retry then succeeds."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    op = await start(backend, "generate_report", sim(duration_ms=100, faults=[fault]))
    if where == "get":
        with pytest.raises(error) as caught:
            await backend.get(op)
        if fault == "poll_429":
            assert caught.value.retry_after == timedelta(seconds=1)
        op, _ = await finish(backend, op)
    else:
        op, _ = await finish(backend, op)
        with pytest.raises(error):
            await backend.fetch_result(op)
    assert (await backend.fetch_result(op)).status is ServerStatus.COMPLETED


async def test_2025_a_ten_megabyte_result_is_refused(mcp25, client):
    """A result past the body cap is a violation, never accepted."""
    backend = await opened(mcp25, client, Protocol.MCP_2025_11_25)
    op, _ = await finish(
        backend, await start(backend, "generate_report", sim(duration_ms=10, result_bytes=10_000_000))
    )
    with pytest.raises(ProtocolViolation, match="byte limit"):
        await backend.fetch_result(op)


async def test_2025_a_lost_creating_response_is_found_again_by_its_key(mcp25_keyed, client):
    """create_response_lost: submit is unavailable; the keyed lookup binds the one task created."""
    backend = await opened(mcp25_keyed, client, Protocol.MCP_2025_11_25, token="tok-a")
    op = operation("generate_report")
    arguments = sim(duration_ms=200, faults=["create_response_lost"])
    with pytest.raises(BackendUnavailable):
        await backend.submit(SubmitRequest(operation=op, arguments=arguments))
    view = await backend.look_up(op, arguments)
    assert view is not None
    assert mcp25_keyed.stats()["operations_created"]["total"] == 1
    assert await backend.candidates(op) == [view.task_id]


async def test_2025_a_wrong_token_is_rejected(mcp25_keyed, client):
    """401 is a refusal with the HTTP status, not a protocol mismatch."""
    mcp25_keyed.reset()
    backend = open_backend(
        Protocol.MCP_2025_11_25, mcp25_keyed.endpoint, client=client, token="bad", options=OPTIONS
    )
    with pytest.raises(BackendRejected) as caught:
        await backend.negotiate(Principal("mallory"))
    assert caught.value.code == 401


# ---------------------------------------------------------------------------------- 2026-07-28


async def test_2026_a_task_completes_with_its_outcome_inside_tasks_get(mcp26, client):
    """The DetailedTask carries the verified result; fetch re-reads the same outcome."""
    backend = await opened(mcp26, client, Protocol.MCP_2026_07_28)
    op, view = await finish(backend, await start(backend, "generate_report", sim(duration_ms=500)))
    assert view.outcome is not None
    assert view.outcome.epoch_echo == op.epoch
    assert await backend.fetch_result(op) == view.outcome


async def test_2026_a_short_call_is_answered_inline(mcp26, client):
    """The server may skip the task; the plain result is Inline."""
    backend = await opened(mcp26, client, Protocol.MCP_2026_07_28)
    op = operation("generate_report", protocol=Protocol.MCP_2026_07_28)
    inline = await backend.submit(SubmitRequest(operation=op, arguments=sim(duration_ms=10)))
    assert isinstance(inline, Inline)
    assert inline.outcome.status is ServerStatus.COMPLETED


@pytest.mark.parametrize(
    ("outcome", "status"), [("is_error", ServerStatus.COMPLETED), ("failed", ServerStatus.FAILED)]
)
async def test_2026_is_error_completes_and_a_json_rpc_error_fails(mcp26, client, outcome, status):
    """On the extension isError is completed; failed is for JSON-RPC errors."""
    backend = await opened(mcp26, client, Protocol.MCP_2026_07_28)
    op, view = await finish(
        backend, await start(backend, "generate_report", sim(duration_ms=200, outcome=outcome))
    )
    assert view.status is status
    assert (await backend.fetch_result(op)).status is status


async def test_2026_an_input_round_is_answered_through_tasks_update(mcp26, client):
    """inputRequests → InputRequest; tasks/update answers it; the task completes."""
    backend = await opened(mcp26, client, Protocol.MCP_2026_07_28)
    op = await start(backend, "generate_report", sim(duration_ms=500, input_rounds=1))
    view = await poll(backend, op, lambda v: v.input_request is not None)
    assert view.input_request is not None
    await backend.answer_input(op, view.input_request.key, ACCEPT)
    _, view = await finish(backend, op)
    assert view.status is ServerStatus.COMPLETED


async def test_2026_cancel_is_acknowledged_and_the_task_ends_cancelled(mcp26, client):
    """The ack confirms nothing; tasks/get shows the cancelled state later."""
    backend = await opened(mcp26, client, Protocol.MCP_2026_07_28)
    op = await start(backend, "apply_batch_change", sim(duration_ms=LONG))
    assert await backend.cancel(op) is CancelResult.ACKNOWLEDGED
    _, view = await finish(backend, op)
    assert view.status is ServerStatus.CANCELLED


async def test_2026_cancel_of_a_finished_task_is_acknowledged_and_changes_nothing(mcp26, client):
    """A finished task keeps its terminal status after an acknowledged cancel."""
    backend = await opened(mcp26, client, Protocol.MCP_2026_07_28)
    op, _ = await finish(backend, await start(backend, "generate_report", sim(duration_ms=100)))
    assert await backend.cancel(op) is CancelResult.ACKNOWLEDGED
    assert (await backend.get(op)).status is ServerStatus.COMPLETED


async def test_2026_unknown_ids_and_busy_polls_map_to_engine_errors(mcp26, client):
    """-32602 → NotFoundOnServer; an injected 503 → BackendUnavailable, then the poll works."""
    backend = await opened(mcp26, client, Protocol.MCP_2026_07_28)
    with pytest.raises(NotFoundOnServer):
        await backend.get(operation(protocol=Protocol.MCP_2026_07_28, task_id="nope"))
    op = await start(backend, "generate_report", sim(duration_ms=LONG, faults=["poll_503"]))
    with pytest.raises(BackendUnavailable):
        await backend.get(op)
    assert (await backend.get(op)).status is ServerStatus.WORKING


# --------------------------------------------------------------------------------------- AIP-151


async def test_aip_an_operation_completes_with_its_response_and_epoch_echo(aip, client):
    """POST :run → GetOperation until done → response, verified, epoch echoed."""
    backend = await opened(aip, client, Protocol.AIP_151)
    op, view = await finish(backend, await start(backend, "generate_report", sim(duration_ms=300)))
    assert view.status is ServerStatus.COMPLETED
    outcome = await backend.fetch_result(op)
    assert outcome.epoch_echo == op.epoch
    structured: Any = outcome.payload["structuredContent"]
    assert structured["echo"] == {"report": "q3"}


async def test_aip_a_failed_operation_carries_its_status(aip, client):
    """done + error (code 13) is failed, with the google.rpc.Status as payload."""
    backend = await opened(aip, client, Protocol.AIP_151)
    op, view = await finish(
        backend, await start(backend, "generate_report", sim(duration_ms=100, outcome="failed"))
    )
    assert view.status is ServerStatus.FAILED
    outcome = await backend.fetch_result(op)
    assert outcome.payload["code"] == 13
    assert outcome.epoch_echo == op.epoch


async def test_aip_cancel_is_acknowledged_and_the_operation_ends_cancelled(aip, client):
    """CancelOperation is best effort; GetOperation later shows error code 1."""
    backend = await opened(aip, client, Protocol.AIP_151)
    op = await start(backend, "apply_batch_change", sim(duration_ms=LONG))
    assert await backend.cancel(op) is CancelResult.ACKNOWLEDGED
    _, view = await finish(backend, op)
    assert view.status is ServerStatus.CANCELLED


async def test_aip_a_lost_creating_response_is_found_again_by_request_id(aip, client):
    """On a service declared to dedupe request_id, the lookup by key finds the one operation created."""
    backend = await opened(aip, client, Protocol.AIP_151)
    op = operation("generate_report", protocol=Protocol.AIP_151)
    arguments = sim(duration_ms=200, faults=["create_response_lost"])
    with pytest.raises(BackendUnavailable):
        await backend.submit(SubmitRequest(operation=op, arguments=arguments))
    view = await backend.look_up(op, arguments)
    assert view is not None
    assert aip.stats()["operations_created"]["total"] == 1
    assert await backend.candidates(op) == [view.task_id]


async def test_aip_an_operation_past_its_retention_is_not_found(aip, client):
    """AIP-151 retention counts from completion; afterwards GetOperation is 404."""
    backend = await opened(aip, client, Protocol.AIP_151)
    op = await start(backend, "generate_report", sim(duration_ms=10, ttl_ms=1000))
    with pytest.raises(NotFoundOnServer):
        await poll(backend, op, lambda v: False)


async def test_aip_unknown_operations_and_rate_limits_map_to_engine_errors(aip, client):
    """404 → NotFoundOnServer; 429 with Retry-After → BackendUnavailable carrying it."""
    backend = await opened(aip, client, Protocol.AIP_151)
    with pytest.raises(NotFoundOnServer):
        await backend.get(operation(protocol=Protocol.AIP_151, task_id="operations/nope"))
    op = await start(
        backend, "generate_report", sim(duration_ms=LONG, faults=[{"name": "poll_429", "retry_after_s": 2}])
    )
    with pytest.raises(BackendUnavailable) as caught:
        await backend.get(op)
    assert caught.value.retry_after == timedelta(seconds=2)
    assert (await eventually(lambda: backend.get(op))).task_id == op.task_id
