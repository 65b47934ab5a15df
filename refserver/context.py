"""The state one running server shares between its routes: options, the store, auth and waiting.

Holds no protocol logic. Waiting is the one place that mixes the injected clock with real asyncio
time: a waiter sleeps until the task's next scheduled change or until a client moved some task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from starlette.requests import Request

from refserver.clock import Clock
from refserver.fault import Fault, FaultPlan
from refserver.store import StoreConfig, TaskStore
from refserver.task import Retention, Task
from refserver.wire import Delivery

SERVER_NAME = "finality-refserver"
SERVER_VERSION = "0.1.0"
EPOCH_META_KEY = "dev.finality/epoch"
# Upper bound on one sleep of a waiter, so a departed client is noticed soon.
_MAX_WAIT_S = 0.25


class Protocol(StrEnum):
    MCP_2025_11_25 = "mcp-2025-11-25"
    MCP_2026_07_28 = "mcp-2026-07-28"
    AIP_151 = "aip-151"


@dataclass(frozen=True, slots=True)
class Options:
    """Everything the command line decides."""

    protocol: Protocol
    time_scale: float = 1.0
    seed: int = 0
    idempotency: bool = False
    request_id: bool = True
    """AIP-151: honour AIP-155 ``request_id`` (deduplicate, record it, filter by it). Off: the field
    is accepted and ignored (a repeat creates a second operation; a ``request_id`` filter is 400),
    as AIP-155 allows."""
    cancel: bool = True
    """MCP 2025-11-25: declare ``tasks.cancel`` and serve ``tasks/cancel`` (off: -32601, as a server
    without the capability would answer)."""
    elicitation_id: int | str | None = None
    """MCP 2025-11-25: send every elicitation under this one JSON-RPC id (as some servers send 0),
    instead of a key unique per round; an answer then applies to whatever round the task has open."""
    tokens: Mapping[str, str] = field(default_factory=dict)
    page_size: int = 50
    plan_json: object = None

    def store_config(self) -> StoreConfig:
        if self.protocol is Protocol.MCP_2025_11_25:
            return StoreConfig(self.time_scale, Retention.FROM_CREATION, is_error_fails=True)
        if self.protocol is Protocol.MCP_2026_07_28:
            return StoreConfig(
                self.time_scale, Retention.FROM_CREATION, is_error_fails=False, vary_intervals=True
            )
        return StoreConfig(self.time_scale, Retention.FROM_COMPLETION, is_error_fails=False)

    def initial_plan(self) -> FaultPlan:
        if self.plan_json is None:
            return FaultPlan(seed=self.seed)
        return FaultPlan.from_json(self.plan_json, default_seed=self.seed)


class Unauthenticated(Exception):
    """The request lacks a bearer token this server knows."""


class ServerContext:
    def __init__(self, options: Options, clock: Clock, *, new_id: Callable[[], str] | None = None) -> None:
        self.options = options
        self.clock = clock
        ids = {} if new_id is None else {"new_id": new_id}
        self.store = TaskStore(
            clock, options.store_config(), seed=options.seed, plan=options.initial_plan(), **ids
        )
        self._changed = asyncio.Event()

    def principal(self, request: Request) -> str | None:
        """The principal behind the request's bearer token; ``None`` when the server has no tokens.

        Raises:
            Unauthenticated: tokens are configured and the request has none of them.
        """
        if not self.options.tokens:
            return None
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        principal = self.options.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if principal is None:
            raise Unauthenticated("a valid 'Authorization: Bearer <token>' header is required")
        return principal

    def reset(self) -> None:
        self.store.reset(self.options.initial_plan())
        self.notify()

    def notify(self) -> None:
        """Wake every waiter: some task may have moved because of a client request."""
        self._changed.set()
        self._changed = asyncio.Event()

    def refresh(self, task: Task) -> Task:
        self.store.lookup(task.task_id, task.principal)
        return task

    async def wait_until(self, task: Task, request: Request, done: Callable[[Task], bool]) -> bool:
        """Wait until ``done(task)`` holds (task refreshed first); ``False`` if the client disconnected."""
        while not done(self.refresh(task)):
            if await request.is_disconnected():
                return False
            next_at = task.next_event_at()
            timeout = _MAX_WAIT_S
            if next_at is not None:
                timeout = min(timeout, max(0.0, next_at - self.clock.monotonic()))
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)
        return True

    def scaled_s(self, ms: float) -> float:
        return ms * self.options.time_scale / 1000.0

    def delivery_for(self, task: Task, where: str) -> tuple[Delivery, float]:
        """The generic faults of a non-creating request on ``task``: reset, garbage and delay."""
        delay_s = 0.0
        slow = task.faults.take(Fault.SLOW_RESPONSE, where)
        if slow is not None:
            delay_s = self.scaled_s(slow.delay_ms)
        if task.faults.take(Fault.CONNECTION_RESET, where):
            return Delivery.BROKEN, delay_s
        if task.faults.take(Fault.MALFORMED_BODY, where):
            return Delivery.GARBAGE, delay_s
        return Delivery.NORMAL, delay_s

    def create_delivery(self, task: Task) -> tuple[Delivery, float]:
        """Faults of the creating response: only ``create_response_lost`` and ``slow_response``."""
        delay_s = 0.0
        slow = task.faults.take(Fault.SLOW_RESPONSE, "create")
        if slow is not None:
            delay_s = self.scaled_s(slow.delay_ms)
        if task.faults.take(Fault.CREATE_RESPONSE_LOST, "create"):
            return Delivery.BROKEN, delay_s
        return Delivery.NORMAL, delay_s


__all__ = [
    "EPOCH_META_KEY",
    "SERVER_NAME",
    "SERVER_VERSION",
    "Options",
    "Protocol",
    "ServerContext",
    "Unauthenticated",
]
