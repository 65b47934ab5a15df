"""Where the console reads from: the running service over HTTP, or a ledger file or PostgreSQL ledger read-only.

A source runs queries and, for the service, actions; it never builds SQL of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Final, Protocol

from console.views import Json, SourceInfo
from engine.errors import (
    ActionRefused,
    EngineError,
    NotConfigured,
    QueryFailed,
    ReadOnlyConsole,
    ServiceRefused,
    ServiceUnavailable,
    SourceUnavailable,
)
from engine.ledger.sandbox import SharedSandbox
from service.client import ServiceClient

ENV_SERVICE_URL: Final = "FINALITY_SERVICE_URL"


ENV_LEDGER: Final = "FINALITY_LEDGER"


ENV_CACHE_S: Final = "FINALITY_CONSOLE_CACHE_S"


ENV_GATE_CACHE_S: Final = "FINALITY_CONSOLE_GATE_CACHE_S"


ENV_GATE_INTERVAL_S: Final = "FINALITY_CONSOLE_GATE_INTERVAL_S"


ENV_TIMEOUT_S: Final = "FINALITY_CONSOLE_TIMEOUT_S"
"""How long the console waits for the service to answer one request (seconds; default 30)."""


SERVICE_GATE_INTERVAL_S: Final = 10.0
"""The service's default ``gate_interval_s``: it records a gate run this often."""


SERVICE_RUN_SLACK_S: Final = 10.0
"""What a recorded run may be older than the interval when the console reads it through the service:
the SQL snapshot is up to 5 s old, and evaluating and recording take a second or two at a million
operations. A run older than ``gate_interval + SERVICE_RUN_SLACK_S`` is not current."""


class Source(Protocol):
    info: SourceInfo

    @property
    def dialect(self) -> str:
        """The ledger's SQL dialect (``engine.ledger.gate_sql.DIALECTS``): which fragments the named queries use."""
        ...

    def close(self) -> None: ...

    def query(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]: ...

    def held(self) -> AbstractContextManager[None]:
        """While held, the queries made (by any thread) share what the source can share: a ledger
        file is attached once for them all. A page holds its source while it renders."""
        ...

    def rollout_status(self) -> Json | None: ...

    def whoami(self, token: str | None) -> Json | None:
        """Who ``token`` is (principal, roles; ``authenticated`` false in the service's local mode);
        None for a source that has no identities (a file)."""
        ...

    # Actions: ``token`` is the signed-in person's (None: the console's own, or local mode).
    def resolve(self, entry_id: int, body: Json, token: str | None = None) -> Json: ...

    def answer(self, operation_id: str, input_round: int, body: Json, token: str | None = None) -> Json: ...

    def cancel(self, call_node: str, body: Json, token: str | None = None) -> Json: ...

    def rollout(self, action: str, body: Json, token: str | None = None) -> Json: ...

    def evaluate_gates(self, token: str | None = None) -> Json | None:
        """The service's fresh evaluation, recorded as a run (``POST /api/v1/gates``); None without a service."""
        ...


