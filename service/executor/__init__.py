"""The service's executor: one timer heap over every in-flight operation, ticks, and group commit.

Split by concern, one module each, composed in ``core.Executor``:

- ``loop``: start up, the timer heap and ticks, launching due operations, following finished advances;
- ``groups``: group commit on the writer thread, and what follows a refused write (fenced replies);
- ``leases``: how the executor shares the ledger (``Tenancy``: alone, or leased and fenced with a
  QPS budget booked in the database), chosen once from what the ledger's port says it can do;
- ``actions``: person actions (submit routed by the rollout, cancel, resubmit, answer, resolve);
- ``forwarding``: person actions on operations another executor holds (recorded here, carried out there);
- ``adoption``: rollout actions, raising the execution epoch, adopting in-flight operations.

There is one code path whatever the ledger: the executor asks its tenancy, never a backend's type.
This package must not be imported by ``engine`` or ``rollout``: the service is the composition root.
"""

from engine.errors import ServiceError
from service.executor.base import (
    CLAIM_BATCH,
    FLUSH_BATCH,
    FLUSH_DELAY,
    FLUSH_PATIENCE,
    MAX_IN_FLIGHT_REQUESTS,
    MAX_RUNNING,
    S,
    owner_name,
)
from service.executor.core import Executor

__all__ = [
    "CLAIM_BATCH",
    "FLUSH_BATCH",
    "FLUSH_DELAY",
    "FLUSH_PATIENCE",
    "MAX_IN_FLIGHT_REQUESTS",
    "MAX_RUNNING",
    "Executor",
    "S",
    "ServiceError",
    "owner_name",
]
