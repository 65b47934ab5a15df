"""Protocol adapters: one ``Backend`` per wire contract version, and how to pick and open one.

``open_backend`` builds the adapter for a protocol already chosen; ``discover`` chooses it for
``--protocol auto`` by asking the server, most specific contract first. Neither ever guesses from a
URL's shape: similar-looking URLs are never the same protocol.
"""

from __future__ import annotations

from typing import assert_never

from engine.adapters import aip151, mcp_2025_11_25, mcp_2026_07_28
from engine.adapters.aip151 import Aip151Backend
from engine.adapters.base import Backend
from engine.adapters.config import AdapterOptions, AipPaths, ClientInfo, Timeouts
from engine.adapters.legacy_sync import LegacySyncBackend
from engine.adapters.mcp_2025_11_25 import Mcp2025Backend
from engine.adapters.mcp_2026_07_28 import Mcp2026Backend
from engine.adapters.negotiate import CallMode, CallPlan, plan_call
from engine.adapters.transport import AiohttpClient, HttpClient
from engine.errors import (
    BackendError,
    BackendRejected,
    BackendUnavailable,
    NegotiationError,
)
from engine.model import Protocol

# A refused credential, as HTTP status (MCP) or canonical code name (AIP-193).
_REFUSALS = frozenset({401, 403, "UNAUTHENTICATED", "PERMISSION_DENIED"})


def open_client(*, pool: int | None = None) -> HttpClient:
    """A pooled HTTP client for the adapters; ``pool`` caps connections (kept-alive ones too).

    Callers above the adapters use this instead of importing an HTTP library, so that wire concerns
    stay here (``engine.adapters.transport`` owns aiohttp).
    """
    # A pool for many operations at once: aiohttp's connector (see ``AiohttpClient``); without a
    # cap, aiohttp's default of 100 connections.
    return AiohttpClient(100 if pool is None else pool)


__all__ = [
    "AdapterOptions",
    "AipPaths",
    "CallMode",
    "CallPlan",
    "ClientInfo",
    "HttpClient",
    "Timeouts",
    "discover",
    "open_backend",
    "open_client",
    "plan_call",
]


def open_backend(
    protocol: Protocol,
    url: str,
    *,
    client: HttpClient,
    token: str | None,
    options: AdapterOptions,
) -> Backend:
    """The adapter for ``protocol`` bound to the server at ``url``.

    Args:
        protocol: the wire contract (never ``auto``: call ``discover`` first).
        url: the MCP endpoint, or the AIP-151 service root the path templates are relative to.
        client: the one pooled HTTP client; the adapter borrows it and never closes it.
        token: the server's bearer token, if it needs one.
        options: size caps, timeouts, AIP-151 paths, client identity.
    """
    match protocol:
        case Protocol.MCP_2025_11_25:
            return Mcp2025Backend(url, client=client, token=token, options=options)
        case Protocol.MCP_2026_07_28:
            return Mcp2026Backend(url, client=client, token=token, options=options)
        case Protocol.AIP_151:
            return Aip151Backend(url, client=client, token=token, options=options)
        case Protocol.LEGACY_SYNC:
            return LegacySyncBackend(url, client=client, token=token, options=options)
        case _:
            assert_never(protocol)


async def discover(
    url: str,
    client: HttpClient,
    token: str | None,
    *,
    options: AdapterOptions | None = None,
) -> Protocol:
    """Which protocol the server at ``url`` speaks, for ``--protocol auto``.

    Tries, in order: 2026-07-28 ``server/discover`` offering the tasks extension; 2025-11-25
    ``initialize`` declaring ``tasks.requests.tools.call``; an AIP-151 ``ListOperations`` answering
    JSON; then an MCP server without tasks (legacy synchronous calls, or 2026-07-28 without the
    extension, whose adapter also makes plain calls).

    Raises:
        BackendUnavailable: nothing matched and at least one probe could not reach the server.
        BackendRejected: nothing matched and the server refused our credentials (401/403).
        NegotiationError: the server answered, but speaks none of these contracts.
    """
    options = options or AdapterOptions()
    unreachable: BackendUnavailable | None = None
    refused: BackendRejected | None = None

    def note(exc: BackendError | NegotiationError) -> None:
        nonlocal unreachable, refused
        if isinstance(exc, BackendUnavailable):
            unreachable = unreachable or exc
        elif isinstance(exc, BackendRejected) and exc.code in _REFUSALS:
            refused = refused or exc

    plain_2026 = False
    try:
        extension = await mcp_2026_07_28.probe(url, client=client, token=token, options=options)
        if extension:
            return Protocol.MCP_2026_07_28
        plain_2026 = extension is False
    except (BackendError, NegotiationError) as exc:
        note(exc)

    handshake: mcp_2025_11_25.Handshake | None = None
    try:
        handshake = await mcp_2025_11_25.probe(url, client=client, token=token, options=options)
        if handshake.protocol_version == mcp_2025_11_25.PROTOCOL_VERSION and handshake.tasks_for_tools_call:
            return Protocol.MCP_2025_11_25
    except (BackendError, NegotiationError) as exc:
        note(exc)

    try:
        if await aip151.probe(url, client=client, token=token, options=options):
            return Protocol.AIP_151
    except (BackendError, NegotiationError) as exc:
        note(exc)

    if handshake is not None:
        return Protocol.LEGACY_SYNC
    if plain_2026:
        return Protocol.MCP_2026_07_28
    if refused is not None:
        raise BackendRejected(f"{url}: the server refused the credentials ({refused})", code=refused.code)
    if unreachable is not None:
        raise BackendUnavailable(
            f"{url}: could not tell the protocol ({unreachable})", unreachable.retry_after
        )
    raise NegotiationError(f"{url} speaks none of MCP 2026-07-28, MCP 2025-11-25, AIP-151 or plain MCP")
