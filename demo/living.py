"""``make demo``: a small living Finality on this machine, everything under ``data/demo/``.

Starts three reference servers (MCP 2025-11-25, the MCP tasks extension 2026-07-28, AIP-151) with
realistic, time-scaled durations and a small rate of every seed fault; records a short race-explorer
run of the shipped code into a fresh ledger; starts ``finality serve`` on that ledger, which meanwhile explores
the shipped driver and adapters (``--explore``, 10,000 interleavings: some minutes) and records
that run for the terminal_divergence gate, and, through the rollout API, shadows
the report tool and then opens a 5 % canary (the service records a gate run every 10 s); runs a
workload (calls, cancels, a person answering approvals after a while, an operator reconciling
UNKNOWN and leftover-effect entries) and a downstream workflow that long-polls the ready outbox and
acknowledges each entry it advances on (the traceability gate's real acknowledgements); and starts the Streamlit console, whose URL it prints. Ctrl-C
(or SIGTERM) stops every process it started, and the demo ends by itself when the service dies.
Within 30 seconds every console chart has data. A demo harness, not part of the engine.

The simulated people (approver, operator, release manager) are announced at start and can be left
out (``--no-bots``, or ``--bots approver,release``) so that a person does the approvals and the
reconciliations in the console. What they do is counted and printed as one summary line every
``--summary-s`` seconds, not one line per action.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import heapq
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType

from engine.clock import SystemClock, monotonic_seconds
from engine.errors import ServiceRefused, ServiceUnavailable
from refserver.testing import RefServer
from service.auth import new_token, token_hash
from service.client import ServiceClient
from service.testing import ServiceProcess, free_port

CLOCK = SystemClock()

ROOT = Path(__file__).resolve().parents[1]
ACTOR_RELEASE = "demo-release-manager"
ACTOR_APPROVER = "demo-approver"
ACTOR_OPERATOR = "demo-operator"
ACTOR_USER = "demo-user"
PRINCIPALS = {
    "viewer": "demo-viewer",
    "analyst": "demo-analyst",
    "approver": ACTOR_APPROVER,
    "operator": ACTOR_OPERATOR,
    "release-manager": ACTOR_RELEASE,
    "caller": ACTOR_USER,
}
"""One token per role, each its own principal (the bots act with theirs; people sign in with any)."""
SERVICE_HOLDERS = {"console": ("demo-console", ["analyst"]), "downstream": ("demo-downstream", ["operator"])}
"""Tokens that are not a person's: the console's own (analyst: its dashboards run SQL; people's actions
go with their own) and the downstream workflow's (it reads the outbox and acknowledges entries)."""


def holder(name: str) -> tuple[str, list[str]]:
    """A token's principal and roles: a role's own principal, or a service holder's."""
    return SERVICE_HOLDERS[name] if name in SERVICE_HOLDERS else (PRINCIPALS[name], [name])


SHADOW_SUFFIX = "#shadow"
FIRST_CALLS = 9
"""The scripted first calls, sent in a quick burst so that every chart has data within seconds."""
FAULTS = (
    "create_response_lost",
    "poll_out_of_order",
    "input_replayed",
    "complete_on_cancel",
    "cancel_ack_lost",
    "result_lost",
    "result_truncated",
    "stale_epoch_result",
    "task_id_reused",
    "not_found_before_expiry",
    "expire_early",
    "poll_429",
    "poll_503",
    "connection_reset",
    "slow_response",
)
"""Every fault the seed names (plus resets and slow replies), each armed at ``--fault-rate``."""


def fault_plan(rate: float, seed: int) -> dict[str, object]:
    return {"seed": seed, "rules": [{"fault": name, "tool": "*", "rate": rate} for name in FAULTS]}


def port_or_free(port: int) -> int:
    """``port`` if nothing listens on it (0 or taken: a free one)."""
    if port:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return free_port()
            return port
    return free_port()


def endpoint(server: RefServer) -> str:
    return server.url if server.protocol == "aip-151" else server.endpoint


def demo_tokens() -> dict[str, str]:
    """A fresh token per role (and the console's and the downstream's), new on every run."""
    return {name: new_token() for name in (*PRINCIPALS, *SERVICE_HOLDERS)}


