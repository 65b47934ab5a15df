"""Several executors act as one: the rollout stage is the ledger's, followed by every executor.

Three ``finality serve`` processes share one PostgreSQL ledger and a tool with an old path
(AIP-151, request_id idempotency) and a new one (MCP 2025-11-25, idempotency keys). A canary set
through one executor routes the others' new calls within the stated bound; a rollback through one
executor, with more than 1,000 calls in flight, sends no new call onto the new path anywhere once
its API call has returned; the in-flight operations are adopted at the new epoch by whichever
executor holds them; nothing is sent twice. A second rollback, with one executor SIGKILLed at the
same moment, holds the same: the victim's operations are taken over and adopted by the survivors.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from engine.errors import ServiceRefused, ServiceUnavailable
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, wait_until

EXECUTORS = 3
LEASE_S = 3.0
FIRST = 1100
"""Calls submitted before the first rollback (all in flight when it is recorded)."""
AFTER = 60
"""Calls submitted through every executor right after each rollback returned."""
SECOND = 200
THREADS = 8
IN_FLIGHT_MS = 90_000
"""How long the calls in flight at the first rollback run on the server: far longer than
submitting them (tens of seconds on a loaded 2-core machine)."""


def _config(old: RefServer, new: RefServer) -> str:
    return f"""
global_qps = 1500
rollout_salt = "cluster"
gate_interval_s = 0

[poll]
default_interval_ms = 1000
min_interval_ms = 200
max_interval_ms = 2000
retry_backoff_ms = 100

[servers.old]
url = "{old.url}"
protocol = "aip-151"
qps = 1500
request_id_dedupe = true

[servers.new]
url = "{new.endpoint}"
protocol = "mcp-2025-11-25"
qps = 1500

[tools.analyze_upload]
server = "old"
shadow_server = "new"
side_effect_free = true
"""


def _submit(executors: list[ServiceProcess], nodes: list[str], *, duration_ms: int = 2500) -> None:
    """Submit ``nodes`` round robin through the executors' APIs (eight threads each: each
    executor records the submissions waiting at once in one transaction)."""
    live = executors
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        clients = [ServiceClient(e.url, timeout=60.0) for e in live]
        try:
            for i in range(worker, len(nodes), THREADS * len(live)):
                node = nodes[i]
                for attempt in range(2 * len(live)):
                    try:
                        clients[(i + attempt) % len(live)].submit(
                            call_node=node,
                            tool="analyze_upload",
                            arguments={
                                "n": node,
                                # Kept on the server well past the test (a lookup after a
                                # rollback finds it), so no operation is left to a person.
                                "_sim": {"duration_ms": duration_ms + (i % 5) * 500, "ttl_ms": 3_600_000},
                            },
                        )
                        break
                    except (ServiceUnavailable, ServiceRefused) as exc:
                        if attempt == 2 * len(live) - 1:
                            raise AssertionError(f"{node} refused everywhere: {exc}") from exc
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            for client in clients:
                client.close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(THREADS * len(live))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "submitters did not finish in time"
    assert not errors, errors[0]


def _routed_new_since(con: psycopg.Connection[tuple[object, ...]], new_url: str, since: datetime) -> int:
    """Operations created on the new path after ``since`` (wall clock: the processes share the host)."""
    row = con.execute(
        "SELECT count(*) FROM op_identity i JOIN op_state s USING (operation_id) "
        "WHERE i.server = %s AND i.created_at > %s",
        [new_url, since],
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def _canary_after(con: psycopg.Connection[tuple[object, ...]], seq: int) -> int:
    row = con.execute(
        "SELECT count(*) FROM rollout_assignments WHERE arm = 'canary' AND rollout_seq >= %s", [seq]
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def _accepted_behind(con: psycopg.Connection[tuple[object, ...]], epoch: int, since: datetime) -> int:
    """Receipts accepted at an epoch older than ``epoch`` after ``since`` (none: the fence refuses them)."""
    row = con.execute(
        "SELECT count(*) FROM receipts WHERE epoch < %s AND accepted_at > %s", [epoch, since]
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def _in_flight(con: psycopg.Connection[tuple[object, ...]]) -> int:
    row = con.execute(
        "SELECT count(*) FROM op_state s WHERE NOT EXISTS "
        "(SELECT 1 FROM receipts r WHERE r.operation_id = s.operation_id)"
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def _to_canary(client: ServiceClient, why: str) -> None:
    """Shadow, then the first canary step (at most 5 %): the stage machine's order."""
    client.rollout("shadow", {"actor": "rm", "reason": why, "tools": ["analyze_upload"]})
    client.rollout("canary", {"actor": "rm", "reason": why, "percentage": 5, "override": True})


def _rollback(executor: ServiceProcess, reason: str) -> tuple[dict[str, object], datetime]:
    with executor.client() as client:
        out = client.rollout("rollback", {"actor": "rm", "reason": reason})
    return out, datetime.now(UTC)


