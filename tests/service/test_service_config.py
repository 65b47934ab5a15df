"""The service's TOML configuration is validated at start, with the offending key named."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ConfigError
from service.config import load_config, parse_config

GOOD = {
    "global_qps": 50,
    "servers": {"a": {"url": "http://127.0.0.1:9/mcp", "protocol": "mcp-2025-11-25", "qps": 10}},
    "tools": {"generate_report": {"server": "a", "side_effect_free": True, "wait_budget_s": 60}},
}


def test_good_config_parses_into_values() -> None:
    """Servers, tools and limits come out typed."""
    config = parse_config(GOOD)
    assert config.global_qps == 50
    assert config.servers["a"].qps == 10
    assert config.tools["generate_report"].ref.side_effects is False
    assert config.tools["generate_report"].wait_budget.total_seconds() == 60


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"bogus": 1}, "bogus"),
        ({"global_qps": -1}, "global_qps"),
        ({"servers": {"a": {"protocol": "mcp-2025-11-25"}}}, "servers.a.url"),
        ({"servers": {"a": {"url": "ftp://x"}}}, "servers.a.url"),
        ({"servers": {"a": {"url": "http://x", "protocol": "grpc"}}}, "servers.a.protocol"),
        ({"servers": {"a": {"url": "http://x", "qps": "fast"}}}, "servers.a.qps"),
        ({"servers": {"a": {"url": "http://x", "colour": "red"}}}, "servers.a.colour"),
        ({"tools": {"t": {"server": "nope"}}}, "tools.t.server"),
        ({"tools": {"t": {"server": "a", "side_effect_free": "yes"}}}, "tools.t.side_effect_free"),
        ({"tools": {"t": {"server": "a", "on_budget_exhausted": "explode"}}}, "tools.t.on_budget_exhausted"),
        ({"poll": {"jitter": 2}}, "poll.jitter"),
        ({"servers": {}}, "servers"),
    ],
)
def test_bad_config_names_the_offending_key(patch: dict[str, object], key: str) -> None:
    """Every mistake is refused with the key that is wrong."""
    data = {**GOOD, **patch}
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.key == key


def test_unreadable_or_non_toml_file_is_refused(tmp_path: Path) -> None:
    """A missing file or broken TOML is named as such."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[servers\nurl = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
