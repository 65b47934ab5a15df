"""Helpers for the ledger contract tests: drive operations through ``step``, reach into either database raw,
and run callables at once in several threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import TypeVar

from engine.ledger import duckdb_client, is_postgres, open_ledger, pg_client
from engine.ledger.duckdb import Ledger
from engine.ledger.port import LedgerPort
from engine.ledger.postgres import PgLedger
from engine.machine import step
from engine.model import (
    AcceptTerminal,
    Epoch,
    Event,
    FetchStarted,
    Operation,
    ResultVerified,
    ServerStatus,
    StatusObserved,
    Submitted,
    TaskId,
    Transition,
    digest_of,
)
from engine.testing import EPOCH_START, make_operation
from rollout.audit import AuditEvent, next_event
from rollout.plan import RolloutState

E = Epoch(1)
NOW = EPOCH_START
PAYLOAD: dict[str, object] = {"content": [{"type": "text", "text": "report"}], "isError": False}
T = TypeVar("T")


class RawError(Exception):
    """A statement the database itself refused (constraint, permission), whichever database it was."""


def raw(ledger: Ledger | PgLedger, statement: str) -> list[tuple[object, ...]]:
    """Run SQL on the ledger's own database, bypassing the ledger's API (to prove the database enforces a rule)."""
    try:
        if isinstance(ledger, PgLedger):
            with ledger.connection() as conn, conn.transaction():
                cur = conn.execute(statement)
                return list(cur.fetchall()) if cur.description else []
        cur_d = ledger._con.execute(statement)
        return [tuple(r) for r in cur_d.fetchall()] if cur_d.description else []
    except (duckdb_client.Error, pg_client.Error) as exc:
        raise RawError(str(exc)) from exc


def advance(ledger: LedgerPort, op: Operation, event: Event, *, at: datetime = NOW) -> Operation:
    t = step(op, event, at)
    assert t.accepted, t.reason
    if any(isinstance(e, AcceptTerminal) for e in t.effects):
        ledger.accept_terminal(t, PAYLOAD)
        return t.after
    return ledger.apply(t)


def created(ledger: LedgerPort, call_node: str, **kw: object) -> Operation:
    op, _ = ledger.create_operation(make_operation(call_node, **kw), {"report": call_node})  # type: ignore[arg-type]
    return op


def to_fetching(ledger: LedgerPort, call_node: str = "n1", **kw: object) -> Operation:
    op = created(ledger, call_node, **kw)
    task = TaskId(f"task-{call_node}")
    op = advance(ledger, op, Submitted(task, E))
    op = advance(ledger, op, StatusObserved(task, ServerStatus.COMPLETED, E))
    return advance(ledger, op, FetchStarted(E))


def verified(op: Operation, payload: dict[str, object] = PAYLOAD) -> Transition:
    return step(op, ResultVerified(op.task_id, ServerStatus.COMPLETED, digest_of(payload), E), NOW)


def handles(target: str, ledger: Ledger | PgLedger, n: int) -> list[Ledger | PgLedger]:
    """``n`` ledger handles for concurrent writers: separate connection pools on PostgreSQL (as separate
    processes would have), the one shared handle on DuckDB (one writing process per file)."""
    if is_postgres(target):
        return [open_ledger(target) for _ in range(n)]
    return [ledger] * n


def close_extra(target: str, opened: Sequence[Ledger | PgLedger]) -> None:
    if is_postgres(target):
        for h in opened:
            h.close()


def at_once(calls: Sequence[Callable[[], T]], timeout_s: float = 60) -> list[T | BaseException]:
    """Run every call in its own thread, released together by a barrier; results or exceptions, in order."""
    barrier = threading.Barrier(len(calls))
    out: list[T | BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(timeout=timeout_s)
        try:
            out[i] = calls[i]()
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=timeout_s)
        assert not th.is_alive(), "a concurrent call did not finish in time"
    return [o for o in out]  # type: ignore[misc]


def rollout_event(
    ledger: LedgerPort,
    *,
    prev: tuple[int, str],
    before: RolloutState,
    after: RolloutState,
    action: str = "shadow",
    at: datetime = NOW,
) -> AuditEvent:
    """Build the next audit link (as ``rollout.controller`` does) and append it by compare-and-swap."""
    event = next_event(
        prev_seq=prev[0],
        prev_hash=prev[1],
        action=action,
        actor="alice",
        reason="contract test",
        override=False,
        before_state=before.as_json(),
        after_state=after.as_json(),
        detail={"note": action},
        gate_inputs=ledger.gate_inputs(at),
        at=at,
    )
    ledger.append_rollout_event(
        asdict(event), after.as_json(), expected_seq=prev[0], expected_epoch=before.epoch
    )
    return event
