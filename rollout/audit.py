"""The rollout audit chain: each ``rollout_events`` row carries the hash of the one before it.

Pure: builds the next link and verifies a chain read from the ledger; no I/O. A row's hash is
sha256 over the canonical JSON of all its other fields (its sequence number, the previous hash and
the digest of the gate inputs included), so editing any field, deleting a row or swapping two rows
breaks the chain. The tail is anchored in ``rollout_state`` (head sequence and hash), so dropping
the newest rows is caught too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Final

GENESIS: Final = "0" * 64
"""The ``prev_hash`` of the first row."""


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return instant(value)
    return str(value)


def canonical(value: object) -> str:
    """Sorted keys, no whitespace, instants as UTC ISO 8601: the text every hash is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_default)


def instant(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds")


def text_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One ``rollout_events`` row."""

    seq: int
    action: str
    actor: str
    reason: str
    override: bool
    before_state: str
    """The rollout state before the action, canonical JSON."""
    after_state: str
    detail: str
    """What else the action decided (failing gates overridden, arm flips, epochs), canonical JSON."""
    gate_inputs: str
    """``Ledger.gate_inputs`` at that moment, canonical JSON."""
    gate_inputs_digest: str
    prev_hash: str
    hash: str
    recorded_at: datetime

    def body(self) -> dict[str, object]:
        """Every field but ``hash``: what the hash covers."""
        return {
            "seq": self.seq,
            "action": self.action,
            "actor": self.actor,
            "reason": self.reason,
            "override": self.override,
            "before_state": self.before_state,
            "after_state": self.after_state,
            "detail": self.detail,
            "gate_inputs_digest": self.gate_inputs_digest,
            "prev_hash": self.prev_hash,
            "recorded_at": instant(self.recorded_at),
        }


def row_hash(event: AuditEvent) -> str:
    return hashlib.sha256(canonical(event.body()).encode()).hexdigest()


def next_event(
    *,
    prev_seq: int,
    prev_hash: str,
    action: str,
    actor: str,
    reason: str,
    override: bool,
    before_state: Mapping[str, object],
    after_state: Mapping[str, object],
    detail: Mapping[str, object],
    gate_inputs: Mapping[str, object],
    at: datetime,
) -> AuditEvent:
    """The link after the one at ``prev_seq`` (0 and ``GENESIS`` for the first), hash computed."""
    inputs = canonical(gate_inputs)
    draft = AuditEvent(
        seq=prev_seq + 1,
        action=action,
        actor=actor,
        reason=reason,
        override=override,
        before_state=canonical(before_state),
        after_state=canonical(after_state),
        detail=canonical(detail),
        gate_inputs=inputs,
        gate_inputs_digest=text_digest(inputs),
        prev_hash=prev_hash,
        hash="",
        recorded_at=at.astimezone(UTC),
    )
    return replace(draft, hash=row_hash(draft))


@dataclass(frozen=True, slots=True)
class Anchor:
    """Where the ledger says the chain ends, and the state it left."""

    head_seq: int
    head_hash: str
    state: str
    """The current rollout state, canonical JSON."""


@dataclass(frozen=True, slots=True)
class AuditReport:
    checked: int
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, object]:
        return {"ok": self.ok, "checked": self.checked, "problems": list(self.problems)}


def verify(rows: Sequence[AuditEvent], anchor: Anchor | None) -> AuditReport:
    """Check a chain read in ``seq`` order against its anchor; name every broken row.

    Detects an edited row (its hash no longer matches its fields, or its gate inputs no longer
    match their digest), a deleted row (a gap in ``seq`` and a broken link), reordered rows (links
    and hashes that no longer follow), and a dropped tail (the anchor points past the last row).
    """
    problems: list[str] = []
    previous_hash = GENESIS
    for position, row in enumerate(rows, start=1):
        where = f"row seq={row.seq} ({row.action} by {row.actor})"
        if row.seq != position:
            problems.append(f"{where}: expected seq {position}; a row was deleted, inserted or reordered")
        if row.prev_hash != previous_hash:
            problems.append(f"{where}: prev_hash does not match the hash of the row before it")
        if row_hash(row) != row.hash:
            problems.append(f"{where}: hash does not match its contents; the row was edited")
        if text_digest(row.gate_inputs) != row.gate_inputs_digest:
            problems.append(f"{where}: gate inputs do not match their digest; they were edited")
        previous_hash = row.hash
    if anchor is None:
        if rows:
            problems.append("the ledger has rollout events but no rollout_state anchor")
    else:
        last = rows[-1] if rows else None
        if last is None or anchor.head_seq != last.seq or anchor.head_hash != last.hash:
            seen = f"seq {last.seq}" if last is not None else "no rows"
            problems.append(
                f"chain ends at {seen}, but rollout_state says it ends at seq {anchor.head_seq}; "
                "rows were deleted from the end or the anchor was edited"
            )
        elif anchor.state != last.after_state:
            problems.append("rollout_state differs from the state the last event left; it was edited")
    return AuditReport(len(rows), tuple(problems))


__all__ = [
    "GENESIS",
    "Anchor",
    "AuditEvent",
    "AuditReport",
    "canonical",
    "instant",
    "next_event",
    "row_hash",
    "text_digest",
    "verify",
]
