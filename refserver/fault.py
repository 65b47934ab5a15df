"""Fault names, fault plans and per-task fault budgets. Pure: no I/O, no clock.

A fault is *armed* on a task when the task is created, either because the call asked for it in
``_sim.faults`` or because a plan rule matched; the protocol layer then *takes* it at the moment the
fault applies, and each take uses up one of the fault's ``times``. Plans draw their randomness from
their own seeded ``random.Random``, so the same seed and the same call order fire the same faults.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Fault(StrEnum):
    """Every fault the server can inject, named exactly as in plans and ``_sim.faults``."""

    CREATE_RESPONSE_LOST = "create_response_lost"
    CREATE_REQUEST_LOST = "create_request_lost"
    POLL_OUT_OF_ORDER = "poll_out_of_order"
    INPUT_REPLAYED = "input_replayed"
    COMPLETE_ON_CANCEL = "complete_on_cancel"
    CANCEL_ACK_LOST = "cancel_ack_lost"
    RESULT_LOST = "result_lost"
    RESULT_TRUNCATED = "result_truncated"
    STALE_EPOCH_RESULT = "stale_epoch_result"
    FUTURE_EPOCH_RESULT = "future_epoch_result"
    TASK_ID_REUSED = "task_id_reused"
    NOT_FOUND_BEFORE_EXPIRY = "not_found_before_expiry"
    NOT_FOUND_ON_CANCEL = "not_found_on_cancel"
    EXPIRE_EARLY = "expire_early"
    POLL_429 = "poll_429"
    POLL_503 = "poll_503"
    CONNECTION_RESET = "connection_reset"
    SLOW_RESPONSE = "slow_response"
    MALFORMED_BODY = "malformed_body"


class FaultError(ValueError):
    """A fault reference, rule or plan that cannot be understood; the message names the culprit."""


_PARAM_NAMES = frozenset({"times", "retry_after_s", "delay_ms"})


@dataclass(frozen=True, slots=True)
class FaultParams:
    """Parameters a fault may use; each fault reads only the ones that concern it.

    ``delay_ms`` is multiplied by the server's time scale, ``retry_after_s`` is not, because it goes
    verbatim into a ``Retry-After`` header, which only carries whole seconds.
    """

    times: int = 1
    retry_after_s: int = 1
    delay_ms: float = 1000.0


@dataclass(frozen=True, slots=True)
class FaultRequest:
    """One fault to arm on one task."""

    fault: Fault
    params: FaultParams = FaultParams()


def _parse_fault_name(raw: object) -> Fault:
    if not isinstance(raw, str):
        raise FaultError(f"a fault name must be a string, got {raw!r}")
    try:
        return Fault(raw)
    except ValueError:
        known = ", ".join(sorted(f.value for f in Fault))
        raise FaultError(f"unknown fault {raw!r}; known faults: {known}") from None


def _parse_int(name: str, raw: object, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise FaultError(f"fault parameter {name!r} must be an integer >= {minimum}, got {raw!r}")
    return raw


def parse_params(raw: object) -> FaultParams:
    """Validate a params object (``{}`` or absent means the defaults)."""
    if raw is None:
        return FaultParams()
    if not isinstance(raw, Mapping):
        raise FaultError(f"fault params must be an object, got {raw!r}")
    unknown = set(raw) - _PARAM_NAMES
    if unknown:
        raise FaultError(f"unknown fault parameter(s): {', '.join(sorted(map(str, unknown)))}")
    defaults = FaultParams()
    times = _parse_int("times", raw.get("times", defaults.times), 1)
    retry_after_s = _parse_int("retry_after_s", raw.get("retry_after_s", defaults.retry_after_s), 0)
    delay_raw = raw.get("delay_ms", defaults.delay_ms)
    if isinstance(delay_raw, bool) or not isinstance(delay_raw, int | float) or delay_raw < 0:
        raise FaultError(f"fault parameter 'delay_ms' must be a number >= 0, got {delay_raw!r}")
    return FaultParams(times=times, retry_after_s=retry_after_s, delay_ms=float(delay_raw))


def parse_fault_ref(raw: object) -> FaultRequest:
    """Parse one entry of ``_sim.faults``: a name, or ``{"name": ..., <params>}``.

    Params may sit beside ``name`` or inside a nested ``params`` object.
    """
    if isinstance(raw, str):
        return FaultRequest(_parse_fault_name(raw))
    if not isinstance(raw, Mapping):
        raise FaultError(f"a fault must be a name or an object with 'name', got {raw!r}")
    fault = _parse_fault_name(raw.get("name"))
    inline = {k: v for k, v in raw.items() if k not in ("name", "params")}
    nested = raw.get("params")
    if nested is not None and not isinstance(nested, Mapping):
        raise FaultError(f"fault params must be an object, got {nested!r}")
    return FaultRequest(fault, parse_params({**inline, **(nested or {})}))


def parse_fault_refs(raw: object) -> tuple[FaultRequest, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise FaultError(f"'faults' must be a list, got {raw!r}")
    return tuple(parse_fault_ref(item) for item in raw)


@dataclass(frozen=True, slots=True)
class FaultRule:
    """A plan rule: arm ``fault`` on calls of ``tool`` (``"*"`` = any) by rate or for the first N calls.

    With neither ``rate`` nor ``count`` the rule matches every call of the tool.
    """

    fault: Fault
    tool: str = "*"
    rate: float | None = None
    count: int | None = None
    params: FaultParams = FaultParams()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fault": self.fault.value, "tool": self.tool}
        if self.rate is not None:
            out["rate"] = self.rate
        if self.count is not None:
            out["count"] = self.count
        out["params"] = {
            "times": self.params.times,
            "retry_after_s": self.params.retry_after_s,
            "delay_ms": self.params.delay_ms,
        }
        return out


def parse_rule(raw: object) -> FaultRule:
    if not isinstance(raw, Mapping):
        raise FaultError(f"a fault rule must be an object, got {raw!r}")
    unknown = set(raw) - {"fault", "tool", "rate", "count", "params"}
    if unknown:
        raise FaultError(f"unknown fault rule field(s): {', '.join(sorted(map(str, unknown)))}")
    fault = _parse_fault_name(raw.get("fault"))
    tool = raw.get("tool", "*")
    if not isinstance(tool, str) or not tool:
        raise FaultError(f"rule 'tool' must be a tool name or '*', got {tool!r}")
    rate = raw.get("rate")
    count = raw.get("count")
    if rate is not None and count is not None:
        raise FaultError("a fault rule takes 'rate' or 'count', not both")
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1
    ):
        raise FaultError(f"rule 'rate' must be a number in [0, 1], got {rate!r}")
    if count is not None:
        count = _parse_int("count", count, 0)
    return FaultRule(
        fault=fault,
        tool=tool,
        rate=None if rate is None else float(rate),
        count=count,
        params=parse_params(raw.get("params")),
    )


@dataclass(slots=True)
class FaultPlan:
    """Rules applied to every new task, with the counters and random stream they consume."""

    seed: int = 0
    rules: tuple[FaultRule, ...] = ()
    _matches: list[int] = field(default_factory=list, init=False, repr=False)
    _rng: random.Random = field(default_factory=random.Random, init=False, repr=False)

    def __post_init__(self) -> None:
        self._matches = [0] * len(self.rules)
        self._rng = random.Random(self.seed)

    @classmethod
    def from_json(cls, raw: object, default_seed: int = 0) -> FaultPlan:
        """Parse ``{"seed": 1, "rules": [...]}``; a bare list of rules is accepted too."""
        if isinstance(raw, list):
            raw = {"rules": raw}
        if not isinstance(raw, Mapping):
            raise FaultError(f"a fault plan must be an object with 'rules', got {raw!r}")
        unknown = set(raw) - {"seed", "rules"}
        if unknown:
            raise FaultError(f"unknown fault plan field(s): {', '.join(sorted(map(str, unknown)))}")
        seed = raw.get("seed", default_seed)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise FaultError(f"plan 'seed' must be an integer, got {seed!r}")
        rules = raw.get("rules", [])
        if not isinstance(rules, list):
            raise FaultError(f"plan 'rules' must be a list, got {rules!r}")
        return cls(seed=seed, rules=tuple(parse_rule(r) for r in rules))

    def arm(self, tool: str) -> list[FaultRequest]:
        """Decide which rules fire for a new call of ``tool``; advances counters and the rng."""
        armed: list[FaultRequest] = []
        for index, rule in enumerate(self.rules):
            if rule.tool not in ("*", tool):
                continue
            self._matches[index] += 1
            if rule.count is not None:
                fires = self._matches[index] <= rule.count
            elif rule.rate is not None:
                # Draw even when the rate is 0 or 1 so that editing one rule's rate does not shift
                # the random stream the other rules see.
                fires = self._rng.random() < rule.rate
            else:
                fires = True
            if fires:
                armed.append(FaultRequest(rule.fault, rule.params))
        return armed

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "rules": [rule.to_json() for rule in self.rules],
            "matches": list(self._matches),
        }


@dataclass(slots=True)
class _Armed:
    remaining: int
    params: FaultParams


@dataclass(frozen=True, slots=True)
class FiredFault:
    fault: Fault
    where: str


class FaultBook:
    """The faults armed on one task and what is left of each; records every firing."""

    def __init__(self, requests: Sequence[FaultRequest] = ()) -> None:
        self._armed: dict[Fault, _Armed] = {}
        self.fired: list[FiredFault] = []
        for request in requests:
            current = self._armed.get(request.fault)
            if current is None:
                self._armed[request.fault] = _Armed(request.params.times, request.params)
            else:
                # Arming the same fault twice (call and plan) adds up the budgets.
                current.remaining += request.params.times

    def has(self, fault: Fault) -> bool:
        armed = self._armed.get(fault)
        return armed is not None and armed.remaining > 0

    def params(self, fault: Fault) -> FaultParams | None:
        armed = self._armed.get(fault)
        return armed.params if armed is not None else None

    def take(self, fault: Fault, where: str) -> FaultParams | None:
        """Use up one firing of ``fault``; ``None`` when it is not armed or already spent."""
        armed = self._armed.get(fault)
        if armed is None or armed.remaining <= 0:
            return None
        armed.remaining -= 1
        self.fired.append(FiredFault(fault, where))
        return armed.params

    def armed_names(self) -> list[str]:
        return sorted(f.value for f in self._armed)

    def remaining(self) -> dict[str, int]:
        return {f.value: a.remaining for f, a in sorted(self._armed.items())}


__all__ = [
    "Fault",
    "FaultBook",
    "FaultError",
    "FaultParams",
    "FaultPlan",
    "FaultRequest",
    "FaultRule",
    "FiredFault",
    "parse_fault_ref",
    "parse_fault_refs",
    "parse_params",
    "parse_rule",
]
