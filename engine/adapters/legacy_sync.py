"""The legacy synchronous adapter: a plain MCP ``tools/call`` without tasks, over the 2025-11-25 transport.

For tools that only run synchronously, and only when ``plan_call`` found that the tool's published
limit fits the caller's wait budget. The call blocks for the tool's whole run and returns ``Inline``.
There is no task, so nothing can be polled, cancelled or looked up: those methods refuse.
"""

from __future__ import annotations

from engine.adapters.base import (
    CancelResult,
    Capabilities,
    Inline,
    Json,
    Outcome,
    ServerView,
    SubmitRequest,
    SubmitResult,
    TaskSupport,
)
from engine.adapters.cache import InlineOutcomes
from engine.adapters.config import AdapterOptions
from engine.adapters.mcp_2025_11_25 import HANDSHAKE_VERSIONS, Session, require_result
from engine.adapters.transport import HttpClient
from engine.adapters.verify import EPOCH_META, Expectation, PayloadKind, epoch_echo_of, verify_outcome
from engine.errors import NegotiationError
from engine.model import Operation, Principal, Protocol, ServerStatus, TaskId

ADAPTER_VERSION = "legacy-sync/1"


class LegacySyncBackend:
    """``Backend`` for an MCP server whose tool runs only synchronously (or that has no tasks)."""

    protocol = Protocol.LEGACY_SYNC
    adapter_version = ADAPTER_VERSION

    def __init__(self, url: str, *, client: HttpClient, token: str | None, options: AdapterOptions) -> None:
        self._options = options
        self._session = Session(client, url, token=token, options=options, versions=HANDSHAKE_VERSIONS)
        self._caps: Capabilities | None = None
        self._inline = InlineOutcomes()

    def canonical_task_id(self, raw: str) -> TaskId:
        """Synchronous calls have no task; any name is kept as given (surrounding blanks aside)."""
        return TaskId(raw.strip())

    async def negotiate(self, principal: Principal) -> Capabilities:
        """``initialize`` and ``tools/list``; whatever tasks the server offers are not used here."""
        await self._session.ensure()
        self._caps = Capabilities(
            protocol=self.protocol,
            tasks=False,
            cancel=False,
            list=False,
            lookup_by_key=False,
            tools=await self._session.list_tools(),
            cancel_capability="a task to cancel (a legacy synchronous call has none)",
        )
        return self._caps

    async def submit(self, request: SubmitRequest) -> SubmitResult:
        """A plain ``tools/call``, bounded by ``timeouts.sync_call``.

        ``isError`` is ``FAILED`` and a JSON-RPC error is ``FAILED`` with the error as payload (MCP
        2025-11-25 semantics). A timeout is ``BackendUnavailable``: the call may have run, and since
        nothing can look it up, the runtime must hand it to a person, never call again blindly.

        Raises:
            NegotiationError: the tool is not offered, or requires a task.
        """
        op = request.operation
        caps = self._caps or await self.negotiate(op.principal)
        info = caps.tools.get(op.tool.name)
        if info is None:
            raise NegotiationError(f"the server does not offer tool {op.tool.name!r}")
        if info.task_support is TaskSupport.REQUIRED:
            raise NegotiationError(
                f"tool {op.tool.name!r} requires a task; it cannot be called synchronously"
            )
        params: Json = {
            "name": op.tool.name,
            "arguments": request.arguments,
            "_meta": {EPOCH_META: int(op.epoch)},
        }
        reply = await self._session.call("tools/call", params, limit=self._options.timeouts.sync_call)
        expected = Expectation(
            task_id=None, max_result_bytes=self._options.max_result_bytes, output_schema=info.output_schema
        )
        if reply.error is not None:
            payload = reply.error.payload()
            outcome = verify_outcome(
                ServerStatus.FAILED,
                payload,
                PayloadKind.JSONRPC_ERROR,
                expected,
                epoch_echo=epoch_echo_of(payload),
            )
            return Inline(self._inline.keep(op, outcome))
        result = require_result(reply, "tools/call")
        status = ServerStatus.FAILED if result.get("isError") is True else ServerStatus.COMPLETED
        outcome = verify_outcome(
            status, result, PayloadKind.MCP_2025_TOOL_RESULT, expected, epoch_echo=epoch_echo_of(result)
        )
        return Inline(self._inline.keep(op, outcome))

    async def get(self, op: Operation) -> ServerView:
        raise NegotiationError("a synchronous call has no task to poll")

    async def fetch_result(self, op: Operation) -> Outcome:
        """The outcome ``submit`` returned, while this adapter still holds it."""
        return self._inline.get(op)

    async def cancel(self, op: Operation) -> CancelResult:
        raise NegotiationError("a synchronous call has no task to cancel")

    async def look_up(self, op: Operation, arguments: Json) -> ServerView | None:
        raise NegotiationError("a synchronous call cannot be looked up by submission key")

    async def candidates(self, op: Operation) -> list[TaskId]:
        return []

    async def answer_input(self, op: Operation, request_key: str, response: Json) -> None:
        raise NegotiationError("a synchronous call takes no input through Finality")

    async def aclose(self) -> None:
        """End the MCP session. The shared HTTP client belongs to the caller and stays open."""
        await self._session.close()


__all__ = [
    "ADAPTER_VERSION",
    "LegacySyncBackend",
]