def auth_table(tokens: dict[str, str]) -> str:
    """The ``[auth]`` table admitting ``tokens`` (their hashes only)."""
    lines = ["[auth]", "open_metrics = true"]
    for role, token in tokens.items():
        principal, roles = holder(role)
        lines += [
            "",
            f"[auth.tokens.{principal}]",
            f'sha256 = "{token_hash(token)}"',
            f'principal = "{principal}"',
            f"roles = {json.dumps(roles)}",
        ]
    return "\n".join(lines) + "\n"


def write_tokens(folder: Path, tokens: dict[str, str]) -> Path:
    """The tokens, readable by this user only (the configuration holds only their hashes)."""
    path = folder / "tokens.txt"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f"{name}\t{holder(name)[0]}\t{t}\n" for name, t in tokens.items()))
    return path


def write_config(folder: Path, servers: dict[str, RefServer], tokens: dict[str, str]) -> Path:
    """The demo's service config: the report tool has a new path (the 2026-07-28 server) to roll out;
    one token per role (``tokens``, stored as hashes)."""
    config = folder / "finality.toml"
    config.write_text(
        f"""# Written by `make demo` (demo/living.py). The rollout (shadow, then a 5 % canary of
# generate_report onto the 2026-07-28 server) is set through the rollout API at start.
global_qps = 100
rollout_salt = "demo"
gate_interval_s = 10

[poll]
default_interval_ms = 1000
min_interval_ms = 50
max_interval_ms = 10000
retry_backoff_ms = 200

[servers.reports]
url = "{endpoint(servers["reports"])}"
protocol = "mcp-2025-11-25"
qps = 60

[servers.reports_next]
url = "{endpoint(servers["reports_next"])}"
protocol = "mcp-2026-07-28"
qps = 60

[servers.uploads]
url = "{endpoint(servers["uploads"])}"
protocol = "aip-151"
qps = 60
# The reference AIP-151 server deduplicates AIP-155 request_id; declared, because a service may not.
request_id_dedupe = true

[tools.generate_report]
server = "reports"
shadow_server = "reports_next"
side_effect_free = true
version = "2.3.0"
wait_budget_s = 600

[tools.analyze_upload]
server = "uploads"
side_effect_free = true
version = "1.9.0"
wait_budget_s = 600

[tools.apply_batch_change]
server = "reports_next"
version = "0.8.0"
wait_budget_s = 600
on_budget_exhausted = "stop"

"""
        + auth_table(tokens)
    )
    return config


# ------------------------------------------------------------------------------------------ the people


@dataclass
class Shared:
    """What the demo's threads share: the stop flag and what the workload submitted."""

    url: str
    servers: dict[str, RefServer]
    tokens: dict[str, str] = field(default_factory=dict)
    """Role -> token: each bot acts with its role's token (the service records its principal)."""
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    arguments: dict[str, dict[str, object]] = field(default_factory=dict)
    """Call node -> the arguments it was submitted with (an operator finds a lost task by them)."""
    tools: dict[str, str] = field(default_factory=dict)
    """Call node -> its tool (the downstream's workflow step depends on it)."""
    counts: Counter[str] = field(default_factory=Counter)
    """What the simulated people did since the start (the periodic summary line prints it)."""
    unreachable: threading.Event = field(default_factory=threading.Event)
    """Set when a call found the service not answering (the main loop then checks whether it died)."""

    def token(self, role: str) -> str | None:
        """The token a bot of ``role`` acts with; None for a service in local mode (no ``[auth]``)."""
        return self.tokens.get(role)

    def say(self, who: str, text: str) -> None:
        print(f"[{who}] {text}", flush=True)

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def summary(self, elapsed_s: float) -> str:
        with self.lock:
            c = dict(self.counts)
        return (
            f"[demo {int(elapsed_s) // 60:02d}:{int(elapsed_s) % 60:02d}] submitted {c.get('submitted', 0)}, "
            f"cancelled {c.get('cancelled', 0)}; approver answered {c.get('answered', 0)}; operator resolved "
            f"{c.get('resolved unknown', 0)} UNKNOWN and {c.get('resolved effects', 0)} leftover-effect entries; "
            f"downstream advanced on {c.get('advanced', 0)} outbox entries"
        )


def _quietly(
    shared: Shared, who: str, call: Callable[..., object], *args: object, **kwargs: object
) -> object | None:
    """``call(*args, **kwargs)``; a refusal or an unreachable service is reported, not raised."""
    try:
        return call(*args, **kwargs)
    except ServiceRefused as exc:
        if exc.status != 409:
            shared.say(who, f"refused: {exc.message}")
    except ServiceUnavailable:
        # Said once by the main loop, which also ends the demo if the service died.
        shared.unreachable.set()
    return None


