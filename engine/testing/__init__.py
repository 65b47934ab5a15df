"""Test doubles shipped with the engine: a controllable clock and builders for requests and operations.

For tests, simulations and benchmarks only; production code never imports this module.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from engine.model import (
    CallNodeId,
    CallRequest,
    Epoch,
    Operation,
    OperationId,
    Principal,
    Protocol,
    Role,
    ToolRef,
    new_operation,
)

if TYPE_CHECKING:
    from engine.ledger.port import LedgerPort

EPOCH_START = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when told to. ``sleep`` advances it instead of waiting."""

    def __init__(self, start: datetime = EPOCH_START) -> None:
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> datetime:
        self._now += delta
        return self._now

    async def sleep(self, delay: timedelta) -> None:
        if delay > timedelta(0):
            self._now += delay


REPORT_TOOL = ToolRef(name="generate_report", version="1.0.0", descriptor_version="1", side_effects=False)
BATCH_TOOL = ToolRef(name="apply_batch_change", version="1.0.0", descriptor_version="1", side_effects=True)

_ids = itertools.count(1)


def make_request(
    call_node: str | None = None, *, tool: ToolRef = REPORT_TOOL, arguments: dict[str, object] | None = None
) -> CallRequest:
    node = call_node or f"node-{next(_ids)}"
    return CallRequest(
        call_node_id=CallNodeId(node),
        tool=tool,
        arguments=arguments if arguments is not None else {"report": node},
        principal=Principal("alice"),
    )


def make_operation(
    call_node: str | None = None,
    *,
    tool: ToolRef = REPORT_TOOL,
    protocol: Protocol = Protocol.MCP_2025_11_25,
    epoch: int = 1,
    now: datetime = EPOCH_START,
    role: Role = Role.PRIMARY,
    arguments: dict[str, object] | None = None,
) -> Operation:
    request = make_request(call_node, tool=tool, arguments=arguments)
    return new_operation(
        request,
        operation_id=OperationId(f"op-{request.call_node_id}"),
        protocol=protocol,
        adapter_version="test",
        server="http://127.0.0.1:1",
        epoch=Epoch(epoch),
        now=now,
        role=role,
    )


def acknowledge_ready(
    ledger: LedgerPort, consumer: str = "downstream", at: datetime = EPOCH_START + timedelta(seconds=5)
) -> int:
    """``consumer``'s downstream advances on every ready outbox entry and acknowledges it, as a
    consumer of the outbox API would (what the traceability gate measures). Returns how many."""
    entries = ledger.outbox_ready(consumer, None, 100_000)
    for entry in entries:
        digest = entry["result_digest"]
        ledger.ack_outbox(
            consumer,
            str(entry["call_node_id"]),
            str(entry["status"]),
            None if digest is None else str(digest),
            at,
        )
    return len(entries)


__all__ = [
    "BATCH_TOOL",
    "EPOCH_START",
    "REPORT_TOOL",
    "FakeClock",
    "acknowledge_ready",
    "make_operation",
    "make_request",
]
