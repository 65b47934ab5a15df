"""All tasks of one server, their submission keys, the execution log and the counters for tests.

Pure apart from the injected ``Clock``: the protocol modules call it, render what it returns, and
never touch a ``Task``'s timeline themselves. Deleted tasks are kept (flagged) so that stats can still
count them and a repeated submission key can still answer with the original task.
"""

from __future__ import annotations

import random
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from refserver.clock import Clock, WallAnchor
from refserver.fault import Fault, FaultBook, FaultPlan
from refserver.sim import DEFAULT_TTL_MS, SimSpec
from refserver.task import Retention, Task
from refserver.tool import CATALOG, Outcome, ToolSpec, digest_of, planned_outcome


class KeyConflict(Exception):
    """A submission key reused with different arguments."""

    def __init__(self, key: str, task_id: str) -> None:
        super().__init__(f"key {key!r} was already used with different arguments (task {task_id})")
        self.key = key
        self.task_id = task_id


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Protocol-dependent policy of the store.

    Attributes:
        time_scale: multiplier for every simulated duration.
        retention: where a ttl is counted from.
        is_error_fails: whether an ``isError`` result makes the task ``failed`` (MCP 2025-11-25).
        cancel_delay_ms: unscaled delay before a cooperative cancel takes effect.
        vary_intervals: whether ttl and poll interval drift a little between reads (2026-07-28).
    """

    time_scale: float = 1.0
    retention: Retention = Retention.FROM_CREATION
    is_error_fails: bool = True
    cancel_delay_ms: float = 200.0
    vary_intervals: bool = False

    @property
    def cancel_delay_s(self) -> float:
        return self.cancel_delay_ms * self.time_scale / 1000.0


@dataclass(frozen=True, slots=True)
class Execution:
    """One time a tool's work started running."""

    tool: str
    task_id: str | None
    arguments: Mapping[str, Any]
    at: float


@dataclass(frozen=True, slots=True)
class Submission:
    """What a create call produced. ``reported_id`` differs from ``task.task_id`` under ``task_id_reused``."""

    task: Task
    created: bool
    reported_id: str


def _default_id() -> str:
    return secrets.token_urlsafe(16)


@dataclass(slots=True)
class _Log:
    executions: list[Execution] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    stale_answers: int = 0