def test_a_rollback_through_one_executor_stops_the_new_path_on_every_executor_before_it_returns(
    pg_url: str, tmp_path: Path
) -> None:
    """0 calls onto the new path after the rollback returned (twice, once with an executor killed),
    in-flight work adopted at the new epoch by its holder, one server operation per call node."""
    config = tmp_path / "finality.toml"
    with (
        RefServer("aip-151", time_scale=1.0, seed=5) as old,
        RefServer("mcp-2025-11-25", time_scale=1.0, seed=6, idempotency=True) as new,
    ):
        config.write_text(_config(old, new))
        executors = [
            ServiceProcess(
                pg_url, config, seed=i, startup_timeout=120, extra_args=["--lease-s", str(LEASE_S)]
            )
            for i in range(EXECUTORS)
        ]
        try:
            for executor in executors:
                executor.start()
            # A canary set through executor 0 routes executor 2's new calls within the bound.
            with executors[0].client() as client:
                _to_canary(client, "first")
                canary = client.rollout(
                    "canary", {"actor": "rm", "reason": "half", "percentage": 50, "override": True}
                )
            cluster = canary["cluster"]
            assert isinstance(cluster, dict)
            assert cluster["effective_everywhere"] is False
            by = datetime.fromisoformat(str(cluster["effective_everywhere_by"]))
            assert (by - datetime.now(UTC)).total_seconds() <= 1.0
            wait_until(lambda: datetime.now(UTC) >= by, timeout=5, what="the stated bound")
            _submit([executors[2]], [f"probe-{i}" for i in range(40)])
            with psycopg.connect(pg_url) as con:
                assert _canary_after(con, int(str(canary["seq"]))) > 0, "executor 2 ignored the canary"

            # More than 1,000 calls in flight, then a rollback through executor 1.
            _submit(executors, [f"a-{i:05d}" for i in range(FIRST)], duration_ms=IN_FLIGHT_MS)
            with psycopg.connect(pg_url) as con:
                assert _in_flight(con) >= 1000
            first, first_returned = _rollback(executors[1], "first rollback")
            returned = first_returned
            assert first["cluster"]["effective_everywhere"] is True  # type: ignore[index]
            _submit(executors, [f"b-{i:05d}" for i in range(AFTER)])
            with psycopg.connect(pg_url) as con:
                assert _routed_new_since(con, new.endpoint, returned) == 0
                assert _canary_after(con, int(str(first["seq"]))) == 0

            # Again: canary, load, then a rollback through executor 1 while executor 2 is killed.
            with executors[0].client() as client:
                _to_canary(client, "again")
                client.rollout(
                    "canary", {"actor": "rm", "reason": "again", "percentage": 50, "override": True}
                )
            _submit(executors, [f"c-{i:05d}" for i in range(SECOND)], duration_ms=20_000)
            victim = executors[2]
            killer = threading.Thread(target=victim.kill)
            killer.start()
            second, returned = _rollback(executors[1], "second rollback")
            killer.join(timeout=10)
            survivors = executors[:2]
            _submit(survivors, [f"d-{i:05d}" for i in range(AFTER)])
            with psycopg.connect(pg_url) as con:
                assert _routed_new_since(con, new.endpoint, returned) == 0
                assert _canary_after(con, int(str(second["seq"]))) == 0

            total = 40 + FIRST + AFTER + SECOND + AFTER

            def finished() -> bool:
                with psycopg.connect(pg_url) as con:
                    row = con.execute("SELECT count(*) FROM receipts").fetchone()
                return row is not None and int(str(row[0])) == total

            wait_until(finished, timeout=240, what="every operation holds a receipt")
            for executor in survivors:
                assert executor.running, executor.stderr()
            with psycopg.connect(pg_url) as con:
                epochs = Counter(
                    (str(r[0]).split("-")[0], int(str(r[1])))
                    for r in con.execute(
                        "SELECT i.call_node_id, r.epoch FROM receipts r JOIN op_identity i USING (operation_id)"
                    )
                )
                fenced = con.execute(
                    "SELECT count(*) FROM transitions WHERE NOT accepted AND cause LIKE 'stale epoch%'"
                ).fetchone()
                behind_first = _accepted_behind(con, 2, first_returned)
                behind_second = _accepted_behind(con, 3, returned)
                in_flight_epochs = Counter(
                    int(str(r[0]))
                    for r in con.execute(
                        "SELECT r.epoch FROM receipts r WHERE r.accepted_at > %s", [first_returned]
                    )
                )
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
    assert in_flight_epochs[2] + in_flight_epochs[3] > 1000, in_flight_epochs
    assert {e for (prefix, e) in epochs if prefix in ("b", "c", "d")} <= {2, 3}
    # Nothing was sent twice: one server operation per call node, on either path.
    created = old_stats["operations_created"]["total"] + new_stats["operations_created"]["total"]
    assert created == total
    for stats in (old_stats, new_stats):
        per_key = Counter(t["key"] for t in stats["tasks"])
        assert not per_key or max(per_key.values()) == 1
    # Old-epoch replies were fenced and logged (the transitions log keeps each refusal).
    assert fenced is not None
    assert int(str(fenced[0])) > 0
    assert all(s["epoch"] == 3 for s in statuses)
