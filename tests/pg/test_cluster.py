"""Several executors act as one: the rollout stage is the ledger's, followed by every executor.

Three ``finality serve`` processes share one PostgreSQL ledger and a tool with an old path (MCP
2026-07-28) and a new one (AIP-151 with request_id deduplication). With more than 1,000 calls in
flight, a canary raised through one executor routes another's new calls within the stated bound;
a rollback through a third sends no new call onto the new path anywhere once its API call has
returned, the in-flight operations are adopted at the new epoch by whichever executor holds them,
old-epoch replies are fenced and logged, and nothing is sent twice. A second rollback, with one
executor SIGKILLed at the same moment, holds the same: the victim's operations are taken over and
adopted by the survivors.

Sized to what the issue asks and to the suite's time. The 1,000 calls held in flight do a second of
work on the server and advise a 5-minute poll interval, so holding them costs nothing: at the
rollback the executors have not yet seen them finish (no receipt), each is adopted at the new epoch
by its holder, and the first poll after adoption finds it finished and records its receipt, at the
new epoch. (Durations fitted to the submission pace instead overshot on a loaded machine: calls
still running minutes later, past the test's bounded wait.) A smaller set whose every request is
answered 1.5 s late keeps requests in flight across the first rollback, so that old-epoch replies
arrive after it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime
from pathlib import Path

from engine.clock import SystemClock
from engine.errors import ServiceRefused, ServiceUnavailable
from engine.ledger import pg_client
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, start_all, wait_until

CLOCK = SystemClock()  # the wall clock the executors under test read too

EXECUTORS = 3
LEASE_S = 6.0
"""Long enough that a busy executor's lease does not lapse between renewals on a loaded machine."""
HELD = 1050
"""Calls submitted before the first rollback and held in flight until it."""
BUSY = 30
"""Calls with requests in flight across the first rollback (their replies arrive after it)."""
AFTER = 15
"""Calls submitted through every executor right after each rollback returned."""
SECOND = 60
THREADS = 16
SLOW_POLL_MS = 300_000
SHORT = {"duration_ms": 500, "poll_interval_ms": 300, "ttl_ms": 3_600_000}
HELD_SIM = {"duration_ms": 1000, "poll_interval_ms": SLOW_POLL_MS, "ttl_ms": 3_600_000}
"""Short work on the server, polled every 5 minutes: in flight (no receipt, not yet seen finished)
until the rollback's adoption polls it, whatever the submission pace on a loaded machine."""
BUSY_SIM = {
    "duration_ms": 6000,
    "poll_interval_ms": 300,
    "ttl_ms": 3_600_000,
    "faults": [{"name": "slow_response", "delay_ms": 1500, "times": 100}],
}
"""Each request answered 1.5 s late: some are always awaiting their reply when a rollback lands,
so old-epoch replies arrive after it on a loaded machine and an idle one alike."""
SECOND_SIM = {"duration_ms": 8000, "poll_interval_ms": 1000, "ttl_ms": 3_600_000}
"""In flight at the second rollback (and at the victim's death), then taken over or adopted."""


def _config(old: RefServer, new: RefServer) -> str:
    return f"""
global_qps = 2000
rollout_salt = "cluster"
gate_interval_s = 0

[poll]
default_interval_ms = 1000
min_interval_ms = 200
max_interval_ms = {SLOW_POLL_MS}
retry_backoff_ms = 100

[servers.old]
url = "{old.endpoint}"
protocol = "mcp-2026-07-28"
qps = 2000

[servers.new]
url = "{new.url}"
protocol = "aip-151"
qps = 2000
request_id_dedupe = true

[tools.analyze_upload]
server = "old"
shadow_server = "new"
side_effect_free = true
"""


Sim = Callable[[int, int], dict[str, object]]
"""The ``_sim`` of the k-th call submitted (0-based) out of n."""


def _fixed(sim: dict[str, object]) -> Sim:
    return lambda k, n: sim


