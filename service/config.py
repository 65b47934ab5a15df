"""The service's TOML configuration, parsed into frozen values and refused early with the key named.

Example::

    ledger = "data/finality.duckdb"          # optional; --ledger wins (or postgresql://...)
    global_qps = 200                         # across every executor sharing a PostgreSQL ledger
    lease_s = 30                             # PostgreSQL only: lease length (takeover after expiry)
    rollout_salt = "2026-q4"

    [servers.reports]
    url = "http://127.0.0.1:9101/mcp"
    protocol = "mcp-2025-11-25"              # or mcp-2026-07-28, aip-151, legacy-sync, auto
    token = "secret"                         # optional bearer token
    principal = "svc-reports"                # optional; defaults to "anonymous"
    qps = 50

    [servers.uploads]
    url = "http://127.0.0.1:9102"
    protocol = "aip-151"
    request_id_dedupe = true                 # AIP-151: the service dedupes request_id (default false:
                                             # a lost create response then goes to reconciliation)

    [tools.generate_report]
    server = "reports"
    version = "1.4.0"
    side_effect_free = true
    sync_limit_s = 20                        # published synchronous limit (optional)
    wait_budget_s = 900
    on_budget_exhausted = "cancel"           # or "stop" (stop waiting only); a server without cancel
                                             # capability gets a 'budget' reconciliation entry instead
    max_argument_bytes = 4194304             # optional; this tool's arguments (compact JSON), default
                                             # limits.body_bytes

    [limits]                                 # optional; the defaults shown (README: Limits)
    body_bytes = 1048576                     # any request body, enforced while reading (413)
    answer_bytes = 65536                     # an answer to an input round (413)
    in_flight_per_principal = 10000          # operations without a receipt, per principal (429)
    submissions_per_s_per_principal = 200    # token bucket per principal (429 + Retry-After)
    submission_burst = 400                   # default: twice the rate

    [auth]                                   # tokens, principals and roles (service.auth; README: Who may act)
    [auth.tokens.alice]
    sha256 = "..."                           # finality token new --principal alice --role release-manager
    principal = "alice"
    roles = ["release-manager"]

    [analyst]                                # reads that are not the executor's own (all optional)
    workers = 2                              # reader threads (analyst SQL, console, gates, metrics)
    queue = 8                                # reads waiting beyond those; more get 503 + Retry-After
    queries = 0                              # analyst queries running at once (0: one fewer than
                                             # the cores, at least 1); the rest wait in the queue
    timeout_s = 10                           # one query's time limit
    memory_limit_mb = 512                    # DuckDB sandbox: memory per query (no spilling)
    threads = 1                              # DuckDB sandbox: threads per query
    work_mem_mb = 64                         # PostgreSQL analyst role: work_mem
    nice = 19                                # CPU priority of reader threads (and a local PostgreSQL
                                             # analyst backend): 0-19, 19 yields to the executor
    max_rows = 100000                        # the most rows one result may carry
    max_result_mb = 64                       # the most MB one result may carry
    snapshot_every_min = 0                   # publish a snapshot every N minutes (0: on request only)
    snapshot_keep = 3                        # snapshots kept (older ones deleted)
    snapshot_dir = "data/snapshots"          # where snapshots go (default: beside the ledger)

No I/O beyond reading the file; nothing here talks to a server.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal

from engine.errors import ConfigError
from engine.model import Protocol, ToolRef
from service.auth import AuthConfig, parse_auth

_PROTOCOLS = {p.value for p in Protocol} | {"auto"}
_SERVER_KEYS = {
    "url",
    "protocol",
    "token",
    "principal",
    "qps",
    "ttl_s",
    "max_result_bytes",
    "request_id_dedupe",
}
_TOOL_KEYS = {
    "server",
    "version",
    "descriptor_version",
    "side_effect_free",
    "sync_limit_s",
    "wait_budget_s",
    "on_budget_exhausted",
    "shadow_server",
    "max_argument_bytes",
}
_LIMIT_KEYS = {
    "body_bytes",
    "answer_bytes",
    "in_flight_per_principal",
    "submissions_per_s_per_principal",
    "submission_burst",
}
_TOP_KEYS = {
    "ledger",
    "global_qps",
    "rollout_salt",
    "servers",
    "tools",
    "poll",
    "gate_interval_s",
    "lease_s",
    "analyst",
    "limits",
    "auth",
}
_ANALYST_KEYS = {
    "workers",
    "queue",
    "queries",
    "timeout_s",
    "memory_limit_mb",
    "threads",
    "work_mem_mb",
    "nice",
    "max_rows",
    "max_result_mb",
    "snapshot_every_min",
    "snapshot_keep",
    "snapshot_dir",
}
_POLL_KEYS = {"default_interval_ms", "min_interval_ms", "max_interval_ms", "jitter", "retry_backoff_ms"}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    name: str
    url: str
    protocol: str
    token: str | None = None
    principal: str = "anonymous"
    qps: float = 50.0
    ttl: timedelta | None = None
    max_result_bytes: int | None = None
    request_id_dedupe: bool = False
    """AIP-151: the service deduplicates AIP-155 ``request_id`` (declared, never assumed: see
    ``AdapterOptions.request_id_dedupe``)."""


@dataclass(frozen=True, slots=True)
class ToolConfig:
    name: str
    server: str
    version: str = "unversioned"
    descriptor_version: str = "1"
    side_effect_free: bool = False
    sync_limit: timedelta | None = None
    wait_budget: timedelta = timedelta(minutes=15)
    on_budget_exhausted: Literal["cancel", "stop"] = "cancel"
    shadow_server: str | None = None
    max_argument_bytes: int | None = None
    """This tool's arguments, as compact JSON; None: ``limits.body_bytes``."""

    @property
    def ref(self) -> ToolRef:
        return ToolRef(
            self.name, self.version, self.descriptor_version, side_effects=not self.side_effect_free
        )


