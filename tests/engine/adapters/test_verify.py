"""Result verification: shape per version, task binding, size cap, output schema, digest."""

from __future__ import annotations

import pytest
from adapter_fakes import OUTPUT_SCHEMA, tool_result

from engine.adapters.verify import Expectation, PayloadKind, verify_outcome
from engine.errors import ProtocolViolation
from engine.model import ServerStatus, TaskId, digest_of

EXPECT = Expectation(task_id=TaskId("t-1"), max_result_bytes=100_000, output_schema=OUTPUT_SCHEMA)
TOOL_2025 = PayloadKind.MCP_2025_TOOL_RESULT


def test_a_completed_result_that_fits_its_schema_is_accepted_with_its_digest():
    """The outcome carries the payload as sent, its canonical digest, the task id and the epoch echo."""
    payload = tool_result(related="t-1", epoch=4)
    outcome = verify_outcome(
        ServerStatus.COMPLETED, payload, TOOL_2025, EXPECT, related_task_id="t-1", epoch_echo=4
    )
    assert outcome.payload == payload
    assert outcome.digest == digest_of(payload)
    assert (outcome.task_id, outcome.epoch_echo, outcome.status) == ("t-1", 4, ServerStatus.COMPLETED)


def test_a_result_for_another_task_is_refused():
    """Related-task metadata or a reply naming another task id is a violation."""
    with pytest.raises(ProtocolViolation, match="another task"):
        verify_outcome(ServerStatus.COMPLETED, tool_result(), TOOL_2025, EXPECT, related_task_id="t-2")
    with pytest.raises(ProtocolViolation, match="another task"):
        verify_outcome(ServerStatus.COMPLETED, tool_result(), TOOL_2025, EXPECT, reported_task_id="t-9")


def test_a_result_over_the_size_cap_is_refused():
    """``max_result_bytes`` bounds the canonical JSON of the outcome."""
    big = tool_result(content=[{"type": "text", "text": "x" * 200_000}])
    with pytest.raises(ProtocolViolation, match="byte limit"):
        verify_outcome(ServerStatus.COMPLETED, big, TOOL_2025, EXPECT)


def test_a_completed_result_without_structured_content_is_refused_when_a_schema_is_declared():
    """A declared outputSchema makes structuredContent mandatory on success."""
    payload = tool_result()
    del payload["structuredContent"]
    with pytest.raises(ProtocolViolation, match="no structuredContent"):
        verify_outcome(ServerStatus.COMPLETED, payload, TOOL_2025, EXPECT)


def test_structured_content_that_breaks_the_schema_is_refused_with_the_place():
    """A schema mismatch names the field that failed."""
    payload = tool_result(structuredContent={"tool": 5, "digest": "d"})
    with pytest.raises(ProtocolViolation, match="at tool"):
        verify_outcome(ServerStatus.COMPLETED, payload, TOOL_2025, EXPECT)


def test_an_is_error_result_is_not_held_to_the_output_schema():
    """Error results need not carry the success shape."""
    payload = tool_result(is_error=True, structuredContent={"unexpected": True})
    assert verify_outcome(ServerStatus.FAILED, payload, TOOL_2025, EXPECT).status is ServerStatus.FAILED
    payload_2026 = {**payload, "resultType": "complete"}
    kind = PayloadKind.MCP_2026_TOOL_RESULT
    assert verify_outcome(ServerStatus.COMPLETED, payload_2026, kind, EXPECT).status is ServerStatus.COMPLETED


def test_an_invalid_output_schema_is_reported_as_the_servers_violation():
    """A tool that publishes a broken schema cannot have its results verified."""
    expect = Expectation(task_id=None, max_result_bytes=100_000, output_schema={"type": 12})
    with pytest.raises(ProtocolViolation, match="not a valid JSON Schema"):
        verify_outcome(ServerStatus.COMPLETED, tool_result(), TOOL_2025, expect)


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        (PayloadKind.MCP_2025_TOOL_RESULT, {"content": "not a list"}),
        (PayloadKind.MCP_2025_TOOL_RESULT, {"content": [{"type": "video"}]}),
        (PayloadKind.MCP_2026_TOOL_RESULT, {"content": [], "resultType": "task"}),
        (PayloadKind.JSONRPC_ERROR, {"code": "x", "message": "m"}),
        (PayloadKind.AIP_STATUS, {"code": "CANCELLED"}),
        (PayloadKind.TASK_RECORD, {"status": "cancelled"}),
    ],
)
def test_payloads_that_do_not_parse_for_their_version_are_refused(kind, payload):
    """Each kind is parsed with its own wire model; a mismatch is a violation."""
    expect = Expectation(task_id=None, max_result_bytes=100_000)
    with pytest.raises(ProtocolViolation):
        verify_outcome(ServerStatus.FAILED, payload, kind, expect)


def test_a_2026_result_without_result_type_is_read_as_complete():
    """Servers of older versions omit resultType; 2026-07-28 says read it as complete."""
    expect = Expectation(task_id=None, max_result_bytes=100_000)
    outcome = verify_outcome(ServerStatus.COMPLETED, tool_result(), PayloadKind.MCP_2026_TOOL_RESULT, expect)
    assert "resultType" not in outcome.payload


def test_an_outcome_needs_a_terminal_status():
    """``working`` has no outcome to verify."""
    with pytest.raises(ProtocolViolation, match="terminal"):
        verify_outcome(ServerStatus.WORKING, tool_result(), TOOL_2025, EXPECT)
