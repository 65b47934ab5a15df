"""The fastmcp half of bench/fastmcp_compare.py: runs in the benchmark's own virtualenv, never in the project's.

Two roles, each its own process:

* ``server``: a FastMCP 2026-07-28 server with the fastmcp-tasks extension (in-memory Docket
  backend, worker concurrency above the load) and one ``task=True`` tool, ``slow_report``, that
  sleeps ``--duration-s`` and advises ``pollIntervalMs`` of ``--poll-s``. An ASGI wrapper counts
  every JSON-RPC method it receives and every execution of the tool per ``key`` argument (the
  benchmark's server-side check: one operation per call node) and keeps each task's timeline: when
  its create was answered and when each ``tasks/get`` of it arrived and was answered (from which
  the benchmark tells how late each client read). All served as JSON at ``/bench/stats``.
* ``client``: the real fastmcp ``Client`` with ``fastmcp_tasks.call_tool_task`` driving
  ``--calls`` concurrent calls to completion; prints one JSON line with each call's submit and
  result instants (wall clock) and this process's CPU seconds over the calls.

This file imports fastmcp, which the project does not depend on, so it must not import anything of
the project (engine/, refserver/) and the project must not import it. Its name starts with ``_``
so bench/run_all.py does not mistake it for a benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import sys
import time
from collections import Counter
from datetime import timedelta
from typing import Any


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------- server


class Counting:
    """ASGI wrapper: counts JSON-RPC methods on the way in and answers ``GET /bench/stats``."""

    def __init__(self, app: Any, executions: Counter[str]) -> None:
        self.app = app
        self.methods: Counter[str] = Counter()
        self.executions = executions
        self.timelines: dict[str, list[list[float]]] = {}
        """Per task id: ``[[created], [read arrived, read answered], ...]`` (wall-clock seconds)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/bench/stats":
            stats = {"methods": self.methods, "executions": self.executions, "timelines": self.timelines}
            body = json.dumps(stats).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        arrived = time.time()
        try:
            message = json.loads(body)
            method = message.get("method", "?")
            task_id = (message.get("params") or {}).get("taskId") if method == "tasks/get" else None
        except (ValueError, AttributeError):
            method, task_id = "?", None
        self.methods[str(method)] += 1
        sent = False
        reply: list[bytes] = []

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def timed(message: dict[str, Any]) -> None:
            if method in ("tools/call", "tasks/get") and message["type"] == "http.response.body":
                reply.append(message.get("body", b""))
                if not message.get("more_body", False):
                    self._answered(str(method), task_id, arrived, b"".join(reply))
            await send(message)

        await self.app(scope, replay, timed)

    def _answered(self, method: str, task_id: str | None, arrived: float, reply: bytes) -> None:
        answered = time.time()
        if method == "tasks/get" and task_id is not None:
            self.timelines.setdefault(str(task_id), []).append([arrived, answered])
            return
        try:
            created = json.loads(reply).get("result", {}).get("taskId")
        except (ValueError, AttributeError):
            return
        if created is not None:
            self.timelines.setdefault(str(created), []).insert(0, [answered])


def serve(args: argparse.Namespace) -> None:
    import uvicorn
    from fastmcp import FastMCP
    from fastmcp.utilities.tasks import TaskConfig
    from fastmcp_tasks import TasksExtension

    executions: Counter[str] = Counter()
    mcp = FastMCP("bench-fastmcp")
    mcp.add_extension(TasksExtension(url="memory://", concurrency=args.concurrency))

    @mcp.tool(task=TaskConfig(mode="required", poll_interval=timedelta(seconds=args.poll_s)))
    async def slow_report(key: str) -> str:
        """A report that takes a fixed time to write."""
        executions[key] += 1
        await asyncio.sleep(args.duration_s)
        return f"report {key}"

    app = Counting(mcp.http_app(path="/mcp", json_response=True), executions)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on", backlog=2048)
    server = uvicorn.Server(config)

    async def main() -> None:
        print(f"READY {sock.getsockname()[1]}", flush=True)
        await server.serve(sockets=[sock])

    asyncio.run(main())


# ---------------------------------------------------------------------------------------- client


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    from fastmcp import Client
    from fastmcp_tasks import call_tool_task

    keys = [f"{args.prefix}-{i}" for i in range(args.calls)]
    calls: dict[str, dict[str, Any]] = {}
    async with Client(args.url, timeout=120) as client:
        cpu0 = cpu_seconds()
        wall0 = time.time()

        async def one(key: str) -> None:
            record: dict[str, Any] = {"key": key, "submitted_at": time.time()}
            calls[key] = record
            try:
                task = await call_tool_task(client, "slow_report", {"key": key})
                record["task_id"] = task.task_id
                result = await task.result()
                record["result_at"] = time.time()
                record["text"] = result.content[0].text if result.content else None
            except Exception as exc:  # a benchmark records what went wrong and goes on
                record["error"] = f"{type(exc).__name__}: {exc}"

        await asyncio.gather(*(one(k) for k in keys))
        cpu = cpu_seconds() - cpu0
        wall = time.time() - wall0
    return {"cpu_s": cpu, "wall_s": wall, "calls": list(calls.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--duration-s", type=float, default=3.0)
    s.add_argument("--poll-s", type=float, default=1.0)
    s.add_argument("--concurrency", type=int, default=1000)
    c = sub.add_parser("client")
    c.add_argument("--url", required=True)
    c.add_argument("--calls", type=int, default=200)
    c.add_argument("--prefix", default="fastmcp")
    args = parser.parse_args()
    if args.role == "server":
        serve(args)
        return 0
    print(json.dumps(asyncio.run(drive(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
