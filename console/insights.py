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
import re
import threading
import zipfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import TypeVar

import pandas as pd  # type: ignore[import-untyped]

from console.export import _csv_bytes, _json_bytes, frame_to_csv, frame_to_parquet
from console.queries import (
    ARM_FALLBACK_SQL,
    ARM_JOIN_SQL,
    ARM_SQL,
    ARMS,
    CANCEL_SLO_S,
    CHARTS,
    LIVE_STATES,
    PROTOCOLS,
    QUERIES,
    ROLLOUT_ACTIONS,
    SQL_EXAMPLES,
    STATES,
    UNKNOWN_SLO_S,
    lit,
    lit_list,
)
from console.sources import (
    ENV_CACHE_S,
    ENV_GATE_CACHE_S,
    ENV_GATE_INTERVAL_S,
    ENV_LEDGER,
    ENV_SERVICE_URL,
    ENV_TIMEOUT_S,
    SERVICE_GATE_INTERVAL_S,
    SERVICE_RUN_SLACK_S,
    FileSource,
    PostgresSource,
    ServiceSource,
    Source,
)
from console.views import GateView, Json, RolloutStatus, SourceInfo, SqlResult, parse_rollout_status
from engine.clock import Clock, SystemClock, monotonic_seconds
from engine.errors import (
    ActionRefused,
    ConsoleError,
    NotConfigured,
    QueryFailed,
    ReadOnlyConsole,
    ServiceRefused,
    ServiceUnavailable,
)
from engine.ledger.gate_sql import (
    DUPLICATED_OPERATION_IDS,
    advance_clock,
    gate_inputs_from_recorded,
    gate_inputs_from_values,
    recorded_run_from_rows,
)
from engine.revision import running_revision
from service.auth import TOKEN_ENV
from service.client import API_VERSION, ServiceClient

_T = TypeVar("_T")


# ------------------------------------------------------------------------------------ literals


# ----------------------------------------------------------------------------- named queries


# ---------------------------------------------------------------------------------- value types


# -------------------------------------------------------------------------------------- sources


# -------------------------------------------------------------------------------------- insights


@dataclass
class _Cached:
    at: float
    value: object