class TaskStore:
    """The server's state; single-threaded by design (one asyncio loop), so it takes no locks."""

    def __init__(
        self,
        clock: Clock,
        config: StoreConfig,
        *,
        seed: int = 0,
        plan: FaultPlan | None = None,
        new_id: Callable[[], str] = _default_id,
    ) -> None:
        self.clock = clock
        self.config = config
        self.anchor = WallAnchor(clock)
        self.seed = seed
        self.rng = random.Random(seed)
        self.plan = plan or FaultPlan(seed=seed)
        self._new_id = new_id
        self._tasks: dict[str, Task] = {}
        self._keys: dict[tuple[str | None, str], str] = {}
        self._log = _Log()

    # -- lifecycle ---------------------------------------------------------------------------------

    def reset(self, plan: FaultPlan) -> None:
        """Forget every task, key, execution and counter; install ``plan``."""
        self._tasks.clear()
        self._keys.clear()
        self._log = _Log()
        self.rng = random.Random(self.seed)
        self.plan = plan

    def now(self) -> float:
        return self.clock.monotonic()

    def note_request(self, method: str) -> None:
        self._log.requests[method] += 1

    def note_stale_answer(self) -> None:
        self._log.stale_answers += 1

    # -- creating ----------------------------------------------------------------------------------

    def granted_ttl_s(self, sim: SimSpec, requested_ttl_ms: int | None) -> float:
        """``_sim.ttl_ms`` wins, then the client's request (real milliseconds), then the default."""
        if sim.ttl_s is not None:
            return sim.ttl_s
        if requested_ttl_ms is not None:
            return requested_ttl_ms / 1000.0
        return DEFAULT_TTL_MS * self.config.time_scale / 1000.0

    def submit(
        self,
        *,
        tool: ToolSpec,
        arguments: Mapping[str, Any],
        echo: Mapping[str, Any],
        sim: SimSpec,
        principal: str | None,
        key: str | None,
        epoch: int | None,
        requested_ttl_ms: int | None = None,
    ) -> Submission:
        """Create a task and start its work, or return the task an earlier call with ``key`` created.

        Raises:
            KeyConflict: ``key`` was used before with different arguments.
        """
        now = self.now()
        digest = digest_of({"tool": tool.name, "arguments": arguments})
        if key is not None:
            existing_id = self._keys.get((principal, key))
            if existing_id is not None:
                existing = self._tasks[existing_id]
                if existing.request_digest != digest:
                    raise KeyConflict(key, existing_id)
                self._advance(existing, now)
                return Submission(existing, created=False, reported_id=existing.task_id)
        task_id = self._new_id()
        while task_id in self._tasks:
            task_id = self._new_id()
        ttl_bump_s = 0.0
        if self.config.vary_intervals:
            ttl_bump_s = self.rng.uniform(0.0, 0.1) * (self.granted_ttl_s(sim, requested_ttl_ms))
        task = Task(
            task_id=task_id,
            tool=tool.name,
            echo=echo,
            sim=sim,
            principal=principal,
            key=key,
            request_digest=digest,
            epoch=epoch,
            created_at=now,
            ttl_s=self.granted_ttl_s(sim, requested_ttl_ms),
            retention=self.config.retention,
            is_error_fails=self.config.is_error_fails,
            planned=planned_outcome(tool.name, echo, sim),
            faults=FaultBook([*sim.faults, *self.plan.arm(tool.name)]),
            ttl_bump_s=ttl_bump_s,
        )
        earlier = self._latest_other(task)
        self._tasks[task_id] = task
        if key is not None:
            self._keys[(principal, key)] = task_id
        self._log.executions.append(Execution(tool.name, task_id, dict(echo), now))
        reported = task_id
        if earlier is not None and task.faults.take(Fault.TASK_ID_REUSED, "create"):
            reported = earlier.task_id
        task.advance(now)
        return Submission(task, created=True, reported_id=reported)

    def run_sync(self, tool: ToolSpec, echo: Mapping[str, Any], sim: SimSpec) -> Outcome:
        """Record a synchronous execution and return what it ends with; the caller waits the duration."""
        self._log.executions.append(Execution(tool.name, None, dict(echo), self.now()))
        return planned_outcome(tool.name, echo, sim)

    def _latest_other(self, task: Task) -> Task | None:
        for other in reversed(self._tasks.values()):
            if other.principal == task.principal and not other.deleted:
                return other
        return None

    # -- finding -----------------------------------------------------------------------------------

    def _advance(self, task: Task, now: float) -> None:
        task.advance(now)
        expires_at = task.expires_at()
        if not task.deleted and expires_at is not None and now >= expires_at:
            if task.faults.has(Fault.EXPIRE_EARLY):
                task.faults.take(Fault.EXPIRE_EARLY, "expiry")
                task.mark_deleted(now, "expire_early")
            else:
                task.mark_deleted(now, "expired")

    def lookup(self, task_id: str, principal: str | None) -> Task | None:
        """The live task visible to ``principal``; another principal's task is simply not found."""
        task = self._tasks.get(task_id)
        if task is None or task.principal != principal:
            return None
        self._advance(task, self.now())
        return None if task.deleted else task

    def by_key(self, principal: str | None, key: str) -> Task | None:
        """The task created with ``key``, deleted or not (the caller decides what a tombstone means)."""
        task_id = self._keys.get((principal, key))
        if task_id is None:
            return None
        task = self._tasks[task_id]
        self._advance(task, self.now())
        return task

    def find_round(self, key: str, principal: str | None) -> Task | None:
        """The live task that asked (or asks) input round ``key``."""
        now = self.now()
        for task in self._tasks.values():
            if task.principal == principal and not task.deleted:
                self._advance(task, now)
                if not task.deleted and task.knows_round(key):
                    return task
        return None

    def visible(self, principal: str | None) -> list[Task]:
        """Live tasks of ``principal``, oldest first."""
        now = self.now()
        out = []
        for task in self._tasks.values():
            self._advance(task, now)
            if task.principal == principal and not task.deleted:
                out.append(task)
        return out

    def delete(self, task: Task, reason: str) -> None:
        task.mark_deleted(self.now(), reason)

    def all_tasks(self) -> Iterable[Task]:
        return self._tasks.values()

    # -- rendering helpers -------------------------------------------------------------------------

    def poll_interval_ms(self, task: Task) -> int:
        base = task.sim.poll_interval_s * 1000.0
        if self.config.vary_intervals:
            base *= 1.0 + self.rng.uniform(-0.1, 0.1)
        return max(1, round(base))

    def ttl_ms(self, task: Task) -> int | None:
        return None if task.ttl_s is None else round(task.ttl_s * 1000.0)

    def iso(self, mono: float) -> str:
        return self.anchor.iso(mono)

    def counts(self) -> dict[str, Any]:
        """The creation and request counters alone: what a benchmark of 100,000 tasks asks at its end,
        where ``stats`` (every task as JSON) took longer than the admin call's timeout."""
        by_tool: Counter[str] = Counter(t.tool for t in self._tasks.values())
        return {
            "operations_created": {"total": len(self._tasks), "by_tool": dict(sorted(by_tool.items()))},
            "requests": dict(sorted(self._log.requests.items())),
        }

    def stats(self) -> dict[str, Any]:
        """Everything tests need to see server-side: creations, tasks, requests, executions, faults."""
        now = self.now()
        for task in self._tasks.values():
            self._advance(task, now)
        by_tool: Counter[str] = Counter(t.tool for t in self._tasks.values())
        executions: dict[str, list[dict[str, Any]]] = {name: [] for name in CATALOG}
        for ex in self._log.executions:
            executions.setdefault(ex.tool, []).append(
                {"task_id": ex.task_id, "arguments": dict(ex.arguments), "at": self.iso(ex.at)}
            )
        return {
            "operations_created": {"total": len(self._tasks), "by_tool": dict(sorted(by_tool.items()))},
            "tasks": [self._task_json(t) for t in self._tasks.values()],
            "requests": dict(sorted(self._log.requests.items())),
            "executions": executions,
            "faults_fired": [
                {"task_id": t.task_id, "fault": f.fault.value, "where": f.where}
                for t in self._tasks.values()
                for f in t.faults.fired
            ],
            "stale_answers": self._log.stale_answers,
            "fault_plan": self.plan.to_json(),
        }

    def _task_json(self, task: Task) -> dict[str, Any]:
        return {
            "id": task.task_id,
            "tool": task.tool,
            "status": task.status.value,
            "principal": task.principal,
            "key": task.key,
            "epoch": task.epoch,
            "created_at": self.iso(task.created_at),
            "terminal_at": None if task.terminal_at is None else self.iso(task.terminal_at),
            "cancel_requested_at": None
            if task.cancel_requested_at is None
            else self.iso(task.cancel_requested_at),
            "deleted": task.deleted,
            "deleted_reason": task.deleted_reason,
            "input_rounds_answered": task.rounds_answered,
            "faults_armed": task.faults.remaining(),
        }


__all__ = [
    "Execution",
    "KeyConflict",
    "StoreConfig",
    "Submission",
    "TaskStore",
]
