"""Adapter options are checked once, when built, and name the offending key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.adapters.config import AdapterOptions, AipPaths, Timeouts
from engine.adapters.timestamp import millis, parse_instant
from engine.errors import ConfigError, ProtocolViolation


@pytest.mark.parametrize(
    ("build", "key"),
    [
        (lambda: Timeouts(request=timedelta(0)), "timeouts.request"),
        (lambda: AipPaths(get="/v1/operations"), "aip_paths.get"),
        (lambda: AipPaths(list="v1/operations"), "aip_paths.list"),
        (lambda: AdapterOptions(max_body_bytes=0), "max_body_bytes"),
        (lambda: AdapterOptions(max_pages=0), "max_pages"),
    ],
)
def test_bad_options_are_refused_with_the_key_named(build, key):
    """Non-positive limits and path templates without their placeholder are configuration errors."""
    with pytest.raises(ConfigError) as caught:
        build()
    assert caught.value.key == key


def test_wire_instants_are_read_as_aware_utc_and_bad_ones_are_violations():
    """``Z``, offsets and zone-less stamps all become UTC; garbage is the peer's violation."""
    assert parse_instant("2026-01-01T00:00:00Z", "t") == datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_instant("2026-01-01T02:00:00+02:00", "t") == datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_instant("2026-01-01T00:00:00", "t").tzinfo is UTC
    with pytest.raises(ProtocolViolation):
        parse_instant("tomorrow", "t")


def test_negative_or_absent_millisecond_counts_mean_not_stated():
    """A negative pollInterval or ttl is ignored rather than trusted."""
    assert millis(None) is None
    assert millis(-5) is None
    assert millis(1500) == timedelta(milliseconds=1500)