def _submit(executors: list[ServiceProcess], nodes: list[str], sim: Sim) -> None:
    """Submit ``nodes`` round robin through the executors' APIs (sixteen threads each: each
    executor records the submissions waiting at once in one transaction)."""
    errors: list[BaseException] = []
    count = threading.Lock()
    submitted = [0]

    def work(worker: int) -> None:
        clients = [ServiceClient(e.url, timeout=60.0) for e in executors]
        try:
            for i in range(worker, len(nodes), THREADS * len(executors)):
                with count:
                    k = submitted[0]
                    submitted[0] += 1
                arguments = {"n": nodes[i], "_sim": sim(k, len(nodes))}
                for attempt in range(2 * len(executors)):
                    try:
                        client = clients[(i + attempt) % len(executors)]
                        client.submit(call_node=nodes[i], tool="analyze_upload", arguments=arguments)
                        break
                    except (ServiceUnavailable, ServiceRefused) as exc:
                        if attempt == 2 * len(executors) - 1:
                            raise AssertionError(f"{nodes[i]} refused everywhere: {exc}") from exc
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            for client in clients:
                client.close()

    with ThreadPoolExecutor(THREADS * len(executors)) as pool:
        _, late = wait([pool.submit(work, w) for w in range(THREADS * len(executors))], timeout=120)
    assert not late, "submitters did not finish in time"
    assert not errors, errors[0]