def workload(shared: Shared, seed: int, rate: float) -> None:
    """Calls at ``rate`` per second: mostly reports, some uploads and batch changes; some are cancelled.

    The first calls are short and walk through the interesting cases (a lost create response, an
    approval, cancels of each kind) so that every chart has something to show within seconds.
    """
    rng = random.Random(seed)
    cancels: list[tuple[float, str]] = []
    n = 0
    with ServiceClient(shared.url, timeout=15, token=shared.token("caller")) as client:
        next_at = monotonic_seconds()
        while not shared.stop.is_set():
            now = monotonic_seconds()
            while cancels and cancels[0][0] <= now:
                _, node = heapq.heappop(cancels)
                if _quietly(
                    shared, "workload", client.cancel, node, actor=ACTOR_USER, reason="closed the report tab"
                ):
                    shared.count("cancelled")
            if now < next_at:
                shared.stop.wait(min(next_at - now, 0.2))
                continue
            n += 1
            next_at += 1 / rate if n > FIRST_CALLS else 0.15
            tool, sim, cancel_after = plan_call(n, rng)
            node = f"demo-{seed}-{n}"
            arguments: dict[str, object] = {"job": n, "customer": f"c{rng.randrange(40)}", "_sim": sim}
            with shared.lock:
                shared.arguments[node] = arguments
                shared.tools[node] = tool
            if _quietly(shared, "workload", client.submit, call_node=node, tool=tool, arguments=arguments):
                shared.count("submitted")
                if cancel_after is not None:
                    heapq.heappush(cancels, (monotonic_seconds() + cancel_after, node))


DOWNSTREAM = "demo-workflow"
"""The downstream consumer's name: it reads the ready outbox and acknowledges what it advanced on."""

WORKFLOW_STEP = {
    "generate_report": "report filed",
    "analyze_upload": "upload triaged",
    "apply_batch_change": "change rolled out",
}
"""The small workflow the downstream advances: one step per tool's completed call."""


def workflow_step(entry: dict[str, object], tool_of: dict[str, str]) -> str:
    """The step the downstream takes on an outbox entry (a cancelled or failed call closes the job)."""
    if entry["status"] == "cancelled":
        return "job closed (cancelled)"
    if entry["status"] != "completed":
        return f"job flagged ({entry['status']})"
    return WORKFLOW_STEP.get(tool_of.get(str(entry["call_node_id"]), ""), "job done")


def downstream(shared: Shared) -> None:
    """The downstream workflow: long-polls the ready outbox, takes one workflow step per entry and
    acknowledges it (so the traceability gate has real acknowledgements). Its cursor moves only
    past acknowledged entries: an entry it could not acknowledge is received again."""
    cursor: int | None = None
    # Acknowledging moves delivery on: an operator's role, under the downstream's own principal.
    with ServiceClient(shared.url, timeout=15, token=shared.token("downstream")) as client:
        while not shared.stop.is_set():
            got = _quietly(shared, "downstream", client.outbox, DOWNSTREAM, after=cursor, wait_s=5)
            if not isinstance(got, dict):
                shared.stop.wait(1.0)
                continue
            with shared.lock:
                tool_of = dict(shared.tools)
            for entry in got["entries"]:
                step = workflow_step(entry, tool_of)
                if _quietly(shared, "downstream", client.ack, entry, consumer=DOWNSTREAM) is None:
                    break  # received again from the same cursor
                shared.count("advanced")
                shared.count(step)
                cursor = int(entry["seq"])


