"""``make mutants``: prove the safety net can fail. Apply realistic one-line bugs, one at a time, to a
throwaway copy of the tree and report whether the explorer and the test suite catch each.

For every mutant: copy the tracked files to a temporary directory (never the working tree), replace
one line, then

* explorer half: ``finality explore --code shipped`` (the real driver and adapters against the
  reference servers) over the whole scenario catalogue, ``--per-pair`` interleavings per scenario
  and protocol, stopping at the first divergent run (the mutant's ``hint`` scenario goes first,
  with ``--hint-budget`` interleavings per protocol, only to get there sooner);
* test half (``--tests``): the mutant's targeted test files with ``pytest -x``.

Writes ``bench/results/mutants.md`` (one row per mutant: area, the bug, whether it breaks a seed
rule on its own, caught by the explorer and by which scenario, caught by the tests and by which
test) and prints how long each half took. Exit 1 when a mutant that breaks a seed rule survives
the explorer. Usage::

    python bench/mutants.py [--per-pair 2] [--hint-budget 30] [--tests] [--only ID ...] [--out bench/results/mutants.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.clock import monotonic_seconds

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    id: str
    area: str
    path: str
    old: str
    new: str
    bug: str
    seed_rule: bool
    """The bug on its own breaks a rule of the seed (else it removes a second line of defence)."""
    hint: str
    tests: tuple[str, ...]
    duckdb: bool = False
    """The bug is in the DuckDB ledger's SQL: every run of its own scenario writes through the real DuckDB ledger."""
    why_not: str = ""
    """For a mutant that breaks no seed rule on its own: what it breaks instead (the tests catch it)."""


RACE = ("tests/integration/test_race_cancel.py", "tests/integration/test_race_submission.py")
RESULT = ("tests/integration/test_race_result.py", "tests/integration/test_race_happy_paths.py")
# The race tests each start reference servers over real HTTP; a mutant of the driver or an adapter
# runs the race test of its own rule (the whole race files cost minutes a mutant under load).
CANCEL_RACE = f"{RACE[0]}::test_completion_and_cancel_arriving_together_accept_the_completion_once"
SUB_KEY = f"{RACE[1]}::test_a_lost_creating_response_is_found_by_its_key_and_makes_one_operation"
NOT_FOUND = (
    "tests/integration/test_race_polling.py::"
    "test_a_404_before_expiry_goes_to_unknown_and_resumes_when_the_server_answers"
)

