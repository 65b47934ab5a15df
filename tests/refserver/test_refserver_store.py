"""The task store with a fake clock: keys, principals, expiry, execution log and stats."""

from __future__ import annotations

import itertools

import pytest

from refserver.clock import FakeClock
from refserver.fault import FaultPlan
from refserver.sim import parse_sim
from refserver.store import KeyConflict, StoreConfig, TaskStore
from refserver.task import Retention, Status
from refserver.tool import CATALOG


def make_store(**config: object) -> tuple[TaskStore, FakeClock]:
    clock = FakeClock()
    counter = itertools.count(1)
    store = TaskStore(clock, StoreConfig(**config), new_id=lambda: f"task-{next(counter)}")  # type: ignore[arg-type]
    return store, clock


def submit(
    store, arguments=None, *, tool="apply_batch_change", key=None, principal=None, requested_ttl_ms=None
):
    arguments = arguments if arguments is not None else {"batch_id": "b1"}
    echo = {k: v for k, v in arguments.items() if k != "_sim"}
    sim = parse_sim(arguments.get("_sim"), default_duration_ms=1000, time_scale=1)
    return store.submit(
        tool=CATALOG[tool],
        arguments=arguments,
        echo=echo,
        sim=sim,
        principal=principal,
        key=key,
        epoch=None,
        requested_ttl_ms=requested_ttl_ms,
    )


def test_repeated_key_with_same_arguments_returns_the_original_task_without_executing_again():
    """Idempotent submit: same key and arguments give the same task and no second execution."""
    store, _ = make_store()
    first = submit(store, key="k1")
    again = submit(store, key="k1")
    assert again.task is first.task
    assert not again.created
    assert len(store.stats()["executions"]["apply_batch_change"]) == 1
    assert store.stats()["operations_created"]["total"] == 1


def test_repeated_key_with_different_arguments_is_a_conflict():
    """Same key, different arguments: KeyConflict naming the original task."""
    store, _ = make_store()
    first = submit(store, key="k1")
    with pytest.raises(KeyConflict) as caught:
        submit(store, {"batch_id": "other"}, key="k1")
    assert caught.value.task_id == first.task.task_id


def test_keys_are_scoped_per_principal():
    """Two principals may use the same key for different tasks."""
    store, _ = make_store()
    alice = submit(store, key="k", principal="alice")
    bob = submit(store, {"batch_id": "other"}, key="k", principal="bob")
    assert alice.task is not bob.task


def test_another_principals_task_is_not_found():
    """lookup() hides tasks of other principals as if they did not exist."""
    store, _ = make_store()
    task = submit(store, principal="alice").task
    task_id = task.task_id
    assert store.lookup(task_id, "alice") is task
    assert store.lookup(task_id, "bob") is None
    assert store.visible("bob") == []


def test_every_creation_is_an_execution_with_its_arguments():
    """The execution log has one entry per created task, arguments without _sim."""
    store, _ = make_store()
    submit(store, {"batch_id": "b1", "_sim": {"duration_ms": 5}})
    submit(store, {"batch_id": "b2"})
    entries = store.stats()["executions"]["apply_batch_change"]
    assert [e["arguments"] for e in entries] == [{"batch_id": "b1"}, {"batch_id": "b2"}]


def test_task_id_reused_reports_the_id_of_an_earlier_task():
    """The create response names an earlier task, while a new task is really created."""
    store, _ = make_store()
    earlier = submit(store).task
    faulty = submit(store, {"batch_id": "b2", "_sim": {"faults": ["task_id_reused"]}})
    assert faulty.created
    assert faulty.reported_id == earlier.task_id
    assert faulty.task.task_id != earlier.task_id


def test_task_id_reused_without_an_earlier_task_reports_the_real_id():
    """With nothing to reuse, the fault stays armed and the real id is returned."""
    store, _ = make_store()
    only = submit(store, {"_sim": {"faults": ["task_id_reused"]}})
    assert only.reported_id == only.task.task_id


def test_tasks_are_deleted_after_their_ttl_and_stay_in_stats():
    """An expired task is not found but is still counted and listed as deleted."""
    store, clock = make_store(retention=Retention.FROM_COMPLETION)
    task = submit(store, {"_sim": {"ttl_ms": 500}}).task
    clock.advance(1.2)
    task_id = task.task_id
    assert store.lookup(task_id, None) is task
    clock.advance(0.4)
    assert store.lookup(task_id, None) is None
    stats = store.stats()
    assert stats["operations_created"]["total"] == 1
    assert stats["tasks"][0]["deleted"]
    assert stats["tasks"][0]["deleted_reason"] == "expired"


def test_client_ttl_is_granted_unless_sim_overrides_it():
    """The requested ttl (real ms) is granted; _sim.ttl_ms wins over it."""
    store, _ = make_store()
    assert submit(store, requested_ttl_ms=1234).task.ttl_s == pytest.approx(1.234)
    assert submit(store, {"_sim": {"ttl_ms": 10}}, requested_ttl_ms=1234).task.ttl_s == pytest.approx(0.01)


def test_plan_rules_arm_faults_on_new_tasks():
    """A count rule in the store's plan arms its fault on the first matching task only."""
    store, _ = make_store()
    store.plan = FaultPlan.from_json(
        {"rules": [{"fault": "expire_early", "tool": "apply_batch_change", "count": 1}]}
    )
    first = submit(store).task
    second = submit(store).task
    assert first.faults.armed_names() == ["expire_early"]
    assert second.faults.armed_names() == []


def test_reset_forgets_tasks_and_counters():
    """reset() empties tasks, executions and request counts."""
    store, _ = make_store()
    submit(store)
    store.note_request("tools/call")
    store.reset(FaultPlan())
    stats = store.stats()
    assert stats["operations_created"]["total"] == 0
    assert stats["requests"] == {}
    assert stats["executions"]["apply_batch_change"] == []


def test_find_round_locates_the_task_asking_for_input():
    """An answer's key leads back to its task, for the right principal only."""
    store, clock = make_store()
    task = submit(store, {"_sim": {"input_rounds": 1}}, principal="alice").task
    key = f"round-{task.task_id}-1"
    clock.advance(0.6)
    found = store.find_round(key, "alice")
    assert found is not None
    assert found.task_id == task.task_id
    assert found.status is Status.INPUT_REQUIRED
    assert store.find_round(key, "bob") is None
