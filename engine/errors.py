"""The engine's exception tree. Callers catch by type; retryability is the type, never the message.

EngineError
├── InvalidTransition        a bug or a peer violation: carries state and event
├── LedgerError
│   ├── StaleWrite           compare-and-swap lost: the row moved since it was read
│   ├── ReceiptConflict      acceptTerminal refused: names the mismatching field
│   ├── DuplicateOperation   a second operation for a call node, key or server task id
│   ├── LedgerUnavailable    the file cannot be opened or written
│   ├── LedgerCorrupt        the file is not a ledger, or is damaged
│   └── SchemaTooNew         the file was written by a newer Finality
├── InvalidRecord            an operation record with missing or malformed fields
├── ConfigError              bad configuration or usage: names the offending key
├── NegotiationError         the server/tool cannot run this call the way it was asked
│   └── CancelUnsupported    the server declared no cancel: refused before anything is recorded
├── BackendError             talking to a server failed
│   ├── BackendUnavailable   retryable: connection lost, timeout, 429/503 (carries retry_after)
│   ├── BackendRejected      not retryable: the server refused the request
│   ├── NotFoundOnServer     the server does not know the operation
│   └── ProtocolViolation    the peer broke its wire contract (malformed or foreign reply)
├── BudgetExhausted          the caller's wait budget ran out (the operation goes on)
└── SqlRefused               analyst SQL that would write or reach outside the snapshot
"""

from __future__ import annotations

from datetime import timedelta


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
