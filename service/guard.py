"""Request guards of the control API: body size read with a cap, identifier rules, per-principal limits.

Every route that takes a body reads it through ``read_body``: the cap holds while reading (a
declared Content-Length over the cap is refused before a byte is read, a body that grows past it
is refused as soon as it does), so an oversized request costs no more memory than the cap. The
per-principal limits (operations in flight, submissions per second) answer 429 with Retry-After.

Decides nothing about operations: refusals happen before the executor sees the request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.requests import ClientDisconnect, Request

from engine.errors import IdentifierRefused, ServiceError, TooLarge, TooMany
from service.config import LimitsConfig

DRAIN_FACTOR = 16
"""An oversized body is read on (and dropped) up to this many times the cap, so that the client
gets to read the 413 instead of a reset connection; past that the connection is closed."""


def refused(exc: IdentifierRefused) -> ServiceError:
    return ServiceError(422, str(exc))


def _mib(limit: int) -> str:
    if limit % 1024 == 0:
        return f"{limit // 1024} KiB" if limit < 1 << 20 or limit % (1 << 20) else f"{limit >> 20} MiB"
    return f"{limit} bytes"


def describe(limit: int) -> str:
    """``1048576 bytes (1 MiB)``: the figure a refusal names."""
    return f"{limit} bytes ({_mib(limit)})"


async def read_body(request: Request, limit: int, what: str = "request body") -> bytes:
    """The raw body, at most ``limit`` bytes; 413 naming the limit otherwise (nothing parsed)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        await _drain(request, limit)
        raise TooLarge(f"{what} of {declared} bytes exceeds the limit of {describe(limit)}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                await _drain(request, limit, already=size)
                raise TooLarge(f"{what} exceeds the limit of {describe(limit)}")
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise ServiceError(400, "the client went away before sending the whole body") from exc
    return b"".join(chunks)


async def _drain(request: Request, limit: int, *, already: int = 0) -> None:
    # Read and drop: memory stays at one chunk. Bounded, so a body without end cannot hold us.
    budget = limit * DRAIN_FACTOR - already
    try:
        async for chunk in request.stream():
            budget -= len(chunk)
            if budget <= 0:
                return
    except (ClientDisconnect, RuntimeError):
        return


def json_object(raw: bytes) -> dict[str, object]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ServiceError(400, f"request body is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ServiceError(400, "request body must be a JSON object")
    return value


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class PrincipalLimiter:
    """Submissions per second (a token bucket per principal) and operations in flight per principal.

    ``now`` is a monotonic clock in seconds (injected: tests drive it); ``in_flight`` counts a
    principal's operations without a receipt (the executor's own count).
    """

    limits: LimitsConfig
    now: Callable[[], float]
    in_flight: Callable[[str], int]
    refusals: dict[tuple[str, str], int] = field(default_factory=dict)
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def admit(self, principal: str) -> None:
        """Take one submission for ``principal`` or raise TooMany (429) with when to retry."""
        limit = self.limits.in_flight_per_principal
        running = self.in_flight(principal)
        if running >= limit:
            self._count("in_flight", principal)
            raise TooMany(
                f"principal {principal!r} has {running} operations in flight, the limit is {limit} "
                "(limits.in_flight_per_principal); retry once some have a receipt",
                retry_after=1,
            )
        rate = self.limits.submissions_per_s_per_principal
        burst = self.limits.submission_burst
        now = self.now()
        bucket = self._buckets.get(principal)
        if bucket is None:
            bucket = self._buckets[principal] = _Bucket(burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1:
            self._count("submissions_per_s", principal)
            wait = (1 - bucket.tokens) / rate
            raise TooMany(
                f"principal {principal!r} exceeds {rate:g} submissions per second "
                f"(limits.submissions_per_s_per_principal, burst {burst:g}); retry in {wait:.2f} s",
                retry_after=max(1, math.ceil(wait)),
            )
        bucket.tokens -= 1

    def _count(self, limit: str, principal: str) -> None:
        key = (limit, principal)
        self.refusals[key] = self.refusals.get(key, 0) + 1


__all__ = ["DRAIN_FACTOR", "PrincipalLimiter", "describe", "json_object", "read_body", "refused"]