class ServiceSource:
    """Reads and acts through the running service's control API."""

    def __init__(self, client: ServiceClient, health: Json | None = None) -> None:
        self.client = client
        self.info = SourceInfo("service", client.base_url, writable=True)
        self._dialect = _dialect_of_health(health or {})
        self._dialect_lock = threading.Lock()

    @property
    def dialect(self) -> str:
        """What the service's health answer says its ledger is; else asked once with ``SELECT version()``
        (DuckDB answers ``v1.x``, PostgreSQL ``PostgreSQL 15...``)."""
        with self._dialect_lock:
            if self._dialect is None:
                _, rows, _, _ = self.query("SELECT version() AS version", 1)
                text = str(rows[0][0]) if rows and rows[0] else ""
                self._dialect = "postgres" if text.lower().startswith("postgresql") else "duckdb"
            return self._dialect

    def close(self) -> None:
        self.client.close()

    def held(self) -> AbstractContextManager[None]:
        return nullcontext()  # the service keeps its own snapshots open

    def query(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]:
        try:
            body = self.client.sql(sql, max_rows=max_rows)
        except ServiceRefused as exc:
            if exc.status == 503:
                raise not_answering(exc) from exc
            raise QueryFailed(exc.message) from exc
        except ServiceUnavailable as exc:
            raise not_answering(exc) from exc
        return (
            list(body["columns"]),
            [list(r) for r in body["rows"]],
            bool(body.get("truncated")),
            float(body.get("elapsed_ms", 0.0)),
        )

    def rollout_status(self) -> Json | None:
        try:
            return self.client.rollout_status()
        except ServiceRefused as exc:
            if exc.status in (404, 405, 501):
                return None
            if exc.status == 503:
                raise not_answering(exc) from exc
            raise ActionRefused(exc.status, exc.message) from exc
        except ServiceUnavailable as exc:
            raise not_answering(exc) from exc

    def _do(self, call: Callable[[ServiceClient], Json], token: str | None = None) -> Json:
        """``call`` on the console's client, or on one presenting the signed-in person's ``token``."""
        try:
            if token is None:
                return call(self.client)
            with ServiceClient(self.client.base_url, timeout=30.0, token=token) as person:
                return call(person)
        except ServiceRefused as exc:
            raise ActionRefused(exc.status, exc.message) from exc
        except ServiceUnavailable as exc:
            raise ActionRefused(503, str(exc)) from exc

    def whoami(self, token: str | None) -> Json | None:
        return self._do(lambda c: c.whoami(), token)

    def resolve(self, entry_id: int, body: Json, token: str | None = None) -> Json:
        return self._do(lambda c: c.resolve(entry_id, **body), token)

    def answer(self, operation_id: str, input_round: int, body: Json, token: str | None = None) -> Json:
        return self._do(lambda c: c.answer(operation_id, input_round, **body), token)

    def cancel(self, call_node: str, body: Json, token: str | None = None) -> Json:
        return self._do(lambda c: c.cancel(call_node, **body), token)

    def rollout(self, action: str, body: Json, token: str | None = None) -> Json:
        return self._do(lambda c: c.rollout(action, body), token)

    def evaluate_gates(self, token: str | None = None) -> Json | None:
        return self._do(lambda c: c.gates(record=True), token)


class _ReadOnlyActions:
    """The actions of a source that only reads: each is refused with ``refusal``; gates are never recorded."""

    refusal: str = "this console is read-only"

    def _refuse(self) -> Json:
        raise ReadOnlyConsole(self.refusal)

    def whoami(self, token: str | None) -> Json | None:
        return None  # a ledger read in place has no identities

    def resolve(self, entry_id: int, body: Json, token: str | None = None) -> Json:
        return self._refuse()

    def answer(self, operation_id: str, input_round: int, body: Json, token: str | None = None) -> Json:
        return self._refuse()

    def cancel(self, call_node: str, body: Json, token: str | None = None) -> Json:
        return self._refuse()

    def rollout(self, action: str, body: Json, token: str | None = None) -> Json:
        return self._refuse()

    def evaluate_gates(self, token: str | None = None) -> Json | None:
        return None  # read-only: the console evaluates itself and records nothing


class FileSource(_ReadOnlyActions):
    """Reads a ledger file read-only (no service running); refuses every action."""

    dialect = "duckdb"

    def __init__(self, path: str | Path, note: str = "") -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise NotConfigured(f"ledger file {self.path} does not exist")
        self.info = SourceInfo("file", str(self.path), writable=False, note=note)
        # One attach for the queries of a page, released when they end (then a writer may open it).
        self._sandbox = SharedSandbox(self.path)

    def close(self) -> None:
        pass

    def held(self) -> AbstractContextManager[None]:
        return self._sandbox.held()

    def query(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]:
        try:
            result = self._sandbox.query(sql, max_rows=max_rows)
        except EngineError as exc:
            raise QueryFailed(str(exc)) from exc
        return result.columns, result.rows, result.truncated, result.elapsed_ms

    def rollout_status(self) -> Json | None:
        return None

    refusal = (
        "this console reads a ledger file read-only; start `finality serve` and set "
        f"{ENV_SERVICE_URL} to act (only the service writes the ledger)"
    )


