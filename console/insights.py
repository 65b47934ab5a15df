"""The console's one data module: named, aggregated SQL behind every chart, plus the console's actions.

Pages read only through ``Insights``; they never build SQL. Every query is a named template here
(``QUERIES``) with its parameters turned into quoted literals, so the evidence bundle can show the
exact SQL behind each chart. Queries run on one of three sources:

* ``ServiceSource``: the running ``finality serve`` over its control API (``ServiceClient``):
  ``POST /api/v1/sql`` for the queries (sandboxed, on a snapshot; on a PostgreSQL ledger, analyst
  SQL), ``/api/v1/gates``, ``/api/v1/rollout/...`` and the approval/reconciliation/cancel routes for
  actions.
* ``FileSource``: no service running; the ledger file is read read-only through the SQL sandbox
  (``engine.ledger.sandbox.SharedSandbox``: the queries of a page's render share one attach, released
  when they end). Actions are refused: only the process that owns the ledger may write it.
* ``PostgresSource``: no service running, a PostgreSQL ledger (``FINALITY_LEDGER=postgresql://...``);
  every query is analyst SQL (``PgLedger.analyst_query``: a READ ONLY transaction under the
  read-only analyst role), the rollout status is read through a read-only ledger handle. Actions
  are refused, as in file mode.

The named queries are one text for both backends' SQL (DuckDB and PostgreSQL); the few fragments
each dialect says its own way sit side by side in the query's entry (``NamedQuery.fragments``),
chosen by the source's ``dialect``. A service names its ledger's dialect in its health answer, or
is asked once with ``SELECT version()``.

The six gates come from the latest recorded gate run (``gate_runs``, with its raw inputs) when it
is current, and are evaluated afresh otherwise (``Insights.gates``):

* service: the running service records a run every ``gate_interval_s`` (default 10 s); a run no
  older than that interval plus ``SERVICE_RUN_SLACK_S`` is current, shown with its age.
* file (and PostgreSQL with no service): a run is current when nothing was written after it
  (``engine.ledger.gate_sql.RecordedRun.written_since``: the last recorded write instant and the counts,
  from statistics, no scan); the clock-dependent ages are advanced to now exactly
  (``engine.ledger.gate_sql.advance_clock``).

``Insights.from_env()`` picks the source from ``FINALITY_SERVICE_URL`` (preferred while the service
answers) and ``FINALITY_LEDGER`` (a DuckDB file, or a ``postgresql://`` URL). Queries aggregate in
SQL; no page ever pulls a million rows.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import timedelta

import pandas as pd  # type: ignore[import-untyped]

from console.core import _missing, _Raw
from console.export import _csv_bytes, _json_bytes, frame_to_csv, frame_to_parquet
from console.gate_reads import GateReads
from console.operation_reads import OperationReads
from console.queries import (
    ARMS,
    CANCEL_SLO_S,
    CHARTS,
    LIVE_STATES,
    PROTOCOLS,
    QUERIES,
    SQL_EXAMPLES,
    STATES,
    UNKNOWN_SLO_S,
)
from console.rollout_reads import RolloutReads
from console.sources import (
    ENV_CACHE_S,
    ENV_GATE_CACHE_S,
    ENV_GATE_INTERVAL_S,
    ENV_LEDGER,
    ENV_SERVICE_URL,
    ENV_TIMEOUT_S,
    SERVICE_GATE_INTERVAL_S,
    FileSource,
    PostgresSource,
    ServiceSource,
    Source,
)
from console.views import GateView, RolloutStatus
from engine.clock import Clock
from engine.errors import (
    ActionRefused,
    ConsoleError,
    NotConfigured,
    QueryFailed,
    ReadOnlyConsole,
    ServiceRefused,
    ServiceUnavailable,
)
from service.auth import TOKEN_ENV
from service.client import API_VERSION, ServiceClient


class Insights(GateReads, OperationReads, RolloutReads):
    """What the console pages read and do: the facade over the concerns (``console.core`` holds the
    shared state; gates, operations and rollout reads each a module). Thread-safe."""

    # ------------------------------------------------------------------------------ building

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, clock: Clock | None = None) -> Insights:
        """The service at ``FINALITY_SERVICE_URL`` if it answers, else the file at ``FINALITY_LEDGER``.

        Raises:
            NotConfigured: neither is usable (the message says what to set).
        """
        env = os.environ if env is None else env
        url = env.get(ENV_SERVICE_URL, "").strip()
        ledger = env.get(ENV_LEDGER, "").strip()
        cache_s = float(env.get(ENV_CACHE_S, "2") or 0)
        gate_cache_s = float(env.get(ENV_GATE_CACHE_S, "15") or 0)
        interval_s = float(env.get(ENV_GATE_INTERVAL_S, str(SERVICE_GATE_INTERVAL_S)) or 0)
        timeout_s = float(env.get(ENV_TIMEOUT_S, "30") or 30)
        note = ""
        if url:
            # The console's own token (its reads: dashboards run SQL, so an analyst's); each person's
            # actions go with the token they signed in with.
            client = ServiceClient(url, timeout=timeout_s, token=env.get(TOKEN_ENV) or None)
            try:
                health = client.health()
            except (ServiceUnavailable, ServiceRefused) as exc:
                client.close()
                if isinstance(exc, ServiceRefused) and exc.status in (401, 403):
                    raise NotConfigured(
                        f"the Finality service at {url} refuses the console's token ({exc.message}): set "
                        f"{TOKEN_ENV} to an analyst's token for the console's reads (README: Who may act)"
                    ) from exc
                if not ledger:
                    raise NotConfigured(f"the Finality service at {url} does not answer: {exc}") from exc
                note = f"service at {url} does not answer; reading the ledger file read-only"
            else:
                found = health.get("api_version") if isinstance(health, dict) else None
                if not isinstance(found, int) or found < API_VERSION:
                    client.close()
                    speaks = (
                        f"control API version {found}" if isinstance(found, int) else "an older control API"
                    )
                    raise NotConfigured(
                        f"the Finality service at {url} is older than this console: it speaks {speaks}, "
                        f"this console needs version {API_VERSION} or later. Restart `finality serve` from "
                        "the same release as the console (or run the console of the service's release)."
                    )
                return cls(
                    ServiceSource(client, health if isinstance(health, dict) else None),
                    clock=clock,
                    cache_s=cache_s,
                    gate_cache_s=gate_cache_s,
                    gate_interval_s=interval_s,
                    prefetch=True,
                )
        if ledger:
            source: Source
            if ledger.lower().startswith(("postgresql://", "postgres://")):
                source = PostgresSource(ledger, note.replace("the ledger file", "the PostgreSQL ledger"))
            else:
                source = FileSource(ledger, note)
            return cls(
                source,
                clock=clock,
                cache_s=cache_s,
                gate_cache_s=gate_cache_s,
                gate_interval_s=interval_s,
                prefetch=True,
            )
        raise NotConfigured(
            f"set {ENV_SERVICE_URL} (a running `finality serve`) or {ENV_LEDGER} (a ledger file or a "
            "postgresql:// URL, read-only)"
        )

    # evidence -------------------------------------------------------------------------------

    def evidence_bundle(self, *, decision: str = "", actor: str = "") -> bytes:
        """A zip for a rollout decision: gate verdicts and raw inputs, gate history, explorer coverage,
        the audit chain and its verification, and the SQL behind each chart (with its result)."""
        now = self.now()
        files: dict[str, bytes] = {}
        gates = self.gates()
        files["gates.json"] = _json_bytes(
            {
                "evaluated_at": gates.evaluated_at,
                "run_id": gates.run_id,
                "basis": gates.basis,
                "aged_s": gates.aged_s,
                "passed": gates.passed,
                "gates": [asdict(r) for r in gates.results],
                "inputs": gates.inputs,
            }
        )
        files["gate_history.csv"] = _csv_bytes(self.gate_history(runs=500))
        files["explorer_coverage.csv"] = _csv_bytes(self.explorer_coverage())
        status = None
        try:
            status = self.rollout_status()
        except ConsoleError as exc:
            files["rollout_status_error.txt"] = str(exc).encode()
        files["rollout_status.json"] = _json_bytes(asdict(status) if status else None)
        audit = self.audit_log(limit=5000)
        files["audit_log.csv"] = _csv_bytes(audit) if audit is not None else b""
        denials = self.access_denials(limit=5000)
        files["access_denials.csv"] = _csv_bytes(denials) if denials is not None else b""
        files["audit_verification.json"] = _json_bytes(
            asdict(status.audit) if status else {"verified": None, "detail": "no rollout status available"}
        )
        since, until = now - timedelta(days=7), now + timedelta(seconds=1)
        produced: dict[str, Callable[[], pd.DataFrame]] = {
            "arms": self.arms,
            "in_flight": self.in_flight,
            "cancel_latency_over_time": lambda: self.cancel_latency_over_time(since=since, until=until),
            "cancel_latency_summary": lambda: self.cancel_latency_summary(since=since, until=until),
            "slowest_cancels": lambda: self.slowest_cancels(since=since, until=until),
            "unknown_age_histogram": self.unknown_age_histogram,
            "reconciliation_aging": self.reconciliation_aging,
            "explorer_runs": self.explorer_runs,
            "approvals_pending": self.approvals_pending,
        }
        if self.has_table("shadow_diffs"):
            produced["shadow_summary"] = lambda: self._named("shadow_summary")
            produced["shadow_diverged"] = lambda: self._named("shadow_diverged", limit=5000)
        index_lines = ["# The SQL behind each chart", ""]
        for page, names in CHARTS.items():
            index_lines.append(f"## {page}")
            for name in names:
                index_lines.append(f"- `{name}`: {QUERIES[name].title} -> queries/{name}.sql")
            index_lines.append("")
        for name, run in produced.items():
            frame = run()
            files[f"queries/{name}.csv"] = _csv_bytes(frame)
        for name in QUERIES:
            sql = self.last_sql.get(name)
            if sql is None:
                sql = (
                    "-- template (parameters in braces are filled with SQL literals at run time)\n"
                    + QUERIES[name].template.strip()
                )
            files[f"queries/{name}.sql"] = (sql + "\n").encode()
        files["queries/README.md"] = "\n".join(index_lines).encode()
        manifest = {
            "kind": "finality evidence bundle",
            "generated_at": now,
            "decision": decision,
            "actor": actor,
            "source": asdict(self.info),
            "gates_passed": gates.passed,
            "failing_gates": [r.gate for r in gates.failing()],
            "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
        }
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
            bundle.writestr("manifest.json", _json_bytes(manifest))
            for name, data in sorted(files.items()):
                bundle.writestr(name, data)
        return buffer.getvalue()


__all__ = [
    "ARMS",
    "CANCEL_SLO_S",
    "CHARTS",
    "LIVE_STATES",
    "PROTOCOLS",
    "QUERIES",
    "SQL_EXAMPLES",
    "STATES",
    "UNKNOWN_SLO_S",
    "ActionRefused",
    "ConsoleError",
    "GateView",
    "Insights",
    "NotConfigured",
    "QueryFailed",
    "ReadOnlyConsole",
    "RolloutStatus",
    "_Raw",
    "_missing",
    "frame_to_csv",
    "frame_to_parquet",
]
