"""MCP 2026-07-28 with the tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) at ``/mcp``.

Stateless: no ``initialize`` and no session; every request carries its protocol version and client
capabilities in ``_meta`` and mirrors method (and task id) in headers. Outcomes and input requests
come back inside ``tasks/get``; answers go in through ``tasks/update``. Renders store state only.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from refserver.clock import pause
from refserver.context import EPOCH_META_KEY, SERVER_NAME, SERVER_VERSION, ServerContext, Unauthenticated
from refserver.fault import Fault
from refserver.jsonrpc import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    SERVER_ERROR,
    RpcFault,
    RpcNotification,
    RpcRequest,
    RpcResponse,
    epoch_of,
    error_message,
    fault_reply,
    meta_of,
    parse_message,
    reply,
    require_str,
    result_message,
)
from refserver.mcpwire import (
    call_tool_result,
    elicitation_params,
    failure_fault,
    parse_tool_call,
    tool_json,
    valid_elicit_result,
)
from refserver.store import KeyConflict
from refserver.task import AnswerResult, Status, Task, View
from refserver.tool import CATALOG, TaskSupport, ToolFailure, ToolOutput
from refserver.wire import Delivery

PROTOCOL_VERSION: Final = "2026-07-28"
SUPPORTED_VERSIONS: Final = (PROTOCOL_VERSION,)
TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
PROTOCOL_VERSION_META: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META: Final = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_META: Final = "io.modelcontextprotocol/serverInfo"
HEADER_MISMATCH: Final = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY: Final = -32021
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022
# Methods whose Mcp-Name header must equal a params field (tools/call is checked only when sent).
_NAME_FIELD: Final = {"tasks/get": "taskId", "tasks/update": "taskId", "tasks/cancel": "taskId"}
_B64_HEADER = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")


@dataclass(frozen=True, slots=True)
class Envelope:
    """The per-request protocol fields, validated."""

    version: str
    tasks_opt_in: bool


Handler = Callable[[Request, RpcRequest, "str | None", Envelope], Awaitable[Response]]


def _header_value(raw: str | None) -> str | None:
    """Undo the ``=?base64?...?=`` wrapping MCP uses for header values that are not plain ASCII."""
    if raw is None:
        return None
    match = _B64_HEADER.match(raw)
    if match is None:
        return raw
    try:
        return base64.b64decode(match["payload"], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return raw


def check_envelope(message: RpcRequest, headers: Mapping[str, str]) -> Envelope:
    """The validation ladder: envelope keys, then headers, then the version (first failure wins).

    Raises:
        RpcFault: -32602 for a missing envelope, -32020 for headers that disagree with the body,
            -32022 for an unsupported version; all with HTTP 400.
    """
    meta = message.params.get("_meta")
    if not isinstance(meta, Mapping):
        raise RpcFault(
            INVALID_PARAMS,
            f"params._meta must carry {PROTOCOL_VERSION_META!r} and {CLIENT_CAPABILITIES_META!r}",
            http_status=400,
        )
    missing = [k for k in (PROTOCOL_VERSION_META, CLIENT_CAPABILITIES_META) if k not in meta]
    if missing:
        raise RpcFault(INVALID_PARAMS, f"params._meta is missing {', '.join(missing)}", http_status=400)
    version = meta[PROTOCOL_VERSION_META]
    if headers.get("mcp-protocol-version") != version:
        raise RpcFault(HEADER_MISMATCH, "MCP-Protocol-Version header does not match _meta", http_status=400)
    if headers.get("mcp-method") != message.method:
        raise RpcFault(
            HEADER_MISMATCH, "Mcp-Method header does not match the request method", http_status=400
        )
    name_field = _NAME_FIELD.get(message.method)
    name_header = _header_value(headers.get("mcp-name"))
    if name_field is not None and name_header != message.params.get(name_field):
        raise RpcFault(
            HEADER_MISMATCH, f"Mcp-Name header does not match params.{name_field}", http_status=400
        )
    if (
        message.method == "tools/call"
        and name_header is not None
        and name_header != message.params.get("name")
    ):
        raise RpcFault(HEADER_MISMATCH, "Mcp-Name header does not match params.name", http_status=400)
    if not isinstance(version, str):
        raise RpcFault(INVALID_PARAMS, "the protocol version must be a string", http_status=400)
    if version not in SUPPORTED_VERSIONS:
        raise RpcFault(
            UNSUPPORTED_PROTOCOL_VERSION,
            f"Unsupported protocol version: {version}",
            {"supported": list(SUPPORTED_VERSIONS), "requested": version},
            http_status=400,
        )
    capabilities = meta[CLIENT_CAPABILITIES_META]
    if not isinstance(capabilities, Mapping):
        raise RpcFault(INVALID_PARAMS, f"{CLIENT_CAPABILITIES_META} must be an object", http_status=400)
    extensions = capabilities.get("extensions")
    opted_in = isinstance(extensions, Mapping) and isinstance(extensions.get(TASKS_EXTENSION), Mapping)
    return Envelope(version, opted_in)


class Mcp2026:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.methods: dict[str, Handler] = {
            "server/discover": self._discover,
            "ping": self._ping,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
            "tasks/get": self._tasks_get,
            "tasks/update": self._tasks_update,
            "tasks/cancel": self._tasks_cancel,
        }

    def routes(self) -> list[Route]:
        return [Route("/mcp", self.endpoint, methods=["GET", "POST", "DELETE"])]

    def reset(self) -> None:
        """Nothing per-connection to forget: the protocol is stateless."""

    async def endpoint(self, request: Request) -> Response:
        try:
            principal = self.ctx.principal(request)
        except Unauthenticated as exc:
            fault = RpcFault(SERVER_ERROR, str(exc), http_status=401, headers={"www-authenticate": "Bearer"})
            return fault_reply(None, fault)
        if request.method != "POST":
            return Response(status_code=405, headers={"allow": "POST"})
        try:
            message = parse_message(await request.body())
        except RpcFault as fault:
            return fault_reply(None, fault)
        if isinstance(message, RpcNotification):
            self.store.note_request(message.method)
            return Response(status_code=202)
        if isinstance(message, RpcResponse):
            # This server never sends requests on 2026-07-28, so there is nothing to match.
            self.store.note_request("response")
            return Response(status_code=202)
        self.store.note_request(message.method)
        try:
            if message.method == "initialize":
                raise RpcFault(
                    METHOD_NOT_FOUND, "Method not found: initialize (2026-07-28 uses server/discover)"
                )
            envelope = check_envelope(message, request.headers)
            handler = self.methods.get(message.method)
            if handler is None:
                raise RpcFault(METHOD_NOT_FOUND, f"Method not found: {message.method}")
            return await handler(request, message, principal, envelope)
        except RpcFault as fault:
            if fault.http_status != 200:
                return fault_reply(message.id, fault)
            return reply(request, error_message(message.id, fault))

    # -- rendering ---------------------------------------------------------------------------------

    def _task_base(self, task: Task, view: View, task_id: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "taskId": task_id or task.task_id,
            "status": view.status.value,
            "createdAt": self.store.iso(task.created_at),
            "lastUpdatedAt": self.store.iso(view.updated_at),
            "ttlMs": self.store.ttl_ms(task),
            "pollIntervalMs": self.store.poll_interval_ms(task),
        }
        if view.status_message:
            out["statusMessage"] = view.status_message
        return out

    def _detailed(self, task: Task, view: View, request_epoch: int | None = None) -> dict[str, Any]:
        echo = task.echo_for(request_epoch)
        out = self._task_base(task, view)
        out["resultType"] = "complete"
        if view.status is Status.COMPLETED and isinstance(view.outcome, ToolOutput):
            out["result"] = {
                **call_tool_result(view.outcome, echo, None),
                "resultType": "complete",
            }
        elif view.status is Status.FAILED:
            if isinstance(view.outcome, ToolFailure):
                out["error"] = failure_fault(view.outcome, echo, None).error()
            elif isinstance(view.outcome, ToolOutput):  # not reached: isError completes on this version
                out["error"] = {"code": -32603, "message": view.outcome.text}
        elif view.status is Status.INPUT_REQUIRED and view.input_round is not None:
            request = {"method": "elicitation/create", "params": elicitation_params(view.input_round, None)}
            out["inputRequests"] = {view.input_round.key: request}
        return out

    def _lookup(self, message: RpcRequest, principal: str | None) -> Task:
        task_id = require_str(message.params, "taskId")
        task = self.store.lookup(task_id, principal)
        if task is None:
            raise RpcFault(INVALID_PARAMS, f"Invalid params: task not found: {task_id}")
        return task

    # -- methods -----------------------------------------------------------------------------------

    async def _discover(
        self, request: Request, message: RpcRequest, principal: str | None, env: Envelope
    ) -> Response:
        tools: dict[str, Any] = {"listChanged": False}
        if self.ctx.options.idempotency:
            tools["idempotency"] = {}
        result = {
            "resultType": "complete",
            "supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": {"tools": tools, "extensions": {TASKS_EXTENSION: {}}},
            "cacheScope": "public",
            "ttlMs": 0,
            "instructions": "Finality reference server (MCP 2026-07-28, tasks extension). Behaviour is driven by `_sim`.",
            "_meta": {SERVER_INFO_META: {"name": SERVER_NAME, "version": SERVER_VERSION}},
        }
        return reply(request, result_message(message.id, result))

    async def _ping(
        self, request: Request, message: RpcRequest, principal: str | None, env: Envelope
    ) -> Response:
        return reply(request, result_message(message.id, {"resultType": "complete"}))

    async def _tools_list(
        self, request: Request, message: RpcRequest, principal: str | None, env: Envelope
    ) -> Response:
        tools = [tool_json(spec, with_execution=False) for spec in CATALOG.values()]
        body = {"tools": tools, "resultType": "complete", "cacheScope": "public", "ttlMs": 0}
        return reply(request, result_message(message.id, body))

    async def _tools_call(
        self, request: Request, message: RpcRequest, principal: str | None, env: Envelope
    ) -> Response:
        call = parse_tool_call(
            message.params, time_scale=self.ctx.options.time_scale, idempotency=self.ctx.options.idempotency
        )
        if call.spec.task_support is TaskSupport.FORBIDDEN or call.sim.is_short:
            outcome = self.store.run_sync(call.spec, call.echo, call.sim)
            await pause(call.sim.duration_s)
            if isinstance(outcome, ToolFailure):
                raise failure_fault(outcome, call.epoch, None)
            result = {**call_tool_result(outcome, call.epoch, None), "resultType": "complete"}
            return reply(request, result_message(message.id, result))
        if not env.tasks_opt_in:
            raise RpcFault(
                MISSING_REQUIRED_CLIENT_CAPABILITY,
                f"Tool {call.spec.name} runs as a task; declare the {TASKS_EXTENSION} extension",
                {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        try:
            submission = self.store.submit(
                tool=call.spec,
                arguments=call.arguments,
                echo=call.echo,
                sim=call.sim,
                principal=principal,
                key=call.key,
                epoch=call.epoch,
            )
        except KeyConflict as exc:
            raise RpcFault(
                INVALID_PARAMS, f"Invalid params: idempotencyKey {exc.key!r} reused with different arguments"
            ) from exc
        self.ctx.notify()
        task = submission.task
        delivery, delay_s = self.ctx.create_delivery(task) if submission.created else (Delivery.NORMAL, 0.0)
        body = {
            **self._task_base(task, task.view(self.store.now()), submission.reported_id),
            "resultType": "task",
        }
        return reply(request, result_message(message.id, body), delivery=delivery, delay_s=delay_s)

    async def _tasks_get(
        self, request: Request, message: RpcRequest, principal: str | None, env: Envelope
    ) -> Response:
        task = self._lookup(message, principal)
        for fault, status in ((Fault.POLL_429, 429), (Fault.POLL_503, 503)):
            params = task.faults.take(fault, "tasks/get")
            if params is not None:
                text = "Too Many Requests" if status == 429 else "Service Unavailable"
                refusal = RpcFault(
                    SERVER_ERROR,
                    f"{text}; retry after {params.retry_after_s} s",
                    http_status=status,
                    headers={"retry-after": str(params.retry_after_s)},
                )
                return fault_reply(message.id, refusal)
        if task.faults.take(Fault.NOT_FOUND_BEFORE_EXPIRY, "tasks/get"):
            raise RpcFault(INVALID_PARAMS, f"Invalid params: task not found: {task.task_id}")
        if task.terminal and task.faults.take(Fault.POLL_OUT_OF_ORDER, "tasks/get"):
            view = task.stale_view()
        else:
            view = task.view(self.store.now())
        delivery, delay_s = Delivery.NORMAL, 0.0
        if view.outcome is not None and task.faults.take(Fault.RESULT_LOST, "tasks/get"):
            delivery = Delivery.BROKEN
        elif view.outcome is not None and task.faults.take(Fault.RESULT_TRUNCATED, "tasks/get"):
            delivery = Delivery.TRUNCATED
        else:
            delivery, delay_s = self.ctx.delivery_for(task, "tasks/get")
        return reply(
            request,
            result_message(
                message.id, self._detailed(task, view, epoch_of(meta_of(message.params), EPOCH_META_KEY))
            ),
            delivery=delivery,
            delay_s=delay_s,
        )

    async def _tasks_update(
        self, request: Request, message: RpcRequest, principal: str | None, env: Envelope
    ) -> Response:
        task = self._lookup(message, principal)
        responses = message.params.get("inputResponses")
        if not isinstance(responses, Mapping):
            raise RpcFault(INVALID_PARAMS, "Invalid params: 'inputResponses' must be an object")
        now = self.store.now()
        for key, value in responses.items():
            pending = task.pending_round()
            if pending is None or pending.key != key:
                # Stale or unknown keys are ignored, as the extension asks of servers.
                self.store.note_stale_answer()
                continue
            answer = valid_elicit_result(value)
            if answer is None:
                raise RpcFault(
                    INVALID_PARAMS, f"Invalid params: inputResponses[{key!r}] is not an elicitation result"
                )
            if task.answer(key, answer, now) is not AnswerResult.ACCEPTED:
                self.store.note_stale_answer()
        self.ctx.notify()
        delivery, delay_s = self.ctx.delivery_for(task, "tasks/update")
        return reply(
            request,
            result_message(message.id, {"resultType": "complete"}),
            delivery=delivery,
            delay_s=delay_s,
        )

    async def _tasks_cancel(
        self, request: Request, message: RpcRequest, principal: str | None, env: Envelope
    ) -> Response:
        task = self._lookup(message, principal)
        if task.faults.take(Fault.NOT_FOUND_ON_CANCEL, "tasks/cancel"):
            # A server that lost the task (a restart): the cancel changes nothing.
            raise RpcFault(INVALID_PARAMS, f"Invalid params: task not found: {task.task_id}")
        task.request_cancel(self.store.now(), self.store.config.cancel_delay_s)
        self.ctx.notify()
        if task.faults.take(Fault.CANCEL_ACK_LOST, "tasks/cancel"):
            delivery, delay_s = Delivery.BROKEN, 0.0
        else:
            delivery, delay_s = self.ctx.delivery_for(task, "tasks/cancel")
        return reply(
            request,
            result_message(message.id, {"resultType": "complete"}),
            delivery=delivery,
            delay_s=delay_s,
        )


__all__ = [
    "CLIENT_CAPABILITIES_META",
    "HEADER_MISMATCH",
    "MISSING_REQUIRED_CLIENT_CAPABILITY",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSION_META",
    "SERVER_INFO_META",
    "SUPPORTED_VERSIONS",
    "TASKS_EXTENSION",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "Envelope",
    "Handler",
    "Mcp2026",
    "check_envelope",
]