MUTANTS: tuple[Mutant, ...] = (
    # ---------------------------------------------------------------------------- the driver
    Mutant(
        "driver-blind-resubmit",
        "driver",
        "engine/runtime/driver.py",
        "                case Step.LOOK_UP:\n                    return await self._look_up(op)",
        "                case Step.LOOK_UP:\n                    mem.fresh_submit = True\n"
        "                    return await self._submit(op, mem)",
        "after a lost create response, send the create again instead of looking it up by key",
        True,
        "create-lost-no-lookup",
        (SUB_KEY,),
    ),
    Mutant(
        "driver-ack-as-confirmed",
        "driver",
        "engine/runtime/cancelling.py",
        "                op = self.commit(op, CancelAcknowledged(task, generation, self.epoch))",
        "                op = self.commit(op, CancelConfirmed(task, generation, self.epoch))",
        "a cancel acknowledgement recorded as a confirmed cancel",
        True,
        "complete-vs-cancel",
        (CANCEL_RACE,),
    ),
    Mutant(
        "driver-payload-dropped",
        "driver",
        "engine/runtime/polling.py",
        "        op = self.commit(op, event, payload=outcome.payload)",
        "        op = self.commit(op, event, payload=None)",
        "the verified result is accepted without its payload",
        True,
        "happy",
        (
            "tests/integration/test_race_result.py::test_a_lost_or_truncated_result_is_read_again_before_completed_is_accepted",
        ),
    ),
    Mutant(
        "driver-unknown-on-404-skipped",
        "driver",
        "engine/runtime/polling.py",
        "            mem.failures = 0\n            return Wake(self.commit(op, NotFound(self.epoch)), self.clock.now())",
        "            mem.failures = 0\n            return Wake(op, None)",
        "a 404 on a status read parks the operation without a reconciliation item",
        True,
        "not-found-before-expiry",
        (NOT_FOUND,),
    ),
    Mutant(
        "driver-restart-resends",
        "driver",
        "engine/runtime/submission.py",
        "        if not mem.fresh_submit:\n            # Found in SUBMITTING without having sent it",
        "        if False:\n            # Found in SUBMITTING without having sent it",
        "an executor restarted in SUBMITTING sends the create again instead of looking it up",
        True,
        "crash-while-submitting",
        (
            "tests/integration/test_race_submission.py::"
            "test_an_executor_restarted_with_its_operation_in_submitting_never_sends_the_create_again",
        ),
    ),
    # ------------------------------------------------------------------ MCP 2025-11-25 adapter
    Mutant(
        "mcp25-32602-as-cancelled",
        "adapter 2025-11-25",
        "engine/adapters/mcp_2025_11_25.py",
        "            if reply.error.code == INVALID_PARAMS:\n                return CancelResult.ALREADY_TERMINAL",
        "            if reply.error.code == INVALID_PARAMS:\n                return CancelResult.CONFIRMED",
        "a -32602 answer to tasks/cancel (the task already ended) taken as cancelled",
        True,
        "complete-vs-cancel",
        (CANCEL_RACE,),
    ),
    Mutant(
        "mcp25-iserror-as-completed",
        "adapter 2025-11-25",
        "engine/adapters/mcp_2025_11_25.py",
        '            status = ServerStatus.FAILED if result.get("isError") is True else ServerStatus.COMPLETED',
        "            status = ServerStatus.COMPLETED",
        "a tool result with isError read as completed",
        True,
        "tool-error",
        (
            "tests/integration/test_race_happy_paths.py::"
            "test_an_is_error_result_is_accepted_with_the_status_its_protocol_gives_it",
        ),
    ),
    Mutant(
        "mcp25-cancel-requested-as-cancelled",
        "adapter 2025-11-25",
        "engine/adapters/mcp_2025_11_25.py",
        "        cancelled = op.server_status is ServerStatus.CANCELLED",
        "        cancelled = op.cancel_generation > 0",
        "any requested cancel makes the fetched result a cancelled one",
        True,
        "complete-vs-cancel",
        (CANCEL_RACE,),
    ),
    # ------------------------------------------------------------------ MCP 2026-07-28 adapter
    Mutant(
        "mcp26-ack-as-terminal",
        "adapter 2026-07-28",
        "engine/adapters/mcp_2026_07_28.py",
        '        require_result(reply, "tasks/cancel")\n        return CancelResult.ACKNOWLEDGED',
        '        require_result(reply, "tasks/cancel")\n        return CancelResult.CONFIRMED',
        "the cancel acknowledgement taken as the cancelled terminal state",
        True,
        "complete-vs-cancel",
        (CANCEL_RACE,),
    ),
    Mutant(
        "mcp26-32602-on-cancel-as-cancelled",
        "adapter 2026-07-28",
        "engine/adapters/mcp_2026_07_28.py",
        "            if reply.error.code == INVALID_PARAMS:\n                raise NotFoundOnServer(\n"
        '                    f"tasks/cancel: the server does not know task',
        "            if reply.error.code == INVALID_PARAMS:\n                return CancelResult.CONFIRMED\n"
        '                raise NotFoundOnServer(\n                    f"tasks/cancel: the server does not know task',
        "a -32602 on tasks/cancel taken as cancelled",
        True,
        "cancel-not-found",
        ("tests/engine/adapters/test_mcp_2026_07_28.py",),
    ),
    Mutant(
        "mcp26-cancelled-outcome-as-completed",
        "adapter 2026-07-28",
        "engine/adapters/mcp_2026_07_28.py",
        '                raise NotFoundOnServer(\n                    f"tasks/get: the server does not know task {task_id!r} ({reply.error})"\n'
        "                )",
        "                return await self._detailed(op)",
        "an unknown task on tasks/get is asked again (for ever) instead of reported not found",
        True,
        "not-found-before-expiry",
        (NOT_FOUND,),
    ),
    # -------------------------------------------------------------------------- AIP-151 adapter
    Mutant(
        "aip-ack-as-confirmed",
        "adapter AIP-151",
        "engine/adapters/aip151.py",
        "        return CancelResult.ACKNOWLEDGED",
        "        return CancelResult.CONFIRMED",
        "the best-effort CancelOperation acknowledgement taken as cancelled",
        True,
        "complete-vs-cancel",
        (CANCEL_RACE,),
    ),
    Mutant(
        "aip-cancelled-as-failed",
        "adapter AIP-151",
        "engine/adapters/aip151.py",
        "            return ServerStatus.CANCELLED\n        return ServerStatus.FAILED",
        "            return ServerStatus.FAILED\n        return ServerStatus.FAILED",
        "a done operation with error code 1 (CANCELLED) read as failed",
        True,
        "complete-vs-cancel",
        ("tests/integration/test_race_cancel.py",),
    ),
    Mutant(
        "aip-error-as-completed",
        "adapter AIP-151",
        "engine/adapters/aip151.py",
        "        if operation.response is not None:\n            return ServerStatus.COMPLETED",
        "        if operation.response is not None or operation.error is not None:\n"
        "            return ServerStatus.COMPLETED",
        "a done operation carrying an error read as completed",
        True,
        "failure",
        (
            "tests/integration/test_race_happy_paths.py::test_a_failed_call_is_accepted_as_failed_with_the_servers_error",
        ),
    ),
    # ------------------------------------------------------------------------------- machine.step
    Mutant(
        "step-epoch-fence-off-by-one",
        "machine.step",
        "engine/machine.py",
        "    if ev_epoch is not None and ev_epoch != op.epoch:",
        "    if ev_epoch is not None and ev_epoch < op.epoch - 1:",
        "the epoch fence lets a reply of the previous epoch through",
        True,
        "stale-epoch",
        ("tests/engine/test_machine.py", "tests/integration/test_race_result.py"),
    ),
    Mutant(
        "step-ack-accepts-cancel",
        "machine.step",
        "engine/machine.py",
        '            return _ok(op, event, now, op, (Poll(),), reason="acknowledged only; polling until terminal")',
        '            return _accept_cancel(op, event, now, "acknowledged")',
        "a cancel acknowledgement accepted as the cancelled terminal",
        True,
        "complete-vs-cancel",
        ("tests/engine/test_machine.py", *RACE),
    ),
    Mutant(
        "step-digest-not-recorded",
        "machine.step",
        "engine/machine.py",
        "            after = replace(op, state=S.ACCEPTED, result_digest=event.result_digest)",
        "            after = replace(op, state=S.ACCEPTED, result_digest=op.result_digest)",
        "the verified result's digest is not recorded on acceptance",
        True,
        "happy",
        ("tests/engine/test_machine.py", *RESULT),
    ),
    Mutant(
        "step-stale-generation-confirms",
        "machine.step",
        "engine/machine.py",
        "            if event.generation != op.cancel_generation:\n                return _reject(\n"
        "                    op,\n                    event,\n                    now,\n"
        '                    f"confirmation for cancel generation',
        "            if event.generation > op.cancel_generation:\n                return _reject(\n"
        "                    op,\n                    event,\n                    now,\n"
        '                    f"confirmation for cancel generation',
        "a confirmation of an older cancel generation is accepted",
        True,
        "cancel-crossed",
        ("tests/engine/test_machine.py", *RACE),
    ),
    # -------------------------------------------------------- the ledger's acceptance and its CAS
    Mutant(
        "acceptance-status-unchecked",
        "ledger acceptance",
        "engine/acceptance.py",
        '        ("status", ServerStatus.CANCELLED if cancelled else current.server_status, receipt.status),',
        "",
        "the receipt's terminal status is not matched against the row",
        False,
        "happy",
        ("tests/engine/ledger/test_ledger.py::test_accept_terminal_refuses_any_mismatch_naming_the_field",),
        why_not="a second line of defence: the driver only asks for a receipt with the status it read "
        "and verified; the ledger's own check stops a buggy caller",
    ),
    Mutant(
        "acceptance-any-state",
        "ledger acceptance",
        "engine/acceptance.py",
        "        if current.state is not LocalState.FETCHING_RESULT:",
        "        if current.state is LocalState.SUBMITTING:",
        "a completed receipt is accepted from any state but SUBMITTING",
        False,
        "happy",
        (
            "tests/engine/ledger/test_ledger.py::"
            "test_a_completed_receipt_for_an_operation_not_fetching_its_result_is_refused_naming_the_state",
        ),
        why_not="unreachable through step: acceptance first requires the row version the transition was "
        "computed from, so the row it checks is the transition's own before-state, and step emits a "
        "completed or failed receipt only from FETCHING_RESULT (ResultVerified); the check stops a caller "
        "that builds a receipt by hand",
    ),
    Mutant(
        "ledger-cas-ignores-version",
        "ledger CAS SQL",
        "engine/ledger/sql.py",
        "WHERE operation_id = ? AND row_version = ? AND cancel_generation = ?",
        "WHERE operation_id = ? AND row_version >= 0 * ? AND cancel_generation = ?",
        "the compare-and-swap UPDATE matches any row version",
        True,
        # The version clause decides alone only when another writer changed the row without raising
        # the cancel generation (a cancel click raises both, and the generation clause refuses the
        # stale write by itself): a rollback's adoption while the old executor's reply is in flight.
        "stale-epoch",
        ("tests/engine/ledger/test_ledger.py::test_stale_write_fails_cleanly_and_changes_nothing",),
        duckdb=True,
    ),
    Mutant(
        "acceptance-payload-unmatched",
        "ledger acceptance",
        "engine/acceptance.py",
        '            ("result_digest", digest_of(payload) if payload is not None else None, receipt.result_digest)',
        '            ("result_digest", receipt.result_digest, receipt.result_digest)',
        "the stored payload is not matched against the receipt's verified digest",
        False,
        "happy",
        ("tests/engine/ledger/test_ledger.py::test_result_digest_is_checked_against_the_payload",),
        why_not="a second line of defence: the driver stores the payload whose digest it verified "
        "(driver-payload-dropped shows the check firing); it stops a caller that stores another payload",
    ),
    Mutant(
        "ledger-cas-count-unchecked",
        "ledger CAS SQL",
        "engine/ledger/duckdb.py",
        "                if self._affected(tx, sql.STATE_UPDATE, cas_params(row)) != 1:",
        "                if self._affected(tx, sql.STATE_UPDATE, cas_params(row)) > 1:",
        "a compare-and-swap that matched no row is reported as written",
        True,
        "stale-epoch",
        ("tests/engine/ledger/test_ledger.py::test_stale_write_fails_cleanly_and_changes_nothing",),
        duckdb=True,
    ),
    Mutant(
        "ledger-cas-same-state-logged-only",
        "ledger CAS SQL",
        "engine/ledger/duckdb.py",
        "            if after == before:",
        "            if after.state == before.state:",
        "a write that keeps the local state (an epoch raise, a new server status) is logged, not written",
        True,
        "stale-epoch",
        ("tests/engine/ledger/test_ledger.py::test_acceptance_under_a_raised_epoch_is_refused",),
        duckdb=True,
    ),
    Mutant(
        "plan-fence-reversed",
        "driver",
        "engine/runtime/plan.py",
        "    if op.epoch != epoch:\n        return Step.FENCED",
        "    if op.epoch < epoch:\n        return Step.FENCED",
        "the fence compares the wrong way: an executor a rollback replaced keeps driving the adopted "
        "operation (FENCED only for operations behind it)",
        False,
        "fenced-advance",
        (
            "tests/engine/runtime/test_plan_fenced.py",
            "tests/engine/explore/test_explore_shipped.py::"
            "test_an_executor_replaced_by_a_rollback_is_fenced_and_sends_nothing_for_the_operation",
        ),
        why_not="the replaced driver's requests go out, but every event their replies become is stamped "
        "with its old epoch and refused by step, so no outcome changes; the explorer catches it all the "
        "same (a request sent by a fenced advance is a fence divergence)",
    ),
    # ----------------------------------------------- service executor (engine/runtime/epochs.py)
    Mutant(
        "executor-old-epoch-kept",
        "service executor",
        "engine/runtime/epochs.py",
        "        return read(op.operation_id) or op\n",
        "        return op\n",
        "an operation value from before a rollback is advanced as it is",
        False,
        "stale-epoch",
        ("tests/engine/runtime/test_epochs.py",),
        why_not="the driver's writes from the stale value lose their compare-and-swap and are fenced by "
        "step; the cost is wasted requests, not a wrong outcome (the explorer's executor always reads the "
        "ledger's row)",
    ),
    Mutant(
        "executor-no-cancel-priority",
        "service executor",
        "engine/runtime/epochs.py",
        "    return op.cancel_generation > 0 and op.state not in RECEIPT_STATES",
        "    return False",
        "cancel-path requests queue behind routine polls under load",
        False,
        "complete-vs-cancel",
        ("tests/engine/runtime/test_epochs.py",),
        why_not="a latency bound under load (the cancel still goes out, later); the explorer has no "
        "request limiter contention",
    ),
    Mutant(
        "executor-ledger-epoch-ignored",
        "service executor",
        "engine/runtime/epochs.py",
        "    if recorded is not None and recorded != configured:",
        "    if False:",
        "a restarted executor ignores the execution epoch the ledger recorded",
        True,
        "rollback-restart",
        ("tests/engine/runtime/test_epochs.py", "tests/rollout/test_adoption.py"),
    ),
    Mutant(
        "executor-released-before-durable",
        "service executor",
        "service/executor/groups.py",
        "        group = self._store.take()\n        started = monotonic_seconds()\n",
        "        group = self._store.take()\n"
        "        finished = [self._after(wake) for wake in finished] and []\n"
        "        started = monotonic_seconds()\n",
        "a finished advance is handed back to the heap before its group commit is durable (its next "
        "request may go out on a write the ledger does not hold yet)",
        True,
        "group-create-lost",
        ("tests/service/test_executor_hot_path.py", "tests/engine/explore/test_explore_groups.py"),
    ),
    Mutant(
        "executor-relaunched-before-durable",
        "service executor",
        "service/executor/loop.py",
        "        if op_id in self._running or op_id in self._awaiting_group:",
        "        if op_id in self._running:",
        "an operation put back on the heap while its advance ran (a rollback's adoption, a cancel) is "
        "launched again before that advance's group is durable: both advances' writes share a group",
        True,
        "group-rollback",
        ("tests/engine/explore/test_explore_groups.py", "tests/service/test_executor_hot_path.py"),
    ),
    # ------------------------------------------------------------------ rollout fencing, adoption
    Mutant(
        "rollout-raise-keeps-old-drivers",
        "rollout adoption",
        "service/executor/adoption.py",
        "            server.driver = self._new_driver(server.config, server.backend, server.caps)",
        "            server.driver = server.driver",
        "a rollback adopts the operations but keeps each server's driver of the old epoch, which is "
        "fenced from every adopted operation",
        True,
        "group-rollback",
        ("tests/rollout/test_adoption.py", "tests/rollout/test_rollback.py"),
    ),
    Mutant(
        "rollout-restart-skips-adoption",
        "rollout adoption",
        "service/executor/loop.py",
        "        if left_behind:",
        "        if left_behind and False:",
        "an executor restarted after a rollback that stopped before adopting never adopts what it left "
        "behind the epoch",
        True,
        "group-rollback-restart",
        ("tests/rollout/test_adoption.py", "tests/service/test_restart_recovery.py"),
    ),
    Mutant(
        "rollout-adoption-keeps-epoch",
        "rollout adoption",
        "engine/runtime/epochs.py",
        "    return step(op, EpochRaised(epoch, actor), now)",
        "    return step(op, EpochRaised(op.epoch, actor), now)",
        "adoption after a rollback leaves the operation at its old epoch",
        True,
        "stale-epoch",
        ("tests/engine/runtime/test_epochs.py", "tests/rollout/test_adoption.py"),
    ),
    Mutant(
        "rollout-state-cas-unfenced",
        "rollout fencing",
        "rollout/controller.py",
        "                expected_epoch=decision.before.epoch,",
        "                expected_epoch=decision.after.epoch,",
        "the rollout state is written fenced by the epoch it is about to set, not the one it read",
        False,
        "stale-epoch",
        ("tests/rollout/test_controller.py",),
        why_not="every rollback's compare-and-swap is refused, so no rollback happens (the rollout "
        "cannot be stopped): a rollout failure before any operation is touched, outside the explored "
        "operation",
    ),
    Mutant(
        "rollout-epoch-unfenced",
        "rollout fencing",
        "engine/ledger/sql.py",
        '    "WHERE id = 1 AND head_seq = ? AND epoch = ?"',
        '    "WHERE id = 1 AND head_seq = ? AND epoch >= 0 * ?"',
        "the rollout state's compare-and-swap ignores the epoch the action read",
        False,
        "stale-epoch",
        (
            "tests/contract/test_ledger_contract.py::"
            "test_rollout_events_form_a_verified_hash_chain_written_by_compare_and_swap[duckdb]",
        ),
        why_not="a race of two rollout actions deciding at once (the controller reads the state again "
        "before each action), outside the explored operation: two rollbacks could both land from the "
        "same epoch",
    ),
    Mutant(
        "rollout-taken-over-not-adopted",
        "rollout adoption",
        "engine/runtime/epochs.py",
        "    return [op for op in ops if is_behind(op, epoch) and op.state not in RECEIPT_STATES]",
        "    return [op for op in ops if is_behind(op, Epoch(epoch - 1)) and op.state not in RECEIPT_STATES]",
        "operations behind the epoch are adopted only two epochs late",
        True,
        "stale-epoch",
        ("tests/engine/runtime/test_epochs.py", "tests/rollout/test_adoption.py"),
    ),
)


