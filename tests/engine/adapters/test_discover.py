"""Protocol discovery for ``--protocol auto`` and the backend factory."""

from __future__ import annotations

import http_kit
import pytest
from adapter_fakes import FakeMcp, init_result, options, result

from engine.adapters import discover, open_backend, open_client
from engine.adapters.aip151 import Aip151Backend
from engine.adapters.legacy_sync import LegacySyncBackend
from engine.adapters.mcp_2025_11_25 import Mcp2025Backend
from engine.adapters.mcp_2026_07_28 import Mcp2026Backend
from engine.errors import BackendRejected, BackendUnavailable, NegotiationError
from engine.model import Protocol

DISCOVER = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
    "cacheScope": "public",
    "ttlMs": 0,
}


def client_for(fake: FakeMcp, aip_ok: bool = False) -> http_kit.MockClient:
    def handler(request: http_kit.Request) -> http_kit.Response:
        if request.method == "GET" and request.url.path.endswith("/v1/operations"):
            if aip_ok:
                return http_kit.Response(200, json={"operations": []})
            return http_kit.Response(404, text="not found")
        return fake.handler(request)

    return http_kit.mock_client(handler)


async def test_a_2026_server_offering_the_tasks_extension_is_found_first():
    """server/discover with the extension wins."""
    fake = FakeMcp().on("server/discover", result(DISCOVER))
    assert await discover("http://x/mcp", client_for(fake), None) is Protocol.MCP_2026_07_28


async def test_a_2025_server_with_task_capabilities_is_found_by_initialize():
    """initialize declaring tasks.requests.tools.call means 2025-11-25."""
    fake = FakeMcp().on("initialize", result(init_result(), headers={"mcp-session-id": "s"}))
    assert await discover("http://x/mcp", client_for(fake), None) is Protocol.MCP_2025_11_25


async def test_an_aip_151_service_is_found_by_its_operations_listing():
    """GET {list}?page_size=1 answering JSON means AIP-151."""
    assert await discover("http://x", client_for(FakeMcp(), aip_ok=True), None) is Protocol.AIP_151


async def test_an_mcp_server_without_tasks_falls_back_to_legacy_synchronous_calls():
    """A handshake without task capabilities is a legacy synchronous server."""
    fake = FakeMcp().on("initialize", result(init_result(tasks=False), headers={"mcp-session-id": "s"}))
    assert await discover("http://x/mcp", client_for(fake), None) is Protocol.LEGACY_SYNC


async def test_an_unreachable_server_is_unavailable_not_a_guess():
    """If nothing answered, discovery says so instead of picking a protocol."""

    def down(request: http_kit.Request) -> http_kit.Response:
        raise http_kit.ConnectError("refused")

    client = http_kit.mock_client(down)
    with pytest.raises(BackendUnavailable):
        await discover("http://x", client, None)


async def test_a_server_refusing_the_token_is_rejected():
    """401 everywhere means the credentials are wrong, not that the protocol is unknown."""

    def refuse(request: http_kit.Request) -> http_kit.Response:
        return http_kit.Response(401, text="who are you")

    client = http_kit.mock_client(refuse)
    with pytest.raises(BackendRejected):
        await discover("http://x", client, "bad")


async def test_an_aip_service_refusing_the_token_is_rejected():
    """AIP-193 UNAUTHENTICATED counts as a refused credential too."""

    def refuse(request: http_kit.Request) -> http_kit.Response:
        if request.method == "GET":
            body = {"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "token"}}
            return http_kit.Response(401, json=body)
        return http_kit.Response(404, text="no")

    client = http_kit.mock_client(refuse)
    with pytest.raises(BackendRejected):
        await discover("http://x", client, "bad")


async def test_a_server_speaking_none_of_the_contracts_is_a_negotiation_error():
    """Answers that fit no contract end in NegotiationError."""
    with pytest.raises(NegotiationError, match="speaks none"):
        await discover("http://x", client_for(FakeMcp()), None)


@pytest.mark.parametrize(
    ("protocol", "cls"),
    [
        (Protocol.MCP_2025_11_25, Mcp2025Backend),
        (Protocol.MCP_2026_07_28, Mcp2026Backend),
        (Protocol.AIP_151, Aip151Backend),
        (Protocol.LEGACY_SYNC, LegacySyncBackend),
    ],
)
async def test_the_factory_opens_the_adapter_of_each_protocol(protocol, cls):
    """open_backend maps every Protocol to its adapter, which reports that protocol."""
    async with open_client() as client:
        backend = open_backend(protocol, "http://x", client=client, token=None, options=options())
    assert isinstance(backend, cls)
    assert backend.protocol is protocol
