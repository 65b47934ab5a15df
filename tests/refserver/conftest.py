"""Fixtures for the refserver tests: protocol clients that are closed after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from refserver_clients import AipClient, Mcp2025Client, Mcp2026Client

from refserver.testing import RefServer


@pytest.fixture
def mcp25_factory() -> Iterator[Callable[..., Mcp2025Client]]:
    clients: list[Mcp2025Client] = []

    def make(server: RefServer, **kwargs: Any) -> Mcp2025Client:
        clients.append(Mcp2025Client(server, **kwargs))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def mcp26_factory() -> Iterator[Callable[..., Mcp2026Client]]:
    clients: list[Mcp2026Client] = []

    def make(server: RefServer, **kwargs: Any) -> Mcp2026Client:
        clients.append(Mcp2026Client(server, **kwargs))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def aip_factory() -> Iterator[Callable[..., AipClient]]:
    clients: list[AipClient] = []

    def make(server: RefServer, **kwargs: Any) -> AipClient:
        clients.append(AipClient(server, **kwargs))
        return clients[-1]

    yield make
    for client in clients:
        client.close()
