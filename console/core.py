"""The console's query core: one source, the brief cache of identical queries, the named queries'
rendering, the table list and the background readers (``soon``) every read of ``Insights`` uses.

What the reads and actions are lives in the concern modules (``console.gate_reads``,
``console.operation_reads``, ``console.rollout_reads``) and the facade pages use, ``console.insights``;
this module builds no page's SQL of its own and never talks to a source but through ``Source``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import pandas as pd  # type: ignore[import-untyped]

from console.queries import (
    ARM_FALLBACK_SQL,
    ARM_JOIN_SQL,
    ARM_SQL,
    ARMS,
    QUERIES,
    STATES,
    lit,
    lit_list,
)
from console.sources import (
    SERVICE_GATE_INTERVAL_S,
    Source,
)
from console.views import GateView, Json, SourceInfo
from engine.clock import Clock, SystemClock, monotonic_seconds
from engine.errors import (
    ActionRefused,
)
from engine.ledger.gate_sql import (
    DUPLICATED_OPERATION_IDS,
)

__all__ = ["InsightsCore"]

_T = TypeVar("_T")


@dataclass
class _Cached:
    at: float
    value: object


class InsightsCore:
    """The state every concern of ``Insights`` shares. Thread-safe; identical queries are cached briefly."""

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

    def soon(self, read: Callable[..., _T], /, *args: object, **kwargs: object) -> Future[_T]:
        """Start a read in the background and return its future, so a page overlaps its independent reads.

        Only reads belong here (no Streamlit calls: the work runs outside the page's script thread).
        The gate inputs, for instance, are a whole-ledger scan a page can start before drawing the rest.
        """
        return self._pool.submit(read, *args, **kwargs)


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
