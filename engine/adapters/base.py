"""The one interface every protocol adapter offers, in engine types only.

Adapters translate between these values and their wire contract; wire words, wire errors and
HTTP types never cross this line. Everything here is a value or a ``Protocol``; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Protocol as TypingProtocol

from engine.model import Digest, Operation, Principal, Protocol, ServerStatus, TaskId

Json = dict[str, object]


class TaskSupport(StrEnum):
    """A tool's declared task support (MCP 2025-11-25 ``execution.taskSupport``; absent = forbidden)."""

    FORBIDDEN = "forbidden"
    OPTIONAL = "optional"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class ToolInfo:
    name: str
    task_support: TaskSupport
    output_schema: Json | None = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What negotiation found out about a server, before anything is submitted."""

    protocol: Protocol
    tasks: bool
    """The server runs tool calls as tasks/operations at all."""
    cancel: bool
    list: bool
    lookup_by_key: bool
    """The server can find an operation by the submission key (AIP-155, SEP-3182 idempotency)."""
    tools: Mapping[str, ToolInfo] = field(default_factory=dict)
    cancel_capability: str = "a cancel capability"
    """What the server declares (or would have to declare) to take a cancel, in its protocol's
    words, for the message that refuses a cancel it cannot take."""


@dataclass(frozen=True, slots=True)
class InputRequest:
    """A server's request for input, handed to a person. ``key`` binds the answer to its round."""

    key: str
    message: str
    requested_schema: Json
    schema_digest: Digest
    deadline: datetime | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A terminal outcome as the server stated it: the original call's result or its error.

    ``payload`` is the verified result (an MCP ``CallToolResult``, a JSON-RPC error object, an
    AIP-151 ``response`` or ``google.rpc.Status``), ``digest`` its canonical digest.
    """

    status: ServerStatus
    payload: Json
    digest: Digest
    task_id: TaskId | None = None
    epoch_echo: int | None = None
    """The execution epoch the server echoed back, if it echoes one; an old one is fenced."""


@dataclass(frozen=True, slots=True)
class ServerView:
    """What one status read (or a creating response) said about a task."""

    task_id: TaskId
    status: ServerStatus
    poll_interval: timedelta | None = None
    expires_at: datetime | None = None
    status_message: str | None = None
    input_request: InputRequest | None = None
    outcome: Outcome | None = None
    """Set when the read itself carried the terminal outcome (2026-07-28 ``DetailedTask``, AIP-151)."""
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class Created:
    """The submission created a task; ``view`` is the creating response's (possibly later) status."""

    view: ServerView


@dataclass(frozen=True, slots=True)
class Inline:
    """The server answered the submission with the final outcome (no task)."""

    outcome: Outcome


SubmitResult = Created | Inline


class CancelResult(StrEnum):
    CONFIRMED = "confirmed"
    """The response itself proves the cancelled terminal state (MCP 2025-11-25)."""
    ACKNOWLEDGED = "acknowledged"
    """Only an acknowledgement; the final state shows later (2026-07-28, AIP-151)."""
    ALREADY_TERMINAL = "already_terminal"
    """Refused because the task had already ended; read its state, never rewrite it."""


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """Everything an adapter needs to submit one call."""

    operation: Operation
    arguments: Json
    ttl: timedelta | None = None


class Backend(TypingProtocol):
    """A protocol adapter bound to one server.

    Raises (every method): ``BackendUnavailable`` (retryable; a lost connection is never a cancel),
    ``BackendRejected``, ``NotFoundOnServer``, ``ProtocolViolation``, ``NegotiationError``.
    """

    protocol: Protocol
    adapter_version: str

    async def negotiate(self, principal: Principal) -> Capabilities: ...

    def canonical_task_id(self, raw: str) -> TaskId:
        """The one spelling of a server task's name under this protocol (for names from outside the
        wire, such as a person's reconciliation); the same task always gets the same ``TaskId``.

        MCP: the ``taskId`` exactly as the server issued it. AIP-151: the operation's full resource
        name (``operations/{id}``); a bare id gets the collection prefix.
        """
        ...

    async def submit(self, request: SubmitRequest) -> SubmitResult: ...

    async def get(self, op: Operation) -> ServerView: ...

    async def fetch_result(self, op: Operation) -> Outcome:
        """The verified terminal outcome. Raises ``ProtocolViolation`` when it fails verification."""
        ...

    async def cancel(self, op: Operation) -> CancelResult: ...

    async def look_up(self, op: Operation, arguments: Json) -> ServerView | None:
        """Find the operation by submission key. ``None`` means the server proved it absent.

        Raises ``NegotiationError`` when the server offers no lookup by key.
        """
        ...

    async def candidates(self, op: Operation) -> list[TaskId]:
        """Tasks that might be this operation (for a person reconciling it); empty if unlisted."""
        ...

    async def answer_input(self, op: Operation, request_key: str, response: Json) -> None: ...

    async def aclose(self) -> None: ...


__all__ = [
    "Backend",
    "CancelResult",
    "Capabilities",
    "Created",
    "Inline",
    "InputRequest",
    "Json",
    "Outcome",
    "ServerView",
    "SubmitRequest",
    "SubmitResult",
    "TaskSupport",
    "ToolInfo",
]
