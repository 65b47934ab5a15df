"""The MCP Tasks adapter for protocol revision 2025-11-25 (SEP-1686), over Streamable HTTP.

Speaks ``initialize``, ``tools/call`` with ``params.task``, ``tasks/get``, ``tasks/result``,
``tasks/cancel``, ``tasks/list`` and elicitation answers, and maps them onto the ``Backend`` interface.
It never sends a task the server or the tool did not declare, and never turns a refused cancel into
a cancelled state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TypeVar

from mcp_types import _v2025_11_25 as v2025
from pydantic import BaseModel, ValidationError

from engine.adapters.base import (
    CancelResult,
    Capabilities,
    Created,
    Inline,
    InputRequest,
    Json,
    Outcome,
    ServerView,
    SubmitRequest,
    SubmitResult,
    TaskSupport,
    ToolInfo,
)
from engine.adapters.cache import InlineOutcomes
from engine.adapters.config import AdapterOptions
from engine.adapters.elicitation import INPUT_METHODS, check_answer, input_request_of, round_key
from engine.adapters.timestamp import millis, parse_instant
from engine.adapters.transport import (
    PROTOCOL_VERSION_HEADER,
    HttpClient,
    Reply,
    RequestId,
    RpcError,
    ServerRequest,
    StreamableHttp,
)
from engine.adapters.verify import (
    EPOCH_META,
    RELATED_TASK_META,
    Expectation,
    PayloadKind,
    epoch_echo_of,
    error_outcome,
    related_task_of,
    summarize,
    verify_outcome,
)
from engine.errors import (
    BackendRejected,
    BackendUnavailable,
    InvalidRecord,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
    SessionExpired,
)
from engine.model import Operation, Principal, Protocol, ServerStatus, TaskId

PROTOCOL_VERSION = "2025-11-25"
ADAPTER_VERSION = "mcp-2025-11-25/1"
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
"""Versions the legacy synchronous adapter accepts: plain ``tools/call`` is the same in all of them."""
INVALID_PARAMS = -32602
# Clock skew allowed when matching a server's task creation time against our submission time.
_CANDIDATE_SKEW = timedelta(minutes=5)

M = TypeVar("M", bound=BaseModel)


def parse_wire(model: type[M], data: Json, what: str) -> M:
    """Validate one wire object with its mcp-types model; a mismatch is the peer's violation."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProtocolViolation(f"{what}: not a valid {model.__name__}: {summarize(exc)}") from exc


def require_result(reply: Reply, what: str) -> Json:
    if reply.error is not None:
        raise BackendRejected(f"{what} refused: {reply.error}", code=reply.error.code)
    if reply.result is None:
        raise ProtocolViolation(f"{what}: no reply")
    return reply.result


def task_id_of(op: Operation) -> TaskId:
    if op.task_id is None:
        raise InvalidRecord(f"operation {op.operation_id} has no server task id yet")
    return op.task_id


def view_of(task: v2025.Task) -> ServerView:
    """A 2025-11-25 ``Task`` as a ``ServerView``.

    ``expires_at`` is ``createdAt + ttl``, the earliest moment the spec lets the server delete the
    task; servers that count retention from the terminal moment only keep it longer.
    """
    created_at = parse_instant(task.created_at, "Task.createdAt")
    ttl = millis(task.ttl)
    return ServerView(
        task_id=TaskId(task.task_id),
        status=ServerStatus(task.status),
        poll_interval=millis(task.poll_interval),
        expires_at=created_at + ttl if ttl is not None else None,
        status_message=task.status_message,
    )


def tool_infos(tools: list[v2025.Tool], raw_tools: list[object]) -> dict[str, ToolInfo]:
    """Each tool's task support (absent means forbidden) and its output schema as published."""
    out: dict[str, ToolInfo] = {}
    for tool, raw in zip(tools, raw_tools, strict=True):
        support = TaskSupport.FORBIDDEN
        if tool.execution is not None and tool.execution.task_support is not None:
            support = TaskSupport(tool.execution.task_support)
        schema = raw.get("outputSchema") if isinstance(raw, dict) else None
        out[tool.name] = ToolInfo(
            name=tool.name, task_support=support, output_schema=schema if isinstance(schema, dict) else None
        )
    return out


