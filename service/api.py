"""The control API of ``finality serve``: JSON over HTTP on loopback, under ``/api/v1``, plus ``/metrics``.

Routes (all JSON; errors are ``{"error": "..."}`` with a meaningful status):

    GET  /api/v1/health                                   liveness, in-flight count, servers, SQL dialect
    POST /api/v1/calls                                    {call_node, tool, arguments, principal?, wait_s?}
                                                          -> operation; with wait_s, once it holds a receipt
                                                          (201) or the wait ended (202, current state)
    GET  /api/v1/operations?state=&protocol=&tool=&limit= operations, newest first
    GET  /api/v1/operations/{call_node}?wait_s=           the same object as ``finality show --json``;
                                                          wait_s: 200 with a receipt, 202 when the wait ended
    GET  /api/v1/outbox?consumer=&after=&wait_s=&limit=   ready entries for a consumer (``service.delivery``)
    POST /api/v1/outbox/{call_node}/ack                   {consumer, status, result_digest}; idempotent
    GET  /api/v1/outbox/lag                               per consumer: acknowledged, behind, oldest waiting
    POST /api/v1/operations/{call_node}/cancel            {actor, reason}
    GET  /api/v1/approvals[?all=1]                        pending input rounds (?all: every round)
    POST /api/v1/approvals/{operation_id}/{round}         {actor, answer}; 409 for a stale round
    GET  /api/v1/reconciliation                           open entries
    POST /api/v1/reconciliation/{entry_id}/resolve        {actor, reason, task_id?, absent?}
    POST /api/v1/sql                                      {query, max_rows?} read-only, sandboxed
    POST /api/v1/sql/arrow                                {query, max_rows?} the same, as an Arrow IPC
                                                          stream; more rows than max_rows is refused
    POST /api/v1/snapshots                                publish a snapshot file (as-of instant inside)
    GET  /api/v1/snapshots                                the snapshots kept, newest first
    GET  /api/v1/snapshots/{name}                         one snapshot's bytes (a DuckDB file)
    GET  /api/v1/gates                                    the six gates with raw inputs (POST: also record the run)
    GET  /metrics                                         Prometheus text format

Rollout (``build_rollout_routes``; every action needs ``actor`` and ``reason``, refusals carry the reason
and, for a blocked promotion, ``failing_gates`` with their raw values):

    GET  /api/v1/rollout/status                           stage, percentage, epoch, kill switch with remaining
                                                          operations, arms, shadow divergence, gates, audit check
    POST /api/v1/rollout/shadow                           {actor, reason, tools?}; side-effect-free tools only (422)
    POST /api/v1/rollout/canary                           {actor, reason, percentage, override?}; 409 while a gate fails
    POST /api/v1/rollout/promote                          {actor, reason, override?}; canary -> full, gated
    POST /api/v1/rollout/rollback                         {actor, reason}; new calls to the old path, epoch raised,
                                                          in-flight operations adopted (never resubmitted)
    POST /api/v1/rollout/disable-protocol                 {actor, reason, protocol}; new calls on it refused (409)
    POST /api/v1/rollout/enable-protocol                  {actor, reason, protocol}
    GET  /api/v1/rollout/events?limit=                    the hash-chained audit log, newest first
    GET  /api/v1/rollout/audit                            verify the chain: names edited, deleted or reordered rows
    GET  /api/v1/rollout/shadow-diffs?diverged=&limit=    shadow comparisons, newest first
    GET  /api/v1/rollout/assignments?limit=               operations' arms, newest first

Who may act (``service.access``, ``service.auth``; README: Who may act): with an ``[auth]`` table every
route but ``/metrics`` (when ``auth.open_metrics``) needs ``Authorization: Bearer <token>``: 401 without
a valid one, 403 naming the role that would allow the action, each refusal recorded (``GET
/api/v1/access/denials``). The actor of every action is the token's principal; a body's ``actor``
naming someone else is refused (403). A caller sees and cancels only its own principal's operations.
Without ``[auth]`` (local mode) the body's ``actor`` is recorded as typed.

    GET  /api/v1/whoami                                   the request's principal and roles
    GET  /api/v1/access/denials?limit=                    refused attempts, newest first

Every route that takes a body reads it through ``service.guard`` (413 naming the limit, 422 naming
an identifier rule of ``engine.limits``, 429 with Retry-After for a principal over its limits; README:
Limits).

Presentation only: every decision is the executor's or the engine's. Every read that is not the
executor's own (SQL, console lists, gates, rollout status, metrics, the audit check, snapshots)
runs on the readers' pool (``service.readers``), off the executor's loop; a full pool answers 503
with Retry-After. Analyst SQL on a DuckDB ledger (the console's charts too) runs further off: in
a reader process (``service.reader_process``), whose encoded answer the route sends unread. Where a read's result is the whole answer (SQL, snapshots, rollout status, the
audit check) its JSON is encoded there too (``_read_json``): 100,000 rows take about 0.8 s to encode.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from engine.clock import monotonic_seconds
from engine.errors import (
    EngineError,
    IdentifierRefused,
    InvalidRecord,
    RolloutRefused,
    ServiceError,
    SqlRefused,
    TooLarge,
    TooMany,
)
from engine.ledger.port import LedgerPort
from engine.limits import (
    check_actor,
    check_call_node,
    check_principal,
    check_reason,
    encoded_size,
)
from engine.runtime.report import creation_report, operation_report
from rollout.assign import percent_to_bp
from rollout.controller import verify_ledger
from rollout.plan import Action as RolloutAction
from rollout.plan import Request as RolloutRequest
from service.access import Access, Denied, identity_of
from service.analysis import AnalystReads
from service.auth import Identity, Permission, TokenStore
from service.client import API_VERSION
from service.config import AnalystConfig
from service.delivery import awaited, build_outbox_routes, wait_seconds
from service.executor import Executor
from service.guard import PrincipalLimiter, describe, json_object, read_body, refused
from service.readers import ReaderPool, ReadersBusy

Handler = Callable[[Request], Awaitable[Response]]


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _json_bytes(content: object) -> bytes:
    return json.dumps(content, default=_default).encode()


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return _json_bytes(content)


async def _read_json(
    pool: ReaderPool, what: str, read: Callable[[], object], status_code: int = 200
) -> Response:
    """A read's answer, read and encoded on the readers' pool: encoding is the loop's only other cost
    of a read, and the largest answers (100,000 rows of SQL) take the best part of a second to encode."""
    body = await pool.run(what, lambda: _json_bytes(read()))
    return Response(body, status_code=status_code, media_type="application/json")


def _error(status: int, message: str) -> JSON:
    return JSON({"error": message}, status_code=status)


def _limit_of(request: Request) -> int:
    state: State = request.app.state
    return int(state.body_bytes)


async def _body(request: Request, limit: int | None = None) -> dict[str, object]:
    """The JSON object body, read with the body limit (or ``limit``) held while reading."""
    return json_object(await read_body(request, limit if limit is not None else _limit_of(request)))


def _checked(check: Callable[[object], str], value: object) -> str:
    try:
        return check(value)
    except IdentifierRefused as exc:
        raise refused(exc) from exc


def _actor(identity: Identity, body: dict[str, object], *, required: bool = True) -> str:
    """Who acts: the token's principal; a body's ``actor`` naming anyone else is refused (403).

    In local mode (no identities) the body's ``actor`` as typed: present (400, unless not
    ``required``) and within its identifier rule (422).
    """
    typed = body.get("actor")
    if identity.authenticated:
        if typed is not None and typed != identity.principal:
            raise Denied(
                403,
                f"'actor' is taken from the token: principal {identity.principal!r} may not act as {typed!r}",
            )
        return identity.principal
    if not required and not typed:
        return ""
    return _checked(check_actor, _text(body, "actor"))


def _person(identity: Identity, body: dict[str, object]) -> tuple[str, str]:
    """The actor (``_actor``) and ``reason``: present (400) and within its identifier rule (422)."""
    return _actor(identity, body), _checked(check_reason, _text(body, "reason"))


def _optional(body: dict[str, object], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ServiceError(400, f"{key!r} must be a non-empty string")
    return value


def _text(body: dict[str, object], key: str) -> str:
    value = _optional(body, key)
    if value is None:
        raise ServiceError(400, f"{key!r} is required")
    return value


def _guard(handler: Handler, access: Access | None = None) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Denied as exc:
            if access is not None:
                await access.record(request, exc)
            response = _error(exc.status, str(exc))
            if exc.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="finality"'
            return response
        except ReadersBusy as exc:
            response = _error(exc.status, str(exc))
            response.headers["Retry-After"] = str(exc.retry_after_s)
            return response
        except TooMany as exc:
            response = _error(exc.status, str(exc))
            response.headers["Retry-After"] = str(exc.retry_after)
            return response
        except ServiceError as exc:
            return _error(exc.status, str(exc))
        except SqlRefused as exc:
            return _error(400, str(exc))
        except InvalidRecord as exc:
            return _error(400, str(exc))
        except EngineError as exc:
            return _error(409, str(exc))

    return wrapped


ARROW_STREAM = "application/vnd.apache.arrow.stream"


def _has_receipt(report: dict[str, object] | None) -> bool:
    return report is not None and report.get("receipt") is not None


def build_api(
    executor: Executor,
    ledger: LedgerPort,
    *,
    sql: AnalystReads | None = None,
    readers: ReaderPool | None = None,
    analyst: AnalystConfig | None = None,
) -> Starlette:
    """The ASGI app over one executor and its ledger; reads go to ``readers`` (a default pool if None)."""
    pool = readers or ReaderPool()
    limits = analyst or AnalystConfig()
    config = executor.config
    access = Access(
        TokenStore(config.auth, executor.clock.now) if config.auth is not None else None,
        ledger,
        now=executor.clock.now,
        monotonic=monotonic_seconds,
        open_metrics=config.auth.open_metrics if config.auth is not None else True,
    )

    def door(permission: Permission | None, handler: Handler) -> Handler:
        return _guard(access.route(permission, handler), access)

    limiter = PrincipalLimiter(config.limits, now=monotonic_seconds, in_flight=executor.in_flight_of)
    registry = CollectorRegistry()
    limit_values = Gauge(
        "finality_limit", "Configured request and principal limits", ["limit"], registry=registry
    )
    for name in ("body_bytes", "answer_bytes", "in_flight_per_principal", "submissions_per_s_per_principal"):
        limit_values.labels(limit=name).set(float(getattr(config.limits, name)))
    limit_refusals = Gauge(
        "finality_limit_refusals",
        "Submissions refused with 429 since start, by limit and principal",
        ["limit", "principal"],
        registry=registry,
    )
    principal_in_flight = Gauge(
        "finality_principal_in_flight",
        "Operations without a receipt, by principal",
        ["principal"],
        registry=registry,
    )
    in_flight = Gauge(
        "finality_operations",
        "Operations by local state and protocol",
        ["state", "protocol"],
        registry=registry,
    )
    requests = Gauge(
        "finality_protocol_requests", "Protocol requests by outcome", ["outcome"], registry=registry
    )
    ticks = Gauge("finality_executor_ticks", "Executor ticks since start", registry=registry)
    group_commits = Gauge(
        "finality_executor_group_commits",
        "Group commits on the executor's writer thread since start",
        registry=registry,
    )
    group_writes = Gauge(
        "finality_executor_group_writes",
        "Writes (transitions, acceptances, poll rows, held outcomes) those group commits carried",
        registry=registry,
    )
    write_transactions = Gauge(
        "finality_executor_write_transactions",
        "Write transactions through the executor's store since start (group commits, flushes, immediate writes)",
        registry=registry,
    )
    denials = Gauge(
        "finality_access_refusals",
        "Control-API requests refused with 401/403 since start (recorded or not), by status",
        ["status"],
        registry=registry,
    )
    unknown = Gauge(
        "finality_reconciliation_open", "Open reconciliation entries", ["kind"], registry=registry
    )

    async def health(request: Request) -> Response:
        return JSON(
            {
                "status": "ok",
                # What the console checks first: a console newer than this service refuses it clearly.
                "api_version": API_VERSION,
                "in_flight": executor.in_flight,
                "epoch": executor.epoch,
                "servers": {name: protocol.value for name, protocol in executor.servers().items()},
                # The SQL dialect POST /api/v1/sql speaks (the console picks its query variants by it).
                "dialect": ledger.dialect,
                # How busy the readers' pool is (it never holds this answer back: health is not a read),
                # and the reader processes running analyst SQL (DuckDB), each with its niceness.
                "readers": {
                    **pool.stats().as_json(),
                    "processes": sql.reader_processes() if sql is not None else [],
                },
            }
        )

    async def submit(request: Request) -> Response:
        body = await _body(request, config.calls_body_limit)
        arguments = body.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ServiceError(400, "'arguments' must be a JSON object")
        call_node = _checked(check_call_node, _text(body, "call_node"))
        tool = _text(body, "tool")
        principal = _optional(body, "principal")
        if principal is not None:
            _checked(check_principal, principal)
        identity = identity_of(request)
        if identity.authenticated:
            # The seed binds an operation to a principal: the token's, never one the body names.
            if principal is not None and principal != identity.principal:
                raise Denied(
                    403,
                    f"'principal' is taken from the token: {identity.principal!r} may not submit as {principal!r}",
                )
            principal = identity.principal
        limit = config.argument_limit(tool)
        size = encoded_size(arguments)
        if size > limit:
            raise TooLarge(
                f"arguments of {size} bytes exceed the limit for tool {tool!r} of {describe(limit)}"
            )
        tool_config = config.tools.get(tool)
        if tool_config is not None:
            # The principal the operation will carry: the body's, else its server's configured one.
            limiter.admit(principal or config.servers[tool_config.server].principal)
        wait_s = wait_seconds(body.get("wait_s"))
        op = await executor.submit(call_node=call_node, tool=tool, arguments=arguments, principal=principal)
        if wait_s:
            # The operation is recorded: a caller that goes away from here on cancels nothing.
            report = await _await_receipt(op.call_node_id, wait_s)
            return JSON(report, status_code=201 if _has_receipt(report) else 202)
        if op.row_version == 0:
            # Recorded and not yet written since (a new call, or a repeat before its submission):
            # the reply needs no read, the record is the durable SUBMITTING row itself.
            return JSON(creation_report(op), status_code=201)
        # Read back on a worker thread: three queries per call, and 200 callers at once would
        # otherwise hold the event loop (and every request in flight) for seconds.
        report = await asyncio.to_thread(operation_report, ledger, op.call_node_id)
        return JSON(report, status_code=201)

    async def _await_receipt(call_node: str, wait_s: float) -> dict[str, object] | None:
        return await awaited(
            pool,
            executor.commit_signal,
            "operation read",
            lambda: operation_report(ledger, call_node),
            _has_receipt,
            wait_s,
        )

    async def operations(request: Request) -> Response:
        q = request.query_params
        try:
            limit = min(int(q.get("limit", "100")), 10_000)
        except ValueError as exc:
            raise ServiceError(400, "limit must be an integer") from exc
        identity = identity_of(request)
        # A list of up to 10,000 rows is a reader's read (the console's), not the executor's.
        rows = await pool.run(
            "operations list",
            lambda: ledger.list_operations(
                state=q.get("state"),
                protocol=q.get("protocol"),
                tool=q.get("tool"),
                # A caller sees its own principal's operations only.
                principal=None if identity.sees_all_operations else identity.principal,
                limit=limit,
            ),
        )
        return JSON({"operations": rows})

    def _visible(request: Request, call_node: str) -> dict[str, object]:
        """The operation's report, if the request's identity may see it (else 404, as if absent)."""
        identity = identity_of(request)
        report = operation_report(ledger, call_node)
        if report is None:
            raise ServiceError(404, f"no operation for call node {call_node!r}")
        if not identity.sees_all_operations and report.get("principal") != identity.principal:
            # Recorded as a denial, answered as a 404: a caller learns nothing of others' operations.
            raise Denied(404, f"no operation for call node {call_node!r} of principal {identity.principal!r}")
        return report

    async def show(request: Request) -> Response:
        call_node = request.path_params["call_node"]
        if not identity_of(request).sees_all_operations:
            _visible(request, call_node)  # a caller reads (and awaits) its own operations only
        wait_s = wait_seconds(request.query_params.get("wait_s"))
        report = await _await_receipt(call_node, wait_s) if wait_s else operation_report(ledger, call_node)
        if report is None:
            raise ServiceError(404, f"no operation for call node {call_node!r}")
        return JSON(report, status_code=200 if not wait_s or _has_receipt(report) else 202)

    async def cancel(request: Request) -> Response:
        identity = identity_of(request)
        if not identity.may(Permission.OPERATE):
            _visible(request, request.path_params["call_node"])  # a caller cancels its own only
        body = await _body(request)
        actor, reason = _person(identity, body)
        op = await executor.cancel(request.path_params["call_node"], actor=actor, reason=reason)
        return JSON(operation_report(ledger, op.call_node_id), status_code=202)

    async def resubmit(request: Request) -> Response:
        body = await _body(request)
        actor, reason = _person(identity_of(request), body)
        op = await executor.resubmit(request.path_params["call_node"], actor=actor, reason=reason)
        return JSON(operation_report(ledger, op.call_node_id), status_code=202)

    async def approvals(request: Request) -> Response:
        # Pending rounds only (the answerable ones); ``?all`` also lists answered, expired and
        # closed rounds, each with when and why it closed.
        pending_only = request.query_params.get("all") is None
        return JSON(
            {
                "approvals": await pool.run(
                    "approvals list", lambda: ledger.approvals(pending_only=pending_only)
                )
            }
        )

    async def answer(request: Request) -> Response:
        body = await _body(request)
        actor = _actor(identity_of(request), body)
        value = body.get("answer")
        if not isinstance(value, dict):
            raise ServiceError(400, "'answer' must be a JSON object")
        size = encoded_size(value)
        if size > config.limits.answer_bytes:
            raise TooLarge(
                f"an answer of {size} bytes exceeds the limit of {describe(config.limits.answer_bytes)} "
                "(limits.answer_bytes)"
            )
        try:
            round_ = int(request.path_params["round"])
        except ValueError as exc:
            raise ServiceError(400, "round must be an integer") from exc
        op = await executor.answer(
            request.path_params["operation_id"], input_round=round_, answer=value, actor=actor
        )
        return JSON(operation_report(ledger, op.call_node_id))

    async def reconciliation(request: Request) -> Response:
        open_only = request.query_params.get("all") is None
        return JSON(
            {
                "entries": await pool.run(
                    "reconciliation list", lambda: ledger.reconciliation(open_only=open_only)
                )
            }
        )

    async def resolve(request: Request) -> Response:
        body = await _body(request)
        actor, reason = _person(identity_of(request), body)
        try:
            entry_id = int(request.path_params["entry_id"])
        except ValueError as exc:
            raise ServiceError(400, "entry id must be an integer") from exc
        absent = body.get("absent", False)
        if not isinstance(absent, bool):
            raise ServiceError(400, "'absent' must be true or false")
        done = await executor.resolve(
            entry_id,
            actor=actor,
            reason=reason,
            task_id=_optional(body, "task_id"),
            absent=absent,
        )
        if not done:
            raise ServiceError(409, f"entry {entry_id} is not open")
        return JSON({"resolved": entry_id})

    def _reads() -> AnalystReads:
        if sql is None:
            raise ServiceError(501, "the SQL sandbox is not enabled")
        return sql

    async def _sql_request(request: Request, default_rows: int) -> tuple[str, int]:
        body = await _body(request)
        query = _text(body, "query")
        max_rows = body.get("max_rows", default_rows)
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows <= 0:
            raise ServiceError(400, "'max_rows' must be a positive integer")
        if max_rows > limits.max_rows:
            raise ServiceError(
                400, f"max_rows={max_rows:,} is over the service's result limit of {limits.max_rows:,} rows"
            )
        return query, max_rows

    async def run_sql(request: Request) -> Response:
        reads = _reads()
        query, max_rows = await _sql_request(request, 1000)
        # The answer arrives encoded (from a reader process on DuckDB): the loop only sends its bytes.
        body = await pool.run("analyst SQL", lambda: reads.query_json(query, max_rows), analyst=True)
        return Response(body, media_type="application/json")

    async def run_sql_arrow(request: Request) -> Response:
        reads = _reads()
        query, max_rows = await _sql_request(request, 10_000)
        body = await pool.run("analyst SQL", lambda: reads.arrow_ipc(query, max_rows), analyst=True)
        return Response(body, media_type=ARROW_STREAM)

    async def publish_snapshot(request: Request) -> Response:
        reads = _reads()
        return await _read_json(pool, "snapshot", reads.publish, status_code=201)

    async def list_snapshots(request: Request) -> Response:
        return JSON({"snapshots": _reads().snapshots()})

    async def get_snapshot(request: Request) -> Response:
        path = _reads().snapshot_path(request.path_params["name"])
        return FileResponse(path, media_type="application/octet-stream", filename=path.name)

    async def gates(request: Request) -> Response:
        # Imported here: rollout sits above the engine and the API only presents its verdicts.
        from rollout.gates import Thresholds, evaluate

        now = executor.clock.now()
        report = await pool.run("gate evaluation", lambda: evaluate(ledger.gate_inputs(now), Thresholds()))
        run_id = (
            await pool.run("gate record", lambda: ledger.record_gate_run(report.results, now))
            if request.method == "POST"
            else None
        )
        return JSON(
            {
                "run_id": run_id,
                "passed": report.passed,
                "gates": [
                    {
                        "gate": r.gate,
                        "passed": r.passed,
                        "value": r.value,
                        "threshold": r.threshold,
                        "verdict": r.verdict,
                        "inputs": r.inputs,
                    }
                    for r in report.results
                ],
            }
        )

    async def metrics(request: Request) -> Response:
        def scan() -> tuple[list[tuple[str, str, int]], list[tuple[str, int]], list[tuple[str, int]]]:
            return ledger.state_counts(), ledger.poll_counts(), ledger.open_reconciliation_counts()

        states, polls, open_entries = await pool.run("metrics", scan)
        in_flight.clear()
        for state, protocol, count in states:
            in_flight.labels(state=state, protocol=protocol).set(count)
        requests.clear()
        for outcome, count in polls:
            requests.labels(outcome=outcome).set(count)
        unknown.clear()
        for kind, count in open_entries:
            unknown.labels(kind=kind).set(count)
        ticks.set(executor.stats["ticks"])
        group_commits.set(executor.stats["commits"])
        group_writes.set(executor.stats["committed_writes"])
        write_transactions.set(executor.write_transactions)
        denials.clear()
        for status, count in access.refused.items():
            denials.labels(status=str(status)).set(count)
        limit_refusals.clear()
        for (limit, principal), count in limiter.refusals.items():
            limit_refusals.labels(limit=limit, principal=principal).set(count)
        principal_in_flight.clear()
        for principal, count in executor.in_flight_by_principal().items():
            principal_in_flight.labels(principal=principal).set(count)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def whoami(request: Request) -> Response:
        return JSON(identity_of(request).as_json())

    async def access_denials(request: Request) -> Response:
        return JSON(
            {"denials": await pool.run("access denials", lambda: ledger.denials(limit=_limit(request)))}
        )

    P = Permission
    routes = [
        Route("/api/v1/health", door(P.HEALTH, health)),
        Route("/api/v1/whoami", door(P.HEALTH, whoami)),
        Route("/api/v1/access/denials", door(P.READ, access_denials)),
        Route("/api/v1/calls", door(P.SUBMIT, submit), methods=["POST"]),
        Route("/api/v1/operations", door(P.OWN_OPERATIONS, operations)),
        Route("/api/v1/operations/{call_node}", door(P.OWN_OPERATIONS, show)),
        Route("/api/v1/operations/{call_node}/cancel", door(P.CANCEL, cancel), methods=["POST"]),
        Route("/api/v1/operations/{call_node}/resubmit", door(P.OPERATE, resubmit), methods=["POST"]),
        Route("/api/v1/approvals", door(P.READ, approvals)),
        Route("/api/v1/approvals/{operation_id}/{round}", door(P.ANSWER, answer), methods=["POST"]),
        Route("/api/v1/reconciliation", door(P.READ, reconciliation)),
        Route("/api/v1/reconciliation/{entry_id}/resolve", door(P.OPERATE, resolve), methods=["POST"]),
        Route("/api/v1/sql", door(P.SQL, run_sql), methods=["POST"]),
        Route("/api/v1/sql/arrow", door(P.SQL, run_sql_arrow), methods=["POST"]),
        Route("/api/v1/snapshots", door(P.SQL, publish_snapshot), methods=["POST"]),
        Route("/api/v1/snapshots", door(P.SQL, list_snapshots), methods=["GET"]),
        Route("/api/v1/snapshots/{name}", door(P.SQL, get_snapshot)),
        # POST records the evaluation it answers (derived data only): a viewer's "Re-evaluate now".
        Route("/api/v1/gates", door(P.READ, gates), methods=["GET", "POST"]),
        Route("/metrics", door(None if access.open_metrics else P.READ, metrics)),
        *build_rollout_routes(executor, ledger, pool, door),
        *build_outbox_routes(
            ledger,
            pool,
            executor.commit_signal,
            respond=lambda content, status: JSON(content, status_code=status),
            body=_body,
            now=executor.clock.now,
            # A consumer reads the outbox like any reader; acknowledging moves delivery: an operator's.
            guard=lambda handler: door(P.READ, handler),
            write_guard=lambda handler: door(P.OPERATE, handler),
        ),
    ]
    app = Starlette(routes=routes)
    app.state.body_bytes = config.limits.body_bytes
    return app


# ------------------------------------------------------------------------------------------ rollout


def _rollout_request(action: str, body: dict[str, object], identity: Identity) -> RolloutRequest:
    try:
        kind = RolloutAction(action)
    except ValueError as exc:
        known = ", ".join(a.value for a in RolloutAction)
        raise ServiceError(404, f"unknown rollout action {action!r} (one of {known})") from exc
    override = body.get("override", False)
    if not isinstance(override, bool):
        raise ServiceError(400, "'override' must be true or false")
    canary_bp = None
    if kind is RolloutAction.CANARY:
        percentage = body.get("percentage", body.get("percent"))
        if isinstance(percentage, bool) or not isinstance(percentage, int | float):
            raise ServiceError(400, "a canary needs 'percentage', a number in (0, 100]")
        try:
            canary_bp = percent_to_bp(float(percentage))
        except ValueError as exc:
            raise ServiceError(400, str(exc)) from exc
    tools = body.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise ServiceError(400, "'tools' must be a list of tool names")
    actor, reason = _actor(identity, body, required=False), body.get("reason")
    # Missing ones are the plan's to refuse (it names what a rollout action needs); present ones
    # must hold the identifier rules.
    return RolloutRequest(
        kind,
        actor=actor,
        reason=_checked(check_reason, reason) if reason else "",
        canary_bp=canary_bp,
        tools=tuple(str(t) for t in tools),
        protocol=_optional(body, "protocol"),
        override=override,
    )


def _refused(exc: RolloutRefused) -> JSON:
    failing = [
        {
            "gate": g.gate,
            "verdict": g.verdict,
            "value": g.value,
            "threshold": g.threshold,
            "inputs": g.inputs,
        }
        for g in exc.failing
    ]
    return JSON({"error": str(exc), "failing_gates": failing}, status_code=exc.status)


def _limit(request: Request, default: int = 100) -> int:
    try:
        return max(1, min(int(request.query_params.get("limit", str(default))), 10_000))
    except ValueError as exc:
        raise ServiceError(400, "limit must be an integer") from exc


def build_rollout_routes(
    executor: Executor,
    ledger: LedgerPort,
    pool: ReaderPool | None = None,
    door: Callable[[Permission | None, Handler], Handler] | None = None,
) -> list[Route]:
    """The ``/api/v1/rollout`` routes: status and reads, and one POST per action (behind ``door``:
    reads for a viewer, actions for a release manager; None: local mode, no identities)."""
    if door is None:
        local = Access(None, ledger, now=executor.clock.now, monotonic=monotonic_seconds)

        def door(permission: Permission | None, handler: Handler) -> Handler:
            return _guard(local.route(permission, handler), local)

    readers = pool or ReaderPool()

    async def status(request: Request) -> Response:
        # Gate inputs, live counts, arms, shadow summary and the whole audit chain's check: a read
        # that grows with the ledger, so it runs on the readers' pool, not on the executor's loop.
        return await _read_json(readers, "rollout status", executor.rollout_status)

    async def act(request: Request) -> Response:
        body = await _body(request)
        rollout_request = _rollout_request(request.path_params["action"], body, identity_of(request))
        try:
            result = await executor.rollout_act(rollout_request)
        except RolloutRefused as exc:
            return _refused(exc)
        return JSON(result)

    async def events(request: Request) -> Response:
        limit = _limit(request)
        return JSON(
            {
                "events": await readers.run(
                    "rollout events", lambda: ledger.rollout_events(limit=limit, newest_first=True)
                )
            }
        )

    async def audit(request: Request) -> Response:
        # The chain check scans every rollout event: a read, so it runs on the readers' pool.
        return await _read_json(readers, "audit check", lambda: verify_ledger(ledger).as_json())

    async def shadow_diffs(request: Request) -> Response:
        diverged = request.query_params.get("diverged") not in (None, "", "0", "false")
        limit = _limit(request)
        return JSON(
            await readers.run(
                "shadow diffs",
                lambda: {
                    "summary": ledger.shadow_summary(),
                    "diffs": ledger.shadow_diffs(diverged_only=diverged, limit=limit),
                },
            )
        )

    async def assignments(request: Request) -> Response:
        limit = _limit(request, 1000)
        return JSON(
            {"assignments": await readers.run("rollout assignments", lambda: ledger.assignments(limit=limit))}
        )

    P = Permission
    return [
        Route("/api/v1/rollout/status", door(P.READ, status)),
        Route("/api/v1/rollout/events", door(P.READ, events)),
        Route("/api/v1/rollout/audit", door(P.READ, audit)),
        Route("/api/v1/rollout/shadow-diffs", door(P.READ, shadow_diffs)),
        Route("/api/v1/rollout/assignments", door(P.READ, assignments)),
        Route("/api/v1/rollout/{action}", door(P.ROLLOUT, act), methods=["POST"]),
    ]


__all__ = [
    "ARROW_STREAM",
    "JSON",
    "Handler",
    "build_api",
    "build_rollout_routes",
]
