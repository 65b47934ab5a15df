"""The control API of ``finality serve``: JSON over HTTP on loopback, under ``/api/v1``, plus ``/metrics``.

Routes (all JSON; errors are ``{"error": "..."}`` with a meaningful status):

    GET  /api/v1/health                                   liveness, in-flight count, servers
    POST /api/v1/calls                                    {call_node, tool, arguments, principal?} -> operation
    GET  /api/v1/operations?state=&protocol=&tool=&limit= operations, newest first
    GET  /api/v1/operations/{call_node}                   the same object as ``finality show --json``
    POST /api/v1/operations/{call_node}/cancel            {actor, reason}
    GET  /api/v1/approvals                                pending input rounds
    POST /api/v1/approvals/{operation_id}/{round}         {actor, answer}; 409 for a stale round
    GET  /api/v1/reconciliation                           open entries
    POST /api/v1/reconciliation/{entry_id}/resolve        {actor, reason, task_id?, absent?}
    POST /api/v1/sql                                      {query, max_rows?} read-only, sandboxed
    GET  /api/v1/gates                                    the six gates with raw inputs (POST: also record the run)
    GET  /metrics                                         Prometheus text format

Presentation only: every decision is the executor's or the engine's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.errors import EngineError, InvalidRecord, SqlRefused
from engine.ledger import Ledger
from engine.runtime.report import operation_report
from engine.service.executor import Executor, ServiceError

Handler = Callable[[Request], Awaitable[Response]]


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=_default).encode()


def _error(status: int, message: str) -> JSON:
    return JSON({"error": message}, status_code=status)


async def _body(request: Request) -> dict[str, object]:
    try:
        value = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ServiceError(400, f"request body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ServiceError(400, "request body must be a JSON object")
    return value


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


def _guard(handler: Handler) -> Handler:
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ServiceError as exc:
            return _error(exc.status, str(exc))
        except SqlRefused as exc:
            return _error(400, str(exc))
        except InvalidRecord as exc:
            return _error(400, str(exc))
        except EngineError as exc:
            return _error(409, str(exc))

    return wrapped


def build_api(
    executor: Executor, ledger: Ledger, *, sql: Callable[[str, int], dict[str, object]] | None = None
) -> Starlette:
    """The ASGI app over one executor and its ledger."""
    registry = CollectorRegistry()
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
    unknown = Gauge(
        "finality_reconciliation_open", "Open reconciliation entries", ["kind"], registry=registry
    )

    async def health(request: Request) -> Response:
        return JSON(
            {
                "status": "ok",
                "in_flight": executor.in_flight,
                "epoch": executor.epoch,
                "servers": {name: protocol.value for name, protocol in executor.servers().items()},
            }
        )

    async def submit(request: Request) -> Response:
        body = await _body(request)
        arguments = body.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ServiceError(400, "'arguments' must be a JSON object")
        call_node = _text(body, "call_node")
        tool = _text(body, "tool")
        op = await executor.submit(
            call_node=call_node,
            tool=tool,
            arguments=arguments,
            principal=_optional(body, "principal"),
        )
        return JSON(operation_report(ledger, op.call_node_id), status_code=201)

    async def operations(request: Request) -> Response:
        q = request.query_params
        try:
            limit = min(int(q.get("limit", "100")), 10_000)
        except ValueError as exc:
            raise ServiceError(400, "limit must be an integer") from exc
        rows = ledger.list_operations(
            state=q.get("state"), protocol=q.get("protocol"), tool=q.get("tool"), limit=limit
        )
        return JSON({"operations": rows})

    async def show(request: Request) -> Response:
        report = operation_report(ledger, request.path_params["call_node"])
        if report is None:
            raise ServiceError(404, f"no operation for call node {request.path_params['call_node']!r}")
        return JSON(report)

    async def cancel(request: Request) -> Response:
        body = await _body(request)
        actor = _text(body, "actor")
        reason = _text(body, "reason")
        op = await executor.cancel(request.path_params["call_node"], actor=actor, reason=reason)
        return JSON(operation_report(ledger, op.call_node_id), status_code=202)

    async def approvals(request: Request) -> Response:
        return JSON({"approvals": ledger.approvals(pending_only=True)})

    async def answer(request: Request) -> Response:
        body = await _body(request)
        actor = _text(body, "actor")
        value = body.get("answer")
        if not isinstance(value, dict):
            raise ServiceError(400, "'answer' must be a JSON object")
        try:
            round_ = int(request.path_params["round"])
        except ValueError as exc:
            raise ServiceError(400, "round must be an integer") from exc
        op = await executor.answer(
            request.path_params["operation_id"], input_round=round_, answer=value, actor=actor
        )
        return JSON(operation_report(ledger, op.call_node_id))

    async def reconciliation(request: Request) -> Response:
        return JSON({"entries": ledger.reconciliation(open_only=request.query_params.get("all") is None)})

    async def resolve(request: Request) -> Response:
        body = await _body(request)
        actor = _text(body, "actor")
        reason = _text(body, "reason")
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

    async def run_sql(request: Request) -> Response:
        if sql is None:
            raise ServiceError(501, "the SQL sandbox is not enabled")
        body = await _body(request)
        query = _text(body, "query")
        max_rows = body.get("max_rows", 1000)
        if not isinstance(max_rows, int) or max_rows <= 0:
            raise ServiceError(400, "'max_rows' must be a positive integer")
        return JSON(sql(query, min(max_rows, 100_000)))

    async def gates(request: Request) -> Response:
        # Imported here: rollout sits above the engine and the API only presents its verdicts.
        from rollout.gates import Thresholds, evaluate

        now = executor.clock.now()
        report = evaluate(ledger.gate_inputs(now), Thresholds())
        run_id = ledger.record_gate_run(report.results, now) if request.method == "POST" else None
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
        in_flight.clear()
        for state, protocol, count in ledger.state_counts():
            in_flight.labels(state=state, protocol=protocol).set(count)
        requests.clear()
        for outcome, count in ledger.poll_counts():
            requests.labels(outcome=outcome).set(count)
        unknown.clear()
        for kind, count in ledger.open_reconciliation_counts():
            unknown.labels(kind=kind).set(count)
        ticks.set(executor.stats["ticks"])
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/api/v1/health", _guard(health)),
        Route("/api/v1/calls", _guard(submit), methods=["POST"]),
        Route("/api/v1/operations", _guard(operations)),
        Route("/api/v1/operations/{call_node}", _guard(show)),
        Route("/api/v1/operations/{call_node}/cancel", _guard(cancel), methods=["POST"]),
        Route("/api/v1/approvals", _guard(approvals)),
        Route("/api/v1/approvals/{operation_id}/{round}", _guard(answer), methods=["POST"]),
        Route("/api/v1/reconciliation", _guard(reconciliation)),
        Route("/api/v1/reconciliation/{entry_id}/resolve", _guard(resolve), methods=["POST"]),
        Route("/api/v1/sql", _guard(run_sql), methods=["POST"]),
        Route("/api/v1/gates", _guard(gates), methods=["GET", "POST"]),
        Route("/metrics", _guard(metrics)),
    ]
    return Starlette(routes=routes)
