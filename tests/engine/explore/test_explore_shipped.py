"""The shipped-code explorer: the real ``Driver`` and adapters against the reference servers in process."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from engine.explore.cli import EXIT_DIVERGENT, EXIT_OK, main
from engine.explore.explorer import explore_pair
from engine.explore.scenario import scenario_named
from engine.ledger.duckdb import Ledger
from engine.model import Operation, Protocol
from engine.revision import running_revision

P = Protocol


@pytest.mark.parametrize(
    ("scenario", "protocol"),
    [
        ("happy", P.MCP_2025_11_25),
        ("complete-vs-cancel", P.MCP_2026_07_28),
        ("create-lost", P.AIP_151),
        ("input-replayed", P.MCP_2025_11_25),
        ("crash-restart", P.MCP_2026_07_28),
        ("stale-epoch", P.AIP_151),
    ],
)
def test_the_shipped_driver_and_adapters_pass_every_check(scenario: str, protocol: Protocol) -> None:
    """Sampled interleavings of the real driver, adapter and reference server end without a divergence."""
    result = explore_pair(scenario_named(scenario), protocol, budget=12, code="shipped")
    assert result.code == "shipped"
    assert result.explored == 12
    assert result.divergent == 0, result.trace
    assert result.receipts + result.parked == 12


def test_the_same_seed_runs_the_same_interleavings() -> None:
    """Two explorers with one seed run the same choice sequences (the shipped code is deterministic here)."""
    from engine.explore.explorer import PairExplorer

    runs = []
    for _ in range(2):
        explorer = PairExplorer(scenario_named("cancel-twice"), P.MCP_2025_11_25, seed=5, code="shipped")
        explorer.record = []
        explorer.run(8)
        runs.append(explorer.record)
    assert runs[0] == runs[1]


@pytest.mark.usefixtures("ack_taken_as_confirmed")
def test_a_broken_adapter_is_caught_and_its_trace_replays_by_one_command() -> None:
    """The explorer fails on an adapter bug, prints the timeline, and ``--replay`` reproduces it."""
    out = io.StringIO()
    code = main(
        ["--scenario", "complete-vs-cancel", "--permutations", "60", "--seed", "1"],
        out=out,
        err=io.StringIO(),
    )
    text = out.getvalue()
    assert code == EXIT_DIVERGENT
    assert "DIVERGENT complete-vs-cancel on mcp-2026-07-28" in text
    assert "DIVERGENCE terminal: accepted cancelled; the server's truth is completed" in text
    command = text.split("replay it: ", 1)[1].strip()
    assert command.startswith("finality explore --code shipped --replay complete-vs-cancel@mcp-2026-07-28:")
    again = io.StringIO()
    assert main(command.split()[2:], out=again, err=io.StringIO()) == EXIT_DIVERGENT
    assert "DIVERGENCE terminal" in again.getvalue()
    assert "caller    cancel" in again.getvalue()


def test_a_recorded_shipped_run_names_its_code_and_revision(tmp_path: Path) -> None:
    """``--ledger`` records code 'shipped' and the running git revision (what the gate counts)."""
    path = tmp_path / "explore.duckdb"
    code = main(
        ["--scenario", "happy", "--permutations", "6", "--ledger", str(path)],
        out=io.StringIO(),
        err=io.StringIO(),
    )
    assert code == EXIT_OK
    with Ledger.open(path, read_only=True) as ledger:
        rows = ledger.explorer_runs()
        gates = ledger.gate_inputs(rows[0]["finished_at"])  # type: ignore[arg-type]
    assert {(r["code"], r["revision"]) for r in rows} == {("shipped", running_revision())}
    assert gates["terminal_divergence"]["explorer_runs"] == 3


def test_a_share_of_runs_write_through_the_real_duckdb_ledger_and_pass_the_same_checks() -> None:
    """Every eighth run of a pair uses the DuckDB ledger; a run there passes exactly as in memory."""
    from engine.explore.shipped import WireWorld

    world = WireWorld(scenario_named("complete-vs-cancel"), P.AIP_151, ledger="duckdb")
    choices = 0
    while (enabled := world.enabled()) and world.steps < 100:
        world.perform(enabled[choices % len(enabled)])
        choices += 1
    assert type(world.ledger.ledger).__name__ == "Ledger"
    assert world.finish() == []
    assert world.ledger.receipt(world.node) is not None


@pytest.mark.parametrize(
    ("scenario", "protocol"),
    [("crash-restart", P.MCP_2026_07_28), ("group-crash", P.AIP_151), ("input-replayed", P.MCP_2025_11_25)],
)
def test_on_duckdb_the_row_the_explorer_sees_is_the_row_the_ledger_holds(
    scenario: str, protocol: Protocol
) -> None:
    """The explorer answers its own reads of a DuckDB run's row from memory (``SeenRows``) between
    writes; after every step, crashes, restarts and group commits included, that row is the one a
    query of the ledger returns."""
    from engine.explore.shipped import WireWorld

    world = WireWorld(scenario_named(scenario), protocol, ledger="duckdb")
    steps = 0
    while (enabled := world.enabled()) and world.steps < 60:
        world.perform(enabled[(steps * 7) % len(enabled)])
        steps += 1
        assert world.ledger.get(world.op_id) == world.ledger.ledger.get(world.op_id)
    assert steps > 5
    world.finish()


def test_a_fault_free_run_that_parks_in_unknown_is_a_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing went wrong, yet no receipt: a failed tool result read as completed on 2025-11-25 parks the
    operation in UNKNOWN (machine.step refuses the mismatch), which the explorer reports as stuck."""
    from engine.adapters import mcp_2025_11_25
    from engine.adapters.base import Outcome

    original = mcp_2025_11_25.Mcp2025Backend.fetch_result

    async def fetch_result(self: mcp_2025_11_25.Mcp2025Backend, op: Operation) -> Outcome:
        from dataclasses import replace

        from engine.model import ServerStatus

        return replace(await original(self, op), status=ServerStatus.COMPLETED)

    monkeypatch.setattr(mcp_2025_11_25.Mcp2025Backend, "fetch_result", fetch_result)
    result = explore_pair(scenario_named("failure"), P.MCP_2025_11_25, budget=10, code="shipped")
    assert result.divergent > 0
    assert "stuck" in result.kinds


