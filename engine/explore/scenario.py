"""The explorer's scenarios: which actors take part and how many faults each run may inject.

A scenario is a value: the server's work script, what the caller does (cancel clicks, answers),
the fault budgets of the network (loss, late delivery, duplication, 429/503, truncated results),
executor crashes, epoch raises, expiry and the server quirks under test. The explorer interleaves
every enabled step of these actors. Declarative only: no behaviour lives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from engine.explore.wire import Kind
from engine.model import Protocol

P = Protocol
ALL = (P.MCP_2025_11_25, P.MCP_2026_07_28, P.AIP_151)
MCP = (P.MCP_2025_11_25, P.MCP_2026_07_28)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One race setting, run once per protocol it lists."""

    name: str
    summary: str
    protocols: tuple[Protocol, ...] = ALL
    script: tuple[str, ...] = ("complete",)
    """The server work: ``progress``, ``input`` (ask for input), then ``complete`` or ``fail``."""
    lookup_by_key: bool = True
    """The server can find a submission by its key (AIP-155 request_id, SEP-3182 idempotency key)."""
    cancels: int = 0
    """Cancel clicks the caller may make (each raises the cancel generation)."""
    drops: int = 0
    """Requests or replies the network may lose (the waiting request then times out)."""
    delays: int = 0
    """Requests that may arrive after the executor gave up on them (late delivery)."""
    dups: int = 0
    """Requests the network may deliver twice."""
    throttles: int = 0
    """Requests the server may answer with 429/503 without acting on them."""
    corrupts: int = 0
    """Result replies that may arrive truncated (failing verification)."""
    fault_kinds: frozenset[Kind] | None = None
    """Message kinds the faults above may hit (None: every kind)."""
    crashes: int = 0
    """Executor crashes; each restart loses the executor's memory and resumes from the ledger."""
    crash_in: frozenset[str] | None = None
    """Local states (``LocalState`` values) a crash may happen in (None: any state before a receipt)."""
    epoch_raises: int = 0
    """Rollbacks: an operator raises the execution epoch and a new executor takes over."""
    stale_advances: int = 0
    """Advances the executor a rollback replaced may still make (a process that has not heard of
    the rollback yet): its driver must find the operation FENCED and send nothing for it."""
    pollers: int = 1
    """Status reads one executor may have in flight at once (2: replies can overtake each other)."""
    evict: bool = False
    """The server may lose the task before it expires (404 before expiry)."""
    expire: bool = False
    """The clock may pass the task's expiry, after which the server may delete it (404 after expiry)."""
    reuse_task_id: bool = False
    """The server hands out a task id already bound to another call node's operation."""
    cancel_not_found: bool = False
    """The server answers the first cancel -32602 (task not found) though the task exists (MCP only)."""
    tool_error: bool = False
    """The tool ends with an ``isError`` result: ``failed`` on MCP 2025-11-25, a completed result
    carrying the error on 2026-07-28 and AIP-151."""
    flip: bool = False
    """Non-compliant server: after a cancel won, the finished work shows as completed on later reads."""
    echo_creation_epoch: bool = False
    """Outcomes echo the epoch the task was created under, not the epoch of the request."""
    reconciler: bool = False
    """A person binds an UNKNOWN operation to the task they find on the server."""
    side_effects: bool = False
    ttl: timedelta = timedelta(hours=1)
    request_id_dedupe: bool = False
    """AIP-151: the service is declared to deduplicate ``request_id`` (AIP-155), so a lookup by key
    can prove a lost submission absent and the driver resubmits it under the same key."""
    groups: bool = False
    """Run each executor as the service does (``service.explore_seat``): its writes are buffered and
    group-committed, an advance is handed back only after its group is durable, and a crash may
    come between the buffering and the commit."""

    def script_for(self, protocol: Protocol) -> tuple[str, ...]:
        """AIP-151 operations never ask for input; their script skips the input rounds."""
        if protocol is P.AIP_151:
            return tuple(s for s in self.script if s != "input")
        return self.script


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("happy", "submit, poll, complete, fetch, accept", dups=1),
    Scenario(
        "failure", "the tool fails; the failure is fetched and accepted as failed", script=("fail",), drops=1
    ),
    Scenario(
        "tool-error",
        "the tool reports an error in its result (isError); the receipt carries the server's status",
        tool_error=True,
    ),
    Scenario("complete-vs-cancel", "completion racing a cancel click", cancels=1, side_effects=True),
    Scenario(
        "cancel-ack-lost",
        "the cancel request or its acknowledgement is lost or late",
        cancels=1,
        drops=1,
        delays=1,
        fault_kinds=frozenset({Kind.CANCEL}),
    ),
    Scenario(
        "cancel-twice",
        "two cancel clicks: replies to the first generation arrive after the second",
        cancels=2,
        dups=1,
        fault_kinds=frozenset({Kind.CANCEL}),
    ),
    Scenario(
        "cancel-crossed",
        "two cancel clicks: the first generation's reply arrives after the second click",
        cancels=2,
    ),
    Scenario(
        "cancel-not-found",
        "the server answers the cancel -32602 (it does not know the task) though the task exists",
        protocols=MCP,
        cancels=1,
        cancel_not_found=True,
    ),
    Scenario(
        "create-lost",
        "the creating response is lost or late: SUBMISSION_UNKNOWN, then lookup by key",
        drops=1,
        delays=1,
        fault_kinds=frozenset({Kind.SUBMIT, Kind.LOOKUP}),
        cancels=1,
    ),
    Scenario(
        "create-lost-no-lookup",
        "the creating response is lost on a server without lookup by key: reconciliation",
        protocols=MCP,
        lookup_by_key=False,
        drops=1,
        delays=1,
        fault_kinds=frozenset({Kind.SUBMIT}),
        reconciler=True,
    ),
    Scenario(
        "input-replayed",
        "input_required replayed: the answer is lost, late or duplicated while polls continue",
        protocols=MCP,
        script=("input", "complete"),
        drops=1,
        dups=1,
        fault_kinds=frozenset({Kind.INPUT, Kind.GET}),
    ),
    Scenario(
        "out-of-order-polls",
        "two status reads in flight; their replies overtake each other",
        script=("input", "complete"),
        pollers=2,
        cancels=1,
    ),
    Scenario(
        "result-lost",
        "the terminal result is lost, throttled or truncated, then fetched again",
        drops=1,
        throttles=1,
        corrupts=2,
        fault_kinds=frozenset({Kind.RESULT, Kind.GET}),
    ),
    Scenario(
        "poll-throttled",
        "status reads and cancels answered 429/503 (no effect on the server) while the work progresses",
        script=("progress", "complete"),
        cancels=1,
        throttles=2,
        fault_kinds=frozenset({Kind.GET, Kind.CANCEL}),
    ),
    Scenario(
        "not-found-before-expiry",
        "the server loses the task before it expires: 404 means UNKNOWN",
        evict=True,
        cancels=1,
    ),
    Scenario(
        "not-found-after-expiry",
        "the task expires and is deleted: a held outcome may still be accepted",
        expire=True,
        pollers=2,
    ),
    Scenario(
        "stale-epoch",
        "rollback raises the epoch; replies to the old executor arrive afterwards",
        epoch_raises=1,
        dups=1,
        fault_kinds=frozenset({Kind.GET, Kind.RESULT}),
    ),
    Scenario(
        "rollback-restart",
        "a rollback, and an executor restart before or after it: the restarted executor runs at the "
        "epoch the ledger recorded and adopts what was left behind",
        epoch_raises=1,
        crashes=1,
    ),
    Scenario(
        "stale-epoch-input",
        "rollback in the middle of an input round: the old executor's replies and answers arrive late",
        protocols=MCP,
        script=("input", "complete"),
        epoch_raises=1,
    ),
    Scenario(
        "fenced-advance",
        "rollback, then the replaced executor advances the operation again: it is fenced and sends "
        "nothing, while its earlier requests may still be answered",
        epoch_raises=1,
        stale_advances=2,
    ),
    Scenario(
        "task-id-reused",
        "the server hands out a task id already bound to another call node",
        reuse_task_id=True,
    ),
    Scenario(
        "crash-restart",
        "the executor crashes and restarts at any point, with a cancel click in play",
        crashes=1,
        cancels=1,
    ),
    Scenario(
        "crash-while-submitting",
        "the executor crashes with the create in flight, on a server without lookup by key: the "
        "restarted executor must not send the create again",
        protocols=MCP,
        lookup_by_key=False,
        crashes=1,
        crash_in=frozenset({"SUBMITTING"}),
        reconciler=True,
    ),
    Scenario(
        "crash-restart-input",
        "the executor crashes and restarts at any point of an input round",
        protocols=MCP,
        script=("input", "complete"),
        crashes=1,
    ),
    Scenario(
        "late-completion",
        "the cancel wins, then the finished work shows up as completed on a later read",
        protocols=(P.MCP_2026_07_28, P.AIP_151),
        cancels=1,
        flip=True,
        pollers=2,
        side_effects=True,
    ),
    Scenario(
        "rollback-creation-echo",
        "rollback on a server that echoes the creating epoch in results (as the refserver does): the "
        "new executor's fetch is fenced; the operation parks in UNKNOWN for a person, once (it cycled "
        "UNKNOWN -> FETCHING_RESULT before the driver stopped probing a terminal UNKNOWN)",
        epoch_raises=1,
        echo_creation_epoch=True,
    ),
    Scenario(
        "crash-after-proved-absent",
        "the lookup by key proves a lost create absent (NOT_FOUND_SAFE), and the executor restarts before "
        "it resubmits: the restarted driver finds the server's proof in the ledger's log and resubmits "
        "under the same key (it once waited for a person nobody told; found by group-create-lost)",
        protocols=(P.AIP_151,),
        request_id_dedupe=True,
        drops=1,
        fault_kinds=frozenset({Kind.SUBMIT, Kind.LOOKUP}),
        crashes=1,
        crash_in=frozenset({"NOT_FOUND_SAFE"}),
    ),
    Scenario(
        "group-crash",
        "the service executor's write groups: an advance's writes are buffered and group-committed, "
        "the executor crashes between the buffering and the commit (or while it lands), with a cancel "
        "click in play",
        crashes=1,
        cancels=1,
        groups=True,
    ),
    Scenario(
        "group-create-lost",
        "the service executor's write groups after a lost create (AIP-151 declared to deduplicate "
        "request_id): the lookup proves it absent and the "
        "resubmission is recorded in a group that must be durable before the create goes out again; "
        "a crash may come between the buffering and the commit",
        protocols=(P.AIP_151,),
        request_id_dedupe=True,
        drops=1,
        fault_kinds=frozenset({Kind.SUBMIT, Kind.LOOKUP}),
        crashes=1,
        crash_in=frozenset(
            {
                "SUBMITTING",
                "SUBMISSION_UNKNOWN",
                "NOT_FOUND_SAFE",
                "WORKING",
                "TERMINAL_OBSERVED",
                "FETCHING_RESULT",
            }
        ),
        groups=True,
    ),
    Scenario(
        "group-rollback",
        "the service executor's rollback (its own epoch raise and adoption, ``_raise_epoch``) at any "
        "point between group commits: an advance still awaiting a reply keeps its old driver, whose "
        "replies and writes arrive after the raise and must be fenced; a cancel click in play",
        cancels=1,
        epoch_raises=1,
        groups=True,
    ),
    Scenario(
        "group-rollback-restart",
        "the service executor's rollback and a crash: the process dies at any point, or after the "
        "raised epoch is recorded and before it adopts; the restarted executor starts at the "
        "recorded epoch and adopts what was left behind (``Loop._resume``) while replies of the old "
        "epoch are still in flight",
        epoch_raises=1,
        crashes=1,
        groups=True,
    ),
)


FINDINGS: tuple[Scenario, ...] = ()
"""Open findings: scenarios the engine does not pass yet. Never part of ``all``; run them by name."""


def scenario_named(name: str) -> Scenario:
    """The scenario called ``name`` (in the catalogue or among the open findings).

    Raises:
        KeyError: no scenario has that name.
    """
    for scenario in (*SCENARIOS, *FINDINGS):
        if scenario.name == name:
            return scenario
    raise KeyError(name)


__all__ = [
    "ALL",
    "FINDINGS",
    "MCP",
    "SCENARIOS",
    "P",
    "Scenario",
    "scenario_named",
]
