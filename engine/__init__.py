"""Finality's engine: durable long-running tool calls with exactly one accepted terminal state.

This is the public surface the notebook, the benchmarks and the docs use; everything else in the
package is an implementation detail. Names load on first use (PEP 562), so importing one part of the
engine (the pure core, say) does not load the database drivers or the HTTP stack.

    from engine import open_ledger, step, LocalState
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.acceptance import check_acceptance, receipt_of
    from engine.adapters import AdapterOptions, discover, open_backend, plan_call
    from engine.clock import Clock, SystemClock
    from engine.errors import (
        BackendError,
        BackendRejected,
        BackendUnavailable,
        BudgetExhausted,
        ConfigError,
        DuplicateOperation,
        EngineError,
        InvalidTransition,
        LedgerError,
        LedgerUnavailable,
        NegotiationError,
        ReceiptConflict,
        SqlRefused,
        StaleWrite,
    )
    from engine.ledger import LeasingLedgerPort, Ledger, LedgerPort, PgLedger, is_postgres, open_ledger
    from engine.ledger.sandbox import QueryResult, run_arrow, run_query
    from engine.machine import step
    from engine.model import (
        RECEIPT_STATES,
        SCHEMA_VERSION,
        CallNodeId,
        Digest,
        Epoch,
        Event,
        GateRecord,
        IdempotencyKey,
        LocalState,
        Operation,
        OperationId,
        Protocol,
        Receipt,
        ServerStatus,
        Transition,
        digest_of,
    )
    from engine.runtime.call import CallSpec, run_call
    from engine.runtime.driver import Driver
    from engine.runtime.report import operation_report

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("check_acceptance", "receipt_of"), "engine.acceptance"),
    **dict.fromkeys(("AdapterOptions", "discover", "open_backend", "plan_call"), "engine.adapters"),
    **dict.fromkeys(("Clock", "SystemClock"), "engine.clock"),
    **dict.fromkeys(
        (
            "BackendError",
            "BackendRejected",
            "BackendUnavailable",
            "BudgetExhausted",
            "ConfigError",
            "DuplicateOperation",
            "EngineError",
            "InvalidTransition",
            "LedgerError",
            "LedgerUnavailable",
            "NegotiationError",
            "ReceiptConflict",
            "SqlRefused",
            "StaleWrite",
        ),
        "engine.errors",
    ),
    **dict.fromkeys(
        ("Ledger", "LedgerPort", "LeasingLedgerPort", "PgLedger", "is_postgres", "open_ledger"),
        "engine.ledger",
    ),
    **dict.fromkeys(("QueryResult", "run_arrow", "run_query"), "engine.ledger.sandbox"),
    "step": "engine.machine",
    **dict.fromkeys(
        (
            "RECEIPT_STATES",
            "SCHEMA_VERSION",
            "CallNodeId",
            "Digest",
            "Epoch",
            "Event",
            "GateRecord",
            "IdempotencyKey",
            "LocalState",
            "Operation",
            "OperationId",
            "Protocol",
            "Receipt",
            "ServerStatus",
            "Transition",
            "digest_of",
        ),
        "engine.model",
    ),
    **dict.fromkeys(("CallSpec", "run_call"), "engine.runtime.call"),
    "Driver": "engine.runtime.driver",
    "operation_report": "engine.runtime.report",
}

__all__ = [
    "RECEIPT_STATES",
    "SCHEMA_VERSION",
    "AdapterOptions",
    "BackendError",
    "BackendRejected",
    "BackendUnavailable",
    "BudgetExhausted",
    "CallNodeId",
    "CallSpec",
    "Clock",
    "ConfigError",
    "Digest",
    "Driver",
    "DuplicateOperation",
    "EngineError",
    "Epoch",
    "Event",
    "GateRecord",
    "IdempotencyKey",
    "InvalidTransition",
    "LeasingLedgerPort",
    "Ledger",
    "LedgerError",
    "LedgerPort",
    "LedgerUnavailable",
    "LocalState",
    "NegotiationError",
    "Operation",
    "OperationId",
    "PgLedger",
    "Protocol",
    "QueryResult",
    "Receipt",
    "ReceiptConflict",
    "ServerStatus",
    "SqlRefused",
    "StaleWrite",
    "SystemClock",
    "Transition",
    "check_acceptance",
    "digest_of",
    "discover",
    "is_postgres",
    "open_backend",
    "open_ledger",
    "operation_report",
    "plan_call",
    "receipt_of",
    "run_arrow",
    "run_call",
    "run_query",
    "step",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips __getattr__
    return value


def __dir__() -> list[str]:
    return __all__
