"""Shadow comparison: how a shadow operation on the new adapter differs from its primary.

Pure: no I/O. Divergence means a different terminal status or a different result *content*; the
content digest leaves out protocol envelope fields that legitimately differ between adapters
(``_meta`` anywhere, e.g. the echoed epoch and related-task id, and the 2026-07-28 ``resultType``
tag). Latency and poll counts are recorded beside it but are not divergence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from engine.model import Digest, digest_of

SHADOW_SUFFIX: Final = "#shadow"
"""A shadow operation's call node is its primary's call node plus this suffix."""

_ENVELOPE_TOP: Final = frozenset({"resultType"})


def shadow_call_node(call_node: str) -> str:
    return f"{call_node}{SHADOW_SUFFIX}"


def _strip(value: object) -> object:
    if isinstance(value, Mapping):
        return {str(k): _strip(v) for k, v in value.items() if k != "_meta"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def content_digest(payload: Mapping[str, object] | None) -> Digest | None:
    """Digest of the result with protocol envelope fields removed; ``None`` without a result."""
    if payload is None:
        return None
    body = {str(k): v for k, v in payload.items() if k not in _ENVELOPE_TOP}
    return digest_of(_strip(body))


@dataclass(frozen=True, slots=True)
class Side:
    """One operation's terminal facts, as the comparison needs them."""

    operation_id: str
    status: str
    result_digest: str | None
    content_digest: str | None
    latency: timedelta
    """From recording the operation to accepting its receipt."""
    polls: int
    """Protocol requests sent for it (submission, status reads, fetches, cancels)."""


@dataclass(frozen=True, slots=True)
class ShadowDiff:
    primary: Side
    shadow: Side
    differences: tuple[str, ...]

    @property
    def diverged(self) -> bool:
        return bool(self.differences)


def compare(primary: Side, shadow: Side) -> ShadowDiff:
    """What differs between a primary and its shadow: ``status`` and/or ``result``."""
    differences: list[str] = []
    if primary.status != shadow.status:
        differences.append("status")
    if primary.content_digest != shadow.content_digest:
        differences.append("result")
    return ShadowDiff(primary, shadow, tuple(differences))


__all__ = [
    "SHADOW_SUFFIX",
    "ShadowDiff",
    "Side",
    "compare",
    "content_digest",
    "shadow_call_node",
]