def _walk(world: object, stride: int) -> list[str]:
    """Run a world to its end choosing ``(step * stride) % n``; return its timeline."""
    from engine.explore.shipped import WireWorld

    assert isinstance(world, WireWorld)
    while (enabled := world.enabled()) and world.steps < 100:
        world.perform(enabled[(world.steps * stride) % len(enabled)])
    return list(world.lines or [])


@pytest.mark.parametrize("protocol", [P.MCP_2025_11_25, P.AIP_151])
def test_a_reused_reference_server_runs_an_interleaving_exactly_as_a_fresh_one(protocol: Protocol) -> None:
    """The server, loop and handshake replies kept between runs change nothing: a fresh server gives
    the same timeline and the same verdict for the same choices."""
    from engine.explore.shipped import WireWorld

    scenario = scenario_named("complete-vs-cancel")
    warm = WireWorld(scenario, protocol, trace=True)
    _walk(warm, 1)
    warm.finish()
    cached = WireWorld(scenario, protocol, trace=True)
    assert cached.ref is warm.ref
    cached_lines = _walk(cached, 3)
    fresh = WireWorld(scenario, protocol, trace=True)  # the cached server is in use: a new one
    assert fresh.ref is not cached.ref
    fresh_lines = _walk(fresh, 3)
    assert cached_lines == fresh_lines
    assert cached.finish() == fresh.finish() == []


def test_an_answer_the_server_took_for_another_rounds_question_is_a_wrong_round_divergence() -> None:
    """The wrong-round check reads the server's own record of the answers and can fail."""
    from engine.explore.shipped import Kinds, WireWorld

    def answered_world() -> WireWorld:
        world = WireWorld(scenario_named("crash-restart-input"), P.MCP_2025_11_25)
        for _ in range(80):
            actions = [a for a in world.enabled() if a[1] != "crash"]
            preferred = [a for a in actions if a[1] in ("answer", "work")]
            world.perform((preferred or actions)[0])
            task = world._main_task()
            if task is not None and task.answers:
                return world
        raise AssertionError("the run never delivered an answer")

    honest = answered_world()
    assert Kinds.WRONG_ROUND not in {kind for kind, _ in honest.finish()}
    tampered = answered_world()
    for answer in tampered._main_task().answers.values():
        answer["content"]["note"] = "a question of another round"
    assert Kinds.WRONG_ROUND in {kind for kind, _ in tampered.finish()}


def test_an_executor_replaced_by_a_rollback_is_fenced_and_sends_nothing_for_the_operation() -> None:
    """The replaced executor advances the adopted operation again (it has not heard of the
    rollback): the shipped driver finds it FENCED and sends no request; its earlier requests may
    still be answered, and none of their replies is accepted."""
    from engine.explore.prune import explore_merged

    result = explore_merged(scenario_named("fenced-advance"), Protocol.AIP_151, max_runs=60)
    assert result.explored > 60
    assert result.divergent == 0, result.shortest
