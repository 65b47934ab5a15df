"""The engine's exception tree, the one tree of the whole project (service, console, rollout, demo,
test helpers included). Callers catch by type; retryability is the type, never the message.

Every class is defined here except the few that carry what only their module knows; those are
drawn with their module in brackets and still derive from a class here. ``refserver/`` is a
separate program (the reference servers, standing in for other people's servers): it imports
nothing from Finality and has exceptions of its own, outside this tree on purpose.

EngineError
├── InvalidTransition        a bug or a peer violation: carries state and event
├── LedgerError
│   ├── StaleWrite           compare-and-swap lost: the row moved since it was read
│   │   └── LeaseLost        a fenced write refused: the lease was taken over or the epoch raised
│   │       └── EpochMoved   refused only because a rollback raised the epoch: adopt, never drop
│   ├── ReceiptConflict      acceptTerminal refused: names the mismatching field
│   ├── DuplicateOperation   a second operation for a call node, key or server task id
│   ├── AckRefused           an outbox acknowledgement refused (and recorded): unknown or not held
│   ├── LedgerUnavailable    the file cannot be opened or written
│   ├── LedgerCorrupt        the file is not a ledger, or is damaged
│   └── SchemaTooNew         the file was written by a newer Finality
├── InvalidRecord            an operation record with missing or malformed fields
├── ConfigError              bad configuration or usage: names the offending key
│   └── AnswerInvalid        a person's answer does not fit the requested schema: names the field
├── NegotiationError         the server/tool cannot run this call the way it was asked
│   └── CancelUnsupported    a cancel the server cannot receive (no cancel capability declared)
├── BackendError             talking to a server failed
│   ├── BackendUnavailable   retryable: connection lost, timeout, 429/503 (carries retry_after)
│   │   ├── SessionExpired   an MCP session the server forgot: re-initialize
│   │   └── ExchangeFailed   [engine.adapters.transport] an HttpClient's exchange broke or never connected
│   │       └── ExchangeTimedOut  [engine.adapters.transport] no complete reply in time
│   ├── BackendRejected      not retryable: the server refused the request
│   ├── NotFoundOnServer     the server does not know the operation
│   └── ProtocolViolation    the peer broke its wire contract (malformed or foreign reply)
├── BudgetExhausted          the caller's wait budget ran out (the operation goes on)
├── SqlRefused               analyst SQL that would write or reach outside the snapshot
├── CancelNotAllowed         a cancel the operation cannot take now
├── StaleRound               an answer for an input round that is not open
├── ResubmitNotAllowed       a resubmission nothing proves safe
├── RolloutRefused           a rollout action not allowed now (HTTP status, blocking gates)
├── ServiceError             a service request that cannot be carried out (HTTP status)
│   ├── TooLarge             413: a body, arguments or an answer over its limit
│   ├── TooMany              429: a principal over its limits (carries retry_after)
│   ├── Denied               [service.access] 401/403: the request may not do this (recorded)
│   └── ReadersBusy          [service.readers] 503: every reader busy, queue full (retry_after)
│       └── ReaderLost       [service.reader_process] 503: the reader process ended mid-query
├── IdentifierRefused        a call node id, principal, actor or reason breaking its rule (422)
├── ServiceUnavailable       the service cannot be reached (client side)
├── ServiceRefused           the service answered an error status (client side)
├── ServiceProcessError      a service subprocess did not start or stop (tests, benchmarks)
├── ClusterError             the throwaway PostgreSQL could not be started or reached
├── StateLimit               the explorer's pruned search met its state limit
├── Nondeterminism           the explorer found the simulation not deterministic
├── OutOfRuns                [engine.explore.prune] the explorer's run budget ended mid-search
├── SeedScriptError          [demo.seed] a seeded history the decision path or the machine refuses
└── ConsoleError             shown to a console user as a message, never a traceback
    ├── NotConfigured        neither a service URL nor a ledger was given
    ├── ReadOnlyConsole      an action asked of a console that reads a ledger read-only
    ├── ActionRefused        the service refused an action
    └── QueryFailed          a query refused or failed
        └── SourceUnavailable  the service timed out, is unreachable or busy: retried at the next refresh
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.model import GateRecord


class EngineError(Exception):
    """Root of every error the engine raises on purpose."""


class InvalidTransition(EngineError):
    def __init__(self, state: str, event: str, reason: str) -> None:
        super().__init__(f"{event} is not allowed in {state}: {reason}")
        self.state = state
        self.event = event
        self.reason = reason


class LedgerError(EngineError):
    pass


class StaleWrite(LedgerError):
    def __init__(self, operation_id: str, expected_version: int, detail: str = "") -> None:
        super().__init__(
            f"operation {operation_id} changed since it was read (expected row version {expected_version})"
            + (f": {detail}" if detail else "")
        )
        self.operation_id = operation_id
        self.expected_version = expected_version


class ReceiptConflict(LedgerError):
    def __init__(self, call_node_id: str, field: str, expected: object, got: object) -> None:
        super().__init__(
            f"acceptTerminal refused for call node {call_node_id}: {field} mismatch "
            f"(ledger has {expected!r}, receipt has {got!r})"
        )
        self.call_node_id = call_node_id
        self.field = field
        self.expected = expected
        self.got = got


class DuplicateOperation(LedgerError):
    def __init__(self, what: str, value: str) -> None:
        super().__init__(f"an operation with this {what} already exists: {value}")
        self.what = what
        self.value = value


class AckRefused(LedgerError):
    """An outbox acknowledgement the ledger refused (and recorded): no such entry, or not what it holds."""

    def __init__(self, call_node_id: str, reason: str, *, missing: bool) -> None:
        super().__init__(f"acknowledgement of outbox entry {call_node_id} refused: {reason}")
        self.call_node_id = call_node_id
        self.reason = reason
        self.missing = missing


class LedgerUnavailable(LedgerError):
    pass


class LedgerCorrupt(LedgerError):
    pass


class SchemaTooNew(LedgerError):
    def __init__(self, found: int, supported: int) -> None:
        super().__init__(
            f"ledger schema version {found} is newer than this Finality supports ({supported}); upgrade Finality"
        )
        self.found = found
        self.supported = supported


class InvalidRecord(EngineError):
    pass


class ConfigError(EngineError):
    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class AnswerInvalid(ConfigError):
    """A person's answer that does not fit the schema the server requested; nothing was recorded."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, f"the answer does not fit the requested schema: {problem}")
        self.field = field