def plan_call(n: int, rng: random.Random) -> tuple[str, dict[str, object], float | None]:
    """Tool, ``_sim`` and when to cancel (seconds after submitting, or None) for the ``n``-th call."""
    # Durations in unscaled ms, log-uniform over 20 s - 5 min (2-30 s at the default time scale).
    duration = round(20_000 * math.exp(rng.random() * math.log(15)))
    tool = rng.choice(["generate_report", "generate_report", "analyze_upload", "apply_batch_change"])
    sim: dict[str, object] = {"duration_ms": duration, "poll_interval_ms": 5_000, "ttl_ms": 3_600_000}
    cancel_after: float | None = None
    scripted: dict[int, tuple[str, int, dict[str, object], float | None]] = {
        1: ("generate_report", 10_000, {}, None),
        2: ("generate_report", 12_000, {}, None),
        3: ("apply_batch_change", 200_000, {}, 0.5),
        # A lost create response on a server without idempotency keys: UNKNOWN, for the operator.
        4: ("generate_report", 30_000, {"faults": ["create_response_lost"]}, None),
        5: ("generate_report", 20_000, {"input_rounds": 1}, None),
        6: ("analyze_upload", 10_000, {}, None),
        7: ("analyze_upload", 200_000, {}, 0.8),
        8: ("apply_batch_change", 30_000, {"input_rounds": 1}, None),
        9: ("generate_report", 200_000, {}, 1.0),
    }
    if n in scripted:
        tool, duration, extra, cancel_after = scripted[n]
        sim.update({"duration_ms": duration, **extra})
        return tool, sim, cancel_after
    if n % 8 == 0:
        sim["faults"] = ["create_response_lost"]
        tool = "generate_report"
    if (tool == "generate_report" and n % 5 == 0) or (tool == "apply_batch_change" and n % 3 == 0):
        sim["input_rounds"] = 1
    if rng.random() < 0.04:
        sim["outcome"] = rng.choice(["failed", "is_error"])
    if n % 10 == 0:
        cancel_after = rng.uniform(1.0, 4.0)
    return tool, sim, cancel_after


def approver(shared: Shared, seed: int, delay: tuple[float, float]) -> None:
    """A person who answers each approval after reading it for a few seconds.

    The first one they answer at once: the console's "answered approvals" has data within the
    demo's first 30 seconds even when start-up takes 20 of them on a busy machine.
    """
    rng = random.Random(seed)
    due: dict[tuple[str, int], float] = {}
    first = True
    with ServiceClient(shared.url, timeout=15, token=shared.token("approver")) as client:
        while not shared.stop.wait(0.5):
            pending = _quietly(shared, "approver", client.approvals)
            if not isinstance(pending, list):
                continue
            now = monotonic_seconds()
            for approval in pending:
                key = (str(approval["operation_id"]), int(str(approval["input_round"])))
                due.setdefault(key, now if first else now + rng.uniform(*delay))
                first = False
                if due[key] <= now and _quietly(
                    shared,
                    "approver",
                    client.answer,
                    *key,
                    actor=ACTOR_APPROVER,
                    answer=approving_answer(approval.get("requested_schema")),
                ):
                    shared.count("answered")


def approving_answer(schema: object) -> dict[str, object]:
    """What the simulated approver answers: yes, in the requested schema's own boolean field."""
    from console.views import answer_fields, decision_field

    decision = decision_field(answer_fields(schema))
    return {decision.name if decision is not None else "approve": True}