class Insights:
    """What the console pages read and do. Thread-safe; results of identical queries are cached briefly."""

    def __init__(
        self,
        source: Source,
        *,
        clock: Clock | None = None,
        cache_s: float = 2.0,
        gate_cache_s: float = 15.0,
        gate_interval_s: float = SERVICE_GATE_INTERVAL_S,
        prefetch: bool = False,
    ) -> None:
        self.source = source
        self.gate_cache_s = gate_cache_s
        self.gate_interval_s = gate_interval_s
        """How often the service records a gate run (its ``gate_interval_s``; 0: only on request)."""
        self._gate_view: tuple[float, GateView] | None = None
        """The last evaluation this console made itself (fresh or by ``reevaluate``), with when."""
        self.clock: Clock = clock or SystemClock()
        self.cache_s = cache_s
        self._cache: dict[tuple[str, int], _Cached] = {}
        self._lock = threading.Lock()
        self._tables: tuple[float, frozenset[str]] | None = None
        self._tables_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="finality-console")
        self._signs_in: bool | None = None
        self.last_sql: dict[str, str] = {}
        """The SQL each named query last ran with (the evidence bundle's 'SQL behind each chart')."""
        if prefetch:
            # Every page's first query needs the table list (which arm join, whether gate runs
            # exist); read it while the page is still laying itself out.
            self._pool.submit(self.has_table, "gate_runs")

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

    @property
    def info(self) -> SourceInfo:
        return self.source.info

    def whoami(self, token: str | None) -> Json | None:
        """Who ``token`` is to the service (``ActionRefused`` 401 for a bad one); None: a ledger read in place."""
        return self.source.whoami(token)

    @property
    def signs_in(self) -> bool:
        """Whether the service asks for identities (an ``[auth]`` table): then the console signs people in.
        False in the service's local mode and for a ledger read in place (a typed name is the actor)."""
        raw = self._signs_in
        if raw is None:
            raw = self._signs_in = bool(
                self.info.kind == "service" and (self.source.whoami(None) or {}).get("authenticated")
            )
        return raw

    @property
    def dialect(self) -> str:
        """The SQL dialect of the ledger the queries run on: ``duckdb`` or ``postgres``."""
        return self.source.dialect

    def now(self) -> datetime:
        return self.clock.now()

    # ------------------------------------------------------------------------------- queries

    def sql_of(self, name: str, **params: object) -> str:
        """The SQL a named query runs with these parameters (what the pages show under each chart)."""
        arm, join = self._arm() if "{arm" in QUERIES[name].template else ("", "")
        values = {"arm": arm, "arm_join": join, **{k: _param(v) for k, v in params.items()}}
        return QUERIES[name].render(self.dialect, **values)

    def _arm(self) -> tuple[str, str]:
        """How this ledger tells an operation's arm: from ``rollout_assignments`` once the ledger has it."""
        if self.has_table("rollout_assignments"):
            return ARM_SQL, ARM_JOIN_SQL
        return ARM_FALLBACK_SQL, ""

    def has_table(self, table: str) -> bool:
        """Whether the ledger has ``table`` (the list of tables is read once a minute: one query, not one per check)."""
        with self._tables_lock:  # pages read in parallel (``soon``): one of them reads the list
            now = monotonic_seconds()
            cached = self._tables
            if cached is None or now - cached[0] > 60:
                frame = self._named("tables")
                cached = (now, frozenset(str(t) for t in frame["table_name"]))
                self._tables = cached
        return table in cached[1]

    def _named(self, name: str, **params: object) -> pd.DataFrame:
        query = QUERIES[name]
        sql = self.sql_of(name, **params)
        self.last_sql[name] = sql
        columns, rows, _, _ = self._run(sql, query.max_rows)
        frame = pd.DataFrame(rows, columns=columns)
        for column in query.times:
            if column in frame.columns:
                frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
        return frame

    def _run(self, sql: str, max_rows: int) -> tuple[list[str], list[list[object]], bool, float]:
        key = (sql, max_rows)
        now = monotonic_seconds()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit.at <= self.cache_s:
                return hit.value  # type: ignore[return-value]
        value = self.source.query(sql, max_rows)
        if self.cache_s > 0:
            with self._lock:
                if len(self._cache) > 256:
                    self._cache.clear()
                self._cache[key] = _Cached(now, value)
        return value

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
        self._gate_view = None
        self._tables = None

    def reading(self) -> AbstractContextManager[None]:
        """Hold the source for the reads made meanwhile (a page's render): on a ledger file they share
        one read-only attach instead of attaching per query; released when the last one ends."""
        return self.source.held()

    def close(self) -> None:
        """Stop the background readers (``soon``) and close the source (a PostgreSQL source's pool)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.source.close()

    # overview -------------------------------------------------------------------------------

    def arms(self) -> pd.DataFrame:
        """Operations and in-flight operations per arm (``last_assigned_at``: creation time on old ledgers)."""
        return self._named("arms" if self.has_table("rollout_assignments") else "arms_by_adapter")

    def in_flight(self) -> pd.DataFrame:
        return self._named("in_flight")

    def alerts(self) -> dict[str, float]:
        frame = self._named("alerts", now=self.now())
        row = frame.iloc[0].to_dict() if len(frame) else {}
        return {k: float(v) if v is not None and not pd.isna(v) else 0.0 for k, v in row.items()}

    def gate_inputs(self) -> tuple[dict[str, dict[str, object]], datetime]:
        """The six gates' raw inputs, read from the ledger now (``engine.ledger.gate_sql``, the ``Ledger.gate_inputs`` shape)."""
        now = self.now()
        sql = self.sql_of("gate_inputs", now=now, revision=running_revision())
        self.last_sql["gate_inputs"] = sql
        columns, rows, _, _ = self._run(sql, 1)
        if not rows:
            raise QueryFailed("the gate-inputs query returned no row")
        return gate_inputs_from_values(columns, rows[0]), now

    def recorded_gates(self) -> GateView | None:
        """The six gates from the latest recorded run when it is current, else None (with no scan).

        Service: the service records a run every ``gate_interval_s``; a run read through its SQL
        snapshot is current while no older than that interval plus ``SERVICE_RUN_SLACK_S``. File:
        nobody writes the ledger, so a run is current when nothing was written after it (the last
        recorded write instant and the row counts, ``RecordedRun.written_since``); its clock-dependent
        ages are then advanced to now, which is exactly what a fresh evaluation would read.
        """
        if not self.has_table("gate_runs"):
            return None
        columns, rows, _, _ = self._run(self.sql_of("latest_gate_run"), 100)
        run = recorded_run_from_rows(columns, rows)
        if run is None or run.inputs is None:
            return None
        now = self.now()
        age = max(0.0, (now - run.evaluated_at).total_seconds())
        if self.info.kind == "service":
            bound = self.gate_interval_s + SERVICE_RUN_SLACK_S
            if self.gate_interval_s <= 0 or age > bound:
                return None
            inputs, aged, basis = (
                run.inputs,
                0.0,
                (
                    f"run #{run.run_id}, recorded by the service every {self.gate_interval_s:g} s "
                    f"(a run older than {bound:g} s is not used)"
                ),
            )
        else:
            if run.written_since() is not None:
                return None
            inputs, aged = advance_clock(run.inputs, age), age
            basis = f"run #{run.run_id}; nothing written to the ledger since" + (
                f", ages advanced {age:.0f} s to now" if age >= 1 else ""
            )
        view = GateView.evaluate(inputs, run.evaluated_at, self.info.kind)
        return replace(view, run_id=run.run_id, basis=basis, aged_s=aged)

    def gates(self, thresholds: object | None = None, *, max_age_s: float | None = None) -> GateView:
        """The six gates, by ``rollout.gates.evaluate``; with other ``Thresholds``, the what-if on the same inputs.

        From the latest recorded run when it is current (``recorded_gates``), or this console's own
        last evaluation when newer and no older than ``max_age_s`` (default ``gate_cache_s``);
        otherwise evaluated afresh (a whole-ledger scan, about a second at a million operations).
        ``evaluated_at`` says when the inputs were read and ``basis`` why they are current. To
        evaluate other thresholds on the inputs a view was built from, use ``GateView.with_thresholds``.
        """
        limit = self.gate_cache_s if max_age_s is None else max_age_s
        candidates: list[GateView] = []
        own = self._gate_view
        if own is not None and monotonic_seconds() - own[0] <= limit:
            candidates.append(own[1])
        recorded = self.recorded_gates()
        if recorded is not None:
            candidates.append(recorded)
        view = max(candidates, key=lambda v: v.evaluated_at) if candidates else self._evaluate_here()
        return view if thresholds is None else view.with_thresholds(thresholds)

    def _evaluate_here(self) -> GateView:
        inputs, now = self.gate_inputs()
        view = replace(
            GateView.evaluate(inputs, now, self.info.kind),
            basis="evaluated now by this console (no current recorded run)",
        )
        self._gate_view = (monotonic_seconds(), view)
        return view

    def reevaluate(self) -> GateView:
        """Evaluate the gates afresh now ("Re-evaluate now").

        Service: ``POST /api/v1/gates`` (the service reads its live ledger and records the run).
        File: this console reads the ledger file itself (read-only: nothing is recorded).
        """
        at = self.now()
        body = self.source.evaluate_gates()
        if body is None:
            view = self._evaluate_here()
            view = replace(view, basis="re-evaluated now by this console (read-only: not recorded)")
        else:
            try:
                inputs = gate_inputs_from_recorded({str(g["gate"]): g["inputs"] for g in body["gates"]})
            except (KeyError, TypeError, ValueError) as exc:
                raise QueryFailed(f"the service's gate evaluation could not be read: {exc}") from exc
            run_id = body.get("run_id")
            view = replace(
                GateView.evaluate(inputs, at, self.info.kind),
                run_id=int(run_id) if isinstance(run_id, int) else None,
                basis=f"re-evaluated now by the service (POST /api/v1/gates), recorded as run #{run_id}",
            )
        self._gate_view = (monotonic_seconds(), view)
        with self._lock:
            self._cache.clear()  # the gate history shows the new run as soon as the snapshot has it
        return view

    def soon(self, read: Callable[..., _T], /, *args: object, **kwargs: object) -> Future[_T]:
        """Start a read in the background and return its future, so a page overlaps its independent reads.

        Only reads belong here (no Streamlit calls: the work runs outside the page's script thread).
        The gate inputs, for instance, are a whole-ledger scan a page can start before drawing the rest.
        """
        return self._pool.submit(read, *args, **kwargs)

    # cancel latency -------------------------------------------------------------------------

    def cancel_span(self, *, since: datetime, until: datetime) -> datetime | None:
        """When the first confirmed cancel in ``[since, until)`` was accepted (None: there is none)."""
        frame = self._named("cancel_span", since=since, until=until)
        if frame.empty or _missing(frame.iloc[0]["first_at"]):
            return None
        first: datetime = frame.iloc[0]["first_at"].to_pydatetime()
        return first

    def cancel_latency_over_time(
        self,
        *,
        since: datetime,
        until: datetime,
        bucket: timedelta = timedelta(hours=1),
        by: str = "protocol",
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
    ) -> pd.DataFrame:
        group = {"protocol": "protocol", "arm": "arm", "all": "'all'"}[by]
        chosen = _choices(arms, ARMS)
        if by != "arm" and _all_arms(chosen):
            # Every operation's arm is one of ARMS, so all of them selected filters nothing: the
            # arm (a join with a million-row table) is not read at all.
            arm_parts: dict[str, object] = {
                "arm": _Raw("NULL"),
                "arm_join": _Raw(""),
                "arm_filter": _Raw("TRUE"),
            }
        else:
            arm_parts = {"arm_filter": _Raw(f"arm IN {lit_list(list(chosen))}")}
        return self._named(
            "cancel_latency_over_time",
            since=since,
            until=until,
            bucket=bucket,
            group=_Raw(group),
            protocols=_choices(protocols, PROTOCOLS),
            **arm_parts,
        )

    def cancel_latency_summary(
        self,
        *,
        since: datetime,
        until: datetime,
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
    ) -> pd.DataFrame:
        return self._named(
            "cancel_latency_summary",
            since=since,
            until=until,
            protocols=_choices(protocols, PROTOCOLS),
            arms=_choices(arms, ARMS),
        )

    def slowest_cancels(
        self,
        *,
        since: datetime,
        until: datetime,
        protocols: Sequence[str] = PROTOCOLS,
        arms: Sequence[str] = ARMS,
        limit: int = 25,
    ) -> pd.DataFrame:
        chosen_protocols = _choices(protocols, PROTOCOLS)
        chosen_arms = _choices(arms, ARMS)
        if set(chosen_protocols) == set(PROTOCOLS) and _all_arms(chosen_arms):
            # Every operation's protocol is one of PROTOCOLS and its arm one of ARMS: nothing to filter.
            filter_join, where = "", "TRUE"
        else:
            arm, join = self._arm()
            filter_join = f"JOIN op_identity i USING (operation_id) {join}"
            where = (
                f"i.protocol IN {lit_list(list(chosen_protocols))} AND {arm} IN {lit_list(list(chosen_arms))}"
            )
        return self._named(
            "slowest_cancels",
            now=self.now(),
            since=since,
            until=until,
            filter_join=_Raw(filter_join),
            filter=_Raw(where),
            limit=_limit(limit),
        )

    # reconciliation -------------------------------------------------------------------------

    def unknown_age_histogram(
        self, *, kinds: Sequence[str] = ("unknown",), bin_min: int = 5, cap_min: int = 240
    ) -> pd.DataFrame:
        return self._named(
            "unknown_age_histogram",
            now=self.now(),
            kinds=_choices(kinds, ("unknown", "effects")),
            bin_min=max(1, int(bin_min)),
            cap_min=max(1, int(cap_min)),
        )

    def reconciliation_aging(
        self, *, kinds: Sequence[str] = ("unknown", "effects"), limit: int = 500
    ) -> pd.DataFrame:
        return self._named(
            "reconciliation_aging",
            now=self.now(),
            kinds=_choices(kinds, ("unknown", "effects")),
            limit=_limit(limit),
        )

    def reconciliation_resolved(self, *, limit: int = 50) -> pd.DataFrame:
        return self._named("reconciliation_resolved", limit=_limit(limit))

    def resolve(
        self,
        entry_id: int,
        *,
        actor: str,
        reason: str,
        task_id: str | None = None,
        absent: bool = False,
        token: str | None = None,
    ) -> Json:
        """Resolve a reconciliation entry (through the service: a person's decision, with actor and reason;
        ``token``: the signed-in person's, whose principal the service records as the actor)."""
        actor, reason = _required(actor, "actor"), _required(reason, "reason")
        body: Json = {
            "actor": actor,
            "reason": reason,
            "absent": absent,
            "task_id": (task_id or "").strip() or None,
        }
        result = self.source.resolve(int(entry_id), body, token)
        self.clear_cache()
        return result

    # gates ----------------------------------------------------------------------------------

    def gate_history(self, *, runs: int = 200) -> pd.DataFrame:
        return self._named("gate_history", runs=_limit(runs))

    def explorer_coverage(self) -> pd.DataFrame:
        return self._named("explorer_coverage")

    def explorer_runs(self, *, limit: int = 200) -> pd.DataFrame:
        return self._named("explorer_runs", limit=_limit(limit))

    # operations -----------------------------------------------------------------------------

    def filter_options(self) -> dict[str, list[str]]:
        frame = self._named("filter_options")
        out: dict[str, list[str]] = {"protocol": [], "tool": [], "bounds": []}
        for field_name, value in frame.itertuples(index=False):
            if value is not None:
                out.setdefault(str(field_name), []).append(str(value))
        out["state"] = list(STATES)
        out["arm"] = list(ARMS)
        return out

    def operations(
        self,
        *,
        states: Sequence[str] = (),
        protocols: Sequence[str] = (),
        tools: Sequence[str] = (),
        arms: Sequence[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        duplicated: bool = False,
        limit: int = 200,
    ) -> pd.DataFrame:
        """The newest operations matching the filters; ``duplicated``: only those the
        duplicate_operations gate counts (bound to a second server task)."""
        arm, join = self._arm()
        where = _op_filter(arm, states, protocols, tools, arms, since, until, duplicated)
        picking_join = join if arms else ""  # the arm is joined to the picked rows only, unless filtered on
        # Pick the newest ids first and join the rest to those only: a top-N over a million-row
        # join is what makes this slow, not the filters.
        candidates = f"op_identity i {picking_join}" + (
            " JOIN op_state s USING (operation_id)" if states or duplicated else ""
        )
        return self._named("operations", where=_Raw(where), candidates=_Raw(candidates), limit=_limit(limit))

    def operations_by_state(
        self,
        *,
        states: Sequence[str] = (),
        protocols: Sequence[str] = (),
        tools: Sequence[str] = (),
        arms: Sequence[str] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        duplicated: bool = False,
    ) -> pd.DataFrame:
        arm, join = self._arm() if arms else ("", "")
        where = _op_filter(arm, states, protocols, tools, arms, since, until, duplicated)
        # Join only what the filter reads: op_state alone answers "per state" for everything.
        needs_identity = bool(protocols or tools or arms or since or until)
        source = "op_state s" + (f" JOIN op_identity i USING (operation_id) {join}" if needs_identity else "")
        return self._named("operations_by_state", where=_Raw(where), source=_Raw(source))

    def operation(self, key: str) -> dict[str, object] | None:
        """One operation by call node id or operation id (None if there is none)."""
        frame = self._named("operation", key=key.strip())
        if frame.empty:
            return None
        return {k: (None if _missing(v) else v) for k, v in frame.iloc[0].to_dict().items()}

    def timeline(self, key: str) -> pd.DataFrame:
        """Transitions, protocol requests and the receipt of one call node, in time order."""
        return self._named("operation_timeline", key=key.strip())

    def cancel(self, call_node: str, *, actor: str, reason: str, token: str | None = None) -> Json:
        body = {"actor": _required(actor, "actor"), "reason": _required(reason, "reason")}
        result = self.source.cancel(_path_part(call_node), body, token)
        self.clear_cache()
        return result

    # approvals ------------------------------------------------------------------------------

    def approvals_pending(self, *, limit: int = 200) -> pd.DataFrame:
        """Rounds a person can answer now, newest first: the operation is in INPUT_REQUIRED at this very
        round and the deadline has not passed (a round whose operation moved on is not listed)."""
        return self._named("approvals_pending", now=self.now(), limit=_limit(limit))

    def approvals_answered(self, *, limit: int = 50) -> pd.DataFrame:
        return self._named("approvals_answered", limit=_limit(limit))

    def answer(
        self, operation_id: str, input_round: int, *, actor: str, answer: Json, token: str | None = None
    ) -> Json:
        """Answer one input round; the service refuses (409) an answer to a round that is no longer open."""
        if not isinstance(answer, dict):
            raise ActionRefused(400, "an answer must be a JSON object")
        body = {"actor": _required(actor, "actor"), "answer": answer}
        result = self.source.answer(_path_part(operation_id), int(input_round), body, token)
        self.clear_cache()
        return result

    # rollout --------------------------------------------------------------------------------

    def rollout_status(self) -> RolloutStatus | None:
        """The rollout as the service reports it; None when no service runs or it has no rollout API yet."""
        raw = self.source.rollout_status()
        return parse_rollout_status(raw) if raw is not None else None

    def rollout_action(
        self,
        action: str,
        *,
        actor: str,
        reason: str,
        percentage: float | None = None,
        protocol: str | None = None,
        token: str | None = None,
    ) -> Json:
        """Ask the service for a rollout action (``shadow``, ``canary``, ``promote``, ``rollback``, ...)."""
        if action not in ROLLOUT_ACTIONS:
            raise ActionRefused(400, f"unknown rollout action {action!r}")
        body: Json = {"actor": _required(actor, "actor"), "reason": _required(reason, "reason")}
        if percentage is not None:
            body["percentage"] = percentage
        if protocol is not None:
            body["protocol"] = _choices([protocol], PROTOCOLS)[0]
        result = self.source.rollout(action, body, token)
        self.clear_cache()
        return result

    def outbox_lag(self) -> pd.DataFrame | None:
        """Per downstream consumer: entries acknowledged and behind, its last acknowledgement, and the
        age in seconds of the oldest entry it has not acknowledged (None: a ledger without acks)."""
        if not self.has_table("outbox_acks"):
            return None
        frame = self._named("outbox_lag")
        now = pd.Timestamp(self.now())
        frame["oldest_waiting_s"] = [
            None if pd.isna(t) else (now - pd.Timestamp(t)).total_seconds()
            for t in frame["oldest_unacked_at"]
        ]
        return frame

    def shadow_summary(self) -> pd.DataFrame | None:
        """Per tool: the old path and the new one, pairs compared and diverged (None: no shadow table)."""
        if not self.has_table("shadow_diffs"):
            return None
        return self._named("shadow_summary")

    def shadow_diverged(self, *, limit: int = 100) -> pd.DataFrame | None:
        """Diverged shadow pairs, newest first, with both sides' call nodes (None: no shadow table)."""
        if not self.has_table("shadow_diffs"):
            return None
        return self._named("shadow_diverged", limit=_limit(limit))

    def access_denials(self, *, limit: int = 200) -> pd.DataFrame | None:
        """Refused control-API attempts (401/403), newest first; None while the ledger has no such table."""
        if not self.has_table("access_denials"):
            return None
        frame = self._named("access_denials", limit=_limit(limit))
        frame["recorded_at"] = pd.to_datetime(frame["recorded_at"], utc=True, format="ISO8601")
        return frame

    def audit_log(self, *, limit: int = 200) -> pd.DataFrame | None:
        """The rollout audit log (newest first), or None while the ledger has no ``rollout_events`` table."""
        if not self.has_table("rollout_events"):
            return None
        frame = self._named("audit_log", limit=_limit(limit))
        for column in frame.columns:
            if column.endswith("_at"):
                frame[column] = pd.to_datetime(frame[column], utc=True, format="ISO8601")
        return frame

    # SQL ------------------------------------------------------------------------------------

    def run_sql(self, sql: str, *, max_rows: int = 1000) -> SqlResult:
        """An analyst's own read-only query, through the sandbox (never cached)."""
        columns, rows, truncated, elapsed = self.source.query(sql, max(1, min(int(max_rows), 100_000)))
        return SqlResult(pd.DataFrame(rows, columns=columns), truncated, elapsed, sql)

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


# ------------------------------------------------------------------------------------ helpers


class _Raw(str):
    """A fragment this module composed itself from validated pieces (never user text)."""


def _param(value: object) -> str:
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, _Choices):
        return lit_list(list(value))
    return lit(value)


