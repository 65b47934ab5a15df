"""A PostgreSQL ledger's port offers leasing: with ``lease_s`` the executor shares it, leased and fenced."""

from __future__ import annotations

from engine.clock import SystemClock
from engine.ledger import open_ledger
from engine.model import Epoch
from service.executor.leases import SharedLeases, SoleOwner, tenancy_for


def test_a_ledger_that_offers_leasing_is_shared_only_when_leases_are_asked_for(pg_url: str) -> None:
    """PostgreSQL offers leasing; without lease_s the executor owns it alone, with it writes are fenced."""
    ledger = open_ledger(pg_url)
    try:
        assert ledger.leasing is ledger
        assert isinstance(tenancy_for(ledger, owner="o", token="t", lease_s=None), SoleOwner)
        shared = tenancy_for(ledger, owner="o", token="t", lease_s=5.0)
        assert isinstance(shared, SharedLeases)
        assert shared.shared
        assert shared.handle(Epoch(2)) is not ledger  # a fenced handle on the same pool
        now = SystemClock().now()
        assert shared.renew(now) == set()  # nothing leased yet
        assert shared.lease_due > now
    finally:
        ledger.close()
