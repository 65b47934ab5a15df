"""A seeded ledger for demos, console tests, the notebook and benchmarks: N operations of realistic history.

Builds, with numpy and Arrow (no Python loop per operation), operations across protocols, tools,
roles and rollout arms, each with its chain of transitions, its protocol requests (``polls``), and,
when terminal, its receipt, outbox entry and result; cancels with their confirmation latency (a
long tail, a few past 60 s); ``input_required`` rounds (answered and pending); UNKNOWN operations
with open reconciliation entries of various ages (some past 15 minutes) and resolved ones;
leftover-effect entries; explorer runs and a history of gate runs. Like a real ledger, it ends with a
gate run evaluated on its own data (``Ledger.gate_inputs`` and ``rollout.gates.evaluate``, recorded
with its raw inputs), so a console reading it finds a current run. One million operations take well
under a few minutes. The rows are written by ``Ledger.import_rows`` (one transaction), which exists for
this module only; the service never writes this way.

Arms: a shadow operation has role ``shadow``; a primary operation is on the ``canary`` arm when its
adapter version is ``CANARY_ADAPTER_VERSION`` and on ``control`` otherwise (see ``console.insights``).

    python -m demo.seed --ops 100000 --out data/seeded.duckdb [--seed 0]
    python -m demo.seed --ops 100000 --out postgresql://user:pw@host/db   # an empty database
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine.clock import Clock, SystemClock
from engine.errors import EngineError
from engine.ledger import is_postgres, open_ledger
from engine.ledger.gate_sql import WRITE_SETTLE_S
from engine.ledger.port import ExplorerRun, LedgerPort
from engine.ledger.rows import created_row, event_detail
from engine.machine import step
from engine.model import (
    SCHEMA_VERSION,
    AcceptTerminal,
    AwaitApproval,
    CallNodeId,
    CancelConfirmed,
    CancelRefusedTerminal,
    CancelRequested,
    Digest,
    Epoch,
    Event,
    FetchStarted,
    FlagEffectReconciliation,
    GateRecord,
    IdempotencyKey,
    InlineResultReturned,
    InputAnswered,
    LocalState,
    LookupUnavailable,
    OpenReconciliation,
    Operation,
    OperationId,
    Principal,
    Protocol,
    Receipt,
    Reconciled,
    ResultVerified,
    ServerStatus,
    StatusObserved,
    SubmissionLost,
    Submitted,
    TaskId,
    ToolRef,
)
from engine.runtime.plan import Step as PlanStep
from engine.runtime.plan import next_step

CANARY_ADAPTER_VERSION = "finality-0.2"
"""The adapter version of operations routed through the new adapter (the canary arm)."""
CONTROL_ADAPTER_VERSION = "finality-0.1"

PROTOCOLS = ("mcp-2025-11-25", "mcp-2026-07-28", "aip-151", "legacy-sync")
_PROTOCOL_WEIGHTS = (0.45, 0.25, 0.25, 0.05)
_SERVERS = {
    "mcp-2025-11-25": "http://reports.seed.invalid/mcp",
    "mcp-2026-07-28": "http://batch.seed.invalid/mcp",
    "aip-151": "http://uploads.seed.invalid",
    "legacy-sync": "http://legacy.seed.invalid/rpc",
}
# tool -> side effects
TOOLS = {
    "generate_report": False,
    "analyze_upload": False,
    "apply_batch_change": True,
    "export_archive": True,
}
_TOOL_WEIGHTS = (0.4, 0.3, 0.2, 0.1)
_PRINCIPALS = ("svc-reports", "svc-uploads", "alice", "bob", "svc-batch")
_TS = pa.timestamp("us", tz="UTC")
_S = np.float64


# ------------------------------------------------------------------ histories, replayed through the machine
# A seeded history is a script of what the world did to an operation: the server's replies (each
# answering the action ``engine.runtime.plan.next_step`` names as due) and people's actions. The
# seeding holds no state, no transition and no reason of its own: each script is replayed once
# through ``engine.machine.step`` on a prototype operation, and every operation of that history
# gets the replay's rows with its own identifiers and instants. A script that asks for a reply the
# decision path would not wait for, or an event the machine refuses, is an error, not a row.

_TASK = "@@task@@"
_KEY = "@@key@@"
_DIGEST = "@@digest@@"
_ELICIT = "@@elicit@@"
_EXPIRES = datetime(2000, 1, 1, tzinfo=UTC)
"""Placeholders in the prototype operation; each seeded operation's own values replace them."""
_EXPIRES_TEXT = orjson.dumps(_EXPIRES).decode().strip('"')
_PROTO_AT = datetime(2000, 1, 1, tzinfo=UTC)
_PROTO_EPOCH = Epoch(1)


@dataclass(frozen=True, slots=True)
class Happening:
    """One thing the world did to an operation, at the instant named by ``at``.

    ``answers`` is the action the reply answers (the decision path must name it as due), or
    ``None`` for a person's action, which may come at any time the machine accepts it.
    """

    at: str
    """Name of the per-operation time column (seconds after creation)."""
    answers: PlanStep | None
    event: Callable[[Operation], Event]


def _reply(at: str, answers: PlanStep, event: Callable[[Operation], Event]) -> Happening:
    return Happening(at, answers, event)


def _person(at: str, event: Callable[[Operation], Event]) -> Happening:
    return Happening(at, None, event)


_SUBMITTED = _reply(
    "t_sub", PlanStep.SUBMIT, lambda op: Submitted(TaskId(_TASK), op.epoch, expires_at=_EXPIRES)
)
_LOST = _reply(
    "t_sub", PlanStep.SUBMIT, lambda op: SubmissionLost(op.epoch, "no usable reply to the submission")
)
_NO_LOOKUP = _reply(
    "t_lost",
    PlanStep.LOOK_UP,
    lambda op: LookupUnavailable(op.epoch, "lookup by key unavailable; a person must find it"),
)
_FOUND = _person(
    "t_resolve", lambda op: Reconciled("oncall-1", "found on the server by submission key", TaskId(_TASK))
)


def _status(at: str, status: ServerStatus) -> Happening:
    key = _ELICIT if status is ServerStatus.INPUT_REQUIRED else None
    return _reply(
        at, PlanStep.POLL, lambda op: StatusObserved(TaskId(_TASK), status, op.epoch, input_request_key=key)
    )


_FETCH = _reply("t_fetch", PlanStep.FETCH_START, lambda op: FetchStarted(op.epoch))