class _Choices(tuple[str, ...]):
    pass


def _choices(values: Sequence[str], allowed: Sequence[str]) -> _Choices:
    chosen = [v for v in values if v in allowed]
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f"unknown values {unknown}; allowed: {list(allowed)}")
    return _Choices(chosen)


def _all_arms(chosen: Sequence[str]) -> bool:
    """Whether every arm is chosen (an operation's arm is always one of ``ARMS``: ``rollout.assign.Arm``
    or, with no recorded arm, ``unassigned``), so filtering on the arm would keep every row."""
    return set(chosen) == set(ARMS)


def _limit(value: int) -> int:
    return max(1, min(int(value), 10_000))


def _required(value: str, what: str) -> str:
    text = (value or "").strip()
    if not text:
        raise ActionRefused(400, f"{what} is required")
    return text


_SAFE_PATH = re.compile(r"^[A-Za-z0-9._:@\-]+$")


def _path_part(value: str) -> str:
    text = value.strip()
    if not _SAFE_PATH.match(text):
        raise ActionRefused(400, f"not a valid id: {value!r}")
    return text


def _op_filter(
    arm_sql: str,
    states: Sequence[str],
    protocols: Sequence[str],
    tools: Sequence[str],
    arms: Sequence[str],
    since: datetime | None,
    until: datetime | None,
    duplicated: bool = False,
) -> str:
    parts = ["TRUE"]
    if duplicated:  # the gate's own definition (one text), so the link lists exactly what it counts
        parts.append(f"s.operation_id IN ({DUPLICATED_OPERATION_IDS})")
    if states:
        parts.append(f"s.state IN {lit_list(_choices(states, STATES))}")
    if protocols:
        parts.append(f"i.protocol IN {lit_list(list(protocols))}")
    if tools:
        parts.append(f"i.tool_name IN {lit_list(list(tools))}")
    if arms:
        parts.append(f"{arm_sql} IN {lit_list(_choices(arms, ARMS))}")
    if since is not None:
        parts.append(f"i.created_at >= {lit(since)}")
    if until is not None:
        parts.append(f"i.created_at < {lit(until)}")
    return " AND ".join(parts)


def _missing(value: object) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


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
    "frame_to_csv",
    "frame_to_parquet",
]
