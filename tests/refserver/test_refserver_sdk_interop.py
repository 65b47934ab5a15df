"""The official MCP Python SDK client talks to both MCP reference servers (a wire-shape cross-check)."""

from __future__ import annotations

import pytest
from mcp import Client

from refserver.testing import RefServer


@pytest.mark.parametrize("protocol", ["mcp-2025-11-25", "mcp-2026-07-28"])
async def test_sdk_client_negotiates_lists_tools_and_calls_them(protocol):
    """The SDK's auto mode picks the right era and accepts our discover/initialize, tools/list and tools/call."""
    async with RefServer(protocol, time_scale=0.01) as server, Client(server.endpoint) as client:
        assert client.protocol_version == protocol.removeprefix("mcp-")
        tools = await client.list_tools()
        assert [t.name for t in tools.tools] == [
            "generate_report",
            "analyze_upload",
            "apply_batch_change",
            "quick_lookup",
        ]
        quick = await client.call_tool("quick_lookup", {"query": "x"})
        assert quick.structured_content is not None
        assert quick.structured_content["echo"] == {"query": "x"}
        short = await client.call_tool("generate_report", {"report": "r", "_sim": {"duration_ms": 10}})
        assert short.is_error is False
