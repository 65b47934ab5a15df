"""The legacy synchronous adapter: a plain tools/call, no task, nothing to poll."""

from __future__ import annotations

import http_kit
import pytest
from adapter_fakes import URL, error, init_result, mcp_2025, operation, options, raises, result, tool_result

from engine.adapters.base import Inline, SubmitRequest
from engine.adapters.legacy_sync import LegacySyncBackend
from engine.errors import BackendUnavailable, NegotiationError, NotFoundOnServer
from engine.model import Principal, Protocol, ServerStatus


def backend(fake) -> LegacySyncBackend:
    return LegacySyncBackend(URL, client=fake.client(), token=None, options=options())


def request(tool: str = "quick_lookup") -> SubmitRequest:
    return SubmitRequest(operation=operation(tool, protocol=Protocol.LEGACY_SYNC), arguments={"query": "x"})


async def test_a_synchronous_call_sends_no_task_and_returns_the_result_inline():
    """tools/call without ``task``; the CallToolResult is the inline outcome."""
    fake = mcp_2025().on("tools/call", result(tool_result(epoch=3)))
    adapter = backend(fake)
    inline = await adapter.submit(request())
    assert isinstance(inline, Inline)
    assert inline.outcome.status is ServerStatus.COMPLETED
    assert inline.outcome.epoch_echo == 3
    params = fake.calls("tools/call")[0].params
    assert "task" not in params
    assert params["_meta"] == {"dev.finality/epoch": 3}
    assert await adapter.fetch_result(request().operation) == inline.outcome


@pytest.mark.parametrize("responder", [result(tool_result(is_error=True)), error(-32603, "tool crashed")])
async def test_a_tool_error_or_json_rpc_error_is_an_inline_failure(responder):
    """isError and JSON-RPC errors are FAILED (2025-11-25 semantics)."""
    fake = mcp_2025().on("tools/call", responder)
    inline = await backend(fake).submit(request())
    assert isinstance(inline, Inline)
    assert inline.outcome.status is ServerStatus.FAILED


async def test_negotiation_accepts_older_handshake_versions_and_uses_no_tasks():
    """Plain tools/call is the same on 2025-06-18; tasks are never used here."""
    fake = mcp_2025().on("initialize", result(init_result(version="2025-06-18")))
    caps = await backend(fake).negotiate(Principal("alice"))
    assert (caps.tasks, caps.cancel, caps.lookup_by_key) == (False, False, False)


async def test_a_tool_that_requires_a_task_is_refused():
    """'required' cannot run synchronously."""
    fake = mcp_2025()
    with pytest.raises(NegotiationError, match="requires a task"):
        await backend(fake).submit(request("analyze_upload"))
    assert fake.calls("tools/call") == []


async def test_a_timed_out_synchronous_call_is_unavailable():
    """The call may have run; the error is retryable knowledge, not a verdict."""
    fake = mcp_2025().on("tools/call", raises(http_kit.ReadTimeout("slow tool")))
    with pytest.raises(BackendUnavailable):
        await backend(fake).submit(request())


async def test_there_is_nothing_to_poll_cancel_look_up_or_answer():
    """Without a task those methods refuse; an unheld outcome cannot be read back."""
    adapter = backend(mcp_2025())
    op = request().operation
    for call in (
        adapter.get(op),
        adapter.cancel(op),
        adapter.look_up(op, {}),
        adapter.answer_input(op, "k", {}),
    ):
        with pytest.raises(NegotiationError):
            await call
    assert await adapter.candidates(op) == []
    with pytest.raises(NotFoundOnServer):
        await adapter.fetch_result(op)