def _verified(status: ServerStatus) -> Happening:
    return _reply(
        "t_accept",
        PlanStep.FETCH,
        lambda op: ResultVerified(op.task_id, status, Digest(_DIGEST), op.epoch),
    )


_CANCEL = _person(
    "t_cancel",
    lambda op: CancelRequested(op.cancel_generation + 1, "oncall", "user asked to stop"),
)
_DONE = (_status("t_term", ServerStatus.COMPLETED), _FETCH, _verified(ServerStatus.COMPLETED))

SCRIPTS: dict[str, tuple[Happening, ...]] = {
    "completed": (_SUBMITTED, *_DONE),
    "failed": (
        _SUBMITTED,
        _status("t_term", ServerStatus.FAILED),
        _FETCH,
        _verified(ServerStatus.FAILED),
    ),
    "cancelled": (
        _SUBMITTED,
        _CANCEL,
        _reply(
            "t_accept",
            PlanStep.SEND_CANCEL,
            lambda op: CancelConfirmed(TaskId(_TASK), op.cancel_generation, op.epoch),
        ),
    ),
    "cancel_lost": (
        _SUBMITTED,
        _CANCEL,
        _reply(
            "t_cancel_reply",
            PlanStep.SEND_CANCEL,
            lambda op: CancelRefusedTerminal(TaskId(_TASK), op.cancel_generation, op.epoch),
        ),
        *_DONE,
    ),
    "input": (
        _SUBMITTED,
        _status("t_input", ServerStatus.INPUT_REQUIRED),
        _person("t_answer", lambda op: InputAnswered(op.input_round, "approver-1")),
        *_DONE,
    ),
    "unknown_resolved": (_LOST, _NO_LOOKUP, _FOUND, *_DONE),
    "inline": (
        _reply("t_term", PlanStep.SUBMIT, lambda op: InlineResultReturned(ServerStatus.COMPLETED, op.epoch)),
        _FETCH,
        _verified(ServerStatus.COMPLETED),
    ),
    # live (not terminal): cut short where they stand now
    "working": (_SUBMITTED,),
    "submitting": (),
    "terminal_observed": (_SUBMITTED, _DONE[0]),
    "fetching": (_SUBMITTED, *_DONE[:2]),
    "cancel_requested": (_SUBMITTED, _CANCEL),
    "input_pending": (_SUBMITTED, _status("t_input", ServerStatus.INPUT_REQUIRED)),
    "submission_unknown": (_LOST,),
    "unknown_open": (_LOST, _NO_LOOKUP),
}
"""The seeded histories by name: what the world did, never what the operation became."""


_PLACEHOLDER = re.compile(
    "(" + "|".join(re.escape(p) for p in (_TASK, _KEY, _DIGEST, _ELICIT, _EXPIRES_TEXT)) + ")"
)


def _fill(template: str, members: pa.Array, fills: dict[str, pa.Array]) -> pa.Array:
    """``template`` with each placeholder replaced by the operation's own value, per member."""
    pieces = _PLACEHOLDER.split(template)
    if len(pieces) == 1:
        return pa.array(np.full(len(members), template))
    args = [pc.take(fills[p], members) if i % 2 else pa.scalar(p) for i, p in enumerate(pieces) if p]
    return pc.binary_join_element_wise(*args, "")


class SeedScriptError(EngineError):
    """A seeded history the decision path or the machine does not allow."""


@dataclass(frozen=True, slots=True)
class Row:
    """One ``transitions`` row of a replayed history, with the placeholders still in its detail."""

    from_state: str | None
    to_state: str
    event: str
    detail: str
    cause: str
    row_version: int
    at: str


@dataclass(frozen=True, slots=True)
class Replay:
    """A history replayed through ``machine.step``: its rows and the operation it leaves."""

    rows: tuple[Row, ...]
    final: Operation
    updated_at: str
    """The time column of the last write that changed the operation."""
    cancel_at: str | None
    receipt: Receipt | None
    receipt_at: str | None
    reconciliations: tuple[tuple[str, str, str], ...]
    """``(kind, reason, at)`` of each reconciliation entry the replay's effects open."""
    resolution: tuple[str, str, str] | None
    """``(actor, resolution, at)`` of a person's reconciliation, when the history has one."""
    approval: tuple[str, str | None, str | None] | None
    """``(opened at, answered at, actor)`` of the input round the replay's effects open."""


def _prototype(side_effects: bool) -> Operation:
    return Operation(
        operation_id=OperationId("op-seeded"),
        call_node_id=CallNodeId("node-seeded"),
        request_digest=Digest(_DIGEST),
        tool=ToolRef("seeded", "1.4.0", "1", side_effects),
        principal=Principal("seeded"),
        protocol=Protocol.MCP_2025_11_25,
        adapter_version=CONTROL_ADAPTER_VERSION,
        server="http://seeded.invalid",
        idempotency_key=IdempotencyKey(_KEY),
        state=LocalState.SUBMITTING,
        epoch=_PROTO_EPOCH,
        created_at=_PROTO_AT,
        updated_at=_PROTO_AT,
    )


def replay(name: str, *, side_effects: bool) -> Replay:
    """Replay the history ``name`` through the decision path and ``machine.step``."""
    op = _prototype(side_effects)
    created = created_row(op)
    rows = [
        Row(None, op.state.value, str(created[4]), str(created[5]), str(created[6]), op.row_version, "t0")
    ]
    fresh_submit, cancel_sent = True, 0
    updated_at, cancel_at, receipt, receipt_at = "t0", None, None, None
    opened: list[tuple[str, str, str]] = []
    resolution: tuple[str, str, str] | None = None
    approval: tuple[str, str | None, str | None] | None = None
    for h in SCRIPTS[name]:
        if h.answers is not None:
            due = next_step(op, epoch=op.epoch, fresh_submit=fresh_submit, cancel_sent=cancel_sent)
            if due is not h.answers:
                raise SeedScriptError(f"{name}: {op.state} calls for {due}, not {h.answers}")
        t = step(op, h.event(op), _PROTO_AT)
        if not t.accepted:
            raise SeedScriptError(f"{name}: {type(t.event).__name__} refused in {op.state}: {t.reason}")
        if h.answers is PlanStep.SUBMIT:
            fresh_submit = False
        elif h.answers is PlanStep.SEND_CANCEL:
            cancel_sent = op.cancel_generation
        rows.append(
            Row(
                t.before.state.value,
                t.after.state.value,
                type(t.event).__name__,
                event_detail(t),
                t.reason,
                t.after.row_version,
                h.at,
            )
        )
        if t.after.row_version != t.before.row_version:
            updated_at = h.at
        if t.after.cancel_requested_at != t.before.cancel_requested_at:
            cancel_at = h.at
        for effect in t.effects:
            match effect:
                case AcceptTerminal(receipt=r):
                    receipt, receipt_at = r, h.at
                case OpenReconciliation(reason=reason):
                    opened.append(("unknown", reason, h.at))
                case FlagEffectReconciliation(reason=reason):
                    opened.append(("effects", reason, h.at))
                case AwaitApproval():
                    approval = (h.at, None, None)
                case _:
                    pass
        match t.event:
            case Reconciled(actor=actor):
                resolution = (actor, t.reason, h.at)
            case InputAnswered(actor=actor) if approval is not None:
                approval = (approval[0], h.at, actor)
            case _:
                pass
        op = t.after
    return Replay(
        tuple(rows), op, updated_at, cancel_at, receipt, receipt_at, tuple(opened), resolution, approval
    )


