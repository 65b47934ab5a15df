"""The executor: the six concerns composed into one object that owns the ledger's writes.

``Executor`` adds nothing but the choice, made once from what the ledger's port offers, of how
it shares the ledger (``leases.tenancy_for``); each concern is its own module. This module must
not grow behaviour: a new concern gets its own module and class.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.batching import BatchingLedger
from service.executor.actions import PersonActions
from service.executor.adoption import RolloutAdoption
from service.executor.forwarding import ForwardedActions
from service.executor.groups import WriteGroups
from service.executor.leases import Leases, tenancy_for
from service.executor.loop import Loop


@dataclass
class Executor(Loop, WriteGroups, Leases, PersonActions, ForwardedActions, RolloutAdoption):
    """Owns the ledger's writes while the service runs."""

    def __post_init__(self) -> None:
        self._tenancy = tenancy_for(
            self.ledger, owner=self.owner, token=self.lease_token, lease_s=self.lease_s
        )
        self._store = BatchingLedger(self.ledger)


__all__ = ["Executor"]