def copy_tree(dest: Path) -> None:
    """The tracked files (and untracked, unignored ones) of the working tree, copied to ``dest``."""
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listing:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.is_file():
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def apply(tree: Path, mutant: Mutant) -> bool:
    path = tree / mutant.path
    text = path.read_text()
    if text.count(mutant.old) != 1:
        return False
    path.write_text(text.replace(mutant.old, mutant.new))
    return True


PROBE = """
import json, logging, sys, time
logging.disable(logging.CRITICAL)
from engine.explore.explorer import PairExplorer
from engine.explore.scenario import SCENARIOS
from service.explore_seat import plug_into_the_explorer
plug_into_the_explorer()
hint, per_pair, hint_budget, duckdb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
pairs = [(s, p) for s in SCENARIOS for p in s.protocols]
pairs.sort(key=lambda sp: sp[0].name != hint)
started, runs = time.monotonic(), 0
for scenario, protocol in pairs:
    own = scenario.name == hint
    # A bug in the ledger's SQL: the mutant's own scenario writes every run through DuckDB.
    pair = PairExplorer(scenario, protocol, code="shipped", ledger="duckdb" if duckdb and own else None)
    budget = hint_budget if own else per_pair
    # One interleaving at a time (the same tree), so the first divergent run ends the probe.
    while budget > 0 and pair.run(1) == 1 and not pair.result.divergent:
        budget -= 1
    r = pair.result
    runs += r.explored
    if r.divergent:
        print(json.dumps({"caught": True, "by": f"{scenario.name} on {protocol}", "kinds": r.kinds,
                          "runs": runs, "seconds": time.monotonic() - started}))
        sys.exit(0)
print(json.dumps({"caught": False, "by": None, "kinds": {}, "runs": runs, "seconds": time.monotonic() - started}))
"""