@dataclass(frozen=True, slots=True)
class Handshake:
    """What ``initialize`` told us."""

    protocol_version: str
    capabilities: Json

    def _section(self, *path: str) -> object:
        node: object = self.capabilities
        for part in path:
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node

    @property
    def tasks_for_tools_call(self) -> bool:
        return isinstance(self._section("tasks", "requests", "tools", "call"), dict)

    @property
    def cancel(self) -> bool:
        return isinstance(self._section("tasks", "cancel"), dict)

    @property
    def list(self) -> bool:
        return isinstance(self._section("tasks", "list"), dict)

    @property
    def idempotency(self) -> bool:
        """SEP-3182's proposed ``capabilities.tools.idempotency``: repeat keys replay the first call."""
        return isinstance(self._section("tools", "idempotency"), dict)


class Session:
    """An MCP session over Streamable HTTP: the ``initialize`` handshake, its id, and re-opening it.

    A 404 on a request that carried the session id means the server dropped the session; the
    request was not processed, so it is re-sent once on a fresh session.
    """

    def __init__(
        self,
        client: HttpClient,
        url: str,
        *,
        token: str | None,
        options: AdapterOptions,
        versions: tuple[str, ...],
    ) -> None:
        self.transport = StreamableHttp(client, url, token=token, options=options)
        self._options = options
        self._versions = versions
        self._lock = asyncio.Lock()
        self.handshake: Handshake | None = None

    async def ensure(self) -> Handshake:
        async with self._lock:
            if self.handshake is None:
                self.handshake = await self._initialize()
            return self.handshake

    async def _initialize(self) -> Handshake:
        self.transport.session_id = None
        info = self._options.client_info
        params: Json = {
            "protocolVersion": self._versions[0],
            "capabilities": {"elicitation": {"form": {}}},
            "clientInfo": {"name": info.name, "version": info.version},
        }
        reply = await self.transport.call("initialize", params, limit=self._options.timeouts.request)
        if reply.error is not None:
            raise NegotiationError(f"initialize refused: {reply.error}")
        raw = require_result(reply, "initialize")
        result = parse_wire(v2025.InitializeResult, raw, "initialize")
        if result.protocol_version not in self._versions:
            raise NegotiationError(
                f"server speaks MCP {result.protocol_version}; this adapter needs one of {', '.join(self._versions)}"
            )
        self.transport.set_header(PROTOCOL_VERSION_HEADER, result.protocol_version)
        await self.transport.notify("notifications/initialized", {})
        caps = raw.get("capabilities")
        return Handshake(result.protocol_version, caps if isinstance(caps, dict) else {})

    async def _reopen(self, stale: str | None) -> None:
        async with self._lock:
            # Many operations may see the same expiry; only the first one re-opens.
            if self.transport.session_id == stale or self.handshake is None:
                self.handshake = await self._initialize()

    async def call(
        self,
        method: str,
        params: Json,
        *,
        limit: timedelta,
        until: Callable[[ServerRequest], bool] | None = None,
    ) -> Reply:
        await self.ensure()
        stale = self.transport.session_id
        try:
            return await self.transport.call(method, params, limit=limit, until=until)
        except SessionExpired:
            await self._reopen(stale)
            return await self.transport.call(method, params, limit=limit, until=until)

    async def respond(self, request_id: RequestId, result: Json) -> None:
        await self.ensure()
        stale = self.transport.session_id
        try:
            await self.transport.respond(request_id, result)
        except SessionExpired:
            # The question belonged to the dropped session; the server asks again on the new one.
            await self._reopen(stale)
            raise

    async def list_tools(self) -> dict[str, ToolInfo]:
        """``tools/list`` with every ``nextCursor`` followed (bounded)."""
        tools: dict[str, ToolInfo] = {}
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(self._options.max_pages):
            params: Json = {"cursor": cursor} if cursor is not None else {}
            raw = require_result(
                await self.call("tools/list", params, limit=self._options.timeouts.request), "tools/list"
            )
            page = parse_wire(v2025.ListToolsResult, raw, "tools/list")
            raw_tools = raw.get("tools")
            tools.update(tool_infos(page.tools, raw_tools if isinstance(raw_tools, list) else []))
            cursor = page.next_cursor
            if cursor is None:
                return tools
            if cursor in seen:
                raise ProtocolViolation(f"tools/list repeated cursor {cursor!r}")
            seen.add(cursor)
        raise ProtocolViolation(f"tools/list did not end within {self._options.max_pages} pages")

    async def close(self) -> None:
        await self.transport.close_session()
        self.handshake = None