def _count(con: pg_client.Connection[tuple[object, ...]], sql: str, params: list[object]) -> int:
    row = con.execute(sql, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(str(row[0]))


def _routed_new_since(con: pg_client.Connection[tuple[object, ...]], new_url: str, since: datetime) -> int:
    """Operations created on the new path after ``since`` (wall clock: the processes share the host)."""
    return _count(
        con, "SELECT count(*) FROM op_identity WHERE server = %s AND created_at > %s", [new_url, since]
    )


def _canary_after(con: pg_client.Connection[tuple[object, ...]], seq: int) -> int:
    return _count(
        con, "SELECT count(*) FROM rollout_assignments WHERE arm = 'canary' AND rollout_seq >= %s", [seq]
    )


def _accepted_behind(con: pg_client.Connection[tuple[object, ...]], epoch: int, since: datetime) -> int:
    """Receipts accepted at an epoch older than ``epoch`` after ``since`` (none: the fence refuses them)."""
    return _count(con, "SELECT count(*) FROM receipts WHERE epoch < %s AND accepted_at > %s", [epoch, since])


_LIVE = "NOT EXISTS (SELECT 1 FROM receipts r WHERE r.operation_id = s.operation_id)"


def _in_flight(con: pg_client.Connection[tuple[object, ...]]) -> int:
    return _count(con, f"SELECT count(*) FROM op_state s WHERE {_LIVE}", [])


def _live_behind(pg_url: str, epoch: int) -> int:
    """Operations without a receipt still at an epoch older than ``epoch`` (not yet adopted)."""
    with pg_client.connect(pg_url) as con:
        return _count(con, f"SELECT count(*) FROM op_state s WHERE s.epoch < %s AND {_LIVE}", [epoch])


def _stuck(pg_url: str, executors: list[ServiceProcess], servers: list[RefServer]) -> str:
    """What a failed wait leaves to read: the live operations, their last transitions, their tasks
    as the servers hold them, and what the executors logged about them."""
    lines: list[str] = []
    tasks = {str(t["id"]): t for server in servers for t in server.stats()["tasks"]}
    with pg_client.connect(pg_url) as con:
        live = con.execute(
            "SELECT s.operation_id, i.call_node_id, s.state, s.epoch, s.row_version, s.lease_owner, s.task_id, "
            f"s.lease_expires_at, s.updated_at FROM op_state s JOIN op_identity i USING (operation_id) WHERE {_LIVE} "
            "ORDER BY i.call_node_id LIMIT 12"
        ).fetchall()
        lines.append(f"now {CLOCK.now().isoformat()}; {_in_flight(con)} live")
        for row in live:
            lines.append(f"live {row}")
            lines.append(f"    server: {tasks.get(str(row[6]))}")
            for t in con.execute(
                "SELECT seq, from_state, to_state, event, accepted, cause, epoch, row_version, recorded_at "
                "FROM transitions WHERE operation_id = %s ORDER BY seq DESC LIMIT 8",
                [row[0]],
            ):
                lines.append(f"    {t}")
    ids = [str(row[0]) for row in live]
    for executor in executors:
        log = executor.stderr(2_000_000).splitlines()
        mentions = [
            line for line in log if any(i in line for i in ids) or "WARNING" in line or "ERROR" in line
        ]
        lines.append(f"executor {executor.pid} (running {executor.running}): {len(log)} lines")
        lines.extend(f"    {line[:300]}" for line in mentions[-30:])
    return "\n".join(lines)


def _to_canary(client: ServiceClient, why: str, percentage: int) -> dict[str, object]:
    """Shadow, then the first canary step, then ``percentage``: the stage machine's order."""
    client.rollout("shadow", {"actor": "rm", "reason": why, "tools": ["analyze_upload"]})
    first = client.rollout("canary", {"actor": "rm", "reason": why, "percentage": 5, "override": True})
    if percentage == 5:
        return first
    return client.rollout(
        "canary", {"actor": "rm", "reason": why, "percentage": percentage, "override": True}
    )


def _rollback(executor: ServiceProcess, reason: str) -> tuple[dict[str, object], datetime]:
    with executor.client() as client:
        out = client.rollout("rollback", {"actor": "rm", "reason": reason})
    return out, CLOCK.now()


def test_a_rollback_through_one_executor_stops_the_new_path_on_every_executor_before_it_returns(
    pg_url: str, tmp_path: Path
) -> None:
    """0 calls onto the new path after the rollback returned (twice, once with an executor killed),
    in-flight work adopted at the new epoch by its holder, one server operation per call node."""
    config = tmp_path / "finality.toml"
    with (
        RefServer("mcp-2026-07-28", seed=5, idempotency=True) as old,
        RefServer("aip-151", seed=6) as new,
    ):
        assert new.dedupes_request_id
        config.write_text(_config(old, new))
        executors = [
            ServiceProcess(
                pg_url, config, seed=i, startup_timeout=120, extra_args=["--lease-s", str(LEASE_S)]
            )
            for i in range(EXECUTORS)
        ]
        try:
            start_all(executors)
            # More than 1,000 calls in flight at a 5 % canary.
            with executors[0].client() as client:
                _to_canary(client, "first", 5)
            _submit(executors, [f"a-{i:05d}" for i in range(HELD)], _fixed(HELD_SIM))
            # A canary raised through executor 0 routes executor 2's new calls within the bound.
            with executors[0].client() as client:
                canary = client.rollout(
                    "canary", {"actor": "rm", "reason": "half", "percentage": 50, "override": True}
                )
            cluster = canary["cluster"]
            assert isinstance(cluster, dict)
            assert cluster["effective_everywhere"] is False
            by = datetime.fromisoformat(str(cluster["effective_everywhere_by"]))
            assert (by - CLOCK.now()).total_seconds() <= 1.0
            wait_until(lambda: CLOCK.now() >= by, timeout=5, what="the stated bound")
            _submit([executors[2]], [f"busy-{i}" for i in range(BUSY)], _fixed(BUSY_SIM))
            with pg_client.connect(pg_url) as con:
                assert _canary_after(con, int(str(canary["seq"]))) > 0, "executor 2 ignored the canary"
                in_flight_at_first = _in_flight(con)
            assert in_flight_at_first >= 1000, in_flight_at_first

            # The rollback through executor 1.
            first, first_returned = _rollback(executors[1], "first rollback")
            assert first["cluster"]["effective_everywhere"] is True  # type: ignore[index]
            _submit(executors, [f"b-{i:05d}" for i in range(AFTER)], _fixed(SHORT))
            with pg_client.connect(pg_url) as con:
                assert _routed_new_since(con, new.url, first_returned) == 0
                assert _canary_after(con, int(str(first["seq"]))) == 0
            # Each executor adopts what it holds (the others within the bound the answer states).
            wait_until(
                lambda: _live_behind(pg_url, 2) == 0, timeout=30, every=0.5, what="adoption at epoch 2"
            )

            # Again: canary, load, then a rollback through executor 1 while executor 2 is killed.
            with executors[0].client() as client:
                again = _to_canary(client, "again", 50)
            by = datetime.fromisoformat(str(again["cluster"]["effective_everywhere_by"]))  # type: ignore[index]
            wait_until(lambda: CLOCK.now() >= by, timeout=5, what="the stated bound")
            _submit(executors, [f"c-{i:05d}" for i in range(SECOND)], _fixed(SECOND_SIM))
            victim = executors[2]
            killer = threading.Thread(target=victim.kill)
            killer.start()
            second, returned = _rollback(executors[1], "second rollback")
            killer.join(timeout=10)
            survivors = executors[:2]
            _submit(survivors, [f"d-{i:05d}" for i in range(AFTER)], _fixed(SHORT))
            with pg_client.connect(pg_url) as con:
                assert _routed_new_since(con, new.url, returned) == 0
                assert _canary_after(con, int(str(second["seq"]))) == 0

            total = HELD + BUSY + AFTER + SECOND + AFTER

            def finished() -> bool:
                with pg_client.connect(pg_url) as con:
                    return _count(con, "SELECT count(*) FROM receipts", []) == total

            try:
                wait_until(finished, timeout=60, every=0.5, what="every operation holds a receipt")
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{_stuck(pg_url, executors, [old, new])}") from None
            for executor in survivors:
                assert executor.running, executor.stderr()
            with pg_client.connect(pg_url) as con:
                epochs = Counter(
                    (str(r[0]).split("-")[0], int(str(r[1])))
                    for r in con.execute(
                        "SELECT i.call_node_id, r.epoch FROM receipts r JOIN op_identity i USING (operation_id)"
                    )
                )
                fenced = _count(
                    con,
                    "SELECT count(*) FROM transitions WHERE NOT accepted AND cause LIKE %s",
                    ["stale epoch%"],
                )
                behind_first = _accepted_behind(con, 2, first_returned)
                behind_second = _accepted_behind(con, 3, returned)
            statuses = []
            for executor in survivors:
                with executor.client() as client:
                    statuses.append(client.rollout_status())
        finally:
            for executor in executors:
                executor.close()
        old_stats, new_stats = old.stats(), new.stats()

    # Every call in flight at a rollback ended at the epoch after it, whoever held it (the victim's
    # included): no receipt at an older epoch was accepted once the rollback had returned.
    assert int(str(second["after"]["epoch"])) == 3  # type: ignore[index]
    assert behind_first == 0, (behind_first, epochs)
    assert behind_second == 0, (behind_second, epochs)
    held_after_first = epochs[("a", 2)] + epochs[("a", 3)]
    assert held_after_first >= 1000 - (HELD - in_flight_at_first), epochs
    assert {e for (prefix, e) in epochs if prefix in ("b", "c", "d")} <= {2, 3}
    assert {e for (prefix, e) in epochs if prefix == "d"} == {3}
    # Nothing was sent twice: one server operation per call node, on either path.
    created = old_stats["operations_created"]["total"] + new_stats["operations_created"]["total"]
    assert created == total
    for stats in (old_stats, new_stats):
        per_key = Counter(t["key"] for t in stats["tasks"])
        assert None not in per_key, "every server operation was created under the call's key"
        assert not per_key or max(per_key.values()) == 1
    # Old-epoch replies were fenced and logged (the transitions log keeps each refusal).
    assert fenced > 0
    assert all(s["epoch"] == 3 for s in statuses)
