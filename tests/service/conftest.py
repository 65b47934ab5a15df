"""Fixtures for service tests: reference servers (one per protocol, per session) and config files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from refserver.testing import RefServer
from service.testing import config_text

TIME_SCALE = 0.05


@pytest.fixture(scope="session")
def servers() -> Iterator[dict[str, RefServer]]:
    started = {
        "mcp": RefServer("mcp-2025-11-25", time_scale=TIME_SCALE, idempotency=True),
        "aip": RefServer("aip-151", time_scale=TIME_SCALE),
        "ext": RefServer("mcp-2026-07-28", time_scale=TIME_SCALE),
    }
    try:
        for server in started.values():
            server.start()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def write_config(tmp_path: Path, servers: dict[str, RefServer]) -> Callable[..., Path]:
    def write(**kwargs: object) -> Path:
        path = tmp_path / "finality.toml"
        path.write_text(config_text(servers, **kwargs))  # type: ignore[arg-type]
        return path

    return write