def _epoch_meta(op: Operation) -> Json:
    return {EPOCH_META: int(op.epoch)}


class Mcp2025Backend:
    """``Backend`` for an MCP 2025-11-25 server with the tasks utility."""

    protocol = Protocol.MCP_2025_11_25
    adapter_version = ADAPTER_VERSION

    def __init__(self, url: str, *, client: HttpClient, token: str | None, options: AdapterOptions) -> None:
        self._options = options
        self._session = Session(client, url, token=token, options=options, versions=(PROTOCOL_VERSION,))
        self._caps: Capabilities | None = None
        # Raw JSON-RPC ids (0 and "0" differ on the wire) and methods of pending input requests.
        self._pending: dict[tuple[TaskId, str], ServerRequest] = {}
        self._inline = InlineOutcomes()

    # --------------------------------------------------------------------------- negotiation

    def canonical_task_id(self, raw: str) -> TaskId:
        """A ``taskId`` is opaque: exactly as the server issued it (surrounding blanks aside)."""
        return TaskId(raw.strip())

    async def negotiate(self, principal: Principal) -> Capabilities:
        """``initialize`` (+ ``notifications/initialized``), then ``tools/list``.

        The bearer token decides the authorization context, so ``principal`` does not change
        what is sent; it is accepted so that every adapter negotiates the same way.
        """
        handshake = await self._session.ensure()
        tools = await self._session.list_tools()
        self._caps = Capabilities(
            protocol=self.protocol,
            tasks=handshake.tasks_for_tools_call,
            cancel=handshake.cancel,
            list=handshake.list,
            lookup_by_key=handshake.idempotency,
            tools=tools,
            cancel_capability="capabilities.tasks.cancel (MCP 2025-11-25)",
        )
        return self._caps

    async def _ready(self, op: Operation) -> Capabilities:
        if self._caps is None:
            return await self.negotiate(op.principal)
        return self._caps

    def _expect(self, op: Operation, caps: Capabilities) -> Expectation:
        info = caps.tools.get(op.tool.name)
        return Expectation(
            task_id=op.task_id,
            max_result_bytes=self._options.max_result_bytes,
            output_schema=info.output_schema if info is not None else None,
        )

    # -------------------------------------------------------------------------------- submit

    def _call_params(self, request: SubmitRequest, caps: Capabilities) -> Json:
        op = request.operation
        task: Json = {}
        if request.ttl is not None and request.ttl > timedelta(0):
            task["ttl"] = int(request.ttl.total_seconds() * 1000)
        params: Json = {
            "name": op.tool.name,
            "arguments": request.arguments,
            "task": task,
            "_meta": _epoch_meta(op),
        }
        if caps.lookup_by_key:
            params["idempotencyKey"] = op.idempotency_key
        return params

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        """``tools/call`` with ``params.task``.

        Returns ``Created`` from a ``CreateTaskResult`` (whose status may already be later than
        ``working``), or ``Inline`` when the server ran the call without a task or refused it with a
        JSON-RPC error (then ``FAILED`` with the error as payload).

        Raises:
            NegotiationError: the server or the tool does not allow a task; nothing was sent.
        """
        op = request.operation
        caps = await self._ready(op)
        if not caps.tasks:
            raise NegotiationError(
                "the server does not declare tasks.requests.tools.call; a task must not be sent"
            )
        info = caps.tools.get(op.tool.name)
        if info is None:
            raise NegotiationError(f"the server does not offer tool {op.tool.name!r}")
        if info.task_support is TaskSupport.FORBIDDEN:
            raise NegotiationError(f"tool {op.tool.name!r} forbids tasks; a task must not be sent")
        reply = await self._session.call(
            "tools/call", self._call_params(request, caps), limit=self._options.timeouts.request
        )
        return self._created_or_inline(op, reply, caps)

    def _created_or_inline(self, op: Operation, reply: Reply, caps: Capabilities) -> SubmitResult:
        expected = replace(self._expect(op, caps), task_id=None)
        if reply.error is not None:
            # Refused before any work: -32601/-32600/-32602 for taskSupport misuse land here too.
            return Inline(self._inline.keep(op, error_outcome(reply.error.payload(), expected)))
        result = require_result(reply, "tools/call")
        if "task" in result:
            created = parse_wire(v2025.CreateTaskResult, result, "tools/call")
            return Created(view_of(created.task))
        # A receiver that ignores the task runs the call normally and answers with its result.
        status = ServerStatus.FAILED if result.get("isError") is True else ServerStatus.COMPLETED
        outcome = verify_outcome(
            status,
            result,
            PayloadKind.MCP_2025_TOOL_RESULT,
            expected,
            epoch_echo=epoch_echo_of(result),
        )
        return Inline(self._inline.keep(op, outcome))

    # ----------------------------------------------------------------------------------- get

    async def _read_task(self, op: Operation) -> ServerView:
        task_id = task_id_of(op)
        reply = await self._session.call(
            "tasks/get", {"taskId": task_id, "_meta": _epoch_meta(op)}, limit=self._options.timeouts.request
        )
        if reply.error is not None:
            if reply.error.code == INVALID_PARAMS:
                raise NotFoundOnServer(
                    f"tasks/get: the server does not know task {task_id!r} ({reply.error})"
                )
            raise BackendRejected(f"tasks/get refused: {reply.error}", code=reply.error.code)
        task = parse_wire(v2025.GetTaskResult, require_result(reply, "tasks/get"), "tasks/get")
        if task.task_id != task_id:
            raise ProtocolViolation(f"tasks/get for {task_id!r} answered about task {task.task_id!r}")
        return view_of(task)

    async def get(self, op: Operation) -> ServerView:
        """``tasks/get``; while ``input_required``, also collect the pending elicitation request.

        Raises:
            NotFoundOnServer: -32602, the task id is unknown or expired.
        """
        view = await self._read_task(op)
        if view.status is ServerStatus.INPUT_REQUIRED:
            view = replace(view, input_request=await self._probe_input(op))
        return view

    async def _probe_input(self, op: Operation) -> InputRequest | None:
        """Open a short ``tasks/result`` stream and keep the first input request for this task.

        The server can only send its request on an open stream; reading stops as soon as it
        arrives. A probe that finds nothing in time is not an error: the next poll tries again.
        """
        task_id = task_id_of(op)

        def ours(request: ServerRequest) -> bool:
            return request.method in INPUT_METHODS and related_task_of(request.params) in (None, task_id)

        try:
            reply = await self._session.call(
                "tasks/result",
                {"taskId": task_id, "_meta": _epoch_meta(op)},
                limit=self._options.timeouts.input_probe,
                until=ours,
            )
        except BackendUnavailable:
            return None
        for request in reply.requests:
            if ours(request):
                key = round_key(request.key, request.method, request.params)
                self._pending[(task_id, key)] = request
                return input_request_of(key, request.method, request.params, version=PROTOCOL_VERSION)
        return None

    # ------------------------------------------------------------------------------ result

    async def fetch_result(self, op: Operation) -> Outcome:
        """``tasks/result``: the original call's result or JSON-RPC error, verified.

        A ``CallToolResult`` with ``isError`` is ``FAILED``; a JSON-RPC error is ``FAILED`` with the
        error as payload; for a cancelled task whatever is readable (often -32603 "no result") is
        kept as the ``CANCELLED`` outcome's payload, never as success.

        Raises:
            BackendUnavailable: the bounded wait ran out; poll and fetch again.
            NotFoundOnServer: the task is gone.
            ProtocolViolation: the result failed verification.
        """
        if op.task_id is None:
            return self._inline.get(op)
        caps = await self._ready(op)
        expected = self._expect(op, caps)
        reply = await self._session.call(
            "tasks/result",
            {"taskId": op.task_id, "_meta": _epoch_meta(op)},
            limit=self._options.timeouts.result_wait,
        )
        cancelled = op.server_status is ServerStatus.CANCELLED
        if reply.error is not None:
            status = ServerStatus.CANCELLED if cancelled else await self._error_status(op, reply.error)
            payload = reply.error.payload()
            return verify_outcome(
                status,
                payload,
                PayloadKind.JSONRPC_ERROR,
                expected,
                related_task_id=related_task_of(payload),
                epoch_echo=epoch_echo_of(payload),
            )
        result = require_result(reply, "tasks/result")
        if cancelled:
            status = ServerStatus.CANCELLED
        else:
            status = ServerStatus.FAILED if result.get("isError") is True else ServerStatus.COMPLETED
        return verify_outcome(
            status,
            result,
            PayloadKind.MCP_2025_TOOL_RESULT,
            expected,
            related_task_id=related_task_of(result),
            epoch_echo=epoch_echo_of(result),
        )

    async def _error_status(self, op: Operation, error: RpcError) -> ServerStatus:
        if op.server_status is ServerStatus.COMPLETED:
            raise ProtocolViolation(f"tasks/get said completed, but tasks/result answered {error}")
        if error.code == INVALID_PARAMS:
            # Either the original call's own -32602 or an unknown/expired task id; tasks/get
            # tells them apart (it raises NotFoundOnServer for the latter).
            await self._read_task(op)
        return ServerStatus.FAILED

    # ------------------------------------------------------------------------------ cancel

    async def cancel(self, op: Operation) -> CancelResult:
        """``tasks/cancel``: success is ``CONFIRMED`` (the server sets ``cancelled`` before replying);
        -32602 is ``ALREADY_TERMINAL`` (read the state; never rewrite it as cancelled)."""
        task_id = task_id_of(op)
        caps = await self._ready(op)
        if not caps.cancel:
            raise NegotiationError("the server does not declare tasks.cancel")
        reply = await self._session.call(
            "tasks/cancel",
            {"taskId": task_id, "_meta": _epoch_meta(op)},
            limit=self._options.timeouts.request,
        )
        if reply.error is not None:
            if reply.error.code == INVALID_PARAMS:
                return CancelResult.ALREADY_TERMINAL
            raise BackendRejected(f"tasks/cancel refused: {reply.error}", code=reply.error.code)
        task = parse_wire(v2025.CancelTaskResult, require_result(reply, "tasks/cancel"), "tasks/cancel")
        if task.task_id != task_id:
            raise ProtocolViolation(f"tasks/cancel for {task_id!r} answered about task {task.task_id!r}")
        if task.status == "cancelled":
            return CancelResult.CONFIRMED
        if ServerStatus(task.status).terminal:
            return CancelResult.ALREADY_TERMINAL
        return CancelResult.ACKNOWLEDGED

    # ---------------------------------------------------------------------- lookup, listing

    async def look_up(self, op: Operation, arguments: Json) -> ServerView | None:
        """Repeat the ``tools/call`` under the same ``idempotencyKey`` (SEP-3182 servers only).

        The key makes the repeat the same single call: the server replays the task it created, or
        creates it now if the first request never arrived. So this never proves absence (never
        ``None``); both answers bind the operation to exactly one task.

        Raises:
            NegotiationError: the server declares no idempotency; a person must find the task.
        """
        caps = await self._ready(op)
        if not caps.lookup_by_key:
            raise NegotiationError("the server offers no lookup by submission key (no tools.idempotency)")
        request = SubmitRequest(operation=op, arguments=arguments)
        reply = await self._session.call(
            "tools/call", self._call_params(request, caps), limit=self._options.timeouts.request
        )
        if reply.error is not None:
            raise BackendRejected(f"lookup by key refused: {reply.error}", code=reply.error.code)
        result = require_result(reply, "tools/call")
        if "task" not in result:
            raise NegotiationError("the server replayed a result without a task; there is no task to bind")
        return view_of(parse_wire(v2025.CreateTaskResult, result, "tools/call").task)

    async def candidates(self, op: Operation) -> list[TaskId]:
        """``tasks/list`` (when declared): tasks created around or after this submission."""
        caps = await self._ready(op)
        if not caps.list:
            return []
        found: list[TaskId] = []
        cursor: str | None = None
        for _ in range(self._options.max_pages):
            params: Json = {"_meta": _epoch_meta(op)}
            if cursor is not None:
                params["cursor"] = cursor
            raw = require_result(
                await self._session.call("tasks/list", params, limit=self._options.timeouts.request),
                "tasks/list",
            )
            page = parse_wire(v2025.ListTasksResult, raw, "tasks/list")
            for task in page.tasks:
                if parse_instant(task.created_at, "Task.createdAt") >= op.created_at - _CANDIDATE_SKEW:
                    found.append(TaskId(task.task_id))
            cursor = page.next_cursor
            if cursor is None:
                break
        return found

    # ------------------------------------------------------------------------------- input

    async def answer_input(self, op: Operation, request_key: str, response: Json) -> None:
        """Answer the pending request of round ``request_key`` (``round_key``) with ``response``.

        The answer goes out under the JSON-RPC id of the request that round was asked with, and
        only while the server still asks exactly that question: an id the server reused for another
        question never receives it.

        Raises:
            ConfigError: ``response`` is not a valid elicitation result.
            BackendRejected: the server no longer asks the question this answer was given for.
        """
        task_id = task_id_of(op)
        pending = self._pending.get((task_id, request_key))
        if pending is None:
            # After a restart the raw id is unknown; ask the server for the request again.
            await self._probe_input(op)
            pending = self._pending.get((task_id, request_key))
        if pending is None:
            raise BackendRejected(
                f"task {task_id!r} no longer asks the question of round {request_key!r}; the answer was not sent"
            )
        check_answer(pending.method, response)
        result: Json = {**response, "_meta": {RELATED_TASK_META: {"taskId": task_id}}}
        await self._session.respond(pending.id, result)
        self._pending.pop((task_id, request_key), None)

    async def aclose(self) -> None:
        """End the MCP session. The shared HTTP client belongs to the caller and stays open."""
        await self._session.close()


async def probe(url: str, *, client: HttpClient, token: str | None, options: AdapterOptions) -> Handshake:
    """``initialize`` with any handshake version, then end the session again.

    Raises:
        NegotiationError: the server refused the handshake or speaks another version.
    """
    session = Session(client, url, token=token, options=options, versions=HANDSHAKE_VERSIONS)
    try:
        return await session.ensure()
    finally:
        await session.close()


__all__ = [
    "ADAPTER_VERSION",
    "HANDSHAKE_VERSIONS",
    "INVALID_PARAMS",
    "PROTOCOL_VERSION",
    "Handshake",
    "M",
    "Mcp2025Backend",
    "Session",
    "parse_wire",
    "probe",
    "require_result",
    "task_id_of",
    "tool_infos",
    "view_of",
]
