"""Shadow comparison: status and result content, envelope fields ignored, latency and polls recorded."""

from __future__ import annotations

from datetime import timedelta

from rollout.shadow import Side, compare, content_digest, shadow_call_node

CONTENT = {"content": [{"type": "text", "text": "done"}], "isError": False, "structuredContent": {"n": 1}}


def side(
    status: str = "completed", payload: dict[str, object] | None = None, ms: int = 100, polls: int = 3
) -> Side:
    p = payload if payload is not None else CONTENT
    return Side("op", status, "sha256:raw", content_digest(p), timedelta(milliseconds=ms), polls)


def test_envelope_fields_do_not_count_as_a_different_result() -> None:
    """The echoed epoch, related task id (_meta) and the 2026 resultType tag are protocol envelope."""
    old = {
        **CONTENT,
        "_meta": {"dev.finality/epoch": 1, "io.modelcontextprotocol/related-task": {"taskId": "a"}},
    }
    new = {**CONTENT, "_meta": {"dev.finality/epoch": 2}, "resultType": "complete"}
    assert content_digest(old) == content_digest(new)
    error_a = {"code": -32603, "message": "boom", "data": {"_meta": {"x": 1}, "reason": "R"}}
    error_b = {"code": -32603, "message": "boom", "data": {"reason": "R"}}
    assert content_digest(error_a) == content_digest(error_b)


def test_same_status_and_content_is_no_divergence_even_if_slower() -> None:
    """Latency and polls are recorded, not divergence."""
    diff = compare(side(ms=100, polls=2), side(ms=900, polls=9))
    assert not diff.diverged
    assert diff.shadow.latency - diff.primary.latency == timedelta(milliseconds=800)


def test_a_different_status_or_content_diverges() -> None:
    """Status and result content are what divergence means."""
    assert compare(side(), side("failed")).differences == ("status",)
    other = {**CONTENT, "structuredContent": {"n": 2}}
    assert compare(side(), side(payload=other)).differences == ("result",)


def test_no_result_compares_equal_to_no_result() -> None:
    """Two cancelled operations (no result payload) agree."""
    assert content_digest(None) is None
    a = Side("p", "cancelled", None, None, timedelta(0), 1)
    assert not compare(a, a).diverged


def test_shadow_call_nodes_are_their_own() -> None:
    """A shadow has its own call node id, derived from the primary's."""
    assert shadow_call_node("node-1") == "node-1#shadow"