@dataclass(frozen=True, slots=True)
class PollConfig:
    default_interval: timedelta = timedelta(seconds=1)
    min_interval: timedelta = timedelta(milliseconds=50)
    max_interval: timedelta = timedelta(seconds=30)
    jitter: float = 0.1
    retry_backoff: timedelta = timedelta(milliseconds=200)


@dataclass(frozen=True, slots=True)
class AnalystConfig:
    """Limits on the reads that are not the executor's own (see ``service.readers``)."""

    workers: int = 2
    queue: int = 8
    queries: int = 0
    """Analyst queries that may run at once (0: one fewer than the cores, at least one; never more
    than ``workers``): a query that runs for its whole time limit holds a core, and a core is left
    to the executor however many analysts ask (``service.readers.analyst_slots``)."""
    timeout: timedelta = timedelta(seconds=10)
    memory_limit_mb: int = 512
    threads: int = 1
    work_mem_mb: int = 64
    nice: int = 19
    """Scheduling niceness of reader threads and of a local PostgreSQL analyst backend: on a
    machine with few cores a reader that burns a core takes CPU from the executor even though it
    never holds the loop; at 19 it runs on what the executor leaves (and a PostgreSQL analyst
    backend goes into the idle scheduling class: ``engine.ledger.analyst``)."""
    max_rows: int = 100_000
    max_result_mb: int = 64
    """The most bytes (MiB) one analyst answer may carry, however few its rows."""
    snapshot_every: timedelta | None = None
    snapshot_keep: int = 3
    snapshot_dir: str | None = None


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """What one request and one principal may ask of the service (README: Limits)."""

    body_bytes: int = 1 << 20
    answer_bytes: int = 64 << 10
    in_flight_per_principal: int = 10_000
    submissions_per_s_per_principal: float = 200.0
    submission_burst: float = 400.0


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    servers: dict[str, ServerConfig]
    tools: dict[str, ToolConfig]
    global_qps: float = 200.0
    rollout_salt: str = "finality"
    ledger: str | None = None
    poll: PollConfig = field(default_factory=PollConfig)
    gate_interval: timedelta | None = timedelta(seconds=10)
    """How often the service evaluates the six gates and records the run (None: only on request)."""
    lease_s: float = 30.0
    """PostgreSQL ledger: how long an executor's lease lasts without renewal (renewed every third)."""
    analyst: AnalystConfig = field(default_factory=AnalystConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    auth: AuthConfig | None = None
    """Tokens, principals and roles (``service.auth``); None: local mode (loopback only, no identities)."""

    def argument_limit(self, tool: str) -> int:
        """The byte limit on ``tool``'s arguments (its own, else the body limit)."""
        config = self.tools.get(tool)
        own = config.max_argument_bytes if config is not None else None
        return own if own is not None else self.limits.body_bytes

    @property
    def calls_body_limit(self) -> int:
        """What ``POST /api/v1/calls`` reads at most: the largest argument limit plus room for the rest."""
        largest = max([self.limits.body_bytes, *(self.argument_limit(t) for t in self.tools)])
        return largest if largest == self.limits.body_bytes else largest + (64 << 10)


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _flag(table: dict[str, object], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}", "must be true or false")
    return value


def _number(table: dict[str, object], key: str, where: str, *, positive: bool = True) -> float | None:
    if key not in table:
        return None
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(_key(where, key), f"must be a number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(_key(where, key), f"must be positive, got {value!r}")
    return float(value)


def _string(table: dict[str, object], key: str, where: str, *, required: bool = False) -> str | None:
    if key not in table:
        if required:
            raise ConfigError(_key(where, key), "is required")
        return None
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(_key(where, key), f"must be a non-empty string, got {value!r}")
    return value


def _unknown(table: dict[str, object], allowed: set[str], where: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(
                _key(where, key) if where else key, f"unknown key (allowed: {', '.join(sorted(allowed))})"
            )


def _table(value: object, where: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ConfigError(where, "must be a table")
    return value


def _ms(table: dict[str, object], key: str, where: str, default: timedelta) -> timedelta:
    value = _number(table, key, where)
    return default if value is None else timedelta(milliseconds=value)


def parse_config(data: dict[str, object], source: Path | None = None) -> ServiceConfig:
    """Validate a parsed TOML document (``source``: the file it came from, where ``[auth]``'s tokens are
    read again on change).

    Raises:
        ConfigError: naming the offending key.
    """
    _unknown(data, _TOP_KEYS, "")
    servers: dict[str, ServerConfig] = {}
    for name, raw in _table(data.get("servers", {}), "servers").items():
        where = f"servers.{name}"
        table = _table(raw, where)
        _unknown(table, _SERVER_KEYS, where)
        url = _string(table, "url", where, required=True)
        assert url is not None
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.url", f"must be an http(s) URL, got {url!r}")
        protocol = _string(table, "protocol", where) or "auto"
        if protocol not in _PROTOCOLS:
            raise ConfigError(
                f"{where}.protocol", f"unknown protocol {protocol!r} (one of {', '.join(sorted(_PROTOCOLS))})"
            )
        ttl = _number(table, "ttl_s", where)
        max_bytes = _number(table, "max_result_bytes", where)
        servers[name] = ServerConfig(
            name=name,
            url=url,
            protocol=protocol,
            token=_string(table, "token", where),
            principal=_string(table, "principal", where) or "anonymous",
            qps=_number(table, "qps", where) or 50.0,
            ttl=timedelta(seconds=ttl) if ttl is not None else None,
            max_result_bytes=int(max_bytes) if max_bytes is not None else None,
            request_id_dedupe=_flag(table, "request_id_dedupe", where),
        )
    if not servers:
        raise ConfigError("servers", "at least one server is required")
    tools: dict[str, ToolConfig] = {}
    for name, raw in _table(data.get("tools", {}), "tools").items():
        where = f"tools.{name}"
        table = _table(raw, where)
        _unknown(table, _TOOL_KEYS, where)
        server = _string(table, "server", where, required=True)
        assert server is not None
        if server not in servers:
            raise ConfigError(f"{where}.server", f"names no configured server: {server!r}")
        shadow = _string(table, "shadow_server", where)
        if shadow is not None and shadow not in servers:
            raise ConfigError(f"{where}.shadow_server", f"names no configured server: {shadow!r}")
        side_effect_free = table.get("side_effect_free", False)
        if not isinstance(side_effect_free, bool):
            raise ConfigError(f"{where}.side_effect_free", "must be true or false")
        on_exhausted = table.get("on_budget_exhausted", "cancel")
        if on_exhausted not in ("cancel", "stop"):
            raise ConfigError(
                f"{where}.on_budget_exhausted", f"must be 'cancel' or 'stop', got {on_exhausted!r}"
            )
        sync = _number(table, "sync_limit_s", where)
        budget = _number(table, "wait_budget_s", where)
        max_arguments = _integer(table, "max_argument_bytes", where)
        tools[name] = ToolConfig(
            name=name,
            server=server,
            version=_string(table, "version", where) or "unversioned",
            descriptor_version=_string(table, "descriptor_version", where) or "1",
            side_effect_free=side_effect_free,
            sync_limit=timedelta(seconds=sync) if sync is not None else None,
            wait_budget=timedelta(seconds=budget) if budget is not None else timedelta(minutes=15),
            on_budget_exhausted="cancel" if on_exhausted == "cancel" else "stop",
            shadow_server=shadow,
            max_argument_bytes=max_arguments,
        )
    poll_table = _table(data.get("poll", {}), "poll")
    _unknown(poll_table, _POLL_KEYS, "poll")
    defaults = PollConfig()
    jitter = _number(poll_table, "jitter", "poll", positive=False)
    if jitter is not None and not 0 <= jitter < 1:
        raise ConfigError("poll.jitter", f"must be in [0, 1), got {jitter}")
    poll = PollConfig(
        default_interval=_ms(poll_table, "default_interval_ms", "poll", defaults.default_interval),
        min_interval=_ms(poll_table, "min_interval_ms", "poll", defaults.min_interval),
        max_interval=_ms(poll_table, "max_interval_ms", "poll", defaults.max_interval),
        jitter=defaults.jitter if jitter is None else jitter,
        retry_backoff=_ms(poll_table, "retry_backoff_ms", "poll", defaults.retry_backoff),
    )
    if poll.min_interval > poll.max_interval:
        raise ConfigError("poll.min_interval_ms", "must not exceed poll.max_interval_ms")
    gate_interval_s = _number(data, "gate_interval_s", "", positive=False)
    if gate_interval_s is not None and gate_interval_s < 0:
        raise ConfigError("gate_interval_s", f"must be 0 (off) or a number of seconds, got {gate_interval_s}")
    return ServiceConfig(
        analyst=_analyst(_table(data.get("analyst", {}), "analyst")),
        gate_interval=timedelta(seconds=10)
        if gate_interval_s is None
        else (timedelta(seconds=gate_interval_s) if gate_interval_s > 0 else None),
        servers=servers,
        tools=tools,
        global_qps=_number(data, "global_qps", "") or 200.0,
        rollout_salt=_string(data, "rollout_salt", "") or "finality",
        ledger=_string(data, "ledger", ""),
        poll=poll,
        lease_s=_number(data, "lease_s", "") or 30.0,
        limits=_limits(_table(data.get("limits", {}), "limits")),
        auth=parse_auth(data, source or Path("finality.toml")),
    )


def _analyst(table: dict[str, object]) -> AnalystConfig:
    _unknown(table, _ANALYST_KEYS, "analyst")
    d = AnalystConfig()

    def whole(key: str, default: int, least: int) -> int:
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"analyst.{key}", f"must be a whole number >= {least}, got {value!r}")
        return value

    timeout_s = _number(table, "timeout_s", "analyst")
    every = _number(table, "snapshot_every_min", "analyst", positive=False)
    if every is not None and every < 0:
        raise ConfigError("analyst.snapshot_every_min", f"must be 0 (off) or minutes, got {every}")
    return AnalystConfig(
        workers=whole("workers", d.workers, 1),
        queue=whole("queue", d.queue, 0),
        queries=whole("queries", d.queries, 0),
        timeout=timedelta(seconds=timeout_s) if timeout_s is not None else d.timeout,
        memory_limit_mb=whole("memory_limit_mb", d.memory_limit_mb, 16),
        threads=whole("threads", d.threads, 1),
        work_mem_mb=whole("work_mem_mb", d.work_mem_mb, 1),
        nice=_nice(whole("nice", d.nice, 0)),
        max_rows=whole("max_rows", d.max_rows, 1),
        max_result_mb=whole("max_result_mb", d.max_result_mb, 1),
        snapshot_every=timedelta(minutes=every) if every else None,
        snapshot_keep=whole("snapshot_keep", d.snapshot_keep, 1),
        snapshot_dir=_string(table, "snapshot_dir", "analyst"),
    )


def _nice(value: int) -> int:
    if value > 19:
        raise ConfigError("analyst.nice", f"must be 0 (normal priority) to 19 (lowest), got {value}")
    return value


def _limits(table: dict[str, object]) -> LimitsConfig:
    _unknown(table, _LIMIT_KEYS, "limits")
    d = LimitsConfig()
    rate = _number(table, "submissions_per_s_per_principal", "limits")
    burst = _number(table, "submission_burst", "limits")
    if burst is not None and burst < 1:
        raise ConfigError("limits.submission_burst", f"must be at least 1, got {burst:g}")
    in_flight = _integer(table, "in_flight_per_principal", "limits")
    return LimitsConfig(
        body_bytes=_integer(table, "body_bytes", "limits") or d.body_bytes,
        answer_bytes=_integer(table, "answer_bytes", "limits") or d.answer_bytes,
        in_flight_per_principal=in_flight or d.in_flight_per_principal,
        submissions_per_s_per_principal=rate or d.submissions_per_s_per_principal,
        submission_burst=burst or (max(1.0, 2 * rate) if rate else d.submission_burst),
    )


def _integer(table: dict[str, object], key: str, where: str) -> int | None:
    if key not in table:
        return None
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(_key(where, key), f"must be a positive integer, got {value!r}")
    return value


def load_config(path: str | Path) -> ServiceConfig:
    """Read and validate a TOML config file.

    Raises:
        ConfigError: the file is missing, not TOML, or a key is wrong (named).
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read config file: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from exc
    return parse_config(data, Path(path))


__all__ = [
    "AnalystConfig",
    "LimitsConfig",
    "PollConfig",
    "ServerConfig",
    "ServiceConfig",
    "ToolConfig",
    "load_config",
    "parse_config",
]
