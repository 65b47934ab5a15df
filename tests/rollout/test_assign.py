"""Sticky canary bucketing: stable, uniform enough, monotone in the canary size; the arm-flip report."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout.assign import BUCKETS, Arm, Key, arm_for, bucket, flip_report, percent_to_bp

keys = st.text(min_size=1, max_size=40)
salts = st.text(max_size=20)
sizes = st.integers(min_value=0, max_value=BUCKETS)


def test_bucket_is_a_stable_sha256_function_of_salt_and_key() -> None:
    """The bucket is sha256-derived (the same in every process), not Python's salted hash()."""
    expected = int.from_bytes(hashlib.sha256(b"s1\x00node-7").digest()[:8], "big") % BUCKETS
    assert bucket("node-7", "s1") == expected
    assert any(bucket(f"n{i}", "s1") != bucket(f"n{i}", "s2") for i in range(10)), "the salt must matter"


@given(keys, salts)
def test_bucket_is_in_range(key: str, salt: str) -> None:
    """Every key lands in [0, 10,000)."""
    assert 0 <= bucket(key, salt) < BUCKETS


@given(keys, salts, sizes, sizes)
def test_a_key_keeps_its_canary_arm_as_the_percentage_grows(key: str, salt: str, a: int, b: int) -> None:
    """Monotone: canary at a smaller size means canary at every larger size (sticky as the canary grows)."""
    low, high = sorted((a, b))
    if arm_for(key, salt, low) is Arm.CANARY:
        assert arm_for(key, salt, high) is Arm.CANARY
    if arm_for(key, salt, high) is Arm.CONTROL:
        assert arm_for(key, salt, low) is Arm.CONTROL


@given(keys, salts)
def test_zero_is_all_control_and_full_is_all_canary(key: str, salt: str) -> None:
    """0 basis points routes nothing to the canary, 10,000 routes everything."""
    assert arm_for(key, salt, 0) is Arm.CONTROL
    assert arm_for(key, salt, BUCKETS) is Arm.CANARY


def test_five_percent_routes_about_five_percent_of_keys() -> None:
    """Over 20,000 keys the 5 % canary takes between 4 % and 6 %."""
    share = sum(arm_for(f"call-{i}", "salt", 500) is Arm.CANARY for i in range(20_000)) / 20_000
    assert 0.04 < share < 0.06


@pytest.mark.parametrize(("percent", "bp"), [(5, 500), (12.5, 1250), (0.01, 1), (100, 10_000)])
def test_percentages_convert_to_basis_points(percent: float, bp: int) -> None:
    """Percent with up to two decimals maps to basis points."""
    assert percent_to_bp(percent) == bp


@pytest.mark.parametrize("percent", [0, -1, 100.5, 0.001])
def test_bad_percentages_are_refused(percent: float) -> None:
    """Out of range, or finer than a basis point."""
    with pytest.raises(ValueError, match="percentage"):
        percent_to_bp(percent)


@given(st.lists(keys, unique=True, max_size=60), salts, sizes, sizes)
def test_flip_report_lists_exactly_the_keys_whose_arm_changed(
    nodes: list[str], salt: str, a: int, b: int
) -> None:
    """The report names every key whose arm differs between the two sizes, and only those."""
    ks = [Key(n, f"op-{n}", "WORKING" if i % 2 else "ACCEPTED", bool(i % 2)) for i, n in enumerate(nodes)]
    report = flip_report(ks, salt, a, b)
    expected = {n for n in nodes if arm_for(n, salt, a) is not arm_for(n, salt, b)}
    assert {f.call_node for f in report.flips} == expected
    assert report.considered == len(nodes)
    assert {f.call_node for f in report.in_flight} == {k.call_node for k in ks if k.in_flight} & expected
    if a <= b:
        assert report.to_control == ()
    else:
        assert report.to_canary == ()


def test_flip_report_json_caps_lists_but_not_counts() -> None:
    """A long report lists at most ``limit`` keys per list while its counts stay exact."""
    ks = [Key(f"k{i}", f"op{i}", "WORKING", True) for i in range(500)]
    doc = flip_report(ks, "s", 0, BUCKETS).as_json(limit=10)
    assert doc["keys_flipped"] == 500
    assert doc["in_flight_affected"] == 500
    assert len(doc["flipped"]) == 10  # type: ignore[arg-type]
    assert doc["from_percent"] == 0
    assert doc["to_percent"] == 100
