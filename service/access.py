"""The control API's door: who a request is (``service.auth``), whether its role allows the route, and the
record of every refusal (who, what, when) in the ledger's ``access_denials``.

A refusal is 401 (no, unknown or expired token) or 403 naming the role that would allow the action.
Refusals are recorded at most ``RECORD_PER_S`` per second (a burst of bad tokens must not turn into
a burst of ledger writes); every one is counted, recorded or not, in ``/metrics``.

Decides nothing about operations; holds no role rule (``service.auth.allows`` is the one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from starlette.requests import Request
from starlette.responses import Response

from engine.errors import ServiceError
from engine.ledger.port import LedgerPort
from service.auth import LOCAL, Identity, Permission, TokenStore, bearer, would_allow

logger = logging.getLogger(__name__)

RECORD_PER_S = 50
"""Refusals recorded per second at most; the rest are counted only."""

Handler = Callable[[Request], Awaitable[Response]]


class Denied(ServiceError):
    """401 or 403: the request may not do this (recorded in ``access_denials``)."""

    def __init__(self, status: int, message: str, *, needed_role: str = "") -> None:
        super().__init__(status, message)
        self.needed_role = needed_role


@dataclass
class Access:
    """Identifies requests against ``tokens`` (None: local mode) and records refusals in ``ledger``."""

    tokens: TokenStore | None
    ledger: LedgerPort
    now: Callable[[], datetime]
    monotonic: Callable[[], float]
    open_metrics: bool = True
    refused: dict[int, int] = field(default_factory=dict)
    """Refusals since start by status (recorded or not)."""
    unrecorded: int = 0
    _window: tuple[int, int] = (0, 0)

    @property
    def enabled(self) -> bool:
        return self.tokens is not None

    def identify(self, request: Request) -> Identity:
        """The request's identity (``LOCAL`` in local mode); raises ``Denied`` (401) without a valid token."""
        if self.tokens is None:
            return LOCAL
        try:
            return self.tokens.identify(bearer(request.headers.get("authorization")))
        except ServiceError as exc:
            raise Denied(exc.status, str(exc)) from exc

    async def identify_off_loop(self, request: Request) -> Identity:
        """``identify``, on a worker thread when the token is an ID token: checking one may first fetch
        the provider's keys over HTTP (up to 5 s), and the executor shares this loop."""
        if self.tokens is not None and (bearer(request.headers.get("authorization")) or "").count(".") == 2:
            return await asyncio.to_thread(self.identify, request)
        return self.identify(request)

    def check(self, identity: Identity, permission: Permission) -> None:
        """Raises ``Denied`` (403, naming the role that would allow it) unless ``identity`` may."""
        if identity.may(permission):
            return
        role = would_allow(permission)
        held = ", ".join(sorted(identity.roles)) or "none"
        raise Denied(
            403,
            f"principal {identity.principal!r} (roles: {held}) may not {permission.value}: "
            f"role {role!r} would allow it",
            needed_role=role,
        )

    def route(self, permission: Permission | None, handler: Handler) -> Handler:
        """``handler`` behind the door: identified, checked for ``permission`` (None: open)."""

        async def wrapped(request: Request) -> Response:
            request.state.permission = permission.value if permission else "open"
            if permission is None:
                request.state.identity = LOCAL if self.tokens is None else None
                return await handler(request)
            identity = await self.identify_off_loop(request)
            request.state.identity = identity
            self.check(identity, permission)
            return await handler(request)

        return wrapped

    async def record(self, request: Request, denied: ServiceError) -> None:
        """Record one refusal (who, what, when); never fails the answer it accompanies."""
        self.refused[denied.status] = self.refused.get(denied.status, 0) + 1
        second = int(self.monotonic())
        start, count = self._window
        if start != second:
            start, count = second, 0
        if count >= RECORD_PER_S:
            self.unrecorded += 1
            return
        self._window = (start, count + 1)
        identity: Identity | None = getattr(request.state, "identity", None)
        row: dict[str, object] = {
            "recorded_at": self.now(),
            "principal": identity.principal if identity is not None else "",
            "token_id": identity.token_id if identity is not None else "",
            "method": request.method,
            "path": request.url.path[:500],
            "permission": str(getattr(request.state, "permission", "")),
            "status": denied.status,
            "needed_role": denied.needed_role if isinstance(denied, Denied) else "",
            "reason": str(denied)[:1000],
            "client": request.client.host if request.client else "",
        }
        try:
            await asyncio.to_thread(self.ledger.record_denial, row)
        except Exception:  # a failed record must not turn a 403 into a 500
            logger.exception("could not record an access denial")


def identity_of(request: Request) -> Identity:
    """The identity ``Access.route`` put on the request."""
    identity = getattr(request.state, "identity", None)
    if not isinstance(identity, Identity):
        raise ServiceError(500, "route has no identity (not behind Access.route)")
    return identity


__all__ = ["RECORD_PER_S", "Access", "Denied", "Handler", "identity_of"]
