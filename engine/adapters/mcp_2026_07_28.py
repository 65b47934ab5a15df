"""The adapter for MCP 2026-07-28 with the ``io.modelcontextprotocol/tasks`` extension (SEP-2663).

No ``initialize``: ``server/discover`` once, then every request carries the protocol version and the
client's capabilities in ``_meta`` and the routing headers. Outcomes come inline from ``tasks/get``
(a ``DetailedTask``); ``tasks/result`` is never called (it answers -32601 here). The core 2026 schema
has no task types, so the extension's ``Task``/``DetailedTask`` models are defined in this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from typing import Literal, Self

from mcp_types import _v2026_07_28 as v2026
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.adapters.base import (
    CancelResult,
    Capabilities,
    Created,
    Inline,
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
from engine.adapters.elicitation import check_answer, input_request_of, round_key
from engine.adapters.mcp_2025_11_25 import parse_wire, require_result, task_id_of
from engine.adapters.timestamp import millis, parse_instant
from engine.adapters.transport import PROTOCOL_VERSION_HEADER, HttpClient, Reply, StreamableHttp
from engine.adapters.verify import (
    EPOCH_META,
    Expectation,
    PayloadKind,
    epoch_echo_of,
    error_outcome,
    related_task_of,
    verify_outcome,
)
from engine.errors import (
    BackendRejected,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
)
from engine.model import Operation, Principal, Protocol, ServerStatus, TaskId

PROTOCOL_VERSION = "2026-07-28"
ADAPTER_VERSION = "mcp-2026-07-28+tasks/1"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
PROTOCOL_VERSION_META = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"
INVALID_PARAMS = -32602
# -32021 is the released code; -32003 is what the ext-tasks drafts and SDK branch sent.
MISSING_CAPABILITY = frozenset({-32021, -32003})
UNSUPPORTED_VERSION = -32022

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]


# ---------------------------------------------------------------------- extension wire models


class ExtTask(BaseModel):
    """The extension's flat ``Task`` (also the creating response, with ``resultType: "task"``).

    Strict, like the extension's own zod schemas: ``"ttlMs": "60000"`` is not an integer.
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)
    task_id: str = Field(alias="taskId")
    status: TaskStatus
    status_message: str | None = Field(default=None, alias="statusMessage")
    created_at: str = Field(alias="createdAt")
    last_updated_at: str = Field(alias="lastUpdatedAt")
    ttl_ms: int | None = Field(alias="ttlMs")
    poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")
    result_type: str = Field(default="complete", alias="resultType")
    meta: dict[str, object] | None = Field(default=None, alias="_meta")