def operator(shared: Shared, unknown_after_s: float, effects_after_s: float) -> None:
    """A person on call: reconciles each open entry once it is a while old.

    For an UNKNOWN operation they look for the task on the server the call went to, by the call's
    arguments (the server's execution log), and bind it; if the server never ran it, they declare
    it absent. A result the engine could not verify for its epoch they do not bind again (the
    server would hand back the same result): they close it without a receipt. A leftover-effect
    entry (a cancelled batch change) they check and close.
    """
    first_seen: dict[int, float] = {}
    refused: dict[int, str] = {}
    with ServiceClient(shared.url, timeout=15, token=shared.token("operator")) as client:
        while not shared.stop.wait(0.5):
            entries = _quietly(shared, "operator", client.reconciliation)
            if not isinstance(entries, list):
                continue
            now = monotonic_seconds()
            due = [
                entry
                for entry in entries
                if now - first_seen.setdefault(int(str(entry["entry_id"])), now)
                >= (unknown_after_s if entry["kind"] == "unknown" else effects_after_s)
            ]
            # One look at the evidence a pass (the bindings, each server's executions), however many
            # entries are due: read per entry, a busy demo's operator fell behind its own queue.
            evidence = Evidence(shared, client)
            for entry in due:
                entry_id = int(str(entry["entry_id"]))
                task_id: str | None = None
                if entry["kind"] != "unknown":
                    reason = "checked the batch: the partial change was rolled back by hand"
                elif entry.get("task_id") and "not found" in str(entry["reason"]):
                    # Bound to a task the server no longer has: nothing to bind again; absent.
                    reason = f"the server no longer has task {entry['task_id']}"
                elif entry.get("task_id") and "echoed by the result" in str(entry["reason"]):
                    # The server answers this task with another epoch's result every time: binding
                    # it again fetched the same result and reopened the entry, round after round.
                    reason = f"task {entry['task_id']}'s result is not this epoch's; closed without a receipt"
                else:
                    task_id = evidence.find_task(str(entry["operation_id"]))
                    reason = (
                        f"found task {task_id} on the server by the call's arguments"
                        if task_id
                        else "the server's execution log has no unbound run of this call"
                    )
                # One resolve for every case. (The "no longer has the task" case used to set its
                # answer and send nothing, then count the previous entry's success again: the
                # demo logged hundreds of resolutions while those entries stayed open for good.)
                try:
                    done = client.resolve(
                        entry_id,
                        actor=ACTOR_OPERATOR,
                        reason=reason,
                        task_id=task_id,
                        absent=entry["kind"] == "unknown" and task_id is None,
                    )
                except ServiceRefused as exc:
                    # Said once per entry and answer, a conflict (409) too: an entry the service
                    # keeps refusing stays open, and the person says why instead of retrying unheard.
                    if refused.get(entry_id) != exc.message:
                        refused[entry_id] = exc.message
                        shared.say(
                            "operator", f"entry {entry_id} ({entry['reason']}): refused: {exc.message}"
                        )
                    continue
                except ServiceUnavailable:
                    shared.unreachable.set()
                    continue
                if done:
                    shared.count(f"resolved {entry['kind']}")
                    if task_id is not None:
                        evidence.bound[task_id] = str(entry["operation_id"])


class Evidence:
    """What the operator looks at in one pass: which tasks are bound, and what each server ran.

    Each is read once a pass, when first needed, and kept up to date with the pass's own bindings.
    """

    def __init__(self, shared: Shared, client: ServiceClient) -> None:
        self.shared = shared
        self.client = client
        self._bound: dict[str, str] | None = None
        self._executions: dict[str, dict[str, list[dict[str, object]]]] = {}

    @property
    def bound(self) -> dict[str, str]:
        """Task id (bare, without AIP-151's ``operations/``) -> the operation bound to it."""
        if self._bound is None:
            rows = _quietly(
                self.shared,
                "operator",
                self.client.sql,
                "SELECT task_id, operation_id FROM task_bindings",
                max_rows=100_000,
            )
            found = rows.get("rows", []) if isinstance(rows, dict) else []
            self._bound = {str(r[0]).removeprefix("operations/"): str(r[1]) for r in found}
        return self._bound

    def executions(self, server_url: str) -> dict[str, list[dict[str, object]]]:
        """Tool -> the runs the server at ``server_url`` recorded (none for an unknown server)."""
        if server_url not in self._executions:
            runs: dict[str, list[dict[str, object]]] = {}
            for server in self.shared.servers.values():
                if endpoint(server) == server_url:
                    runs = server.stats()["executions"]
                    break
            self._executions[server_url] = runs
        return self._executions[server_url]

    def find_task(self, operation_id: str) -> str | None:
        """The server task that ran this operation's call, found as a careful person would: a run of
        the same arguments on the server the call went to, started at or after the call was
        recorded, whose task no other operation is bound to; the earliest such.

        (Taking the first run with equal arguments, as before, bound calls that repeat arguments to
        another call's task: one already bound elsewhere, so the resolve was refused and the entry
        stayed open past 15 minutes, or one the server had already deleted, so the operation went
        straight back to UNKNOWN, for the whole run.)
        """
        quoted = "'" + operation_id.replace("'", "''") + "'"
        rows = _quietly(
            self.shared,
            "operator",
            self.client.sql,
            f"SELECT call_node_id, server, tool_name, created_at FROM op_identity WHERE operation_id = {quoted}",
        )
        if not isinstance(rows, dict) or not rows.get("rows"):
            return None
        call_node, server_url, tool, created_raw = (str(v) for v in rows["rows"][0])
        with self.shared.lock:
            arguments = self.shared.arguments.get(call_node.removesuffix(SHADOW_SUFFIX))
        if arguments is None:
            return None
        created_at = datetime.fromisoformat(created_raw) - timedelta(seconds=1)
        echo = {k: v for k, v in arguments.items() if k != "_sim"}
        bound = self.bound
        runs = [
            run
            for run in self.executions(server_url).get(tool, [])
            if run["arguments"] == echo
            and run["task_id"]
            and bound.get(str(run["task_id"]), operation_id) == operation_id
            and datetime.fromisoformat(str(run["at"])) >= created_at
        ]
        runs.sort(key=lambda run: datetime.fromisoformat(str(run["at"])))
        return str(runs[0]["task_id"]) if runs else None


