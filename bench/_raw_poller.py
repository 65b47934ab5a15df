"""The raw-poller column of bench/fastmcp_compare.py: the least a hand-written httpx client can do.

One process, one ``httpx.AsyncClient``, ``--calls`` concurrent calls: create the task, then sleep the
server's advised interval and read its status until it is terminal (MCP 2026-07-28 carries the
result in the terminal ``tasks/get``; MCP 2025-11-25 fetches it with ``tasks/result``; AIP-151's
terminal operation holds it). No validation beyond what it needs to find the next step, no retries,
no ledger: the cost floor a durable client is compared with. Prints one JSON line with each call's
submit and result instants (wall clock) and this process's CPU seconds over the calls.

It speaks the wire by hand on purpose (not through engine.adapters), so it imports nothing of the
project; its name starts with ``_`` so bench/run_all.py does not take it for a benchmark.

    python bench/_raw_poller.py --protocol mcp-2026-07-28 --url URL --tool slow_report --calls 200
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import resource
import sys
import time
from typing import Any

import httpx

TERMINAL = frozenset({"completed", "failed", "cancelled"})
TASKS = "io.modelcontextprotocol/tasks"
META_2026 = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
    "io.modelcontextprotocol/clientInfo": {"name": "raw-poller", "version": "1"},
}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rpc_body(payload: bytes, content_type: str) -> dict[str, Any]:
    """The JSON-RPC message of a reply, whether sent as JSON or as one SSE event."""
    if content_type.startswith("text/event-stream"):
        for line in payload.decode().splitlines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if "id" in message:
                    return dict(message)
        raise RuntimeError("the stream carried no response")
    return dict(json.loads(payload))


class Mcp:
    """JSON-RPC over streamable HTTP for either MCP version."""

    def __init__(self, http: httpx.AsyncClient, url: str, version: str) -> None:
        self.http = http
        self.url = url
        self.version = version
        self.ids = itertools.count(1)
        self.session: str | None = None

    async def call(self, method: str, params: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": self.version}
        if self.version == "2026-07-28":
            params = {**params, "_meta": META_2026}
            headers["Mcp-Method"] = method
            if name is not None:
                headers["Mcp-Name"] = name
        if self.session is not None:
            headers["Mcp-Session-Id"] = self.session
        body = {"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params}
        response = await self.http.post(self.url, json=body, headers=headers)
        response.raise_for_status()
        if method == "initialize":
            self.session = response.headers.get("mcp-session-id")
        message = rpc_body(response.content, response.headers.get("content-type", ""))
        if "error" in message:
            raise RuntimeError(f"{method}: {message['error']}")
        return dict(message["result"])

    async def open(self) -> None:
        if self.version == "2026-07-28":
            await self.call("server/discover", {})
            return
        await self.call(
            "initialize",
            {
                "protocolVersion": self.version,
                "capabilities": {"tasks": {}},
                "clientInfo": {"name": "raw-poller", "version": "1"},
            },
        )
        headers = {"MCP-Protocol-Version": self.version, "Content-Type": "application/json"}
        if self.session is not None:
            headers["Mcp-Session-Id"] = self.session
        await self.http.post(
            self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
        )

    async def run(self, tool: str, arguments: dict[str, Any], record: dict[str, Any]) -> None:
        if self.version == "2026-07-28":
            task = await self.call("tools/call", {"name": tool, "arguments": arguments}, name=tool)
            task_id = str(task["taskId"])
            record["task_id"] = task_id
            while task.get("status") not in TERMINAL:
                await asyncio.sleep(task.get("pollIntervalMs", 1000) / 1000)
                task = await self.call("tasks/get", {"taskId": task_id}, name=task_id)
            record["status"] = task["status"]
            return
        created = await self.call(
            "tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": 600_000}}
        )
        task = dict(created["task"])
        task_id = str(task["taskId"])
        record["task_id"] = task_id
        while task.get("status") not in TERMINAL:
            await asyncio.sleep(task.get("pollInterval", 1000) / 1000)
            task = await self.call("tasks/get", {"taskId": task_id})
        await self.call("tasks/result", {"taskId": task_id})
        record["status"] = task["status"]


class Aip151:
    """AIP-151 long-running operations: ``POST :run``, then ``GET operations/{id}`` until done."""

    def __init__(self, http: httpx.AsyncClient, url: str, interval_s: float) -> None:
        self.http = http
        self.base = url.rstrip("/").removesuffix("/v1")
        self.interval_s = interval_s

    async def open(self) -> None:
        """Nothing to negotiate."""

    async def run(self, tool: str, arguments: dict[str, Any], record: dict[str, Any]) -> None:
        response = await self.http.post(
            f"{self.base}/v1/tools/{tool}:run",
            json={"request_id": record["key"], "arguments": arguments},
        )
        response.raise_for_status()
        operation = response.json()
        name = str(operation["name"])
        record["task_id"] = name.removeprefix("operations/")
        while not operation.get("done"):
            await asyncio.sleep(self.interval_s)
            response = await self.http.get(f"{self.base}/v1/{name}")
            response.raise_for_status()
            operation = response.json()
        record["status"] = "failed" if "error" in operation else "completed"


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    arguments_of = json.loads(args.arguments)
    limits = httpx.Limits(max_connections=args.calls + 10, max_keepalive_connections=args.calls + 10)
    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        client: Mcp | Aip151
        if args.protocol == "aip-151":
            client = Aip151(http, args.url, args.interval_s)
        else:
            client = Mcp(http, args.url, args.protocol.removeprefix("mcp-"))
        await client.open()
        calls: list[dict[str, Any]] = []
        cpu0 = cpu_seconds()
        wall0 = time.time()

        async def one(i: int) -> None:
            key = f"{args.prefix}-{i}"
            record: dict[str, Any] = {"key": key, "submitted_at": time.time()}
            calls.append(record)
            arguments = {k: (key if v == "{key}" else v) for k, v in arguments_of.items()}
            try:
                await client.run(args.tool, arguments, record)
                record["result_at"] = time.time()
            except Exception as exc:  # a benchmark records what went wrong and goes on
                record["error"] = f"{type(exc).__name__}: {exc}"

        await asyncio.gather(*(one(i) for i in range(args.calls)))
        cpu = cpu_seconds() - cpu0
        wall = time.time() - wall0
    return {"cpu_s": cpu, "wall_s": wall, "calls": calls}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=("mcp-2026-07-28", "mcp-2025-11-25", "aip-151"), required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--tool", required=True)
    parser.add_argument(
        "--arguments", default='{"key": "{key}"}', help='JSON; the value "{key}" is the call key'
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--interval-s", type=float, default=1.0, help="AIP-151 only: it advises no interval")
    parser.add_argument("--prefix", default="raw")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(drive(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