_HISTORIC = {
    "completed": 0.872,
    "failed": 0.04,
    "cancelled": 0.055,
    "cancel_lost": 0.005,
    "input": 0.015,
    "unknown_resolved": 0.003,
    "inline": 0.01,
}
UNKNOWN_AGES_MIN = (1.5, 4.0, 7.5, 11.0, 14.0, 22.0, 47.0, 190.0)
"""Ages (minutes) of the open UNKNOWN entries a small ledger gets; larger ledgers repeat the pattern."""


@dataclass(frozen=True, slots=True)
class SeedSummary:
    path: str
    operations: int
    rows: dict[str, int]
    now: datetime
    seconds: float


def _live_counts(n: int) -> dict[str, int]:
    return {
        "unknown_open": max(len(UNKNOWN_AGES_MIN), n // 2000),
        "input_pending": max(4, n // 3000),
        "working": max(12, n // 150),
        "submitting": max(2, n // 5000),
        "terminal_observed": max(2, n // 5000),
        "fetching": max(2, n // 5000),
        "cancel_requested": max(3, n // 4000),
        "submission_unknown": max(2, n // 10000),
    }


def _hex_ids(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    raw = rng.integers(0, 256, size=n * (width // 2), dtype=np.uint8).tobytes().hex()
    return np.frombuffer(raw.encode(), dtype=f"S{width}").astype(f"U{width}")


def _numbered(prefix: str, idx: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(pa.scalar(prefix), pc.cast(pa.array(idx), pa.string()), "")


def _ts(base_us: np.ndarray, offset_s: np.ndarray) -> pa.Array:
    return pa.array((base_us + np.round(offset_s * 1e6)).astype("int64"), type=pa.int64()).cast(_TS)


def seed_ledger(
    path: str | Path,
    *,
    operations: int,
    seed: int = 0,
    now: datetime | None = None,
    span: timedelta = timedelta(days=7),
    global_qps: float = 200.0,
    gate_run_count: int = 48,
    clock: Clock | None = None,
) -> SeedSummary:
    """Write a new ledger at ``path`` (which must not exist) holding ``operations`` operations.

    Args:
        path: the ledger file to create, or a ``postgresql://`` URL of a database that holds no
            operations yet (it is migrated first).
        operations: how many operations (at least 100).
        seed: the random seed; the same seed and ``now`` give the same ledger.
        now: the instant the history ends at (live operations are a few minutes old then); by
            default ``WRITE_SETTLE_S`` before seeding starts, so the closing gate run, evaluated
            when seeding ends, is later than every write by at least that margin.
        span: how far back the history goes.
        global_qps: the configured QPS recorded in ``settings`` (the poll-amplification gate's cap).
        gate_run_count: how many gate evaluations the history holds.
        clock: what the closing gate run is stamped from (default the system clock); with a fixed
            ``now`` and a fixed clock, two ledgers seeded alike (a DuckDB file and a PostgreSQL
            database) hold the same rows.
    """
    clock = clock or SystemClock()
    started = clock.now()
    if now is None:
        now = started - timedelta(seconds=WRITE_SETTLE_S)
    if operations < 100:
        raise ValueError("a seeded ledger needs at least 100 operations")
    target = str(path)
    if not is_postgres(target) and Path(target).exists():
        raise FileExistsError(f"{target} exists; seeding only creates new ledgers")
    rng = np.random.default_rng(seed)
    n = operations
    now_us = int(now.timestamp() * 1e6)

    live = _live_counts(n)
    n_hist = n - sum(live.values())
    names = list(_HISTORIC)
    weights = np.array([_HISTORIC[k] for k in names], dtype=_S)
    hist_cat = rng.choice(len(names), size=n_hist, p=weights / weights.sum())
    cat_names = names + list(live)
    cat = np.concatenate([hist_cat, np.repeat(np.arange(len(names), len(cat_names)), list(live.values()))])

    # ---------------------------------------------------------------- per-operation attributes
    protocol = rng.choice(len(PROTOCOLS), size=n, p=_PROTOCOL_WEIGHTS)
    tool_names = list(TOOLS)
    tool = rng.choice(len(tool_names), size=n, p=_TOOL_WEIGHTS)
    inline = cat == cat_names.index("inline")
    protocol[inline] = PROTOCOLS.index("legacy-sync")
    protocol[(protocol == PROTOCOLS.index("legacy-sync")) & ~inline] = 0
    side_effects = np.array([TOOLS[t] for t in tool_names])[tool]
    shadow = (~side_effects) & (rng.random(n) < 0.08)
    canary = (~shadow) & (rng.random(n) < 0.05)

    span_s = span.total_seconds()
    age_s = np.empty(n, dtype=_S)
    historic = np.arange(n) < n_hist
    # Older history is thinner: the rollout ramps up over the span.
    age_s[historic] = 3600 + (span_s - 3600) * (1 - np.sqrt(rng.random(n_hist)))
    live_idx = np.flatnonzero(~historic)
    age_s[live_idx] = rng.uniform(20, 900, size=live_idx.size)
    unknown_open = np.flatnonzero(cat == cat_names.index("unknown_open"))
    ages_min = np.resize(np.array(UNKNOWN_AGES_MIN), unknown_open.size)
    age_s[unknown_open] = ages_min * 60 + 30
    pending = np.flatnonzero(cat == cat_names.index("input_pending"))
    age_s[pending] = rng.uniform(120, 3 * 3600, size=pending.size)
    created_us = now_us - np.round(age_s * 1e6).astype("int64")

    # per-operation times, seconds after creation
    t: dict[str, np.ndarray] = {"t0": np.zeros(n)}
    t["t_sub"] = 0.05 + rng.lognormal(np.log(0.25), 0.6, n)
    work = np.clip(rng.lognormal(np.log(90), 0.9, n), 2, 1800)
    t["t_term"] = t["t_sub"] + work
    t["t_fetch"] = t["t_term"] + rng.uniform(0.01, 0.3, n)
    t["t_accept"] = t["t_fetch"] + rng.uniform(0.01, 0.4, n)
    t["t_cancel"] = t["t_sub"] + rng.uniform(0.1, 0.9, n) * work
    cancel_latency = np.clip(rng.lognormal(np.log(2.5), 0.9, n), 0.08, 400)
    cancelled = cat == cat_names.index("cancelled")
    t["t_accept"][cancelled] = t["t_cancel"][cancelled] + cancel_latency[cancelled]
    lost = cat == cat_names.index("cancel_lost")
    t["t_term"][lost] = t["t_cancel"][lost] + rng.uniform(0.05, 2, lost.sum())
    t["t_cancel_reply"] = t["t_cancel"] + 0.02
    t["t_input"] = t["t_sub"] + 0.3 * work
    t["t_answer"] = t["t_input"] + np.clip(rng.lognormal(np.log(150), 1.0, n), 5, 7200)
    inp = cat == cat_names.index("input")
    t["t_term"][inp] = t["t_answer"][inp] + 0.7 * work[inp]
    t["t_lost"] = t["t_sub"] + rng.uniform(5, 30, n)
    t["t_resolve"] = t["t_lost"] + rng.uniform(90, 13 * 60, n)
    unk = cat == cat_names.index("unknown_resolved")
    t["t_term"][unk] = t["t_resolve"][unk] + work[unk]
    for later in ("t_fetch", "t_accept"):
        base = t["t_term"] + (0.02 if later == "t_fetch" else 0.1)
        fix = lost | inp | unk
        t[later][fix] = base[fix] + rng.uniform(0.01, 0.3, fix.sum())
    t["t_term"][inline] = t["t_sub"][inline] + np.minimum(work[inline], 20)
    t["t_fetch"][inline] = t["t_term"][inline] + 0.01
    t["t_accept"][inline] = t["t_fetch"][inline] + 0.01
    # live operations must not be ahead of now
    for name in t:
        t[name] = np.where(historic, t[name], np.minimum(t[name], age_s - 1.0))
        t[name] = np.maximum(t[name], 0)
    t["t_lost"][unknown_open] = 30.0
    asking = np.flatnonzero(cat == cat_names.index("cancel_requested"))
    t["t_cancel"][asking] = np.maximum(
        age_s[asking] - rng.uniform(2, 25, asking.size), t["t_sub"][asking] + 0.1
    )

    idx = np.arange(n)
    op_id = _numbered("op-", idx)
    node = pc.if_else(pa.array(shadow), _numbered("shadow-node-", idx), _numbered("node-", idx))
    keys = pc.binary_join_element_wise(pa.scalar("key-"), pa.array(_hex_ids(rng, n, 32)), "")
    digests = pc.binary_join_element_wise(pa.scalar("sha256:"), pa.array(_hex_ids(rng, n, 64)), "")
    proto_arr = pa.array(np.array(PROTOCOLS)[protocol])
    server_arr = pa.array(np.array([_SERVERS[p] for p in PROTOCOLS])[protocol])
    tool_arr = pa.array(np.array(tool_names)[tool])
    created = _ts(created_us, np.zeros(n))

    # ---------------------------------------------------------------- histories, replayed
    # One replay per history and side-effect flag (the machine's outcome depends on both); every
    # operation of that pair takes the replay's rows with its own identifiers and instants.
    combos = [(c, se) for c in cat_names for se in (False, True)]
    replays = [replay(c, side_effects=se) for c, se in combos]
    combo = cat * 2 + side_effects.astype(np.int64)
    task_text = _numbered("task-", idx)
    elicit_text = _numbered("elicit-", idx)
    expires_text = pc.binary_join_element_wise(
        pc.strftime(_ts(created_us, np.full(n, 3600.0 * 6)), format="%Y-%m-%dT%H:%M:%S"),
        pa.scalar("+00:00"),
        "",
    )
    fills = {
        _TASK: task_text,
        _KEY: keys,
        _DIGEST: digests,
        _ELICIT: elicit_text,
        _EXPIRES_TEXT: expires_text,
    }

    def each(value: Callable[[Replay], object]) -> np.ndarray:
        """``value`` of each operation's replay."""
        values: np.ndarray = np.array([value(r) for r in replays], dtype=object)[combo]
        return values

    for k, r in enumerate(replays):
        # A history's instants follow its order (a live history's are clipped to before now).
        members = np.flatnonzero(combo == k)
        for before, after in itertools.pairwise(r.rows):
            if after.at != before.at:
                t[after.at][members] = np.maximum(t[after.at][members], t[before.at][members] + 0.001)

    log_parts: list[pa.Table] = []
    for k in range(len(combos)):
        members = np.flatnonzero(combo == k)
        if members.size == 0:
            continue
        m = pa.array(members)
        for row in replays[k].rows:
            at = t[row.at][members]
            log_parts.append(
                pa.table(
                    {
                        "op_index": m,
                        "from_state": pa.nulls(members.size, pa.string())
                        if row.from_state is None
                        else pa.array(np.full(members.size, row.from_state)),
                        "to_state": pa.array(np.full(members.size, row.to_state)),
                        "event": pa.array(np.full(members.size, row.event)),
                        "detail": _fill(row.detail, m, fills),
                        "cause": pa.array(np.full(members.size, row.cause)),
                        "row_version": pa.array(np.full(members.size, row.row_version), pa.int64()),
                        "recorded_at": _ts(created_us[members], at),
                        "_at_us": pa.array(created_us[members] + np.round(at * 1e6).astype("int64")),
                    }
                )
            )
    log = pa.concat_tables(log_parts).sort_by([("_at_us", "ascending"), ("op_index", "ascending")])
    li = pa.array(log.column("op_index").to_numpy())
    transitions = pa.table(
        {
            "operation_id": pc.take(op_id, li),
            "call_node_id": pc.take(node, li),
            "from_state": log.column("from_state"),
            "to_state": log.column("to_state"),
            "event": log.column("event"),
            "detail": log.column("detail"),
            "cause": log.column("cause"),
            "accepted": pa.array(np.ones(len(li), dtype=bool)),
            "epoch": pa.array(np.full(len(li), _PROTO_EPOCH, dtype=np.int64)),
            "row_version": log.column("row_version"),
            "recorded_at": log.column("recorded_at"),
        }
    )

    # ---------------------------------------------------------------- operations
    final_state = each(lambda r: r.final.state.value).astype(str)
    terminal = each(lambda r: r.receipt is not None).astype(bool)
    has_task = each(lambda r: r.final.task_id is not None).astype(bool)
    task_ids = pc.if_else(pa.array(has_task), task_text, pa.nulls(n, pa.string()))
    server_status = each(lambda r: r.final.server_status.value if r.final.server_status else None)
    status_of_op = each(lambda r: r.receipt.status.value if r.receipt else "").astype(str)
    # the machine flags every cancel of a side-effecting tool; a result read after a third of them
    effects = each(lambda r: r.final.effect_reconciliation_required).astype(bool)
    audited = effects & (rng.random(n) < 0.3)
    result_digest = pc.if_else(
        pa.array(each(lambda r: r.final.result_digest is not None).astype(bool)),
        digests,
        pa.nulls(n, pa.string()),
    )
    adapter = np.where(canary, CANARY_ADAPTER_VERSION, CONTROL_ADAPTER_VERSION)
    identity = pa.table(
        {
            "operation_id": op_id,
            "call_node_id": node,
            "role": pa.array(np.where(shadow, "shadow", "primary")),
            "request_digest": digests,
            "tool_name": tool_arr,
            "tool_version": pa.array(np.full(n, "1.4.0")),
            "descriptor_version": pa.array(np.full(n, "1")),
            "side_effects": pa.array(side_effects),
            "principal": pa.array(np.array(_PRINCIPALS)[rng.integers(0, len(_PRINCIPALS), n)]),
            "protocol": proto_arr,
            "adapter_version": pa.array(adapter),
            "server": server_arr,
            "idempotency_key": keys,
            "arguments": pc.binary_join_element_wise(
                pa.scalar('{"n":'), pc.cast(pa.array(idx), pa.string()), pa.scalar("}"), ""
            ),
            "schema_version": pa.array(np.full(n, SCHEMA_VERSION)),
            "created_at": created,
        }
    )
    cancel_col = each(lambda r: r.cancel_at)
    asked = cancel_col != None  # noqa: E711 (element-wise)
    cancel_at = np.where(asked, t["t_cancel"], 0.0)
    updated_col = each(lambda r: r.updated_at)
    updated_at = np.zeros(n)
    for col in set(updated_col.tolist()):
        where = updated_col == col
        updated_at[where] = t[col][where]
    state = pa.table(
        {
            "operation_id": op_id,
            "state": pa.array(final_state),
            "server_status": pa.array(server_status, pa.string()),
            "task_id": task_ids,
            "poll_cursor": pa.nulls(n, pa.string()),
            "input_round": pa.array(each(lambda r: r.final.input_round).astype(np.int32)),
            "answered_round": pa.array(each(lambda r: r.final.answered_round).astype(np.int32)),
            "input_request_key": pc.if_else(
                pa.array(each(lambda r: r.final.input_request_key is not None).astype(bool)),
                elicit_text,
                pa.nulls(n, pa.string()),
            ),
            "cancel_generation": pa.array(each(lambda r: r.final.cancel_generation).astype(np.int32)),
            "cancel_requested_at": pc.if_else(pa.array(asked), _ts(created_us, cancel_at), pa.nulls(n, _TS)),
            "expires_at": pc.if_else(
                pa.array(each(lambda r: r.final.expires_at is not None).astype(bool)),
                _ts(created_us, np.full(n, 3600.0 * 6)),
                pa.nulls(n, _TS),
            ),
            "result_digest": result_digest,
            "result_held": pa.array(each(lambda r: r.final.result_held).astype(bool)),
            "effect_reconciliation_required": pa.array(effects),
            "submit_attempts": pa.array(each(lambda r: r.final.submit_attempts).astype(np.int32)),
            "epoch": pa.array(np.full(n, _PROTO_EPOCH, dtype=np.int64)),
            "row_version": pa.array(each(lambda r: r.final.row_version).astype(np.int64)),
            "updated_at": _ts(created_us, updated_at),
        }
    )

    # ---------------------------------------------------------------- receipts, outbox, results
    term_idx = np.flatnonzero(terminal)
    ti = pa.array(term_idx)
    accepted_at = _ts(created_us[term_idx], t["t_accept"][term_idx])
    t_status = pa.array(status_of_op[term_idx])
    t_digest = pc.take(result_digest, ti)
    is_cancel = status_of_op[term_idx] == ServerStatus.CANCELLED.value
    receipts = pa.table(
        {
            "call_node_id": pc.take(node, ti),
            "operation_id": pc.take(op_id, ti),
            "request_digest": pc.take(digests, ti),
            "task_id": pc.take(task_ids, ti),
            "tool_version": pa.array(np.full(term_idx.size, "1.4.0")),
            "epoch": pa.array(np.full(term_idx.size, _PROTO_EPOCH, dtype=np.int64)),
            "cancel_generation": pa.array(
                each(lambda r: r.receipt.cancel_generation if r.receipt else 0)[term_idx].astype(np.int32)
            ),
            "status": t_status,
            "result_digest": t_digest,
            "cancel_evidence": pa.array(
                each(lambda r: r.receipt.cancel_evidence if r.receipt else None)[term_idx], pa.string()
            ),
            "role": pc.take(identity.column("role"), ti),
            "accepted_at": accepted_at,
        }
    )
    payload_ok = pa.scalar('{"content":[{"text":"done","type":"text"}],"isError":false}')
    payload_fail = pa.scalar('{"content":[{"text":"tool error","type":"text"}],"isError":true}')
    payloads = pc.if_else(
        pa.array(status_of_op[term_idx] == ServerStatus.FAILED.value), payload_fail, payload_ok
    )
    primary_term = ~shadow[term_idx]
    pt = pa.array(np.flatnonzero(primary_term))
    outbox = pa.table(
        {
            "call_node_id": pc.take(receipts.column("call_node_id"), pt),
            "operation_id": pc.take(receipts.column("operation_id"), pt),
            "status": pa.array(np.full(len(pt), "ready")),
            "terminal_status": pc.take(t_status, pt),
            "result_digest": pc.take(t_digest, pt),
            "payload": pc.take(
                pc.if_else(pa.array(is_cancel), pa.nulls(term_idx.size, pa.string()), payloads), pt
            ),
            "created_at": pc.take(accepted_at, pt),
        }
    )
    # The downstream workflow acknowledged each entry a few seconds after it was ready, all but
    # those of the last two minutes (still ready: the consumer's lag, not yet stale). ``entry_seq``
    # is the number the import gives each outbox row: its position, on a fresh ledger.
    ready_at = outbox.column("created_at")
    ack_delay = np.random.default_rng([seed, 21])  # its own stream: the other seeded values stay as they were
    acked_at = pc.add(ready_at, pa.array(ack_delay.integers(200_000, 3_000_000, len(pt)), pa.duration("us")))
    acked = pa.array(
        np.asarray(pc.less(acked_at, pa.scalar(now, pa.timestamp("us", tz="UTC"))))
        & (np.asarray(pc.less(ready_at, pa.scalar(now - timedelta(minutes=2), pa.timestamp("us", tz="UTC")))))
    )
    outbox_acks = pa.table(
        {
            "consumer": pa.array(np.full(len(pt), "workflow")),
            "call_node_id": outbox.column("call_node_id"),
            "entry_seq": pa.array(np.arange(1, len(pt) + 1), pa.int64()),
            "status": outbox.column("terminal_status"),
            "result_digest": outbox.column("result_digest"),
            "acked_at": acked_at,
        }
    ).filter(acked)
    res = pa.array(np.flatnonzero(~is_cancel))
    results = pa.table(
        {
            "operation_id": pc.take(receipts.column("operation_id"), res),
            "digest": pc.take(t_digest, res),
            "status": pc.take(t_status, res),
            "payload": pc.take(payloads, res),
            "stored_at": pc.take(accepted_at, res),
        }
    )
    bound = np.flatnonzero(has_task)
    task_bindings = pa.table(
        {
            "server": pc.take(server_arr, pa.array(bound)),
            "task_id": pc.take(task_ids, pa.array(bound)),
            "operation_id": pc.take(op_id, pa.array(bound)),
            "bound_at": _ts(created_us[bound], t["t_sub"][bound]),
        }
    )

    # ---------------------------------------------------------------- polls
    polls = _polls(rng, n, cat, cat_names, has_task, created_us, t, work, op_id, server_arr)

    # ---------------------------------------------------------------- approvals
    approvals = _approvals(rng, each(lambda r: r.approval), created_us, t, op_id)

    # ---------------------------------------------------------------- reconciliation
    reconciliation = _reconciliation(
        rng, replays, combo, created_us, t, op_id, keys, digests, task_ids, now_us
    )
    audit_idx = np.flatnonzero(audited)
    receipt_audit = pa.table(
        {
            "call_node_id": pc.take(node, pa.array(audit_idx)),
            "operation_id": pc.take(op_id, pa.array(audit_idx)),
            "kind": pa.array(np.full(audit_idx.size, "result_after_cancel")),
            "digest": pc.take(digests, pa.array(audit_idx)),
            "payload": pa.array(np.full(audit_idx.size, '{"content":[],"isError":false}')),
            "recorded_at": _ts(created_us[audit_idx], t["t_accept"][audit_idx] + 1.0),
        }
    )

    arms = np.where(shadow, "shadow", np.where(canary, "canary", "control"))
    bucket = rng.integers(0, 10_000, n).astype(np.int32)
    bucket[canary] = bucket[canary] % 500
    bucket[~canary & ~shadow] = 500 + bucket[~canary & ~shadow] % 9500
    assignments = {
        "operation_id": op_id,
        "call_node_id": node,
        "tool_name": tool_arr,
        "role": identity.column("role"),
        "arm": pa.array(arms),
        "stage": pa.array(np.where(shadow, "shadow", "canary")),
        "bucket": pa.array(bucket),
        "canary_bp": pa.array(np.full(n, 500, dtype=np.int32)),
        "server_name": pa.array(np.array([p.split("-")[0] for p in PROTOCOLS])[protocol]),
        "rerouted_from": pa.nulls(n, pa.string()),
        "primary_operation_id": pa.nulls(n, pa.string()),
        "rollout_seq": pa.array(np.zeros(n, dtype=np.int64)),
        "assigned_at": created,
    }

    ledger = open_ledger(target)
    try:
        if ledger.count("op_state"):
            raise FileExistsError(f"{ledger.path} holds operations; seeding only fills new ledgers")
        extra: dict[str, pa.Table] = {}
        columns = ledger.table_columns().get("rollout_assignments")
        if columns is not None:
            # The rollout's record of each operation's arm, when this ledger has that table.
            extra["rollout_assignments"] = pa.table(
                {c: assignments.get(c, pa.nulls(n, pa.string())) for c in columns}
            )
        rows = ledger.import_rows(
            {
                **extra,
                "op_identity": identity,
                "op_state": state,
                "task_bindings": task_bindings,
                "transitions": transitions,
                "receipts": receipts,
                "outbox": outbox,
                "outbox_acks": outbox_acks,
                "results": results,
                "receipt_audit": receipt_audit,
                "polls": polls,
                "approvals": approvals,
                "reconciliation": reconciliation,
            }
        )
        ledger.put_setting("global_qps", repr(global_qps), now)
        ledger.put_setting("rollout_salt", "seeded", now)
        rows["explorer_runs"] = _explorer_runs(ledger, rng, now)
        rows["gate_runs"] = _gate_runs(ledger, rng, now, gate_run_count)
        rows["gate_runs"] += _closing_gate_run(
            ledger, max(clock.now(), now + timedelta(seconds=WRITE_SETTLE_S))
        )
        where = str(ledger.path) if is_postgres(target) else target  # a URL without its password
    finally:
        ledger.close()
    return SeedSummary(where, n, rows, now, (clock.now() - started).total_seconds())


def _polls(
    rng: np.random.Generator,
    n: int,
    cat: np.ndarray,
    cat_names: Sequence[str],
    has_task: np.ndarray,
    created_us: np.ndarray,
    t: dict[str, np.ndarray],
    work: np.ndarray,
    op_id: pa.Array,
    server_arr: pa.Array,
) -> pa.Table:
    names = np.array(cat_names)[cat]
    # status polls between submission and the terminal observation (or cancel / input / now)
    end = np.where(np.isin(names, ["cancelled", "cancel_requested"]), t["t_cancel"], t["t_term"])
    end = np.where(np.isin(names, ["input", "input_pending"]), t["t_input"], end)
    interval = np.clip(work / 4, 2, 60) * rng.uniform(0.9, 1.1, n)
    count = np.where(has_task, np.floor(np.maximum(end - t["t_sub"], 0) / interval).astype(np.int64), 0)
    count = np.minimum(count, 40)
    op_rep = np.repeat(np.arange(n), count)
    starts = np.repeat(np.cumsum(count) - count, count)
    j = np.arange(op_rep.size) - starts + 1
    sent = t["t_sub"][op_rep] + j * interval[op_rep]
    parts = [(op_rep, sent, "get")]
    sub = np.flatnonzero(~np.isin(names, ["submitting"]))
    parts.append((sub, np.zeros(sub.size), "submit"))
    fetch = np.flatnonzero(
        np.isin(names, ["completed", "failed", "cancel_lost", "input", "unknown_resolved", "fetching"])
    )
    parts.append((fetch, t["t_fetch"][fetch], "result"))
    cancel = np.flatnonzero(np.isin(names, ["cancelled", "cancel_lost", "cancel_requested"]))
    parts.append((cancel, t["t_cancel"][cancel] + 0.01, "cancel"))
    lookup = np.flatnonzero(np.isin(names, ["unknown_resolved", "unknown_open", "submission_unknown"]))
    parts.append((lookup, t["t_sub"][lookup] + 2.0, "lookup"))
    answered = np.flatnonzero(names == "input")
    parts.append((answered, t["t_answer"][answered] + 0.01, "input"))
    ops = np.concatenate([p[0] for p in parts])
    offsets = np.concatenate([p[1] for p in parts])
    methods = np.concatenate([np.full(p[0].size, p[2]) for p in parts])
    submit_rows = methods == "submit"
    offsets[submit_rows] = np.maximum(t["t_sub"][ops[submit_rows]] - 0.2, 0.001)
    roll = rng.random(ops.size)
    outcome = np.where(roll < 0.975, "ok", np.where(roll < 0.99, "unavailable", "rejected"))
    outcome[methods == "lookup"] = np.where(
        names[ops[methods == "lookup"]] == "unknown_resolved", "ok", "unavailable"
    )
    latency = rng.lognormal(np.log(0.04), 0.7, ops.size)
    sent_us = created_us[ops] + np.round(offsets * 1e6).astype("int64")
    order = np.argsort(sent_us, kind="stable")
    ops, sent_us, latency, outcome, methods = (
        ops[order],
        sent_us[order],
        latency[order],
        outcome[order],
        methods[order],
    )
    received = pa.array(sent_us + np.round(latency * 1e6).astype("int64")).cast(_TS)
    no_reply = outcome == "unavailable"
    oi = pa.array(ops)
    return pa.table(
        {
            "operation_id": pc.take(op_id, oi),
            "server": pc.take(server_arr, oi),
            "method": pa.array(methods),
            "epoch": pa.array(np.ones(ops.size, dtype=np.int64)),
            "sent_at": pa.array(sent_us).cast(_TS),
            "received_at": pc.if_else(pa.array(no_reply), pa.nulls(ops.size, _TS), received),
            "outcome": pa.array(outcome),
        }
    )


def _at_us(
    created_us: np.ndarray, t: dict[str, np.ndarray], rows: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    """The instant of each row's time column ``cols[i]`` for operation ``rows[i]``, in µs."""
    at = np.zeros(rows.size)
    for col in set(cols.tolist()):
        where = cols == col
        at[where] = t[col][rows[where]]
    instants: np.ndarray = created_us[rows] + np.round(at * 1e6).astype("int64")
    return instants


def _approvals(
    rng: np.random.Generator,
    rounds: np.ndarray,
    created_us: np.ndarray,
    t: dict[str, np.ndarray],
    op_id: pa.Array,
) -> pa.Table:
    """The input rounds the replays opened: answered where a person answered them, else pending."""
    rows = np.flatnonzero(rounds != None)  # noqa: E711 (element-wise)
    opened = _at_us(created_us, t, rows, np.array([r[0] for r in rounds[rows]], dtype=object))
    answered = np.array([r[1] is not None for r in rounds[rows]], dtype=bool)
    answered_col = np.array([r[1] or r[0] for r in rounds[rows]], dtype=object)
    answered_at = _at_us(created_us, t, rows, answered_col)
    actors = pa.array([r[2] for r in rounds[rows]], pa.string())
    messages = np.array(
        [
            "Approve applying the batch change to production?",
            "Which region should the report cover?",
            "Confirm deletion of 1,204 stale rows?",
            "Upload contains PII columns: proceed with masking?",
        ]
    )
    schema = '{"properties":{"approve":{"type":"boolean"},"note":{"type":"string"}},"required":["approve"],"type":"object"}'
    return pa.table(
        {
            "operation_id": pc.take(op_id, pa.array(rows)),
            "input_round": pa.array(np.ones(rows.size, dtype=np.int32)),
            "request_key": _numbered("elicit-", rows),
            "message": pa.array(messages[rng.integers(0, messages.size, rows.size)]),
            "requested_schema": pa.array(np.full(rows.size, schema)),
            "schema_digest": pa.array(np.full(rows.size, "sha256:5e1f0c" + "0" * 58)),
            "deadline": pa.array(opened + int(4 * 3600 * 1e6)).cast(_TS),
            "status": pa.array(np.where(answered, "answered", "pending")),
            "answer": pc.if_else(
                pa.array(answered), pa.scalar('{"approve":true}'), pa.nulls(rows.size, pa.string())
            ),
            "actor": actors,
            "opened_at": pa.array(opened).cast(_TS),
            "answered_at": pc.if_else(
                pa.array(answered), pa.array(answered_at).cast(_TS), pa.nulls(rows.size, _TS)
            ),
            # Seeded rounds are answered or pending; the service closes the ones no longer answerable.
            "closed_at": pa.nulls(rows.size, _TS),
            "closed_reason": pa.nulls(rows.size, pa.string()),
        }
    )


def _reconciliation(
    rng: np.random.Generator,
    replays: Sequence[Replay],
    combo: np.ndarray,
    created_us: np.ndarray,
    t: dict[str, np.ndarray],
    op_id: pa.Array,
    keys: pa.Array,
    digests: pa.Array,
    task_ids: pa.Array,
    now_us: int,
) -> pa.Table:
    """The entries the replays' effects opened, resolved where a person resolved them.

    An UNKNOWN entry is resolved when its history holds the person's reconciliation; a leftover-
    effect entry is resolved by a person minutes to hours later, all but one in ten.
    """
    parts: list[tuple[np.ndarray, str, str, np.ndarray, np.ndarray, str | None, str | None]] = []
    for k, r in enumerate(replays):
        members = np.flatnonzero(combo == k)
        for kind_, reason_, at in r.reconciliations:
            opened_ = created_us[members] + np.round(t[at][members] * 1e6).astype("int64")
            person = r.resolution if kind_ == "unknown" else None
            if person is None:
                resolved_ = np.zeros(members.size, dtype=np.int64)
            else:
                resolved_ = created_us[members] + np.round(t[person[2]][members] * 1e6).astype("int64")
            parts.append(
                (members, kind_, reason_, opened_, resolved_, *(person[:2] if person else (None, None)))
            )
    rows = np.concatenate([p[0] for p in parts])
    kind = np.concatenate([np.full(p[0].size, p[1]) for p in parts])
    reason = np.concatenate([np.full(p[0].size, p[2]) for p in parts])
    opened = np.concatenate([p[3] for p in parts])
    resolved_at = np.concatenate([p[4] for p in parts])
    is_open = np.concatenate([np.full(p[0].size, p[1] == "unknown" and p[5] is None) for p in parts])
    actor = np.concatenate([np.full(p[0].size, p[5] or "oncall-1") for p in parts])
    resolution = np.concatenate([np.full(p[0].size, p[6] or "no leftover effects found") for p in parts])
    eff = kind == "effects"
    is_open[eff] = rng.random(int(eff.sum())) < 0.1
    later = opened + np.round(rng.uniform(300, 7200, rows.size) * 1e6).astype("int64")
    resolved = np.minimum(np.where(eff, later, resolved_at), now_us - 1_000_000)
    ri = pa.array(rows)
    return pa.table(
        {
            "operation_id": pc.take(op_id, ri),
            "kind": pa.array(kind),
            "reason": pa.array(reason),
            "idempotency_key": pc.take(keys, ri),
            "task_id": pc.take(task_ids, ri),
            "request_digest": pc.take(digests, ri),
            "window_start": pa.array(created_us[rows]).cast(_TS),
            "window_end": pa.array(opened).cast(_TS),
            "candidates": pa.array(np.full(rows.size, "[]")),
            "status": pa.array(np.where(is_open, "open", "resolved")),
            "opened_at": pa.array(opened).cast(_TS),
            "resolved_at": pc.if_else(
                pa.array(is_open), pa.nulls(rows.size, _TS), pa.array(resolved).cast(_TS)
            ),
            "actor": pc.if_else(
                pa.array(is_open), pa.nulls(rows.size, pa.string()), pa.array(actor.astype(str))
            ),
            "resolution": pc.if_else(
                pa.array(is_open), pa.nulls(rows.size, pa.string()), pa.array(resolution.astype(str))
            ),
        }
    )


_SCENARIOS = (
    "lost-creation-response",
    "out-of-order-pollers",
    "input-replayed",
    "complete-cancel-together",
    "cancel-ack-lost",
    "result-lost-after-completed",
    "stale-epoch-callback",
    "task-id-reused",
    "not-found-before-expiry",
    "not-found-after-expiry",
    "poll-429-503",
)


def _explorer_runs(ledger: LedgerPort, rng: np.random.Generator, now: datetime) -> int:
    count = 0
    finished = now - timedelta(hours=3)
    for scenario in _SCENARIOS:
        for protocol in PROTOCOLS[:3]:
            distinct = int(rng.integers(300, 1400))
            ledger.record_explorer_run(
                ExplorerRun(
                    scenario=scenario,
                    protocol=protocol,
                    seed=int(rng.integers(0, 2**31)),
                    explored=distinct,
                    distinct_interleavings=distinct,
                    divergent=0,
                    exhaustive=True,
                    rules="engine",
                    shortest_trace=None,
                    started_at=finished - timedelta(seconds=float(rng.uniform(5, 60))),
                    finished_at=finished,
                    code="seeded",
                    revision=None,
                )
            )
            count += 1
    # a deliberately broken rule set, which the explorer must catch (not an input of the gate)
    ledger.record_explorer_run(
        ExplorerRun(
            scenario="complete-cancel-together",
            protocol="mcp-2025-11-25",
            seed=7,
            explored=412,
            distinct_interleavings=412,
            divergent=37,
            exhaustive=True,
            rules="accept-late-completion",
            shortest_trace="cancel sent; completed observed; cancel ack; late completion accepted",
            started_at=finished - timedelta(minutes=2),
            finished_at=finished - timedelta(minutes=1),
            code="seeded",
            revision=None,
        )
    )
    return count + 1


def _gate_runs(ledger: LedgerPort, rng: np.random.Generator, now: datetime, runs: int) -> int:
    """An hourly history of gate evaluations; the UNKNOWN gate fails now and then, as it does today."""
    thresholds = {
        "terminal_divergence": 0.0,
        "duplicate_operations": 0.0,
        "poll_amplification": 200.0,
        "cancel_confirmation": 60.0,
        "unknown_reconciliation": 900.0,
        "traceability": 1.0,
    }
    for k in range(runs):
        at = now - timedelta(hours=runs - k)
        values = {
            "terminal_divergence": 0.0,
            "duplicate_operations": 0.0,
            "poll_amplification": float(rng.integers(20, 60)),
            "cancel_confirmation": float(rng.uniform(12, 30)),
            "unknown_reconciliation": float(
                rng.choice([180, 420, 780, 1320, 2820], p=[0.3, 0.3, 0.2, 0.1, 0.1])
            ),
            "traceability": 1.0,
        }
        records = []
        for gate, value in values.items():
            cap = thresholds[gate]
            if gate == "traceability":
                ok = value >= cap
            elif gate == "unknown_reconciliation":
                ok = value <= cap
            elif gate == "cancel_confirmation":
                ok = value < cap
            else:
                ok = value <= cap
            records.append(
                GateRecord(gate, ok, value, cap, "seeded history", {"value": value, "threshold": cap})
            )
        ledger.record_gate_run(records, at)
    return runs * 6


def _closing_gate_run(ledger: LedgerPort, at: datetime) -> int:
    """The last act: the six gates evaluated at ``at`` on the seeded data, recorded with their raw inputs."""
    # Imported here: rollout sits above the engine, which only records its verdicts.
    from rollout.gates import evaluate

    results = evaluate(ledger.gate_inputs(at)).results
    ledger.record_gate_run(results, at)
    return len(results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.seed", description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    summary = seed_ledger(args.out, operations=args.ops, seed=args.seed)
    print(
        json.dumps(
            {
                "path": summary.path,
                "operations": summary.operations,
                "rows": summary.rows,
                "seconds": round(summary.seconds, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "CANARY_ADAPTER_VERSION",
    "CONTROL_ADAPTER_VERSION",
    "PROTOCOLS",
    "SCRIPTS",
    "TOOLS",
    "UNKNOWN_AGES_MIN",
    "Happening",
    "Replay",
    "Row",
    "SeedScriptError",
    "SeedSummary",
    "main",
    "replay",
    "seed_ledger",
]
