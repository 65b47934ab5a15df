"""Fixtures for rollout tests: an old-path and a new-path reference server (per session) and config files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rollout_kit import TIME_SCALE, rollout_config

from refserver.testing import RefServer


@pytest.fixture(scope="session")
def paths() -> Iterator[dict[str, RefServer]]:
    """``old``: MCP 2025-11-25 (the adapter being replaced); ``new``: MCP 2026-07-28 (the new adapter)."""
    started = {
        "old": RefServer("mcp-2025-11-25", time_scale=TIME_SCALE, idempotency=True, seed=1),
        "new": RefServer("mcp-2026-07-28", time_scale=TIME_SCALE, idempotency=True, seed=2),
    }
    try:
        for server in started.values():
            server.start()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture
def write_rollout_config(tmp_path: Path, paths: dict[str, RefServer]) -> Callable[..., Path]:
    def write(**kwargs: object) -> Path:
        path = tmp_path / "rollout.toml"
        path.write_text(rollout_config(paths, **kwargs))  # type: ignore[arg-type]
        return path

    return write