class ExtError(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    code: int
    message: str
    data: object | None = None


class ExtInputRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    method: Literal["elicitation/create", "sampling/createMessage", "roots/list"]
    params: dict[str, object] | None = None


class DetailedTask(ExtTask):
    """``tasks/get``'s answer: the task plus ``result`` / ``error`` / ``inputRequests`` by status."""

    result: dict[str, object] | None = None
    error: dict[str, object] | None = None
    """Kept as sent (the outcome digest is over it); checked as a JSON-RPC error object."""
    input_requests: dict[str, ExtInputRequest] | None = Field(default=None, alias="inputRequests")

    @model_validator(mode="after")
    def _carries_what_its_status_needs(self) -> Self:
        if self.status == "completed" and self.result is None:
            raise ValueError("a completed DetailedTask must carry result")
        if self.status == "failed" and self.error is None:
            raise ValueError("a failed DetailedTask must carry error")
        if self.error is not None:
            ExtError.model_validate(self.error)
        if self.status == "input_required" and not self.input_requests:
            raise ValueError("an input_required DetailedTask must carry inputRequests")
        return self


def _complete(raw: Json) -> Json:
    # Results from servers of older versions have no resultType; 2026-07-28 says read it as "complete".
    return raw if "resultType" in raw else {**raw, "resultType": "complete"}


def _view(task: ExtTask) -> ServerView:
    """``expires_at`` is ``createdAt + ttlMs``; ``ttlMs`` may change between reads, so each read says."""
    created_at = parse_instant(task.created_at, "Task.createdAt")
    ttl = millis(task.ttl_ms)
    return ServerView(
        task_id=TaskId(task.task_id),
        status=ServerStatus(task.status),
        poll_interval=millis(task.poll_interval_ms),
        expires_at=created_at + ttl if ttl is not None else None,
        status_message=task.status_message,
    )


def _round_keys(requests: Mapping[str, ExtInputRequest]) -> dict[str, str]:
    """Each open input request's round key (``round_key``), mapped to the server's input key."""
    return {
        round_key(wire_key, request.method, request.params or {}): wire_key
        for wire_key, request in requests.items()
    }


def _pick_input(op: Operation, requests: Mapping[str, ExtInputRequest]) -> str:
    """The round key of one input request to hand to a person.

    The server ignores stale keys, so a round this operation already answered is skipped while
    another is open; if it is the only one, it is returned as-is and the machine reads it as a
    replay. Rounds are compared by ``round_key`` (input key and question), never by key alone.
    """
    keys = sorted(_round_keys(requests))
    answered = op.input_request_key if op.answered_round == op.input_round else None
    fresh = [k for k in keys if k != answered]
    return fresh[0] if fresh else keys[0]


class Mcp2026Backend:
    """``Backend`` for an MCP 2026-07-28 server offering the tasks extension."""

    protocol = Protocol.MCP_2026_07_28
    adapter_version = ADAPTER_VERSION

    def __init__(self, url: str, *, client: HttpClient, token: str | None, options: AdapterOptions) -> None:
        self._options = options
        self._transport = StreamableHttp(
            client, url, token=token, options=options, headers={PROTOCOL_VERSION_HEADER: PROTOCOL_VERSION}
        )
        self._caps: Capabilities | None = None
        # Round key -> (method, the server's input key) of each open input request handed out.
        self._input_methods: dict[tuple[TaskId, str], tuple[str, str]] = {}
        self._inline = InlineOutcomes()

    # -------------------------------------------------------------------------- one request

    def _meta(self, op: Operation | None) -> Json:
        info = self._options.client_info
        meta: Json = {
            PROTOCOL_VERSION_META: PROTOCOL_VERSION,
            CLIENT_CAPABILITIES_META: {"extensions": {TASKS_EXTENSION: {}}, "elicitation": {"form": {}}},
            CLIENT_INFO_META: {"name": info.name, "version": info.version},
        }
        if op is not None:
            meta[EPOCH_META] = int(op.epoch)
        return meta

    async def _rpc(
        self,
        method: str,
        params: Json,
        *,
        op: Operation | None = None,
        name: str | None = None,
        limit: timedelta | None = None,
    ) -> Reply:
        headers = {"Mcp-Method": method}
        if name is not None:
            headers["Mcp-Name"] = name
        reply = await self._transport.call(
            method,
            {**params, "_meta": self._meta(op)},
            limit=limit or self._options.timeouts.request,
            headers=headers,
        )
        if reply.error is not None and reply.error.code in MISSING_CAPABILITY:
            data = reply.error.data
            needed = data.get("requiredCapabilities") if isinstance(data, dict) else None
            raise NegotiationError(
                f"{method}: the server requires client capabilities {needed!r} ({reply.error})"
            )
        if reply.error is not None and reply.error.code == UNSUPPORTED_VERSION:
            raise NegotiationError(
                f"{method}: the server does not support {PROTOCOL_VERSION} ({reply.error})"
            )
        return reply

    # --------------------------------------------------------------------------- negotiation

    def canonical_task_id(self, raw: str) -> TaskId:
        """A ``taskId`` is opaque: exactly as the server issued it (surrounding blanks aside)."""
        return TaskId(raw.strip())

    async def negotiate(self, principal: Principal) -> Capabilities:
        """``server/discover``, then ``tools/list``.

        There is no per-tool gate in the extension: the server decides per request whether a call
        becomes a task, so every tool is ``OPTIONAL`` when the extension is offered.
        """
        raw = require_result(await self._rpc("server/discover", {}), "server/discover")
        discovered = parse_wire(
            v2026.DiscoverResult,
            {"cacheScope": "private", "ttlMs": 0, **_complete(raw)},
            "server/discover",
        )
        if PROTOCOL_VERSION not in discovered.supported_versions:
            raise NegotiationError(
                f"server supports {', '.join(discovered.supported_versions)}, not {PROTOCOL_VERSION}"
            )
        extensions = discovered.capabilities.extensions or {}
        tasks = TASKS_EXTENSION in extensions
        raw_caps = raw.get("capabilities")
        tools_section = raw_caps.get("tools") if isinstance(raw_caps, dict) else None
        idempotency = isinstance(tools_section, dict) and isinstance(tools_section.get("idempotency"), dict)
        self._caps = Capabilities(
            protocol=self.protocol,
            tasks=tasks,
            cancel=tasks,
            list=False,
            lookup_by_key=idempotency,
            tools=await self._list_tools(TaskSupport.OPTIONAL if tasks else TaskSupport.FORBIDDEN),
            cancel_capability=f"the {TASKS_EXTENSION} extension (MCP 2026-07-28)",
        )
        return self._caps

    async def _list_tools(self, support: TaskSupport) -> dict[str, ToolInfo]:
        tools: dict[str, ToolInfo] = {}
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(self._options.max_pages):
            params: Json = {"cursor": cursor} if cursor is not None else {}
            raw = require_result(await self._rpc("tools/list", params), "tools/list")
            page = parse_wire(
                v2026.ListToolsResult, {"cacheScope": "private", "ttlMs": 0, **_complete(raw)}, "tools/list"
            )
            raw_tools = raw.get("tools")
            for tool, raw_tool in zip(
                page.tools, raw_tools if isinstance(raw_tools, list) else [], strict=True
            ):
                schema = raw_tool.get("outputSchema") if isinstance(raw_tool, dict) else None
                tools[tool.name] = ToolInfo(
                    tool.name, support, output_schema=schema if isinstance(schema, dict) else None
                )
            cursor = page.next_cursor
            if cursor is None:
                return tools
            if cursor in seen:
                raise ProtocolViolation(f"tools/list repeated cursor {cursor!r}")
            seen.add(cursor)
        raise ProtocolViolation(f"tools/list did not end within {self._options.max_pages} pages")

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

    async def _call(self, op: Operation, arguments: Json, caps: Capabilities) -> Reply:
        params: Json = {"name": op.tool.name, "arguments": arguments}
        if caps.lookup_by_key:
            params["idempotencyKey"] = op.idempotency_key
        # Without the extension the server runs the tool inside this request.
        limit = self._options.timeouts.request if caps.tasks else self._options.timeouts.sync_call
        return await self._rpc("tools/call", params, op=op, name=op.tool.name, limit=limit)

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        """``tools/call``: a flat ``Task`` (``resultType: "task"``) is ``Created``; a plain result is ``Inline``.

        The extension has no way to ask for a retention, so ``request.ttl`` is not sent.

        Raises:
            NegotiationError: missing client capability (-32021/-32003), or the server asked for
                input inside a synchronous round trip, which Finality does not do.
        """
        op = request.operation
        caps = await self._ready(op)
        reply = await self._call(op, request.arguments, caps)
        expected = Expectation(task_id=None, max_result_bytes=self._options.max_result_bytes)
        if reply.error is not None:
            return Inline(self._inline.keep(op, error_outcome(reply.error.payload(), expected)))
        result = require_result(reply, "tools/call")
        kind = result.get("resultType", "complete")
        if kind == "task":
            return Created(_view(parse_wire(ExtTask, result, "tools/call")))
        if kind == "complete":
            # isError is still COMPLETED on this version: failed is for JSON-RPC errors only.
            outcome = verify_outcome(
                ServerStatus.COMPLETED,
                result,
                PayloadKind.MCP_2026_TOOL_RESULT,
                self._expect(op, caps),
                epoch_echo=epoch_echo_of(result),
            )
            return Inline(self._inline.keep(op, outcome))
        if kind == "input_required":
            raise NegotiationError(
                "tools/call answered input_required without a task; Finality answers input only through tasks"
            )
        raise ProtocolViolation(f"tools/call answered unknown resultType {kind!r}")

    # ----------------------------------------------------------------------------------- get

    async def _detailed(self, op: Operation) -> DetailedTask:
        task_id = task_id_of(op)
        reply = await self._rpc("tasks/get", {"taskId": task_id}, op=op, name=task_id)
        if reply.error is not None:
            if reply.error.code == INVALID_PARAMS:
                raise NotFoundOnServer(
                    f"tasks/get: the server does not know task {task_id!r} ({reply.error})"
                )
            raise BackendRejected(f"tasks/get refused: {reply.error}", code=reply.error.code)
        task = parse_wire(DetailedTask, require_result(reply, "tasks/get"), "tasks/get")
        if task.task_id != task_id:
            raise ProtocolViolation(f"tasks/get for {task_id!r} answered about task {task.task_id!r}")
        return task

    def _outcome(self, op: Operation, task: DetailedTask, caps: Capabilities) -> Outcome:
        """The terminal outcome a ``DetailedTask`` carries, verified."""
        expected = self._expect(op, caps)
        status = ServerStatus(task.status)
        echo = epoch_echo_of(task.meta or {})
        if task.status == "completed" and task.result is not None:
            result = task.result
            return verify_outcome(
                status,
                result,
                PayloadKind.MCP_2026_TOOL_RESULT,
                expected,
                reported_task_id=task.task_id,
                related_task_id=related_task_of(result),
                epoch_echo=epoch_echo_of(result) if epoch_echo_of(result) is not None else echo,
            )
        if task.status == "failed" and task.error is not None:
            error_echo = epoch_echo_of(task.error)
            return verify_outcome(
                status,
                task.error,
                PayloadKind.JSONRPC_ERROR,
                expected,
                reported_task_id=task.task_id,
                epoch_echo=error_echo if error_echo is not None else echo,
            )
        if task.status == "cancelled":
            # A cancelled task carries no result: its own (terminal, immutable) record is the outcome.
            record: Json = {"taskId": task.task_id, "status": task.status}
            if task.status_message is not None:
                record["statusMessage"] = task.status_message
            return verify_outcome(
                status,
                record,
                PayloadKind.TASK_RECORD,
                expected,
                reported_task_id=task.task_id,
                epoch_echo=echo,
            )
        raise ProtocolViolation(f"task {task.task_id!r} is {task.status}, which carries no outcome")

    async def get(self, op: Operation) -> ServerView:
        """``tasks/get``: the status, the verified outcome when terminal, one input request when needed.

        An outcome that fails verification is left off the view (the status still counts); the
        fetch stage re-reads it and reports the violation, where the runtime handles it.

        Raises:
            NotFoundOnServer: -32602, unknown or expired task id.
        """
        caps = await self._ready(op)
        task = await self._detailed(op)
        view = _view(task)
        if view.status.terminal:
            try:
                return replace(view, outcome=self._outcome(op, task, caps))
            except ProtocolViolation:
                return view
        if task.status == "input_required" and task.input_requests:
            key = _pick_input(op, task.input_requests)
            wire_key = _round_keys(task.input_requests)[key]
            request = task.input_requests[wire_key]
            self._input_methods[(view.task_id, key)] = (request.method, wire_key)
            return replace(
                view,
                input_request=input_request_of(
                    key, request.method, request.params or {}, version=PROTOCOL_VERSION
                ),
            )
        return view

    async def fetch_result(self, op: Operation) -> Outcome:
        """Re-read ``tasks/get`` and return its inline outcome (never ``tasks/result``).

        Raises:
            ProtocolViolation: the task is not terminal, or its outcome fails verification.
        """
        if op.task_id is None:
            return self._inline.get(op)
        caps = await self._ready(op)
        task = await self._detailed(op)
        if not ServerStatus(task.status).terminal:
            raise ProtocolViolation(f"task {task.task_id!r} is {task.status}; there is no outcome to fetch")
        return self._outcome(op, task, caps)

    # ------------------------------------------------------------------------------ cancel

    async def cancel(self, op: Operation) -> CancelResult:
        """``tasks/cancel``: an empty ack, always ``ACKNOWLEDGED`` (even for a finished task).

        Raises:
            NotFoundOnServer: -32602, unknown task id.
        """
        task_id = task_id_of(op)
        reply = await self._rpc("tasks/cancel", {"taskId": task_id}, op=op, name=task_id)
        if reply.error is not None:
            if reply.error.code == INVALID_PARAMS:
                raise NotFoundOnServer(
                    f"tasks/cancel: the server does not know task {task_id!r} ({reply.error})"
                )
            raise BackendRejected(f"tasks/cancel refused: {reply.error}", code=reply.error.code)
        require_result(reply, "tasks/cancel")
        return CancelResult.ACKNOWLEDGED

    # ---------------------------------------------------------------------- lookup, listing

    async def look_up(self, op: Operation, arguments: Json) -> ServerView | None:
        """Repeat the ``tools/call`` under the same ``idempotencyKey`` (SEP-3182 servers only).

        As on 2025-11-25, the key makes the repeat the same single call, so this never returns
        ``None``.

        Raises:
            NegotiationError: no idempotency capability (the extension itself has none).
        """
        caps = await self._ready(op)
        if not caps.lookup_by_key:
            raise NegotiationError("the server offers no lookup by submission key (no tools.idempotency)")
        reply = await self._call(op, arguments, caps)
        if reply.error is not None:
            raise BackendRejected(f"lookup by key refused: {reply.error}", code=reply.error.code)
        result = require_result(reply, "tools/call")
        if result.get("resultType") != "task":
            raise NegotiationError("the server replayed a result without a task; there is no task to bind")
        return _view(parse_wire(ExtTask, result, "tools/call"))

    async def candidates(self, op: Operation) -> list[TaskId]:
        """Always empty: the extension removed ``tasks/list``."""
        return []

    # ------------------------------------------------------------------------------- input

    async def answer_input(self, op: Operation, request_key: str, response: Json) -> None:
        """``tasks/update {taskId, inputResponses: {key: response}}``; the server acks with ``{}``.

        ``request_key`` is the round key; the answer goes out under the server's input key of that
        round, and only while the task still asks exactly that question.

        Raises:
            ConfigError: ``response`` is not a valid elicitation result.
            NotFoundOnServer: -32602, unknown task id.
            BackendRejected: the task no longer asks the question this answer was given for.
        """
        task_id = task_id_of(op)
        known = self._input_methods.get((task_id, request_key))
        if known is None:
            # After a restart: read the open requests again and find this round among them.
            task = await self._detailed(op)
            open_rounds = _round_keys(task.input_requests or {})
            wire = open_rounds.get(request_key)
            if wire is None or task.input_requests is None:
                raise BackendRejected(
                    f"task {task_id!r} no longer asks the question of round {request_key!r}; "
                    "the answer was not sent"
                )
            known = (task.input_requests[wire].method, wire)
        method, wire_key = known
        check_answer(method, response)
        reply = await self._rpc(
            "tasks/update",
            {"taskId": task_id, "inputResponses": {wire_key: response}},
            op=op,
            name=task_id,
        )
        if reply.error is not None:
            if reply.error.code == INVALID_PARAMS:
                raise NotFoundOnServer(
                    f"tasks/update: the server does not know task {task_id!r} ({reply.error})"
                )
            raise BackendRejected(f"tasks/update refused: {reply.error}", code=reply.error.code)
        require_result(reply, "tasks/update")
        self._input_methods.pop((task_id, request_key), None)

    async def aclose(self) -> None:
        """Nothing to end: the extension is sessionless, and the HTTP client belongs to the caller."""


async def probe(url: str, *, client: HttpClient, token: str | None, options: AdapterOptions) -> bool | None:
    """``server/discover`` alone: ``True`` with the tasks extension, ``False`` without it, ``None`` when
    the server does not speak 2026-07-28. Transport failures propagate (``BackendUnavailable``)."""
    backend = Mcp2026Backend(url, client=client, token=token, options=options)
    reply = await backend._rpc("server/discover", {})
    if reply.result is None:
        return None
    discovered = parse_wire(
        v2026.DiscoverResult,
        {"cacheScope": "private", "ttlMs": 0, **_complete(reply.result)},
        "server/discover",
    )
    if PROTOCOL_VERSION not in discovered.supported_versions:
        return None
    return TASKS_EXTENSION in (discovered.capabilities.extensions or {})


__all__ = [
    "ADAPTER_VERSION",
    "CLIENT_CAPABILITIES_META",
    "CLIENT_INFO_META",
    "INVALID_PARAMS",
    "MISSING_CAPABILITY",
    "PROTOCOL_VERSION",
    "PROTOCOL_VERSION_META",
    "TASKS_EXTENSION",
    "UNSUPPORTED_VERSION",
    "DetailedTask",
    "ExtError",
    "ExtInputRequest",
    "ExtTask",
    "Mcp2026Backend",
    "TaskStatus",
    "probe",
]