class NegotiationError(EngineError):
    pass


class CancelUnsupported(NegotiationError):
    """A cancel the server cannot receive: it declared no cancel capability.

    Raised before CANCEL_REQUESTED is recorded, so nothing changes; ``capability`` names what the
    server would have had to declare.
    """

    def __init__(self, operation_id: str, server: str, capability: str) -> None:
        super().__init__(
            f"cannot cancel operation {operation_id}: its server {server} does not declare {capability}"
        )
        self.operation_id = operation_id
        self.server = server
        self.capability = capability


class BackendError(EngineError):
    retryable = False


class BackendUnavailable(BackendError):
    retryable = True

    def __init__(self, message: str, retry_after: timedelta | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendRejected(BackendError):
    def __init__(self, message: str, code: int | str | None = None) -> None:
        super().__init__(message)
        self.code = code


class NotFoundOnServer(BackendError):
    pass


class ProtocolViolation(BackendError):
    pass


class BudgetExhausted(EngineError):
    pass


class SqlRefused(EngineError):
    pass


class CancelNotAllowed(EngineError):
    """A cancel this operation cannot take now (terminal, or the server has no cancel capability)."""


class StaleRound(EngineError):
    """An answer for an input round that is no longer open (answered, closed or superseded)."""


class ResubmitNotAllowed(EngineError):
    """A resubmission nothing proves safe: only the server's proof or a person's recorded action allows one."""


class SessionExpired(BackendUnavailable):
    """HTTP 404 on a request that carried a session id: the server forgot the session; re-initialize."""


class RolloutRefused(EngineError):
    """The action is not allowed now; ``status`` is the HTTP status, ``failing`` the gates that block it."""

    def __init__(self, status: int, message: str, failing: tuple[GateRecord, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.failing = failing


class ServiceUnavailable(EngineError):
    """The service cannot be reached (connection refused, timed out); ``timeout_s`` is set when it
    was reached but did not answer within that many seconds."""

    def __init__(self, message: str, *, timeout_s: float | None = None) -> None:
        super().__init__(message)
        self.timeout_s = timeout_s


class ServiceRefused(EngineError):
    """The service answered with an error status; ``status`` and ``message`` say which and why."""

    def __init__(self, status: int, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after
        """Seconds, from a 429's Retry-After header."""


class ServiceError(EngineError):
    """A request to the service that cannot be carried out; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class TooLarge(ServiceError):
    """413: a body, a tool's arguments or an answer over its limit (the message names the limit)."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


class TooMany(ServiceError):
    """429: a principal over its in-flight or rate limit; ``retry_after`` whole seconds (Retry-After)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(429, message)
        self.retry_after = retry_after


class IdentifierRefused(EngineError):
    """A value breaks an identifier rule of ``engine.limits``; the message names the field and the rule."""

    def __init__(self, field: str, rule: str, detail: str) -> None:
        super().__init__(f"{field!r} refused ({detail}): {rule}")
        self.field = field
        self.rule = rule
        self.detail = detail


class ServiceProcessError(EngineError):
    """A service subprocess (tests, benchmarks) did not start or stop as asked; says why."""


class ConsoleError(EngineError):
    """Root of the console's errors (shown to the user as a message, never a traceback)."""


class NotConfigured(ConsoleError):
    """Neither a service URL nor a ledger file was given."""


class ReadOnlyConsole(ConsoleError):
    """An action was asked of a console that reads a ledger file: only the running service writes."""


class ActionRefused(ConsoleError):
    """The service refused an action (its message says why)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class QueryFailed(ConsoleError):
    """A query was refused or failed (analyst SQL, or a source that went away)."""


class SourceUnavailable(QueryFailed):
    """The console's source did not answer a read: the service timed out, cannot be reached, or its
    readers are all busy (503). Transient: a live section says so in one line and reads again at its
    next refresh. The message is that line's first half ("the service did not answer in 30 s")."""


class ClusterError(EngineError):
    """The throwaway PostgreSQL server could not be found, started or reached; says why."""


class LeaseLost(StaleWrite):
    """A fenced write refused: the operation's lease was taken over (or released), or the epoch was raised.

    A ``StaleWrite``, so code that reloads on a lost compare-and-swap does the right thing; an
    executor that sees it should drop the operation (another executor owns it now).
    """

    def __init__(self, operation_id: str, expected_version: int, detail: str) -> None:
        super().__init__(operation_id, expected_version, f"lease lost: {detail}")


class EpochMoved(LeaseLost):
    """A fenced write refused because the execution epoch was raised (a rollback), not because the
    lease was taken over: the writer still holds the operation's lease and must adopt it at the new
    epoch rather than drop it (a dropped one would stay leased to it, renewed, and driven by nobody)."""


class StateLimit(EngineError):
    """A scenario has more distinct states than the search may expand."""


class Nondeterminism(EngineError):
    """The same choices led to a different set of enabled steps: the simulation is not deterministic."""


__all__ = [
    "ActionRefused",
    "BackendError",
    "BackendRejected",
    "BackendUnavailable",
    "BudgetExhausted",
    "CancelNotAllowed",
    "CancelUnsupported",
    "ClusterError",
    "ConfigError",
    "ConsoleError",
    "DuplicateOperation",
    "EngineError",
    "EpochMoved",
    "IdentifierRefused",
    "InvalidRecord",
    "InvalidTransition",
    "LeaseLost",
    "LedgerCorrupt",
    "LedgerError",
    "LedgerUnavailable",
    "NegotiationError",
    "Nondeterminism",
    "NotConfigured",
    "NotFoundOnServer",
    "ProtocolViolation",
    "QueryFailed",
    "ReadOnlyConsole",
    "ReceiptConflict",
    "ResubmitNotAllowed",
    "RolloutRefused",
    "SchemaTooNew",
    "ServiceError",
    "ServiceProcessError",
    "ServiceRefused",
    "ServiceUnavailable",
    "SessionExpired",
    "SqlRefused",
    "StaleRound",
    "StaleWrite",
    "StateLimit",
    "TooLarge",
    "TooMany",
]
