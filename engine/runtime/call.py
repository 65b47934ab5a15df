"""Drive one tool call to its end with the same driver the service uses (``finality call``).

Negotiates first, records the operation before sending anything, then advances it until it holds a
receipt, waits for a person (input, reconciliation), or the caller's wait budget runs out. Running
it again for the same call node resumes that operation; it never submits a second one. Leaving
(budget spent, Ctrl-C) only stops local waiting: it is never a cancel.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from engine.adapters import (
    AdapterOptions,
    CallMode,
    HttpClient,
    discover,
    open_backend,
    open_client,
    plan_call,
)
from engine.adapters.base import Backend, Json
from engine.clock import Clock
from engine.errors import ConfigError, NegotiationError, StaleRound
from engine.model import (
    RECEIPT_STATES,
    CallNodeId,
    CallRequest,
    Epoch,
    LocalState,
    Operation,
    OperationId,
    Principal,
    Protocol,
    ToolRef,
    new_operation,
    request_mismatch,
)
from engine.runtime.driver import Driver, Wake
from engine.schedule import PollPolicy

ADAPTER_VERSION = "finality-0.1"
_CANCELLABLE = frozenset({LocalState.WORKING, LocalState.INPUT_REQUIRED})

if TYPE_CHECKING:  # both ledgers (DuckDB, PostgreSQL) offer this port
    from engine.ledger.port import LedgerPort


@dataclass(frozen=True, slots=True)
class CallSpec:
    """What ``finality call`` was asked to do."""

    server: str
    protocol: str
    tool: ToolRef
    arguments: Json
    call_node: str
    principal: str = "anonymous"
    token: str | None = None
    wait_budget: timedelta = timedelta(minutes=15)
    cancel_after: timedelta | None = None
    sync_limit: timedelta | None = None
    answer: Json | None = None
    """Answer every input round with this (actor ``cli``); without it the call stops at the first round."""
    epoch: int = 1
    options: AdapterOptions = field(default_factory=AdapterOptions)
    policy: PollPolicy = field(default_factory=PollPolicy)
    seed: int | None = None


async def choose_protocol(spec: CallSpec, client: HttpClient) -> Protocol:
    if spec.protocol == "auto":
        return await discover(spec.server, client, spec.token, options=spec.options)
    try:
        return Protocol(spec.protocol)
    except ValueError as exc:
        raise ConfigError("--protocol", f"unknown protocol {spec.protocol!r}") from exc


async def run_call(spec: CallSpec, ledger: LedgerPort, clock: Clock) -> Operation:
    """Drive the call to a receipt, a person, or the end of the wait budget; return the operation.

    Raises:
        NegotiationError: the server or tool cannot run this call within the caller's limits
            (nothing was recorded or sent); ``CancelUnsupported`` when ``cancel_after`` was asked
            of a server that declares no cancel.
        ConfigError: bad arguments.
    """
    async with open_client() as client:
        existing = ledger.by_call_node(spec.call_node)
        if existing is not None:
            refuse_other_request(existing, spec)
            protocol = existing.protocol
            backend = open_backend(
                protocol, spec.server, client=client, token=spec.token, options=spec.options
            )
            return await _drive(spec, ledger, clock, backend, existing, fresh_arguments=None)
        protocol = await choose_protocol(spec, client)
        backend = open_backend(protocol, spec.server, client=client, token=spec.token, options=spec.options)
        caps = await backend.negotiate(Principal(spec.principal))
        plan = plan_call(caps, spec.tool.name, sync_limit=spec.sync_limit, wait_budget=spec.wait_budget)
        if plan.mode is CallMode.SYNC and protocol is Protocol.MCP_2025_11_25:
            protocol = Protocol.LEGACY_SYNC
            backend = open_backend(
                protocol, spec.server, client=client, token=spec.token, options=spec.options
            )
            await backend.negotiate(Principal(spec.principal))
        elif plan.mode is CallMode.SYNC and protocol is not Protocol.MCP_2026_07_28:
            raise NegotiationError(f"{protocol} cannot run {spec.tool.name!r} synchronously")
        request = CallRequest(
            call_node_id=CallNodeId(spec.call_node),
            tool=spec.tool,
            arguments=spec.arguments,
            principal=Principal(spec.principal),
        )
        op = new_operation(
            request,
            operation_id=OperationId(str(uuid.uuid4())),
            protocol=protocol,
            adapter_version=ADAPTER_VERSION,
            server=spec.server,
            epoch=Epoch(spec.epoch),
            now=clock.now(),
        )
        return await _drive(spec, ledger, clock, backend, op, fresh_arguments=spec.arguments)


_FLAGS = {"tool": "--tool", "arguments digest": "--args", "server": "--server", "principal": "--principal"}


def refuse_other_request(existing: Operation, spec: CallSpec) -> None:
    """Refuse to resume call node ``spec.call_node`` for a request other than the one it holds.

    Raises:
        ConfigError: naming the differing field (tool, arguments digest, server, principal); in
            particular a server other than the one the operation was created on is never polled.
    """
    asked = CallRequest(
        call_node_id=CallNodeId(spec.call_node),
        tool=spec.tool,
        arguments=spec.arguments,
        principal=Principal(spec.principal),
    )
    field = request_mismatch(existing, asked, server=spec.server)
    if field is None:
        return
    held = {
        "tool": f"{existing.tool.name} {existing.tool.version}",
        "arguments digest": existing.request_digest,
        "server": existing.server,
        "principal": existing.principal,
    }[field]
    given = {
        "tool": f"{spec.tool.name} {spec.tool.version}",
        "arguments digest": asked.request_digest,
        "server": spec.server,
        "principal": spec.principal,
    }[field]
    raise ConfigError(
        _FLAGS[field],
        f"call node {spec.call_node} already holds another request: its {field} differs "
        f"(the ledger has {held}, this call asks for {given}); use another call node",
    )


async def _drive(
    spec: CallSpec,
    ledger: LedgerPort,
    clock: Clock,
    backend: Backend,
    op: Operation,
    *,
    fresh_arguments: Json | None,
) -> Operation:
    if op.principal != spec.principal:
        raise ConfigError("--principal", f"call node {op.call_node_id} belongs to another principal")
    driver = Driver(
        ledger=ledger,
        backend=backend,
        clock=clock,
        rng=random.Random(spec.seed),
        server=spec.server,
        epoch=op.epoch,
        policy=spec.policy,
        wait_budgets={spec.tool.name: spec.wait_budget},
    )
    start = clock.now()
    deadline = start + spec.wait_budget
    cancel_at = start + spec.cancel_after if spec.cancel_after is not None else None
    try:
        driver.capabilities = await backend.negotiate(Principal(spec.principal))
        if cancel_at is not None:
            # Asked to cancel later on a server that cannot take a cancel: say so now, before
            # anything is submitted, rather than record a cancel that can never be sent.
            driver.check_cancel(op)
        if fresh_arguments is not None:
            wake = await driver.submit_new(op, fresh_arguments)
        elif op.state is LocalState.INPUT_REQUIRED and spec.answer is not None:
            # Resumed to answer the open round: answer it first (a closed round is refused here,
            # before the operation moves on unanswered).
            wake = Wake(await _answer(driver, op, spec.answer), clock.now())
        else:
            wake = await driver.advance(op)
        op = wake.operation
        while op.state not in RECEIPT_STATES:
            now = clock.now()
            if now >= deadline:
                break
            if cancel_at is not None and now >= cancel_at and op.state in _CANCELLABLE:
                op = driver.request_cancel(op, actor="cli", reason="--cancel-after elapsed")
                cancel_at = None
                wake = Wake(op, now)
            if op.state is LocalState.INPUT_REQUIRED:
                if spec.answer is not None:
                    wake = Wake(await _answer(driver, op, spec.answer), clock.now())
                    op = wake.operation
                    continue
                if cancel_at is not None:
                    await clock.sleep(min(cancel_at, deadline) - now)
                    continue
                break  # parked: a person must answer (``--answer`` on a later call)
            if wake.at is None:
                break  # parked: a person must act (reconciliation)
            target = min(wake.at, deadline, cancel_at or deadline)
            if target > now:
                await clock.sleep(target - now)
                continue
            wake = await driver.advance(ledger.get(op.operation_id) or op)
            op = wake.operation
    finally:
        await backend.aclose()
    return ledger.get(op.operation_id) or op


async def _answer(driver: Driver, op: Operation, answer: Json) -> Operation:
    """``--answer`` for the open round.

    Raises:
        ConfigError: (``--answer``) the round is closed or past its deadline, or the answer does
            not fit the requested schema; nothing was sent.
    """
    try:
        return await driver.answer(op, input_round=op.input_round, answer=answer, actor="cli")
    except StaleRound as exc:
        raise ConfigError(
            "--answer", f"{exc}: that round can no longer be answered; nothing was sent"
        ) from exc


__all__ = [
    "ADAPTER_VERSION",
    "CallSpec",
    "choose_protocol",
    "run_call",
]
