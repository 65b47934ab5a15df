"""MCP 2025-11-25 with tasks (SEP-1686) over Streamable HTTP at ``/mcp``.

Sessions come from ``initialize``; tasks are bound to the bearer principal, not to the session.
Input rounds are ``elicitation/create`` requests sent on the SSE stream of an open ``tasks/result``;
the answer is a JSON-RPC response POSTed to ``/mcp``. Renders store state; never moves time itself.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from refserver.clock import pause
from refserver.context import EPOCH_META_KEY, SERVER_NAME, SERVER_VERSION, ServerContext, Unauthenticated
from refserver.fault import Fault
from refserver.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
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
    optional_int,
    parse_message,
    reply,
    require_str,
    result_message,
    sse_chunks,
)
from refserver.mcpwire import (
    RELATED_TASK_KEY,
    call_tool_result,
    elicitation_params,
    failure_fault,
    parse_tool_call,
    tool_json,
    valid_elicit_result,
)
from refserver.store import KeyConflict
from refserver.task import AnswerResult, CancelRejected, InputRound, Task, View
from refserver.tool import CATALOG, TaskSupport, ToolFailure, ToolOutput
from refserver.wire import ABORT, Abort, Delivery, EventStream, Reply, accepts_sse, sse_event

PROTOCOL_VERSION: Final = "2025-11-25"

Handler = Callable[[Request, RpcRequest, "str | None"], Awaitable[Response]]


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"tasks:{offset}".encode()).decode()


def _decode_cursor(cursor: object) -> int:
    try:
        if not isinstance(cursor, str):
            raise ValueError(cursor)
        prefix, _, number = base64.urlsafe_b64decode(cursor.encode()).decode().partition(":")
        if prefix != "tasks":
            raise ValueError(cursor)
        offset = int(number)
        if offset < 0:
            raise ValueError(cursor)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RpcFault(INVALID_PARAMS, "Invalid params: unknown cursor") from exc
    return offset


class Mcp2025:
    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx
        self.store = ctx.store
        self.sessions: set[str] = set()
        self.methods: dict[str, Handler] = {
            "ping": self._ping,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
            "tasks/get": self._tasks_get,
            "tasks/result": self._tasks_result,
            "tasks/cancel": self._tasks_cancel,
            "tasks/list": self._tasks_list,
        }

    def routes(self) -> list[Route]:
        return [Route("/mcp", self.endpoint, methods=["GET", "POST", "DELETE"])]

    def reset(self) -> None:
        """Sessions survive an admin reset so that a test's open client keeps working."""

    # -- transport ---------------------------------------------------------------------------------

    async def endpoint(self, request: Request) -> Response:
        try:
            principal = self.ctx.principal(request)
        except Unauthenticated as exc:
            fault = RpcFault(SERVER_ERROR, str(exc), http_status=401, headers={"www-authenticate": "Bearer"})
            return fault_reply(None, fault)
        if request.method == "GET":
            # No standalone server-to-client stream: input requests travel on tasks/result streams.
            return Response(status_code=405, headers={"allow": "POST, DELETE"})
        if request.method == "DELETE":
            self.sessions.discard(request.headers.get("mcp-session-id", ""))
            return Response(status_code=200)
        try:
            message = parse_message(await request.body())
        except RpcFault as fault:
            return fault_reply(None, fault)
        if isinstance(message, RpcRequest) and message.method == "initialize":
            self.store.note_request("initialize")
            return self._initialize(request, message)
        request_id = message.id if isinstance(message, RpcRequest | RpcResponse) else None
        refusal = self._session_refusal(request)
        if refusal is not None:
            return fault_reply(request_id, refusal)
        if isinstance(message, RpcNotification):
            self.store.note_request(message.method)
            return Response(status_code=202)
        if isinstance(message, RpcResponse):
            self.store.note_request("response")
            return self._client_response(message, principal)
        self.store.note_request(message.method)
        handler = self.methods.get(message.method)
        try:
            if handler is None:
                raise RpcFault(METHOD_NOT_FOUND, f"Method not found: {message.method}")
            return await handler(request, message, principal)
        except RpcFault as fault:
            return reply(request, error_message(message.id, fault))

    def _session_refusal(self, request: Request) -> RpcFault | None:
        session = request.headers.get("mcp-session-id")
        if session is None:
            return RpcFault(
                INVALID_REQUEST, "Bad Request: Mcp-Session-Id header is required", http_status=400
            )
        if session not in self.sessions:
            return RpcFault(INVALID_REQUEST, "Not Found: unknown or terminated session", http_status=404)
        version = request.headers.get("mcp-protocol-version")
        if version is not None and version != PROTOCOL_VERSION:
            return RpcFault(
                INVALID_REQUEST, f"Bad Request: unsupported MCP-Protocol-Version {version!r}", http_status=400
            )
        return None

    def _initialize(self, request: Request, message: RpcRequest) -> Response:
        session = secrets.token_urlsafe(16)
        self.sessions.add(session)
        tools: dict[str, Any] = {"listChanged": False}
        if self.ctx.options.idempotency:
            tools["idempotency"] = {}
        tasks: dict[str, Any] = {"list": {}, "requests": {"tools": {"call": {}}}}
        if self.ctx.options.cancel:
            tasks["cancel"] = {}
        result = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {
                "tools": tools,
                "tasks": tasks,
            },
            "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
            "instructions": "Finality reference server (MCP 2025-11-25 tasks). Behaviour is driven by `_sim`.",
        }
        return reply(request, result_message(message.id, result), headers={"mcp-session-id": session})

    def _client_response(self, message: RpcResponse, principal: str | None) -> Response:
        key = str(message.id)
        shared = self.ctx.options.elicitation_id
        if shared is not None and key == str(shared):
            # One id for every elicitation: the only thing that says which task an answer is for is
            # its related-task tag, and the answer goes to whatever round that task has open.
            task = self._task_of_answer(message, principal)
            pending = task.pending_round() if task is not None else None
            if task is None or pending is None:
                self.store.note_stale_answer()
                return Response(status_code=202)
            key = pending.key
        else:
            task = self.store.find_round(key, principal)
        if task is None:
            # An answer to nothing we asked (or to a replayed round already answered): ignored.
            self.store.note_stale_answer()
            return Response(status_code=202)
        if message.error is not None:
            answer: dict[str, Any] = {"action": "cancel"}
        else:
            valid = valid_elicit_result(message.result)
            if valid is None:
                fault = RpcFault(INVALID_PARAMS, "elicitation result needs action accept, decline or cancel")
                return Reply(error_message(message.id, fault), 400)
            answer = dict(valid)
        if task.answer(key, answer, self.store.now()) is AnswerResult.STALE:
            self.store.note_stale_answer()
        self.ctx.notify()
        return Response(status_code=202)

    def _task_of_answer(self, message: RpcResponse, principal: str | None) -> Task | None:
        result = message.result if isinstance(message.result, dict) else {}
        meta = result.get("_meta")
        related = meta.get(RELATED_TASK_KEY) if isinstance(meta, dict) else None
        task_id = related.get("taskId") if isinstance(related, dict) else None
        return self.store.lookup(task_id, principal) if isinstance(task_id, str) else None

    # -- rendering ---------------------------------------------------------------------------------

    def _task_json(self, task: Task, view: View, task_id: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "taskId": task_id or task.task_id,
            "status": view.status.value,
            "createdAt": self.store.iso(task.created_at),
            "lastUpdatedAt": self.store.iso(view.updated_at),
            "ttl": self.store.ttl_ms(task),
            "pollInterval": self.store.poll_interval_ms(task),
        }
        if view.status_message:
            out["statusMessage"] = view.status_message
        return out

    def _final_message(self, request_id: Any, task: Task, request_epoch: int | None = None) -> dict[str, Any]:
        outcome = task.outcome
        echo = task.echo_for(request_epoch)
        if isinstance(outcome, ToolOutput):
            return result_message(request_id, call_tool_result(outcome, echo, task.task_id))
        if isinstance(outcome, ToolFailure):
            return error_message(request_id, failure_fault(outcome, echo, task.task_id))
        data = {"_meta": {RELATED_TASK_KEY: {"taskId": task.task_id}}}
        return error_message(
            request_id, RpcFault(INTERNAL_ERROR, "task was cancelled; no result stored", data)
        )

    def _final_delivery(self, task: Task) -> tuple[Delivery, float]:
        if task.outcome is not None:
            if task.faults.take(Fault.RESULT_LOST, "tasks/result"):
                return Delivery.BROKEN, 0.0
            if task.faults.take(Fault.RESULT_TRUNCATED, "tasks/result"):
                return Delivery.TRUNCATED, 0.0
        return self.ctx.delivery_for(task, "tasks/result")

    def _lookup(self, message: RpcRequest, principal: str | None) -> Task:
        task_id = require_str(message.params, "taskId")
        task = self.store.lookup(task_id, principal)
        if task is None:
            raise RpcFault(INVALID_PARAMS, f"Invalid params: task not found: {task_id}")
        return task

    # -- methods -----------------------------------------------------------------------------------

    async def _ping(self, request: Request, message: RpcRequest, principal: str | None) -> Response:
        return reply(request, result_message(message.id, {}))

    async def _tools_list(self, request: Request, message: RpcRequest, principal: str | None) -> Response:
        tools = [tool_json(spec, with_execution=True) for spec in CATALOG.values()]
        return reply(request, result_message(message.id, {"tools": tools}))

    async def _tools_call(self, request: Request, message: RpcRequest, principal: str | None) -> Response:
        call = parse_tool_call(
            message.params, time_scale=self.ctx.options.time_scale, idempotency=self.ctx.options.idempotency
        )
        task_param = message.params.get("task")
        if task_param is not None:
            if not isinstance(task_param, dict):
                raise RpcFault(INVALID_PARAMS, "Invalid params: 'task' must be an object")
            if call.spec.task_support is TaskSupport.FORBIDDEN:
                raise RpcFault(
                    METHOD_NOT_FOUND, f"Tool {call.spec.name} does not support task-augmented execution"
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
                    requested_ttl_ms=optional_int(task_param, "ttl"),
                )
            except KeyConflict as exc:
                raise RpcFault(
                    INVALID_PARAMS,
                    f"Invalid params: idempotencyKey {exc.key!r} reused with different arguments",
                ) from exc
            self.ctx.notify()
            task = submission.task
            delivery, delay_s = (
                self.ctx.create_delivery(task) if submission.created else (Delivery.NORMAL, 0.0)
            )
            body = {"task": self._task_json(task, task.view(self.store.now()), submission.reported_id)}
            return reply(request, result_message(message.id, body), delivery=delivery, delay_s=delay_s)
        if call.spec.task_support is TaskSupport.REQUIRED:
            raise RpcFault(METHOD_NOT_FOUND, f"Tool {call.spec.name} requires task-augmented execution")
        outcome = self.store.run_sync(call.spec, call.echo, call.sim)
        await pause(call.sim.duration_s)
        if isinstance(outcome, ToolFailure):
            raise failure_fault(outcome, call.epoch, None)
        return reply(request, result_message(message.id, call_tool_result(outcome, call.epoch, None)))

    async def _tasks_get(self, request: Request, message: RpcRequest, principal: str | None) -> Response:
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
        delivery, delay_s = self.ctx.delivery_for(task, "tasks/get")
        return reply(
            request,
            result_message(message.id, self._task_json(task, view)),
            delivery=delivery,
            delay_s=delay_s,
        )

    async def _tasks_result(self, request: Request, message: RpcRequest, principal: str | None) -> Response:
        task = self._lookup(message, principal)
        needs_input = task.rounds_answered < task.sim.input_rounds or task.stream_replay_due
        if accepts_sse(request) and not task.terminal and needs_input:
            return EventStream(self._result_events(request, message, task))
        if not await self.ctx.wait_until(task, request, lambda t: t.terminal or t.deleted):
            return Response(status_code=499)
        if task.deleted:
            raise RpcFault(INVALID_PARAMS, f"Invalid params: task not found: {task.task_id}")
        delivery, delay_s = self._final_delivery(task)
        return reply(
            request,
            self._final_message(message.id, task, epoch_of(meta_of(message.params), EPOCH_META_KEY)),
            delivery=delivery,
            delay_s=delay_s,
        )

    async def _result_events(
        self, request: Request, message: RpcRequest, task: Task
    ) -> AsyncIterator[bytes | Abort]:
        sent: set[str] = set()

        def moved(t: Task) -> bool:
            pending = t.pending_round()
            return (
                t.terminal
                or t.deleted
                or t.stream_replay_due
                or (pending is not None and pending.key not in sent)
            )

        while True:
            self.ctx.refresh(task)
            if task.deleted:
                fault = RpcFault(INVALID_PARAMS, f"Invalid params: task not found: {task.task_id}")
                yield sse_event(error_message(message.id, fault))
                return
            if task.terminal:
                delivery, delay_s = self._final_delivery(task)
                if delay_s > 0:
                    await pause(delay_s)
                for chunk in sse_chunks(
                    self._final_message(message.id, task, epoch_of(meta_of(message.params), EPOCH_META_KEY)),
                    delivery,
                ):
                    yield chunk
                return
            pending = task.pending_round()
            if pending is not None and pending.key not in sent:
                sent.add(pending.key)
                yield sse_event(self._elicitation(task, pending))
            replay = task.take_stream_replay()
            if replay is not None:
                yield sse_event(self._elicitation(task, replay))
            if not await self.ctx.wait_until(task, request, moved):
                yield ABORT
                return

    def _elicitation(self, task: Task, round_: InputRound) -> dict[str, Any]:
        shared = self.ctx.options.elicitation_id
        return {
            "jsonrpc": "2.0",
            "id": round_.key if shared is None else shared,
            "method": "elicitation/create",
            "params": elicitation_params(round_, task.task_id),
        }

    async def _tasks_cancel(self, request: Request, message: RpcRequest, principal: str | None) -> Response:
        if not self.ctx.options.cancel:
            raise RpcFault(METHOD_NOT_FOUND, "Method not found: tasks/cancel (tasks.cancel is not declared)")
        task = self._lookup(message, principal)
        if task.faults.take(Fault.NOT_FOUND_ON_CANCEL, "tasks/cancel"):
            # A server that lost the task (a restart): the cancel changes nothing.
            raise RpcFault(INVALID_PARAMS, f"Invalid params: task not found: {task.task_id}")
        try:
            task.cancel_now(self.store.now())
        except CancelRejected as exc:
            self.ctx.notify()
            raise RpcFault(INVALID_PARAMS, f"Invalid params: cannot cancel: {exc}") from exc
        self.ctx.notify()
        view = task.view(self.store.now())
        if task.faults.take(Fault.CANCEL_ACK_LOST, "tasks/cancel"):
            delivery, delay_s = Delivery.BROKEN, 0.0
        else:
            delivery, delay_s = self.ctx.delivery_for(task, "tasks/cancel")
        return reply(
            request,
            result_message(message.id, self._task_json(task, view)),
            delivery=delivery,
            delay_s=delay_s,
        )

    async def _tasks_list(self, request: Request, message: RpcRequest, principal: str | None) -> Response:
        cursor = message.params.get("cursor")
        offset = 0 if cursor is None else _decode_cursor(cursor)
        tasks = self.store.visible(principal)
        if offset > len(tasks):
            raise RpcFault(INVALID_PARAMS, "Invalid params: unknown cursor")
        size = self.ctx.options.page_size
        page = tasks[offset : offset + size]
        now = self.store.now()
        body: dict[str, Any] = {
            "tasks": [self._task_json(t, t.view(now, consume_replay=False)) for t in page]
        }
        if offset + size < len(tasks):
            body["nextCursor"] = _encode_cursor(offset + size)
        return reply(request, result_message(message.id, body))


__all__ = [
    "PROTOCOL_VERSION",
    "Handler",
    "Mcp2025",
]
