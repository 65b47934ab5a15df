"""Google AIP-151 long-running operations over HTTP/JSON, with AIP-155 request ids and AIP-193 errors.

``POST /v1/tools/{tool}:run`` starts an operation; ``/v1/operations`` gets, lists, cancels (best effort)
and deletes them. Input rounds do not exist here, so ``_sim.input_rounds`` is ignored. Renders store
state only.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from refserver.context import ServerContext, Unauthenticated
from refserver.fault import Fault
from refserver.sim import SimError, parse_sim, split_arguments
from refserver.store import KeyConflict
from refserver.task import TERMINAL, Status, Task, View
from refserver.tool import CATALOG, ToolFailure, ToolOutput
from refserver.wire import Delivery, Reply

DOMAIN: Final = "refserver.finality.dev"
METADATA_TYPE: Final = "type.googleapis.com/finality.ref.RunMetadata"
RESULT_TYPE: Final = "type.googleapis.com/finality.ref.ToolResult"
ERROR_INFO_TYPE: Final = "type.googleapis.com/google.rpc.ErrorInfo"
# google.rpc.Code values used inside Operation.error.
CODE_CANCELLED: Final = 1
CODE_INTERNAL: Final = 13
_HTTP_STATUS_NAMES: Final = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
}
_MAX_PAGE_SIZE: Final = 1000
_FILTER_TERM = re.compile(r'^\s*(?P<field>[A-Za-z_.]+)\s*(?P<op>=|:)\s*(?P<value>"[^"]*"|\S+)\s*$')
_FILTER_FIELDS: Final = {
    "request_id": "request_id",
    "requestId": "request_id",
    "metadata.request_id": "request_id",
    "metadata.requestId": "request_id",
    "tool": "tool",
    "metadata.tool": "tool",
    "done": "done",
    "name": "name",
}
_BODY_FIELDS: Final = frozenset({"request_id", "arguments", "epoch"})


class AipError(Exception):
    """An AIP-193 error response."""

    def __init__(
        self,
        http_status: int,
        message: str,
        reason: str,
        metadata: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        self.headers = dict(headers or {})

    def reply(self) -> Reply:
        return Reply(
            error_json(self.http_status, self.message, self.reason, self.metadata),
            self.http_status,
            self.headers or None,
        )


def error_info(reason: str, metadata: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"@type": ERROR_INFO_TYPE, "reason": reason, "domain": DOMAIN, "metadata": dict(metadata or {})}


def error_json(
    http_status: int, message: str, reason: str, metadata: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "code": http_status,
            "message": message,
            "status": _HTTP_STATUS_NAMES.get(http_status, "UNKNOWN"),
            "details": [error_info(reason, metadata)],
        }
    }


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"ops:{offset}".encode()).decode()


def _decode_token(token: str) -> int:
    try:
        prefix, _, number = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        offset = int(number)
        if prefix != "ops" or offset < 0:
            raise ValueError(token)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AipError(400, "invalid page_token", "INVALID_PAGE_TOKEN") from exc
    return offset


def parse_filter(text: str, *, request_id: bool = True) -> list[tuple[str, str]]:
    """Parse ``field = value [AND field = value ...]``; fields: request_id, tool, done, name.

    Raises:
        AipError: 400 for anything else.
    """
    terms: list[tuple[str, str]] = []
    if not text.strip():
        return terms
    for part in re.split(r"\s+AND\s+", text.strip()):
        match = _FILTER_TERM.match(part)
        known = match is not None and match["field"] in _FILTER_FIELDS
        if match is None or not known or (_FILTER_FIELDS[match["field"]] == "request_id" and not request_id):
            raise AipError(400, f"unsupported filter term {part!r}", "INVALID_FILTER", {"filter": text})
        value = match["value"]
        if value.startswith('"'):
            value = value[1:-1]
        terms.append((_FILTER_FIELDS[match["field"]], value))
    return terms


def _matches(task: Task, terms: list[tuple[str, str]]) -> bool:
    for field, value in terms:
        actual: str | None
        if field == "request_id":
            actual = task.key
        elif field == "tool":
            actual = task.tool
        elif field == "done":
            actual = "true" if task.terminal else "false"
            value = value.lower()
        else:
            actual = f"operations/{task.task_id}"
            value = value if value.startswith("operations/") else f"operations/{value}"
        if actual != value:
            return False
    return True


class Aip151:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        # Creates cut by create_request_lost, by (principal, request_id): each is dropped once only.
        self._dropped: set[tuple[str | None, str]] = set()

    def routes(self) -> list[Route]:
        return [
            Route("/v1/tools/{spec}", self.run, methods=["POST"]),
            Route("/v1/operations", self.list_operations, methods=["GET"]),
            Route("/v1/operations/{spec}", self.operation, methods=["GET", "POST", "DELETE"]),
        ]

    def reset(self) -> None:
        """Forget which creates were dropped (no per-connection state)."""
        self._dropped.clear()

    # -- rendering ---------------------------------------------------------------------------------

    def _operation(
        self, task: Task, view: View, op_id: str | None = None, request_epoch: int | None = None
    ) -> dict[str, Any]:
        echo = task.echo_for(request_epoch)
        metadata: dict[str, Any] = {
            "@type": METADATA_TYPE,
            "tool": task.tool,
            "progress": round(view.progress * 100),
            "createTime": self.store.iso(task.created_at),
            "updateTime": self.store.iso(view.updated_at),
            "cancelRequested": task.cancel_requested_at is not None,
        }
        if task.key is not None:
            metadata["requestId"] = task.key
        op: dict[str, Any] = {
            "name": f"operations/{op_id or task.task_id}",
            "metadata": metadata,
            "done": view.status in TERMINAL,
        }
        if view.status is Status.CANCELLED:
            op["error"] = {
                "code": CODE_CANCELLED,
                "message": "operation cancelled",
                "details": [error_info("CANCELLED", {"tool": task.tool})],
            }
        elif isinstance(view.outcome, ToolOutput):
            response: dict[str, Any] = {
                "@type": RESULT_TYPE,
                "tool": task.tool,
                "content": [{"type": "text", "text": view.outcome.text}],
                "structuredContent": dict(view.outcome.structured),
                "isError": view.outcome.is_error,
            }
            if echo is not None:
                response["epoch"] = echo
            op["response"] = response
        elif isinstance(view.outcome, ToolFailure):
            info: dict[str, str] = {"tool": task.tool}
            if echo is not None:
                info["epoch"] = str(echo)
            op["error"] = {
                "code": CODE_INTERNAL,
                "message": view.outcome.message,
                "details": [error_info(view.outcome.reason, info)],
            }
        return op

    def _lookup(self, op_id: str, principal: str | None) -> Task:
        task = self.store.lookup(op_id, principal)
        if task is None:
            raise AipError(
                404,
                f"operation operations/{op_id} not found",
                "OPERATION_NOT_FOUND",
                {"name": f"operations/{op_id}"},
            )
        return task

    def _principal(self, request: Request) -> str | None:
        try:
            return self.ctx.principal(request)
        except Unauthenticated as exc:
            raise AipError(401, str(exc), "UNAUTHENTICATED", headers={"www-authenticate": "Bearer"}) from exc

    # -- endpoints ---------------------------------------------------------------------------------

    async def run(self, request: Request) -> Response:
        self.store.note_request("Run")
        try:
            return await self._run(request)
        except AipError as exc:
            return exc.reply()

    async def _run(self, request: Request) -> Response:
        principal = self._principal(request)
        name, _, verb = request.path_params["spec"].rpartition(":")
        spec = CATALOG.get(name)
        if verb != "run" or spec is None:
            raise AipError(404, f"no such method: {request.url.path}", "TOOL_NOT_FOUND", {"tool": name})
        try:
            body = json.loads(await request.body())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise AipError(400, f"request body is not JSON: {exc}", "MALFORMED_BODY") from exc
        if not isinstance(body, dict):
            raise AipError(400, "request body must be a JSON object", "MALFORMED_BODY")
        unknown = set(body) - _BODY_FIELDS
        if unknown:
            raise AipError(400, f"unknown field(s): {', '.join(sorted(unknown))}", "UNKNOWN_FIELD")
        request_id = body.get("request_id")
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise AipError(400, "request_id must be a non-empty string", "INVALID_REQUEST_ID")
        arguments = body.get("arguments", {})
        if not isinstance(arguments, dict):
            raise AipError(400, "arguments must be an object", "INVALID_ARGUMENTS")
        epoch = body.get("epoch")
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
            raise AipError(400, "epoch must be an integer", "INVALID_EPOCH")
        echo, sim_raw = split_arguments(arguments)
        try:
            sim = parse_sim(
                sim_raw, default_duration_ms=spec.default_duration_ms, time_scale=self.ctx.options.time_scale
            )
        except SimError as exc:
            raise AipError(400, str(exc), "INVALID_SIM") from exc
        if not self.ctx.options.request_id:
            request_id = None  # accepted and ignored, as AIP-155 allows
        if any(f.fault is Fault.CREATE_REQUEST_LOST for f in sim.faults):
            dropped = (
                principal,
                request_id if request_id is not None else json.dumps(arguments, sort_keys=True),
            )
            if dropped not in self._dropped:
                # The request "never arrived": the connection breaks before anything is recorded.
                self._dropped.add(dropped)
                return Reply({}, delivery=Delivery.BROKEN)
        try:
            submission = self.store.submit(
                tool=spec,
                arguments=arguments,
                echo=echo,
                # AIP-151 has no mid-operation input.
                sim=dataclasses.replace(sim, input_rounds=0),
                principal=principal,
                key=request_id,
                epoch=epoch,
            )
        except KeyConflict as exc:
            raise AipError(
                409,
                f"request_id {exc.key!r} was already used with a different request",
                "REQUEST_ID_REUSED",
                {"request_id": exc.key, "operation": f"operations/{exc.task_id}"},
            ) from exc
        self.ctx.notify()
        task = submission.task
        delivery, delay_s = self.ctx.create_delivery(task) if submission.created else (Delivery.NORMAL, 0.0)
        # A repeat after deletion answers with the last state of the original: AIP-155's "stale success".
        view = task.view(self.store.now())
        return Reply(self._operation(task, view, submission.reported_id), delivery=delivery, delay_s=delay_s)

    async def operation(self, request: Request) -> Response:
        spec: str = request.path_params["spec"]
        method = request.method
        if method == "POST":
            op_id, _, verb = spec.rpartition(":")
            self.store.note_request("CancelOperation" if verb == "cancel" else "Unknown")
        else:
            op_id, verb = spec, ""
            self.store.note_request("GetOperation" if method == "GET" else "DeleteOperation")
        try:
            principal = self._principal(request)
            if method == "GET":
                return self._get(op_id, principal, _header_epoch(request))
            if method == "DELETE":
                return self._delete(op_id, principal)
            if verb != "cancel" or not op_id:
                raise AipError(404, f"no such method: {request.url.path}", "METHOD_NOT_FOUND")
            return self._cancel(op_id, principal)
        except AipError as exc:
            return exc.reply()

    def _get(self, op_id: str, principal: str | None, request_epoch: int | None = None) -> Response:
        task = self._lookup(op_id, principal)
        for fault, status, reason in (
            (Fault.POLL_429, 429, "RATE_LIMITED"),
            (Fault.POLL_503, 503, "BACKEND_UNAVAILABLE"),
        ):
            params = task.faults.take(fault, "GetOperation")
            if params is not None:
                raise AipError(
                    status,
                    f"try again in {params.retry_after_s} s",
                    reason,
                    headers={"retry-after": str(params.retry_after_s)},
                )
        if task.faults.take(Fault.NOT_FOUND_BEFORE_EXPIRY, "GetOperation"):
            raise AipError(
                404,
                f"operation operations/{op_id} not found",
                "OPERATION_NOT_FOUND",
                {"name": f"operations/{op_id}"},
            )
        if task.terminal and task.faults.take(Fault.POLL_OUT_OF_ORDER, "GetOperation"):
            view = task.stale_view()
        else:
            view = task.view(self.store.now())
        delivery, delay_s = Delivery.NORMAL, 0.0
        if view.outcome is not None and task.faults.take(Fault.RESULT_LOST, "GetOperation"):
            delivery = Delivery.BROKEN
        elif view.outcome is not None and task.faults.take(Fault.RESULT_TRUNCATED, "GetOperation"):
            delivery = Delivery.TRUNCATED
        else:
            delivery, delay_s = self.ctx.delivery_for(task, "GetOperation")
        return Reply(
            self._operation(task, view, request_epoch=request_epoch), delivery=delivery, delay_s=delay_s
        )

    def _cancel(self, op_id: str, principal: str | None) -> Response:
        task = self._lookup(op_id, principal)
        task.request_cancel(self.store.now(), self.store.config.cancel_delay_s)
        self.ctx.notify()
        if task.faults.take(Fault.CANCEL_ACK_LOST, "CancelOperation"):
            return Reply({}, delivery=Delivery.BROKEN)
        delivery, delay_s = self.ctx.delivery_for(task, "CancelOperation")
        return Reply({}, delivery=delivery, delay_s=delay_s)

    def _delete(self, op_id: str, principal: str | None) -> Response:
        task = self._lookup(op_id, principal)
        # DeleteOperation means "not interested": the work itself goes on (and stays in the log).
        self.store.delete(task, "deleted by client")
        delivery, delay_s = self.ctx.delivery_for(task, "DeleteOperation")
        return Reply({}, delivery=delivery, delay_s=delay_s)

    async def list_operations(self, request: Request) -> Response:
        self.store.note_request("ListOperations")
        try:
            principal = self._principal(request)
            query = request.query_params
            terms = parse_filter(query.get("filter", ""), request_id=self.ctx.options.request_id)
            size_raw = query.get("page_size") or query.get("pageSize") or ""
            token = query.get("page_token") or query.get("pageToken") or ""
            try:
                size = int(size_raw) if size_raw else self.ctx.options.page_size
            except ValueError as exc:
                raise AipError(400, "page_size must be an integer", "INVALID_PAGE_SIZE") from exc
            if size < 0:
                raise AipError(400, "page_size must not be negative", "INVALID_PAGE_SIZE")
            size = min(size or self.ctx.options.page_size, _MAX_PAGE_SIZE)
            offset = _decode_token(token) if token else 0
            tasks = [t for t in self.store.visible(principal) if _matches(t, terms)]
            now = self.store.now()
            page = tasks[offset : offset + size]
            body: dict[str, Any] = {
                "operations": [self._operation(t, t.view(now, consume_replay=False)) for t in page]
            }
            if offset + size < len(tasks):
                body["nextPageToken"] = _encode_token(offset + size)
            return Reply(body)
        except AipError as exc:
            return exc.reply()


EPOCH_HEADER: Final = "x-finality-epoch"


def _header_epoch(request: Request) -> int | None:
    """The asking executor's epoch, from the ``X-Finality-Epoch`` header (GET has no body)."""
    raw = request.headers.get(EPOCH_HEADER)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise AipError(400, f"{EPOCH_HEADER} must be an integer", "INVALID_EPOCH") from exc


__all__ = [
    "CODE_CANCELLED",
    "CODE_INTERNAL",
    "DOMAIN",
    "EPOCH_HEADER",
    "ERROR_INFO_TYPE",
    "METADATA_TYPE",
    "RESULT_TYPE",
    "Aip151",
    "AipError",
    "error_info",
    "error_json",
    "parse_filter",
]