def release_manager(shared: Shared, min_compared: int, override_after_s: float) -> None:
    """Shadow is on from the start; the 5 % canary opens once ``min_compared`` shadow pairs were
    compared and every gate passes. If that has not happened after ``override_after_s`` (gates
    without data yet), it opens with an override, which the audit log records with its reason.
    """
    started = monotonic_seconds()
    with ServiceClient(shared.url, timeout=30, token=shared.token("release-manager")) as client:
        while not shared.stop.wait(1.0):
            override = monotonic_seconds() - started >= override_after_s
            diffs = _quietly(shared, "release", client.shadow_diffs)
            compared = diffs.get("summary", {}).get("compared", 0) if isinstance(diffs, dict) else 0
            if compared < min_compared and not override:
                continue
            body: dict[str, object] = {
                "actor": ACTOR_RELEASE,
                "reason": f"{compared} shadow comparisons of generate_report; route 5 % of report calls "
                "to the new adapter",
                "percentage": 5,
            }
            if override:
                body["override"] = True
                body["reason"] = (
                    f"demo start: open the 5 % canary after {compared} shadow comparisons although some "
                    "gates may have no data yet (they fill in within a minute)"
                )
            try:
                client.rollout("canary", body)
            except ServiceRefused as exc:
                if exc.status == 409:
                    continue  # a gate fails: try again next second
                shared.say("release", f"canary refused: {exc.message}")
            except ServiceUnavailable:
                continue
            else:
                shared.say("release", "canary at 5 %" + (" (override, in the audit log)" if override else ""))
            return


# ------------------------------------------------------------------------------------------- running


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


BOTS = ("approver", "operator", "release")
"""The simulated people ``--bots`` chooses from."""
_ANNOUNCE = {
    "approver": f"approver ({ACTOR_APPROVER}) answers each approval 4-10 s after it opens (the first at once)",
    "operator": f"operator ({ACTOR_OPERATOR}) resolves UNKNOWN entries after 10 s, leftover effects after 3 s",
    "release": f"release manager ({ACTOR_RELEASE}) opens the 5 % canary once shadow pairs compare",
}


def chosen_bots(args: argparse.Namespace) -> tuple[str, ...]:
    if args.no_bots:
        return ()
    names = tuple(n.strip() for n in args.bots.split(",") if n.strip())
    unknown = [n for n in names if n not in BOTS]
    if unknown:
        raise SystemExit(f"--bots: unknown {unknown}; choose from {', '.join(BOTS)}")
    return names


def announce(bots: tuple[str, ...]) -> str:
    """Who acts besides the workload, and a first thing for a person to try."""
    lines = ["simulated people: " + ("; ".join(_ANNOUNCE[b] for b in bots) if bots else "none (--no-bots)")]
    if bots:
        lines.append(
            "  (leave them out with `make demo ARGS=--no-bots`, or pick some: --bots approver,release)"
        )
    if "approver" not in bots:
        lines.append("  try first: open Approvals in the console and Approve or Reject a waiting round")
    elif "operator" not in bots:
        lines.append("  try first: open UNKNOWN and reconciliation and resolve an entry")
    else:
        lines.append(
            "  try first: open Rollout control and roll back the canary (a typed reason, the epoch goes up)"
        )
    return "\n".join(lines)


def sign_in_help(tokens: dict[str, str], path: Path) -> str:
    """How to use the tokens: the console's sign-in, the CLI and notebooks (``FINALITY_TOKEN``)."""
    lines = [f"tokens (one per role; new every run; also in {path}):"]
    lines += [f"  {role:<16} {token}" for role, token in tokens.items() if role in PRINCIPALS]
    lines.append("  sign in to the console with one; the CLI and notebooks read FINALITY_TOKEN (or --token)")
    return "\n".join(lines)


def start_console(
    data: Path, service_url: str, ledger: Path, port: int, token: str
) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ, FINALITY_SERVICE_URL=service_url, FINALITY_LEDGER=str(ledger), FINALITY_TOKEN=token
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "app.py"),
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=(data / "console.log").open("wb"),
        stderr=subprocess.STDOUT,
    )