def run_explorer(
    tree: Path, mutant: Mutant, per_pair: int, hint_budget: int, timeout: float
) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                PROBE,
                mutant.hint,
                str(per_pair),
                str(hint_budget),
                "1" if mutant.duckdb else "0",
            ],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {
            "caught": False,
            "by": f"timed out after {timeout:.0f} s",
            "kinds": {},
            "runs": 0,
            "seconds": timeout,
        }
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        # The mutant broke the import or the run itself: the explorer failed loudly.
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {
            "caught": True,
            "by": f"the explorer crashed: {tail[:120]}",
            "kinds": {},
            "runs": 0,
            "seconds": 0.0,
        }
    return dict(json.loads(lines[-1]))


def run_tests(tree: Path, mutant: Mutant, timeout: float) -> tuple[bool, str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    started = monotonic_seconds()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s", monotonic_seconds() - started
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if done.returncode == 0:
        return False, "", monotonic_seconds() - started
    return (
        True,
        (failed[0].split(" ", 1)[1].split(" - ")[0] if failed else f"exit {done.returncode}"),
        monotonic_seconds() - started,
    )


def write_report(
    args: argparse.Namespace,
    chosen: list[Mutant],
    rows: list[str],
    survivors: list[str],
    explorer_s: float,
    tests_s: float,
    *,
    partial: bool,
) -> None:
    """``bench/results/mutants.md`` for the rows so far (``partial``: the run is still going)."""
    seed_ids = {m.id for m in chosen if m.seed_rule}
    seed_survivors = [s for s in survivors if s in seed_ids]
    others = [s for s in survivors if s not in seed_ids]
    caught_seed = len(seed_ids) - len(seed_survivors)
    total_seed = len(seed_ids)
    doc = [
        "# Mutants: does the safety net fail when the code is wrong?",
        "",
        f"`python bench/mutants.py --per-pair {args.per_pair} --hint-budget {args.hint_budget}"
        f"{' --tests' if args.tests else ''}`: "
        f"{len(chosen)} one-line bugs, each applied alone to a throwaway copy of the tree. Explorer: "
        "`finality explore --code shipped` (the real driver and adapters against the reference servers, "
        f"the mutant's own scenario first with {args.hint_budget} interleavings per protocol, then "
        f"{args.per_pair} per scenario and protocol over the whole catalogue, stopping at the first "
        "divergent pair; for the ledger's SQL every run of its own scenario writes through the real "
        "DuckDB ledger). "
        "Tests: the mutant's targeted test files, `pytest -x`.",
        "",
        (
            f"Seed-rule-breaking mutants caught by the explorer alone: {caught_seed} of {total_seed}"
            + (f"; survivors (gaps to close): {', '.join(seed_survivors)}" if seed_survivors else "")
            + "."
            if not args.no_explorer
            else f"Explorer half not run (--no-explorer): the {total_seed} seed-rule mutants are judged by it alone."
        )
        + (
            f" Mutants that break no seed rule alone and neither half caught: {', '.join(others)}."
            if others
            else ""
        ),
        (
            "Explorer half: not run; test half: "
            if args.no_explorer
            else f"Explorer half: {explorer_s:.0f} s in total; test half: "
        )
        + (f"{tests_s:.0f} s in total." if args.tests else "not run."),
        "",
        "| mutant | area | the bug | breaks a seed rule alone | caught by the explorer (scenario) | caught by the tests (test) |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if partial:
        doc.insert(2, f"(partial: {len(rows)} of {len(chosen)} mutants run so far)\n")
    Path(args.out).write_text("\n".join(doc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-pair", type=int, default=2, help="interleavings per scenario/protocol pair")
    parser.add_argument(
        "--hint-budget",
        type=int,
        default=30,
        help="interleavings of the mutant's own scenario per protocol (explored first)",
    )
    parser.add_argument("--tests", action="store_true", help="also run each mutant's targeted tests")
    parser.add_argument("--no-explorer", action="store_true", help="skip the explorer half")
    parser.add_argument("--only", nargs="*", help="mutant ids to run (default: all)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per half per mutant")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "mutants.md"))
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.id in args.only]
    rows: list[str] = []
    explorer_s = tests_s = 0.0
    survivors: list[str] = []
    for mutant in chosen:
        with tempfile.TemporaryDirectory(prefix="finality-mutant-") as folder:
            tree = Path(folder)
            copy_tree(tree)
            if not apply(tree, mutant):
                rows.append(
                    f"| {mutant.id} | {mutant.area} | {mutant.bug} | - | does not apply (code changed) | | |"
                )
                print(f"{mutant.id}: does not apply", flush=True)
                continue
            found: dict[str, object] = (
                {"caught": False, "by": "not run", "kinds": {}, "runs": 0, "seconds": 0.0}
                if args.no_explorer
                else run_explorer(tree, mutant, args.per_pair, args.hint_budget, args.timeout)
            )
            explorer_s += float(found["seconds"])  # type: ignore[arg-type]
            by = found["by"] or "survived"
            kinds = ", ".join(sorted(found["kinds"])) if found["kinds"] else ""  # type: ignore[arg-type]
            explorer = (
                f"yes: {by} ({kinds})"
                if found["caught"] and kinds
                else ("yes: " + str(by) if found["caught"] else f"no ({found['runs']} runs)")
            )
            if mutant.seed_rule and not found["caught"] and not args.no_explorer:
                survivors.append(mutant.id)
            tests = "not run"
            if args.tests:
                caught, test, seconds = run_tests(tree, mutant, args.timeout)
                tests_s += seconds
                tests = f"yes: {test}" if caught else f"no ({test})" if test else "no"
                if not mutant.seed_rule and not caught and not found["caught"]:
                    survivors.append(mutant.id)
            seed = "yes" if mutant.seed_rule else f"no: {mutant.why_not}"
            rows.append(f"| {mutant.id} | {mutant.area} | {mutant.bug} | {seed} | {explorer} | {tests} |")
            print(f"{mutant.id}: explorer {explorer}; tests {tests}", flush=True)
            write_report(args, chosen, rows, survivors, explorer_s, tests_s, partial=True)
    write_report(args, chosen, rows, survivors, explorer_s, tests_s, partial=False)
    print(f"explorer half {explorer_s:.0f} s, test half {tests_s:.0f} s; wrote {args.out}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
