"""Delivery to the downstream: the outbox's consumer routes and awaiting a call's receipt (issue 21).

Routes (JSON):

    GET  /api/v1/outbox?consumer=&after=&wait_s=&limit=   the consumer's ready entries after its cursor,
                                                          in acceptance order; long-polls up to wait_s
    POST /api/v1/outbox/{call_node}/ack                   {consumer, status, result_digest}: the
                                                          downstream advanced; idempotent per consumer
    GET  /api/v1/outbox/lag                               per consumer: acknowledged, behind, oldest
                                                          unacknowledged entry

and ``wait_s`` on ``POST /api/v1/calls`` and ``GET /api/v1/operations/{call_node}`` (``awaited``).

Delivery is at-least-once: an entry stays ready for a consumer until that consumer acknowledges it,
so a consumer that restarts from its last cursor receives again what it had not acknowledged; the
acknowledgement is recorded exactly once per consumer and entry (``LedgerPort.ack_outbox``).

A wait never blocks the executor's loop and never holds a reader: each look at the ledger is one
short read on the readers' pool (``service.readers``); between looks the request sleeps on the
executor's commit signal (``CommitSignal``, set after a commit that wrote receipts), or at most
``RECHECK_S`` (another executor sharing a PostgreSQL ledger commits without telling this one). A
caller that goes away while waiting cancels nothing: the call's operation is already recorded.

Presentation only: what is ready and what an acknowledgement must match is the ledger's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Final, TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from engine.clock import monotonic_seconds
from engine.errors import AckRefused, IdentifierRefused, ServiceError
from engine.ledger.port import LedgerPort
from engine.limits import check_call_node, check_principal
from service.readers import ReaderPool, ReadersBusy

T = TypeVar("T")

MAX_WAIT_S: Final = 60.0
"""The longest a request may wait (``wait_s`` above it is refused: a proxy would cut it anyway)."""
RECHECK_S: Final = 0.5
"""How often a waiting request looks again without a commit signal (other executors' commits)."""
MAX_ENTRIES: Final = 1000


class CommitSignal:
    """Set by the executor after a commit that wrote receipts; waiters wake and look again.

    Lives on the executor's loop: ``notify`` and ``wait`` are called there only.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Return at the next ``notify`` or after ``timeout_s``, whichever comes first."""
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            return


def wait_seconds(raw: object) -> float:
    """``wait_s`` from a query or a body: absent is 0; a number in [0, MAX_WAIT_S] (400 otherwise)."""
    if raw is None or raw == "":
        return 0.0
    if isinstance(raw, bool):
        raise ServiceError(400, f"wait_s must be a number of seconds, got {raw!r}")
    try:
        value = float(raw) if isinstance(raw, int | float) else float(str(raw))
    except ValueError as exc:
        raise ServiceError(400, f"wait_s must be a number of seconds, got {raw!r}") from exc
    if not 0.0 <= value <= MAX_WAIT_S:  # NaN fails both comparisons
        raise ServiceError(400, f"wait_s must be between 0 and {MAX_WAIT_S:g} seconds, got {raw!r}")
    return value


async def awaited(
    pool: ReaderPool,
    signal: CommitSignal,
    what: str,
    read: Callable[[], T],
    ready: Callable[[T], bool],
    wait_s: float,
) -> T:
    """``read()`` on the readers' pool until ``ready`` says so or ``wait_s`` has passed; the last read.

    The first read is refused like any read when the pool is full; a later look that finds it
    full waits for the next signal instead (the request already holds its answer so far).
    """
    deadline = monotonic_seconds() + wait_s
    value = await pool.run(what, read)
    while not ready(value):
        left = deadline - monotonic_seconds()
        if left <= 0:
            return value
        await signal.wait(min(left, RECHECK_S))
        try:
            value = await pool.run(what, read)
        except ReadersBusy:
            continue
    return value


def _name(check: Callable[[object], str], value: object, what: str) -> str:
    if value is None or value == "":
        raise ServiceError(400, f"{what!r} is required")
    try:
        return check(value)
    except IdentifierRefused as exc:
        raise ServiceError(422, f"{what}: {exc}") from exc


def build_outbox_routes(
    ledger: LedgerPort,
    pool: ReaderPool,
    signal: CommitSignal,
    *,
    respond: Callable[[object, int], Response],
    body: Callable[[Request], Awaitable[dict[str, object]]],
    now: Callable[[], datetime],
    guard: Callable[[Callable[[Request], Awaitable[Response]]], Callable[[Request], Awaitable[Response]]],
    write_guard: Callable[
        [Callable[[Request], Awaitable[Response]]], Callable[[Request], Awaitable[Response]]
    ]
    | None = None,
) -> list[Route]:
    """The ``/api/v1/outbox`` routes over ``ledger``; ``respond``, ``body``, ``now`` and ``guard`` are the API's
    (``write_guard``, if given, guards the acknowledgement: a write)."""

    async def entries(request: Request) -> Response:
        q = request.query_params
        consumer = _name(check_principal, q.get("consumer"), "consumer")
        try:
            after = int(q["after"]) if q.get("after") not in (None, "") else None
            limit = int(q.get("limit", "100"))
        except ValueError as exc:
            raise ServiceError(400, "after and limit must be integers") from exc
        if not 1 <= limit <= MAX_ENTRIES:
            raise ServiceError(400, f"limit must be between 1 and {MAX_ENTRIES}")
        wait_s = wait_seconds(q.get("wait_s"))
        found = await awaited(
            pool,
            signal,
            "outbox read",
            lambda: ledger.outbox_ready(consumer, after, limit),
            bool,
            wait_s,
        )
        cursor = int(str(found[-1]["seq"])) if found else after
        return respond({"consumer": consumer, "entries": found, "cursor": cursor}, 200)

    async def ack(request: Request) -> Response:
        call_node = _name(check_call_node, request.path_params["call_node"], "call node")
        data = await body(request)
        consumer = _name(check_principal, data.get("consumer"), "consumer")
        status = data.get("status")
        if not isinstance(status, str) or not status:
            raise ServiceError(400, "'status' is required: the entry's status the downstream advanced on")
        if "result_digest" not in data:
            raise ServiceError(400, "'result_digest' is required (null for an entry without a result)")
        digest = data["result_digest"]
        if digest is not None and not isinstance(digest, str):
            raise ServiceError(400, "'result_digest' must be a string or null")
        at = now()
        try:
            recorded = await asyncio.to_thread(
                ledger.ack_outbox,
                consumer,
                call_node,
                status,
                digest,
                at,
            )
        except AckRefused as exc:
            raise ServiceError(404 if exc.missing else 409, str(exc)) from exc
        return respond(
            {
                "consumer": recorded.consumer,
                "call_node": recorded.call_node_id,
                "seq": recorded.seq,
                "acknowledged_at": recorded.acknowledged_at,
                "repeated": recorded.repeated,
            },
            200 if recorded.repeated else 201,
        )

    async def lag(request: Request) -> Response:
        return respond({"consumers": await pool.run("outbox lag", ledger.outbox_lag)}, 200)

    return [
        Route("/api/v1/outbox", guard(entries)),
        Route("/api/v1/outbox/lag", guard(lag)),
        Route("/api/v1/outbox/{call_node}/ack", (write_guard or guard)(ack), methods=["POST"]),
    ]


__all__ = [
    "MAX_WAIT_S",
    "RECHECK_S",
    "CommitSignal",
    "awaited",
    "build_outbox_routes",
    "wait_seconds",
]