DEMO_EXPLORER_RUNS = 300


def explore_into(ledger: Path, permutations: int) -> subprocess.Popen[str]:
    # A short run of the shipped code (the merging search: some hundred runs, seconds) before the
    # service opens the ledger; its rows count for the divergence gate at this revision. The longer
    # exploration is the service's own while it runs (``finality serve --explore``).
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service",
            "explore",
            "--code",
            "shipped",
            "--permutations",
            str(permutations),
            "--ledger",
            str(ledger),
            "--json",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "data" / "demo"))
    parser.add_argument("--time-scale", type=float, default=0.1, help="reference servers' time scale")
    parser.add_argument("--rate", type=float, default=2.0, help="calls per second")
    parser.add_argument("--fault-rate", type=float, default=0.01, help="rate of each fault per created task")
    parser.add_argument("--console-port", type=int, default=8501, help="0: any free port")
    parser.add_argument("--service-port", type=int, default=8700, help="0: any free port")
    parser.add_argument("--no-console", action="store_true")
    parser.add_argument("--seconds", type=float, help="stop by itself after this long")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--no-bots", action="store_true", help="no simulated people: you answer and reconcile"
    )
    parser.add_argument(
        "--bots",
        default=",".join(BOTS),
        help=f"which simulated people act (comma-separated: {', '.join(BOTS)})",
    )
    parser.add_argument("--summary-s", type=float, default=30.0, help="seconds between summary lines")
    parser.add_argument(
        "--explore",
        type=int,
        default=10_000,
        help="interleavings of the shipped code the service explores and records for the "
        "terminal_divergence gate (0: none)",
    )
    args = parser.parse_args(argv)
    bots = chosen_bots(args)
    # Both alike, installed explicitly: a background job inherits SIGINT ignored, and then a Ctrl-C
    # to the group killed the children while this loop went on.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    data = Path(args.data)
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    ledger = data / "finality.duckdb"
    servers = {
        "reports": RefServer(
            "mcp-2025-11-25", time_scale=args.time_scale, seed=1, fault_plan=fault_plan(args.fault_rate, 1)
        ),
        "reports_next": RefServer(
            "mcp-2026-07-28",
            time_scale=args.time_scale,
            seed=2,
            idempotency=True,
            fault_plan=fault_plan(args.fault_rate, 2),
        ),
        "uploads": RefServer(
            "aip-151", time_scale=args.time_scale, seed=3, fault_plan=fault_plan(args.fault_rate, 3)
        ),
    }
    shared: Shared | None = None
    console: subprocess.Popen[bytes] | None = None
    explorer: subprocess.Popen[str] | None = None
    service: ServiceProcess | None = None
    threads: list[threading.Thread] = []
    pool = concurrent.futures.ThreadPoolExecutor(len(servers))
    started_at = monotonic_seconds()
    exit_code = 0
    try:
        # The explorer writes the fresh ledger while the servers come up; the service opens it after.
        explorer = explore_into(ledger, DEMO_EXPLORER_RUNS)
        starting = [pool.submit(server.start) for server in servers.values()]
        for future in starting:
            future.result()
        print("reference servers: " + ", ".join(f"{k} {endpoint(s)}" for k, s in servers.items()), flush=True)
        _, explore_err = explorer.communicate(timeout=300)
        summary = "recorded" if explorer.returncode in (0, 1) else f"failed: {explore_err[-300:]}"
        explorer = None
        print(
            f"race explorer (shipped code, {DEMO_EXPLORER_RUNS} runs): {summary}",
            flush=True,
        )
        tokens = demo_tokens()
        config = write_config(data, servers, tokens)
        # A busy laptop can take well over 30 s to start the service (the default wait of the tests'
        # harness): the demo waits longer rather than stopping a person's first try.
        service = ServiceProcess(
            ledger,
            config,
            # 0: the service binds a free port itself (a probed one can be taken before it binds).
            port=port_or_free(args.service_port) if args.service_port else None,
            extra_args=["--explore", str(args.explore)] if args.explore else [],
            startup_timeout=120.0,
        ).start()
        print(f"service: {service.url} (pid {service.pid}, ledger {ledger}, config {config})", flush=True)
        print(sign_in_help(tokens, write_tokens(data, tokens)), flush=True)
        if args.explore:
            print(
                f"race explorer over the shipped code: {args.explore:,} interleavings, run and recorded "
                "by the service for the terminal_divergence gate (some minutes; no data until then)",
                flush=True,
            )
        shared = Shared(service.url, servers, tokens)
        with ServiceClient(service.url, timeout=30, token=tokens["release-manager"]) as client:
            client.rollout(
                "shadow",
                {
                    "actor": ACTOR_RELEASE,
                    "reason": "shadow the report tool on the 2026-07-28 adapter before any canary",
                    "tools": ["generate_report"],
                },
            )
        print("rollout: shadow on generate_report; a 5 % canary follows once the gates pass", flush=True)
        people: list[tuple[Callable[..., None], tuple[object, ...]]] = [
            (workload, (shared, args.seed, args.rate)),
            (downstream, (shared,)),
        ]
        if "approver" in bots:
            people.append((approver, (shared, args.seed + 1, (4.0, 10.0))))
        if "operator" in bots:
            people.append((operator, (shared, 10.0, 3.0)))
        if "release" in bots:
            people.append((release_manager, (shared, 1, 8.0)))
        print(announce(bots), flush=True)
        for target, target_args in people:
            thread = threading.Thread(target=target, args=target_args, name=target.__name__, daemon=True)
            thread.start()
            threads.append(thread)
        if not args.no_console:
            port = port_or_free(args.console_port)
            console = start_console(data, service.url, ledger, port, tokens["console"])
            print(f"\n  Finality console: http://127.0.0.1:{port}\n", flush=True)
        print(f"ready in {monotonic_seconds() - started_at:.1f} s. Ctrl-C stops everything.", flush=True)
        deadline = monotonic_seconds() + args.seconds if args.seconds else None
        next_summary = monotonic_seconds() + args.summary_s
        while deadline is None or monotonic_seconds() < deadline:
            CLOCK.sleep_blocking(timedelta(seconds=0.5))
            assert service is not None
            assert shared is not None
            if not service_alive(service, shared):
                print(f"the service died (status {service.returncode()}); stopping the demo", flush=True)
                exit_code = 1
                break
            if monotonic_seconds() >= next_summary:
                next_summary += args.summary_s
                print(shared.summary(monotonic_seconds() - started_at), flush=True)
            if console is not None and console.poll() is not None:
                print(
                    f"the console exited (status {console.returncode}); see {data / 'console.log'}",
                    flush=True,
                )
                console = None
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if shared is not None:
            shared.stop.set()
        for thread in threads:
            thread.join(timeout=5)
        if explorer is not None:
            explorer.kill()
            explorer.wait(timeout=10)
        if console is not None:
            console.terminate()
            try:
                console.wait(timeout=10)
            except subprocess.TimeoutExpired:
                console.kill()
                console.wait(timeout=10)
        if service is not None:
            with (
                contextlib.suppress(ServiceUnavailable),
                ServiceClient(
                    service.url, timeout=5, token=shared.token("viewer") if shared else None
                ) as client,
            ):
                print(json.dumps(client.health()), flush=True)
            service.close()
        pool.shutdown(wait=True)
        for server in servers.values():
            server.stop()
        print("demo stopped; data kept under", data, flush=True)
    return exit_code


def service_alive(service: ServiceProcess, shared: Shared) -> bool:
    """False once the service process has exited, or stopped answering its health route (3 tries)."""
    if service.returncode() is not None:
        return False
    if not shared.unreachable.is_set():
        return True
    shared.unreachable.clear()
    for _ in range(3):
        try:
            with ServiceClient(service.url, timeout=5, token=shared.tokens.get("viewer")) as client:
                client.health()
            return True
        except (ServiceUnavailable, ServiceRefused):
            if service.returncode() is not None:
                return False
    print("the service does not answer its health route", flush=True)
    return False


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = [
    "ACTOR_APPROVER",
    "ACTOR_OPERATOR",
    "ACTOR_RELEASE",
    "FAULTS",
    "FIRST_CALLS",
    "ROOT",
    "SHADOW_SUFFIX",
    "Evidence",
    "Shared",
    "approver",
    "endpoint",
    "explore_into",
    "fault_plan",
    "main",
    "operator",
    "plan_call",
    "port_or_free",
    "release_manager",
    "start_console",
    "workload",
    "write_config",
]