class PostgresSource(_ReadOnlyActions):
    """Reads a PostgreSQL ledger with no service: every query is analyst SQL (``PgLedger.analyst_query``:
    one statement, in a READ ONLY transaction under the read-only analyst role), the rollout status is
    read through a read-only ledger handle; every action is refused (the executors own the writes).

    The ledger must have been opened (migrated) once by a writer, which also creates the analyst role.
    """

    dialect = "postgres"

    def __init__(self, url: str, note: str = "", *, pool_size: int = 4) -> None:
        # Imported here: a console on DuckDB needs no PostgreSQL driver.
        from engine.ledger.postgres import PgLedger

        try:
            self.ledger = PgLedger.open(url, read_only=True, pool_size=pool_size)
        except EngineError as exc:
            raise NotConfigured(str(exc)) from exc
        self.info = SourceInfo("postgres", self.ledger.path, writable=False, note=note)

    def close(self) -> None:
        self.ledger.close()

    def held(self) -> AbstractContextManager[None]:
        return nullcontext()  # a pool of connections already

    def query(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]:
        try:
            result = self.ledger.analyst_query(sql, max_rows=max_rows)
        except EngineError as exc:
            raise QueryFailed(str(exc)) from exc
        return result.columns, result.rows, result.truncated, result.elapsed_ms

    def rollout_status(self) -> Json | None:
        """The rollout as recorded (stage, exposure, epoch, kill switch with what remains in flight) and
        the audit chain verified against its anchor; None before the first rollout action."""
        # Imported here: rollout sits above the engine, which only presents what it recorded.
        from rollout.controller import verify_ledger
        from rollout.plan import RolloutState

        try:
            row = self.ledger.rollout_state()
            if row is None:
                return None
            state = RolloutState.from_json(row)
            live = self.ledger.live_by_protocol()
            audit = verify_ledger(self.ledger)
        except (EngineError, ValueError) as exc:
            raise ActionRefused(503, f"rollout status unavailable: {exc}") from exc
        remaining = {p: sum(live.get(p, {}).values()) for p in state.disabled_protocols}
        return {
            **state.as_json(),
            "percentage": state.exposure_bp / 100,
            "remaining": remaining,
            "audit": {"verified": audit.ok, "events": audit.checked, "detail": "; ".join(audit.problems)},
        }

    refusal = (
        "this console reads a PostgreSQL ledger read-only; start `finality serve` on it and set "
        f"{ENV_SERVICE_URL} to act (only the executors write the ledger)"
    )


def not_answering(exc: ServiceUnavailable | ServiceRefused) -> SourceUnavailable:
    """A read the service did not answer, said in words a person reads at a glance (the one place that
    says it): it timed out, cannot be reached, or its readers are all busy (503 with Retry-After)."""
    if isinstance(exc, ServiceRefused):
        return SourceUnavailable(f"the service is too busy to answer ({exc.message})")
    if exc.timeout_s is not None:
        return SourceUnavailable(f"the service did not answer in {exc.timeout_s:g} s")
    return SourceUnavailable(str(exc))


def _dialect_of_health(health: Mapping[str, object]) -> str | None:
    """The ledger's dialect if the service's health answer names it (``dialect``, or a ``ledger``
    backend name or URL); None when it does not say."""
    for key in ("dialect", "ledger_dialect", "ledger_backend", "backend", "ledger"):
        value = health.get(key)
        if isinstance(value, Mapping):
            found = _dialect_of_health(value)
            if found is not None:
                return found
            continue
        text = str(value or "").strip().lower()
        if text.startswith("postgres"):
            return "postgres"
        if text.startswith("duckdb"):
            return "duckdb"
    return None


__all__ = [
    "ENV_CACHE_S",
    "ENV_GATE_CACHE_S",
    "ENV_GATE_INTERVAL_S",
    "ENV_LEDGER",
    "ENV_SERVICE_URL",
    "ENV_TIMEOUT_S",
    "SERVICE_GATE_INTERVAL_S",
    "SERVICE_RUN_SLACK_S",
    "FileSource",
    "PostgresSource",
    "ServiceSource",
    "Source",
    "not_answering",
]
