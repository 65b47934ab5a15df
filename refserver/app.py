"""Builds the Starlette application for one protocol: its routes plus ``/healthz`` and ``/admin/*``.

The admin API is for tests on the same machine and is never authenticated; the server binds to
loopback by default for that reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Protocol as TypingProtocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from refserver.aip151 import Aip151, error_json
from refserver.clock import Clock, SystemClock
from refserver.context import Options, Protocol, ServerContext
from refserver.fault import FaultError, FaultPlan
from refserver.jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, RpcFault, error_message
from refserver.mcp2025 import Mcp2025
from refserver.mcp2026 import Mcp2026
from refserver.wire import Reply

logger = logging.getLogger("refserver")


class ProtocolRoutes(TypingProtocol):
    def routes(self) -> list[Route]: ...

    def reset(self) -> None: ...


class Admin:
    def __init__(self, ctx: ServerContext, protocol: ProtocolRoutes) -> None:
        self.ctx = ctx
        self.protocol = protocol

    def routes(self) -> list[Route]:
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/admin/stats", self.stats, methods=["GET"]),
            Route("/admin/counts", self.counts, methods=["GET"]),
            Route("/admin/reset", self.reset, methods=["POST"]),
            Route("/admin/faults", self.faults, methods=["GET", "POST"]),
        ]

    async def healthz(self, request: Request) -> Response:
        return Reply({"status": "ok", "protocol": self.ctx.options.protocol.value})

    async def stats(self, request: Request) -> Response:
        return Reply({"protocol": self.ctx.options.protocol.value, **self.ctx.store.stats()})

    async def counts(self, request: Request) -> Response:
        return Reply({"protocol": self.ctx.options.protocol.value, **self.ctx.store.counts()})

    async def reset(self, request: Request) -> Response:
        self.ctx.reset()
        self.protocol.reset()
        return Reply({"reset": True})

    async def faults(self, request: Request) -> Response:
        if request.method == "GET":
            return Reply(self.ctx.store.plan.to_json())
        try:
            plan = FaultPlan.from_json(json.loads(await request.body()), default_seed=self.ctx.options.seed)
        except (UnicodeDecodeError, json.JSONDecodeError, FaultError) as exc:
            return Reply({"error": str(exc)}, 400)
        self.ctx.store.plan = plan
        return Reply(plan.to_json())


def build_app(
    options: Options, clock: Clock | None = None, *, new_id: Callable[[], str] | None = None
) -> Starlette:
    """The server as an ASGI app; ``app.state.ctx`` is its context (store, clock), for in-process use.

    ``new_id`` replaces the random task ids (the race explorer numbers them to stay deterministic).
    """
    ctx = ServerContext(options, clock or SystemClock(), new_id=new_id)
    protocol: ProtocolRoutes
    if options.protocol is Protocol.MCP_2025_11_25:
        protocol = Mcp2025(ctx)
    elif options.protocol is Protocol.MCP_2026_07_28:
        protocol = Mcp2026(ctx)
    else:
        protocol = Aip151(ctx)
    is_aip = options.protocol is Protocol.AIP_151

    async def http_error(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
        if is_aip:
            status_out = 501 if status == 405 else status
            return Reply(
                error_json(status_out, detail, "NO_SUCH_ROUTE" if status < 500 else "INTERNAL"), status_out
            )
        code = INVALID_REQUEST if status < 500 else INTERNAL_ERROR
        return Reply(error_message(None, RpcFault(code, detail)), status)

    async def crash(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error for %s %s", request.method, request.url.path)
        return await http_error(request, exc)

    admin = Admin(ctx, protocol)
    app = Starlette(
        routes=[*admin.routes(), *protocol.routes()],
        exception_handlers={HTTPException: http_error, Exception: crash},
    )
    app.state.ctx = ctx
    return app


__all__ = [
    "Admin",
    "ProtocolRoutes",
    "build_app",
]
