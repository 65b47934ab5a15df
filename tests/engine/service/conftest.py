"""Fixtures for service tests: reference servers (one per protocol, per session) and config files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from refserver.testing import RefServer

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


def config_text(servers: dict[str, RefServer], *, global_qps: float = 100, extra: str = "") -> str:
    return f"""
global_qps = {global_qps}
rollout_salt = "test"

[poll]
default_interval_ms = 100
min_interval_ms = 20
max_interval_ms = 500
retry_backoff_ms = 50

[servers.mcp]
url = "{servers["mcp"].endpoint}"
protocol = "mcp-2025-11-25"
qps = 200

[servers.aip]
url = "{servers["aip"].url}"
protocol = "aip-151"
qps = 200

[servers.ext]
url = "{servers["ext"].endpoint}"
protocol = "mcp-2026-07-28"
qps = 200

[tools.generate_report]
server = "mcp"
side_effect_free = true

[tools.analyze_upload]
server = "aip"
side_effect_free = true

[tools.apply_batch_change]
server = "ext"
{extra}
"""


@pytest.fixture
def write_config(tmp_path: Path, servers: dict[str, RefServer]) -> Callable[..., Path]:
    def write(**kwargs: object) -> Path:
        path = tmp_path / "finality.toml"
        path.write_text(config_text(servers, **kwargs))  # type: ignore[arg-type]
        return path

    return write
