"""Command line of the reference server: parse options, bind, print ``READY <url>``, serve until killed.

Prints exactly one line to stdout (the READY line); every log line goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
from collections.abc import Sequence

import uvicorn

from refserver.app import build_app
from refserver.clock import pause
from refserver.context import Options, Protocol
from refserver.fault import FaultError, FaultPlan

_INTENTIONAL_ABORT = "ASGI callable returned without completing response."


class _DropIntentionalAborts(logging.Filter):
    """Broken responses are injected on purpose; uvicorn would log each one as an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _INTENTIONAL_ABORT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m refserver",
        description="Finality reference task server: one protocol on one port, with fault injection.",
    )
    parser.add_argument("--protocol", required=True, choices=[p.value for p in Protocol])
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--fault-plan", metavar="FILE", help='JSON: {"seed": 1, "rules": [...]}')
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiplier for every _sim duration")
    parser.add_argument("--seed", type=int, default=0, help="seed for fault plans and interval jitter")
    parser.add_argument("--idempotency", action="store_true", help="MCP: honour params.idempotencyKey")
    parser.add_argument(
        "--ignore-request-id",
        action="store_true",
        help="AIP-151: accept request_id and ignore it (AIP-155 optional)",
    )
    parser.add_argument(
        "--no-cancel",
        action="store_true",
        help="MCP 2025-11-25: declare no tasks.cancel (tasks/cancel: -32601)",
    )
    parser.add_argument(
        "--elicitation-id",
        metavar="ID",
        help="MCP 2025-11-25: use this one JSON-RPC id for every elicitation (digits: an integer)",
    )
    parser.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TOKEN=PRINCIPAL",
        help="require 'Authorization: Bearer TOKEN'; tasks are bound to PRINCIPAL (repeatable)",
    )
    parser.add_argument("--page-size", type=int, default=50, help="page size of task/operation listings")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return parser


def parse_options(argv: Sequence[str] | None) -> tuple[Options, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    if args.page_size < 1:
        parser.error("--page-size must be >= 1")
    if not 0 <= args.port <= 65535:
        parser.error("--port must be in 0..65535")
    tokens: dict[str, str] = {}
    for item in args.token:
        token, sep, principal = item.partition("=")
        if not sep or not token or not principal:
            parser.error(f"--token expects TOKEN=PRINCIPAL, got {item!r}")
        tokens[token] = principal
    plan_json: object = None
    if args.fault_plan:
        try:
            with open(args.fault_plan, encoding="utf-8") as handle:
                plan_json = json.load(handle)
            FaultPlan.from_json(plan_json, default_seed=args.seed)
        except (OSError, json.JSONDecodeError, FaultError) as exc:
            parser.error(f"--fault-plan {args.fault_plan}: {exc}")
    elicitation_id: int | str | None = None
    if args.elicitation_id is not None:
        raw = args.elicitation_id
        elicitation_id = int(raw) if raw.lstrip("-").isdigit() else raw
    options = Options(
        protocol=Protocol(args.protocol),
        time_scale=args.time_scale,
        seed=args.seed,
        idempotency=args.idempotency,
        elicitation_id=elicitation_id,
        cancel=not args.no_cancel,
        request_id=not args.ignore_request_id,
        tokens=tokens,
        page_size=args.page_size,
        plan_json=plan_json,
    )
    return options, args


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose proto is
    # IPPROTO_TCP, and without it every keep-alive response waits ~40 ms on Nagle + delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(options: Options, host: str, port: int, log_level: str = "warning") -> int:
    """Serve until the process is told to stop; print the READY line once connections are accepted."""
    sock = _bind(host, port)
    config = uvicorn.Config(
        build_app(options),
        log_config=None,
        log_level=log_level,
        access_log=False,
        http="h11",
        lifespan="off",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            serving.result()
            return 1
        await pause(0.01)
    bound_port = sock.getsockname()[1]
    shown_host = f"[{host}]" if ":" in host else host
    print(f"READY http://{shown_host}:{bound_port}", flush=True)
    await serving
    return 0


def main(argv: list[str] | None = None) -> int:
    options, args = parse_options(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=args.log_level.upper(),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("uvicorn.error").addFilter(_DropIntentionalAborts())
    try:
        return asyncio.run(serve(options, args.host, args.port, args.log_level))
    except OSError as exc:
        print(f"refserver: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


__all__ = [
    "build_parser",
    "main",
    "parse_options",
    "serve",
]
